"""The build manifest (``model_repository/build_manifest.json``) as one typed object.

Per model: source and weights hashes, spec hash, tool versions, opset, parity figures, time per
stage, artifact hashes, and a fingerprint of every input; an unchanged fingerprint skips a model.
A PyTorch model also records an export fingerprint (what model.onnx/model.plan and parity depend
on): when only that matches, the model is repackaged around its previous, hash-checked export.
Standard library only: the TensorRT guard reads it inside the NGC image through the same type
(``tools/files.py`` is copied beside it).
"""

from __future__ import annotations

import enum
import hashlib
import importlib.metadata
import importlib.util
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tools.files import sha256_file

MANIFEST_NAME = "build_manifest.json"
FORMAT = 1
TOOLS = ("torch", "onnx", "onnxruntime", "openvino", "tensorrt", "tritonclient")
# Each tool may be installed under another distribution name; the first one found counts.
# TensorRT's wheels are `tensorrt` (a meta package) or `tensorrt-cu12` / `tensorrt-cu13`.
_DISTRIBUTIONS = {
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu"),
    "tensorrt": ("tensorrt", "tensorrt-cu13", "tensorrt_cu13", "tensorrt-cu12", "tensorrt_cu12",
                 "tensorrt-cu13-bindings", "tensorrt-cu12-bindings"),  # the builder image: bindings only
}


