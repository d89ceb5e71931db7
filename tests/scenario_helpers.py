"""Helpers of the scenario tests: small real ONNX graphs written with ``onnx.helper`` (no torch),
and the spec a user would get from ``tools add onnx`` on them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def ids_onnx(path: Path, vocabulary: int, width: int = 4, axis: str = "tokens") -> Path:
    """``input_ids`` and ``attention_mask`` int64 [batch, axis] -> ``embedding`` [batch, width]:
    a masked sum of embedding rows. ONNX Runtime refuses an id outside ``vocabulary`` (Gather)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    table = numpy_helper.from_array(rng.normal(size=(vocabulary, width)).astype(np.float32),
                                    "table")
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["rows"]),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "last"], ["mask3"]),
        helper.make_node("Mul", ["rows", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "one"], ["embedding"], keepdims=0),
    ]
    constants = [numpy_helper.from_array(np.array([2], np.int64), "last"),
                 numpy_helper.from_array(np.array([1], np.int64), "one")]
    graph = helper.make_graph(
        nodes, "ids_sum",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", axis]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", axis])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", width])],
        [table, *constants])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def linear_onnx(path: Path, features: int = 6, outputs: int = 3) -> Path:
    """``features`` float32 [batch, features] -> ``scores`` [batch, outputs] (one MatMul)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = np.random.default_rng(1).normal(size=(features, outputs)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["features", "weights"], ["scores"])], "linear",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", features])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", outputs])],
        [numpy_helper.from_array(weights, "weights")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def start_spec(folder: Path, cpu_cores: int = 2, backends: Path | None = None) -> Path:
    """An empty spec of the cpu target, as a user starts one (``tools add`` fills it)."""
    from tools import paths

    spec = folder / "repository.yaml"
    folder.mkdir(parents=True, exist_ok=True)
    spec.write_text(f"# my models\ntarget: cpu\ncpu_cores: {cpu_cores}\n"
                    f"backends: {backends or paths.BACKENDS}\n", encoding="utf-8")
    return spec
