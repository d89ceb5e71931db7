"""The queue gate of a pipeline's first step: reading Triton's queue gauges, admitting, failing open.

These tests hand the gate a stand-in for the metrics endpoint; the real endpoint and the real
ensemble are exercised by tests/test_reliability_faults.py (overload of ``text_embedding``).
"""

from __future__ import annotations

import time

import pytest
from pipeline_ops import admission
from pipeline_ops.admission import AdmissionSettings, QueueGate, pending_requests
from pipeline_ops.errors import ConfigurationError, Overloaded

METRICS = """# HELP nv_inference_pending_request_count Instantaneous number of pending requests
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="minilm_encoder",version="1"} 40
nv_inference_pending_request_count{model="minilm_encoder",version="2"} 2
nv_inference_pending_request_count{model="minilm_encoder_int8",version="1"} 7
nv_inference_pending_request_count{model="text_tokenizer",version="1"} 90
nv_inference_queue_duration_us{model="minilm_encoder",version="1"} 123456
"""
SETTINGS = AdmissionSettings(("minilm_encoder", "minilm_encoder_int8"), max_pending=64)


def test_pending_requests_sum_the_named_models_over_their_versions_only():
    assert pending_requests(METRICS, ["minilm_encoder"]) == 42
    assert pending_requests(METRICS, ["minilm_encoder", "minilm_encoder_int8"]) == 49
    assert pending_requests(METRICS, ["absent"]) == 0


def test_settings_are_none_without_admission_models_and_read_the_metrics_address_from_env():
    assert AdmissionSettings.from_parameters({"max_length": "256"}, "tok") is None
    settings = AdmissionSettings.from_parameters(
        {"admission_models": " a, b ,", "admission_max_pending": "64"}, "tok",
        environ={admission.METRICS_URL_ENV: "127.0.0.1:9"},
    )
    assert settings == AdmissionSettings(("a", "b"), 64, "127.0.0.1:9")
    default = AdmissionSettings.from_parameters(
        {"admission_models": "a", "admission_max_pending": "1"}, "tok", environ={})
    assert default.metrics_url == admission.DEFAULT_METRICS_URL


@pytest.mark.parametrize("value", ["", "0", "-3", "many"])
def test_settings_name_the_model_and_parameter_when_max_pending_is_not_positive(value):
    with pytest.raises(ConfigurationError, match="model 'tok': parameter 'admission_max_pending'"):
        AdmissionSettings.from_parameters(
            {"admission_models": "a", "admission_max_pending": value}, "tok", environ={})


def test_the_gate_counts_what_it_admits_and_reads_again_when_the_room_runs_out(monkeypatch):
    monkeypatch.setattr(admission, "MIN_READ_AGE_S", 0.05)
    readings = iter([METRICS, METRICS.replace("} 40", "} 10")])
    gate = QueueGate(SETTINGS, fetch=lambda url: next(readings), start=False)
    gate.refresh()  # 49 of 64 held: room for 15

    assert gate.admit(10) == 10
    assert gate.admit(10) == 5, "a burst right after a reading cannot overfill the queue"
    assert gate.admit(3) == 0
    time.sleep(0.06)  # the reading is older than MIN_READ_AGE_S: read again before refusing
    assert gate.admit(50) == 45, "19 held now: room for 45"


def test_a_held_batch_waits_for_room_for_all_of_it_then_goes_on_whole(monkeypatch):
    monkeypatch.setattr(admission, "MIN_READ_AGE_S", 0.01)
    pending = iter([60, 60, 58, 50] + [50] * 100)  # room 4, 4, 6, then 14
    reads = []

    def fetch(url):
        reads.append(time.monotonic())
        return f'nv_inference_pending_request_count{{model="minilm_encoder",version="1"}} {next(pending)}'

    gate = QueueGate(AdmissionSettings(("minilm_encoder",), 64, max_wait_s=1.0), fetch=fetch,
                     start=False)
    gate.refresh()
    started = time.monotonic()
    assert gate.admit(8) == 8, "held until a reading showed room for all 8"
    assert len(reads) == 4 and time.monotonic() - started >= 0.02
    assert min(b - a for a, b in zip(reads[1:], reads[2:])) >= 0.009, "reads at most every 10 ms"
    assert gate.admit(6) == 6 and len(reads) == 4, "room 14 - 8 = 6 left: no new reading"


