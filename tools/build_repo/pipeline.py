"""The build orchestrator: decides skip, repackage or build per model, stages, commits or aborts.

Incremental: a model whose fingerprint is unchanged is skipped; a PyTorch model whose export
fingerprint is unchanged is repackaged around its hash-checked previous artifacts.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path

from tools.build_repo import config as cfg
from tools.build_repo.builders import Stages, builder_for
from tools.build_repo.ensemble import render_all
from tools.files import write_atomically
from tools.manifest import (
    MANIFEST_NAME,
    Manifest,
    ModelEntry,
    artifacts_of,
    artifacts_present,
    load_manifest,
    tool_versions,
)
from tools.build_repo.progress import BuildProgress
from tools.build_repo.repository import VERSION, Staging, locked, recover_interrupted
from tools.build_repo.results import BuildResult, ModelResult, ModelStatus
from tools.build_repo.spec import TARGETS, RepoSpec, load_spec
from tools.errors import BuildError, ToolkitError, UserInputError
from tools.front import haproxy_config
from tools.front.plan import FrontPlan


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def build_repository(
    spec_path: Path,
    output: Path,
    target: str | None = None,
    only: list[str] | None = None,
    force: bool = False,
    progress: bool = True,
    *,
    raise_on_failure: bool = True,
    allow_missing_gpu: bool = False,
) -> BuildResult:
    """Build the model repository described by the spec.

    Args:
        spec_path: ``repository.yaml``.
        output: the model repository folder (created if missing).
        target: ``cpu`` or ``gpu``; ``None`` takes the spec's ``target``.
        only: build just these models/pipelines (others are left as they are).
        force: rebuild even when nothing changed.
        progress: draw the live progress display (the summary is printed regardless).
        raise_on_failure: raise the error that stopped the build (default); with False, return
            the result with ``error`` set instead, so callers can read every model's status.
        allow_missing_gpu: on the gpu target without a visible GPU, build anyway and record each
            TensorRT stage as skipped (by default that is a ``BuildError`` naming the models).

    Returns:
        ``BuildResult`` with each model's status, timings and parity figures: ``skipped``
        (nothing changed), ``repackaged`` (a PyTorch model whose export inputs are unchanged:
        config, warmup and backend files rewritten around the previous hash-checked model.onnx /
        model.plan, parity carried over) or ``built``. ``force`` always builds.

    Raises:
        ToolkitError: the spec, a config, an ensemble, an export, parity or TensorRT failed. The
            repository is then unchanged. Errors that are not the project's own are wrapped
            in ``BuildError`` naming the model.
    """
    started = time.perf_counter()
    full = load_spec(Path(spec_path))
    target = target or full.target
    if target not in TARGETS:
        raise UserInputError(f"--target must be one of {list(TARGETS)}, got {target!r}")
    spec = full.for_target(target)
    output = Path(output).resolve()
    configs = render_all(spec, target)  # ensembles are checked here, before anything is built
    texts = {name: cfg.render(c.to_message()) for name, c in configs.items()}
    names = spec.names()
    for name in only or []:
        if name in full.names() and name not in names:
            raise UserInputError(f"--only {name}: not built for target {target} (its targets: "
                                 f"{list(full.find(name).targets)})")
        if name not in names:
            raise UserInputError(f"--only {name}: not in {spec.path} (have {names})")
    selected = [n for n in names if not only or n in only]
    if target == "gpu" and not allow_missing_gpu:
        from tools.build_repo.onnx2trt import require_gpu

        require_gpu(spec, selected)

    with locked(output):
        restored = recover_interrupted(output)
        build = _Build(spec, target, output, texts, force, BuildProgress(enabled=progress))
        for name in restored:
            build.reporter.console.print(f"restored {name} from an interrupted build", markup=False)
        for note in cfg.queue_stall_advisories(configs, [m.name for m in spec.models if m.name in selected]):
            build.reporter.console.print(f"note: {note}", markup=False, soft_wrap=True)
        result = build.run(selected, started)
    if result.error is not None and raise_on_failure:
        raise result.error
    return result


class _Build:
    """One run of ``build_repository``: decides, builds into staging, commits or aborts."""

    def __init__(self, spec: RepoSpec, target: str, output: Path, texts: dict[str, str],
                 force: bool, reporter: BuildProgress) -> None:
        self.spec, self.target, self.output, self.texts = spec, target, output, texts
        self.force, self.reporter = force, reporter
        self.manifest: Manifest = load_manifest(output)
        # The spec's file name, not its path: the manifest (whose hash tags the artifact) must
        # be the same from any checkout, the compose builder's /opt/triton-forge included.
        self.manifest.spec, self.manifest.target = Path(spec.path).name, target
        self.staging: Staging | None = None

    def run(self, selected: list[str], started: float) -> BuildResult:
        results: list[ModelResult] = []
        error: BaseException | None = None
        try:
            with self.reporter:
                for name in selected:
                    builder = builder_for(self.spec, self.spec.find(name), self.target, self.texts[name])
                    result = ModelResult(name, builder.kind)
                    results.append(result)
                    if error is not None:
                        result.status, result.note = ModelStatus.SKIPPED, "not built: an earlier model failed"
                        self.reporter.finish_model(name, result.status.value, result.note)
                        continue
                    error = self._one(builder, result)
                if error is None:
                    self._write_manifest()
                    self._write_front()
        finally:
            if self.staging is not None:
                self.staging.abort()  # a failure, or an interrupt: the repository is untouched
        if error is not None and not isinstance(error, ToolkitError):
            wrapped = BuildError(f"build of {results[-1].name!r} failed: {error!r}")
            wrapped.__cause__ = error
            error = wrapped
        build = BuildResult(self.output, self.target, results, time.perf_counter() - started,
                            self.output / MANIFEST_NAME, error)
        self.reporter.summary(build)
        return build

    def _write_manifest(self) -> None:
        """The one place the manifest is written: with the staged models, or alone."""
        text = self.manifest.to_text()
        if self.staging is not None:
            self.staging.commit(text)
            self.staging = None
            return
        path = self.output / MANIFEST_NAME
        try:
            current = path.read_text()
        except OSError:
            current = None
        if text != current:  # e.g. refreshed weights stat records
            write_atomically(path, text)

    def _write_front(self) -> None:
        """The front's HAProxy config for the repository as it now is (every model's config,
        built this time or not), beside the models: compose and the pod run it from there."""
        haproxy_config.write(FrontPlan.from_repository(self.output), self.output)

    def _one(self, builder, result: ModelResult) -> BaseException | None:
        """Skip or build one model into staging; returns the error instead of raising it."""
        name = result.name
        started = time.perf_counter()
        self.reporter.start_model(name)
        try:
            previous = self.manifest.models.get(name)
            plan = builder.plan(previous)
            model_dir = self.output / name
            if (
                not self.force
                and previous is not None
                and previous.fingerprint == plan.fingerprint
                and (model_dir / VERSION).is_dir()
                and artifacts_present(model_dir, previous.artifacts)
            ):
                if plan.weights_stat:
                    previous.weights_stat = plan.weights_stat
                result.status, result.note = ModelStatus.SKIPPED, "unchanged"
                result.parity = {rt: p.get("cases", []) for rt, p in (previous.parity or {}).items()}
                result.seconds = time.perf_counter() - started
                self.reporter.finish_model(name, result.status.value, result.note)
                return None
            self.staging = self.staging or Staging(self.output)
            stage_dir = self.staging.model_dir(name)
            stages = Stages(result, self.reporter)
            entry = ModelEntry(kind=builder.kind, target=self.target)
            reuse = None if self.force else builder.reusable_export(model_dir, previous, plan)
            built_at = _now()
            if reuse is not None:
                builder.repackage(stage_dir, model_dir, reuse, previous, stages, entry)
            else:
                builder.build(stage_dir, self.output, stages, entry)
                if plan.export_fingerprint is not None:
                    entry.export = {"fingerprint": plan.export_fingerprint, "built_at": built_at}
            entry.fingerprint = plan.fingerprint
            entry.spec_hash = plan.inputs["spec"]
            entry.inputs = {k: v for k, v in plan.inputs.items() if k != "config"}
            entry.tools = tool_versions()
            entry.stages = dict(stages.records)
            entry.artifacts = artifacts_of(stage_dir)
            entry.weights_stat = plan.weights_stat
            entry.built_at = built_at
            self.manifest.models[name] = entry
            result.status = ModelStatus.REPACKAGED if reuse is not None else ModelStatus.BUILT
            result.seconds = time.perf_counter() - started
            self.reporter.finish_model(name, result.status.value, f"{result.seconds:.1f}s {result.note}")
            return None
        except Exception as exc:  # noqa: BLE001 - reported in the summary, raised by the caller
            result.status = ModelStatus.FAILED
            result.seconds = time.perf_counter() - started
            result.note = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            self.reporter.finish_model(name, result.status.value, result.note)
            return exc
