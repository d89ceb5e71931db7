"""What every builder shares: the timed stage runner, the plan (cache keys), the base class.

Kept apart from ``builders.py`` so builders in other modules (``onnx_source.py``) can subclass it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, TypeVar

from pathlib import Path

from tools.build_repo import config as cfg
from tools.build_repo.progress import BuildProgress
from tools.build_repo.repository import VERSION, copy_python_backend
from tools.build_repo.results import ModelKind, ModelResult, StageRecord, StageStatus
from tools.build_repo.spec import RepoSpec

T = TypeVar("T")


class Stages:
    """Times the stages of one model, records them for the manifest and feeds the display."""

    def __init__(self, result: ModelResult, progress: BuildProgress) -> None:
        self.result, self.progress = result, progress
        self.records: dict[str, StageRecord] = {}

    def run(self, stage: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one stage, timing it (also when it fails)."""
        done = [f"{k} {v:.1f}s" for k, v in self.result.timings.items()]
        self.progress.stage(self.result.name, stage, done)
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds = round(time.perf_counter() - start, 3)
            self.result.timings[stage] = seconds
            self.records[stage] = StageRecord(StageStatus.DONE, seconds)

    def skip(self, stage: str, reason: str) -> None:
        """A stage that cannot run here (it is reported, not failed)."""
        self.records[stage] = StageRecord(StageStatus.SKIPPED, reason=reason)
        self.result.timings.pop(stage, None)

    def reuse(self, stage: str, built_at: str) -> None:
        """A stage whose artifact is carried over from an earlier build."""
        self.records[stage] = StageRecord(StageStatus.REUSED, reused_from=built_at)

    def manifest_form(self) -> dict[str, dict[str, Any]]:
        """The ``stages`` field of the model's manifest entry."""
        return {name: record.to_dict() for name, record in self.records.items()}


@dataclasses.dataclass
class Plan:
    """What a model's build depends on: the full key, and (PyTorch) the export key."""

    inputs: dict[str, Any]
    fingerprint: str
    export_fingerprint: str | None = None
    weights_stat: dict[str, list[int]] = dataclasses.field(default_factory=dict)


class SpecEntryBuilder:
    """What every builder is given: the spec, its entry, the target and the rendered config.

    ``where`` starts every message about the entry (``<spec>: model 'x': ``).
    """

    kind: ModelKind
    label = "model"

    def __init__(self, spec: RepoSpec, model: Any, target: str, config_text: str) -> None:
        self.spec, self.model, self.target, self.text = spec, model, target, config_text
        self.where = f"{spec.path}: {self.label} {model.name!r}: "

    @property
    def owner(self) -> str:
        """``where`` without its trailing separator, for messages that go on with a comma."""
        return self.where.rstrip(": ")


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
            sample = sample_fn(batch, dict(model.warmup.axes))
            for t in model.inputs:
                data = np.ascontiguousarray(sample[t.name].numpy().astype(t.numpy_dtype))
                (warm / cfg.warmup_file_name(t.name, batch)).write_bytes(data.tobytes())
    if builder.target == "cpu":
        copy_python_backend(builder.spec.backends, cfg.ONNX_RUNNER_BACKEND, model_dir / VERSION,
                            {}, builder.owner)
