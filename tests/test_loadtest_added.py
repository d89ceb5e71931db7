"""``tools loadtest --scenario NAME`` on models a user adds: a CLS-pooling embedder (``tiny``), a
3-label classifier (``sentiment``; tiny BERTs saved by the test), a raw ONNX graph of token ids
and one of float features, each added with ``tools add`` to the session's repository of every
recipe (tests/add_helpers.py), built, served, and gated on the SLO ``tools add`` wrote.

Every run is short (1 s warm-up + 3 s) and bounded twice: Locust's own hard timeout
(``--timeout``) and the subprocess timeout around ``tools loadtest``.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.add_helpers import VOCABULARY
from tools import paths

pytestmark = [pytest.mark.torch, pytest.mark.server, pytest.mark.load, pytest.mark.timeout(900)]
RUN = ["--warmup", "1", "--duration", "3", "--timeout", "120"]


@pytest.fixture(scope="module")
def added(added_models):
    """The session's repository of every recipe (tests/add_helpers.py), served."""
    return {"root": added_models.root, "spec": added_models.spec, "server": added_models.server}


def _loadtest(added, report: Path, *args: str) -> subprocess.CompletedProcess:
    server = added["server"]
    return subprocess.run(
        [sys.executable, "-m", "tools.cli", "loadtest", "--spec", str(added["spec"]),
         "--url", server.http_url, "--grpc-url", server.grpc_url, "--output", str(report),
         *RUN, *args],
        capture_output=True, text=True, timeout=600, cwd=paths.CHECKOUT)


def _summary(report: Path, scenario: str, protocol: str) -> dict:
    return json.loads((report / f"{scenario}-{protocol}" / "summary.json").read_text())


def test_added_pipelines_pass_with_the_slo_tools_add_wrote(added, tmp_path):
    result = _loadtest(added, tmp_path, "--scenario", "tiny", "--scenario", "sentiment")
    assert result.returncode == 0, result.stdout + result.stderr
    slo_file = added["root"] / "slo.yaml"
    for scenario in ("tiny", "sentiment"):
        for protocol in ("http", "grpc"):
            summary = _summary(tmp_path, scenario, protocol)
            (gated,) = summary["results"]
            assert gated["targets_from"] == str(slo_file)
            assert gated["targets"] == {"p99_ms": 1000.0, "max_error_ratio": 0.0,
                                        "min_throughput_rps": None}
            assert summary["users"] == 4  # the load tools add wrote
            assert gated["summary"]["ok"] > 0 and gated["summary"]["errors"] == 0
            (inputs,) = summary["load"][scenario]["inputs"]
            assert inputs.startswith("TEXT: text, 418 rows from ")
            assert f"backend text_tokenizer of {scenario}_tokenizer" in inputs


def test_raw_onnx_models_are_loaded_with_generated_inputs(added, tmp_path):
    result = _loadtest(added, tmp_path, "--scenario", "token_sum", "--scenario", "scorer",
                       "--protocol", "grpc")
    assert result.returncode == 0, result.stdout + result.stderr
    ids = _summary(tmp_path, "token_sum", "grpc")
    described = " ".join(ids["load"]["token_sum"]["inputs"])
    assert f"token ids in [0, {VOCABULARY})" in described and "tokenizer.json" in described
    assert ids["results"][0]["summary"]["errors"] == 0  # an id past the vocabulary fails Gather
    assert "standard normal" in _summary(tmp_path, "scorer", "grpc")["load"]["scorer"]["inputs"][0]


def test_an_id_past_the_vocabulary_fails_the_gate(added, tmp_path):
    # The control of the test above: ONNX Runtime refuses an out-of-vocabulary id.
    data = tmp_path / "oov.jsonl"
    data.write_text(json.dumps({"input_ids": [1, VOCABULARY + 5], "attention_mask": [1, 1]}) + "\n")
    result = _loadtest(added, tmp_path / "report", "--scenario", "token_sum", "--protocol", "grpc",
                       "--data", str(data))
    assert result.returncode == 1, result.stdout + result.stderr
    verdict = next(line for line in result.stdout.splitlines() if line.startswith("SLO FAIL"))
    assert verdict.startswith("SLO FAIL token_sum/grpc (cpu profile): no successful request")
    assert "error ratio 1.0000 (" in verdict


def test_a_json_lines_file_is_what_is_sent(added, tmp_path):
    data = tmp_path / "features.jsonl"
    data.write_text("".join(json.dumps({"features": [float(i + j) for j in range(6)]}) + "\n"
                            for i in range(3)))
    result = _loadtest(added, tmp_path / "report", "--scenario", "scorer", "--protocol", "http",
                       "--data", str(data))
    assert result.returncode == 0, result.stdout + result.stderr
    with (tmp_path / "report" / "scorer-http" / "requests.csv").open() as handle:
        labels = {row["payload"] for row in csv.DictReader(handle)}
    assert labels == {"line-1", "line-2", "line-3"}
