"""Numerical parity of an exported artifact against PyTorch, on real sample inputs.

Cases: batch 1, a middle size and ``max_batch_size``, times two or more lengths of every other
dynamic axis, within a size bound (a long model's max batch × max length would not fit in
memory at build time). Shapes are checked first (fatal); then every output's max abs / rel error
against the model's tolerances. All failures are collected and raised once, listing every output.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tools.build_repo.spec import ModelSpec
from tools.errors import ParityError

Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
# The size bound of one parity case, where a case's positions are the product of its axis
# lengths: batch x positions (activations grow with it) and batch x positions^2 (a transformer's
# attention scores per head). Both are what batch 32 x sequence 512 needs, so every case of a
# 512-token encoder runs; an 8192-token model is checked up to 512 tokens, not at 8192 (its
# scores alone would be 256x those of 32 x 512, in PyTorch and the runtime at once).
MAX_BATCH_POSITIONS = 32 * 512
MAX_BATCH_POSITIONS_SQUARED = 32 * 512 * 512

Case = tuple[int, dict[str, int]]


@dataclass(frozen=True)
class ParityFigure:
    """One output at one case: the worst absolute and relative differences."""

    batch: int
    axes: dict[str, int]
    output: str
    max_abs: float
    max_rel: float
    ok: bool

    def case(self) -> str:
        return case_text(self.batch, self.axes)


def case_text(batch: int, axes: Mapping[str, int]) -> str:
    """``batch=8, sequence=512``."""
    return f"batch={batch}" + "".join(f", {k}={v}" for k, v in axes.items())


def affordable(batch: int, axes: Mapping[str, int]) -> bool:
    """Whether a case lies within the size bound (``MAX_BATCH_POSITIONS``, ``..._SQUARED``)."""
    positions = math.prod(axes.values())
    return (batch * positions <= MAX_BATCH_POSITIONS
            and batch * positions**2 <= MAX_BATCH_POSITIONS_SQUARED)


def _all_cases(spec: ModelSpec) -> list[Case]:
    lengths = [[(name, n) for n in a.lengths] for name, a in spec.axes.items()]
    return [
        (batch, dict(combo))
        for batch in spec.parity_batches
        for combo in itertools.product(*lengths)
    ]


def parity_cases(spec: ModelSpec) -> list[Case]:
    """``(batch, {axis: length})`` for every parity batch times every combination of lengths,
    within the size bound; the smallest case always runs."""
    cases = _all_cases(spec)
    kept = [c for c in cases if affordable(*c)]
    return kept or [min(cases, key=lambda c: c[0] * math.prod(c[1].values()))]


def unchecked_cases(spec: ModelSpec) -> list[Case]:
    """The cases :func:`parity_cases` leaves out as over the size bound."""
    kept = parity_cases(spec)
    return [c for c in _all_cases(spec) if c not in kept]


def unchecked_note(spec: ModelSpec) -> str:
    """One line for the build table naming the shapes parity did not check, or ``""``."""
    unchecked = unchecked_cases(spec)
    if not unchecked:
        return ""
    largest = max(parity_cases(spec), key=lambda c: c[0] * math.prod(c[1].values()))
    return (f"parity checked up to {case_text(*largest)}; not checked (over the size bound "
            f"batch x positions <= {MAX_BATCH_POSITIONS}, batch x positions^2 <= "
            f"{MAX_BATCH_POSITIONS_SQUARED}): " + "; ".join(case_text(*c) for c in unchecked))


def unchecked_record(spec: ModelSpec) -> list[dict]:
    """The cases parity did not check, for the build manifest."""
    return [{"batch": b, "axes": axes} for b, axes in unchecked_cases(spec)]


def compare_outputs(
    reference: Mapping[str, np.ndarray],
    candidate: Mapping[str, np.ndarray],
    spec: ModelSpec,
    batch: int,
    axes: dict[str, int],
    atol: float,
    rtol: float,
) -> list[ParityFigure]:
    """Compare one case's outputs (shapes must already agree).

    An element passes when ``|candidate - reference| <= atol + rtol * |reference|`` (NumPy's
    ``allclose`` rule); NaN or infinity anywhere fails.
    """
    figures = []
    for out in spec.outputs:
        ref = np.asarray(reference[out.name], dtype=np.float64)
        got = np.asarray(candidate[out.name], dtype=np.float64)
        diff = np.abs(got - ref)
        finite = bool(np.isfinite(got).all() and np.isfinite(ref).all())
        max_abs = float(diff.max()) if diff.size else 0.0
        max_rel = float((diff / np.maximum(np.abs(ref), 1e-12)).max()) if diff.size else 0.0
        ok = finite and bool((diff <= atol + rtol * np.abs(ref)).all())
        figures.append(ParityFigure(batch, dict(axes), out.name, max_abs, max_rel, ok))
    return figures


def check_parity(
    spec: ModelSpec,
    model: object,
    sample_inputs: Callable[[int, dict[str, int]], dict],
    runner: Runner,
    *,
    runtime: str,
    atol: float | None = None,
    rtol: float | None = None,
) -> list[ParityFigure]:
    """Run PyTorch and ``runner`` on every parity case and compare.

    Args:
        spec: the model's spec (outputs, tolerances, parity batches and lengths).
        model: the ``torch.nn.Module`` reference.
        sample_inputs: the model's sample-input function.
        runner: runs the artifact on NumPy inputs and returns outputs by name.
        runtime: named in the error (``onnxruntime``, ``tensorrt fp16``).
        atol: overrides the spec's absolute tolerance.
        rtol: overrides the spec's relative tolerance.

    Returns:
        Every figure (one per case and output).

    Raises:
        ParityError: a shape differs (at the first such case), or any value is out of tolerance
            (after every case ran, listing every output).
    """
    import torch

    atol = spec.atol if atol is None else atol
    rtol = spec.rtol if rtol is None else rtol
    figures: list[ParityFigure] = []
    for batch, axes in parity_cases(spec):
        sample = sample_inputs(batch, axes)
        with torch.no_grad():
            result = model(*(sample[t.name] for t in spec.inputs))
        if not isinstance(result, (tuple, list)):
            result = (result,)
        reference = {o.name: r.detach().cpu().numpy() for o, r in zip(spec.outputs, result)}
        candidate = runner({t.name: sample[t.name].numpy() for t in spec.inputs})
        shape_problems = []
        for out in spec.outputs:
            want = reference[out.name].shape
            got = candidate[out.name].shape if out.name in candidate else None
            if got != want:
                shape_problems.append(f"{out.name}: {runtime} {got} vs torch {want}")
        if shape_problems:
            case = ParityFigure(batch, axes, "", 0, 0, False).case()
            raise ParityError(
                f"model {spec.name!r}: output shapes differ at {case}: " + "; ".join(shape_problems)
            )
        figures += compare_outputs(reference, candidate, spec, batch, axes, atol, rtol)
    failed = [f for f in figures if not f.ok]
    if failed:
        lines = []
        for out in spec.outputs:
            mine = [f for f in failed if f.output == out.name]
            worst = max((f for f in figures if f.output == out.name), key=lambda f: f.max_abs)
            status = f"FAILED at {len(mine)} case(s)" if mine else "ok"
            lines.append(
                f"  {out.name}: {status}; worst max_abs={worst.max_abs:.3g} "
                f"max_rel={worst.max_rel:.3g} at {worst.case()}"
            )
        raise ParityError(
            f"model {spec.name!r}: {runtime} differs from PyTorch beyond atol={atol:g} "
            f"rtol={rtol:g}:\n" + "\n".join(lines)
        )
    return figures


def figures_to_manifest(figures: list[ParityFigure]) -> list[dict]:
    """Figures as JSON-ready dicts for the build manifest."""
    return [asdict(f) for f in figures]


def openvino_runner(path: str, threads: int, precision: str, backends: Path) -> tuple[Runner, str]:
    """The served OpenVINO session (``pipeline_ops.onnx_session.OpenVinoSession`` of the spec's
    ``backends`` folder, so the same properties) as a ``Runner``, and the precision the plugin
    really runs (``bf16``, or ``f32`` on a CPU without bf16: OpenVINO falls back silently).
    """
    import sys

    sys.path.insert(0, str(backends))
    try:
        from pipeline_ops.onnx_session import OpenVinoSession
    finally:
        sys.path.pop(0)
    session = OpenVinoSession(path, threads, precision)
    names = [o.name for o in session.get_outputs()]

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(names, inputs)))

    return run, session.precision


def onnxruntime_runner(path: str, threads: int = 2) -> Runner:
    """A CPU ONNX Runtime session as a ``Runner`` (spinning off: cores are shared)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(names, inputs)))

    return run
