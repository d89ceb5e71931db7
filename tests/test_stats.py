"""Tests of tools.stats, the one way to measure: percentile method, window rule, and every report
(gate, the load engine behind bench / tune / faults, server comparison, GPU check) giving the
same figures from the same raw records.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tools import gpu_check, stats
from tools.bench.report import served_row
from tools.load import Point
from tools.loadtest import gate
from tools.stats import Record, Window




# ---- the percentile method


@pytest.mark.parametrize("pct, expected", [(5, 15.0), (30, 20.0), (40, 20.0), (50, 35.0),
                                           (100, 50.0)])
def test_percentile_is_nearest_rank_when_computed_by_hand(pct, expected):
    # The textbook example: rank = ceil(pct/100 * n), 1-based, of 15 20 35 40 50.
    assert stats.percentile([15.0, 20.0, 35.0, 40.0, 50.0], pct) == expected


def test_percentile_is_free_of_float_noise_when_the_rank_is_a_whole_number():
    values = [float(v) for v in range(1, 1001)]
    # 0.99 * 1000 is 989.9999999999999 in floats; the rank is 990, not 989 or 991.
    assert stats.percentile(values, 99) == 990.0
    assert stats.percentile(values, 99.9) == 999.0
    assert stats.percentile(values, 50) == 500.0


def test_percentile_is_an_observed_latency_where_linear_interpolation_is_not():
    values = [float(v) for v in range(1, 101)]
    assert stats.percentile(values, 99) == 99.0
    assert float(np.percentile(values, 99)) == pytest.approx(99.01)  # numpy's default, not seen
    assert stats.percentile(values, 99) == float(np.percentile(values, 99, method="inverted_cdf"))


def test_percentile_of_one_value_is_that_value_at_every_percentile():
    assert {stats.percentile([7.5], p) for p in (0.1, 50, 99.9, 100)} == {7.5}


@pytest.mark.parametrize("pct", [0, -1, 100.1])
def test_percentile_raises_when_pct_is_outside_0_to_100(pct):
    with pytest.raises(ValueError, match="outside"):
        stats.percentile([1.0], pct)


def test_latency_summary_gives_min_mean_max_and_the_four_percentiles_when_unsorted():
    latency = stats.latency_summary([float(v) for v in range(1000, 0, -1)])
    assert (latency.count, latency.min_ms, latency.mean_ms, latency.max_ms) == (
        1000, 1.0, 500.5, 1000.0)
    assert latency.percentiles() == {50.0: 500.0, 95.0: 950.0, 99.0: 990.0, 99.9: 999.0}
    assert stats.latency_summary([]) is None


def test_median_of_rounds_takes_the_middle_two_when_the_count_is_even():
    assert stats.median([30.0, 10.0, 20.0]) == 20.0
    assert stats.median([10.0, None, 20.0]) == 15.0
    assert stats.median([None]) is None


# ---- the window rule


def test_window_counts_a_request_that_starts_at_its_start_and_completes_at_its_end():
    window = Window(1.0, 2.5)
    assert window.counts(Record(1.0, 10.0, True))
    assert window.counts(Record(2.0, 500.0, True))  # completes at 2.5 s exactly


def test_window_leaves_out_a_request_started_before_warmup_even_when_it_completes_inside():
    summary = stats.summarize([Record(0.999, 500.0, True), Record(1.0, 20.0, True)],
                              Window(1.0, 11.0))
    assert (summary.count, summary.before_window, summary.after_window) == (1, 1, 0)
    assert summary.latency.max_ms == 20.0
    assert summary.throughput_rps == pytest.approx(0.1)


def test_window_leaves_out_requests_completed_after_its_end_or_started_after_it():
    records = [Record(2.0, 500.001, True), Record(2.6, 1.0, True), Record(1.5, 10.0, True)]
    summary = stats.summarize(records, Window(1.0, 2.5))
    assert (summary.count, summary.ok, summary.after_window) == (1, 1, 2)
    assert summary.latency.p99_ms == 10.0


def test_failed_requests_count_in_the_error_ratio_but_not_in_latency_or_throughput():
    records = [Record(1.0 + i * 0.1, 20.0, True) for i in range(9)]
    records += [Record(1.5, 0.5, False, "HTTP 503"), Record(1.6, 0.5, False, "timeout"),
                Record(1.7, 0.5, False, "HTTP 503")]
    records.append(Record(1.9, 2000.0, False, "late"))  # fails after the end: not counted
    summary = stats.summarize(records, Window(1.0, 3.0))
    assert (summary.count, summary.ok, summary.errors, summary.after_window) == (12, 9, 3, 1)
    assert summary.error_ratio == pytest.approx(3 / 12)
    assert summary.throughput_rps == pytest.approx(9 / 2.0)
    assert summary.latency.min_ms == 20.0  # the fast failures do not improve the latency
    assert dict(summary.error_kinds) == {"HTTP 503": 2, "timeout": 1}
    assert list(summary.error_kinds) == ["HTTP 503", "timeout"]
    assert summary.first_error == "HTTP 503"


def test_window_is_empty_when_the_run_stopped_before_the_warmup_ended():
    summary = stats.summarize([Record(0.5, 1.0, True)], Window(5.0, 3.0))
    assert (summary.window.length_s, summary.count, summary.throughput_rps) == (0.0, 0, 0.0)
    assert summary.latency is None and summary.error_ratio == 0.0


def test_stats_module_imports_nothing_heavy():
    code = ("import sys, tools.stats; heavy = {'numpy', 'locust', 'gevent', 'tritonclient'}; "
            "print(sorted(heavy & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- one set of raw records, every report


def _run_records() -> list[gate.RequestRecord]:
    """A run measured over [5 s, 15 s], with a record on every edge of the window rule."""

    def rec(start_s: float, latency_ms: float, ok: bool = True, error: str = ""):
        return gate.RequestRecord("text_embedding", "grpc", "text_embedding", start_s,
                                  latency_ms, ok, error)

    records = [rec(1.0, 5000.0), rec(4.9, 200.0)]  # warm-up, completing inside the window
    # 200 successes in the window with latencies 10, 10.5, ..., 109.5 ms in shuffled order
    records += [rec(5.0 + i * 0.04, 10.0 + (i * 37 % 200) * 0.5) for i in range(200)]
    records.append(rec(14.5, 500.0))  # completes exactly at the end: counted
    records += [rec(6.0 + i, 1.0, False, "HTTP 503" if i < 3 else "timeout") for i in range(5)]
    records += [rec(14.9, 300.0), rec(14.95, 100.0, False, "late")]  # in flight at the end
    records.append(rec(15.5, 1.0))  # started after the end
    return records


# By hand: 201 successes (200 spread + the 500 ms one), 5 failures counted, over 10 s.
# Nearest rank of n = 201: P50 rank 101 -> 60.0, P95 rank 191 -> 105.0, P99 rank 199 -> 109.0,
# P99.9 rank 201 -> 500.0.
EXPECTED = {"ok": 201, "errors": 5, "throughput": 20.1, "p50": 60.0, "p95": 105.0, "p99": 109.0,
            "p99.9": 500.0}


def test_every_report_gives_the_same_figures_when_fed_the_same_raw_records(compare):
    records, window = _run_records(), Window(5.0, 15.0)
    lt = gate.summarize(records, scenario="text_embedding", protocol="grpc", warmup_s=5.0,
                        stop_s=15.0)
    # the load engine's one result, as tools bench, the tuner and the fault tests get it
    engine = Point.from_records(records, window, model="text_embedding", protocol="grpc",
                                concurrency=8)
    comparison = compare.summarise("triton", "grpc", 8, records, window).point
    bench = served_row(engine)  # bench.json's row

    assert (lt.ok, lt.errors, lt.requests) == (EXPECTED["ok"], EXPECTED["errors"], 206)
    assert (lt.excluded_warmup, lt.excluded_after_stop) == (2, 3)
    assert lt.error_ratio == pytest.approx(5 / 206)
    assert lt.latency_ms["p95_ms"] == EXPECTED["p95"]
    assert lt.latency_ms["p99.9_ms"] == EXPECTED["p99.9"]
    assert lt.latency_ms["min_ms"] == 10.0 and lt.latency_ms["max_ms"] == 500.0
    for result in (engine, comparison):
        assert (result.requests, result.errors, result.seconds) == (
            EXPECTED["ok"], EXPECTED["errors"], 10.0)
        assert result.first_error == "HTTP 503"
    assert (bench["requests"], bench["errors"], bench["seconds"], bench["first_error"]) == (
        EXPECTED["ok"], EXPECTED["errors"], 10.0, "HTTP 503")
    for throughput in (lt.throughput_rps, engine.throughput, comparison.throughput,
                       bench["throughput"]):
        assert throughput == pytest.approx(EXPECTED["throughput"])
    for p50, p99 in ((lt.latency_ms["p50_ms"], lt.latency_ms["p99_ms"]),
                     (engine.p50_ms, engine.p99_ms), (comparison.p50_ms, comparison.p99_ms),
                     (bench["p50_ms"], bench["p99_ms"])):
        assert (p50, p99) == (EXPECTED["p50"], EXPECTED["p99"])

    # The GPU check times consecutive calls (no window): the same latencies give the same P50/P99.
    from tools.build_repo.onnx2trt import Timing

    counted = [Timing(r.latency_ms, r.latency_ms) for r in records if r.ok and window.counts(r)]
    row = gpu_check.timing_rows("TensorRT fp16", "minilm_encoder", 8, counted)
    for kind in ("compute", "total"):
        assert (row[f"{kind}_p50_ms"], row[f"{kind}_p99_ms"]) == (
            round(EXPECTED["p50"], 4), round(EXPECTED["p99"], 4))
        assert row[f"{kind}_per_s"] == round(8 / (EXPECTED["p50"] / 1000.0), 1)


def test_requests_in_flight_at_the_end_bound_the_tail_from_below():
    window = stats.Window(0.0, 10.0)
    fast = [stats.Record(1.0 + i * 0.01, 10.0, True) for i in range(90)]
    # Ten requests sent at 4 s that had not completed by the stop (10 s): each took >= 6 s.
    stuck = [stats.Record(4.0, 9000.0, True) for _ in range(10)]

    summary = stats.summarize(fast + stuck, window)

    assert summary.latency.p99_ms == 10.0, "the window rule leaves the stuck requests out"
    assert summary.in_flight_ages_ms == (6000.0,) * 10
    assert summary.tail_lower_bound(99.0) == 6000.0
    assert summary.tail_lower_bound(50.0) == 10.0
