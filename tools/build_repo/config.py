"""config.pbtxt from typed objects through Triton's own ``ModelConfig`` protobuf, and back.

Dataclasses -> dict -> ``json_format.ParseDict`` -> ``text_format.MessageToString``: a field
ModelConfig does not have fails here, at build time, as a ``ConfigError`` naming the field.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from tools.build_repo.spec import (
    DynamicBatchingSpec,
    ModelSpec,
    PythonModelSpec,
    TensorSpec,
)
from tools.errors import ConfigError

ModelConfig = model_config_pb2.ModelConfig

ONNX_FILE = "model.onnx"
PLAN_FILE = "model.plan"
FUSED_FILE = "model.fused.onnx"
INT8_FILE = "model.int8.onnx"
OV_INT8_FILE = "model.int8.xml"  # OpenVINO IR, its weights beside it:
OV_INT8_BIN = "model.int8.bin"
# The graph the cpu target's runner serves, by the model's cpu.optimize.
SERVED_ONNX = {"none": ONNX_FILE, "fused": FUSED_FILE, "int8": INT8_FILE}


def served_file(model: ModelSpec) -> str:
    """The file the cpu target's ``onnx_runner`` opens (OpenVINO int8 is IR, not ONNX)."""
    if model.cpu.runtime == "openvino" and model.cpu.optimize == "int8":
        return OV_INT8_FILE
    return SERVED_ONNX[model.cpu.optimize]
ONNX_RUNNER_BACKEND = "onnx_runner"  # backends/python/onnx_runner serves ONNX on the cpu target


@dataclass(frozen=True)
class TensorConfig:
    """One ``input``/``output`` entry (dims exclude the batch axis)."""

    name: str
    data_type: str
    dims: tuple[int, ...]
    allow_ragged_batch: bool = False

    def to_dict(self, *, is_input: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "data_type": self.data_type, "dims": list(self.dims)}
        if is_input and self.allow_ragged_batch:
            out["allow_ragged_batch"] = True
        return out


@dataclass(frozen=True)
class WarmupInput:
    """Warmup data for one input: a file under ``<model>/warmup/`` or zeros."""

    data_type: str
    dims: tuple[int, ...]
    input_data_file: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"data_type": self.data_type, "dims": list(self.dims)}
        if self.input_data_file:
            out["input_data_file"] = self.input_data_file
        else:
            out["zero_data"] = True
        return out


@dataclass(frozen=True)
class Warmup:
    """One ``model_warmup`` entry."""

    name: str
    batch_size: int
    inputs: tuple[tuple[str, WarmupInput], ...]
    count: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "batch_size": self.batch_size,
            "count": self.count,
            "inputs": {name: w.to_dict() for name, w in self.inputs},
        }


@dataclass(frozen=True)
class InstanceGroup:
    """One ``instance_group`` entry."""

    kind: str  # KIND_CPU | KIND_GPU
    count: int
    gpus: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "count": self.count}
        if self.gpus:
            out["gpus"] = list(self.gpus)
        return out


@dataclass(frozen=True)
class TritonModelConfig:
    """The typed model configuration; ``to_message`` checks it against Triton's protobuf."""

    name: str
    max_batch_size: int
    inputs: tuple[TensorConfig, ...]
    outputs: tuple[TensorConfig, ...]
    backend: str | None = None
    platform: str | None = None
    default_model_filename: str | None = None
    dynamic_batching: DynamicBatchingSpec | None = None
    instance_groups: tuple[InstanceGroup, ...] = ()
    parameters: tuple[tuple[str, str], ...] = ()
    warmups: tuple[Warmup, ...] = ()
    version_latest: int = 1
    ensemble_steps: tuple[dict[str, Any], ...] = ()
    optimization: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # raw ModelConfig fields, checked too

    def to_dict(self) -> dict[str, Any]:
        """The ModelConfig as a JSON-style dict (protobuf field names)."""
        out: dict[str, Any] = {"name": self.name}
        if self.platform:
            out["platform"] = self.platform
        if self.backend:
            out["backend"] = self.backend
        if self.default_model_filename:
            out["default_model_filename"] = self.default_model_filename
        out["max_batch_size"] = self.max_batch_size
        out["version_policy"] = {"latest": {"num_versions": self.version_latest}}
        out["input"] = [t.to_dict(is_input=True) for t in self.inputs]
        out["output"] = [t.to_dict(is_input=False) for t in self.outputs]
        if self.dynamic_batching is not None:
            db = self.dynamic_batching
            batching: dict[str, Any] = {
                "max_queue_delay_microseconds": db.max_queue_delay_microseconds,
            }
            if db.queue_policy is not None:
                batching["default_queue_policy"] = {
                    "timeout_action": db.queue_policy.timeout_action,
                    "default_timeout_microseconds": db.queue_policy.default_timeout_microseconds,
                    "max_queue_size": db.queue_policy.max_queue_size,
                }
            if db.preferred_batch_size:
                batching["preferred_batch_size"] = list(db.preferred_batch_size)
            out["dynamic_batching"] = batching
        if self.instance_groups:
            out["instance_group"] = [g.to_dict() for g in self.instance_groups]
        if self.parameters:
            out["parameters"] = {k: {"string_value": v} for k, v in self.parameters}
        if self.warmups:
            out["model_warmup"] = [w.to_dict() for w in self.warmups]
        if self.ensemble_steps:
            out["ensemble_scheduling"] = {"step": list(self.ensemble_steps)}
        if self.optimization:
            out["optimization"] = self.optimization
        out.update(self.extra)
        return out

    def to_message(self) -> model_config_pb2.ModelConfig:
        """Parse into Triton's ModelConfig protobuf (fails on any field it does not have)."""
        return config_message(self.to_dict(), self.name)


