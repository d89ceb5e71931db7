"""Helpers of the install tests: a tiny ONNX model written with ``onnx.helper`` (no torch)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

FEATURES, SCORES = 4, 3
WEIGHTS = np.arange(FEATURES * SCORES, dtype=np.float32).reshape(FEATURES, SCORES) / 10


def write_tiny_onnx(path: Path) -> Path:
    """``scores = features @ WEIGHTS``: ``features`` [batch, 4] in, ``scores`` [batch, 3] out."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["features", "weights"], ["scores"])],
        "tiny",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", FEATURES])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", SCORES])],
        [numpy_helper.from_array(WEIGHTS, "weights")],
    )
    # IR 8 with opset 17: what every ONNX Runtime this project allows can load
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path
