"""``benchmarks/chaos_soak.py``: its accounting (kill windows, RSS, restart counts) and a short run.

The short run is the soak of the README's reliability figures cut to one minute and one kill,
on the toy repository plus an ensemble, through a real ``tools serve``.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools.stats import Record

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "chaos_soak.py"
_spec = importlib.util.spec_from_file_location("chaos_soak", SCRIPT)
chaos = importlib.util.module_from_spec(_spec)
sys.modules["chaos_soak"] = chaos  # its dataclasses look their module up there
_spec.loader.exec_module(chaos)

PIPELINE = {"ensemble_scheduling": {"step": [{"model_name": "double"}, {"model_name": "double"}]}}
OUTER = {"ensemble_scheduling": {"step": [{"model_name": "pipe"}]}}
CONFIGS = {"double": {}, "text": {}, "pipe": PIPELINE, "outer": OUTER}


def test_a_kill_affects_its_model_and_every_ensemble_that_uses_it_directly_or_not():
    assert chaos.affected("double", CONFIGS) == {"double", "pipe", "outer"}
    assert chaos.affected("text", CONFIGS) == {"text"}


def test_only_failures_of_affected_models_overlapping_the_kill_window_are_excused():
    kill = chaos.Kill("double", "double_0_0", at_s=100.0, ready_s=101.0)  # window 100 .. 101+10
    failed = lambda start, ms=5.0: Record(start, ms, False, "HTTP 500 stub not healthy")  # noqa: E731
    lanes = [
        ("pipe", "valid", [failed(99.9, 200.0), failed(105.0), failed(111.5), Record(50.0, 1, True)]),
        ("text", "valid", [failed(100.5)]),  # another model: never excused
        ("pipe", "bad", [Record(106.0, 1, False, "HTTP 400 bad"), failed(120.0, 1)]),  # answered
        ("text", "bad", [Record(30.0, 10_000.0, False, "client timeout")]),  # in the warm-up
    ]

    lost = chaos.count_lost(lanes, [kill], CONFIGS, counted_from_s=40.0, timeout_s=10.0,
                            end_s_=200.0)

    assert (lost.outside, lost.excused) == (2, 2)  # pipe at 111.5 (after the window), text at 100.5
    assert lost.overload == 0  # errors, not timeouts
    assert any(e.startswith("pipe (valid) at +71.5 s") for e in lost.examples)
    assert lost.kinds == {"pipe (valid): HTTP N stub not healthy": 1,
                          "text (valid): HTTP N stub not healthy": 1}


def test_timeouts_under_load_are_counted_apart_from_errors():
    lanes = [("text", "valid", [Record(50.0, 10_000.0, False, "client timeout"),
                                Record(51.0, 900.0, False, "HTTP 503 Request timeout expired"),
                                Record(52.0, 3.0, False, "HTTP 500 stub not healthy"),
                                Record(53.0, 1.0, False, "ConnectionError: connection closed")])]

    lost = chaos.count_lost(lanes, [], CONFIGS, counted_from_s=40.0, timeout_s=10.0, end_s_=99.0)
    found = chaos.misses(chaos.Figures(minutes=1, capacity_rps=0, rate_rps=1,
                                       lost_outside_windows=lost.outside,
                                       lost_to_overload=lost.overload, kills_planned=False,
                                       lost_examples=lost.examples, rss_mb={"growth": 1.0}))

    assert (lost.outside, lost.overload) == (4, 2)
    assert found == [found[0]] and "(target 0: 2 to timeouts under load, 2 to errors)" in found[0]


def test_a_lane_reuses_each_connection_well_within_the_guards_idle_timeout():
    for rate in (0.05, 0.36, 2.6, 40.0, 900.0):
        connections = chaos.lane_connections(rate, timeout_s=10.0)
        assert connections >= 1 and (connections == 1 or connections / rate <= 15.0)
    assert chaos.lane_connections(40.0, timeout_s=10.0) == 402  # room for 10 s of requests


def test_rss_growth_is_taken_from_samples_outside_the_kill_windows_after_the_warm_up():
    kills = [chaos.Kill("double", "double_0_0", at_s=100.0, ready_s=102.0)]
    samples = [(10.0, 500.0), (60.0, 300.0), (105.0, 900.0), (113.0, 320.0)]

    assert chaos.rss_growth(samples, kills, timeout_s=10.0, from_s=50.0) == (300.0, 320.0, 320.0)


def test_the_soak_fails_on_a_lost_request_a_restart_not_counted_or_a_model_not_back():
    good = chaos.Figures(minutes=1, capacity_rps=0, rate_rps=10,
                         kills=[{"model": "double", "ready_s": 1.2}], restarts={"double": 1.0},
                         rss_mb={"growth": 3.0})
    assert chaos.misses(good) == []

    bad = chaos.Figures(minutes=1, capacity_rps=0, rate_rps=10, lost_outside_windows=1,
                        lost_examples=["x"], kills=[{"model": "double", "ready_s": None}] * 2,
                        restarts={"double": 1.0, "text": 1.0}, rss_mb={"growth": 64.0},
                        server_restarts=["tritonserver exited unexpectedly (exit code -11)"])
    found = chaos.misses(bad)

    assert len(found) == 7
    assert "tritonserver restarted 1 times: tritonserver exited unexpectedly" in found[0]
    assert "1 requests lost outside the kill windows" in found[1]
    assert "grew 64.0 MB" in found[2]
    assert "model 'double' was not ready again" in found[3]
    assert "model 'double': 2 kills but 1 restarts in the metrics" in found[5]
    assert "model 'text': 0 kills but 1 restarts in the metrics" in found[6]  # not killed


_ENSEMBLE = (ROOT / "tests" / "test_reliability_recovery.py").read_text().split('_ENSEMBLE = """')[1]
_ENSEMBLE = _ENSEMBLE.split('"""')[0]


@pytest.mark.system
@pytest.mark.reliability
@pytest.mark.server
def test_a_one_minute_chaos_soak_with_one_kill_loses_nothing_outside_the_kill_window(
    toy_repository, tmp_path
):
    repo = tmp_path / "repo"
    shutil.copytree(toy_repository, repo, ignore=shutil.ignore_patterns("__pycache__", "README.md"))
    (repo / "toy_pipeline" / "1").mkdir(parents=True)
    (repo / "toy_pipeline" / "config.pbtxt").write_text(_ENSEMBLE)

    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--repository", str(repo), "--minutes", "1",
         "--kill-every", "20", "--warmup-s", "10", "--rate", "40", "--kill-models", "toy_double",
         "--log", str(tmp_path / "serve.log")],
        capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path)
    figures = json.loads(result.stdout)

    assert result.returncode == 0, (result.stderr[-3000:], figures["misses"])
    assert [k["model"] for k in figures["kills"]] == ["toy_double"]
    assert figures["kills"][0]["ready_s"] < 10
    assert figures["restarts"] == {"toy_double": 1.0}
    assert figures["lost_outside_windows"] == 0
    # the pipeline (toy_double's ensemble) and the other models, valid and bad requests alike,
    # the valid ones over HTTP and (--grpc-share, default a quarter) gRPC
    assert {k for k, n in figures["requests"].items() if n > 0} == {
        f"{m} {kind}" for m in ("toy_classify", "toy_pipeline", "toy_text")
        for kind in ("valid", "bad", "valid grpc")}
    assert all("none" not in answers for answers in figures["bad_answers"].values())
    assert figures["rss_mb"]["growth"] < chaos.RSS_TARGET_MB
