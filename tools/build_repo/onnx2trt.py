"""ONNX -> TensorRT plan through the TensorRT Python API, then parity against PyTorch.

Profiles, precision flags, guards and the "skipped: no GPU" outcome are plain functions; the calls
that need a GPU sit behind ``TensorRTApi`` (real: ``_RealTensorRT``) so they can be swapped in tests.
Plans run through ``PlanRunner``: cuda-python device memory, pinned host buffers and CUDA events
on one stream (as TensorRT's own samples do), so the builder keeps the CPU build of torch.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tools.manifest import ModelKind, TensorRTRecord
from tools.build_repo.parity import Runner
from tools.build_repo.results import StageStatus
from tools.build_repo.spec import ModelSpec, RepoSpec
from tools.errors import BuildError, TensorRTError
from tools.tensorrt_module import import_tensorrt_module

Shape = tuple[int, ...]
Profile = dict[str, tuple[Shape, Shape, Shape]]  # input -> (min, opt, max), batch axis first
# ORT-TensorRT engine and timing caches inside the serving container (written at load, not
# shipped: engines are specific to the TensorRT and GPU that build them; /tmp is writable there)
ORT_TRT_CACHE_ROOT = "/tmp/triton-forge/ort-tensorrt"


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
    """min/opt/max shapes per input: batch 1 / ``max_batch_size`` / ``max_batch_size``, axes from the spec.

    The opt batch is ``max_batch_size``: TensorRT picks its kernels at the opt shape, and the
    executions that decide throughput are the full batches the dynamic batcher forms under load.
    The other axes take the spec's ``opt`` (for MiniLM the length bucket where the served texts
    spend most of their compute; docs/gpu.md has the figures).

    Raises:
        TensorRTError: an input uses an axis the spec does not declare.
    """
    declared = spec.axes
    profile: Profile = {}
    for t in spec.inputs:
        lo, opt, hi = [1], [spec.max_batch_size], [spec.max_batch_size]
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


def flags_key(precision: str) -> str:
    """A file-name word for the builder flags of ``precision``: ``fp16``, ``notf32`` (fp32)."""
    set_flags, clear_flags = precision_flags(precision)
    return "-".join([f.lower() for f in set_flags] + [f"no{f.lower()}" for f in clear_flags])


def timing_cache_path(cache_dir: Path, info: GpuInfo, precision: str) -> Path:
    """Where the timing cache for this TensorRT version, GPU and set of builder flags lives.

    A timing cache only applies to the TensorRT version, device and builder flags that wrote it
    (an fp16 build times fp16 tactics, an fp32 build with TF32 cleared others), so its name
    carries all three; another GPU, a new image or the other precision starts its own cache.
    """
    capability = info.compute_capability.replace(".", "")
    return Path(cache_dir) / (f"timing-trt{info.tensorrt_version}-sm{capability}-"
                              f"{flags_key(precision)}.cache")


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


def import_tensorrt() -> Any:
    """The TensorRT Python module (``tensorrt``, or the bindings alone: ``tensorrt_bindings``).

    Raises:
        NoGpu: neither is installed.
    """
    module, note = import_tensorrt_module()
    if module is None:
        raise NoGpu(f"{note} (pip install 'triton-forge[gpu]')")
    return module


def probe_gpu() -> GpuInfo:
    """Find a CUDA GPU and TensorRT on this host.

    Raises:
        NoGpu: with the reason (TensorRT missing, no driver, no device).
    """
    trt = import_tensorrt()
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


def tensorrt_models(spec: RepoSpec, names: list[str]) -> list[str]:
    """Which of ``names`` the gpu target builds as TensorRT plans (exported models with
    ``gpu.backend: tensorrt``; a model given as an ONNX file is refused that backend elsewhere)."""
    return [m.name for m in spec.models if m.name in names and m.gpu.backend == "tensorrt"
            and m.kind is ModelKind.PYTORCH]


def require_gpu(spec: RepoSpec, names: list[str], probe: Callable[[], GpuInfo] = probe_gpu) -> None:
    """Refuse a gpu build that would skip TensorRT plans because no GPU is visible.

    Such a build would write ``platform: "tensorrt_plan"`` configs without a ``model.plan``; the
    server guard then refuses to start. ``tools build-repo --allow-missing-gpu`` skips this check
    (the stage is then recorded as skipped, with its reason, in the manifest).

    Raises:
        BuildError: naming the models, the reason and both ways out.
    """
    models = tensorrt_models(spec, names)
    if not models:
        return
    try:
        probe()
    except NoGpu as exc:
        raise BuildError(
            f"{spec.path}: target gpu needs a GPU for the TensorRT plans of {', '.join(models)}, "
            f"but there is none here ({exc}); build where the GPU is visible (docker compose -f "
            f"docker-compose.yml -f docker-compose.gpu.yml run --rm builder), or pass "
            f"--allow-missing-gpu to build everything else and record those plans as skipped"
        ) from None


def ort_tensorrt_parameters(spec: ModelSpec, cache_root: str = ORT_TRT_CACHE_ROOT) -> dict[str, str]:
    """The ORT TensorRT execution provider's parameters for Triton's onnxruntime backend.

    One optimization profile covering the spec's whole range (``trt_profile_*_shapes``), so a new
    batch size or length does not build another engine, and engine and timing caches under
    ``cache_root/<model>``, so the second instance and a reload deserialize the engine instead of
    building it. Keys as the onnxruntime_backend README (r25.08) maps them to ORT's options.
    """
    profile = optimization_profile(spec)

    def shapes(index: int) -> str:
        return ",".join(f"{name}:{'x'.join(str(d) for d in dims[index])}"
                        for name, dims in profile.items())

    cache = f"{cache_root.rstrip('/')}/{spec.name}"
    return {
        "precision_mode": spec.gpu.precision.upper(),
        "max_workspace_size_bytes": str(spec.gpu.workspace_mb << 20),
        "trt_engine_cache_enable": "1",
        "trt_engine_cache_path": cache,
        "trt_timing_cache_enable": "1",
        "trt_timing_cache_path": cache,
        "trt_profile_min_shapes": shapes(0),
        "trt_profile_opt_shapes": shapes(1),
        "trt_profile_max_shapes": shapes(2),
    }


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
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def _tensorrt_object(factory: Callable[[], Any], what: str) -> Any:
    """Create a TensorRT object, turning its pybind failures into one clear ``TensorRTError``.

    On a driver older than the CUDA TensorRT was built for, ``trt.Builder(logger)`` does not
    return None: the pybind factory raises ``TypeError`` ("returned nullptr").
    """
    try:
        made = factory()
    except (TypeError, RuntimeError) as exc:
        raise TensorRTError(
            f"TensorRT could not create its {what} ({type(exc).__name__}: {exc}); the usual cause "
            f"is an NVIDIA driver older than this TensorRT's CUDA needs (nvidia-smi shows the "
            f"driver; scripts/gpu-check.sh checks it first)"
        ) from None
    if made is None:
        raise TensorRTError(f"TensorRT could not create its {what}")
    return made


class _RealTensorRT:
    """TensorRT 10 Python API; device memory and a dedicated stream through cuda-python."""

    def __init__(self, trt: Any = None, cudart: Any = None) -> None:
        self.trt = trt if trt is not None else import_tensorrt()
        self._cudart = cudart
        self.logger = self.trt.Logger(self.trt.Logger.WARNING)

    def build(
        self, onnx_path: Path, plan_path: Path, profile: Profile, precision: str,
        timing_cache: Path, workspace_mb: int,
    ) -> None:
        trt = self.trt
        builder = _tensorrt_object(lambda: trt.Builder(self.logger), "Builder")
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

    def runner(self, plan_path: Path) -> PlanRunner:
        runtime = _tensorrt_object(lambda: self.trt.Runtime(self.logger), "Runtime")
        engine = runtime.deserialize_cuda_engine(plan_path.read_bytes())
        if engine is None:
            raise TensorRTError(f"{plan_path}: TensorRT could not deserialize the plan")
        return PlanRunner(self.trt, self._cudart or _cudart(), engine, str(plan_path))


@dataclass(frozen=True)
class Timing:
    """One timed call, from CUDA events on the runner's stream (milliseconds).

    Attributes:
        compute_ms: the execution alone (inputs already on the device).
        total_ms: host-to-device copies, execution and device-to-host copies.
    """

    compute_ms: float
    total_ms: float


def accepted_input(name: str, array: np.ndarray, expected: np.dtype, where: str) -> np.ndarray:
    """``array`` in the engine's dtype for input ``name``, when that loses nothing.

    TensorRT may give an input another dtype than the ONNX graph (int64 ids as int32, for one).
    Integers are converted when every value fits; any other difference is refused.

    Raises:
        TensorRTError: naming the input, both dtypes and why.
    """
    given = array.dtype
    if given == expected:
        return array
    if given.kind in "iub" and expected.kind in "iu":
        info = np.iinfo(expected)
        if array.size == 0 or (int(array.min()) >= info.min and int(array.max()) <= info.max):
            return array.astype(expected)
        raise TensorRTError(f"{where}: input {name!r} holds values outside {expected} "
                            f"(the engine's dtype; the request is {given})")
    raise TensorRTError(f"{where}: input {name!r} is {given}, the engine takes {expected}")


class CudaStream:
    """One CUDA stream with its events and memory (cuda-python), all released by ``close()``.

    Events are numbered: callers record them around the work they time. Host buffers are
    page-locked (``cudaMallocHost``), so copies are real asynchronous DMA, as in a server.
    """

    def __init__(self, cudart: Any, events: int = 4) -> None:
        self.cudart = cudart
        self.handle = _check(cudart.cudaStreamCreate(), "cudaStreamCreate")
        self.events = [_check(cudart.cudaEventCreate(), "cudaEventCreate") for _ in range(events)]
        self._host: set[int] = set()
        self._device: set[int] = set()

    def pinned(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, int]:
        """A page-locked host array and its pointer (free it with ``free``)."""
        count = int(np.prod(shape, dtype=np.int64))
        nbytes = max(count * np.dtype(dtype).itemsize, 1)
        pointer = int(_check(self.cudart.cudaMallocHost(nbytes), "cudaMallocHost"))
        self._host.add(pointer)
        raw = (ctypes.c_uint8 * nbytes).from_address(pointer)
        return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape), pointer

    def device(self, nbytes: int) -> int:
        """Device memory of ``nbytes`` (at least one byte)."""
        pointer = int(_check(self.cudart.cudaMalloc(max(nbytes, 1)), "cudaMalloc"))
        self._device.add(pointer)
        return pointer

    def free(self, pointer: int) -> None:
        """Free one host or device allocation of this stream."""
        if pointer in self._host:
            self._host.discard(pointer)
            self.cudart.cudaFreeHost(pointer)
        elif pointer in self._device:
            self._device.discard(pointer)
            self.cudart.cudaFree(pointer)

    def to_device(self, pointer: int, host: np.ndarray) -> None:
        """Enqueue a host-to-device copy of ``host``."""
        _check(self.cudart.cudaMemcpyAsync(pointer, host.ctypes.data, host.nbytes,
                                           self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice,
                                           self.handle), "cudaMemcpyAsync")

    def to_host(self, host: np.ndarray, pointer: int) -> None:
        """Enqueue a device-to-host copy into ``host``."""
        _check(self.cudart.cudaMemcpyAsync(host.ctypes.data, pointer, host.nbytes,
                                           self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost,
                                           self.handle), "cudaMemcpyAsync")

    def record(self, event: int) -> None:
        """Record event number ``event`` on the stream."""
        _check(self.cudart.cudaEventRecord(self.events[event], self.handle), "cudaEventRecord")

    def wait(self, event: int) -> None:
        """Block until event number ``event`` has completed."""
        _check(self.cudart.cudaEventSynchronize(self.events[event]), "cudaEventSynchronize")

    def elapsed_ms(self, start: int, end: int) -> float:
        """Milliseconds between two recorded events."""
        return float(_check(self.cudart.cudaEventElapsedTime(self.events[start], self.events[end]),
                            "cudaEventElapsedTime"))

    def close(self) -> None:
        """Free every allocation, the events and the stream."""
        for pointer in list(self._host) + list(self._device):
            self.free(pointer)
        for event in self.events:
            self.cudart.cudaEventDestroy(event)
        self.events = []
        self.cudart.cudaStreamDestroy(self.handle)


@dataclass
class _Buffers:
    """Device and pinned host memory for one set of input shapes."""

    device: dict[str, int]
    host: dict[str, np.ndarray]
    pointers: list[int]


class PlanRunner:
    """Runs a deserialized plan the way a server does, for parity and for fair timings.

    One CUDA stream for its whole life; device buffers and pinned host buffers allocated once per
    set of input shapes and reused; every shape checked with ``set_input_shape``; input dtypes
    compared with ``engine.get_tensor_dtype``; CUDA events around the execution alone and around
    copies plus execution. ``close()`` frees everything.
    """

    #: input shape sets kept allocated (parity and timings use fewer)
    MAX_SHAPE_SETS = 16

    def __init__(self, trt: Any, cudart: Any, engine: Any, where: str) -> None:
        self.trt, self.engine, self.where = trt, engine, where
        self.context = engine.create_execution_context()
        if self.context is None:
            raise TensorRTError(f"{where}: TensorRT could not create an execution context")
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        is_input = {n: engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}
        self.inputs = [n for n in names if is_input[n]]
        self.outputs = [n for n in names if not is_input[n]]
        self.dtypes = {n: np.dtype(trt.nptype(engine.get_tensor_dtype(n))) for n in names}
        self.stream = CudaStream(cudart)
        self._buffers: dict[tuple, _Buffers] = {}
        self._closed = False

    def _set_shapes(self, shapes: dict[str, tuple[int, ...]]) -> None:
        for name in self.inputs:
            if not self.context.set_input_shape(name, shapes[name]):
                raise TensorRTError(
                    f"{self.where}: TensorRT refused shape {shapes[name]} for input {name!r}: it "
                    f"is outside the plan's optimization profile (min, opt, max: "
                    f"{tuple(tuple(s) for s in self.engine.get_tensor_profile_shape(name, 0))})"
                )

    def _buffers_for(self, shapes: dict[str, tuple[int, ...]]) -> _Buffers:
        key = tuple((n, shapes[n]) for n in self.inputs)
        self._set_shapes(shapes)
        if key in self._buffers:
            self._buffers[key] = self._buffers.pop(key)  # most recently used last
            return self._buffers[key]
        buffers = _Buffers({}, {}, [])
        for name in self.inputs + self.outputs:
            shape = shapes[name] if name in shapes else tuple(self.context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise TensorRTError(f"{self.where}: output {name!r} shape {shape} is not "
                                    f"determined by the input shapes {shapes}")
            host, pointer = self.stream.pinned(shape, self.dtypes[name])
            buffers.host[name], buffers.device[name] = host, self.stream.device(host.nbytes)
            buffers.pointers += [pointer, buffers.device[name]]
        if len(self._buffers) >= self.MAX_SHAPE_SETS:
            for pointer in self._buffers.pop(next(iter(self._buffers))).pointers:
                self.stream.free(pointer)
        self._buffers[key] = buffers
        return buffers

    def _prepare(self, inputs: dict[str, np.ndarray]) -> _Buffers:
        if self._closed:
            raise TensorRTError(f"{self.where}: the runner is closed")
        if set(inputs) != set(self.inputs):
            raise TensorRTError(f"{self.where}: inputs {sorted(inputs)} given, the plan takes "
                                f"{sorted(self.inputs)}")
        arrays = {n: accepted_input(n, np.asarray(inputs[n]), self.dtypes[n], self.where)
                  for n in self.inputs}
        buffers = self._buffers_for({n: tuple(a.shape) for n, a in arrays.items()})
        for name, array in arrays.items():
            np.copyto(buffers.host[name], array)
        for name in (*self.inputs, *self.outputs):
            self.context.set_tensor_address(name, buffers.device[name])
        return buffers

    def _enqueue(self, buffers: _Buffers, copies: bool) -> None:
        """One call on the stream, between events: 0 [H2D] 1 execute 2 [D2H] 3, then wait."""
        stream = self.stream
        stream.record(0)
        if copies:
            for name in self.inputs:
                stream.to_device(buffers.device[name], buffers.host[name])
        stream.record(1)
        if not self.context.execute_async_v3(int(stream.handle)):
            raise TensorRTError(f"{self.where}: TensorRT execution failed")
        stream.record(2)
        if copies:
            for name in self.outputs:
                stream.to_host(buffers.host[name], buffers.device[name])
        stream.record(3)
        stream.wait(3)

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Copy in, execute, copy out; returns fresh arrays (the pinned buffers are reused)."""
        buffers = self._prepare(inputs)
        self._enqueue(buffers, copies=True)
        return {name: buffers.host[name].copy() for name in self.outputs}

    def time(self, inputs: dict[str, np.ndarray], iterations: int, warmup: int = 5) -> list[Timing]:
        """Time ``iterations`` calls after ``warmup``: with copies, and the execution alone."""
        buffers = self._prepare(inputs)
        for _ in range(warmup):
            self._enqueue(buffers, copies=True)
        timings = []
        for _ in range(iterations):
            self._enqueue(buffers, copies=True)
            total = self.stream.elapsed_ms(0, 3)
            self._enqueue(buffers, copies=False)
            timings.append(Timing(self.stream.elapsed_ms(1, 2), total))
        return timings

    def close(self) -> None:
        """Free the buffers, the events and the stream."""
        if not self._closed:
            self._closed = True
            self._buffers.clear()
            self.stream.close()

    def __del__(self) -> None:
        # The build's parity stage drops its runner without closing it: free the device memory
        # then, not at the end of the process.
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit cudart may be gone
            pass


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
        cache_dir: folder of the TensorRT timing caches (one per TensorRT version, GPU and flags).
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
        onnx_path, plan_path, profile, precision, timing_cache_path(cache_dir, info, precision),
        spec.gpu.workspace_mb,
    )
    return TrtOutcome(StageStatus.DONE, plan=plan_path, info=info, precision=precision)


def plan_runner(plan_path: Path, api: TensorRTApi | None = None) -> Runner:
    """A ``Runner`` over a built plan (GPU only); the real one is a ``PlanRunner``."""
    return (api or _RealTensorRT()).runner(plan_path)
