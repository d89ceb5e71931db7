"""PyTorch -> ONNX: pinned opset, named dynamic axes, the ONNX checker, a reproduce script.

Exporter choice (torch 2.13, measured on MiniLM): the TorchScript exporter (``dynamo=False``)
exports in ~2.5 s a graph with named ``batch``/``sequence`` dims that passes
``onnx.checker.check_model(full_check=True)`` and matches PyTorch to 2e-7 at every length. The
dynamo exporter took ~10 s and produced an invalid graph: its ``aten.embedding`` Gather is named
``embedding``, the same as our output, so the checker rejects it (SSA violation). We use
``dynamo=False`` deliberately and check the result.
"""

from __future__ import annotations

import contextlib
import io
import shlex
import warnings
from pathlib import Path

from tools.build_repo.spec import ModelSpec
from tools.build_repo.spec.settings import PARITY_LENGTH_CAP
from tools.errors import ExportError


def trace_sample(spec: ModelSpec, sample_fn) -> dict:
    """The sample the exporter traces with: batch 2 (or 1) at each axis's ``opt`` size, capped
    at 512 (a long model's ``opt`` need not fit in memory to trace; the axes stay dynamic).

    Batch 2, not 1, so that the exporter cannot specialise the batch axis to a constant.
    """
    lengths = {name: max(a.min, min(a.opt, PARITY_LENGTH_CAP)) for name, a in spec.axes.items()}
    return sample_fn(min(2, spec.max_batch_size), lengths)


def export_onnx(model: object, sample: dict, spec: ModelSpec, path: Path) -> Path:
    """Export ``model`` to ``path`` and run the ONNX checker.

    Args:
        model: the ``torch.nn.Module`` (eval mode).
        sample: sample inputs by name (torch tensors), used to trace.
        spec: the model's spec (names, opset, dynamic axes).
        path: where the ``.onnx`` file goes.

    Returns:
        ``path``.

    Raises:
        ExportError: the export or the checker failed; the message names the model.
    """
    import onnx
    import torch

    input_names = [t.name for t in spec.inputs]
    output_names = [t.name for t in spec.outputs]
    missing = sorted(set(input_names) - set(sample))
    if missing:
        raise ExportError(f"model {spec.name!r}: sample_inputs returned no {missing}")
    args = tuple(sample[name] for name in input_names)
    dynamic_axes = {t.name: t.dynamic_axes for t in (*spec.inputs, *spec.outputs)}
    path.parent.mkdir(parents=True, exist_ok=True)
    log = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(log), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                args,
                str(path),
                input_names=input_names,
                output_names=output_names,
                dynamic_axes=dynamic_axes,
                opset_version=spec.opset,
                do_constant_folding=True,
                dynamo=False,
            )
    except Exception as exc:  # the exporter raises many unrelated types
        raise ExportError(
            f"model {spec.name!r}: torch.onnx.export failed: {type(exc).__name__}: {exc}"
        ) from exc
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as exc:
        raise ExportError(f"model {spec.name!r}: ONNX checker rejected {path}: {exc}") from exc
    _check_graph_signature(onnx.load(str(path), load_external_data=False), spec, path)
    return path


def _check_graph_signature(graph_model: object, spec: ModelSpec, path: Path) -> None:
    """The exported graph's inputs/outputs carry the spec's names and symbolic dims."""
    graph = graph_model.graph  # type: ignore[attr-defined]
    for kind, tensors, values in (
        ("input", spec.inputs, graph.input),
        ("output", spec.outputs, graph.output),
    ):
        by_name = {v.name: v for v in values}
        for t in tensors:
            value = by_name.get(t.name)
            if value is None:
                raise ExportError(f"model {spec.name!r}: {path} has no {kind} {t.name!r}")
            dims = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
            if len(dims) != len(t.shape):
                raise ExportError(
                    f"model {spec.name!r}: {kind} {t.name!r} has rank {len(dims)} in {path}, "
                    f"spec says {list(t.shape)}"
                )
            for i, (got, want) in enumerate(zip(dims, t.shape)):
                if isinstance(want, str) and not isinstance(got, str):
                    raise ExportError(
                        f"model {spec.name!r}: {kind} {t.name!r} axis {i} ({want!r}) was exported "
                        f"as the fixed size {got}; the exporter lost the dynamic axis"
                    )


def write_reproduce_script(
    artifact: Path, spec_path: Path, output: Path, model_name: str, target: str, note: str = ""
) -> Path:
    """Write ``<artifact>.reproduce.sh``: the exact command that rebuilds ``artifact``."""
    script = artifact.with_name(artifact.name + ".reproduce.sh")
    root = spec_path.parent
    command = (
        f"tools build-repo --spec {shlex.quote(str(spec_path))} "
        f"--repository {shlex.quote(str(output))} --target {target} "
        f"--only {shlex.quote(model_name)} --force"
    )
    lines = [
        "#!/usr/bin/env bash",
        f"# Rebuilds {artifact.name} of model {model_name!r} ({target} target) from the spec.",
    ]
    if note:
        lines += [f"# {line}" for line in note.splitlines()]
    lines += [
        "# Versions, parity figures and hashes of the original build: build_manifest.json.",
        "set -euo pipefail",
        f"cd {shlex.quote(str(root))}",
        f"exec {command} \"$@\"",
        "",
    ]
    script.write_text("\n".join(lines))
    script.chmod(0o755)
    return script
