"""``tools tune`` on what a user adds: a 3-label classifier pipeline tuned in three minutes with
only ``--p99-ms``, a pipeline whose Python step really refuses to load with two instances
(recorded infeasible with the server's reason, the search goes on), and an open-loop run.

Real trials: each repackages the added models, starts an embedded tritonserver and loads it.
Every run is bounded by its budget and by a subprocess timeout. The system tier: minutes of
budgets. The same search, confirmation and results on recorded trials are the fast tier's
tests/test_tune_recorded.py (tests/tune_helpers.py records these runs' specs again).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.add_helpers import tiny_bert_folder
from tests.scenario_helpers import start_spec
from tests.tune_helpers import built, picky_spec, scorer_spec
from tools import paths
from tools.add.command import add_model

pytestmark = [pytest.mark.system, pytest.mark.torch, pytest.mark.server, pytest.mark.load]
SHORT = ["--warmup", "1", "--duration", "3"]


def _tune(spec: Path, repository: Path, output: Path, *args: str,
          timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tools.cli", "tune", "--spec", str(spec), "--repository",
         str(repository), "--output", str(output), "--protocol", "grpc", *args],
        capture_output=True, text=True, timeout=timeout_s, cwd=paths.CHECKOUT)


@pytest.mark.timeout(900)
def test_an_added_classifier_is_tuned_with_p99_ms_alone_in_three_minutes(tmp_path):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    spec = start_spec(tmp_path)
    add_model("hf-sequence-classification",
              str(tiny_bert_folder(tmp_path / "clf", ["negative", "neutral", "positive"])),
              "clf3", spec)
    (tmp_path / "slo.yaml").unlink()  # --p99-ms alone is enough
    repository = built(spec)
    result = _tune(spec, repository, tmp_path / "out", "--scenario", "clf3", "--p99-ms", "800",
                   "--budget-minutes", "3", "--concurrency", "2,4", *SHORT, timeout_s=720)
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((tmp_path / "out" / "clf3" / "results.json").read_text())
    key = data["resume_key"]
    assert (key["p99_ms"], key["max_error_ratio"], key["concurrency"]) == (800.0, 0.0, [2, 4])
    assert {"clf3_tokenizer", "clf3_classifier", "clf3_postprocess"} <= set(key["exports"])
    assert key["spec"] and key["data"] and key["scenario"] == "clf3"
    assert data["target"]["from"] == "--p99-ms"
    tuned = {m for t in data["trials"] for m in t["settings"]}
    assert tuned == {"clf3_tokenizer", "clf3_classifier", "clf3_postprocess"}
    assert data["best"] is not None and "winner: trial" in result.stdout
    confirmation = data["confirmation"]
    if confirmation is None:  # the start won: nothing to confirm
        assert "the start is the winner" in result.stdout
    else:
        assert len(confirmation["start"]["points"]) == len(confirmation["winner"]["points"]) == 3
        assert "min / median / max" in result.stdout


@pytest.mark.timeout(900)
def test_a_trial_that_fails_to_load_is_infeasible_with_the_servers_reason(tmp_path):
    spec = picky_spec(tmp_path)  # cpu_cores 1: the host has more
    repository = built(spec)
    result = _tune(spec, repository, tmp_path / "out", "--scenario", "picky_scorer",
                   "--p99-ms", "800", "--budget-minutes", "2", "--concurrency", "2",
                   "--warmup", "1", "--duration", "2", timeout_s=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    trials = json.loads((tmp_path / "out" / "picky_scorer" / "results.json").read_text())["trials"]
    failed = [t for t in trials if t["failure"]]
    assert failed, output
    assert all(t["settings"]["picky"]["instances"] > 1 for t in failed)
    assert "picky refuses 2 instances" in failed[0]["failure"]
    assert not failed[0]["within_target"] and failed[0]["points"] == []
    assert max(t["id"] for t in trials) > failed[0]["id"]  # the search went on
    assert f"trial {failed[0]['id']}: infeasible: " in result.stderr
    if len(os.sched_getaffinity(0)) > 1:
        assert "not the spec's cpu_cores 1" in result.stderr
        assert any(t["settings"]["scorer"]["instances"] * t["settings"]["scorer"]["threads"] > 1
                   for t in trials if not t["failure"])  # trial specs got the host's cores


@pytest.mark.timeout(600)
def test_the_open_loop_records_rates_and_the_highest_one_met(tmp_path):
    spec = scorer_spec(tmp_path)
    repository = built(spec)
    result = _tune(spec, repository, tmp_path / "out", "--scenario", "scorer", "--p99-ms", "800",
                   "--budget-minutes", "0.7", "--rate", "5,10", "--warmup", "1", "--duration",
                   "2", timeout_s=400)
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((tmp_path / "out" / "scorer" / "results.json").read_text())
    first = data["trials"][0]
    assert [p["rate"] for p in first["points"]][:2] == [5.0, 10.0]
    assert all(p["concurrency"] == 0 for p in first["points"])
    assert data["resume_key"]["rates"] == [5.0, 10.0] and "concurrency" not in data["resume_key"]
    assert first["rate"] == 10.0 and "at r=10" in result.stdout
