"""`build_repository` end to end on a small toy model: atomic, incremental, parity-checked.

The toy encoder (defined here, exported for real) plus the real ``text_tokenizer`` backend and an
ensemble make a repository of every kind; a broken variant perturbs its ONNX graph on purpose.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
VOCAB = 30522
WIDTH = 8

torch = pytest.importorskip("torch", reason="the toy build exports a real PyTorch model")
pytestmark = pytest.mark.torch


class ToyEncoder(torch.nn.Module):
    """Masked mean of token embeddings, plus two per-row scalars: three outputs."""

    def __init__(self, broken: bool = False) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        with torch.no_grad():
            self.embed.weight.copy_(torch.randn(VOCAB, WIDTH, generator=generator))
        self.broken = broken

    def forward(self, input_ids, attention_mask):
        mask = attention_mask.unsqueeze(-1).to(torch.float32)
        counts = mask.sum(dim=1).clamp(min=1.0)
        pooled = (self.embed(input_ids) * mask).sum(dim=1) / counts
        length = counts
        norm = pooled.norm(dim=1, keepdim=True)
        if self.broken and torch.onnx.is_in_onnx_export():
            # Only the exported graph changes: ONNX Runtime will disagree with PyTorch.
            pooled = pooled + 0.5
            length = length * 2.0
        return pooled, length, norm


def build_toy() -> torch.nn.Module:
    return ToyEncoder().eval()


def build_broken_toy() -> torch.nn.Module:
    return ToyEncoder(broken=True).eval()


def build_interrupted_toy() -> torch.nn.Module:
    raise KeyboardInterrupt  # as if the person pressed Ctrl-C while the model loads


def toy_sample_inputs(batch_size, axes):
    length = axes["sequence"]
    generator = torch.Generator().manual_seed(batch_size * 1000 + length)
    ids = torch.randint(1, 2000, (batch_size, length), generator=generator)
    lengths = torch.randint(1, length + 1, (batch_size,), generator=generator)
    lengths[0] = length
    mask = (torch.arange(length)[None, :] < lengths[:, None]).to(torch.int64)
    return {"input_ids": ids * mask, "attention_mask": mask}


def _toy_spec(tmp_path: Path, source: str = "test_build_repository:build_toy", **changes) -> Path:
    project = yaml.safe_load((REPO_ROOT / "repository.yaml").read_text())
    tokenizer = project["python_models"]["text_tokenizer"]
    tokenizer["max_batch_size"] = 8
    tokenizer["instances"] = {"cpu": {"count": 1}}
    outputs = [
        {"name": "pooled", "dtype": "float32", "shape": ["batch", WIDTH]},
        {"name": "length", "dtype": "float32", "shape": ["batch", 1]},
        {"name": "norm", "dtype": "float32", "shape": ["batch", 1]},
    ]
    data = {
        "target": "cpu",
        "backends": str(REPO_ROOT / "backends" / "python"),
        "models": {
            "toy_encoder": {
                "source": source,
                "sample_inputs": "test_build_repository:toy_sample_inputs",
                "max_batch_size": 8,
                "inputs": [
                    {"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence"], "pad_value": 0},
                    {"name": "attention_mask", "dtype": "int64", "shape": ["batch", "sequence"], "pad_value": 0},
                ],
                "outputs": outputs,
                "axes": {"sequence": {"min": 1, "opt": 8, "max": 64, "parity": [4, 16]}},
                "tolerance": {"atol": 1e-5, "rtol": 1e-5},
                "instances": {"cpu": {"count": 1, "intra_op_threads": 1}},
                "warmup": {"batch_sizes": [1, 4], "axes": {"sequence": 8}},
            }
        },
        "python_models": {"text_tokenizer": tokenizer},
        "pipelines": {
            "toy_text": {
                "max_batch_size": 8,
                "inputs": [{"name": "TEXT", "dtype": "string", "shape": ["batch", 1]}],
                "outputs": [{**o, "name": o["name"].upper()} for o in outputs],
                "steps": [
                    {"model": "text_tokenizer", "inputs": {"TEXT": "TEXT"},
                     "outputs": {"input_ids": "ids", "attention_mask": "mask"}},
                    {"model": "toy_encoder", "inputs": {"input_ids": "ids", "attention_mask": "mask"},
                     "outputs": {"pooled": "POOLED", "length": "LENGTH", "norm": "NORM"}},
                ],
            }
        },
    }
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node[key]
        node[leaf] = value
    path = tmp_path / "repository.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def tree_digest(root: Path) -> str:
    """Hash of every path (files and folders) and every file's bytes under ``root``."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from tools.build_repo.pipeline import build_repository

    tmp = tmp_path_factory.mktemp("toy")
    spec = _toy_spec(tmp)
    output = tmp / "model_repository"
    result = build_repository(spec, output, progress=False)
    return spec, output, result


