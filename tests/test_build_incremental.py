"""Incremental `build_repository`: packaging-only changes repackage around the previous export.

A PyTorch model has two fingerprints: the full one (anything changed -> rebuild) and the export
one (what model.onnx and its parity depend on). When only config, warmup or Python-backend files
changed, the previous hash-checked model.onnx is carried over and parity is not rerun.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from test_build_repository import REPO_ROOT, _toy_spec, tree_digest

torch = pytest.importorskip("torch", reason="the toy build exports a real PyTorch model")
pytestmark = pytest.mark.torch


def toy_weights() -> list[Path]:
    """The toy's 'weights' file (the toy ignores it; its hash enters the fingerprints).

    Named by an environment variable: the build imports this module afresh by name.
    """
    return [Path(os.environ["TOY_WEIGHTS"])]


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    """One cold build of the toy repository, copied by each test before it changes anything."""
    from tools.build_repo.pipeline import build_repository

    tmp = tmp_path_factory.mktemp("cold")
    output = tmp / "model_repository"
    build_repository(_toy_spec(tmp), output, progress=False)
    return output


@pytest.fixture
def repo(cold, tmp_path):
    """A private copy of the cold repository and of backends/python (safe to edit)."""
    output = tmp_path / "model_repository"
    shutil.copytree(cold, output)
    backends = tmp_path / "backends"
    shutil.copytree(REPO_ROOT / "backends" / "python", backends,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return tmp_path, output, backends


@pytest.fixture
def exports(monkeypatch):
    """Counts calls of the ONNX export (still exporting for real)."""
    from tools.build_repo import torch2onnx

    calls = []
    real = torch2onnx.export_onnx

    def counting(*args, **kwargs):
        calls.append(args[-1])
        return real(*args, **kwargs)

    monkeypatch.setattr(torch2onnx, "export_onnx", counting)
    return calls


def _entry(output: Path, name: str = "toy_encoder") -> dict:
    return json.loads((output / "build_manifest.json").read_text())["models"][name]


def _onnx_sha(output: Path) -> str:
    return hashlib.sha256((output / "toy_encoder" / "1" / "model.onnx").read_bytes()).hexdigest()


def test_editing_a_pipeline_ops_file_repackages_the_model_without_exporting(repo, exports):
    from tools.build_repo.pipeline import build_repository

    tmp, output, backends = repo
    before = _entry(output)
    onnx_before = (output / "toy_encoder" / "1" / "model.onnx").read_bytes()
    text_py = backends / "pipeline_ops" / "text.py"
    text_py.write_text(text_py.read_text() + "\n# edited by test_build_incremental\n")
    result = build_repository(_toy_spec(tmp, backends=str(backends)), output, progress=False)
    assert {m.name: m.status for m in result.models} == {
        "toy_encoder": "repackaged", "text_tokenizer": "built", "toy_text": "skipped"
    }
    assert exports == []
    encoder = result["toy_encoder"]
    assert "export" not in encoder.timings and "parity" not in encoder.timings
    assert f"parity carried over from the build at {before['built_at']}" in encoder.note
    assert encoder.parity_max_abs["onnxruntime"] <= 1e-5
    assert (output / "toy_encoder" / "1" / "model.onnx").read_bytes() == onnx_before
    copied = output / "toy_encoder" / "1" / "pipeline_ops" / "text.py"
    assert copied.read_text().endswith("# edited by test_build_incremental\n")
    entry = _entry(output)
    assert entry["parity_carried_over_from"] == before["built_at"]
    assert entry["parity"] == before["parity"]
    assert entry["export"] == {**before["export"], "reused": True}
    assert entry["stages"]["export"] == {"status": "reused", "from": before["built_at"]}
    assert entry["artifacts"]["1/model.onnx"] == before["artifacts"]["1/model.onnx"]
    assert entry["artifacts"]["1/pipeline_ops/text.py"] != before["artifacts"]["1/pipeline_ops/text.py"]
    assert not list(tmp.glob(".model_repository.*"))


def test_changing_the_batching_delay_repackages_and_a_second_change_keeps_the_export_date(
    repo, exports
):
    from tools.build_repo.pipeline import build_repository

    tmp, output, _ = repo
    before = _entry(output)
    onnx_sha = _onnx_sha(output)
    delay = {"max_queue_delay_microseconds": 4321}
    spec = _toy_spec(tmp, models__toy_encoder__dynamic_batching=delay)
    result = build_repository(spec, output, only=["toy_encoder"], progress=False)
    assert result["toy_encoder"].status == "repackaged"
    assert "max_queue_delay_microseconds: 4321" in (output / "toy_encoder" / "config.pbtxt").read_text()
    carried = _entry(output)["carried_over"]
    assert "warmup/input_ids_batch4.bin" in carried and "1/model.onnx" in carried
    again = build_repository(spec, output, only=["toy_encoder"], progress=False)
    assert again["toy_encoder"].status == "skipped"
    spec = _toy_spec(tmp, models__toy_encoder__dynamic_batching=delay,
                     models__toy_encoder__warmup={"batch_sizes": [2], "axes": {"sequence": 8}})
    third = build_repository(spec, output, only=["toy_encoder"], progress=False)
    assert third["toy_encoder"].status == "repackaged"
    assert sorted(p.name for p in (output / "toy_encoder" / "warmup").iterdir()) == [
        "attention_mask_batch2.bin", "input_ids_batch2.bin"
    ]
    assert not [k for k in _entry(output)["carried_over"] if k.startswith("warmup/")]
    assert exports == []
    assert _onnx_sha(output) == onnx_sha
    assert _entry(output)["parity_carried_over_from"] == before["built_at"]


@pytest.mark.parametrize(
    "change",
    [
        {"models__toy_encoder__opset": 16},
        {"models__toy_encoder__tolerance": {"atol": 2e-5, "rtol": 1e-5}},
        "weights",
    ],
    ids=["opset", "tolerance", "weights"],
)
def test_changing_what_the_export_depends_on_exports_again(repo, exports, change, monkeypatch):
    from tools.build_repo.pipeline import build_repository

    tmp, output, _ = repo
    if change == "weights":
        weights = tmp / "toy.bin"
        weights.write_bytes(b"first")
        monkeypatch.setenv("TOY_WEIGHTS", str(weights))
        spec = _toy_spec(tmp, models__toy_encoder__weights="test_build_incremental:toy_weights")
        assert build_repository(spec, output, only=["toy_encoder"], progress=False)[
            "toy_encoder"].status == "built"
        weights.write_bytes(b"second, longer")
    else:
        spec = _toy_spec(tmp, **change)
    exports.clear()
    result = build_repository(spec, output, only=["toy_encoder"], progress=False)
    assert result["toy_encoder"].status == "built"
    assert len(exports) == 1
    assert "export" in result["toy_encoder"].timings
    entry = _entry(output)
    assert "parity_carried_over_from" not in entry
    assert entry["export"]["built_at"] == entry["built_at"]


def test_force_exports_again_even_when_only_packaging_changed(repo, exports):
    from tools.build_repo.pipeline import build_repository

    tmp, output, backends = repo
    result = build_repository(_toy_spec(tmp, backends=str(backends),
                                        models__toy_encoder__dynamic_batching={
                                            "max_queue_delay_microseconds": 7}),
                              output, only=["toy_encoder"], force=True, progress=False)
    assert result["toy_encoder"].status == "built"
    assert len(exports) == 1


@pytest.mark.parametrize("damage", ["missing", "hash mismatch"])
def test_missing_or_altered_previous_export_is_exported_again(repo, exports, damage):
    from tools.build_repo.pipeline import build_repository

    tmp, output, _ = repo
    onnx = output / "toy_encoder" / "1" / "model.onnx"
    good = onnx.read_bytes()
    if damage == "missing":
        onnx.unlink()
    else:  # same size, one byte different: only the sha256 tells
        onnx.write_bytes(good[:-1] + bytes([good[-1] ^ 0xFF]))
    spec = _toy_spec(tmp, models__toy_encoder__dynamic_batching={"max_queue_delay_microseconds": 9})
    result = build_repository(spec, output, only=["toy_encoder"], progress=False)
    assert result["toy_encoder"].status == "built"
    assert len(exports) == 1
    assert onnx.read_bytes() == good  # the export is deterministic
    assert "parity_carried_over_from" not in _entry(output)


def test_failed_repackage_leaves_the_previous_repository_byte_identical(repo, exports):
    from tools.build_repo.pipeline import build_repository
    from tools.errors import SpecError

    tmp, output, backends = repo
    before = tree_digest(output)
    (backends / "pipeline_ops" / "__init__.py").unlink()  # copying the backend fails
    with pytest.raises(SpecError, match="pipeline_ops is missing"):
        build_repository(_toy_spec(tmp, backends=str(backends)), output, progress=False)
    assert tree_digest(output) == before
    assert exports == []
    assert not list(tmp.glob(".model_repository.*"))


def test_gpu_target_whose_plan_was_not_built_exports_again(tmp_path, exports):
    from tools.build_repo import onnx2trt
    from tools.build_repo.pipeline import build_repository

    try:
        onnx2trt.probe_gpu()
    except onnx2trt.NoGpu:
        pass
    else:
        pytest.skip("this host has a GPU: the plan is built and reused")
    output = tmp_path / "model_repository"
    build_repository(_toy_spec(tmp_path), output, target="gpu", only=["toy_encoder"], progress=False,
                     allow_missing_gpu=True)
    spec = _toy_spec(tmp_path, models__toy_encoder__dynamic_batching={"max_queue_delay_microseconds": 3})
    result = build_repository(spec, output, target="gpu", only=["toy_encoder"], progress=False,
                              allow_missing_gpu=True)
    assert result["toy_encoder"].status == "built"
    assert len(exports) == 2


def test_weights_reference_added_to_an_unchanged_module_hashes_the_files_it_names(
    repo, monkeypatch
):
    from tools.build_repo.pipeline import build_repository

    tmp, output, _ = repo
    weights = tmp / "toy.bin"
    weights.write_bytes(b"weights")
    monkeypatch.setenv("TOY_WEIGHTS", str(weights))
    spec = _toy_spec(tmp, models__toy_encoder__weights="test_build_incremental:toy_weights")
    build_repository(spec, output, only=["toy_encoder"], progress=False)
    assert _entry(output)["inputs"]["weights"] == {
        str(weights): hashlib.sha256(b"weights").hexdigest()
    }