class Word(str, enum.Enum):
    """An Enum whose members print as their value (in tables, f-strings and JSON)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class ModelKind(Word):
    """What a spec entry is, and so which builder packages it (a manifest entry's ``kind``)."""

    PYTORCH = "pytorch"
    ONNX = "onnx"  # an ONNX file as the source: no export
    PYTHON = "python"
    ENSEMBLE = "ensemble"


class Stage(Word):
    """The stages of a model's build: the keys of a manifest entry's ``stages``."""

    LOAD = "load"
    EXPORT = "export"
    PARITY = "parity"
    PARITY_ENTITIES = "parity_entities"  # a token classifier's entities against transformers
    FUSE = "fuse"
    PARITY_FUSED = "parity_fused"
    QUANTIZE = "quantize"
    QUALITY = "quality"
    OPENVINO = "openvino"
    PARITY_OPENVINO = "parity_openvino"
    ONNX2TRT = "onnx2trt"
    PARITY_TRT = "parity_trt"
    CHECK = "check"  # an ONNX source: its graph against the spec
    COPY = "copy"
    REUSE = "reuse"  # a repackage: the previous artifacts carried over
    WRITE = "write"


class StageStatus(Word):
    """What happened to one stage of one model."""

    DONE = "done"
    SKIPPED = "skipped"  # could not run here (no GPU); the reason says why
    REUSED = "reused"  # carried over from an earlier build


def tool_versions() -> dict[str, str | None]:
    """Installed versions of the tools that shape the artifacts (no heavy imports)."""
    versions: dict[str, str | None] = {}
    for name in TOOLS:
        versions[name] = None
        for distribution in _DISTRIBUTIONS.get(name, (name,)):
            try:
                versions[name] = importlib.metadata.version(distribution)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return versions


def module_file(reference: str) -> Path | None:
    """The source file of the module in ``package.module:function`` (without importing it)."""
    spec = importlib.util.find_spec(reference.partition(":")[0])
    return Path(spec.origin) if spec and spec.origin else None


def fingerprint(parts: dict[str, Any]) -> str:
    """A stable hash of everything a model's build depends on."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class ManifestError(ValueError):
    """The manifest file is not one this version can read (callers decide what that means)."""


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


@dataclass(frozen=True)
class TensorRTRecord:
    """What a TensorRT plan was built with; the server guard refuses a plan that disagrees."""

    version: str
    compute_capability: str
    precision: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The manifest form."""
        return {"version": self.version, "compute_capability": self.compute_capability,
                "precision": self.precision}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> TensorRTRecord:
        """Read a ``tensorrt`` entry; ``where`` names it in the error."""
        if not isinstance(data, dict) or "version" not in data or "compute_capability" not in data:
            raise ManifestError(f"{where} needs 'version' and 'compute_capability'")
        return cls(str(data["version"]), str(data["compute_capability"]), data.get("precision"))


@dataclass
class ModelEntry:
    """One model's record. Optional fields are left out of the JSON when they do not apply.

    Attributes:
        kind: which builder made the folder.
        fingerprint: hash of every input; unchanged means the model is skipped.
        export: PyTorch models: ``{"fingerprint", "built_at", "reused"?}`` of model.onnx/plan.
        parity: runtime -> ``{"atol", "rtol", "cases": [figures]}``.
        stages: what happened to each stage.
        artifacts: relative path -> ``{"sha256", "bytes"}`` of every file of the model folder.
    """

    kind: ModelKind
    target: str
    fingerprint: str = ""
    spec_hash: str = ""
    inputs: dict[str, Any] = field(default_factory=dict)
    tools: dict[str, Any] = field(default_factory=dict)
    stages: dict[Stage, StageRecord] = field(default_factory=dict)
    artifacts: dict[str, dict[str, Any]] = field(default_factory=dict)
    weights_stat: dict[str, list[int]] = field(default_factory=dict)
    built_at: str = ""
    export: dict[str, Any] | None = None
    parity: dict[str, dict[str, Any]] | None = None
    tensorrt: TensorRTRecord | None = None
    optimization: dict[str, Any] | None = None
    opset: int | None = None
    warmup: dict[str, Any] | None = None
    source: dict[str, Any] | None = None
    backend: str | None = None
    carried_over: list[str] | None = None
    parity_carried_over_from: str | None = None

    def __post_init__(self) -> None:
        self.kind = ModelKind(self.kind)  # also accepts the word (``"pytorch"``)

    def to_dict(self) -> dict[str, Any]:
        """The manifest (JSON) form."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            out[f.name] = value.to_dict() if isinstance(value, TensorRTRecord) else value
        out["kind"] = self.kind.value
        out["stages"] = {stage.value: record.to_dict() for stage, record in self.stages.items()}
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str) -> ModelEntry:
        """Read one entry; unknown or missing required fields raise ``ManifestError``."""
        if not isinstance(data, dict):
            raise ManifestError(f"{where} is not a mapping")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown or "kind" not in data:
            raise ManifestError(f"{where}: unknown fields {unknown}" if unknown
                                else f"{where}: field 'kind' is missing")
        values = dict(data)
        values.setdefault("target", "")
        try:
            values["kind"] = ModelKind(values["kind"])
            values["stages"] = {Stage(k): StageRecord.from_dict(v)
                                for k, v in dict(values.get("stages") or {}).items()}
        except (ValueError, TypeError, KeyError) as exc:
            raise ManifestError(f"{where}: {exc}") from None
        if values.get("tensorrt") is not None:
            values["tensorrt"] = TensorRTRecord.from_dict(values["tensorrt"], f"{where} field 'tensorrt'")
        return cls(**values)


@dataclass
class Manifest:
    """The whole manifest: which spec and target built the repository, and every model."""

    spec: str = ""
    target: str = ""
    models: dict[str, ModelEntry] = field(default_factory=dict)
    format: int = FORMAT

    def to_text(self) -> str:
        """The JSON text (sorted keys, so diffs between builds are readable)."""
        data = {"format": self.format, "spec": self.spec, "target": self.target,
                "models": {name: e.to_dict() for name, e in self.models.items()}}
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_text(cls, text: str, where: str = MANIFEST_NAME) -> Manifest:
        """Parse a manifest.

        Raises:
            ManifestError: not JSON, another format, or a malformed entry (named in the message).
        """
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ManifestError(f"{where}: not valid JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ManifestError(f"{where}: not a format-{FORMAT} build manifest")
        models = data.get("models", {})
        if not isinstance(models, dict):
            raise ManifestError(f"{where}: field 'models' is not a mapping")
        entries = {str(n): ModelEntry.from_dict(e, f"{where}: model '{n}'") for n, e in models.items()}
        return cls(str(data.get("spec", "")), str(data.get("target", "")), entries)

    @classmethod
    def read(cls, output: Path) -> Manifest | None:
        """The manifest in the repository ``output``; None when there is none.

        Raises:
            ManifestError: the file exists but cannot be read as a manifest.
        """
        path = Path(output) / MANIFEST_NAME
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ManifestError(f"{path}: cannot be read ({exc})") from None
        return cls.from_text(text, str(path))


def load_manifest(output: Path) -> Manifest:
    """The manifest in ``output`` for the builder: a missing or unreadable one starts fresh."""
    try:
        return Manifest.read(output) or Manifest()
    except ManifestError:
        return Manifest()


def artifacts_of(model_dir: Path) -> dict[str, dict[str, Any]]:
    """sha256 and size of every file in a built model folder, by path relative to it."""
    out = {}
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        if "__pycache__" in path.parts:
            continue
        out[str(path.relative_to(model_dir))] = {
            "sha256": sha256_file(path),
            "bytes": path.stat().st_size,
        }
    return out


def artifacts_present(model_dir: Path, artifacts: dict[str, dict[str, Any]]) -> bool:
    """Whether every recorded artifact is still there with its recorded size (cheap check)."""
    for relative, info in artifacts.items():
        path = model_dir / relative
        if not path.is_file() or path.stat().st_size != info.get("bytes"):
            return False
    return bool(artifacts)


def matching_artifacts(
    model_dir: Path, artifacts: dict[str, dict[str, Any]], relatives: list[str]
) -> bool:
    """Whether each of ``relatives`` is recorded in ``artifacts`` and its file has that sha256."""
    for relative in relatives:
        info = artifacts.get(relative)
        path = Path(model_dir) / relative
        if not info or not path.is_file() or path.stat().st_size != info.get("bytes"):
            return False
        if sha256_file(path) != info.get("sha256"):
            return False
    return bool(relatives)
