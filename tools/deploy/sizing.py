"""Pod resources from the spec: cores, memory, /dev/shm and GPUs of one serving replica.

Requests equal limits (Guaranteed QoS). Every number below is a rule docs/kubernetes.md states.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tools.build_repo.spec import ModelSpec, PythonModelSpec, RepoSpec, TensorSpec, resolve_reference
from tools.errors import UserInputError

MIB = 1024 * 1024
# tritonserver itself (measured idle RSS on the cpu target: 42 MiB) with room for HTTP/gRPC
# buffers; the gpu target adds the CUDA context and TensorRT/ORT host allocations.
SERVER_BASE_MIB = {"cpu": 256, "gpu": 1024}
# One Python-backend stub process (measured idle: 37-54 MiB for the pre/post-processing models).
STUB_MIB = 128
# An ONNX Runtime or TensorRT instance: the weights held twice (file read + session) plus this
# activation budget (measured idle with 87 MiB of MiniLM weights: 172 MiB RSS).
ACTIVATION_MIB = 256
DEFAULT_WEIGHTS_MIB = 256  # a model whose spec names no weights files
# Python-backend shared memory: Triton starts each instance's region at 16 MiB and grows it in
# 16 MiB steps (docker-compose.yml's --backend-config); string inputs are bounded by the HTTP
# limit of 16 MiB per request.
SHM_STEP_MIB = 16
STRING_INPUT_BYTES = 16 * MIB
STRING_OUTPUT_BYTES = 1024  # per element of a string output (labels)
SHM_MIN_MIB = 256
ROUND_MIB = 256


@dataclass(frozen=True)
class PodResources:
    """What one serving replica asks for (requests == limits).

    Attributes:
        cpu: Whole cores (an integer: the static CPU manager can pin them).
        memory_mib: Container memory, /dev/shm included (a memory emptyDir counts against it).
        shm_mib: The /dev/shm emptyDir's sizeLimit.
        gpus: ``nvidia.com/gpu`` (0 on the cpu target).
        breakdown: (item, MiB) lines behind ``memory_mib``, for the docs and the errors.
    """

    cpu: int
    memory_mib: int
    shm_mib: int
    gpus: int
    breakdown: tuple[tuple[str, int], ...]


class ResourceError(UserInputError):
    """The spec's instances cannot fit the resources asked for; the message names the model."""


def _round_up(value: float, step: int) -> int:
    return int(math.ceil(value / step) * step)


def _tensor_bytes(t: TensorSpec, batch: int, axes: dict[str, int], *, is_input: bool) -> int:
    if t.dtype == "string":
        return STRING_INPUT_BYTES if is_input else batch * STRING_OUTPUT_BYTES * math.prod(
            d for d in t.shape[1:] if isinstance(d, int)
        )
    itemsize = {"bool": 1, "uint8": 1, "int8": 1, "float16": 2, "int32": 4, "float32": 4}.get(
        t.dtype, 8
    )
    dims = [axes.get(d, 256) if isinstance(d, str) else d for d in t.shape[1:]]
    return batch * itemsize * math.prod(dims)


def shm_region_mib(model: ModelSpec | PythonModelSpec) -> int:
    """One Python-backend instance's region at its worst: a full batch in and out."""
    axes = {name: a.max for name, a in getattr(model, "axes", {}).items()}
    total = sum(_tensor_bytes(t, model.max_batch_size, axes, is_input=True) for t in model.inputs)
    total += sum(
        _tensor_bytes(t, model.max_batch_size, axes, is_input=False) for t in model.outputs
    )
    return SHM_STEP_MIB + _round_up(total / MIB, SHM_STEP_MIB)


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".onnx", ".plan", ".xml")


def _size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*")
               if p.is_file() and p.suffix in WEIGHT_SUFFIXES)


