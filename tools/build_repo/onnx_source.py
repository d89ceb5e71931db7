"""An existing ONNX file as a model's source (``onnx:`` in the spec): checked, copied, served.

No export: the graph's inputs and outputs must carry the spec's names and a dynamic batch axis.
Parity runs against the PyTorch reference the entry names (``source``), or is skipped with a note.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tools.build_repo import config as cfg
from tools.build_repo.builder_base import (
    Plan,
    SpecEntryBuilder,
    Stages,
    warmup_record,
    write_onnx_model_files,
)
from tools.build_repo.fingerprints import builder_sources
from tools.files import sha256_file, sha256_tree
from tools.manifest import ModelEntry, fingerprint, module_file, tool_versions
from tools.build_repo.repository import VERSION, backend_source
from tools.build_repo.results import ModelKind, Stage
from tools.build_repo.spec import ModelSpec, RepoSpec, resolve_reference, spec_hash
from tools.errors import ModelSourceError, SpecError, UserInputError


NO_REFERENCE = "no PyTorch reference: the entry names no 'source'"


def onnx_path(spec: RepoSpec, model: ModelSpec) -> Path:
    """The model's ONNX file, resolved against the spec's folder.

    Raises:
        SpecError: the file does not exist.
    """
    path = Path(model.onnx)
    path = path if path.is_absolute() else spec.root / path
    if not path.is_file():
        raise SpecError(f"{spec.path}: model {model.name!r}: field 'onnx': {path} does not exist")
    return path


def check_signature(path: Path, model: ModelSpec) -> None:
    """The graph's inputs and outputs are the spec's: names, ranks, a dynamic batch axis.

    Raises:
        ModelSourceError: the file is not a valid ONNX model, or its graph differs from the spec
            (naming the file, the tensor and the axis).
    """
    import onnx

    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception as exc:  # protobuf decode errors have no common type
        raise ModelSourceError(f"{path}: not an ONNX model: {exc}") from None
    for kind, tensors, values in (("input", model.inputs, graph.input),
                                  ("output", model.outputs, graph.output)):
        by_name = {v.name: v for v in values}
        for t in tensors:
            value = by_name.get(t.name)
            if value is None:
                raise ModelSourceError(
                    f"{path}: model {model.name!r}: the graph has no {kind} {t.name!r} "
                    f"(its {kind}s: {sorted(by_name)})"
                )
            dims = value.type.tensor_type.shape.dim
            if len(dims) != len(t.shape):
                raise ModelSourceError(
                    f"{path}: {kind} {t.name!r} has rank {len(dims)}, the spec says {list(t.shape)}"
                )
            if dims[0].HasField("dim_value") and dims[0].dim_value > 0:
                raise ModelSourceError(
                    f"{path}: {kind} {t.name!r} has a fixed batch axis ({dims[0].dim_value}); Triton "
                    "batches requests, so axis 0 must be dynamic (export with dynamic_axes "
                    "{0: 'batch'})"
                )


class OnnxBuilder(SpecEntryBuilder):
    """A model served from an existing ONNX file: check, copy, [reference parity], write."""

    kind = ModelKind.ONNX

    def plan(self, previous: ModelEntry | None) -> Plan:
        """The key of this model: the file's hash, its spec entry, config and backend files."""

        if self.target == "gpu" and self.model.gpu.backend == "tensorrt":
            raise UserInputError(
                f"{self.where}an 'onnx' model is served by ONNX Runtime: set gpu.backend to "
                "'onnxruntime' (TensorRT plans are built for exported models only)"
            )
        modules = {}
        for ref in sorted({self.model.source, self.model.sample_inputs} - {None}):
            path = module_file(ref)
            if path is None:
                raise SpecError(f"{self.where}field 'source': cannot find the module of {ref!r}")
            modules[ref] = sha256_file(path)
        backend = None
        if self.target == "cpu":
            root = self.spec.backends
            backend = {
                "model.py": sha256_file(backend_source(root, cfg.ONNX_RUNNER_BACKEND, self.owner)),
                "pipeline_ops": sha256_tree(root / "pipeline_ops"),
            }
        inputs: dict[str, Any] = {
            "spec": spec_hash(self.model, self.target),
            "config": self.text,
            "onnx": sha256_file(onnx_path(self.spec, self.model)),
            "modules": modules,
            "tools": tool_versions(),
            "builder": fingerprint(builder_sources()),
            "backend": backend,
        }
        return Plan(inputs, fingerprint(inputs))

    def reusable_export(self, model_dir: Path, previous: ModelEntry | None, plan: Plan) -> None:
        """Nothing is exported, so there is nothing to reuse: the file is copied again."""
        return None

    def build(self, model_dir: Path, output: Path, stages: Stages, entry: ModelEntry) -> None:
        """Check and copy the file, check parity against the reference if one is named, write."""
        model, source = self.model, onnx_path(self.spec, self.model)
        version_dir = model_dir / VERSION
        version_dir.mkdir()
        target_file = version_dir / cfg.ONNX_FILE
        stages.run(Stage.CHECK, check_signature, source, model)
        stages.run(Stage.COPY, shutil.copy2, source, target_file)
        sample_fn = None
        if model.source:
            sample_fn = self._parity(target_file, stages, entry)
        else:
            stages.skip(Stage.PARITY, NO_REFERENCE)
            stages.result.note = f"parity skipped: {NO_REFERENCE}"
        stages.run(Stage.WRITE, self._write_files, model_dir, sample_fn)
        entry.opset = None
        entry.warmup = warmup_record(model)
        entry.source = {"onnx": str(source), "sha256": sha256_file(source),
                        "reference": model.source or None,
                        "parity": "checked" if model.source else f"skipped: {NO_REFERENCE}"}

    def _parity(self, onnx_file: Path, stages: Stages, entry: ModelEntry):
        from tools.build_repo.parity import check_parity, figures_to_manifest, onnxruntime_runner

        model = self.model
        factory = resolve_reference(model.source, self.where)
        sample_fn = resolve_reference(model.sample_inputs, self.where)
        torch_model = stages.run(Stage.LOAD, factory)
        runner = onnxruntime_runner(str(onnx_file), threads=self.spec.cpu_cores)
        figures = stages.run(Stage.PARITY, check_parity, model, torch_model, sample_fn, runner,
                             runtime="onnxruntime")
        stages.result.parity["onnxruntime"] = figures_to_manifest(figures)
        entry.parity = {"onnxruntime": {"atol": model.atol, "rtol": model.rtol,
                                        "cases": stages.result.parity["onnxruntime"]}}
        return sample_fn

    def _write_files(self, model_dir: Path, sample_fn) -> None:
        write_onnx_model_files(self, model_dir, sample_fn)
