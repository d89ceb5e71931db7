"""What each model's build depends on, hashed: the keys that decide skip, repackage or build.

The full key covers every input of a model folder; a PyTorch model's export key covers only
what model.onnx, model.plan and their parity figures depend on, so packaging edits repackage.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from tools import cpu_isa
from tools.build_repo import config as cfg
from tools.files import sha256_file, sha256_tree
from tools.manifest import ModelEntry, fingerprint, module_file, tool_versions
from tools.build_repo.entity_parity import SERVED_MODULES
from tools.build_repo.repository import backend_source
from tools.build_repo.model_source import python_recipe_inputs, references
from tools.build_repo.spec import (
    ModelSpec,
    PythonModelSpec,
    RepoSpec,
    resolve_file,
    resolve_reference,
    spec_hash,
)
from tools.errors import SpecError
from tools.models.hf_folder import TOKEN_CLASSIFIER

PACKAGE = Path(__file__).resolve().parent
# Modules of this package (paths relative to it) that shape no artifact: the CLI, the display,
# the result types. Every other module (a new one included, in
# a subpackage too) is part of the full key of every model.
NOT_SHAPING = frozenset({"__init__.py", "command.py", "progress.py", "results.py"})
# Modules that shape config.pbtxt, warmup, backend files or the repository layout but not the
# exported graph or its parity: left out of the export key.
PACKAGING_ONLY = frozenset({
    "config.py", "ensemble.py", "repository.py", "fingerprints.py", "pipeline.py", "drift.py",
    "builder_base.py",
})
EXPORT_TOOLS = ("torch", "onnx", "onnxruntime", "tensorrt")
# The fields of a ModelSpec that shape the exported graph or its parity check.
EXPORT_FIELDS = ("name", "source", "sample_inputs", "weights", "inputs", "outputs", "axes",
                 "max_batch_size", "opset", "tolerance", "recipe")
GPU_EXPORT_FIELDS = ("backend", "precision", "workspace_mb", "fp16_atol", "fp16_rtol")


def builder_sources(*, export_only: bool = False) -> dict[str, str]:
    """sha256 of the package's modules that shape artifacts (all of them, or the export's)."""
    skip = NOT_SHAPING | (PACKAGING_ONLY if export_only else frozenset())
    modules = {p.relative_to(PACKAGE).as_posix(): p for p in sorted(PACKAGE.rglob("*.py"))}
    return {name: sha256_file(p) for name, p in modules.items() if name not in skip}


def _file_stat(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def _weights(
    spec: RepoSpec, model: ModelSpec, modules: dict[str, str], previous: ModelEntry | None
) -> tuple[dict[str, str], dict[str, list[int]]]:
    """sha256 of the weight files, and their (size, mtime) for the next run.

    When the model's modules and its ``weights`` reference are unchanged, the files they name
    are the ones recorded last time, so the module (and torch) need not be imported; a file
    whose size and mtime are unchanged keeps its recorded hash. This keeps a no-op rebuild to a
    few seconds.
    """
    if not model.weights:
        return {}, {}
    old_inputs = previous.inputs if previous else {}
    old_stat = previous.weights_stat if previous else {}
    old_source = (previous.source or {}) if previous else {}
    if (
        old_inputs.get("modules") == modules
        and old_inputs.get("weights")
        and old_source.get("weights") == model.weights
    ):
        paths = [Path(p) for p in old_inputs["weights"]]
    else:
        where = f"{spec.path}: model {model.name!r}: field 'weights': "
        paths = [Path(p) for p in resolve_reference(model.weights, where)()]
    hashes, stats = {}, {}
    for path in paths:
        if not path.is_file():
            raise SpecError(f"{spec.path}: model {model.name!r}: weights file {path} is missing")
        stats[str(path)] = _file_stat(path)
        recorded = old_inputs.get("weights", {}).get(str(path))
        same = recorded and old_stat.get(str(path)) == stats[str(path)]
        hashes[str(path)] = recorded if same else sha256_file(path)
    return hashes, stats


def pytorch_inputs(
    spec: RepoSpec, model: ModelSpec, target: str, config_text: str, previous: ModelEntry | None
) -> tuple[dict[str, Any], dict[str, list[int]]]:
    """Everything a PyTorch model's folder depends on, and the weight files' (size, mtime)."""
    where = f"{spec.path}: model {model.name!r}: "
    modules = {}
    for ref in sorted(set(references(model))):
        path = module_file(ref)
        if path is None:
            raise SpecError(f"{where}field 'source': cannot find the module of {ref!r}")
        modules[ref] = sha256_file(path)
    if model.recipe is not None and model.recipe.kind == TOKEN_CLASSIFIER:
        # its entity parity runs the served tokenizer and aggregation (entity_parity.py)
        for name in SERVED_MODULES:
            modules[f"pipeline_ops/{name}"] = sha256_file(spec.backends / "pipeline_ops" / name)
    weights, stats = _weights(spec, model, modules, previous)
    backend = None
    if target == "cpu":
        root = spec.backends
        backend = {
            "model.py": sha256_file(backend_source(root, cfg.ONNX_RUNNER_BACKEND, where.rstrip(": "))),
            "pipeline_ops": sha256_tree(root / "pipeline_ops"),
        }
    inputs = {
        "spec": spec_hash(model, target),
        "config": config_text,
        "modules": modules,
        "weights": weights,
        "tools": tool_versions(),
        "builder": fingerprint(builder_sources()),
        "backend": backend,
    }
    return inputs, stats


def export_inputs(
    model: ModelSpec, target: str, modules: dict[str, str], weights: dict[str, str],
    device: dict[str, Any] | None = None, quality_files: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The part of a PyTorch model's inputs that model.onnx, model.plan and parity depend on.

    Batching, instances, warmup, the rendered config and the Python-backend files are left
    out: changing only those repackages the model around the previous export. ``device`` (gpu
    target) holds the TensorRT version and GPU compute capability a plan would be built for, so
    a new serving image or another GPU rebuilds the plan. ``quality_files`` (cpu target, int8)
    hash the quality set and tokenizer the int8 gate is judged on.
    """
    fields = dataclasses.asdict(model)
    tools = tool_versions()
    return {
        "target": target,
        "model": {k: fields[k] for k in EXPORT_FIELDS},
        "gpu": {k: fields["gpu"][k] for k in GPU_EXPORT_FIELDS} if target == "gpu" else None,
        "cpu": fields["cpu"] if target == "cpu" else None,
        "quality_files": quality_files if target == "cpu" else None,
        "device": device,
        "modules": modules,
        "weights": weights,
        "tools": {k: tools.get(k) for k in EXPORT_TOOLS}
        # what the bf16 gate ran; left out elsewhere so other models keep their fingerprints
        | ({"openvino": tools.get("openvino")}
           if target == "cpu" and model.cpu.runtime == "openvino" else {}),
        # int8 weights are 7-bit on a CPU without VNNI: building on the other kind re-quantizes
        **({"int8_weights_bits": cpu_isa.this_cpu_int8_weights_bits()}
           if target == "cpu" and model.cpu.optimize == "int8" else {}),
        "builder": builder_sources(export_only=True),
    }


