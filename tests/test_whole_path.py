"""The whole path on four models the project never saw, run as the README tells a user to.

The commands are read from the code block of the README section "From your model to a
P99-gated deployment" and run one by one through ``bash -c`` in a fresh folder (``cd`` lines
move it), with the variables the block uses set here: the models' folder, free loopback ports, a
short tuning budget. Between them the test checks what the commands promise: after
``tools serve --background``, parity of every added model with its reference library over HTTP
and gRPC (max abs diff <= 1e-4); after ``tools loadtest``, a passed gate per scenario and
protocol; after ``tools tune``, a winner; after ``tools deploy k8s``, manifests valid against the
Kubernetes schemas and the CRDs, strictly. Only ``tools deploy package`` is run in-process with a
recording engine (no container engine or registry for tests here; the real build is
tests/test_deploy_podman.py). The server is stopped at the end whatever happens.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from tests.add_helpers import PROTOCOLS, TEXTS, infer_inputs, text_batch
from tests.whole_path_models import (cross_encoder_scores, embeddings, make_models, mean_pooled,
                                     probabilities)
from tools.net import free_ports

REPO_ROOT = Path(__file__).resolve().parents[1]
SECTION = "## From your model to a P99-gated deployment"
TOLERANCE = 1e-4
TUNE_MINUTES = "1"  # the least `tools tune` takes for one trial at its default ladder (it says 0.9)
STEP_TIMEOUT_S = {"build-repo": 900, "loadtest": 600, "tune": 600}
DEFAULT_STEP_TIMEOUT_S = 300
PAIRS = [("How do I bake bread?", "Mix flour, water and yeast, let it rise, then bake it."),
         ("How do I bake bread?", "The cat sits outside on the warm stones."),
         ("A man is eating food.", "Someone eats a meal.")]
TOKEN_IDS = [[101, 1037, 2158, 2003, 5983, 2833, 1012, 102],
             [101, 1996, 4937, 7719, 2648, 2006, 1996, 4010, 102]]


def readme_commands(readme: Path = REPO_ROOT / "README.md") -> list[str]:
    """The commands of the section's ``sh`` block, continuation lines joined, comments dropped."""
    text = readme.read_text(encoding="utf-8")
    start = text.index(SECTION) + len(SECTION)
    end = text.find("\n## ", start)
    block = re.search(r"```sh\n(.*?)```", text[start:end if end != -1 else None], re.DOTALL)
    assert block, f"README.md: no ```sh block under {SECTION!r}"
    joined = block.group(1).replace("\\\n", " ")
    return [" ".join(line.split()) for line in joined.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def _subcommand(command: str) -> str:
    words = shlex.split(command)
    return " ".join(words[:3] if words[:2] == ["tools", "deploy"] else words[:2])


def test_the_readme_block_walks_the_whole_path():
    """The block holds every step, in order (so the run below cannot silently skip one)."""
    steps = [_subcommand(c) for c in readme_commands()]
    wanted = ["tools init", "cd my-project", "tools add", "tools build-repo", "tools serve",
              "tools infer", "curl -fsS", "tools loadtest", "tools serve", "tools tune",
              "tools deploy package", "tools deploy k8s"]
    assert [s for i, s in enumerate(steps) if i == 0 or steps[i - 1] != s] == wanted, steps
    recipes = [shlex.split(c)[2] for c in readme_commands() if c.startswith("tools add ")]
    assert recipes == ["hf-text-embedding", "hf-sequence-classification", "hf-cross-encoder",
                       "onnx"]


def _environment(tmp_path: Path) -> dict[str, str]:
    """This process's environment, the venv's ``tools`` first on PATH, and the block's variables."""
    http, grpc, metrics = free_ports(3)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(MODEL_DIR=str(tmp_path / "models"), HTTP_PORT=str(http), GRPC_PORT=str(grpc),
               METRICS_PORT=str(metrics), TUNE_MINUTES=TUNE_MINUTES,
               REGISTRY="registry.example/you", SERVING_IMAGE="registry.example/you/triton:cpu")
    return env


def _run(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``command`` as a user types it (bash), under a hard timeout; a failure shows its output."""
    step = shlex.split(command)[1]
    result = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=STEP_TIMEOUT_S.get(step, DEFAULT_STEP_TIMEOUT_S),
                            check=False)
    assert result.returncode == 0, (f"{command}\nexit {result.returncode}\n--- stdout\n"
                                    f"{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}")
    return result


class _Engine:
    """Records engine commands like ``tests.test_deploy_artifact.Engine``, keeping the staged
    build context's file sizes (the weights are binary), and answers as podman would."""

    def __init__(self) -> None:
        self.staged: dict[str, int] = {}

    def __call__(self, command: list[str], timeout: float | None = None):
        from tests.test_deploy_artifact import Engine

        if command[1] == "build":
            context = Path(command[-1])
            self.staged = {str(p.relative_to(context)): p.stat().st_size
                           for p in context.rglob("*") if p.is_file()}
            return subprocess.CompletedProcess(command, 0, "", "")
        return Engine()(command, timeout)


def _words(command: str, cwd: Path, env: dict[str, str]) -> list[str]:
    """``command``'s words as bash expands them (quotes, ``$VAR``)."""
    printed = subprocess.run(["bash", "-c", f"printf '%s\\0' {command}"], cwd=cwd, env=env,
                             capture_output=True, text=True, timeout=30, check=True).stdout
    return printed.split("\0")[:-1]


def _package_with_a_recording_engine(command: str, cwd: Path, env: dict[str, str]) -> None:
    """``tools deploy package`` in-process: the real verification of the built repository, the
    real staging and record, the container engine recorded."""
    from unittest import mock

    from tools.deploy import artifact
    from tools.deploy.artifact import default_record_path, package

    words = _words(command, cwd, env)
    option = {w: words[i + 1] for i, w in enumerate(words) if w.startswith("--") and i + 1 < len(words)}
    repository = cwd / option["--repository"]
    engine = _Engine()
    # the recorder is the engine: podman need not be installed (a fresh machine has none)
    with mock.patch.object(artifact, "pick_engine", lambda name=None: name or "podman"):
        record = package(repository, option["--name"], option["--copier-image"], engine="podman",
                         push="--push" in words, run=engine)
    assert engine.staged["repository/minilm_onnx/1/model.onnx"] > 80_000_000  # the user's file
    assert any(k.startswith("repository/clf3_classifier/1/") for k in engine.staged)
    default_record_path(repository).write_text(record.to_text(), encoding="utf-8")


def _check_parity(urls: SimpleNamespace, models: dict[str, Path]) -> dict[str, float]:
    """Every added model against its reference library, over both protocols; the worst diffs."""
    references = {
        "cls_embedder": ({"TEXT": text_batch(TEXTS)}, "EMBEDDING",
                         embeddings(models["cls_embedder"], TEXTS)),
        "clf3": ({"TEXT": text_batch(TEXTS)}, "PROBABILITIES",
                 probabilities(models["classifier"], TEXTS)),
        "reranker": ({"TEXT": text_batch([a for a, _ in PAIRS]),
                      "TEXT_PAIR": text_batch([b for _, b in PAIRS])}, "SCORE",
                     cross_encoder_scores(models["cross_encoder"], PAIRS).reshape(-1, 1)),
    }
    worst = {}
    for protocol in PROTOCOLS:
        for name, (inputs, output, expected) in references.items():
            served = infer_inputs(urls, protocol, name, inputs, [output])[output]
            assert served.shape == expected.shape, (name, protocol, served.shape)
            worst[f"{name}/{protocol}"] = float(np.abs(served - expected).max())
        # the raw ONNX model: one request per row (no padding), token ids as a user sends them
        for ids in TOKEN_IDS:
            tensor = np.array([ids], np.int64)
            served = infer_inputs(urls, protocol, "minilm_onnx",
                                  {"input_ids": tensor, "attention_mask": np.ones_like(tensor)},
                                  ["embedding"])["embedding"]
            diff = float(np.abs(served - mean_pooled([ids])).max())
            worst[f"minilm_onnx/{protocol}"] = max(worst.get(f"minilm_onnx/{protocol}", 0.0), diff)
    assert all(d <= TOLERANCE for d in worst.values()), worst
    return worst


def _check_loadtest(project: Path) -> None:
    for scenario in ("cls_embedder", "clf3", "reranker", "minilm_onnx"):
        for protocol in PROTOCOLS:
            report = json.loads((project / "loadtest-report" / f"{scenario}-{protocol}" /
                                 "summary.json").read_text())
            (result,) = report["results"]
            assert result["targets_from"] == str(project / "slo.yaml"), result["targets_from"]
            assert result["summary"]["requests"] > 0 and not result["violations"], result


def _check_tune(project: Path) -> None:
    results = json.loads((project / "reports" / "tune" / "clf3" / "results.json").read_text())
    assert results["target"]["p99_ms"] == 800.0 and results["best"] is not None
    assert {"clf3_tokenizer", "clf3_classifier", "clf3_postprocess"} <= set(
        results["trials"][0]["settings"])


def _check_manifests(project: Path) -> None:
    """The rendered manifests, strictly, as tests/test_deploy_validate.py checks its renders."""
    from tests.test_deploy_validate import (CRD_KINDS, K8S_VERSIONS, _crd_schemas, _validator,
                                            kubernetes_validate)
    from tools.deploy.artifact import ArtifactRecord

    docs = [d for p in sorted((project / "k8s" / "manifests").glob("*.yaml"))
            for d in yaml.safe_load_all(p.read_text()) if d]
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "NetworkPolicy", "PodDisruptionBudget", "PodMonitor",
            "PrometheusRule", "HorizontalPodAutoscaler"} <= kinds, kinds
    for version in K8S_VERSIONS:
        for doc in docs:
            if doc["kind"] not in CRD_KINDS:
                kubernetes_validate.validate(doc, version, strict=True)
    schemas = _crd_schemas()
    for doc in docs:
        if doc["kind"] in CRD_KINDS:
            _validator(schemas[(doc["apiVersion"], doc["kind"])]).validate(doc)
    record = ArtifactRecord.read(project / "model_repository.artifact.json")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    images = [c["image"] for c in deployment["spec"]["template"]["spec"]["initContainers"]]
    assert record.reference in images and record.reference.startswith("registry.example/"), images
    assert record.weights_bytes["cls_embedder_encoder"] > 80_000_000  # MiniLM's real weights


def _stop(project: Path, env: dict[str, str]) -> None:
    """``tools serve --stop`` if the block's own stop did not run (a step failed before it)."""
    if (project / "server.pid").exists():
        subprocess.run(["bash", "-c", "tools serve --stop --pid-file server.pid --exit-timeout 10"],
                       cwd=project, env=env, capture_output=True, timeout=120, check=False)


@pytest.mark.system
@pytest.mark.torch
@pytest.mark.server
@pytest.mark.load
@pytest.mark.timeout(2400)
def test_your_models_go_the_whole_path_as_the_readme_says(tmp_path):
    env = _environment(tmp_path)
    timings: dict[str, float] = {}
    start = time.monotonic()
    models = make_models(tmp_path / "models")
    timings["make models"] = round(time.monotonic() - start, 1)
    cwd = tmp_path
    project = tmp_path / "my-project"
    try:
        for command in readme_commands():
            step, began = _subcommand(command), time.monotonic()
            if command.startswith("cd "):
                cwd = (cwd / _words(command, cwd, env)[1]).resolve()
                continue
            if step == "tools deploy package":
                _package_with_a_recording_engine(command, cwd, env)
            else:
                result = _run(command, cwd, env)
            if "--background" in command:
                urls = SimpleNamespace(http_url=f"127.0.0.1:{env['HTTP_PORT']}",
                                       grpc_url=f"127.0.0.1:{env['GRPC_PORT']}")
                parity = _check_parity(urls, models)
                print("parity max abs diff: " + ", ".join(f"{k} {v:.1e}" for k, v in parity.items()))
            elif command.startswith("curl ") and "/v1/embeddings" in command:
                answer = json.loads(result.stdout)  # the OpenAI route, through the front
                assert [len(d["embedding"]) for d in answer["data"]] == [384, 384], answer
                assert answer["usage"]["prompt_tokens"] > 0
            elif step == "tools loadtest":
                _check_loadtest(cwd)
            elif step == "tools tune":
                assert "winner" in result.stdout, result.stdout
                _check_tune(cwd)
            elif step == "tools deploy k8s":
                _check_manifests(cwd)
            timings[step] = round(timings.get(step, 0) + time.monotonic() - began, 1)
        assert cwd == project
        assert not (project / "server.pid").exists()  # the block's own `tools serve --stop` ran
    finally:
        _stop(project, env)
        print("whole-path timings (s): " + ", ".join(f"{k} {v}" for k, v in timings.items())
              + f", total {round(time.monotonic() - start, 1)}")
