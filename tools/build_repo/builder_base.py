"""What every builder shares: the timed stage runner, the plan (cache keys), the base class.

Kept apart from ``builders.py`` so builders in other modules (``onnx_source.py``) can subclass it
without importing the modules that subclass it too.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tools.build_repo import config as cfg
from tools.build_repo.progress import BuildProgress
from tools.build_repo.repository import VERSION, copy_python_backend
from tools.build_repo.results import ModelKind, ModelResult, Stage, StageRecord, StageStatus
from tools.build_repo.spec import Entry, ModelSpec, RepoSpec
from tools.manifest import ModelEntry

T = TypeVar("T")


class Stages:
    """Times the stages of one model, records them for the manifest and feeds the display."""

    def __init__(self, result: ModelResult, progress: BuildProgress) -> None:
        self.result, self.progress = result, progress
        self.records: dict[Stage, StageRecord] = {}

    def run(self, stage: Stage, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one stage, timing it (also when it fails)."""
        stage = Stage(stage)  # a name that is no stage fails here, before the stage runs
        done = [f"{k} {v:.1f}s" for k, v in self.result.timings.items()]
        self.progress.stage(self.result.name, stage, done)
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds = round(time.perf_counter() - start, 3)
            self.result.timings[stage] = seconds
            self.records[stage] = StageRecord(StageStatus.DONE, seconds)

    def skip(self, stage: Stage, reason: str) -> None:
        """A stage that cannot run here (it is reported, not failed)."""
        self.records[stage] = StageRecord(StageStatus.SKIPPED, reason=reason)
        self.result.timings.pop(stage, None)

    def reuse(self, stage: Stage, built_at: str) -> None:
        """A stage whose artifact is carried over from an earlier build."""
        self.records[stage] = StageRecord(StageStatus.REUSED, reused_from=built_at)


@dataclasses.dataclass
class Plan:
    """What a model's build depends on: the full key, and (PyTorch) the export key."""

    inputs: dict[str, Any]
    fingerprint: str
    export_fingerprint: str | None = None
    weights_stat: dict[str, list[int]] = dataclasses.field(default_factory=dict)


class SpecEntryBuilder(abc.ABC):
    """What every builder is given (the spec, its entry, the target and the rendered config) and
    what the orchestrator (``pipeline.py``) asks of it.

    ``where`` starts every message about the entry (``<spec>: model 'x': ``).
    """

    kind: ModelKind
    label = "model"

    def __init__(self, spec: RepoSpec, model: Entry, target: str, config_text: str) -> None:
        self.spec, self.model, self.target, self.text = spec, model, target, config_text
        self.where = f"{spec.path}: {self.label} {model.name!r}: "

    @property
    def owner(self) -> str:
        """``where`` without its trailing separator, for messages that go on with a comma."""
        return self.where.rstrip(": ")

    @abc.abstractmethod
    def plan(self, previous: ModelEntry | None) -> Plan:
        """The keys of this entry's build (``previous``: its last manifest entry, if any)."""

    @abc.abstractmethod
    def reusable_export(self, model_dir: Path, previous: ModelEntry | None,
                        plan: Plan) -> list[str] | None:
        """The previous artifacts (relative paths) a repackage carries over, or None to build."""

    @abc.abstractmethod
    def build(self, model_dir: Path, output: Path, stages: Stages, entry: ModelEntry) -> None:
        """Build the entry's folder into ``model_dir`` (staging) and fill its manifest ``entry``."""

    def repackage(self, model_dir: Path, previous_dir: Path, files: list[str],
                  previous: ModelEntry, stages: Stages, entry: ModelEntry) -> None:
        """Stage the entry around the artifacts ``reusable_export`` named.

        Only a builder whose ``reusable_export`` can name artifacts overrides this.
        """
        raise NotImplementedError(f"{type(self).__name__} has no export to carry over")


def warmup_record(model: ModelSpec) -> dict[str, Any] | None:
    """What a PyTorch model's warmup files depend on besides its sample-input module.

    In its manifest (JSON) form, so that it compares equal to the recorded one.
    """
    if model.warmup is None:
        return None
    return {"batch_sizes": list(model.warmup.batch_sizes),
            "axes": [list(item) for item in model.warmup_lengths.items()],
            "count": model.warmup.count}


def write_onnx_model_files(builder: SpecEntryBuilder, model_dir: Path, sample_fn: Any = None) -> None:
    """config.pbtxt, warmup files (when ``sample_fn`` is given) and, on cpu, the ONNX runner.

    Shared by every builder whose artifact is an ONNX graph (exported or given as a file).
    """
    import numpy as np

    model = builder.model
    (model_dir / "config.pbtxt").write_text(builder.text)
    if model.warmup is not None and sample_fn is not None:
        warm = model_dir / "warmup"
        warm.mkdir()
        for batch in model.warmup.batch_sizes:
            sample = sample_fn(batch, model.warmup_lengths)
            for t in model.inputs:
                data = np.ascontiguousarray(sample[t.name].numpy().astype(t.numpy_dtype))
                (warm / cfg.warmup_file_name(t.name, batch)).write_bytes(data.tobytes())
    if builder.target == "cpu":
        copy_python_backend(builder.spec.backends, cfg.ONNX_RUNNER_BACKEND, model_dir / VERSION,
                            {}, builder.owner)
