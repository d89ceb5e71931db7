"""The repository spec (``repository.yaml``): one strict pydantic model the builders read.

``values`` (dtypes, shapes, tensors), ``settings`` (what an entry holds), ``entries`` (models,
Python models, pipelines), ``repository`` (the whole file), ``loading`` (reading a file, errors
with line and column), ``references`` (imports and data files the spec names).
"""

from tools.build_repo.spec.entries import Entry, ModelSpec, PipelineSpec, PythonModelSpec, spec_hash
from tools.build_repo.spec.loading import load_spec, parse_spec, parse_spec_text, problem_line
from tools.build_repo.spec.references import resolve_file, resolve_reference
from tools.build_repo.spec.repository import REPOSITORY_YAML, SECTIONS, RepoSpec
from tools.build_repo.spec.settings import (
    RECIPE_KINDS,
    AxisSpec,
    CpuSpec,
    DynamicBatchingSpec,
    GpuSpec,
    PythonRecipeSpec,
    QualitySetSpec,
    QualityWaiverSpec,
    QueuePolicySpec,
    RecipeSpec,
    StepSpec,
    WarmupSpec,
)
from tools.build_repo.spec.values import (
    BATCH_AXIS,
    DTYPES,
    TARGETS,
    PaddedTensorSpec,
    TensorSpec,
)

__all__ = [
    "BATCH_AXIS", "DTYPES", "RECIPE_KINDS", "REPOSITORY_YAML", "SECTIONS", "TARGETS", "AxisSpec",
    "CpuSpec", "DynamicBatchingSpec", "Entry", "GpuSpec", "ModelSpec", "PaddedTensorSpec",
    "PipelineSpec", "PythonModelSpec", "PythonRecipeSpec", "QualitySetSpec", "QualityWaiverSpec", "QueuePolicySpec", "RecipeSpec",
    "RepoSpec", "StepSpec", "TensorSpec", "WarmupSpec", "load_spec", "parse_spec",
    "parse_spec_text", "problem_line", "resolve_file", "resolve_reference", "spec_hash",
]
