"""``tools tune`` end to end on the embedded server: a short budget, one concurrency level.

Needs the checkout's built model_repository (tools build-repo); bounded well under a minute.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tools.build_repo.spec import load_spec
from tools.cli import cli
from tools.errors import UserInputError
from tools.tune.trial import check_baseline

REPO_ROOT = Path(__file__).resolve().parents[1]
SPEC = REPO_ROOT / "repository.yaml"
BASELINE = REPO_ROOT / "model_repository"
MODELS = ["text_tokenizer", "minilm_encoder", "text_embedding"]


def _baseline_problem() -> str | None:
    try:
        check_baseline(load_spec(SPEC), BASELINE, MODELS, "cpu")
    except UserInputError as exc:
        return str(exc)
    return None


@pytest.mark.server
def test_a_trial_repackages_serves_and_measures_the_pipeline_end_to_end(tmp_path):
    problem = _baseline_problem()
    if problem:
        pytest.skip(f"model_repository is not built from repository.yaml: {problem}")
    result = CliRunner().invoke(cli, [
        "tune", "--scenario", "text_embedding", "--protocol", "http", "--spec", str(SPEC),
        "--repository", str(BASELINE), "--output", str(tmp_path), "--budget-minutes", "0.5",
        "--concurrency", "2", "--warmup", "1", "--duration", "3",
        "--start", "minilm_encoder.max_queue_delay_microseconds=0",
    ])
    assert result.exit_code == 0, result.output
    folder = tmp_path / "text_embedding"
    data = json.loads((folder / "results.json").read_text())
    first = data["trials"][0]
    assert first["settings"]["minilm_encoder"]["max_queue_delay_microseconds"] == 0
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