def config_message(data: dict[str, Any], model: str) -> model_config_pb2.ModelConfig:
    """Load a JSON-style dict into ``ModelConfig``.

    Raises:
        ConfigError: naming the model and the field ModelConfig does not have (or the bad value).
    """
    message = model_config_pb2.ModelConfig()
    try:
        json_format.ParseDict(data, message)
    except json_format.ParseError as exc:
        raise ConfigError(f"model {model!r}: invalid config.pbtxt field: {exc}") from exc
    return message


def render(message: model_config_pb2.ModelConfig) -> str:
    """The text of ``config.pbtxt``."""
    text = text_format.MessageToString(message)
    if "max_batch_size" not in text:
        # proto3 drops zero defaults; Triton wants max_batch_size written explicitly.
        text = text.replace("\n", f"\nmax_batch_size: {message.max_batch_size}\n", 1)
    return text


def parse_config(text: str, path: Path | str = "config.pbtxt") -> model_config_pb2.ModelConfig:
    """Parse ``config.pbtxt`` text into ``ModelConfig`` (compare messages, not text).

    Raises:
        ConfigError: the text is not a valid ModelConfig (the file is named).
    """
    message = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        raise ConfigError(f"{path}: not a valid ModelConfig: {exc}") from exc
    return message


# --------------------------------------------------------------------------- per model


def _tensor_configs(tensors: tuple[TensorSpec, ...], *, ragged: bool) -> tuple[TensorConfig, ...]:
    return tuple(
        TensorConfig(t.name, t.triton_dtype, t.dims, allow_ragged_batch=ragged and t.is_ragged)
        for t in tensors
    )


def warmup_file_name(input_name: str, batch_size: int) -> str:
    """File under ``<model>/warmup/`` holding one warmup input (Triton's raw binary format)."""
    return f"{input_name}_batch{batch_size}.bin"


def _model_warmups(model: ModelSpec) -> tuple[Warmup, ...]:
    if model.warmup is None:
        return ()
    axes = model.warmup_lengths
    warmups = []
    for batch in model.warmup.batch_sizes:
        inputs = tuple(
            (
                t.name,
                WarmupInput(
                    t.triton_dtype,
                    tuple(axes[d] if isinstance(d, str) else d for d in t.shape[1:]),
                    warmup_file_name(t.name, batch),
                ),
            )
            for t in model.inputs
        )
        warmups.append(Warmup(f"batch_{batch}", batch, inputs, model.warmup.count))
    return tuple(warmups)


def _gpu_target_instances(gpu) -> InstanceGroup:
    """The gpu target's instance group: ``KIND_GPU`` on the listed GPUs, or ``KIND_CPU``."""
    if gpu.kind == "cpu":
        return InstanceGroup("KIND_CPU", gpu.count)
    return InstanceGroup("KIND_GPU", gpu.count, gpu.gpus)


def _graph_parameters(model: ModelSpec) -> tuple[tuple[str, str], ...]:
    """What the graph applies that no runner reads, declared for its callers: a recipe's
    ``activation`` (a cross-encoder's sigmoid or identity), which the API gateway needs to give
    raw scores (``tools/api``)."""
    activation = model.recipe.activation if model.recipe is not None else None
    return (("activation", activation),) if activation else ()


