"""ONNX -> fused ONNX: ONNX Runtime's transformer optimizer, saved offline, for the cpu target.

Attention, LayerNorm and GELU subgraphs become single fused kernels; the graph computes the same
function (parity against PyTorch is checked at the model's tolerance after this stage).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tools.build_repo.spec import ModelSpec
from tools.errors import ExportError


@dataclass(frozen=True)
class FusionResult:
    """What the optimizer fused: operator -> count (only operators it created)."""

    fused: dict[str, int]

    def to_dict(self) -> dict[str, int]:
        """The manifest form."""
        return dict(self.fused)


def fuse_onnx(source: Path, destination: Path, spec: ModelSpec) -> FusionResult:
    """Write the fused graph of ``source`` to ``destination``.

    Raises:
        ExportError: the optimizer failed, or fused nothing (the model is not of the declared
            ``cpu.fusion`` family, so the stage would only add a copy).
    """
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import FusionOptions

    model_type = spec.cpu.fusion
    try:
        # num_heads/hidden_size 0: the optimizer reads them from the graph (where it can).
        optimized = optimizer.optimize_model(
            str(source), model_type=model_type, num_heads=spec.cpu.attention_heads,
            hidden_size=spec.cpu.hidden_size,
            optimization_options=FusionOptions(model_type), opt_level=1, use_gpu=False,
        )
    except Exception as exc:  # noqa: BLE001 - the optimizer raises anything; name the model
        raise ExportError(f"model {spec.name!r}: ONNX Runtime's {model_type} optimizer failed on "
                          f"{source}: {exc}") from exc
    fused = {op: n for op, n in optimized.get_fused_operator_statistics().items() if n}
    if not fused:
        raise ExportError(
            f"model {spec.name!r}: field 'cpu.optimize': the {model_type} optimizer fused no "
            f"operator of {source}; this model is not a {model_type}-style transformer (use "
            f"optimize: none)"
        )
    optimized.save_model_to_file(str(destination))
    return FusionResult(fused)
