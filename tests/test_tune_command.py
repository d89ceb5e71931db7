"""``tools tune`` on bad input, and refusing a server whose models it cannot change.

Every case fails before any trial runs, so no server is started.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from click.testing import CliRunner
from tritonclient.utils import InferenceServerException

from tools.cli import cli
from tools.errors import ServerError, UserInputError
from tools.tune import servers
from tools.tune.servers import RemoteTarget

REPO_ROOT = Path(__file__).resolve().parents[1]
SPEC = REPO_ROOT / "repository.yaml"


def _tune(tmp_path: Path, *args: str):
    return CliRunner().invoke(cli, ["tune", "--spec", str(SPEC), "--output", str(tmp_path / "out"),
                                    *args])


def test_tune_is_listed_by_tools_help():
    result = CliRunner().invoke(cli, ["--help"])
    assert "tune" in result.output and "P99" in result.output


def test_an_unknown_scenario_is_a_usage_error_listing_the_scenarios(tmp_path):
    result = _tune(tmp_path, "--scenario", "nope")
    assert result.exit_code == 2
    assert "--scenario nope: not a pipeline or model of" in result.output
    assert "(known: text_embedding, " in result.output


def test_a_scenario_with_targets_but_no_pipeline_in_the_spec_is_a_usage_error(tmp_path):
    slo = tmp_path / "slo.yaml"
    targets = "{p99_ms: 100, max_error_ratio: 0.0, min_throughput_rps: 1}"
    slo.write_text(f"profiles:\n  cpu:\n    scenarios:\n      ghost:\n        load: {{users: 1}}\n"
                   f"        http: {targets}\n        grpc: {targets}\n")
    result = _tune(tmp_path, "--scenario", "ghost", "--slo-file", str(slo))
    assert result.exit_code == 2 and "--scenario ghost: not a pipeline or model" in result.output


def test_a_scenario_without_an_slo_entry_needs_p99_ms(tmp_path):
    result = _tune(tmp_path, "--scenario", "minilm_encoder")
    assert result.exit_code == 2
    assert "profile 'cpu' has no scenario 'minilm_encoder'" in result.output
    assert "give --p99-ms" in result.output


def test_p99_ms_alone_is_enough_for_a_scenario_without_an_slo_entry(tmp_path):
    # Past the SLO, the next check is the baseline: the targets were accepted.
    result = _tune(tmp_path, "--scenario", "image_classification", "--p99-ms", "800",
                   "--slo-file", str(tmp_path / "no-slo.yaml"), "--repository", str(tmp_path / "none"))
    assert result.exit_code == 2 and "tools build-repo" in result.output, result.output


def test_a_budget_too_small_for_one_trial_is_a_usage_error(tmp_path):
    result = _tune(tmp_path, "--scenario", "text_embedding", "--budget-minutes", "0.2")
    assert result.exit_code == 2 and "too small for one trial" in result.output


def test_a_descending_concurrency_ladder_is_refused(tmp_path):
    result = _tune(tmp_path, "--scenario", "text_embedding", "--concurrency", "8,4")
    assert result.exit_code == 2 and "ascending" in result.output


def test_a_missing_baseline_repository_names_the_build_command(tmp_path):
    result = _tune(tmp_path, "--scenario", "text_embedding", "--repository",
                   str(tmp_path / "none"))
    assert result.exit_code == 2 and "tools build-repo" in result.output


def test_a_start_the_spec_would_refuse_is_a_usage_error_naming_the_field(tmp_path):
    result = _tune(tmp_path, "--scenario", "text_embedding",
                   "--start", "minilm_encoder.preferred_batch_size=64")
    assert result.exit_code == 2 and "preferred_batch_size" in result.output


def test_a_url_without_the_admin_key_is_a_usage_error_naming_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(servers.ADMIN_KEY_ENV, raising=False)
    result = _tune(tmp_path, "--scenario", "text_embedding", "--url", "127.0.0.1:9")
    assert result.exit_code == 2 and "TRITON_ADMIN_KEY" in result.output


class _FakeTriton:
    """An HTTP client of a server in --model-control-mode=none (as docker-compose.yml runs)."""

    def __init__(self, load_error: str | None):
        self.load_error = load_error
        self.loads = []

    def get_model_repository_index(self, headers=None):
        return [{"name": n, "state": "READY"} for n in ("text_tokenizer", "minilm_encoder",
                                                        "text_embedding")]

    def get_model_config(self, model):
        return {"name": model}

    def load_model(self, model, headers=None, config=None):
        self.loads.append((model, headers))
        if self.load_error:
            raise InferenceServerException(self.load_error)

    def is_model_ready(self, model):
        return True


def _remote(monkeypatch, triton):
    @contextlib.contextmanager
    def fake_client(url, timeout_s):
        yield triton

    monkeypatch.setattr(servers.health, "client", fake_client)
    return RemoteTarget("127.0.0.1:8000", "127.0.0.1:8001", ["text_tokenizer", "minilm_encoder"],
                        "text_embedding", key="k")


def test_a_server_without_explicit_model_control_is_refused_clearly(monkeypatch):
    triton = _FakeTriton("explicit model load / unload is not allowed if polling is enabled")
    with pytest.raises(ServerError, match="model-control-mode=explicit"):
        _remote(monkeypatch, triton).check()


def test_a_server_that_allows_loads_is_checked_with_the_admin_header(monkeypatch):
    triton = _FakeTriton(None)
    _remote(monkeypatch, triton).check()
    assert triton.loads and triton.loads[0][1]["admin-key"] == "k"


def test_a_remote_target_without_a_key_is_bad_input(monkeypatch):
    monkeypatch.delenv(servers.ADMIN_KEY_ENV, raising=False)
    with pytest.raises(UserInputError, match="TRITON_ADMIN_KEY"):
        RemoteTarget("127.0.0.1:8000", "127.0.0.1:8001", ["m"], "p")
