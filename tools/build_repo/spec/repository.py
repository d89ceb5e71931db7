"""The whole spec: its sections, the rules between entries, and the lookups the builders use."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field, TypeAdapter, ValidationInfo, model_validator
from pydantic.json_schema import SkipJsonSchema

from tools.build_repo.spec.entries import Entry, ModelSpec, PipelineSpec, PythonModelSpec
from tools.build_repo.spec.values import EntryName, Target
from tools import paths
from tools.errors import SpecError
from tools.typed_yaml import Omittable, PositiveInt, Rules, fail, strict

# The sections of the file, and what their entries are called in messages.
SECTIONS = {"models": "model", "python_models": "python model", "pipelines": "pipeline"}


def _fits_the_cores(entry: ModelSpec | PythonModelSpec, info: ValidationInfo) -> Any:
    """Instances × threads of one entry against ``cpu_cores`` (validated before the entries)."""
    cores = info.data.get("cpu_cores")  # absent when cpu_cores itself is wrong (and reported)
    cpu = entry.instances.cpu
    if cores is not None and cpu.count * cpu.intra_op_threads > cores:
        pytorch = isinstance(entry, ModelSpec)
        threads = f" x intra_op_threads {cpu.intra_op_threads}" if pytorch else ""
        rules = Rules()
        rules.add(("instances", "cpu"), f"count {cpu.count}{threads} exceeds cpu_cores {cores}: "
                                        "threads would contend for the cores")
        rules.raise_any()
    return entry


@strict
class RepoSpec:
    """repository.yaml: the PyTorch models, Python models and pipelines of a model repository.

    The sections are mappings in the file (``models_by_name``, ...); ``models``,
    ``python_models`` and ``pipelines`` are their entries in file order, each knowing its name.
    """

    path: SkipJsonSchema[Path]  # the file it was read from (set by the loader, not written)
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
    backends_folder: Omittable[str] = Field(
        None,
        alias="backends",
        description="Folder that holds the Python backends. A relative path is resolved against "
        "the spec's folder. Default: the ones installed with triton-forge (`backends/python/` "
        "of a checkout).",
    )
    models_by_name: dict[EntryName, Annotated[ModelSpec, AfterValidator(_fits_the_cores)]] = Field(
        default_factory=dict, alias="models", description="PyTorch models by name."
    )
    python_models_by_name: dict[
        EntryName, Annotated[PythonModelSpec, AfterValidator(_fits_the_cores)]
    ] = Field(default_factory=dict, alias="python_models",
              description="Python-backend models by name.")
    pipelines_by_name: dict[EntryName, PipelineSpec] = Field(
        default_factory=dict, alias="pipelines", description="Ensembles by name."
    )

    @model_validator(mode="after")
    def _unique_names(self) -> RepoSpec:
        names = [*self.models_by_name, *self.python_models_by_name, *self.pipelines_by_name]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise fail("duplicate_name",
                       f"names used by more than one model or pipeline: {duplicates}")
        return self

    @model_validator(mode="after")
    def _unbounded_queues_are_gated(self) -> RepoSpec:
        gated: set[str] = set()
        for entry in self.python_models:
            for params in (entry.parameters, *entry.target_parameters.values()):
                gated.update(m.strip() for m in params.get("admission_models", "").split(","))
        rules = Rules()
        for section, entries in (("models", self.models), ("python_models", self.python_models)):
            for entry in entries:
                name = entry.name
                batching = entry.dynamic_batching
                if batching is not None and batching.queue_policy is None and name not in gated:
                    rules.add((section, name, "dynamic_batching", "default_queue_policy"),
                              "is null (an unbounded queue), but no python model's "
                              "'admission_models' parameter names this model: give it a "
                              "queue policy, or gate the step before it")
        rules.raise_any()
        return self

    @model_validator(mode="after")
    def _pipelines_on_their_models_targets(self) -> RepoSpec:
        rules = Rules()
        for pipeline in self.pipelines:
            name = pipeline.name
            for step in pipeline.steps:
                model = self.models_by_name.get(step.model)
                missing = [t for t in pipeline.targets if model and t not in model.targets]
                if missing:
                    rules.add(("pipelines", name, "targets"),
                              f"includes {missing}, but step model {step.model!r} is built only "
                              f"for {list(model.targets)}: give the pipeline the same targets")
        rules.raise_any()
        return self

    @property
    def models(self) -> tuple[ModelSpec, ...]:
        """The PyTorch models (exported or ONNX files), in file order."""
        return tuple(self.models_by_name.values())

    @property
    def python_models(self) -> tuple[PythonModelSpec, ...]:
        """The Python-backend models, in file order."""
        return tuple(self.python_models_by_name.values())

    @property
    def pipelines(self) -> tuple[PipelineSpec, ...]:
        """The ensembles, in file order."""
        return tuple(self.pipelines_by_name.values())

    @property
    def root(self) -> Path:
        """The folder relative paths in the spec are resolved against."""
        return self.path.parent

    @property
    def backends(self) -> Path:
        """The folder of the Python backends, resolved against the spec's folder."""
        if self.backends_folder is None:
            return paths.BACKENDS
        folder = Path(self.backends_folder)
        return folder if folder.is_absolute() else self.root / folder

    def names(self) -> list[str]:
        """Every model and pipeline name, in spec order."""
        return [e.name for e in (*self.models, *self.python_models, *self.pipelines)]

    def for_target(self, target: str) -> RepoSpec:
        """The spec without the models and pipelines whose ``targets`` leave ``target`` out."""
        return self._replace(
            models={m.name: m for m in self.models if target in m.targets},
            pipelines={p.name: p for p in self.pipelines if target in p.targets},
        )

    def find(self, name: str) -> Entry:
        """The model or pipeline called ``name``."""
        for entry in (*self.models, *self.python_models, *self.pipelines):
            if entry.name == name:
                return entry
        raise SpecError(f"{self.path}: no model or pipeline named {name!r} (have {self.names()})")

    def _replace(self, **changes: Any) -> RepoSpec:
        """A copy with ``changes`` (by the file's keys), validated again."""
        fields = self.__pydantic_fields__  # type: ignore[attr-defined]
        values = {info.alias or name: getattr(self, name) for name, info in fields.items()}
        return RepoSpec(**{**values, **changes})


REPOSITORY_YAML = TypeAdapter(RepoSpec)
