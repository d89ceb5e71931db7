"""ONNX -> TensorRT plan through the TensorRT Python API, then parity against PyTorch.

Profiles, precision flags, guards and the "skipped: no GPU" outcome are plain functions; the calls
that need a GPU sit behind ``TensorRTApi`` (real: ``_RealTensorRT``) so they can be swapped in tests.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from tools.build_repo.parity import Runner
from tools.build_repo.spec import ModelSpec
from tools.errors import TensorRTError

Shape = tuple[int, ...]
Profile = dict[str, tuple[Shape, Shape, Shape]]  # input -> (min, opt, max), batch axis first


@dataclass(frozen=True)
class GpuInfo:
    """What the plan is built for; recorded in the manifest and checked by the server guard."""

    name: str
    compute_capability: str  # "8.6"
    tensorrt_version: str  # "10.x.y"


class NoGpu(Exception):
    """This host cannot build plans; ``str()`` is the reason shown as "skipped: no GPU (...)"."""


@dataclass(frozen=True)
class TrtOutcome:
    """Result of the TensorRT stage."""

    status: str  # built | skipped
    reason: str = ""
    plan: Path | None = None
    info: GpuInfo | None = None
    precision: str = ""

    def manifest_entry(self) -> dict | None:
        """``{"version", "compute_capability", "precision"}`` for a built plan, else None."""
        if self.status != "built" or self.info is None:
            return None
        return {
            "version": self.info.tensorrt_version,
            "compute_capability": self.info.compute_capability,
            "precision": self.precision,
        }


def optimization_profile(spec: ModelSpec) -> Profile:
    """min/opt/max shapes per input: batch 1 / half / ``max_batch_size``, axes from the spec.

    Raises:
        TensorRTError: an input uses an axis the spec does not declare.
    """
    batch_opt = max(1, spec.max_batch_size // 2)
    declared = {a.name: a for a in spec.axes}
    profile: Profile = {}
    for t in spec.inputs:
        lo, opt, hi = [1], [batch_opt], [spec.max_batch_size]
        for d in t.shape[1:]:
            if isinstance(d, int):
                lo.append(d), opt.append(d), hi.append(d)
                continue
            axis = declared.get(d)
            if axis is None:
                raise TensorRTError(f"model {spec.name!r}: input {t.name!r} axis {d!r} has no range")
            lo.append(axis.min), opt.append(axis.opt), hi.append(axis.max)
        profile[t.name] = (tuple(lo), tuple(opt), tuple(hi))
    check_profile(spec, profile)
    return profile


def check_profile(spec: ModelSpec, profile: Profile) -> None:
    """A profile must cover every input, batch 1..``max_batch_size`` and each axis's range.

    Raises:
        TensorRTError: naming the model, input and axis.
    """
    for t in spec.inputs:
        if t.name not in profile:
            raise TensorRTError(f"model {spec.name!r}: profile has no shapes for input {t.name!r}")
        lo, opt, hi = profile[t.name]
        if not (len(lo) == len(opt) == len(hi) == len(t.shape)):
            raise TensorRTError(f"model {spec.name!r}: input {t.name!r} profile rank differs")
        if lo[0] > 1 or hi[0] < spec.max_batch_size:
            raise TensorRTError(
                f"model {spec.name!r}: input {t.name!r} profile batch range [{lo[0]}, {hi[0]}] "
                f"does not cover 1..max_batch_size {spec.max_batch_size}"
            )
        for i, (a, b, c) in enumerate(zip(lo, opt, hi)):
            if not a <= b <= c:
                raise TensorRTError(
                    f"model {spec.name!r}: input {t.name!r} axis {i}: min {a} <= opt {b} <= max {c} fails"
                )
        for i, d in enumerate(t.shape[1:], start=1):
            if isinstance(d, str):
                axis = spec.axis(d)
                if lo[i] > axis.min or hi[i] < axis.max:
                    raise TensorRTError(
                        f"model {spec.name!r}: input {t.name!r} axis {d!r} profile [{lo[i]}, "
                        f"{hi[i]}] does not cover the spec's [{axis.min}, {axis.max}]"
                    )


def precision_flags(precision: str) -> tuple[list[str], list[str]]:
    """Builder flags to set and to clear: fp16 enables FP16; fp32 clears TF32 for exact fp32.

    Raises:
        TensorRTError: an unknown precision.
    """
    if precision == "fp16":
        return ["FP16"], []
    if precision == "fp32":
        return [], ["TF32"]
    raise TensorRTError(f"unknown precision {precision!r} (fp32 or fp16)")


def parity_tolerance(spec: ModelSpec, precision: str) -> tuple[float, float]:
    """(atol, rtol) for a plan: the model's tolerances in fp32, the gpu fp16 ones in fp16."""
    if precision == "fp16":
        return spec.gpu.fp16_atol, spec.gpu.fp16_rtol
    return spec.atol, spec.rtol


