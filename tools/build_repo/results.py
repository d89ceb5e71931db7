"""Typed outcomes of `tools build-repo`: what each stage, model and build returns.

Statuses are Enums whose values are the words the summary table and the manifest show; the
kinds, stages and stage statuses the manifest records are defined with it (``tools/manifest.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.manifest import ModelKind, Stage, StageRecord, StageStatus, Word

__all__ = ["BuildResult", "ModelKind", "ModelResult", "ModelStatus", "Stage", "StageRecord",
           "StageStatus"]


class ModelStatus(Word):
    """What the build did with one model."""

    PENDING = "pending"
    BUILT = "built"
    REPACKAGED = "repackaged"  # export and parity reused, packaging rewritten
    SKIPPED = "skipped"
    FAILED = "failed"


@dataclass
class ModelResult:
    """One model's or pipeline's outcome."""

    name: str
    kind: ModelKind
    status: ModelStatus = ModelStatus.PENDING
    seconds: float = 0.0
    timings: dict[Stage, float] = field(default_factory=dict)
    parity: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    note: str = ""
    quality: Any = None  # quality.QualityReport of a gated variant built in this run

    @property
    def parity_max_abs(self) -> dict[str, float]:
        """Worst max abs error per runtime."""
        return {rt: max(f["max_abs"] for f in figs) for rt, figs in self.parity.items() if figs}


@dataclass
class BuildResult:
    """Everything ``build_repository`` did.

    Attributes:
        error: the error that stopped the build (the repository is then unchanged), or None.
    """

    output: Path
    target: str
    models: list[ModelResult]
    seconds: float
    manifest: Path
    error: BaseException | None = None

    def __getitem__(self, name: str) -> ModelResult:
        return next(m for m in self.models if m.name == name)

    @property
    def ok(self) -> bool:
        """No model failed."""
        return self.error is None and all(m.status != ModelStatus.FAILED for m in self.models)
