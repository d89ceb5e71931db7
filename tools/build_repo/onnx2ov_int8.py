"""ONNX -> OpenVINO int8 IR: static post-training quantization by NNCF (cpu target,
``runtime: openvino``, ``optimize: int8``).

Unlike ONNX Runtime's dynamic int8 (``onnx2int8``), activations get fixed int8 ranges measured on
calibration texts, so the CPU plugin runs the MatMuls as int8 x int8 (AVX512-VNNI / AMX) without
quantizing activations at run time. NNCF's transformer preset keeps softmax, layer norms and GELU
in floating point and applies SmoothQuant to the MatMul inputs; nodes whose names match
``cpu.quantize_exclude`` are not quantized; ``cpu.smooth_quant_alpha`` sets SmoothQuant's
strength. Weights are 7-bit (NNCF's overflow fix) unless the building CPU has VNNI
(``tools.cpu_isa``: without it 8-bit sums saturate). Calibration never sees a held-out quality
text (``quality_sets.Calibration``); the quality gate (``quality.py``) decides.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from tools.build_repo.onnx2int8 import QuantizeResult, excluded_nodes
from tools.build_repo.quality_sets import Calibration, QualitySet
from tools.build_repo.spec import ModelSpec
from tools.errors import ExportError

# What NNCF quantizes in a transformer: the MatMuls (weights and their activations).
QUANTIZABLE = ("MatMul",)
CALIBRATION_BATCH = 8


def calibration_batches(encodings: Sequence[tuple[list[int], list[int]]],
                        batch: int = CALIBRATION_BATCH) -> Iterator[dict[str, np.ndarray]]:
    """``input_ids``/``attention_mask`` feeds of length-sorted token sequences, padded with 0 to
    the longest of each batch (as the served runner pads its chunks)."""
    ordered = sorted(encodings, key=lambda e: len(e[0]))
    for start in range(0, len(ordered), batch):
        chunk = ordered[start:start + batch]
        length = max(len(ids) for ids, _ in chunk)
        ids = np.zeros((len(chunk), length), np.int64)
        mask = np.zeros_like(ids)
        for row, (token_ids, attention) in enumerate(chunk):
            ids[row, :len(token_ids)], mask[row, :len(attention)] = token_ids, attention
        yield {"input_ids": ids, "attention_mask": mask}


def quantizable_nodes(model) -> list[str]:
    """Names of the nodes of an OpenVINO model (``openvino.Model``) that NNCF would quantize;
    the ONNX frontend keeps the ONNX node names."""
    return [op.get_friendly_name() for op in model.get_ordered_ops()
            if op.get_type_name() in QUANTIZABLE]


def quantize_openvino(source: Path, destination: Path, spec: ModelSpec, calibration: Calibration,
                      quality: QualitySet, weights_bits: int = 8) -> QuantizeResult:
    """Write the int8 IR of ``source`` (an ONNX file) to ``destination`` (``.xml``, weights in
    the ``.bin`` beside it), calibrated on ``calibration``, none of whose texts may be held out
    in ``quality``; ``weights_bits`` 7 applies NNCF's overflow fix to every MatMul
    (``tools.cpu_isa.int8_weights_bits``).

    Raises:
        ExportError: no calibration texts, a ``quantize_exclude`` pattern matches nothing, or
            NNCF failed; ``HeldOutTextError`` (an ``ExportError``) for a held-out text.
    """
    quality.refuse_held_out(calibration.texts, f"model {spec.name!r}: field 'cpu.calibration_texts': ")
    if not calibration.texts:
        raise ExportError(f"model {spec.name!r}: field 'cpu.calibration_texts' holds no text "
                          f"outside the held-out quality texts: static int8 needs some to "
                          f"calibrate on")
    import logging
    import os

    # NNCF sends usage telemetry (Google Analytics, through openvino-telemetry) unless the user
    # opted out; a build tool should not. NNCF_CI, read when nncf is first imported, is its one
    # switch that needs no consent file written into the user's home.
    os.environ.setdefault("NNCF_CI", "1")
    import nncf
    import openvino
    from nncf.common.logging.logger import set_log_level

    set_log_level(logging.ERROR)  # not a line per ignored node; its progress bars stay

    model = openvino.Core().read_model(str(source))
    nodes = quantizable_nodes(model)
    kept = excluded_nodes(nodes, spec.cpu.quantize_exclude, spec, source)
    batches = list(calibration_batches(calibration.encodings))
    advanced = {}
    if spec.cpu.smooth_quant_alpha is not None:
        advanced["smooth_quant_alphas"] = nncf.AdvancedSmoothQuantParameters(
            matmul=spec.cpu.smooth_quant_alpha)
    if weights_bits not in (7, 8):
        raise ExportError(f"model {spec.name!r}: int8 weights are 7 or 8 bits, not {weights_bits}")
    if weights_bits == 7:
        from nncf.quantization.advanced_parameters import OverflowFix

        advanced["overflow_fix"] = OverflowFix.ENABLE
    try:
        quantized = nncf.quantize(
            model, nncf.Dataset(batches), model_type=nncf.ModelType.TRANSFORMER,
            subset_size=len(batches), ignored_scope=nncf.IgnoredScope(names=kept),
            advanced_parameters=nncf.AdvancedQuantizationParameters(**advanced),
        )
        # fp32 weights stay fp32 (not the fp16 save_model writes by default): what the
        # gate runs is what was kept
        openvino.save_model(quantized, str(destination), compress_to_fp16=False)
    except Exception as exc:  # noqa: BLE001 - name the model and the file
        raise ExportError(f"model {spec.name!r}: OpenVINO int8 quantization of {source} "
                          f"failed: {exc}") from exc
    return QuantizeResult(tuple(n for n in nodes if n not in kept), tuple(kept))
