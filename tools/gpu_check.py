"""The GPU host check behind ``scripts/gpu-check.sh``, in three sections that share one JSON report.

* ``preflight`` (standard library only): the NVIDIA driver against the floor of the CUDA major of
  the pinned GPU wheels (``scripts/gpu-requirements.txt``).
* ``offline`` (only what is installed, no registry: PyTorch with CUDA, cuda-python if present):
  the device, each exported model's torch-CUDA fp32 and fp16 error, the plan runner's CUDA path
  on real cudart.
* ``full`` (the pinned GPU wheels of ``.venv-gpu``): the gpu build as the compose builder runs
  it, TensorRT fp32/fp16 and ONNX Runtime CUDA parity against PyTorch, and timings at batch
  1/8/32 (compute only, and with copies) through preallocated device buffers, pinned host memory
  and CUDA events.

Each section writes its part of the report whatever happens; the exit code is 0 (passed),
1 (a step failed), 2 (no usable GPU or driver) or 3 (nothing could run: a prerequisite is missing).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
PINS = REPO_ROOT / "scripts" / "gpu-requirements.txt"
DEFAULT_REPORT = REPO_ROOT / ".cache" / "gpu-check" / "gpu-check.json"
EXIT_OK, EXIT_FAILED, EXIT_NO_GPU, EXIT_SKIPPED = 0, 1, 2, 3
# NVIDIA's minimum driver per CUDA major for minor version compatibility (pip's CUDA wheels carry
# no compatibility package): docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility
DRIVER_FLOOR = {11: 450, 12: 525, 13: 580}
# Provided by onnxruntime-gpu (the same module; both wheels together can lose the CUDA provider,
# microsoft/onnxruntime#26996); torch comes first, from TORCH_INDEX_URL or PyTorch's CPU index.
NOT_FROM_PROJECT = ("onnxruntime", "torch")


# --- the report -------------------------------------------------------------------------------


class Report:
    """The JSON report: one entry per section, written after every change."""

    def __init__(self, path: Path, fresh: bool = False) -> None:
        self.path = Path(path)
        self.data: dict[str, Any] = {"format": 1, "sections": {}}
        if not fresh and self.path.is_file():
            try:
                self.data = json.loads(self.path.read_text())
            except ValueError:
                pass
        self.data.setdefault("sections", {})

    def section(self, name: str) -> dict[str, Any]:
        """A new, empty entry for section ``name`` (replacing an earlier run's)."""
        entry = {"status": "running", "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                 "python": sys.executable, "failures": []}
        self.data["sections"][name] = entry
        self.save()
        return entry

    def save(self) -> None:
        """Write the file (its folder is created)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=2, default=str) + "\n")


def _say(line: str) -> None:
    print(f"gpu-check: {line}", flush=True)


# --- preflight --------------------------------------------------------------------------------


def pinned_cuda_major(pins: Path = PINS) -> int:
    """The CUDA major of the pinned GPU wheels (from ``tensorrt-cuXX`` in the lock).

    Raises:
        ValueError: the lock names no ``tensorrt-cuXX`` wheel.
    """
    majors = {int(m) for m in re.findall(r"^tensorrt-cu(\d+)", pins.read_text(), flags=re.MULTILINE)}
    if len(majors) != 1:
        raise ValueError(f"{pins}: expected one tensorrt-cuXX major, found {sorted(majors)}")
    return majors.pop()


def driver_preflight(cuda_major: int, run: Callable[..., Any] = subprocess.run) -> dict[str, Any]:
    """Read the driver and GPUs from ``nvidia-smi`` and compare with ``cuda_major``'s floor.

    Returns:
        ``{"ok", "line", "driver", "gpus", "floor"}``; ``line`` is the one line to print.
    """
    floor = DRIVER_FLOOR[cuda_major]
    result: dict[str, Any] = {"ok": False, "floor": floor, "cuda_major": cuda_major, "gpus": []}
    exe = shutil.which("nvidia-smi")
    if exe is None:
        result["line"] = ("no NVIDIA GPU here: nvidia-smi is not on PATH (install the NVIDIA "
                          "driver); nothing was checked")
        return result
    try:
        out = run([exe, "--query-gpu=driver_version,name,compute_cap", "--format=csv,noheader"],
                  capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        result["line"] = f"nvidia-smi failed to run ({exc}); nothing was checked"
        return result
    rows = [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines() if line.strip()]
    if out.returncode != 0 or not rows or len(rows[0]) < 3:
        detail = (out.stderr or out.stdout).strip().splitlines()
        result["line"] = (f"nvidia-smi found no usable GPU (exit {out.returncode}: "
                          f"{detail[0] if detail else 'no output'}); nothing was checked")
        return result
    result["gpus"] = [{"driver": r[0], "name": r[1], "compute_capability": r[2]} for r in rows]
    driver = result["driver"] = rows[0][0]
    major = int(driver.split(".")[0]) if driver.split(".")[0].isdigit() else 0
    if major < floor:
        result["line"] = (f"NVIDIA driver {driver} is too old for the CUDA {cuda_major} wheels this "
                          f"check installs (they need >= {floor}, CUDA minor version "
                          f"compatibility); update the driver (docs/gpu.md has the matrix)")
        return result
    gpus = "; ".join(f"{g['name']}, compute capability {g['compute_capability']}" for g in result["gpus"])
    result["ok"] = True
    result["line"] = f"driver {driver} ({gpus}) meets the CUDA {cuda_major} floor (>= {floor})"
    return result


def run_preflight(args: argparse.Namespace) -> int:
    """Section 1: the driver. Starts a fresh report."""
    report = Report(args.json, fresh=True)
    entry = report.section("preflight")
    try:
        entry.update(driver_preflight(pinned_cuda_major(args.pins)))
    except Exception as exc:  # noqa: BLE001 - reported, and the report is still written
        entry.update(ok=False, line=f"preflight failed: {type(exc).__name__}: {exc}")
    entry["status"] = "passed" if entry["ok"] else "failed"
    if not entry["ok"]:
        entry["failures"].append(entry["line"])
    report.save()
    _say(entry["line"] + ("" if entry["ok"] else f" (report: {_shown(report.path)})"))
    return EXIT_OK if entry["ok"] else EXIT_NO_GPU


def _shown(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


# --- the project's requirements for .venv-gpu ---------------------------------------------------


def project_requirements(pyproject: Path = REPO_ROOT / "pyproject.toml") -> list[str]:
    """The project's base dependencies but onnxruntime and torch (``NOT_FROM_PROJECT``).

    .venv-gpu runs the checkout without installing the project, so ``pip check`` judges the pinned
    GPU wheels and these, and not the project's own ``onnxruntime`` that onnxruntime-gpu replaces.
    """
    text = Path(pyproject).read_text()
    try:
        import tomllib

        deps = tomllib.loads(text)["project"]["dependencies"]
    except ModuleNotFoundError:  # Python 3.10: the one array of strings, read plainly
        block = re.search(r"^dependencies\s*=\s*\[(.*?)^\]", text, flags=re.MULTILINE | re.DOTALL)
        deps = re.findall(r'^\s*"([^"]+)"', block.group(1), flags=re.MULTILINE) if block else []
    name = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
    return [d for d in deps if name.match(d).group(1).lower() not in NOT_FROM_PROJECT]


# --- offline: what PyTorch with CUDA can say, with nothing downloaded ---------------------------


class CopyEngine:
    """An engine with TensorRT's runtime interface that copies each input to its output.

    It lets the plan runner's whole CUDA path (stream, pinned buffers, copies, events, shape and
    dtype checks) run against real cudart where TensorRT is not installed. Its int32 input is fed
    int64 ids, as TensorRT engines that narrowed an ONNX graph's int64 inputs are.
    """

    IO = (("ids", "int32", "in"), ("values", "float32", "in"),
          ("ids_copy", "int32", "out"), ("values_copy", "float32", "out"))

    class TensorIOMode:  # noqa: D106 - TensorRT's names
        INPUT, OUTPUT = "in", "out"

    def __init__(self, cudart: Any) -> None:
        import numpy as np

        self.cudart, self.np = cudart, np
        self.num_io_tensors = len(self.IO)
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}

    @staticmethod
    def nptype(dtype: str) -> Any:
        import numpy as np

        return np.dtype(dtype)

    def get_tensor_name(self, index: int) -> str:
        return self.IO[index][0]

    def get_tensor_mode(self, name: str) -> str:
        return next(mode for n, _, mode in self.IO if n == name)

    def get_tensor_dtype(self, name: str) -> str:
        return next(dtype for n, dtype, _ in self.IO if n == name)

    def get_tensor_profile_shape(self, name: str, profile: int) -> list[tuple[int, ...]]:
        return [(1, 1), (8, 64), (64, 4096)]

    def create_execution_context(self) -> CopyEngine:
        return self

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        if len(shape) != 2 or not (1 <= shape[0] <= 64 and 1 <= shape[1] <= 4096):
            return False
        self.shapes[name] = self.shapes[f"{name}_copy"] = tuple(shape)
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self.shapes[name]

    def set_tensor_address(self, name: str, pointer: int) -> None:
        self.addresses[name] = pointer

    def execute_async_v3(self, stream: int) -> bool:
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        for name, dtype, mode in self.IO:
            if mode == "in":
                nbytes = int(self.np.prod(self.shapes[name])) * self.np.dtype(dtype).itemsize
                error, *_ = self.cudart.cudaMemcpyAsync(self.addresses[f"{name}_copy"],
                                                        self.addresses[name], nbytes, kind, stream)
                if int(error) != 0:
                    return False
        return True


def plan_runner_on_cudart(cudart: Any) -> dict[str, Any]:
    """Run ``PlanRunner`` over a ``CopyEngine`` on real cudart: round trip exact, events timed."""
    import numpy as np

    from tools.build_repo.onnx2trt import PlanRunner

    engine = CopyEngine(cudart)
    runner = PlanRunner(engine, cudart, engine, "copy engine")
    try:
        rng = np.random.default_rng(0)
        results = []
        for batch, length in ((1, 16), (8, 128), (32, 256), (1, 16)):
            ids = rng.integers(0, 30522, size=(batch, length), dtype=np.int64)
            values = rng.standard_normal((batch, length)).astype(np.float32)
            out = runner({"ids": ids, "values": values})
            exact = bool((out["ids_copy"] == ids).all() and (out["values_copy"] == values).all())
            timings = runner.time({"ids": ids, "values": values}, iterations=10, warmup=2)
            results.append({"batch": batch, "length": length, "round_trip_exact": exact,
                            "compute_ms_p50": sorted(t.compute_ms for t in timings)[5],
                            "total_ms_p50": sorted(t.total_ms for t in timings)[5]})
        refused = False
        try:
            runner({"ids": np.zeros((65, 1), np.int64), "values": np.zeros((65, 1), np.float32)})
        except Exception:  # noqa: BLE001 - any refusal counts; the shape is outside the profile
            refused = True
        ok = all(r["round_trip_exact"] and r["total_ms_p50"] >= r["compute_ms_p50"] >= 0 for r in results)
        return {"ok": ok and refused, "calls": results, "shape_outside_profile_refused": refused,
                "shape_sets_allocated": len(runner._buffers)}
    finally:
        runner.close()


def _torch_cuda_runner(model: Any, spec: Any, half: bool) -> Callable:
    import numpy as np
    import torch

    dtype = torch.float16 if half else torch.float32
    device_model = model.to("cuda", dtype=dtype) if half else model.to("cuda")

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tensors = []
        for t in spec.inputs:
            value = torch.from_numpy(np.ascontiguousarray(inputs[t.name])).to("cuda")
            tensors.append(value.to(dtype) if value.is_floating_point() else value)
        with torch.no_grad():
            result = device_model(*tensors)
        result = result if isinstance(result, (tuple, list)) else (result,)
        return {o.name: r.float().cpu().numpy() for o, r in zip(spec.outputs, result)}

    return run


def compare_runners(spec: Any, sample_fn: Callable, reference: Callable, candidate: Callable,
                    atol: float, rtol: float) -> list[Any]:
    """Every parity case of ``spec``: ``candidate`` against ``reference`` (the parity rule)."""
    from tools.build_repo.parity import compare_outputs, parity_cases

    figures = []
    for batch, axes in parity_cases(spec):
        sample = sample_fn(batch, axes)
        feed = {t.name: sample[t.name].numpy() for t in spec.inputs}
        figures += compare_outputs(reference(feed), candidate(feed), spec, batch, axes, atol, rtol)
    return figures


def _figures_summary(figures: list[Any], atol: float, rtol: float) -> dict[str, Any]:
    return {"max_abs": max(f.max_abs for f in figures), "max_rel": max(f.max_rel for f in figures),
            "atol": atol, "rtol": rtol, "within_tolerance": all(f.ok for f in figures),
            "cases": len(figures)}


def _gpu_models(spec_path: Path, names: list[str] | None) -> tuple[Any, list[Any]]:
    from tools.build_repo.spec import load_spec
    from tools.manifest import ModelKind

    spec = load_spec(spec_path).for_target("gpu")
    models = [m for m in spec.models if m.kind is ModelKind.PYTORCH]
    if names:
        missing = sorted(set(names) - {m.name for m in models})
        if missing:
            raise ValueError(f"{spec_path}: no exported gpu-target model named {missing}")
        models = [m for m in models if m.name in names]
    return spec, models


def torch_cuda_parity(spec: Any, model_spec: Any) -> dict[str, Any]:
    """One model in torch on CUDA: fp32 against the CPU (gated), fp16 against fp32 (reported)."""
    import copy

    import torch

    from tools.build_repo.onnx2trt import parity_tolerance
    from tools.build_repo.model_source import model_callables

    factory, sample_fn = model_callables(spec.root, model_spec, f"{spec.path}: model {model_spec.name!r}: ")
    model = factory().eval()
    cpu = _torch_cpu_runner(model, model_spec)
    torch.backends.cudnn.allow_tf32 = False  # exact fp32, as a plan built with TF32 cleared
    torch.backends.cuda.matmul.allow_tf32 = False
    fp32 = _torch_cuda_runner(copy.deepcopy(model), model_spec, half=False)
    fp16 = _torch_cuda_runner(copy.deepcopy(model), model_spec, half=True)
    f32 = compare_runners(model_spec, sample_fn, cpu, fp32, model_spec.atol, model_spec.rtol)
    atol16, rtol16 = parity_tolerance(model_spec, "fp16")
    f16 = compare_runners(model_spec, sample_fn, fp32, fp16, atol16, rtol16)
    return {"model": model_spec.name,
            "cuda_fp32_vs_cpu_fp32": _figures_summary(f32, model_spec.atol, model_spec.rtol),
            "cuda_fp16_vs_cuda_fp32": _figures_summary(f16, atol16, rtol16)}


def _torch_cpu_runner(model: Any, spec: Any) -> Callable:
    import torch

    def run(inputs: dict[str, Any]) -> dict[str, Any]:
        with torch.no_grad():
            result = model(*(torch.from_numpy(inputs[t.name]) for t in spec.inputs))
        result = result if isinstance(result, (tuple, list)) else (result,)
        return {o.name: r.numpy() for o, r in zip(spec.outputs, result)}

    return run


def run_offline(args: argparse.Namespace) -> int:
    """Section 2: with only what is installed (PyTorch with CUDA; cuda-python if present)."""
    report = Report(args.json)
    entry = report.section("offline")
    skips: list[str] = []
    try:
        try:
            import torch
        except ImportError as exc:
            return _finish_skipped(report, entry, f"torch is not installed ({exc})")
        entry["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda}
        if not torch.cuda.is_available():
            return _finish_skipped(report, entry, f"torch {torch.__version__} sees no CUDA device "
                                                  f"(torch.cuda.is_available() is False)")
        index = torch.cuda.current_device()
        entry["device"] = {"name": torch.cuda.get_device_name(index),
                           "compute_capability": ".".join(map(str, torch.cuda.get_device_capability(index))),
                           "cudnn": torch.backends.cudnn.version()}
        _say(f"offline: {entry['device']['name']} (compute capability "
             f"{entry['device']['compute_capability']}), torch {torch.__version__} CUDA {torch.version.cuda}")
        entry["torch_cuda"] = []
        try:
            spec, models = _gpu_models(args.spec, args.models)
        except Exception as exc:  # noqa: BLE001 - a missing package here only skips the models
            skips.append(f"models: {type(exc).__name__}: {exc}")
            models = []
        for model_spec in models:
            try:
                row = torch_cuda_parity(spec, model_spec)
            except Exception as exc:  # noqa: BLE001
                entry["failures"].append(f"{model_spec.name}: torch CUDA: {type(exc).__name__}: {exc}")
                continue
            entry["torch_cuda"].append(row)
            fp32, fp16 = row["cuda_fp32_vs_cpu_fp32"], row["cuda_fp16_vs_cuda_fp32"]
            if not fp32["within_tolerance"]:
                entry["failures"].append(
                    f"{model_spec.name}: torch CUDA fp32 differs from CPU fp32 beyond atol "
                    f"{fp32['atol']:g} rtol {fp32['rtol']:g} (max abs {fp32['max_abs']:.3g})")
            _say(f"offline: {model_spec.name}: CUDA fp32 vs CPU max abs {fp32['max_abs']:.2e}; "
                 f"fp16 vs fp32 max abs {fp16['max_abs']:.2e} (plan fp16 tolerance "
                 f"{'met' if fp16['within_tolerance'] else 'NOT met'})")
        try:
            from tools.build_repo.onnx2trt import _cudart

            cudart = _cudart()
        except Exception as exc:  # noqa: BLE001
            skips.append(f"plan runner: {exc}")
        else:
            entry["plan_runner"] = plan_runner_on_cudart(cudart)
            if not entry["plan_runner"]["ok"]:
                entry["failures"].append(f"plan runner on real cudart: {entry['plan_runner']}")
            _say(f"offline: plan runner on real cudart: {'ok' if entry['plan_runner']['ok'] else 'FAILED'}")
    except Exception as exc:  # noqa: BLE001 - the report is written whatever happened
        entry["failures"].append(f"{type(exc).__name__}: {exc}")
        entry["traceback"] = traceback.format_exc()
    entry["skipped"] = skips
    return _finish(report, entry, "offline")


def _finish_skipped(report: Report, entry: dict[str, Any], reason: str) -> int:
    entry.update(status="skipped", reason=reason)
    report.save()
    _say(f"offline: {reason}; nothing to check without a registry (report: {_shown(report.path)})")
    return EXIT_SKIPPED


def _finish(report: Report, entry: dict[str, Any], name: str) -> int:
    entry["status"] = "failed" if entry["failures"] else "passed"
    report.save()
    for failure in entry["failures"]:
        _say(f"{name}: FAILED: {failure}")
    for skip in entry.get("skipped", []):
        _say(f"{name}: skipped {skip}")
    _say(f"{name}: {entry['status']} (report: {_shown(report.path)})")
    return EXIT_FAILED if entry["failures"] else EXIT_OK


# --- full: the pinned GPU wheels ----------------------------------------------------------------


def onnxruntime_cuda(ort: Any = None) -> Any:
    """``onnxruntime`` with its CUDA execution provider, CUDA and cuDNN libraries preloaded.

    ``preload_dlls`` loads the CUDA/cuDNN libraries of the ``[cuda,cudnn]`` extras from
    site-packages (torch here is the CPU build, so nothing else loads them).

    Raises:
        RuntimeError: no CUDA provider, with the fix. With both ``onnxruntime`` and
            ``onnxruntime-gpu`` installed the CPU wheel can shadow the GPU one
            (microsoft/onnxruntime#26996); scripts/gpu-check.sh installs only the GPU wheel.
    """
    if ort is None:
        import onnxruntime as ort

    providers = ort.get_available_providers()
    if "CUDAExecutionProvider" not in providers:
        raise RuntimeError(
            f"ONNX Runtime has no CUDAExecutionProvider (available: {providers}). Install only "
            f"onnxruntime-gpu: `pip uninstall -y onnxruntime onnxruntime-gpu && pip install "
            f"'onnxruntime-gpu[cuda,cudnn]'` (both wheels together can lose the CUDA provider, "
            f"microsoft/onnxruntime#26996); scripts/gpu-check.sh does this in .venv-gpu"
        )
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        preload(directory="")  # the nvidia-* wheels of site-packages, then the default paths
    return ort


class OrtCudaRunner:
    """An ONNX Runtime CUDA session, timed like ``PlanRunner``: same stream, same kind of buffers.

    The session runs on the runner's own CUDA stream (``user_compute_stream``) through IO binding
    to device buffers allocated once per shape; copies go from and to pinned host memory; CUDA
    events bracket the execution and the copies, and ``disable_synchronize_execution_providers``
    lets the run return after enqueueing, as ``execute_async_v3`` does.
    """

    def __init__(self, onnx_path: Path, ort: Any, cudart: Any) -> None:
        from tools.build_repo.onnx2trt import CudaStream

        self.ort, self.stream = ort, CudaStream(cudart)
        options = {"device_id": "0", "user_compute_stream": str(int(self.stream.handle))}
        self.session = ort.InferenceSession(str(onnx_path), providers=[("CUDAExecutionProvider", options)])
        if "CUDAExecutionProvider" not in self.session.get_providers():
            raise RuntimeError(f"ONNX Runtime could not create a CUDA session for {onnx_path} "
                               f"(it fell back to {self.session.get_providers()})")
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.run_options = ort.RunOptions()
        self.run_options.add_run_config_entry("disable_synchronize_execution_providers", "1")

    def __call__(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Plain ``session.run`` on host arrays (parity)."""
        return dict(zip(self.outputs, self.session.run(self.outputs, inputs)))

    def time(self, inputs: dict[str, Any], iterations: int, warmup: int = 5) -> list[Any]:
        """Timings like ``PlanRunner.time``: with copies, and the execution alone."""
        import numpy as np

        from tools.build_repo.onnx2trt import Timing

        ort, stream = self.ort, self.stream
        binding = self.session.io_binding()
        device_in, host_in = {}, {}
        for name, value in inputs.items():
            value = np.ascontiguousarray(value)
            host_in[name], _ = stream.pinned(value.shape, value.dtype)
            np.copyto(host_in[name], value)
            device_in[name] = ort.OrtValue.ortvalue_from_shape_and_type(value.shape, value.dtype, "cuda", 0)
            binding.bind_ortvalue_input(name, device_in[name])
        for name in self.outputs:  # one run to learn the output shapes, then fixed buffers
            binding.bind_output(name, "cuda")
        self.session.run_with_iobinding(binding)
        device_out, host_out = {}, {}
        for name, value in zip(self.outputs, binding.get_outputs()):
            shape, dtype = tuple(value.shape()), np.dtype(value.numpy().dtype)
            device_out[name] = ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, "cuda", 0)
            host_out[name], _ = stream.pinned(shape, dtype)
            binding.bind_ortvalue_output(name, device_out[name])

        def call(copies: bool) -> None:
            stream.record(0)
            if copies:
                for name in inputs:
                    stream.to_device(device_in[name].data_ptr(), host_in[name])
            stream.record(1)
            self.session.run_with_iobinding(binding, self.run_options)
            stream.record(2)
            if copies:
                for name in self.outputs:
                    stream.to_host(host_out[name], device_out[name].data_ptr())
            stream.record(3)
            stream.wait(3)

        for _ in range(warmup):
            call(True)
        timings = []
        for _ in range(iterations):
            call(True)
            total = stream.elapsed_ms(0, 3)
            call(False)
            timings.append(Timing(stream.elapsed_ms(1, 2), total))
        return timings

    def close(self) -> None:
        """Free the pinned buffers, events and the stream."""
        self.stream.close()


def timing_rows(engine: str, model: str, batch: int, timings: list[Any]) -> dict[str, Any]:
    """One row of the timing table: P50/P99 (``tools.stats``) and items/s, compute and total."""
    from tools import stats

    row: dict[str, Any] = {"model": model, "engine": engine, "batch": batch, "calls": len(timings)}
    for kind in ("compute", "total"):
        latency = stats.latency_summary(getattr(t, f"{kind}_ms") for t in timings)
        if latency is None:
            raise ValueError(f"{engine} batch {batch}: no timed call")
        row[f"{kind}_p50_ms"], row[f"{kind}_p99_ms"] = round(latency.p50_ms, 4), round(latency.p99_ms, 4)
        row[f"{kind}_per_s"] = round(batch / (latency.p50_ms / 1e3), 1)
    return row


def _sample_feed(model_spec: Any, sample_fn: Callable, batch: int, length: int | None) -> dict[str, Any]:
    axes = {name: min(max(length or a.opt, a.min), a.max) for name, a in model_spec.axes.items()}
    sample = sample_fn(batch, axes)
    return {t.name: sample[t.name].numpy().astype(t.numpy_dtype) for t in model_spec.inputs}


def run_full(args: argparse.Namespace) -> int:
    """Section 3: build, parity and timings with the pinned GPU wheels."""
    report = Report(args.json)
    entry = report.section("full")
    failures = entry["failures"]
    runners: list[Any] = []
    try:
        from tools.build_repo import onnx2trt
        from tools.build_repo.config import ONNX_FILE
        from tools.build_repo.parity import check_parity
        from tools.build_repo.pipeline import build_repository
        from tools.build_repo.model_source import model_callables

        ort = onnxruntime_cuda()
        entry["onnxruntime"] = {"version": ort.__version__, "providers": ort.get_available_providers()}
        info = onnx2trt.probe_gpu()
        entry["gpu"] = {"name": info.name, "compute_capability": info.compute_capability,
                        "tensorrt": info.tensorrt_version}
        _say(f"full: {info.name} (compute capability {info.compute_capability}), TensorRT "
             f"{info.tensorrt_version}, ONNX Runtime {ort.__version__} with CUDA")
        cudart = onnx2trt._cudart()
        spec, models = _gpu_models(args.spec, args.models)
        output = args.workdir / "model_repository"
        started = time.perf_counter()
        result = build_repository(args.spec, output, target="gpu", only=[m.name for m in models],
                                  force=True, progress=False, raise_on_failure=False)
        entry["build"] = {"seconds": round(time.perf_counter() - started, 1), "error": str(result.error or ""),
                          "models": {m.name: {"status": str(m.status), "note": m.note, "timings": m.timings}
                                     for m in result.models}}
        if result.error is not None:
            failures.append(f"tools build-repo --target gpu: {result.error}")
        entry["parity"], entry["timings"] = [], []
        batches = [int(b) for b in args.batches.split(",")]
        for model_spec in models:
            onnx_path = output / model_spec.name / "1" / ONNX_FILE
            if not onnx_path.is_file():
                failures.append(f"{model_spec.name}: the build wrote no {ONNX_FILE}")
                continue
            factory, sample_fn = model_callables(spec.root, model_spec, f"{spec.path}: ")
            torch_model = factory().eval()
            engines: dict[str, Any] = {}
            for precision in ("fp32", "fp16"):
                label = f"TensorRT {precision}"
                plan = args.workdir / "plans" / f"{model_spec.name}.{precision}.plan"
                plan.parent.mkdir(parents=True, exist_ok=True)
                atol, rtol = onnx2trt.parity_tolerance(model_spec, precision)
                started = time.perf_counter()
                try:
                    onnx2trt.build_plan(model_spec, onnx_path, plan, args.workdir / "timing-caches",
                                        precision=precision)
                    runner = onnx2trt.plan_runner(plan)
                    runners.append(runner)
                    engines[label] = runner
                    _parity_row(entry, model_spec, label, check_parity, torch_model, sample_fn, runner,
                                atol, rtol, time.perf_counter() - started)
                except Exception as exc:  # noqa: BLE001 - TypeError on an old driver included
                    failures.append(f"{model_spec.name}: {label}: {type(exc).__name__}: {exc}")
            try:
                runner = OrtCudaRunner(onnx_path, ort, cudart)
                runners.append(runner)
                engines["ONNX Runtime CUDA fp32"] = runner
                _parity_row(entry, model_spec, "ONNX Runtime CUDA fp32", check_parity, torch_model,
                            sample_fn, runner, model_spec.atol, model_spec.rtol, None)
            except Exception as exc:  # noqa: BLE001
                failures.append(f"{model_spec.name}: ONNX Runtime CUDA: {type(exc).__name__}: {exc}")
            for batch in batches:
                if batch > model_spec.max_batch_size:
                    entry["timings"].append({"model": model_spec.name, "batch": batch, "skipped":
                                             f"above max_batch_size {model_spec.max_batch_size}"})
                    continue
                feed = _sample_feed(model_spec, sample_fn, batch, args.length)
                for label, runner in engines.items():
                    try:
                        row = timing_rows(label, model_spec.name, batch, runner.time(feed, args.iterations))
                    except Exception as exc:  # noqa: BLE001
                        failures.append(f"{model_spec.name}: {label} batch {batch}: {type(exc).__name__}: {exc}")
                        continue
                    entry["timings"].append(row)
                    report.save()
        _print_tables(entry)
    except Exception as exc:  # noqa: BLE001 - the report is written whatever happened
        failures.append(f"{type(exc).__name__}: {exc}")
        entry["traceback"] = traceback.format_exc()
    finally:
        for runner in runners:
            runner.close()
    return _finish(report, entry, "full")


def _parity_row(entry: dict[str, Any], model_spec: Any, label: str, check_parity: Callable, torch_model: Any,
                sample_fn: Callable, runner: Callable, atol: float, rtol: float, build_s: float | None) -> None:
    row: dict[str, Any] = {"model": model_spec.name, "engine": label, "atol": atol, "rtol": rtol,
                           "build_s": None if build_s is None else round(build_s, 1)}
    try:
        figures = check_parity(model_spec, torch_model, sample_fn, runner, runtime=label, atol=atol, rtol=rtol)
        row.update(verdict="ok", max_abs=max(f.max_abs for f in figures), max_rel=max(f.max_rel for f in figures))
    except Exception as exc:  # noqa: BLE001 - ParityError names every output
        row["verdict"] = f"{type(exc).__name__}: {exc}"
        entry["failures"].append(f"{model_spec.name}: {label} parity: {exc}")
    entry["parity"].append(row)


def _print_tables(entry: dict[str, Any]) -> None:
    print(f"{'model':22} {'engine':24} {'verdict':8} {'max abs':>9} {'atol':>8} {'rtol':>8}")
    for r in entry.get("parity", []):
        verdict = "ok" if r["verdict"] == "ok" else "FAILED"
        print(f"{r['model']:22} {r['engine']:24} {verdict:8} {r.get('max_abs', float('nan')):9.2e} "
              f"{r['atol']:8g} {r['rtol']:8g}")
    print(f"{'model':22} {'engine':24} {'batch':>5} {'compute p50':>11} {'p99':>8} {'/s':>8} "
          f"{'+copies p50':>11} {'p99':>8} {'/s':>8}   (ms, CUDA events)")
    for r in entry.get("timings", []):
        if "skipped" in r:
            print(f"{r['model']:22} {'-':24} {r['batch']:5} skipped: {r['skipped']}")
            continue
        print(f"{r['model']:22} {r['engine']:24} {r['batch']:5} {r['compute_p50_ms']:11.3f} "
              f"{r['compute_p99_ms']:8.3f} {r['compute_per_s']:8.0f} {r['total_p50_ms']:11.3f} "
              f"{r['total_p99_ms']:8.3f} {r['total_per_s']:8.0f}")


# --- command line -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.gpu_check {preflight,offline,full,requirements}``."""
    parser = argparse.ArgumentParser(prog="python -m tools.gpu_check", description=__doc__.splitlines()[0])
    sections = parser.add_subparsers(dest="section", required=True)
    for name, help_text in (("preflight", "the driver against the pinned wheels' CUDA floor"),
                            ("offline", "what installed PyTorch with CUDA can check, no registry"),
                            ("full", "build, parity and timings with the pinned GPU wheels"),
                            ("requirements", "print the project's requirements for .venv-gpu")):
        sub = sections.add_parser(name, help=help_text)
        sub.add_argument("--json", type=Path, default=DEFAULT_REPORT, help="the report (JSON)")
        sub.add_argument("--pins", type=Path, default=PINS, help=argparse.SUPPRESS)
        sub.add_argument("--spec", type=Path, default=REPO_ROOT / "repository.yaml")
        sub.add_argument("--models", nargs="*", default=None,
                         help="exported gpu-target models to check (default: all)")
        sub.add_argument("--workdir", type=Path, default=DEFAULT_REPORT.parent)
        sub.add_argument("--batches", default="1,8,32")
        sub.add_argument("--length", type=int, default=None,
                         help="length of every dynamic axis in the timings (default: its opt)")
        sub.add_argument("--iterations", type=int, default=50)
    args = parser.parse_args(argv)
    if args.section == "requirements":
        print("\n".join(project_requirements()))
        return EXIT_OK
    return {"preflight": run_preflight, "offline": run_offline, "full": run_full}[args.section](args)


if __name__ == "__main__":
    sys.exit(main())
