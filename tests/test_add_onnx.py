"""``tools add onnx FILE``: a graph's inputs, outputs and axes become a served model, no export.

A file without a dynamic batch axis is refused and the spec is left unchanged.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.add_helpers import PROTOCOLS, SPEC_HEAD, export_mlp, infer
from tools.add.command import add_model
from tools.errors import ModelSourceError

pytestmark = [pytest.mark.torch, pytest.mark.timeout(600)]


def _spec(tmp_path: Path) -> Path:
    """A spec without ``backends``: the installed ones."""
    spec = tmp_path / "repository.yaml"
    spec.write_text(SPEC_HEAD)
    return spec


def test_onnx_without_dynamic_batch_axis_is_refused_and_spec_unchanged(tmp_path):
    spec = _spec(tmp_path)
    fixed = export_mlp(tmp_path / "fixed.onnx", dynamic_batch=False)
    before = spec.read_text()
    with pytest.raises(ModelSourceError, match=r"fixed.onnx: input 'features' has no dynamic batch"):
        add_model("onnx", str(fixed), "mlp", spec)
    assert spec.read_text() == before


@pytest.mark.server
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_onnx_file_is_added_built_served_and_answers(added_models, protocol):
    """``mlp`` in the session's repository of every recipe: an ONNX file beside the spec."""
    import onnxruntime

    text = added_models.spec.read_text()
    assert text.startswith(SPEC_HEAD) and "onnx: \"mlp.onnx\"" in text  # relative, comments kept
    assert "parity skipped" in next(m for m in added_models.result.models if m.name == "mlp").note
    features = np.random.default_rng(0).normal(size=(5, 6)).astype(np.float32)
    served = infer(added_models.server, protocol, "mlp", "features", features, ["scores"])["scores"]
    session = onnxruntime.InferenceSession(str(added_models.sources["mlp"]),
                                           providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(served, session.run(None, {"features": features})[0], atol=1e-6)