def test_a_held_batch_is_refused_in_part_at_the_deadline(monkeypatch):
    monkeypatch.setattr(admission, "MIN_READ_AGE_S", 0.01)
    full = 'nv_inference_pending_request_count{model="minilm_encoder",version="1"} 61'
    gate = QueueGate(AdmissionSettings(("minilm_encoder",), 64, max_wait_s=0.05),
                     fetch=lambda url: full, start=False)
    gate.refresh()
    started = time.monotonic()
    assert gate.admit(8) == 3, "room for 3 at the deadline: the other 5 are refused"
    assert 0.04 <= time.monotonic() - started < 0.5


def test_max_wait_is_read_in_milliseconds_and_must_be_a_whole_number():
    params = {"admission_models": "a", "admission_max_pending": "8"}
    assert AdmissionSettings.from_parameters(params, "tok", environ={}).max_wait_s == 0.0
    held = AdmissionSettings.from_parameters({**params, "admission_max_wait_ms": "500"}, "tok",
                                             environ={})
    assert held.max_wait_s == 0.5
    with pytest.raises(ConfigurationError, match="model 'tok': parameter 'admission_max_wait_ms'"):
        AdmissionSettings.from_parameters({**params, "admission_max_wait_ms": "-1"}, "tok",
                                          environ={})


def test_the_gate_refuses_everything_while_the_later_models_hold_the_maximum():
    full = METRICS.replace('"minilm_encoder",version="1"} 40', '"minilm_encoder",version="1"} 80')
    gate = QueueGate(SETTINGS, fetch=lambda url: full, start=False)
    gate.refresh()

    assert gate.admit(4) == 0
    refusal = gate.refusal()
    assert isinstance(refusal, Overloaded)
    assert "minilm_encoder, minilm_encoder_int8 already hold 64 queued requests" in str(refusal)


def test_the_gate_fails_open_before_its_first_reading_and_while_the_endpoint_is_down():
    def down(url):
        raise ConnectionRefusedError(f"{url} refused")

    gate = QueueGate(SETTINGS, fetch=down, start=False)
    assert gate.admit(100) == 100, "no reading yet"
    gate.refresh()
    assert gate.admit(100) == 100, "the later models' own max_queue_size still bounds the backlog"


def test_the_polling_thread_reads_while_requests_arrive_and_stops_reading_when_idle(monkeypatch):
    monkeypatch.setattr(admission, "IDLE_AFTER_S", 0.2)
    reads = []
    gate = QueueGate(AdmissionSettings(("minilm_encoder",), 64, interval_s=0.005),
                     fetch=lambda url: reads.append(url) or METRICS)
    try:
        time.sleep(0.2)
        assert reads == [], "no request yet: nothing is read"
        gate.admit(1)
        deadline = time.monotonic() + 5
        while len(reads) < 3:
            assert time.monotonic() < deadline, reads
            time.sleep(0.01)
        assert gate.admit(100) <= 64 - 42
        time.sleep(0.6)  # idle past IDLE_AFTER_S
        idle_reads = len(reads)
        time.sleep(0.3)
        assert len(reads) == idle_reads, "an idle gate reads nothing"
        assert gate.admit(5) == 5, "after idling the first burst is admitted until read again"
    finally:
        gate.close()
    assert not gate._thread.is_alive()


def test_the_server_sets_the_variable_the_gate_reads():
    # pipeline_ops imports without `tools`, so the name is written in both places
    from tools.serve import server

    assert server.METRICS_URL_ENV == admission.METRICS_URL_ENV
