"""``tools add onnx FILE``: a graph's inputs, outputs and axes become a served model, no export.

A file without a dynamic batch axis is refused and the spec is left unchanged.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.add_helpers import PROTOCOLS, infer
from tools.add.command import add_model
from tools.errors import ModelSourceError

pytestmark = [pytest.mark.torch, pytest.mark.timeout(600)]
SPEC_HEAD = "# my spec: keep this comment\ntarget: cpu   # and this one\ncpu_cores: 2\n"


def _export_mlp(path: Path, dynamic_batch: bool) -> Path:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    axes = {"features": {0: "batch"}, "scores": {0: "batch"}} if dynamic_batch else None
    torch.onnx.export(model.eval(), (torch.randn(2, 6),), str(path), input_names=["features"],
                      output_names=["scores"], dynamic_axes=axes, opset_version=17, dynamo=False)
    return path


def _spec(tmp_path: Path) -> Path:
    """A spec without ``backends``: the installed ones."""
    spec = tmp_path / "repository.yaml"
    spec.write_text(SPEC_HEAD)
    return spec


def test_onnx_without_dynamic_batch_axis_is_refused_and_spec_unchanged(tmp_path):
    spec = _spec(tmp_path)
    fixed = _export_mlp(tmp_path / "fixed.onnx", dynamic_batch=False)
    before = spec.read_text()
    with pytest.raises(ModelSourceError, match=r"fixed.onnx: input 'features' has no dynamic batch"):
        add_model("onnx", str(fixed), "mlp", spec)
    assert spec.read_text() == before


@pytest.mark.server
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_onnx_file_is_added_built_served_and_answers(tmp_path, server_factory, protocol):
    import onnxruntime

    from tools.build_repo.pipeline import build_repository

    spec = _spec(tmp_path)
    model_file = _export_mlp(tmp_path / "mlp.onnx", dynamic_batch=True)
    add_model("onnx", str(model_file), "mlp", spec)
    text = spec.read_text()
    assert text.startswith(SPEC_HEAD) and "onnx: \"mlp.onnx\"" in text  # relative, comments kept
    result = build_repository(spec, tmp_path / "repo", progress=False)
    assert "parity skipped" in next(m for m in result.models if m.name == "mlp").note
    server = server_factory(tmp_path / "repo")
    features = np.random.default_rng(0).normal(size=(5, 6)).astype(np.float32)
    served = infer(server, protocol, "mlp", "features", features, ["scores"])["scores"]
    session = onnxruntime.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(served, session.run(None, {"features": features})[0], atol=1e-6)
