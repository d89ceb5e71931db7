"""ONNX -> TensorRT plan through the TensorRT Python API, then parity against PyTorch.

Profiles, precision flags, guards and the "skipped: no GPU" outcome are plain functions; the calls
that need a GPU sit behind ``TensorRTApi`` (real: ``_RealTensorRT``) so they can be swapped in tests.
Device memory goes through cuda-python on a dedicated stream (as TensorRT's own samples do), so
the builder keeps the CPU build of torch.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tools.manifest import TensorRTRecord
from tools.build_repo.parity import Runner
from tools.build_repo.results import StageStatus
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
    """Result of the TensorRT stage: done (a plan) or skipped (with the reason)."""

    status: StageStatus
    reason: str = ""
    plan: Path | None = None
    info: GpuInfo | None = None
    precision: str = ""

    def manifest_record(self) -> TensorRTRecord | None:
        """The manifest's ``tensorrt`` record of a built plan, else None."""
        if self.status != StageStatus.DONE or self.info is None:
            return None
        return TensorRTRecord(self.info.tensorrt_version, self.info.compute_capability, self.precision)


def optimization_profile(spec: ModelSpec) -> Profile:
    """min/opt/max shapes per input: batch 1 / half / ``max_batch_size``, axes from the spec.

    Raises:
        TensorRTError: an input uses an axis the spec does not declare.
    """
    batch_opt = max(1, spec.max_batch_size // 2)
    declared = spec.axes
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


def builder_flags(trt: Any, names: list[str]) -> list[Any]:
    """The ``trt.BuilderFlag`` members for ``names``.

    TensorRT 11 removed the precision-enabling builder flags (weakly typed networks are gone:
    precision comes from the ONNX graph, a strongly typed network). This builder is the weakly
    typed TensorRT 10 path; ``pyproject.toml`` pins ``tensorrt<11``.

    Raises:
        TensorRTError: a flag this TensorRT does not have, naming the version and the way out.
    """
    flags = []
    for name in names:
        flag = getattr(trt.BuilderFlag, name, None)
        if flag is None:
            version = getattr(trt, "__version__", "?")
            raise TensorRTError(
                f"TensorRT {version} has no BuilderFlag.{name}: TensorRT 11 removed the "
                f"precision-enabling builder flags. Install TensorRT 10 (pip install "
                f"'tensorrt>=10,<11', or the TensorRT of an NGC image before 26.xx), or set "
                f"gpu.precision: fp32"
            )
        flags.append(flag)
    return flags


def timing_cache_path(cache_dir: Path, info: GpuInfo) -> Path:
    """Where the timing cache for this TensorRT version and GPU lives.

    A timing cache only applies to the TensorRT version and device that wrote it, so its name
    carries both; another GPU or a new image starts its own cache.
    """
    capability = info.compute_capability.replace(".", "")
    return Path(cache_dir) / f"timing-trt{info.tensorrt_version}-sm{capability}.cache"


def load_timing_cache(config: Any, cache_path: Path) -> Any:
    """Attach a timing cache to ``config``: the saved one when TensorRT accepts it, else a new one.

    ``set_timing_cache(..., ignore_mismatch=False)`` returns False for a cache from another
    device or version; continuing with it would leave ``get_timing_cache()`` None after the
    build. Such a cache is replaced by a fresh one (and overwritten after the build).
    """
    saved = cache_path.read_bytes() if cache_path.is_file() else b""
    cache = config.create_timing_cache(saved)
    if cache is not None and config.set_timing_cache(cache, ignore_mismatch=False):
        return cache
    fresh = config.create_timing_cache(b"")
    if fresh is None or not config.set_timing_cache(fresh, ignore_mismatch=False):
        raise TensorRTError(f"TensorRT could not create a timing cache ({cache_path})")
    return fresh


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
    name, capability = _cuda_device()
    return GpuInfo(name, capability, trt.__version__)


def _cuda_device() -> tuple[str, str]:
    """Name and compute capability of CUDA device 0, through the driver API (no toolkit needed).

    Raises:
        NoGpu: no driver or no device.
    """
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
    return name.value.decode(), f"{major.value}.{minor.value}"


def device_record(probe: Callable[[], GpuInfo] | None = None) -> dict[str, str] | None:
    """TensorRT version and compute capability a plan built here would carry; None without a GPU.

    Part of a TensorRT model's export key: a new serving image (another TensorRT) or another GPU
    rebuilds the plan instead of skipping it as unchanged.
    """
    try:
        info = (probe or probe_gpu)()
    except NoGpu:
        return None
    return {"tensorrt": info.tensorrt_version, "compute_capability": info.compute_capability}


class TensorRTApi(Protocol):
    """The GPU-only seam: build a plan, and run one."""

    def build(
        self, onnx_path: Path, plan_path: Path, profile: Profile, precision: str,
        timing_cache: Path, workspace_mb: int,
    ) -> None: ...

    def runner(self, plan_path: Path) -> Runner: ...


def _cudart() -> Any:
    """cuda-python's runtime module (``cuda-bindings`` 12.8+ and 13; older ``cuda-python``)."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart  # cuda-python < 12.8
        except ImportError:
            raise TensorRTError(
                "cuda-python is not installed: the TensorRT parity check needs it for device "
                "memory (pip install 'triton-forge[gpu]')"
            ) from None
    return cudart


def _check(result: Any, what: str) -> Any:
    """Unpack a cuda-python ``(error, *values)`` tuple, raising on a CUDA error."""
    error, *values = result if isinstance(result, tuple) else (result,)
    if int(error) != 0:
        raise TensorRTError(f"CUDA {what} failed: {error}")
    return values[0] if len(values) == 1 else values


class _RealTensorRT:
    """TensorRT 10 Python API; device memory and a dedicated stream through cuda-python."""

    def __init__(self, trt: Any = None, cudart: Any = None) -> None:
        if trt is None:
            import tensorrt as trt
        self.trt, self._cudart = trt, cudart
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
        for flag in builder_flags(trt, set_flags):
            config.set_flag(flag)
        for flag in builder_flags(trt, clear_flags):
            config.clear_flag(flag)
        load_timing_cache(config, timing_cache)
        opt_profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in profile.items():
            opt_profile.set_shape(name, lo, opt, hi)
        config.add_optimization_profile(opt_profile)
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise TensorRTError(f"{onnx_path}: TensorRT could not build the plan (see log above)")
        plan_path.write_bytes(bytes(serialized))
        cache = config.get_timing_cache()
        if cache is not None:
            timing_cache.parent.mkdir(parents=True, exist_ok=True)
            timing_cache.write_bytes(bytes(cache.serialize()))

    def runner(self, plan_path: Path) -> Runner:
        trt, cudart = self.trt, self._cudart or _cudart()
        engine = trt.Runtime(self.logger).deserialize_cuda_engine(plan_path.read_bytes())
        if engine is None:
            raise TensorRTError(f"{plan_path}: TensorRT could not deserialize the plan")
        context = engine.create_execution_context()
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        to_device = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        to_host = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost

        def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            stream = _check(cudart.cudaStreamCreate(), "cudaStreamCreate")
            allocations: list[int] = []

            def device_copy_of(array: np.ndarray) -> int:
                pointer = _check(cudart.cudaMalloc(max(array.nbytes, 1)), "cudaMalloc")
                allocations.append(pointer)
                return pointer

            try:
                host = {}
                for name, value in inputs.items():
                    array = np.ascontiguousarray(value)
                    pointer = device_copy_of(array)
                    _check(cudart.cudaMemcpyAsync(pointer, array.ctypes.data, array.nbytes,
                                                  to_device, stream), "cudaMemcpyAsync")
                    context.set_input_shape(name, tuple(array.shape))
                    context.set_tensor_address(name, pointer)
                    host[name] = array  # alive until the copy is done
                for name in outputs:
                    dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
                    host[name] = np.empty(tuple(context.get_tensor_shape(name)), dtype)
                    context.set_tensor_address(name, device_copy_of(host[name]))
                if not context.execute_async_v3(int(stream)):
                    raise TensorRTError(f"{plan_path}: TensorRT execution failed")
                for name, pointer in zip(outputs, allocations[len(inputs):]):
                    _check(cudart.cudaMemcpyAsync(host[name].ctypes.data, pointer, host[name].nbytes,
                                                  to_host, stream), "cudaMemcpyAsync")
                _check(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
                return {name: host[name] for name in outputs}
            finally:
                for pointer in allocations:
                    cudart.cudaFree(pointer)
                cudart.cudaStreamDestroy(stream)

        return run


def build_plan(
    spec: ModelSpec,
    onnx_path: Path,
    plan_path: Path,
    cache_dir: Path,
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
        cache_dir: folder of the TensorRT timing caches (one per TensorRT version and GPU).
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
        return TrtOutcome(StageStatus.SKIPPED, f"no GPU ({exc})", precision=precision)
    (api or _RealTensorRT()).build(
        onnx_path, plan_path, profile, precision, timing_cache_path(cache_dir, info),
        spec.gpu.workspace_mb,
    )
    return TrtOutcome(StageStatus.DONE, plan=plan_path, info=info, precision=precision)


def plan_runner(plan_path: Path, api: TensorRTApi | None = None) -> Runner:
    """A ``Runner`` over a built plan (GPU only)."""
    return (api or _RealTensorRT()).runner(plan_path)