def test_build_writes_every_model_when_the_repository_is_empty(built):
    _, output, result = built
    assert {m.name: m.status for m in result.models} == {
        "toy_encoder": "built", "text_tokenizer": "built", "toy_text": "built"
    }
    encoder = output / "toy_encoder"
    for relative in ("config.pbtxt", "1/model.onnx", "1/model.onnx.reproduce.sh", "1/model.py",
                     "1/pipeline_ops/__init__.py", "warmup/input_ids_batch4.bin"):
        assert (encoder / relative).is_file(), relative
    assert (output / "text_tokenizer" / "1" / "tokenizer.json").is_file()
    assert (output / "toy_text" / "1").is_dir()
    assert not list(output.parent.glob(".model_repository.*"))
    assert not [p for p in output.iterdir() if p.name.startswith(".") and p.is_dir()]


def test_warmup_files_hold_real_sample_inputs_in_triton_raw_format(built):
    _, output, _ = built
    raw = (output / "toy_encoder" / "warmup" / "attention_mask_batch4.bin").read_bytes()
    expected = toy_sample_inputs(4, {"sequence": 8})["attention_mask"].numpy()
    assert np.array_equal(np.frombuffer(raw, dtype=np.int64).reshape(4, 8), expected)


def test_reproduce_script_rebuilds_the_artifact_with_the_exact_command(built):
    spec, output, _ = built
    script = (output / "toy_encoder" / "1" / "model.onnx.reproduce.sh").read_text()
    assert f"--spec {spec}" in script and f"--repository {output}" in script
    assert "--only toy_encoder --force" in script


def test_manifest_records_source_versions_parity_timings_and_hashes(built):
    _, output, result = built
    manifest = json.loads((output / "build_manifest.json").read_text())
    entry = manifest["models"]["toy_encoder"]
    assert entry["source"]["factory"] == "test_build_repository:build_toy"
    assert entry["opset"] == 17
    assert entry["tools"]["torch"] and entry["tools"]["onnx"] and entry["tools"]["onnxruntime"]
    assert "tensorrt" in entry["tools"]
    cases = entry["parity"]["onnxruntime"]["cases"]
    seen = {(c["batch"], c["axes"]["sequence"], c["output"]) for c in cases}
    assert seen == {(b, n, o) for b in (1, 4, 8) for n in (4, 16) for o in ("pooled", "length", "norm")}
    assert all(c["max_abs"] <= 1e-5 for c in cases)
    assert set(entry["stages"]) == {"load", "export", "parity", "write"}
    onnx_bytes = (output / "toy_encoder" / "1" / "model.onnx").read_bytes()
    assert entry["artifacts"]["1/model.onnx"]["sha256"] == hashlib.sha256(onnx_bytes).hexdigest()
    assert len(entry["spec_hash"]) == 64
    assert result["toy_encoder"].parity_max_abs["onnxruntime"] <= 1e-5


def test_rebuild_with_nothing_changed_skips_every_model(built):
    from tools.build_repo.pipeline import build_repository

    spec, output, _ = built
    before = tree_digest(output)
    again = build_repository(spec, output, progress=False)
    assert [m.status for m in again.models] == ["skipped"] * 3
    assert tree_digest(output) == before


def test_changing_one_models_spec_rebuilds_only_that_model(tmp_path):
    from tools.build_repo.pipeline import build_repository

    spec = _toy_spec(tmp_path)
    output = tmp_path / "model_repository"
    build_repository(spec, output, progress=False)
    encoder_before = tree_digest(output / "toy_encoder")
    spec = _toy_spec(tmp_path, python_models__text_tokenizer__parameters={"tokenizer_file": "tokenizer.json", "max_length": 64})
    again = build_repository(spec, output, progress=False)
    assert {m.name: m.status for m in again.models} == {
        "toy_encoder": "skipped", "text_tokenizer": "built", "toy_text": "skipped"
    }
    assert tree_digest(output / "toy_encoder") == encoder_before
    assert 'string_value: "64"' in (output / "text_tokenizer" / "config.pbtxt").read_text()


def test_only_and_force_rebuild_just_the_named_model(built):
    from tools.build_repo.pipeline import build_repository

    spec, output, _ = built
    result = build_repository(spec, output, only=["text_tokenizer"], force=True, progress=False)
    assert [(m.name, m.status) for m in result.models] == [("text_tokenizer", "built")]


def test_parity_failure_stops_the_build_and_lists_every_output(tmp_path):
    from tools.build_repo.pipeline import build_repository
    from tools.errors import ParityError

    spec = _toy_spec(tmp_path, source="test_build_repository:build_broken_toy")
    output = tmp_path / "model_repository"
    result = build_repository(spec, output, progress=False, raise_on_failure=False)
    assert isinstance(result.error, ParityError) and not result.ok
    message = str(result.error)
    assert "model 'toy_encoder'" in message
    assert "pooled: FAILED at 6 case(s)" in message
    assert "length: FAILED at 6 case(s)" in message
    assert "norm: ok" in message
    statuses = {m.name: m.status for m in result.models}
    assert statuses["toy_encoder"] == "failed"
    assert statuses["text_tokenizer"] == "skipped"  # the build stopped
    assert not (output / "toy_encoder").exists()


