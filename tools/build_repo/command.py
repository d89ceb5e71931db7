"""`tools build-repo`: spec -> ONNX (-> TensorRT) -> parity -> config.pbtxt -> model repository.

Incremental: a model whose fingerprint is unchanged is skipped; a PyTorch model whose export
fingerprint (what model.onnx/model.plan and parity depend on) is unchanged is repackaged: its
hash-checked previous artifacts are carried over and only config/warmup/backend files rewritten.

``build_repository`` is the API (tests, the server fixtures); ``build_repo`` the click command.
``check_repository`` compares committed config.pbtxt files with what the spec renders (drift).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click

from tools.build_repo import config as cfg
from tools.build_repo.ensemble import render_all
from tools.build_repo.manifest import (
    MANIFEST_NAME,
    artifacts_of,
    artifacts_present,
    fingerprint,
    load_manifest,
    manifest_text,
    matching_artifacts,
    module_file,
    sha256_file,
    sha256_tree,
    tool_versions,
    write_atomically,
)
from tools.build_repo.progress import BuildProgress
from tools.build_repo.repository import (
    VERSION,
    Staging,
    backend_source,
    copy_python_backend,
    locked,
    recover_interrupted,
)
from tools.build_repo.spec import (
    TARGETS,
    ModelSpec,
    PythonModelSpec,
    RepoSpec,
    load_spec,
    resolve_file,
    resolve_reference,
    spec_hash,
)
from tools.errors import (
    BuildError,
    ConfigError,
    SpecError,
    ToolkitError,
    UserInputError,
)

_BUILDER_FILES = ("torch2onnx.py", "parity.py", "onnx2trt.py", "config.py", "repository.py")
# What model.onnx / model.plan and their parity figures depend on (spec.py: parity_batches).
_EXPORT_BUILDER_FILES = ("torch2onnx.py", "parity.py", "onnx2trt.py", "spec.py")
_EXPORT_TOOLS = ("torch", "onnx", "onnxruntime", "tensorrt")
# The fields of a ModelSpec that shape the exported graph or its parity check.
_EXPORT_FIELDS = ("name", "source", "sample_inputs", "weights", "inputs", "outputs", "axes",
                  "max_batch_size", "opset", "atol", "rtol")
_GPU_EXPORT_FIELDS = ("backend", "precision", "workspace_mb", "fp16_atol", "fp16_rtol")


@dataclass
class ModelResult:
    """One model's or pipeline's outcome."""

    name: str
    kind: str  # pytorch | python | ensemble
    status: str = "pending"  # built | repackaged (export reused) | skipped | failed
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    parity: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    note: str = ""

    @property
    def parity_max_abs(self) -> dict[str, float]:
        """Worst max abs error per runtime."""
        return {rt: max(f["max_abs"] for f in figs) for rt, figs in self.parity.items() if figs}


@dataclass
class BuildResult:
    """Everything ``build_repository`` did."""

    output: Path
    target: str
    models: list[ModelResult]
    seconds: float
    manifest: Path

    def __getitem__(self, name: str) -> ModelResult:
        return next(m for m in self.models if m.name == name)

    @property
    def ok(self) -> bool:
        """No model failed."""
        return all(m.status != "failed" for m in self.models)


class _Stages:
    """Times the stages of one model and feeds the progress display."""

    def __init__(self, result: ModelResult, progress: BuildProgress) -> None:
        self.result, self.progress = result, progress
        self.record: dict[str, dict[str, Any]] = {}

    def run(self, stage: str, fn, *args, **kwargs):
        done = [f"{k} {v:.1f}s" for k, v in self.result.timings.items()]
        self.progress.stage(self.result.name, stage, done)
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds = time.perf_counter() - start
            self.result.timings[stage] = round(seconds, 3)
            self.record[stage] = {"status": "done", "seconds": round(seconds, 3)}

    def skip(self, stage: str, reason: str) -> None:
        self.record[stage] = {"status": "skipped", "reason": reason}


# --------------------------------------------------------------------------- fingerprints


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _hash_files(paths: list[Path]) -> dict[str, str]:
    return {str(p): sha256_file(p) for p in paths}


def _builder_hash() -> str:
    here = Path(__file__).parent
    return fingerprint({name: sha256_file(here / name) for name in _BUILDER_FILES})


def _file_stat(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def _weights(
    spec: RepoSpec, model: ModelSpec, modules: dict[str, str], previous: dict[str, Any]
) -> tuple[dict[str, str], dict[str, list[int]]]:
    """sha256 of the weight files, and their (size, mtime) for the next run.

    When the model's modules and its ``weights`` reference are unchanged, the files they name
    are the ones recorded last time, so the module (and torch) need not be imported; a file
    whose size and mtime are unchanged keeps its recorded hash. This keeps a no-op rebuild to a
    few seconds.
    """
    if not model.weights:
        return {}, {}
    old_inputs = previous.get("inputs", {})
    old_stat = previous.get("weights_stat", {})
    if (
        old_inputs.get("modules") == modules
        and old_inputs.get("weights")
        and previous.get("source", {}).get("weights") == model.weights
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


def _pytorch_inputs(
    spec: RepoSpec, model: ModelSpec, target: str, text: str, previous: dict[str, Any]
) -> dict[str, Any]:
    where = f"{spec.path}: model {model.name!r}: "
    modules = {}
    for ref in sorted({model.source, model.sample_inputs}):
        path = module_file(ref)
        if path is None:
            raise SpecError(f"{where}field 'source': cannot find the module of {ref!r}")
        modules[ref] = sha256_file(path)
    weights, stats = _weights(spec, model, modules, previous)
    backend = None
    if target == "cpu":
        root = spec.backends
        backend = {
            "model.py": sha256_file(backend_source(root, cfg.ONNX_RUNNER_BACKEND, where.rstrip(": "))),
            "pipeline_ops": sha256_tree(root / "pipeline_ops"),
        }
    return {
        "spec": spec_hash(model, target),
        "config": text,
        "modules": modules,
        "weights": weights,
        "weights_stat": stats,
        "tools": tool_versions(),
        "builder": _builder_hash(),
        "backend": backend,
    }


def _export_inputs(
    model: ModelSpec, target: str, modules: dict[str, str], weights: dict[str, str]
) -> dict[str, Any]:
    """The part of a PyTorch model's inputs that model.onnx, model.plan and parity depend on.

    Batching, instances, warmup, the rendered config and the Python-backend files are left
    out: changing only those repackages the model around the previous export.
    """
    fields = dataclasses.asdict(model)
    here = Path(__file__).parent
    tools = tool_versions()
    return {
        "target": target,
        "model": {k: fields[k] for k in _EXPORT_FIELDS},
        "gpu": {k: fields["gpu"][k] for k in _GPU_EXPORT_FIELDS} if target == "gpu" else None,
        "modules": modules,
        "weights": weights,
        "tools": {k: tools.get(k) for k in _EXPORT_TOOLS},
        "builder": {name: sha256_file(here / name) for name in _EXPORT_BUILDER_FILES},
    }


def _exported_files(model: ModelSpec, target: str, previous: dict[str, Any]) -> list[str]:
    """The artifacts of the previous build that a repackage carries over (relative paths)."""
    names = [cfg.ONNX_FILE]
    if target == "gpu" and model.gpu.backend == "tensorrt":
        if "tensorrt" not in previous:
            return []  # the plan was not built last time (no GPU): nothing complete to reuse
        names.append(cfg.PLAN_FILE)
    return [f"{VERSION}/{n}{suffix}" for n in names for suffix in ("", ".reproduce.sh")]


def _reusable_export(
    model: ModelSpec, target: str, model_dir: Path, previous: dict[str, Any], export_print: str
) -> list[str] | None:
    """The previous artifacts to carry over, or None when the export must be redone."""
    export = previous.get("export") or {}
    if (
        export.get("fingerprint") != export_print
        or not export.get("built_at")
        or previous.get("kind") != "pytorch"
        or previous.get("target") != target
        or "parity" not in previous
    ):
        return None
    files = _exported_files(model, target, previous)
    if not files or not matching_artifacts(model_dir, previous.get("artifacts", {}), files):
        return None
    return files


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


def _python_files(spec: RepoSpec, model: PythonModelSpec) -> dict[str, Path]:
    where = f"{spec.path}: python model {model.name!r}: field 'files': "
    return {name: resolve_file(location, spec.root, where) for name, location in model.files}


def _python_inputs(spec: RepoSpec, model: PythonModelSpec, target: str, text: str) -> dict[str, Any]:
    root = spec.backends
    owner = f"{spec.path}: python model {model.name!r}"
    return {
        "spec": spec_hash(model, target),
        "config": text,
        "model.py": sha256_file(backend_source(root, model.backend, owner)),
        "pipeline_ops": sha256_tree(root / "pipeline_ops"),
        "files": {k: sha256_file(v) for k, v in _python_files(spec, model).items()},
    }


# --------------------------------------------------------------------------- builders


def _write_config(model_dir: Path, text: str) -> None:
    (model_dir / "config.pbtxt").write_text(text)


def _build_pytorch(
    spec: RepoSpec, model: ModelSpec, target: str, model_dir: Path, output: Path,
    stages: _Stages, entry: dict[str, Any], text: str,
) -> None:
    from tools.build_repo import onnx2trt
    from tools.build_repo.parity import check_parity, figures_to_manifest, onnxruntime_runner
    from tools.build_repo.torch2onnx import export_onnx, write_reproduce_script

    where = f"{spec.path}: model {model.name!r}: "
    version_dir = model_dir / VERSION
    version_dir.mkdir()
    factory = resolve_reference(model.source, where)
    sample_fn = resolve_reference(model.sample_inputs, where)
    torch_model = stages.run("load", factory)
    onnx_path = version_dir / cfg.ONNX_FILE
    trace_axes = {a.name: a.opt for a in model.axes}
    trace_batch = min(2, model.max_batch_size)
    stages.run("export", lambda: export_onnx(torch_model, sample_fn(trace_batch, trace_axes), model, onnx_path))
    write_reproduce_script(onnx_path, spec.path, output, model.name, target)
    runner = onnxruntime_runner(str(onnx_path), threads=spec.cpu_cores)
    figures = stages.run(
        "parity", check_parity, model, torch_model, sample_fn, runner, runtime="onnxruntime"
    )
    result = stages.result
    result.parity["onnxruntime"] = figures_to_manifest(figures)
    entry["parity"] = {"onnxruntime": {"atol": model.atol, "rtol": model.rtol,
                                       "cases": result.parity["onnxruntime"]}}

    if target == "gpu" and model.gpu.backend == "tensorrt":
        plan_path = version_dir / cfg.PLAN_FILE
        cache = spec.root / ".cache" / "tensorrt" / "timing.cache"
        outcome = stages.run("onnx2trt", onnx2trt.build_plan, model, onnx_path, plan_path, cache)
        if outcome.status == "skipped":
            stages.skip("onnx2trt", outcome.reason)
            result.note = f"onnx2trt skipped: {outcome.reason}"
            result.timings.pop("onnx2trt", None)
        else:
            write_reproduce_script(
                plan_path, spec.path, output, model.name, target,
                note=f"TensorRT {outcome.info.tensorrt_version}, compute capability "
                     f"{outcome.info.compute_capability}, {outcome.precision}",
            )
            atol, rtol = onnx2trt.parity_tolerance(model, outcome.precision)
            plan_figures = stages.run(
                "parity_trt", check_parity, model, torch_model, sample_fn,
                onnx2trt.plan_runner(plan_path), runtime=f"tensorrt {outcome.precision}",
                atol=atol, rtol=rtol,
            )
            result.parity["tensorrt"] = figures_to_manifest(plan_figures)
            entry["parity"]["tensorrt"] = {"atol": atol, "rtol": rtol,
                                           "cases": result.parity["tensorrt"]}
            entry["tensorrt"] = outcome.manifest_entry()

    stages.run("write", _write_pytorch_files, spec, model, target, model_dir, text, sample_fn)
    entry["opset"] = model.opset
    entry["warmup"] = _warmup_record(model)
    entry["source"] = {"factory": model.source, "sample_inputs": model.sample_inputs,
                       "weights": model.weights}


def _warmup_record(model: ModelSpec) -> dict[str, Any] | None:
    """What a PyTorch model's warmup files depend on besides its sample-input module.

    In its manifest (JSON) form, so that it compares equal to the recorded one.
    """
    return json.loads(json.dumps(dataclasses.asdict(model.warmup))) if model.warmup else None


def _write_pytorch_files(
    spec: RepoSpec, model: ModelSpec, target: str, model_dir: Path, text: str, sample_fn=None,
    warmup: bool = True,
) -> None:
    """config.pbtxt, warmup files and (cpu target) the onnx_runner backend of a PyTorch model.

    ``warmup=False``: the warmup files were carried over (this skips importing the sample
    module, and with it torch).
    """
    import numpy as np

    where = f"{spec.path}: model {model.name!r}: "
    _write_config(model_dir, text)
    if model.warmup is not None and warmup:
        sample_fn = sample_fn or resolve_reference(model.sample_inputs, where)
        warm = model_dir / "warmup"
        warm.mkdir()
        for batch in model.warmup.batch_sizes:
            sample = sample_fn(batch, dict(model.warmup.axes))
            for t in model.inputs:
                data = np.ascontiguousarray(sample[t.name].numpy().astype(t.numpy_dtype))
                (warm / cfg.warmup_file_name(t.name, batch)).write_bytes(data.tobytes())
    if target == "cpu":
        copy_python_backend(
            spec.backends, cfg.ONNX_RUNNER_BACKEND, model_dir / VERSION, {}, where.rstrip(": ")
        )


def _repackage_pytorch(
    spec: RepoSpec, model: ModelSpec, target: str, model_dir: Path, previous_dir: Path,
    files: list[str], previous: dict[str, Any], stages: _Stages, entry: dict[str, Any], text: str,
) -> str:
    """Stage a PyTorch model around its previous export: no export, no parity, no onnx2trt.

    Returns:
        When the reused export (and its parity figures) was built.
    """
    built_at = previous["export"]["built_at"]
    artifacts = previous.get("artifacts", {})
    # Warmup files come from the sample-input module (in the export fingerprint) and the
    # warmup spec: when that is unchanged too, they are carried over rather than regenerated.
    warmup = sorted(k for k in artifacts if k.startswith("warmup/"))
    keep_warmup = (
        model.warmup is not None
        and bool(warmup)
        and previous.get("warmup") == _warmup_record(model)
        and matching_artifacts(previous_dir, artifacts, warmup)
    )
    carried = files + (warmup if keep_warmup else [])

    def carry() -> None:
        for relative in carried:
            _link_or_copy(previous_dir / relative, model_dir / relative)

    stages.run("reuse", carry)
    for stage in ("load", "export", "parity", "onnx2trt", "parity_trt"):
        if stage in previous.get("stages", {}):
            stages.record[stage] = {"status": "reused", "from": built_at}
    stages.run("write", _write_pytorch_files, spec, model, target, model_dir, text,
               warmup=not keep_warmup)
    entry["carried_over"] = carried
    entry["parity"] = previous["parity"]
    entry["parity_carried_over_from"] = built_at
    entry["warmup"] = _warmup_record(model)
    if "tensorrt" in previous:
        entry["tensorrt"] = previous["tensorrt"]
    entry["opset"] = model.opset
    entry["source"] = {"factory": model.source, "sample_inputs": model.sample_inputs,
                       "weights": model.weights}
    result = stages.result
    result.parity = {rt: p.get("cases", []) for rt, p in previous["parity"].items()}
    result.note = f"export reused; parity carried over from the build at {built_at}"
    return built_at


def _build_python(
    spec: RepoSpec, model: PythonModelSpec, target: str, model_dir: Path, stages: _Stages,
    text: str,
) -> None:
    files = _python_files(spec, model)
    owner = f"{spec.path}: python model {model.name!r}"

    def write() -> None:
        _write_config(model_dir, text)
        copy_python_backend(spec.backends, model.backend, model_dir / VERSION, files, owner)
        if model.warmup:
            warm = model_dir / "warmup"
            warm.mkdir()
            dims = {t.name: t.dims for t in model.inputs}
            for w in model.warmup:
                for name, texts in w.inputs:
                    if any(d < 0 for d in dims[name]):
                        raise SpecError(f"{owner}: field 'warmup': input {name!r} has variable dims")
                    count = w.batch_size * math.prod(dims[name])
                    (warm / cfg.warmup_file_name(name, w.batch_size)).write_bytes(
                        cfg.python_warmup_bytes(texts, count)
                    )

    stages.run("write", write)


def _build_ensemble(model_dir: Path, stages: _Stages, text: str) -> None:
    def write() -> None:
        _write_config(model_dir, text)
        (model_dir / VERSION).mkdir()  # Triton wants a version folder, even an empty one

    stages.run("write", write)


# --------------------------------------------------------------------------- API


def build_repository(
    spec_path: Path,
    output: Path,
    target: str | None = None,
    only: list[str] | None = None,
    force: bool = False,
    progress: bool = True,
) -> BuildResult:
    """Build the model repository described by the spec.

    Args:
        spec_path: ``repository.yaml``.
        output: the model repository folder (created if missing).
        target: ``cpu`` or ``gpu``; ``None`` takes the spec's ``target``.
        only: build just these models/pipelines (others are left as they are).
        force: rebuild even when nothing changed.
        progress: draw the live progress display (the summary is printed regardless).

    Returns:
        ``BuildResult`` with each model's status, timings and parity figures: ``skipped``
        (nothing changed), ``repackaged`` (a PyTorch model whose export inputs are unchanged:
        config, warmup and backend files rewritten around the previous hash-checked model.onnx /
        model.plan, parity carried over) or ``built``. ``force`` always builds.

    Raises:
        ToolkitError: the spec, a config, an ensemble, an export, parity or TensorRT failed. The
            repository is then unchanged; the error carries ``build_result`` (with the failed
            model) as an attribute.
    """
    started = time.perf_counter()
    spec = load_spec(Path(spec_path))
    target = target or spec.target
    if target not in TARGETS:
        raise UserInputError(f"--target must be one of {list(TARGETS)}, got {target!r}")
    output = Path(output).resolve()
    configs = render_all(spec, target)  # ensembles are checked here, before anything is built
    texts = {name: cfg.render(c.to_message()) for name, c in configs.items()}
    names = spec.names()
    for name in only or []:
        if name not in names:
            raise UserInputError(f"--only {name}: not in {spec.path} (have {names})")
    selected = [n for n in names if not only or n in only]

    with locked(output):
        restored = recover_interrupted(output)
        build = _Build(spec, target, output, texts, force, BuildProgress(enabled=progress))
        for name in restored:
            build.reporter.console.print(f"restored {name} from an interrupted build")
        return build.run(selected, started)


class _Build:
    """One run of ``build_repository``: decides, builds into staging, commits or aborts."""

    def __init__(self, spec: RepoSpec, target: str, output: Path, texts: dict[str, str],
                 force: bool, reporter: BuildProgress) -> None:
        self.spec, self.target, self.output, self.texts = spec, target, output, texts
        self.force, self.reporter = force, reporter
        self.manifest = load_manifest(output)
        self.manifest.update(spec=str(spec.path), target=target)
        self.staging: Staging | None = None

    def run(self, selected: list[str], started: float) -> BuildResult:
        results: list[ModelResult] = []
        error: BaseException | None = None
        try:
            with self.reporter:
                for name in selected:
                    entry_spec = self.spec.find(name)
                    kind = ("pytorch" if isinstance(entry_spec, ModelSpec) else
                            "python" if isinstance(entry_spec, PythonModelSpec) else "ensemble")
                    result = ModelResult(name, kind)
                    results.append(result)
                    if error is not None:
                        result.status, result.note = "skipped", "not built: an earlier model failed"
                        self.reporter.finish_model(name, result.status, result.note)
                        continue
                    error = self._one(entry_spec, result)
                if error is None and self.staging is not None:
                    self.staging.commit(manifest_text(self.manifest))
                    self.staging = None
                elif error is None:
                    text = manifest_text(self.manifest)  # e.g. refreshed weights stat records
                    if text != _read_text(self.output / MANIFEST_NAME):
                        write_atomically(self.output / MANIFEST_NAME, text)
        finally:
            if self.staging is not None:
                self.staging.abort()  # a failure, or an interrupt: the repository is untouched
        build = BuildResult(self.output, self.target, results, time.perf_counter() - started,
                            self.output / MANIFEST_NAME)
        self.reporter.summary(build)
        if error is not None:
            if not isinstance(error, ToolkitError):
                wrapped = BuildError(f"build of {results[-1].name!r} failed: {error!r}")
                wrapped.build_result = build  # type: ignore[attr-defined]
                raise wrapped from error
            error.build_result = build  # type: ignore[attr-defined]
            raise error
        return build

    def _one(self, entry_spec, result: ModelResult) -> Exception | None:
        """Skip or build one model into staging; returns the error instead of raising it."""
        name, kind, spec, target = result.name, result.kind, self.spec, self.target
        started = time.perf_counter()
        self.reporter.start_model(name)
        try:
            previous = self.manifest["models"].get(name, {})
            if kind == "pytorch":
                inputs = _pytorch_inputs(spec, entry_spec, target, self.texts[name], previous)
            elif kind == "python":
                inputs = _python_inputs(spec, entry_spec, target, self.texts[name])
            else:
                inputs = {"spec": spec_hash(entry_spec, target), "config": self.texts[name]}
            stats = inputs.pop("weights_stat", None)
            print_ = fingerprint(inputs)
            export_print = None
            if kind == "pytorch":
                export_print = fingerprint(
                    _export_inputs(entry_spec, target, inputs["modules"], inputs["weights"])
                )
            model_dir = self.output / name
            if (
                not self.force
                and previous.get("fingerprint") == print_
                and (model_dir / VERSION).is_dir()
                and artifacts_present(model_dir, previous.get("artifacts", {}))
            ):
                if stats:
                    previous["weights_stat"] = stats
                result.status, result.note = "skipped", "unchanged"
                result.parity = {rt: p.get("cases", []) for rt, p in previous.get("parity", {}).items()}
                result.seconds = time.perf_counter() - started
                self.reporter.finish_model(name, "skipped", "unchanged")
                return None
            self.staging = self.staging or Staging(self.output)
            stage_dir = self.staging.model_dir(name)
            stages = _Stages(result, self.reporter)
            entry: dict[str, Any] = {"kind": kind, "target": target}
            reuse = None
            if kind == "pytorch" and not self.force:
                reuse = _reusable_export(entry_spec, target, model_dir, previous, export_print)
            now = None
            if reuse is not None:
                _repackage_pytorch(spec, entry_spec, target, stage_dir, model_dir, reuse,
                                   previous, stages, entry, self.texts[name])
                entry["export"] = {**previous["export"], "reused": True}
            elif kind == "pytorch":
                _build_pytorch(spec, entry_spec, target, stage_dir, self.output, stages, entry,
                               self.texts[name])
                now = datetime.now(timezone.utc).isoformat(timespec="seconds")
                entry["export"] = {"fingerprint": export_print, "built_at": now}
            elif kind == "python":
                _build_python(spec, entry_spec, target, stage_dir, stages, self.texts[name])
                entry["backend"] = entry_spec.backend
            else:
                _build_ensemble(stage_dir, stages, self.texts[name])
            entry.update(
                fingerprint=print_,
                spec_hash=inputs["spec"],
                inputs={k: v for k, v in inputs.items() if k != "config"},
                tools=tool_versions(),
                stages=stages.record,
                artifacts=artifacts_of(stage_dir),
                weights_stat=stats or {},
                built_at=now or datetime.now(timezone.utc).isoformat(timespec="seconds"),
            )
            self.manifest["models"][name] = entry
            result.status = "repackaged" if reuse is not None else "built"
            result.seconds = time.perf_counter() - started
            self.reporter.finish_model(name, result.status, f"{result.seconds:.1f}s {result.note}")
            return None
        except Exception as exc:  # noqa: BLE001 - reported in the summary, raised by run()
            result.status = "failed"
            result.seconds = time.perf_counter() - started
            result.note = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            self.reporter.finish_model(name, "failed", result.note)
            return exc


def check_repository(spec_path: Path, output: Path, target: str | None = None) -> list[str]:
    """Compare committed ``config.pbtxt`` files with what the spec renders (no export).

    Returns:
        One unified diff (or message) per drifted model; empty when everything matches.
    """
    spec = load_spec(Path(spec_path))
    target = target or spec.target
    output = Path(output)
    drift = []
    for name, config in render_all(spec, target).items():
        expected = config.to_message()
        path = output / name / "config.pbtxt"
        if not path.is_file():
            drift.append(f"{path}: missing (the spec renders model {name!r})")
            continue
        committed = cfg.parse_config(path.read_text(), path)
        if committed != expected:
            diff = difflib.unified_diff(
                cfg.render(committed).splitlines(), cfg.render(expected).splitlines(),
                f"{path} (committed)", f"{path} (rendered from {spec.path.name})", lineterm="",
            )
            drift.append("\n".join(diff))
    known = set(spec.names())
    if output.is_dir():
        for path in sorted(output.glob("*/config.pbtxt")):
            if path.parent.name not in known and not path.parent.name.startswith("."):
                drift.append(f"{path}: not in the spec {spec.path}")
    return drift


@click.command("build-repo")
@click.option("--spec", "spec_path", type=click.Path(path_type=Path), default=Path("repository.yaml"),
              show_default=True, help="The repository spec.")
@click.option("--output", type=click.Path(path_type=Path), default=Path("model_repository"),
              show_default=True, help="The model repository to write.")
@click.option("--target", type=click.Choice(TARGETS), default=None,
              help="cpu (embedded server) or gpu (NGC image); default: the spec's target.")
@click.option("--only", multiple=True, metavar="NAME", help="Build only this model (repeatable).")
@click.option("--force", is_flag=True, help="Rebuild models even when nothing changed.")
@click.option("--check", is_flag=True,
              help="Only compare committed config.pbtxt files with the spec; exit 1 on drift.")
@click.option("--no-progress", is_flag=True, help="No live progress display.")
def build_repo(spec_path: Path, output: Path, target: str | None, only: tuple[str, ...],
               force: bool, check: bool, no_progress: bool) -> None:
    """Export, check and write the Triton model repository from the spec."""
    if check:
        drift = check_repository(spec_path, output, target)
        if drift:
            click.echo("\n".join(drift))
            raise ConfigError(
                f"{len(drift)} config(s) in {output} differ from {spec_path}; run "
                f"`tools build-repo` and commit the config.pbtxt files"
            )
        click.echo(f"{output}: every config.pbtxt matches {spec_path}")
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    build_repository(spec_path, output, target, list(only) or None, force, not no_progress)