def quality_files(spec: RepoSpec, model: ModelSpec) -> dict[str, str] | None:
    """sha256 of the quality gate's texts, own texts and tokenizer (and of the calibration texts
    of an OpenVINO int8 model); None unless the model is gated (``cpu.optimize: int8`` or
    ``cpu.precision: bf16``)."""
    gate = model.cpu.quality
    if model.cpu.gated_variant is None or gate is None:
        return None
    where = f"{spec.path}: model {model.name!r}: field 'cpu.quality': "
    files = {name: sha256_file(resolve_file(location, spec.root, where))
             for name, location in (("texts", gate.texts), ("tokenizer", gate.tokenizer),
                                    ("own_texts", gate.own_texts)) if location is not None}
    if model.cpu.calibration_texts is not None:
        files["calibration_texts"] = sha256_file(resolve_file(
            model.cpu.calibration_texts, spec.root,
            f"{spec.path}: model {model.name!r}: field 'cpu.calibration_texts': "))
    return files


def python_files(spec: RepoSpec, model: PythonModelSpec) -> dict[str, Path]:
    """The data files a Python model ships (name in the version folder -> source path)."""
    where = f"{spec.path}: python model {model.name!r}: field 'files': "
    return {name: resolve_file(location, spec.root, where) for name, location in model.files.items()}


def python_inputs(spec: RepoSpec, model: PythonModelSpec, target: str, config_text: str) -> dict[str, Any]:
    """Everything a Python model's folder depends on."""
    root = spec.backends
    owner = f"{spec.path}: python model {model.name!r}"
    return {
        "spec": spec_hash(model, target),
        "config": config_text,
        "model.py": sha256_file(backend_source(root, model.backend, owner)),
        "pipeline_ops": sha256_tree(root / "pipeline_ops"),
        "files": {k: sha256_file(v) for k, v in python_files(spec, model).items()},
        "builder": fingerprint(builder_sources()),
    } | ({"recipe": python_recipe_inputs(spec.root, model)} if model.recipe is not None else {})


def ensemble_inputs(pipeline: Any, target: str, config_text: str) -> dict[str, Any]:
    """An ensemble folder depends on its spec entry and rendered config only."""
    return {"spec": spec_hash(pipeline, target), "config": config_text}