def probe_gpu() -> GpuInfo:
    """Find a CUDA GPU and TensorRT on this host.

    Raises:
        NoGpu: with the reason (TensorRT missing, no driver, no device).
    """
    try:
        import tensorrt as trt  # noqa: F401
    except ImportError:
        raise NoGpu("the tensorrt package is not installed (pip install 'triton-forge[gpu]')") from None
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        raise NoGpu("no NVIDIA driver: libcuda.so.1 not found") from None
    if cuda.cuInit(0) != 0:
        raise NoGpu("the CUDA driver failed to initialise (cuInit)")
    count = ctypes.c_int(0)
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        raise NoGpu("no CUDA device visible")
    device = ctypes.c_int(0)
    cuda.cuDeviceGet(ctypes.byref(device), 0)
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75, _MINOR = 76
    cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, device)
    cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, device)
    name = ctypes.create_string_buffer(256)
    cuda.cuDeviceGetName(name, 256, device)
    return GpuInfo(name.value.decode(), f"{major.value}.{minor.value}", trt.__version__)


class TensorRTApi(Protocol):
    """The GPU-only seam: build a plan, and run one."""

    def build(
        self, onnx_path: Path, plan_path: Path, profile: Profile, precision: str,
        timing_cache: Path, workspace_mb: int,
    ) -> None: ...

    def runner(self, plan_path: Path) -> Runner: ...


class _RealTensorRT:
    """TensorRT 10 Python API; device memory through torch CUDA tensors."""

    def __init__(self) -> None:
        import tensorrt as trt

        self.trt = trt
        self.logger = trt.Logger(trt.Logger.WARNING)

    def build(
        self, onnx_path: Path, plan_path: Path, profile: Profile, precision: str,
        timing_cache: Path, workspace_mb: int,
    ) -> None:
        trt = self.trt
        builder = trt.Builder(self.logger)
        network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
        parser = trt.OnnxParser(network, self.logger)
        if not parser.parse_from_file(str(onnx_path)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise TensorRTError(f"{onnx_path}: the TensorRT ONNX parser failed: {errors}")
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb << 20)
        set_flags, clear_flags = precision_flags(precision)
        for flag in set_flags:
            config.set_flag(getattr(trt.BuilderFlag, flag))
        for flag in clear_flags:
            config.clear_flag(getattr(trt.BuilderFlag, flag))
        cache_bytes = timing_cache.read_bytes() if timing_cache.is_file() else b""
        cache = config.create_timing_cache(cache_bytes)
        config.set_timing_cache(cache, ignore_mismatch=False)
        opt_profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in profile.items():
            opt_profile.set_shape(name, lo, opt, hi)
        config.add_optimization_profile(opt_profile)
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise TensorRTError(f"{onnx_path}: TensorRT could not build the plan (see log above)")
        plan_path.write_bytes(bytes(serialized))
        timing_cache.parent.mkdir(parents=True, exist_ok=True)
        timing_cache.write_bytes(bytes(config.get_timing_cache().serialize()))

    def runner(self, plan_path: Path) -> Runner:
        import torch

        trt = self.trt
        engine = trt.Runtime(self.logger).deserialize_cuda_engine(plan_path.read_bytes())
        if engine is None:
            raise TensorRTError(f"{plan_path}: TensorRT could not deserialize the plan")
        context = engine.create_execution_context()
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]

        def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            tensors = {}
            for name, value in inputs.items():
                tensors[name] = torch.from_numpy(np.ascontiguousarray(value)).cuda()
                context.set_input_shape(name, tuple(value.shape))
            for name in outputs:
                dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
                shape = tuple(context.get_tensor_shape(name))
                tensors[name] = torch.empty(
                    shape, dtype=torch.from_numpy(np.zeros(0, dtype)).dtype, device="cuda"
                )
            for name, tensor in tensors.items():
                context.set_tensor_address(name, tensor.data_ptr())
            stream = torch.cuda.current_stream()
            if not context.execute_async_v3(stream.cuda_stream):
                raise TensorRTError(f"{plan_path}: TensorRT execution failed")
            stream.synchronize()
            return {name: tensors[name].cpu().numpy() for name in outputs}

        return run


def build_plan(
    spec: ModelSpec,
    onnx_path: Path,
    plan_path: Path,
    timing_cache: Path,
    *,
    precision: str | None = None,
    probe=probe_gpu,
    api: TensorRTApi | None = None,
) -> TrtOutcome:
    """Build the plan for ``spec``; on a host without a GPU, report the stage as skipped.

    Args:
        spec: the model's spec (profile ranges, precision, workspace).
        onnx_path: the exported, parity-checked ONNX model.
        plan_path: where the plan goes.
        timing_cache: TensorRT timing cache file, read if present and updated.
        precision: overrides ``spec.gpu.precision``.
        probe: finds the GPU or raises ``NoGpu`` (replaceable in tests).
        api: the TensorRT seam (default: the real API).

    Returns:
        ``TrtOutcome`` built (with GPU info) or skipped (with the reason).

    Raises:
        TensorRTError: the profile is wrong, or TensorRT failed to parse or build.
    """
    precision = precision or spec.gpu.precision
    precision_flags(precision)
    profile = optimization_profile(spec)
    try:
        info = probe()
    except NoGpu as exc:
        return TrtOutcome("skipped", f"no GPU ({exc})", precision=precision)
    (api or _RealTensorRT()).build(
        onnx_path, plan_path, profile, precision, timing_cache, spec.gpu.workspace_mb
    )
    return TrtOutcome("built", plan=plan_path, info=info, precision=precision)


def plan_runner(plan_path: Path, api: TensorRTApi | None = None) -> Runner:
    """A ``Runner`` over a built plan (GPU only)."""
    return (api or _RealTensorRT()).runner(plan_path)