def test_failed_build_leaves_the_previous_repository_byte_identical(tmp_path):
    from tools.build_repo.pipeline import build_repository
    from tools.errors import ParityError

    output = tmp_path / "model_repository"
    build_repository(_toy_spec(tmp_path), output, progress=False)
    before = tree_digest(output)
    broken = _toy_spec(
        tmp_path, source="test_build_repository:build_broken_toy",
        python_models__text_tokenizer__parameters={"tokenizer_file": "tokenizer.json", "max_length": 32},
    )
    with pytest.raises(ParityError):
        build_repository(broken, output, force=True, progress=False)
    assert tree_digest(output) == before


@pytest.mark.server
@pytest.mark.timeout(300)
def test_built_toy_repository_loads_with_strict_config_and_answers(built, server_factory):
    import tritonclient.http as httpclient

    _, output, _ = built
    server = server_factory(output)
    client = httpclient.InferenceServerClient(server.http_url.removeprefix("http://"))
    for name in ("toy_encoder", "text_tokenizer", "toy_text"):
        assert client.is_model_ready(name), name
    text = httpclient.InferInput("TEXT", [2, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"hello world"], [b"a longer sentence here"]], dtype=object))
    result = client.infer("toy_text", [text])
    pooled = result.as_numpy("POOLED")
    assert pooled.shape == (2, WIDTH)
    assert np.isfinite(pooled).all()
    assert result.as_numpy("LENGTH")[:, 0].tolist()[0] < result.as_numpy("LENGTH")[:, 0].tolist()[1]


def test_gpu_target_without_a_gpu_reports_the_plan_stage_skipped_with_the_reason(tmp_path):
    from tools.build_repo import onnx2trt
    from tools.build_repo.pipeline import build_repository

    try:
        onnx2trt.probe_gpu()
    except onnx2trt.NoGpu as exc:
        reason = f"no GPU ({exc})"
    else:
        pytest.skip("this host has a GPU: the plan is built, see test_build_trt.py")
    output = tmp_path / "model_repository"
    result = build_repository(_toy_spec(tmp_path), output, target="gpu", only=["toy_encoder"], progress=False,
                              allow_missing_gpu=True)
    assert result["toy_encoder"].status == "built"
    assert result["toy_encoder"].note == f"onnx2trt skipped: {reason}"
    entry = json.loads((output / "build_manifest.json").read_text())["models"]["toy_encoder"]
    assert entry["stages"]["onnx2trt"] == {"status": "skipped", "reason": reason}
    assert "tensorrt" not in entry
    assert 'platform: "tensorrt_plan"' in (output / "toy_encoder" / "config.pbtxt").read_text()
    assert not (output / "toy_encoder" / "1" / "model.plan").exists()


def test_interrupted_build_leaves_the_previous_repository_byte_identical(tmp_path):
    from tools.build_repo.pipeline import build_repository

    output = tmp_path / "model_repository"
    build_repository(_toy_spec(tmp_path), output, progress=False)
    before = tree_digest(output)
    with pytest.raises(KeyboardInterrupt):
        build_repository(_toy_spec(tmp_path, source="test_build_repository:build_interrupted_toy"),
                         output, force=True, progress=False)
    assert tree_digest(output) == before


def test_leftovers_of_a_killed_build_are_removed_and_parked_models_restored(tmp_path):
    import subprocess

    from tools.build_repo.repository import recover_interrupted

    dead = subprocess.Popen(["true"])
    dead.wait()
    output = tmp_path / "model_repository"
    output.mkdir()
    (tmp_path / ".model_repository.build-abc" / "half_written").mkdir(parents=True)
    (tmp_path / ".model_repository.build-abc" / ".pid").write_text(str(dead.pid))
    parked = tmp_path / ".model_repository.previous-abc" / "toy_encoder"
    parked.mkdir(parents=True)
    (parked / "config.pbtxt").write_text("name: 'toy_encoder'")
    assert recover_interrupted(output) == ["toy_encoder"]
    assert (output / "toy_encoder" / "config.pbtxt").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model_repository"]


def test_staging_of_a_running_build_is_left_alone(tmp_path):
    import os

    from tools.build_repo.repository import recover_interrupted

    output = tmp_path / "model_repository"
    output.mkdir()
    staging = tmp_path / ".model_repository.build-live"
    staging.mkdir()
    (staging / ".pid").write_text(str(os.getpid()))
    recover_interrupted(output)
    assert staging.is_dir()


def test_second_build_into_the_same_repository_is_refused_while_one_runs(tmp_path):
    from tools.build_repo.repository import locked
    from tools.errors import ToolkitError

    with locked(tmp_path):
        with pytest.raises(ToolkitError, match="another `tools build-repo` is writing it"):
            with locked(tmp_path):
                pass