def model_config(model: ModelSpec, target: str) -> TritonModelConfig:
    """The config of a PyTorch model for ``target`` (cpu: Python ONNX runner; gpu: native)."""
    common = dict(
        name=model.name,
        max_batch_size=model.max_batch_size,
        outputs=_tensor_configs(model.outputs, ragged=False),
        dynamic_batching=model.dynamic_batching,
        warmups=_model_warmups(model),
        version_latest=model.version_policy_latest,
    )
    if target == "cpu":
        cpu = model.instances.cpu
        pad_values = {t.name: (t.pad_value if t.pad_value is not None else 0) for t in model.inputs}
        # The runner rejects a request beyond an axis' max (e.g. MiniLM's 512 positions would
        # otherwise fail ONNX Runtime for the whole execute call); fixed dims repeat their size.
        max_dims = {
            t.name: [model.axis(d).max if isinstance(d, str) else d for d in t.shape[1:]]
            for t in model.inputs
            if t.is_ragged
        }
        return TritonModelConfig(
            backend="python",
            # The runner pads each execute call's requests to the longest, so merge lengths.
            inputs=_tensor_configs(model.inputs, ragged=True),
            instance_groups=(InstanceGroup("KIND_CPU", cpu.count),),
            parameters=(
                ("onnx_file", served_file(model)),
                ("intra_op_threads", str(cpu.intra_op_threads)),
                ("inter_op_threads", "1"),
                ("pad_values", json.dumps(pad_values, sort_keys=True)),
                ("max_dims", json.dumps(max_dims, sort_keys=True)),
                # only where it is not ONNX Runtime fp32, so those configs stay as they were
                *((("runtime", model.cpu.runtime), ("inference_precision", model.cpu.precision))
                  if model.cpu.runtime != "onnxruntime" else ()),
                *_graph_parameters(model),
            ),
            **common,
        )
    groups = (_gpu_target_instances(model.instances.gpu),)
    # TensorRT and the ORT backend take [batch, sequence] as given: no ragged inputs on gpu.
    inputs = _tensor_configs(model.inputs, ragged=False)
    if model.gpu.backend == "tensorrt":
        return TritonModelConfig(
            platform="tensorrt_plan", default_model_filename=PLAN_FILE, inputs=inputs,
            instance_groups=groups, parameters=_graph_parameters(model), **common,
        )
    optimization = None
    if model.gpu.onnxruntime_tensorrt_accelerator:
        from tools.build_repo.onnx2trt import ort_tensorrt_parameters

        optimization = {
            "execution_accelerators": {
                "gpu_execution_accelerator": [
                    {"name": "tensorrt", "parameters": ort_tensorrt_parameters(model)}
                ]
            }
        }
    return TritonModelConfig(
        backend="onnxruntime", default_model_filename=ONNX_FILE, inputs=inputs,
        instance_groups=groups, optimization=optimization, parameters=_graph_parameters(model),
        **common,
    )


def python_warmup_bytes(texts: tuple[str, ...], count: int) -> bytes:
    """Triton's raw encoding of ``count`` strings: 4-byte little-endian length, then bytes."""
    out = bytearray()
    for i in range(count):
        data = texts[i % len(texts)].encode()
        out += struct.pack("<I", len(data)) + data
    return bytes(out)


def python_model_config(model: PythonModelSpec, target: str) -> TritonModelConfig:
    """The config of a Python-backend model (identical on both targets but the instance kind)."""
    if target == "cpu" or model.instances.gpu.kind == "cpu":
        count = model.instances.cpu.count if target == "cpu" else model.instances.gpu.count
        groups = (InstanceGroup("KIND_CPU", count),)
    else:
        groups = (_gpu_target_instances(model.instances.gpu),)
    warmups = []
    for w in model.warmup:
        dims_of = {t.name: t.dims for t in model.inputs}
        warmups.append(
            Warmup(
                f"batch_{w.batch_size}",
                w.batch_size,
                tuple(
                    (t.name, WarmupInput("TYPE_STRING", dims_of[t.name],
                                         warmup_file_name(t.name, w.batch_size)))
                    for t in model.inputs
                ),
                w.count,
            )
        )
    return TritonModelConfig(
        name=model.name,
        backend="python",
        max_batch_size=model.max_batch_size,
        # Python models get each request's own tensors, so inputs of varying length may batch
        inputs=_tensor_configs(model.inputs, ragged=True),
        outputs=_tensor_configs(model.outputs, ragged=False),
        dynamic_batching=model.dynamic_batching,
        instance_groups=groups,
        parameters=model.parameters_for(target),
        warmups=tuple(warmups),
        version_latest=model.version_policy_latest,
    )


# Triton 2.51's dynamic batcher (core src/dynamic_batch_scheduler.cc, WaitForPayloadSlotAvailable)
# waits up to 500 ms for a free instance and is woken only by a *successful* enqueue: a lone
# instance that finishes while the queue is full (every new request refused) sits idle for the
# rest of those 500 ms. Measured (toy model, 50 ms batches): 1 instance at 3x overload kept
# 0.36-0.46 of capacity; with 2 instances the other's completion wakes the batcher (0.68-1.0).
LONE_INSTANCE_STALL_MS = 500


def queue_stall_advisories(configs: dict[str, TritonModelConfig], names: list[str]) -> list[str]:
    """Notes for models among ``names`` whose bounded queue can stall a single instance.

    Args:
        configs: The rendered configs by model name.
        names: The models to look at (the compute stages: exported or ONNX models).
    """
    notes = []
    for name in names:
        config = configs[name]
        batching = config.dynamic_batching
        instances = sum(g.count for g in config.instance_groups)
        if batching is not None and batching.queue_policy is not None and instances == 1:
            notes.append(
                f"{name}: one instance with max_queue_size {batching.queue_policy.max_queue_size}; "
                f"under overload Triton's batcher can leave a lone instance idle for up to "
                f"{LONE_INSTANCE_STALL_MS} ms when the queue is full (docs/reliability.md). "
                "Use `instances: {cpu: {count: 2, intra_op_threads: 1}}` (or count >= 2 on gpu)."
            )
    return notes
