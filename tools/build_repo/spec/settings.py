"""The settings inside a spec entry: batching, instances, the gpu and cpu targets, axes,
tolerances, warmup, recipes and ensemble steps.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from tools.build_repo.quality_sets import check_family

from tools.typed_yaml import (
    Identifier,
    NonNegativeFloat,
    NonNegativeInt,
    Omittable,
    PositiveInt,
    Reference,
    Rules,
    fail,
    null_allowed,
    strict,
)

@strict
class QueuePolicySpec:
    """``default_queue_policy``: a bounded queue whose requests time out and are rejected."""

    max_queue_size: NonNegativeInt = Field(
        64, description="`default_queue_policy { max_queue_size }`; 0: no bound on the length, "
        "only the timeout."
    )
    default_timeout_microseconds: PositiveInt = Field(
        1_000_000, description="`default_queue_policy { default_timeout_microseconds }`, "
        "rendered at most the model's P99 objective from the SLO file (a request that waited "
        "that long has missed it)."
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
        "(with a policy it waits for the next request to arrive). The queue length is then bound "
        "by a pipeline step's queue gate (`admission_models`), which must name the model, and "
        "the front's admission caps its direct calls by its P99 objective. On the gpu target a "
        "model with a P99 objective in the SLO file also gets a queue policy with that "
        "timeout.",
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
        "in every family (unless `waivers` lowers it for one), in batches and alone; and so must "
        "every sequence length between the set's shortest and longest text, run alone.",
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
        "quantization-sensitive MatMuls, found by quantizing one node at a time).",
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
        "quality set's tune part (held-out texts kept apart).",
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


# Default parity lengths stop here (plus the axis max, when the case is affordable: parity.py).
PARITY_LENGTH_CAP = 512


@strict
class AxisSpec:
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
        "`{opt, min(max, 512), max}`. There must be at least two distinct lengths, so without "
        "this key `opt` must differ from `max`. Parity runs every parity batch × every "
        "combination of lengths within a bounded size (see \"Parity shapes\" in docs/spec.md): "
        "the build table and the manifest say which cases ran and which were not checked.",
    )

    @property
    def lengths(self) -> tuple[int, ...]:
        """The parity lengths: ``parity``, or ``{opt, min(max, 512), max}``."""
        if self.parity is not None:
            return self.parity
        return tuple(sorted({self.opt, min(self.max, PARITY_LENGTH_CAP), self.max}))

    @model_validator(mode="after")
    def _ordered(self) -> AxisSpec:
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
class ToleranceSpec:
    """Parity tolerances of ONNX (and of an fp32 plan) against PyTorch."""

    atol: NonNegativeFloat = Field(
        1e-4, description="Each element must satisfy `|got − ref| ≤ atol + rtol·|ref|`."
    )
    rtol: NonNegativeFloat = Field(1e-3, description="See `tolerance.atol`.")


@strict
class VersionPolicySpec:
    """Which versions Triton serves."""

    latest: PositiveInt = Field(1, description="`version_policy { latest { num_versions } }`.")


@strict
class WarmupSpec:
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


RECIPE_KINDS = ("hf-text-embedding", "hf-sequence-classification", "hf-cross-encoder",
                "hf-token-classification", "image-classification")
# What a cross-encoder's graph applies to its logits (sentence-transformers' CrossEncoder
# activation_fn: Sigmoid for one label, Identity otherwise, unless its config names one).
CROSS_ENCODER_ACTIVATIONS = ("sigmoid", "identity")


@strict
class RecipeSpec:
    """``recipe``: the model is built from a Hugging Face folder or a vision factory."""

    kind: Literal[RECIPE_KINDS] = Field(  # type: ignore[valid-type]
        description="`hf-text-embedding` (encoder + pooling + optional L2 normalisation → "
        "`embedding`), `hf-sequence-classification` (→ `logits`), `hf-cross-encoder` (a "
        "`*ForSequenceClassification` model scoring text pairs: `input_ids`, `attention_mask` "
        "and, when the model takes them, `token_type_ids` → `score`, `activation` applied in the "
        "graph), `hf-token-classification` (a `*ForTokenClassification` model → per-token "
        "`logits` `[batch, sequence, labels]`; after the ONNX parity, the build checks the "
        "entities of the served steps against transformers' token-classification pipeline for "
        "every aggregation strategy) or `image-classification` (`factory`'s model: "
        "`pixel_values` → `logits`)."
    )
    path: Omittable[str] = Field(
        None,
        description="The `hf-*` kinds: the local Hugging Face folder (`config.json`, weights). A "
        "relative path is resolved against the spec's folder. Its `config.json`, weight files "
        "and tokenizer files are hashed into the build key.",
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
        "taking `pixel_values` float32 `[batch, 3, H, W]` and returning logits (or an output "
        "with `.logits`, as transformers' image classifiers return).",
    )
    activation: Omittable[Literal[CROSS_ENCODER_ACTIVATIONS]] = Field(  # type: ignore[valid-type]
        None,
        description="`hf-cross-encoder` (required there, refused elsewhere): `sigmoid` or "
        "`identity` on the logits, inside the graph. `tools add` writes what "
        "sentence-transformers' `CrossEncoder` applies for the folder.",
    )

    @model_validator(mode="after")
    def _complete(self) -> RecipeSpec:
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
        pairs = self.kind == "hf-cross-encoder"
        if pairs and self.activation is None:
            rules.add(("activation",), f"is required for kind {self.kind!r} (one of "
                                       f"{list(CROSS_ENCODER_ACTIVATIONS)})")
        if not pairs and self.activation is not None:
            rules.add(("activation",), f"is not accepted for kind {self.kind!r}")
        rules.raise_any()
        return self


# What a Python model's recipe writes into its version folder.
PYTHON_RECIPE_FILES = {"hf-tokenizer": "tokenizer.json"}


@strict
class PythonRecipeSpec:
    """``recipe`` of a Python model: data files made at build time from a Hugging Face folder."""

    kind: Literal[tuple(PYTHON_RECIPE_FILES)] = Field(  # type: ignore[valid-type]
        description="`hf-tokenizer`: the folder's tokenizer written as `tokenizer.json` in the "
        "version folder, converted by transformers' fast tokenizer (`AutoTokenizer`) from the "
        "files it reads (`vocab.txt`, `tokenizer_config.json` with `do_lower_case` and the like, "
        "`special_tokens_map.json`). `tools add` writes it for a folder without `tokenizer.json`; "
        "the user's folder is never written."
    )
    path: str = Field(
        description="The Hugging Face folder; a relative path is resolved against the spec's "
        "folder. Its tokenizer files and the transformers/tokenizers versions are hashed into "
        "the build key."
    )


@strict
class PythonWarmupSpec:
    """One warmup request of a Python model, written in Triton's raw string format."""

    inputs: dict[Annotated[str, Field(title="input")], tuple[str, ...]] = Field(
        description="Texts per input. Every input must be listed here. Warmup only supports "
        "`string` inputs with fixed dims (checked at build time). The texts are repeated "
        "cyclically to fill `batch_size × prod(dims)`."
    )
    batch_size: PositiveInt = Field(1, description="`model_warmup { batch_size }`.")
    count: PositiveInt = Field(1, description="`model_warmup { count }`.")


@strict
class StepSpec:
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
