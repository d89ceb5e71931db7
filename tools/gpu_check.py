"""One-command GPU check (no Docker): the gpu build as the compose builder runs it, then timings.

``tools build-repo --target gpu`` (CPU torch, TensorRT, cuda-python for the plan's parity), the
plan in fp32 and fp16 against PyTorch, ONNX Runtime CUDA against TensorRT at batch 1/8/32; one
table and a JSON file. Exit 0 only when every step ran and passed. ``scripts/gpu-check.sh``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tools import paths, stats

REPO_ROOT = paths.CHECKOUT
EXIT_OK, EXIT_FAILED, EXIT_NO_GPU = 0, 1, 2


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


def ort_cuda_runner(onnx_path: Path, ort: Any = None) -> Callable[[dict[str, np.ndarray]], dict]:
    """An ONNX Runtime session on the CUDA execution provider.

    Raises:
        RuntimeError: no CUDA provider. With both ``onnxruntime`` and ``onnxruntime-gpu``
            installed the CPU wheel can shadow the GPU one (microsoft/onnxruntime#26996), so the
            message says how to fix the environment; scripts/gpu-check.sh sets it up that way.
    """
    if ort is None:
        import onnxruntime as ort

    providers = ort.get_available_providers()
    if "CUDAExecutionProvider" not in providers:
        raise RuntimeError(
            f"ONNX Runtime has no CUDAExecutionProvider (available: {providers}). Install only "
            f"onnxruntime-gpu: `pip uninstall -y onnxruntime onnxruntime-gpu && pip install "
            f"onnxruntime-gpu` (both wheels together can lose the CUDA provider, "
            f"microsoft/onnxruntime#26996); scripts/gpu-check.sh does this in .venv-gpu"
        )
    session = ort.InferenceSession(str(onnx_path), providers=["CUDAExecutionProvider"])
    if "CUDAExecutionProvider" not in session.get_providers():
        raise RuntimeError(f"ONNX Runtime could not create a CUDA session for {onnx_path} "
                           f"(it fell back to {session.get_providers()})")
    names = [o.name for o in session.get_outputs()]
    return lambda feed: dict(zip(names, session.run(names, feed)))


@dataclass
class Report:
    """Everything the check did; written as JSON, and failed steps decide the exit code."""

    gpu: dict[str, str] = field(default_factory=dict)
    build: dict[str, Any] = field(default_factory=dict)
    parity: list[dict[str, Any]] = field(default_factory=list)
    timings: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        """The JSON file's text."""
        return json.dumps(asdict(self), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Build, check and time; returns the exit code (0 ok, 1 a step failed, 2 no GPU)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=REPO_ROOT / "repository.yaml")
    parser.add_argument("--model", default="minilm_encoder")
    parser.add_argument("--workdir", type=Path, default=REPO_ROOT / ".cache" / "gpu-check")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--sequence", type=int, default=128)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--json", type=Path, default=None,
                        help="Where the report goes (default: WORKDIR/gpu-check.json).")
    args = parser.parse_args(argv)

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from tools.build_repo import onnx2trt
    from tools.build_repo.config import ONNX_FILE, PLAN_FILE
    from tools.build_repo.parity import check_parity
    from tools.build_repo.pipeline import build_repository
    from tools.build_repo.spec import load_spec, resolve_reference
    from tools.errors import ToolkitError

    console = Console()
    report = Report()
    json_path = args.json or args.workdir / "gpu-check.json"
    args.workdir.mkdir(parents=True, exist_ok=True)

    def finish(code: int) -> int:
        json_path.write_text(report.to_json())
        console.print(f"wrote {escape(str(json_path))}", markup=True)
        return code

    try:
        gpu = onnx2trt.probe_gpu()
    except onnx2trt.NoGpu as exc:
        report.failures.append(f"no GPU: {exc}")
        console.print(f"[red]skipped: no GPU ({escape(str(exc))})")
        return finish(EXIT_NO_GPU)
    report.gpu = {"name": gpu.name, "compute_capability": gpu.compute_capability,
                  "tensorrt": gpu.tensorrt_version}
    console.print(escape(f"GPU {gpu.name}, compute capability {gpu.compute_capability}, "
                         f"TensorRT {gpu.tensorrt_version}"))

    # 1. The build exactly as the compose builder runs it (same pipeline, same stages).
    output = args.workdir / "model_repository"
    started = time.perf_counter()
    result = build_repository(args.spec, output, target="gpu", only=[args.model], force=True,
                              progress=False, raise_on_failure=False)
    report.build = {"seconds": round(time.perf_counter() - started, 1),
                    "models": {m.name: {"status": str(m.status), "note": m.note,
                                        "timings": m.timings} for m in result.models}}
    if result.error is not None:
        report.failures.append(f"tools build-repo --target gpu: {result.error}")
        console.print(f"[red]build failed: {escape(str(result.error))}")
        return finish(EXIT_FAILED)
    version = output / args.model / "1"
    onnx_path, built_plan = version / ONNX_FILE, version / PLAN_FILE
    if not built_plan.is_file():
        report.failures.append(f"the build wrote no {PLAN_FILE} for {args.model} "
                               f"({result[args.model].note})")
        return finish(EXIT_FAILED)

    # 2. Parity of a plan in each precision against PyTorch (the build made the spec's one).
    spec = load_spec(args.spec).find(args.model)
    model = resolve_reference(spec.source)()
    sample_fn = resolve_reference(spec.sample_inputs)
    runners: dict[str, Callable] = {}
    for precision in ("fp32", "fp16"):
        plan = args.workdir / f"model.{precision}.plan"
        started = time.perf_counter()
        try:
            onnx2trt.build_plan(spec, onnx_path, plan, args.workdir / "timing-caches",
                                precision=precision)
            runner = onnx2trt.plan_runner(plan)
            atol, rtol = onnx2trt.parity_tolerance(spec, precision)
            figures = check_parity(spec, model, sample_fn, runner, runtime=f"tensorrt {precision}",
                                   atol=atol, rtol=rtol)
            worst, verdict = max(f.max_abs for f in figures), "ok"
            runners[f"TensorRT {precision}"] = runner
        except ToolkitError as exc:
            worst, verdict, atol = float("nan"), str(exc), float("nan")
            report.failures.append(f"TensorRT {precision}: {exc}")
        report.parity.append({"precision": precision, "build_s": round(time.perf_counter() - started, 1),
                              "max_abs": worst, "atol": atol, "verdict": verdict})

    # 3. ONNX Runtime CUDA against TensorRT.
    try:
        runners = {"ONNX Runtime CUDA fp32": ort_cuda_runner(onnx_path), **runners}
    except RuntimeError as exc:
        report.failures.append(str(exc))
        console.print(f"[red]{escape(str(exc))}")

    table = Table(title=f"{spec.name}: parity against PyTorch")
    for column in ("precision", "build s", "max abs", "atol", "verdict"):
        table.add_column(column)
    for row in report.parity:
        table.add_row(row["precision"], f"{row['build_s']:.0f}", f"{row['max_abs']:.2e}",
                      f"{row['atol']:g}", escape(row["verdict"]))
    console.print(table)

    timing = Table(title=f"{spec.name}: latency at sequence {args.sequence} "
                         f"({args.iterations} runs, host<->device copies included)")
    for column in ("engine", "batch", "p50 ms", "p99 ms", "sequences/s"):
        timing.add_column(column)
    axes = dict.fromkeys(spec.axes, args.sequence)
    for batch in (int(b) for b in args.batches.split(",")):
        feed = {k: v.numpy() for k, v in sample_fn(batch, axes).items()}
        for engine, run in runners.items():
            row = timing_row(engine, batch, _time_runner(run, feed, args.iterations))
            timing.add_row(*row)
            report.timings.append(dict(zip(("engine", "batch", "p50_ms", "p99_ms", "per_s"), row)))
    console.print(timing)
    for failure in report.failures:
        console.print(f"[red]FAILED: {escape(failure)}")
    return finish(EXIT_FAILED if report.failures else EXIT_OK)


if __name__ == "__main__":
    sys.exit(main())
