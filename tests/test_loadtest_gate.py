"""Unit tests of the load-test gate: exact percentiles, warm-up exclusion, SLO file, Triton deltas.

No server and no Locust run: records and statistics payloads are built by hand.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from tools.errors import UserInputError
from tools.load import triton_stats
from tools.loadtest import gate
from tools.slo import DEFAULT_SLO_FILE, load_slo


def _record(start_s: float, latency_ms: float, ok: bool = True, **kw) -> gate.RequestRecord:
    fields = {"scenario": "text_embedding", "protocol": "grpc", "model": "text_embedding"}
    fields.update(kw)
    return gate.RequestRecord(
        start_s=start_s, latency_ms=latency_ms, ok=ok, error="" if ok else "boom", **fields
    )


def test_percentile_is_nearest_rank_when_values_are_exact():
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert gate.percentile(values, 50) == 50.0
    assert gate.percentile(values, 99) == 99.0
    assert gate.percentile(values, 99.9) == 100.0
    assert gate.percentile(values, 100) == 100.0


def test_percentile_matches_numpy_inverted_cdf_when_values_are_random():
    rng = random.Random(7)
    values = sorted(rng.lognormvariate(3, 0.8) for _ in range(4321))
    for pct in (50, 95, 99, 99.9):
        expected = float(np.percentile(values, pct, method="inverted_cdf"))
        assert gate.percentile(values, pct) == expected


def test_percentile_keeps_sub_millisecond_precision_when_locust_would_round():
    # Locust buckets these to whole milliseconds; the gate must not.
    values = sorted([12.3456, 12.3457, 12.9, 13.01] * 25)
    assert gate.percentile(values, 99) == 13.01
    assert gate.percentile(values, 50) == 12.3457


def test_percentile_raises_when_there_are_no_values():
    with pytest.raises(ValueError, match="no values"):
        gate.percentile([], 99)


def test_summarize_excludes_warmup_and_requests_sent_after_stop():
    records = [_record(0.5, 5000.0), _record(1.9, 4000.0)]  # slow warm-up
    records += [_record(2.0 + i * 0.01, 10.0 + i) for i in range(100)]
    records.append(_record(12.5, 9000.0))  # sent after the stop mark
    summary = gate.summarize(
        records, scenario="text_embedding", protocol="grpc", warmup_s=2.0, stop_s=12.0
    )
    assert summary.requests == 100
    assert summary.excluded_warmup == 2
    assert summary.excluded_after_stop == 1
    assert summary.latency_ms["p99_ms"] == 108.0
    assert summary.latency_ms["max_ms"] == 109.0
    # the two slow warm-up requests end at 5.5 s and 5.9 s, inside the window, but started
    # before it: they do not count towards throughput either (tools.stats' window rule)
    assert summary.throughput_rps == pytest.approx(100 / 10.0)


def test_summarize_throughput_counts_only_answers_within_the_window():
    # 50 requests sent in 1 s, answered one every 0.2 s: only those answered by 5 s count
    records = [_record(i * 0.02, (0.2 * (i + 1) - i * 0.02) * 1000) for i in range(50)]
    summary = gate.summarize(
        records, scenario="text_embedding", protocol="grpc", warmup_s=0.0, stop_s=5.0
    )
    assert summary.requests == 25
    assert summary.excluded_after_stop == 25  # still in flight at the stop
    assert summary.throughput_rps == pytest.approx(25 / 5.0)


def test_summarize_counts_errors_but_leaves_them_out_of_percentiles():
    records = [_record(1.0 + i * 0.1, 20.0) for i in range(90)]
    records += [_record(1.0 + i * 0.1, 0.5, ok=False) for i in range(10)]
    summary = gate.summarize(
        records, scenario="text_embedding", protocol="grpc", warmup_s=0.0, stop_s=11.0
    )
    assert summary.errors == 10
    assert summary.error_ratio == pytest.approx(0.1)
    assert summary.latency_ms["p50_ms"] == 20.0  # fast errors do not pull the tail down
    assert summary.error_kinds == {"boom": 10}


def test_summarize_keeps_protocols_apart_when_records_are_mixed():
    records = [_record(1.0, 10.0, protocol="http"), _record(1.0, 99.0, protocol="grpc")]
    summary = gate.summarize(
        records, scenario="text_embedding", protocol="http", warmup_s=0.0, stop_s=2.0
    )
    assert summary.requests == 1
    assert summary.latency_ms["p99_ms"] == 10.0


def test_violations_name_every_missed_target():
    records = [_record(1.0 + i * 0.01, 50.0 + i) for i in range(100)]
    records += [_record(1.5, 1.0, ok=False)]
    summary = gate.summarize(
        records, scenario="text_embedding", protocol="grpc", warmup_s=0.0, stop_s=11.0
    )
    missed = gate.violations(summary, gate.Targets(p99_ms=0.001, max_error_ratio=0.0,
                                                   min_throughput_rps=1000))
    assert len(missed) == 3
    assert missed[0].startswith("P99 148.000 ms > 0.001 ms")
    assert "error ratio" in missed[1] and "throughput" in missed[2]
    line = gate.verdict_line(summary, gate.Targets(0.001, 0.0, 1000), "cpu")
    assert line.startswith("SLO FAIL text_embedding/grpc (cpu profile): P99")
    assert "\n" not in line


def test_violations_pass_when_targets_are_met():
    records = [_record(1.0 + i * 0.01, 50.0) for i in range(100)]
    summary = gate.summarize(
        records, scenario="text_embedding", protocol="grpc", warmup_s=0.0, stop_s=11.0
    )
    targets = gate.Targets(p99_ms=60.0, max_error_ratio=0.0, min_throughput_rps=5)
    assert gate.violations(summary, targets) == []
    assert gate.verdict_line(summary, targets, "cpu").startswith("SLO PASS")


def test_violations_fail_when_no_request_was_measured():
    summary = gate.summarize(
        [_record(0.5, 1.0)], scenario="text_embedding", protocol="grpc", warmup_s=1.0, stop_s=5.0
    )
    assert gate.violations(summary, gate.Targets(1e9, 1.0, 0.0)) == [
        "no request completed in the 4 s after the warm-up"
    ]


def test_records_round_trip_through_csv(tmp_path: Path):
    records = [_record(0.123456, 7.654321), _record(1.0, 2.0, ok=False, payload="cat.jpg")]
    gate.write_records(records, tmp_path / "r.csv", tmp_path / "r.json")
    back = gate.read_records(tmp_path / "r.csv")
    assert back == records


# ---- SLO file


def test_shipped_slo_file_has_both_profiles_for_every_scenario_and_protocol():
    for profile in ("cpu", "gpu"):
        for scenario in ("text_embedding", "image_classification"):
            slo = load_slo(DEFAULT_SLO_FILE, profile, scenario)
            assert set(slo.targets) == {"http", "grpc"}
            assert (slo.load.users is None) != (slo.load.rate is None)
            for targets in slo.targets.values():
                assert targets.p99_ms > 0 and targets.min_throughput_rps > 0


def _write_slo(path: Path, body: str) -> Path:
    path.write_text(body, encoding="utf-8")
    return path


_TARGETS = "{p99_ms: 10, max_error_ratio: 0, min_throughput_rps: 1}"


def _text_embedding_slo(tmp_path: Path, *, load: str, http: str = _TARGETS,
                        grpc: str = _TARGETS) -> Path:
    """An SLO file with one cpu scenario, text_embedding, written from its three flow maps."""
    return _write_slo(tmp_path / "slo.yaml", (
        "profiles:\n  cpu:\n    scenarios:\n      text_embedding:\n"
        f"        load: {load}\n        http: {http}\n        grpc: {grpc}\n"
    ))


def test_load_slo_raises_naming_the_field_when_a_target_is_missing(tmp_path: Path):
    path = _text_embedding_slo(tmp_path, load="{users: 2}",
                               http="{p99_ms: 10, min_throughput_rps: 1}")
    with pytest.raises(UserInputError, match=r"text_embedding\.http: missing max_error_ratio"):
        load_slo(path, "cpu", "text_embedding")


def test_a_target_without_min_throughput_gates_p99_and_errors_only(tmp_path: Path):
    path = _text_embedding_slo(tmp_path, load="{users: 2}",
                               http="{p99_ms: 10, max_error_ratio: 0}")
    targets = load_slo(path, "cpu", "text_embedding").targets["http"]
    assert targets.min_throughput_rps is None

    def ten_requests_in_1000_s(latency_ms: float) -> gate.Summary:
        records = [_record(1.0 + i, latency_ms) for i in range(10)]
        return gate.summarize(records, scenario="text_embedding", protocol="grpc", warmup_s=0.0,
                              stop_s=1000.0)

    slow = ten_requests_in_1000_s(5.0)
    assert gate.violations(slow, targets) == []
    assert gate.verdict_line(slow, targets, "cpu").endswith("0.0 req/s (no throughput target)")
    assert gate.violations(ten_requests_in_1000_s(50.0), targets) == ["P99 50.000 ms > 10 ms"]


def test_load_slo_raises_when_the_profile_is_unknown(tmp_path: Path):
    path = _write_slo(tmp_path / "slo.yaml", "profiles: {cpu: {scenarios: {}}}\n")
    with pytest.raises(UserInputError, match="no profile 'gpu'"):
        load_slo(path, "gpu", "text_embedding")


def test_load_slo_raises_when_both_users_and_rate_are_given(tmp_path: Path):
    path = _text_embedding_slo(tmp_path, load="{users: 2, rate: 10}")
    with pytest.raises(UserInputError, match="exactly one of users or rate"):
        load_slo(path, "cpu", "text_embedding")


# ---- Triton statistics


def _stats(name: str, inferences: int, executions: int, count: int, queue_ns: int,
           infer_ns: int, batches: dict[int, int], as_strings: bool = False) -> dict:
    conv = str if as_strings else int

    def d(c, ns):
        return {"count": conv(c), "ns": conv(ns)}

    return {
        "name": name,
        "version": "1",
        "inference_count": conv(inferences),
        "execution_count": conv(executions),
        "inference_stats": {
            "success": d(count, queue_ns + infer_ns + 3 * count * 1000),
            "fail": d(0, 0),
            "queue": d(count, queue_ns),
            "compute_input": d(count, count * 1000),
            "compute_infer": d(count, infer_ns),
            "compute_output": d(count, 2 * count * 1000),
        },
        "batch_stats": [
            {"batch_size": conv(size), "compute_infer": d(n, 0)} for size, n in batches.items()
        ],
    }


def test_window_gives_mean_executed_batch_and_queue_versus_compute_per_request():
    before = triton_stats.parse_statistics({"model_stats": [
        _stats("minilm_encoder", 100, 100, 100, 10**8, 10**9, {1: 100}),
        _stats("idle", 5, 5, 5, 0, 0, {1: 5}),
    ]})
    after = triton_stats.parse_statistics({"model_stats": [
        # +400 requests in 50 executions; +2 s queued and +8 s computing over those requests
        _stats("minilm_encoder", 500, 150, 500, 10**8 + 2 * 10**9, 9 * 10**9,
               {1: 100, 8: 50}),
        _stats("idle", 5, 5, 5, 0, 0, {1: 5}),
    ]})
    models = triton_stats.window(before, after)
    assert set(models) == {"minilm_encoder"}
    m = models["minilm_encoder"]
    assert m.requests == 400 and m.executions == 50
    assert m.mean_batch == pytest.approx(8.0)
    assert m.queue_ms == pytest.approx(5.0)  # 2e9 ns / 400
    assert m.compute_infer_ms == pytest.approx(20.0)  # 8e9 ns / 400
    assert m.compute_ms == pytest.approx(20.0 + 0.001 + 0.002)
    assert m.batch_executions == {8: 50}


def test_parse_statistics_accepts_grpc_json_where_counters_are_strings():
    grpc_form = {"model_stats": [_stats("m", 10, 5, 10, 1000, 2000, {2: 5}, as_strings=True)]}
    http_form = {"model_stats": [_stats("m", 10, 5, 10, 1000, 2000, {2: 5})]}
    assert triton_stats.parse_statistics(grpc_form) == triton_stats.parse_statistics(http_form)


def test_gate_fails_on_a_backlog_in_flight_at_the_stop_even_when_completed_requests_are_fast():
    record = gate.RequestRecord
    records = [record("text_embedding", "http", "text_embedding", 1.0 + i * 0.01, 10.0, True)
               for i in range(90)]
    records += [record("text_embedding", "http", "text_embedding", 4.0, 9000.0, True)
                for _ in range(10)]
    summary = gate.summarize(records, scenario="text_embedding", protocol="http", warmup_s=0.0,
                             stop_s=10.0)

    missed = gate.violations(summary, gate.Targets(p99_ms=250.0, max_error_ratio=0.01,
                                                   min_throughput_rps=1.0))

    assert summary.latency_ms["p99_ms"] == 10.0
    assert summary.in_flight_at_stop == 10
    assert missed and missed[0].startswith("backlog: 10 request(s) still in flight at the stop")
