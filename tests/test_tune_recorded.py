"""``tools tune`` from options to report on recorded trials: the search, the budget, infeasible
trials, the confirmation against the start, the results file and the patch.

Each test runs the real command in this process on a spec it builds (ONNX graphs and a Python
model: no export), with the trial runner answering from a real run recorded in tests/data/tune/
(tests/tune_helpers.py) and the budget's clock advanced by each trial's recorded seconds. So the
search must ask for exactly the settings the real run tried, in the same order, and reach the
same winner. The same runs with real trials and their budgets are the system tier's
tests/test_tune_added.py; one real trial runs in the integration tier (tests/test_tune_server.py).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from tests.tune_helpers import RUNS, Replay, built
from tools.cli import cli
from tools.tune import run as tune_run
from tools.tune.knobs import Cores, settings_key
from tools.tune.tuner import Session


@dataclass
class Run:
    """One replayed command: its click result, the replay, its results file and folder."""

    result: Result
    replay: Replay
    data: dict
    folder: Path


def _tune(root: Path, name: str) -> Run:
    """Run recording ``name``'s command on a spec under ``root`` (built on first use)."""
    recording = RUNS[name]
    spec = root / "project" / "repository.yaml"
    if not spec.exists():
        spec = recording.make_spec(root / "project")
        built(spec)
    replay = Replay.of(recording.data())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tune_run, "TrialRunnerImpl", replay.runner)
        patch.setattr(tune_run, "Session", functools.partial(Session, clock=replay.clock))
        patch.setattr(tune_run, "host_cores",  # the recording machine's cores: its knob space
                      lambda spec_cores: Cores(replay.cores.host, spec_cores, replay.cores.source))
        result = CliRunner().invoke(cli, [
            "tune", "--spec", str(spec), "--repository", str(spec.parent / "repo"), "--output",
            str(root / "out"), "--protocol", "grpc", "--scenario", recording.scenario,
            *recording.args])
    folder = root / "out" / recording.scenario
    data = json.loads((folder / "results.json").read_text()) if folder.is_dir() else {}
    return Run(result, replay, data, folder)


@pytest.fixture(scope="module")
def closed(tmp_path_factory) -> Run:
    """The closed-loop recording, replayed once for the module's tests."""
    return _tune(tmp_path_factory.mktemp("closed"), "closed")


def _recorded_order(name: str) -> list[str]:
    """The settings the recorded run tried, in the order it tried them."""
    trials = sorted(Replay.of(RUNS[name].data()).recorded, key=lambda t: t.id)
    return [settings_key(t.settings) for t in trials]


def test_the_search_asks_for_the_recorded_settings_in_order_and_reaches_the_recorded_winner(
    closed,
):
    recorded = RUNS["closed"].data()
    data = closed.data

    assert closed.result.exit_code == 0, closed.result.output
    assert closed.replay.asked == _recorded_order("closed")
    assert [t["settings"] for t in data["trials"]] == [t["settings"] for t in recorded["trials"]]
    assert data["best"]["id"] == recorded["best"]["id"]
    assert data["search"]["complete"] is recorded["search"]["complete"] is True
    assert f"winner: trial {data['best']['id']}:" in closed.result.output
    start = data["trials"][0]["settings"]["scorer"]
    assert start["max_queue_delay_microseconds"] == 100000  # --start, the first trial
    assert data["best"]["settings"]["scorer"] != start  # the search moved away from it
    assert (closed.folder / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_winner_that_is_not_the_start_is_confirmed_in_interleaved_repeats(closed):
    recorded = RUNS["closed"].data()["confirmation"]
    confirmation = closed.data["confirmation"]

    assert closed.result.exit_code == 0, closed.result.output
    assert len(confirmation["start"]["points"]) == len(confirmation["winner"]["points"]) == 3
    assert confirmation["confirmed"] is recorded["confirmed"]
    assert confirmation["reason"] == recorded["reason"]
    assert "min / median / max" in closed.result.output
    assert (f"confirming trial {closed.data['best']['id']} against the start (trial 1)"
            in closed.result.output)


def test_the_winner_becomes_a_patch_of_the_spec(closed):
    patch = (closed.folder / "repository.yaml.patch").read_text()
    winner = closed.data["best"]["settings"]["scorer"]

    assert closed.result.exit_code == 0, closed.result.output
    assert patch.startswith("--- a/repository.yaml\n+++ b/repository.yaml\n"), patch
    added = [line for line in patch.splitlines() if line.startswith("+ ")]
    assert any(f"max_queue_delay_microseconds: {winner['max_queue_delay_microseconds']}" in line
               for line in added), patch


def test_a_rerun_over_the_same_results_reuses_every_trial(closed):
    again = _tune(closed.folder.parents[1], "closed")

    assert again.result.exit_code == 0, again.result.output
    assert again.replay.asked == []  # nothing run again
    assert again.result.output.count("(not rerun)") == len(closed.data["trials"])


def test_a_trial_that_fails_to_load_is_infeasible_with_the_servers_reason(tmp_path):
    run = _tune(tmp_path, "infeasible")
    result, replay, data = run.result, run.replay, run.data

    trials = data["trials"]
    failed = [t for t in trials if t["failure"]]
    assert result.exit_code == 0, result.output
    assert replay.asked == _recorded_order("infeasible")
    assert failed and all(t["settings"]["picky"]["instances"] > 1 for t in failed)
    assert "picky refuses 2 instances" in failed[0]["failure"]
    assert not failed[0]["within_target"] and failed[0]["points"] == []
    assert max(t["id"] for t in trials) > failed[0]["id"]  # the search went on
    assert f"trial {failed[0]['id']}: infeasible: " in result.output
    assert "not the spec's cpu_cores 1" in result.output  # the recording's host had 2
    assert any(t["settings"]["scorer"]["instances"] * t["settings"]["scorer"]["threads"] > 1
               for t in trials if not t["failure"])  # trial specs got the host's cores


def test_the_open_loop_records_rates_and_the_highest_one_met(tmp_path):
    recorded = RUNS["open"].data()

    run = _tune(tmp_path, "open")
    result, replay, data = run.result, run.replay, run.data

    first = data["trials"][0]
    assert result.exit_code == 0, result.output
    assert replay.asked == _recorded_order("open")
    assert [p["rate"] for p in first["points"]][:2] == [5.0, 10.0]
    assert all(p["concurrency"] == 0 for p in first["points"])
    assert data["resume_key"]["rates"] == [5.0, 10.0] and "concurrency" not in data["resume_key"]
    assert first["rate"] == 10.0 and "at r=10" in result.output
    # the budget ends the search where it ended the recorded run
    assert data["search"]["complete"] is recorded["search"]["complete"]
    assert ("rerun to resume" in result.output) is not recorded["search"]["complete"]
