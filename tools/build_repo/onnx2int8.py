"""Fused ONNX -> int8 ONNX: dynamic quantization with per-channel int8 weights (cpu target).

Weights are quantized once, activations per batch at run time (no calibration set); nodes whose
names match ``cpu.quantize_exclude`` stay fp32. The quality gate (``quality.py``) decides. On a
CPU without VNNI, ONNX Runtime's u8 x s8 kernels sum pairs in int16 (``vpmaddubsw``) and 8-bit
weights saturate (MiniLM: cosine 0.982 against the 0.99 gate on an AVX2-only EPYC), so there the
weights are 7-bit (``reduce_range``; ``tools.cpu_isa.int8_weights_bits``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.build_repo.spec import ModelSpec
from tools.errors import ExportError

# The operators dynamic quantization turns into integer kernels (MatMul -> MatMulInteger,
# fused Attention -> QAttention).
QUANTIZABLE = ("MatMul", "Attention")


@dataclass(frozen=True)
class QuantizeResult:
    """Which nodes were quantized and which were kept fp32 on purpose."""

    quantized: tuple[str, ...]
    kept_fp32: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        """The manifest form."""
        return {"quantized": len(self.quantized), "kept_fp32": list(self.kept_fp32)}


def quantizable_nodes(path: Path) -> list[str]:
    """Names of the nodes of ``path`` that dynamic quantization would quantize."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return [n.name for n in graph.node if n.op_type in QUANTIZABLE]


def excluded_nodes(nodes: Sequence[str], patterns: Sequence[str], spec: ModelSpec, source: Path) -> list[str]:
    """The nodes ``cpu.quantize_exclude`` keeps fp32.

    Raises:
        ExportError: a pattern matches no node (a typo would otherwise quantize what it meant
            to keep).
    """
    kept: list[str] = []
    for pattern in patterns:
        matched = [n for n in nodes if fnmatch.fnmatchcase(n, pattern)]
        if not matched:
            raise ExportError(
                f"model {spec.name!r}: field 'cpu.quantize_exclude': {pattern!r} matches no "
                f"quantizable node of {source} (nodes look like {list(nodes[:3])})"
            )
        kept += [n for n in matched if n not in kept]
    return kept


def quantize_onnx(source: Path, destination: Path, spec: ModelSpec,
                  weights_bits: int = 8) -> QuantizeResult:
    """Write the int8 graph of ``source`` to ``destination``, with ``weights_bits`` (7 or 8) bit
    weights.

    Raises:
        ExportError: a ``quantize_exclude`` pattern matches no node (a typo would otherwise
            silently quantize what it meant to keep), or quantization failed.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if weights_bits not in (7, 8):
        raise ExportError(f"model {spec.name!r}: int8 weights are 7 or 8 bits, not {weights_bits}")
    nodes = quantizable_nodes(source)
    kept = excluded_nodes(nodes, spec.cpu.quantize_exclude, spec, source)
    try:
        quantize_dynamic(
            str(source), str(destination), per_channel=True, weight_type=QuantType.QInt8,
            reduce_range=weights_bits == 7, nodes_to_exclude=kept,
            # The fused graph's com.microsoft ops have no ONNX shape inference: type as float.
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    except Exception as exc:  # noqa: BLE001 - name the model and the file
        raise ExportError(f"model {spec.name!r}: int8 quantization of {source} failed: {exc}") from exc
    return QuantizeResult(tuple(n for n in nodes if n not in kept), tuple(kept))
