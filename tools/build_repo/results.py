"""Typed outcomes of `tools build-repo`: what each stage, model and build returns.

Statuses are Enums whose values are the words the summary table and the manifest show.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class _Word(str, enum.Enum):
    """An Enum whose members print as their value (in tables, f-strings and JSON)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class ModelKind(_Word):
    """What a spec entry is, and so which builder packages it."""

    PYTORCH = "pytorch"
    ONNX = "onnx"  # an ONNX file as the source: no export
    PYTHON = "python"
    ENSEMBLE = "ensemble"


class ModelStatus(_Word):
    """What the build did with one model."""

    PENDING = "pending"
    BUILT = "built"
    REPACKAGED = "repackaged"  # export and parity reused, packaging rewritten
    SKIPPED = "skipped"
    FAILED = "failed"


class StageStatus(_Word):
    """What happened to one stage of one model."""

    DONE = "done"
    SKIPPED = "skipped"  # could not run here (no GPU); the reason says why
    REUSED = "reused"  # carried over from an earlier build


@dataclass
class StageRecord:
    """One stage's line in the manifest."""

    status: StageStatus
    seconds: float | None = None
    reason: str = ""
    reused_from: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The manifest form: only the fields that apply."""
        out: dict[str, Any] = {"status": self.status.value}
        if self.seconds is not None:
            out["seconds"] = self.seconds
        if self.reason:
            out["reason"] = self.reason
        if self.reused_from:
            out["from"] = self.reused_from
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StageRecord:
        """Read the manifest form back."""
        return cls(StageStatus(data["status"]), data.get("seconds"), data.get("reason", ""),
                   data.get("from", ""))


@dataclass
class ModelResult:
    """One model's or pipeline's outcome."""

    name: str
    kind: ModelKind
    status: ModelStatus = ModelStatus.PENDING
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
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
