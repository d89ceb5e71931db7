"""One builder per kind of spec entry: what it depends on, how it is built, how it is repackaged.

The orchestrator (``pipeline.py``) decides skip / repackage / build; a builder only writes one
model folder into staging and fills that model's ``ModelEntry``.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any

from tools import cpu_isa
from tools.build_repo import config as cfg
from tools.build_repo.fingerprints import (
    ensemble_inputs,
    export_inputs,
    python_files,
    python_inputs,
    pytorch_inputs,
    quality_files,
)
from tools.build_repo.builder_base import (
    Plan,
    SpecEntryBuilder,
    Stages,
    warmup_record,
    write_onnx_model_files,
)
from tools.build_repo.model_source import (
    model_callables,
    recipe_folder,
    recipe_weights,
    references,
    write_python_recipe_files,
)
from tools.build_repo.onnx_source import OnnxBuilder
from tools.build_repo.repository import VERSION, copy_python_backend
from tools.build_repo.results import ModelKind, Stage, StageStatus
from tools.build_repo.spec import Entry, RepoSpec, resolve_file
from tools.errors import SpecError
from tools.manifest import ModelEntry, fingerprint, matching_artifacts
from tools.models.hf_folder import TOKEN_CLASSIFIER

# The stages a repackage carries over from the build it reuses.
EXPORT_STAGES = (Stage.LOAD, Stage.EXPORT, Stage.PARITY, Stage.PARITY_ENTITIES, Stage.ONNX2TRT,
                 Stage.PARITY_TRT)


def _link_or_copy(source: Path, destination: Path) -> None:
    """Hard-link ``source`` (staging is beside the repository), copying where links fail.

    Nothing writes a carried-over file in place: commit renames folders, and the previous
    folder's name is dropped, so the new folder ends up the file's only name.
    """
    destination.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def _write_config(model_dir: Path, text: str) -> None:
    (model_dir / "config.pbtxt").write_text(text)


def _parity_figures(entry: ModelEntry) -> dict[str, list[dict[str, Any]]]:
    return {rt: p.get("cases", []) for rt, p in (entry.parity or {}).items()}


class PytorchBuilder(SpecEntryBuilder):
    """A PyTorch model: load, export to ONNX, parity, [gpu] TensorRT plan and its parity."""

    kind = ModelKind.PYTORCH

    @property
    def _tensorrt(self) -> bool:
        return self.target == "gpu" and self.model.gpu.backend == "tensorrt"

    def plan(self, previous: ModelEntry | None) -> Plan:
        """The full and export keys of this model."""
        inputs, stats = pytorch_inputs(self.spec, self.model, self.target, self.text, previous)
        if self.model.recipe is not None:  # the recipe's folder files (model_source.py)
            inputs["weights"], stats = recipe_weights(self.spec.root, self.model, previous)
        device = None
        if self._tensorrt:
            from tools.build_repo.onnx2trt import device_record

            device = device_record()
        quality = quality_files(self.spec, self.model) if self.target == "cpu" else None
        export = export_inputs(self.model, self.target, inputs["modules"], inputs["weights"], device,
                               quality)
        inputs["device"] = device
        inputs["quality"] = quality
        return Plan(inputs, fingerprint(inputs), fingerprint(export), stats)

    # --- reuse -------------------------------------------------------------------------------

    def _exported_files(self, previous: ModelEntry) -> list[str]:
        """The artifacts of the previous build that a repackage carries over (relative paths)."""
        names = [cfg.ONNX_FILE]
        cpu = self.model.cpu
        if self.target == "cpu" and cpu.runtime == "openvino" and cpu.optimize == "int8":
            return [f"{VERSION}/{n}" for n in (cfg.ONNX_FILE, f"{cfg.ONNX_FILE}.reproduce.sh",
                                               cfg.OV_INT8_FILE, f"{cfg.OV_INT8_FILE}.reproduce.sh",
                                               cfg.OV_INT8_BIN)]
        if self.target == "cpu" and self.model.cpu.optimize != "none":
            names.append(cfg.FUSED_FILE)
            if self.model.cpu.optimize == "int8":
                names.append(cfg.INT8_FILE)
        if self._tensorrt:
            if previous.tensorrt is None:
                return []  # the plan was not built last time (no GPU): nothing complete to reuse
            names.append(cfg.PLAN_FILE)
        return [f"{VERSION}/{n}{suffix}" for n in names for suffix in ("", ".reproduce.sh")]

    def reusable_export(self, model_dir: Path, previous: ModelEntry | None, plan: Plan) -> list[str] | None:
        """The previous artifacts to carry over, or None when the export must be redone."""
        if previous is None:
            return None
        export = previous.export or {}
        if (
            export.get("fingerprint") != plan.export_fingerprint
            or not export.get("built_at")
            or previous.kind != self.kind
            or previous.target != self.target
            or previous.parity is None
        ):
            return None
        files = self._exported_files(previous)
        if not files or not matching_artifacts(model_dir, previous.artifacts, files):
            return None
        return files

    # --- building ----------------------------------------------------------------------------

    def build(self, model_dir: Path, output: Path, stages: Stages, entry: ModelEntry) -> None:
        """Export, check and write the model folder."""
        from tools.build_repo import onnx2trt
        from tools.build_repo.parity import (
            check_parity,
            figures_to_manifest,
            onnxruntime_runner,
            unchecked_note,
            unchecked_record,
        )
        from tools.build_repo.torch2onnx import export_onnx, trace_sample, write_reproduce_script

        spec, model, target = self.spec, self.model, self.target
        version_dir = model_dir / VERSION
        version_dir.mkdir()
        factory, sample_fn = model_callables(spec.root, model, self.where)
        torch_model = stages.run(Stage.LOAD, factory)
        onnx_path = version_dir / cfg.ONNX_FILE
        stages.run(Stage.EXPORT, lambda: export_onnx(torch_model, trace_sample(model, sample_fn), model, onnx_path))
        write_reproduce_script(onnx_path, spec.path, output, model.name, target)
        runner = onnxruntime_runner(str(onnx_path), threads=spec.cpu_cores)
        figures = stages.run(
            Stage.PARITY, check_parity, model, torch_model, sample_fn, runner, runtime="onnxruntime"
        )
        result = stages.result
        result.parity["onnxruntime"] = figures_to_manifest(figures)
        entry.parity = {"onnxruntime": {"atol": model.atol, "rtol": model.rtol,
                                        "cases": result.parity["onnxruntime"]}}
        if unchecked_record(model):  # a long model: shapes over the size bound (every runtime)
            entry.parity["onnxruntime"]["not_checked"] = unchecked_record(model)
        if model.recipe is not None and model.recipe.kind == TOKEN_CLASSIFIER:
            self._entity_parity(torch_model, runner, stages, entry)
        if target == "cpu" and model.cpu.runtime == "openvino":
            self._openvino(onnx_path, runner, output, stages, entry, torch_model, sample_fn)
        elif target == "cpu" and model.cpu.optimize != "none":
            self._optimize(onnx_path, runner, output, stages, entry, torch_model, sample_fn)

        if self._tensorrt:
            plan_path = version_dir / cfg.PLAN_FILE
            cache_dir = spec.root / ".cache" / "tensorrt"
            outcome = stages.run(Stage.ONNX2TRT, onnx2trt.build_plan, model, onnx_path, plan_path, cache_dir)
            if outcome.status == StageStatus.SKIPPED:
                stages.skip(Stage.ONNX2TRT, outcome.reason)
                result.note = f"onnx2trt skipped: {outcome.reason}"
            else:
                write_reproduce_script(
                    plan_path, spec.path, output, model.name, target,
                    note=f"TensorRT {outcome.info.tensorrt_version}, compute capability "
                         f"{outcome.info.compute_capability}, {outcome.precision}",
                )
                atol, rtol = onnx2trt.parity_tolerance(model, outcome.precision)
                plan_figures = stages.run(
                    Stage.PARITY_TRT, check_parity, model, torch_model, sample_fn,
                    onnx2trt.plan_runner(plan_path), runtime=f"tensorrt {outcome.precision}",
                    atol=atol, rtol=rtol,
                )
                result.parity["tensorrt"] = figures_to_manifest(plan_figures)
                entry.parity["tensorrt"] = {"atol": atol, "rtol": rtol,
                                            "cases": result.parity["tensorrt"]}
                entry.tensorrt = outcome.manifest_record()

        result.note = "; ".join(n for n in (result.note, unchecked_note(model)) if n)
        stages.run(Stage.WRITE, self._write_files, model_dir, sample_fn)
        self._describe(entry)

    def _entity_parity(self, torch_model: Any, runner: Any, stages: Stages,
                       entry: ModelEntry) -> None:
        """A token classifier: the served steps' entities against transformers' pipeline, on
        the exported graph (``entity_parity.py``), every aggregation strategy."""
        from tools.build_repo import entity_parity

        model = self.model
        folder = recipe_folder(self.spec.root, model)
        axis = next(d for d in model.inputs[0].shape[1:] if isinstance(d, str))
        figures, left_out = stages.run(
            Stage.PARITY_ENTITIES, entity_parity.check_entities, model.name, folder.path,
            torch_model.classifier, folder.fast_tokenizer(), runner, folder.labels(),
            model.axis(axis).max, self.spec.backends, model.atol)
        cases = entity_parity.figures_to_manifest(figures)
        stages.result.parity["entities"] = cases
        entry.parity["entities"] = {"atol": model.atol, "cases": cases}
        if left_out:
            entry.parity["entities"]["not_compared"] = left_out
            stages.result.note = "; ".join(n for n in (
                stages.result.note, f"entity parity: {len(left_out)} text(s) over "
                f"{model.axis(axis).max} tokens not compared (the tokenizer has no "
                "model_max_length: transformers would not truncate them)") if n)

    def _optimize(self, onnx_path: Path, fp32_runner: Any, output: Path, stages: Stages,
                  entry: ModelEntry, torch_model: Any, sample_fn: Any) -> None:
        """cpu target: fuse (parity against PyTorch), then int8 (the quality gate).

        ``fp32_runner`` is the exported graph's session of the parity stage, the gate's reference.
        """
        from tools.build_repo import onnx2fused, onnx2int8, quality
        from tools.build_repo.parity import check_parity, figures_to_manifest, onnxruntime_runner
        from tools.build_repo.torch2onnx import write_reproduce_script

        spec, model = self.spec, self.model
        fused_path = onnx_path.with_name(cfg.FUSED_FILE)
        fusion = stages.run(Stage.FUSE, onnx2fused.fuse_onnx, onnx_path, fused_path, model)
        write_reproduce_script(fused_path, spec.path, output, model.name, self.target,
                               note=f"ONNX Runtime {model.cpu.fusion} fusion of {cfg.ONNX_FILE}")
        figures = stages.run(
            Stage.PARITY_FUSED, check_parity, model, torch_model, sample_fn,
            onnxruntime_runner(str(fused_path), threads=spec.cpu_cores), runtime="onnxruntime fused",
        )
        stages.result.parity["onnxruntime_fused"] = figures_to_manifest(figures)
        entry.parity["onnxruntime_fused"] = {"atol": model.atol, "rtol": model.rtol,
                                             "cases": stages.result.parity["onnxruntime_fused"]}
        record: dict[str, Any] = {"level": model.cpu.optimize, "fused": fusion.to_dict()}
        if model.cpu.optimize == "int8":
            int8_path = onnx_path.with_name(cfg.INT8_FILE)
            weights_bits = cpu_isa.this_cpu_int8_weights_bits()
            quantized = stages.run(Stage.QUANTIZE, onnx2int8.quantize_onnx, fused_path, int8_path,
                                   model, weights_bits)
            write_reproduce_script(int8_path, spec.path, output, model.name, self.target,
                                   note=f"dynamic per-channel int8 of {cfg.FUSED_FILE} "
                                        f"({weights_bits}-bit weights)")
            gate = model.cpu.quality
            quality_set, _ = quality.load_gate_set(gate, spec.root, self.where)
            report = quality.run_gate(stages, model, gate, quality_set, fp32_runner,
                                      onnxruntime_runner(str(int8_path), threads=spec.cpu_cores))
            record["quantize"] = {**quantized.to_dict(), "weights_bits": weights_bits}
            record["quality"] = report.to_dict()
            stages.result.note = quality.summary_note(report)
        entry.optimization = record

    def _openvino(self, onnx_path: Path, fp32_runner: Any, output: Path, stages: Stages,
                  entry: ModelEntry, torch_model: Any, sample_fn: Any) -> None:
        """cpu target, ``runtime: openvino``: fp32 is checked for parity against PyTorch; bf16,
        and int8 (NNCF's static quantization first), on the quality set against the exported
        graph under ONNX Runtime (``fp32_runner``)."""
        from tools.build_repo import onnx2ov_int8, quality, quality_sets
        from tools.build_repo.parity import check_parity, figures_to_manifest, openvino_runner
        from tools.build_repo.torch2onnx import write_reproduce_script

        spec, model = self.spec, self.model
        precision = model.cpu.precision
        served = onnx_path
        record: dict[str, Any] = {"level": model.cpu.optimize, "runtime": "openvino",
                                  "precision": precision}
        gate = model.cpu.quality
        if model.cpu.gated_variant is not None:  # read once: calibration and the gate use them
            quality_set, tokenizer_file = quality.load_gate_set(gate, spec.root, self.where)
        if model.cpu.optimize == "int8":
            calibration = quality_sets.calibration_set(
                quality_sets.read_texts(resolve_file(model.cpu.calibration_texts, spec.root,
                                                     f"{self.where}field 'cpu.calibration_texts': ")),
                quality_set, tokenizer_file, gate.max_length, model.cpu.calibrate_on_tune)
            served = onnx_path.with_name(cfg.OV_INT8_FILE)
            weights_bits = cpu_isa.this_cpu_int8_weights_bits()
            quantized = stages.run(Stage.QUANTIZE, onnx2ov_int8.quantize_openvino, onnx_path, served,
                                   model, calibration, quality_set, weights_bits)
            write_reproduce_script(served, spec.path, output, model.name, self.target,
                                   note=f"NNCF static int8 of {cfg.ONNX_FILE} (OpenVINO IR, weights "
                                        f"in {cfg.OV_INT8_BIN}), calibrated on "
                                        f"{len(calibration.texts)} texts")
            record["quantize"] = {**quantized.to_dict(), "calibration_texts": len(calibration.texts),
                                  "left_out_as_held_out": calibration.left_out,
                                  "tune_texts_added": calibration.tune_added,
                                  "smooth_quant_alpha": model.cpu.smooth_quant_alpha,
                                  "weights_bits": weights_bits}
        candidate, runs_as = stages.run(Stage.OPENVINO, openvino_runner, str(served),
                                        spec.cpu_cores, precision, spec.backends)
        record["runs_as"] = runs_as
        if model.cpu.gated_variant is None:
            figures = stages.run(Stage.PARITY_OPENVINO, check_parity, model, torch_model, sample_fn,
                                 candidate, runtime="openvino fp32")
            stages.result.parity["openvino"] = figures_to_manifest(figures)
            entry.parity["openvino"] = {"atol": model.atol, "rtol": model.rtol,
                                        "cases": stages.result.parity["openvino"]}
        else:
            report = quality.run_gate(stages, model, gate, quality_set, fp32_runner, candidate,
                                      runs_as)
            record["quality"] = report.to_dict()
            stages.result.note = quality.summary_note(report)
            if runs_as != precision:
                stages.result.note += (f"; this CPU runs OpenVINO {precision} as {runs_as}, so the "
                                       f"gate measured {runs_as}: build on the serving CPU")
        entry.optimization = record

    def _describe(self, entry: ModelEntry) -> None:
        model = self.model
        entry.opset = model.opset
        entry.warmup = warmup_record(model)
        factory, sample_inputs = references(model)
        entry.source = {"factory": factory, "sample_inputs": sample_inputs,
                        "weights": model.weights}

    def _write_files(self, model_dir: Path, sample_fn=None, warmup: bool = True) -> None:
        """config.pbtxt, warmup files and (cpu target) the onnx_runner backend.

        ``warmup=False``: the warmup files were carried over (this skips importing the sample
        module, and with it torch).
        """
        if self.model.warmup is not None and warmup:
            sample_fn = sample_fn or model_callables(self.spec.root, self.model, self.where)[1]
        write_onnx_model_files(self, model_dir, sample_fn if warmup else None)

    def repackage(
        self, model_dir: Path, previous_dir: Path, files: list[str], previous: ModelEntry,
        stages: Stages, entry: ModelEntry,
    ) -> None:
        """Stage the model around its previous export: no export, no parity, no onnx2trt."""
        built_at = previous.export["built_at"]
        artifacts = previous.artifacts
        # Warmup files come from the sample-input module (in the export fingerprint) and the
        # warmup spec: when that is unchanged too, they are carried over rather than regenerated.
        warmup = sorted(k for k in artifacts if k.startswith("warmup/"))
        keep_warmup = (
            self.model.warmup is not None
            and bool(warmup)
            and previous.warmup == warmup_record(self.model)
            and matching_artifacts(previous_dir, artifacts, warmup)
        )
        carried = files + (warmup if keep_warmup else [])

        def carry() -> None:
            for relative in carried:
                _link_or_copy(previous_dir / relative, model_dir / relative)

        stages.run(Stage.REUSE, carry)
        for stage in EXPORT_STAGES:
            if stage in previous.stages:
                stages.reuse(stage, built_at)
        stages.run(Stage.WRITE, self._write_files, model_dir, warmup=not keep_warmup)
        entry.carried_over = carried
        entry.parity = previous.parity
        entry.parity_carried_over_from = built_at
        entry.tensorrt = previous.tensorrt
        entry.optimization = previous.optimization
        entry.export = {**previous.export, "reused": True}
        self._describe(entry)
        stages.result.parity = _parity_figures(previous)
        stages.result.note = f"export reused; parity carried over from the build at {built_at}"


class PythonBuilder(SpecEntryBuilder):
    """A Python-backend model: config, model.py, pipeline_ops and its data files, warmup."""

    kind = ModelKind.PYTHON
    label = "python model"

    def plan(self, previous: ModelEntry | None) -> Plan:
        """The key of this model."""
        inputs = python_inputs(self.spec, self.model, self.target, self.text)
        return Plan(inputs, fingerprint(inputs))

    def reusable_export(self, model_dir: Path, previous: ModelEntry | None, plan: Plan) -> None:
        """Python models have no export to reuse."""
        return None

    def build(self, model_dir: Path, output: Path, stages: Stages, entry: ModelEntry) -> None:
        """Write the model folder."""
        model, owner = self.model, self.owner
        files = python_files(self.spec, model)

        def write() -> None:
            _write_config(model_dir, self.text)
            copy_python_backend(self.spec.backends, model.backend, model_dir / VERSION, files, owner)
            write_python_recipe_files(self.spec.root, model, model_dir / VERSION)
            if model.warmup:
                warm = model_dir / "warmup"
                warm.mkdir()
                dims = {t.name: t.dims for t in model.inputs}
                for w in model.warmup:
                    for name, texts in w.inputs.items():
                        if any(d < 0 for d in dims[name]):
                            raise SpecError(f"{owner}: field 'warmup': input {name!r} has variable dims")
                        count = w.batch_size * math.prod(dims[name])
                        (warm / cfg.warmup_file_name(name, w.batch_size)).write_bytes(
                            cfg.python_warmup_bytes(texts, count)
                        )

        stages.run(Stage.WRITE, write)
        entry.backend = model.backend


class EnsembleBuilder(SpecEntryBuilder):
    """A pipeline: the ensemble config and its (empty) version folder."""

    kind = ModelKind.ENSEMBLE
    label = "pipeline"

    def plan(self, previous: ModelEntry | None) -> Plan:
        """The key of this pipeline."""
        inputs = ensemble_inputs(self.model, self.target, self.text)
        return Plan(inputs, fingerprint(inputs))

    def reusable_export(self, model_dir: Path, previous: ModelEntry | None, plan: Plan) -> None:
        """Ensembles have no export to reuse."""
        return None

    def build(self, model_dir: Path, output: Path, stages: Stages, entry: ModelEntry) -> None:
        """Write the ensemble folder."""
        def write() -> None:
            _write_config(model_dir, self.text)
            (model_dir / VERSION).mkdir()  # Triton wants a version folder, even an empty one

        stages.run(Stage.WRITE, write)


Builder = PytorchBuilder | OnnxBuilder | PythonBuilder | EnsembleBuilder
_BUILDERS: dict[ModelKind, type[Builder]] = {
    ModelKind.PYTORCH: PytorchBuilder,
    ModelKind.ONNX: OnnxBuilder,
    ModelKind.PYTHON: PythonBuilder,
    ModelKind.ENSEMBLE: EnsembleBuilder,
}


def builder_for(spec: RepoSpec, entry: Entry, target: str, config_text: str) -> Builder:
    """The builder of one spec entry, chosen by its kind."""
    return _BUILDERS[entry.kind](spec, entry, target, config_text)
