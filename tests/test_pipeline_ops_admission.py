"""The queue gate of a pipeline's first step: reading Triton's gauges, Little's law, holding.

These tests hand the gate a stand-in for the metrics endpoint and a clock of their own (time
moves only when a test or the gate's own ``sleep`` moves it); the real endpoint and the real
ensemble are exercised by tests/test_reliability_faults.py (overload of ``text_embedding``).
"""

from __future__ import annotations

import pytest
from pipeline_ops import admission
from pipeline_ops.admission import AdmissionSettings, QueueGate, pending_requests, read_models
from pipeline_ops.errors import ConfigurationError, Overloaded

METRICS = """# HELP nv_inference_pending_request_count Instantaneous number of pending requests
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="minilm_encoder",version="1"} 40
nv_inference_pending_request_count{model="minilm_encoder",version="2"} 2
nv_inference_pending_request_count{model="minilm_encoder_int8",version="1"} 7
nv_inference_pending_request_count{model="text_tokenizer",version="1"} 90
nv_inference_request_success{model="minilm_encoder",version="1"} 1000
nv_inference_request_success{model="text_tokenizer",version="1"} 5000
nv_inference_queue_duration_us{model="minilm_encoder",version="1"} 123456
"""
SETTINGS = AdmissionSettings(("minilm_encoder", "minilm_encoder_int8"), max_pending=64)


