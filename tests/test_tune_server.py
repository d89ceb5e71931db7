"""``tools tune`` end to end on the embedded server: a short budget, one concurrency level.

The one real trial of the integration tier (``--max-trials 1``): the session's build of the
project's spec is the baseline the trial repackages; under a minute. The search, the
confirmation and the results on recorded trials: tests/test_tune_recorded.py; budgets of minutes:
tests/test_tune_added.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tools.cli import cli

REPO_ROOT = Path(__file__).resolve().parents[1]
SPEC = REPO_ROOT / "repository.yaml"


@pytest.mark.torch
@pytest.mark.server
@pytest.mark.timeout(300)
def test_a_trial_repackages_serves_and_measures_the_pipeline_end_to_end(built_repository, tmp_path):
    baseline = built_repository  # read only: each trial repackages a snapshot of its models
    result = CliRunner().invoke(cli, [
        "tune", "--scenario", "text_embedding", "--protocol", "http", "--spec", str(SPEC),
        "--repository", str(baseline), "--output", str(tmp_path / "out"), "--budget-minutes", "0.5",
        "--max-trials", "1", "--concurrency", "2", "--warmup", "1", "--duration", "3",
        "--start", "minilm_encoder.max_queue_delay_microseconds=1000",
    ])
    assert result.exit_code == 0, result.output
    folder = tmp_path / "out" / "text_embedding"
    data = json.loads((folder / "results.json").read_text())
    (first,) = data["trials"]
    assert "the trial limit ran out before the search converged" in result.output
    assert first["settings"]["minilm_encoder"]["max_queue_delay_microseconds"] == 1000
    assert first["build"]["minilm_encoder"] == "repackaged"
    point = first["points"][0]
    assert point["requests"] > 0 and point["p99_ms"] > 0
    assert point["models"]["minilm_encoder"]["mean_batch"] >= 1.0
    assert point["models"]["text_tokenizer"]["requests"] > 0
    assert data["best"] is not None and (folder / "pareto.png").is_file()
    patch = (folder / "repository.yaml.patch").read_text()
    assert patch == "" or patch.startswith("--- a/repository.yaml")
    assert not list(SPEC.parent.glob(".repository.tune-*.yaml"))  # trial specs are removed
    assert not (folder / ".work").exists()  # trial folders are removed