def weights_mib(model: ModelSpec, built: Mapping[str, int] | None = None,
                root: Path | None = None) -> int:
    """The size of what the model's instances load, in MiB.

    From the build manifest when given (``built``: model -> bytes of its version folder, the
    artifact's record), else from the spec: its ``weights`` reference, a recipe's folder or an
    ONNX file (relative paths against ``root``, the spec's folder, as the build reads them).
    ``DEFAULT_WEIGHTS_MIB`` only when none of these names a file.
    """
    if built is not None and model.name in built:
        return max(1, math.ceil(built[model.name] / MIB))
    if model.weights:
        files = resolve_reference(model.weights, f"model {model.name!r}: weights: ")()
        return max(1, math.ceil(sum(f.stat().st_size for f in files) / MIB))
    local = getattr(model, "onnx", "") or (model.recipe.path if model.recipe else None)
    if local:
        path = Path(local) if Path(local).is_absolute() or root is None else root / local
        if path.exists():
            return max(1, math.ceil(_size_of(path) / MIB))
    return DEFAULT_WEIGHTS_MIB


def size_pod(
    spec: RepoSpec, target: str, *, cpu: int | None = None, gpus: int | None = None,
    memory_mib: int | None = None, built_weights: Mapping[str, int] | None = None,
) -> PodResources:
    """Size one replica for ``target``.

    Args:
        spec: The repository spec (entries whose ``targets`` leave ``target`` out are ignored).
        target: ``cpu`` or ``gpu``.
        cpu: Cores per replica; default the spec's ``cpu_cores``.
        gpus: GPUs per replica (gpu target); default one more than the highest index used.
        memory_mib: Memory per replica; default the computed need (a smaller value is an error).
        built_weights: Model -> bytes of its built files (the artifact record, from the build
            manifest); without it, weights are read from the files the spec names.

    Raises:
        ResourceError: a model's instances need more cores or GPUs than given, or the memory
            given is below the need; the message names the model, the field and the numbers.
    """
    spec = spec.for_target(target)  # only what the builder writes for this target runs
    cores = spec.cpu_cores if cpu is None else cpu
    lines: list[tuple[str, int]] = [("tritonserver", SERVER_BASE_MIB[target])]
    shm = 0
    used_gpus: set[int] = set()
    for m in (*spec.models, *spec.python_models):
        is_model = isinstance(m, ModelSpec)
        if target == "cpu":
            group = m.instances.cpu
            need = group.count * group.intra_op_threads
            if need > cores:
                raise ResourceError(
                    f"{spec.path}: model {m.name!r}: instances.cpu count {group.count} x "
                    f"intra_op_threads {group.intra_op_threads} = {need} cores, more than the "
                    f"{cores} cores of a replica (--cpu / cpu_cores)"
                )
            count, python_backend = group.count, True  # ONNX runs in a Python-backend runner
        else:
            group = m.instances.gpu
            count, python_backend = group.count, group.kind == "cpu"
            if group.kind == "gpu":
                used_gpus.update(group.gpus or (0,))
        per = STUB_MIB if python_backend else 0
        if is_model:
            per += 2 * weights_mib(m, built_weights, spec.root) + ACTIVATION_MIB
        lines.append((f"{m.name} x{count}", per * count))
        if python_backend:
            shm += count * shm_region_mib(m)
    gpu_count = 0
    if target == "gpu":
        gpu_count = max(used_gpus) + 1 if used_gpus else 0
        if gpus is not None:
            beyond = sorted(i for i in used_gpus if i >= gpus)
            if beyond:
                users = [
                    m.name for m in spec.models
                    if m.instances.gpu.kind == "gpu" and set(m.instances.gpu.gpus or (0,)) & set(beyond)
                ]
                raise ResourceError(
                    f"{spec.path}: models {users}: instances.gpu.gpus use GPU {beyond}, but a "
                    f"replica gets {gpus} GPU(s) (--gpus): indices must be below {gpus}"
                )
            gpu_count = gpus
    # Twice the worst case: requests in flight while a region grows.
    shm_mib = _round_up(max(2 * shm, SHM_MIN_MIB), 64)
    lines.append(("/dev/shm (memory emptyDir)", shm_mib))
    need = _round_up(sum(mib for _, mib in lines), ROUND_MIB)
    if memory_mib is not None and memory_mib < need:
        detail = ", ".join(f"{name} {mib}" for name, mib in lines)
        raise ResourceError(
            f"{spec.path}: --memory {memory_mib} MiB is below what the instances need, "
            f"{need} MiB ({detail})"
        )
    return PodResources(
        cpu=cores, memory_mib=memory_mib or need, shm_mib=shm_mib, gpus=gpu_count,
        breakdown=tuple(lines),
    )