class FakeClock:
    """Seconds that move only when told (``advance``) or slept through (``sleep``)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _metrics(pending: int, done: float = 0.0) -> str:
    return (f'nv_inference_pending_request_count{{model="minilm_encoder",version="1"}} {pending}\n'
            f'nv_inference_request_success{{model="minilm_encoder",version="1"}} {done}\n')


def _gate(settings: AdmissionSettings, readings, clock: FakeClock | None = None) -> QueueGate:
    """A gate reading ``readings`` in turn (the last one again once they run out)."""
    readings = list(readings)
    reads = []

    def fetch(url):
        reads.append(url)
        return readings[min(len(reads), len(readings)) - 1]

    clock = clock or FakeClock()
    gate = QueueGate(settings, fetch=fetch, start=False, clock=clock, sleep=clock.sleep)
    gate.reads = reads  # type: ignore[attr-defined]
    return gate


def test_pending_and_answered_requests_sum_the_named_models_over_their_versions_only():
    assert pending_requests(METRICS, ["minilm_encoder"]) == 42
    assert pending_requests(METRICS, ["minilm_encoder", "minilm_encoder_int8"]) == 49
    assert pending_requests(METRICS, ["absent"]) == 0
    assert read_models(METRICS, ["minilm_encoder", "text_tokenizer"]).done == 6000


def test_settings_are_none_without_admission_models_and_read_the_metrics_address_from_env():
    assert AdmissionSettings.from_parameters({"max_length": "256"}, "tok") is None
    settings = AdmissionSettings.from_parameters(
        {"admission_models": " a, b ,", "admission_max_pending": "64"}, "tok",
        environ={admission.METRICS_URL_ENV: "127.0.0.1:9"},
    )
    assert settings == AdmissionSettings(("a", "b"), 64, "127.0.0.1:9")
    default = AdmissionSettings.from_parameters(
        {"admission_models": "a", "admission_max_pending": "1"}, "tok", environ={})
    assert default.metrics_url == admission.DEFAULT_METRICS_URL and default.p99_s is None


@pytest.mark.parametrize("value", ["", "0", "-3", "many"])
def test_settings_name_the_model_and_parameter_when_max_pending_is_not_positive(value):
    with pytest.raises(ConfigurationError, match="model 'tok': parameter 'admission_max_pending'"):
        AdmissionSettings.from_parameters(
            {"admission_models": "a", "admission_max_pending": value}, "tok", environ={})


@pytest.mark.parametrize("value", ["0", "-5", "soon"])
def test_settings_name_the_model_and_parameter_when_the_p99_objective_is_not_positive(value):
    with pytest.raises(ConfigurationError, match="model 'tok': parameter 'admission_p99_ms'"):
        AdmissionSettings.from_parameters({"admission_models": "a", "admission_max_pending": "8",
                                           "admission_p99_ms": value}, "tok", environ={})


def test_the_p99_objective_gives_the_delay_budget_of_the_later_models_queue():
    settings = AdmissionSettings.from_parameters(
        {"admission_models": "a", "admission_max_pending": "64", "admission_p99_ms": "600"},
        "tok", environ={})
    assert settings.p99_s == 0.6
    assert settings.delay_budget_s == pytest.approx(admission.DRAIN_FACTOR * 0.6)


def test_the_gate_counts_what_it_admits_and_reads_again_when_the_room_runs_out():
    clock = FakeClock()
    gate = _gate(SETTINGS, [METRICS, METRICS.replace("} 40", "} 10")], clock)
    gate.refresh()  # 49 of 64 held: room for 15

    assert gate.admit(10) == 10
    assert gate.admit(10) == 5, "a burst right after a reading cannot overfill the queue"
    assert gate.admit(3) == 0 and len(gate.reads) == 1, "the reading is too young to redo"
    clock.advance(admission.MIN_READ_AGE_S * 2)
    assert gate.admit(50) == 45, "older than MIN_READ_AGE_S: read again (19 held, room 45)"
    assert len(gate.reads) == 2


def test_by_littles_law_the_room_is_the_measured_rate_times_the_delay_budget():
    # the encoders' queue may hold 0.3 s of work
    settings = AdmissionSettings(("minilm_encoder",), 64, p99_s=0.3 / admission.DRAIN_FACTOR)
    clock = FakeClock()
    gate = _gate(settings, [_metrics(30, 1000), _metrics(30, 1100), _metrics(0, 1200),
                            _metrics(5, 1250)], clock)
    gate.refresh()
    assert gate.rate is None and gate.limit() == 64, "no rate yet: the size bound alone"
    clock.advance(1.0)
    gate.refresh()  # 100 answered in 1 s with a queue all along
    assert gate.rate == pytest.approx(100.0)
    assert gate.limit() == 30 and gate.admit(5) == 0, "30 held = 0.3 s at 100/s: no room"
    clock.advance(1.0)
    gate.refresh()  # the queue had not run dry before: 100/s again
    assert gate.rate == pytest.approx(100.0) and gate.admit(30) == 30
    clock.advance(1.0)
    gate.refresh()  # it had run dry (0 pending): 50 answers in that second say nothing of speed
    assert gate.rate == pytest.approx(100.0) and gate.admit(30) == 25


def test_the_size_bound_still_caps_a_fast_models_room():
    settings = AdmissionSettings(("minilm_encoder",), 16, p99_s=10.0)
    clock = FakeClock()
    gate = _gate(settings, [_metrics(4, 0), _metrics(4, 1000)], clock)
    gate.refresh()
    clock.advance(1.0)
    gate.refresh()
    assert gate.limit() == 16 and gate.admit(20) == 12


def test_a_held_batch_waits_for_room_for_all_of_it_then_goes_on_whole():
    clock = FakeClock()
    # room 4, 4, 6, then 14
    gate = _gate(AdmissionSettings(("minilm_encoder",), 64, max_wait_s=1.0),
                 [_metrics(60), _metrics(60), _metrics(58), _metrics(50)], clock)
    gate.refresh()
    started = clock.now
    assert gate.admit(8) == 8, "held until a reading showed room for all 8"
    assert len(gate.reads) == 4
    assert clock.slept and min(clock.slept) >= admission.MIN_READ_AGE_S - 1e-9, \
        "read again at most every MIN_READ_AGE_S"
    assert clock.now - started == pytest.approx(3 * admission.MIN_READ_AGE_S)
    assert gate.admit(6) == 6 and len(gate.reads) == 4, "room 14 - 8 = 6 left: no new reading"


def test_a_held_batch_is_refused_in_part_at_the_deadline():
    clock = FakeClock()
    gate = _gate(AdmissionSettings(("minilm_encoder",), 64, max_wait_s=0.05), [_metrics(61)],
                 clock)
    gate.refresh()
    started = clock.now
    assert gate.admit(8) == 3, "room for 3 at the deadline: the other 5 are refused"
    assert 0.04 <= clock.now - started <= 0.05 + admission.MIN_READ_AGE_S


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
    gate = _gate(SETTINGS, [full])
    gate.refresh()

    assert gate.admit(4) == 0
    refusal = gate.refusal()
    assert isinstance(refusal, Overloaded)
    assert "minilm_encoder, minilm_encoder_int8 already hold 64 queued requests" in str(refusal)


def test_the_gate_fails_open_before_its_first_reading_and_while_the_endpoint_is_down():
    def down(url):
        raise ConnectionRefusedError(f"{url} refused")

    clock = FakeClock()
    gate = QueueGate(SETTINGS, fetch=down, start=False, clock=clock, sleep=clock.sleep)
    assert gate.admit(100) == 100, "no reading yet"
    gate.refresh()
    assert gate.admit(100) == 100, "the later models' own max_queue_size still bounds the backlog"


def test_polling_reads_while_requests_arrive_faster_under_pressure_and_not_at_all_when_idle():
    clock = FakeClock()
    settings = AdmissionSettings(("minilm_encoder",), 64, interval_s=0.01)
    gate = _gate(settings, [_metrics(10), _metrics(50)], clock)
    assert gate.poll_once() is None and gate.reads == [], "no request yet: nothing is read"
    gate.admit(1)
    assert gate.poll_once() == pytest.approx(0.05) and len(gate.reads) == 1, \
        "room 54 of 64 left: read every 5 intervals"
    assert gate.poll_once() == pytest.approx(0.05) and len(gate.reads) == 1, "not due yet"
    clock.advance(0.05)
    gate.admit(40)
    assert gate.poll_once() == pytest.approx(0.01) and len(gate.reads) == 2, \
        "50 held, room 14 of 64: read every interval"
    clock.advance(admission.IDLE_AFTER_S + 0.01)
    assert gate.poll_once() is None and len(gate.reads) == 2, "idle: nothing is read"
    assert gate.admit(100) == 100, "after idling the first burst is admitted until read again"


def test_the_polling_thread_stops_on_close_even_while_idle():
    gate = QueueGate(SETTINGS, fetch=lambda url: METRICS)
    gate.close()
    assert not gate._thread.is_alive()


def test_the_server_sets_the_variable_the_gate_reads():
    # pipeline_ops imports without `tools`, so the name is written in both places
    from tools.serve import server

    assert server.METRICS_URL_ENV == admission.METRICS_URL_ENV


def test_the_rate_is_measured_over_a_window_not_a_slice_between_two_batches():
    # 10 ms readings while a batch of 8 takes 0.1 s: most slices answer nothing
    settings = AdmissionSettings(("minilm_encoder",), 64, p99_s=1.0)
    clock = FakeClock()
    readings = [_metrics(2, 8 * (i // 10)) for i in range(120)]
    gate = _gate(settings, readings, clock)
    gate.refresh()
    clock.advance(0.01)
    gate.refresh()  # a first slice with no answer
    assert gate.rate is None and gate.limit() == 64, "one slice says nothing of the speed"
    for _ in range(100):
        clock.advance(0.01)
        gate.refresh()
    assert 60 <= gate.rate <= 100, "8 per 0.1 s, within a batch per window"
    assert gate.limit() == 64 and gate.admit(8) == 8
