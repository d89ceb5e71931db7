"""One-command GPU check (no Docker): MiniLM's TensorRT plan in fp32 and fp16, parity, timings.

Builds the plans with the same code as `tools build-repo --target gpu`, checks them against
PyTorch, times ONNX Runtime (CUDA) against TensorRT at batch 1/8/32, prints a table.
Run on a GPU host: ``scripts/gpu-check.sh`` (or ``python -m tools.gpu_check``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from tools import paths
from tools import stats

REPO_ROOT = paths.CHECKOUT


def _time_runner(run, inputs: dict[str, np.ndarray], iterations: int, warmup: int = 5) -> list[float]:
    for _ in range(warmup):
        run(inputs)
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        run(inputs)
        times.append(time.perf_counter() - start)
    return times


def timing_row(engine: str, batch: int, times_s: list[float]) -> tuple[str, ...]:
    """One row of the latency table: P50 and P99 (``tools.stats``) and sequences/s at the P50.

    Args:
        engine: Engine label.
        batch: Sequences per call.
        times_s: Seconds of each timed call.
    """
    latency = stats.latency_summary(t * 1e3 for t in times_s)
    if latency is None:
        raise ValueError(f"{engine} batch {batch}: no timed call")
    return (engine, str(batch), f"{latency.p50_ms:.2f}", f"{latency.p99_ms:.2f}",
            f"{batch / (latency.p50_ms / 1e3):.0f}")


def _ort_cuda_runner(onnx_path: Path):
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return None, "onnxruntime has no CUDAExecutionProvider (pip install onnxruntime-gpu)"
    session = ort.InferenceSession(str(onnx_path), providers=["CUDAExecutionProvider"])
    if "CUDAExecutionProvider" not in session.get_providers():
        return None, "onnxruntime could not create a CUDA session"
    names = [o.name for o in session.get_outputs()]
    return (lambda feed: dict(zip(names, session.run(names, feed)))), ""


def main(argv: list[str] | None = None) -> int:
    """Build, check and time; returns the process exit code (0 ok, 1 parity failed, 2 no GPU)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=REPO_ROOT / "repository.yaml")
    parser.add_argument("--model", default="minilm_encoder")
    parser.add_argument("--workdir", type=Path, default=REPO_ROOT / ".cache" / "gpu-check")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--sequence", type=int, default=128)
    parser.add_argument("--iterations", type=int, default=50)
    args = parser.parse_args(argv)

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from tools.build_repo import onnx2trt
    from tools.build_repo.parity import check_parity
    from tools.build_repo.spec import load_spec, resolve_reference
    from tools.build_repo.torch2onnx import export_onnx
    from tools.errors import ToolkitError

    console = Console()
    try:
        gpu = onnx2trt.probe_gpu()
    except onnx2trt.NoGpu as exc:
        console.print(f"[red]skipped: no GPU ({escape(str(exc))})")
        return 2
    console.print(f"GPU {gpu.name}, compute capability {gpu.compute_capability}, "
                  f"TensorRT {gpu.tensorrt_version}")
    spec = load_spec(args.spec).find(args.model)
    model = resolve_reference(spec.source)()
    sample_fn = resolve_reference(spec.sample_inputs)
    args.workdir.mkdir(parents=True, exist_ok=True)
    axes = {a.name: a.opt for a in spec.axes}
    onnx_path = export_onnx(model, sample_fn(2, axes), spec, args.workdir / "model.onnx")

    parity_rows, runners, failed = [], {}, False
    for precision in ("fp32", "fp16"):
        plan = args.workdir / f"model.{precision}.plan"
        start = time.perf_counter()
        outcome = onnx2trt.build_plan(
            spec, onnx_path, plan, args.workdir / "timing.cache", precision=precision
        )
        build_s = time.perf_counter() - start
        runner = onnx2trt.plan_runner(plan)
        atol, rtol = onnx2trt.parity_tolerance(spec, precision)
        try:
            figures = check_parity(spec, model, sample_fn, runner, runtime=f"tensorrt {precision}",
                                   atol=atol, rtol=rtol)
            verdict = "ok"
            worst = max(f.max_abs for f in figures)
        except ToolkitError as exc:
            failed, verdict, worst = True, escape(str(exc)), float("nan")
        parity_rows.append((precision, f"{build_s:.0f}", f"{worst:.2e}", f"{atol:g}", verdict))
        runners[f"TensorRT {precision}"] = runner
        del outcome

    ort_runner, why = _ort_cuda_runner(onnx_path)
    if ort_runner is not None:
        runners = {"ONNX Runtime CUDA fp32": ort_runner, **runners}
    else:
        console.print(f"[yellow]ONNX Runtime CUDA not timed: {escape(why)}")

    table = Table(title=f"{spec.name}: parity against PyTorch")
    for column in ("precision", "build s", "max abs", "atol", "verdict"):
        table.add_column(column)
    for row in parity_rows:
        table.add_row(*row)
    console.print(table)

    timing = Table(title=f"{spec.name}: latency at sequence {args.sequence} "
                         f"({args.iterations} runs, host<->device copies included)")
    for column in ("engine", "batch", "p50 ms", "p99 ms", "sequences/s"):
        timing.add_column(column)
    for batch in (int(b) for b in args.batches.split(",")):
        feed = {k: v.numpy() for k, v in sample_fn(batch, {**axes, **{a.name: args.sequence for a in spec.axes}}).items()}
        for engine, run in runners.items():
            timing.add_row(*timing_row(engine, batch, _time_runner(run, feed, args.iterations)))
    console.print(timing)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
