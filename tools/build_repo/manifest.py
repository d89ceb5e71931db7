"""The build manifest (``model_repository/build_manifest.json``) as one typed object.

Per model: source and weights hashes, spec hash, tool versions, opset, parity figures, time per
stage, artifact hashes, and a fingerprint of every input; an unchanged fingerprint skips a model.
A PyTorch model also records an export fingerprint (what model.onnx/model.plan and parity depend
on): when only that matches, the model is repackaged around its previous, hash-checked export.
Standard library only: the TensorRT guard reads it inside the NGC image through the same type.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

MANIFEST_NAME = "build_manifest.json"
FORMAT = 1
TOOLS = ("torch", "onnx", "onnxruntime", "openvino", "tensorrt", "tritonclient")
# Each tool may be installed under another distribution name; the first one found counts.
# TensorRT's wheels are `tensorrt` (a meta package) or `tensorrt-cu12` / `tensorrt-cu13`.
_DISTRIBUTIONS = {
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu"),
    "tensorrt": ("tensorrt", "tensorrt-cu13", "tensorrt_cu13", "tensorrt-cu12", "tensorrt_cu12"),
}


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_tree(root: Path) -> str:
    """Hex sha256 over the relative paths and bytes of every file under ``root`` (or one file)."""
    root = Path(root)
    if root.is_file():
        return sha256_file(root)
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(sha256_file(path).encode())
    return digest.hexdigest()


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
        kind: ``pytorch``, ``python`` or ``ensemble`` (``results.ModelKind`` values).
        fingerprint: hash of every input; unchanged means the model is skipped.
        export: PyTorch models: ``{"fingerprint", "built_at", "reused"?}`` of model.onnx/plan.
        parity: runtime -> ``{"atol", "rtol", "cases": [figures]}``.
        stages: stage -> ``results.StageRecord`` in its manifest form.
        artifacts: relative path -> ``{"sha256", "bytes"}`` of every file of the model folder.
    """

    kind: str
    target: str
    fingerprint: str = ""
    spec_hash: str = ""
    inputs: dict[str, Any] = field(default_factory=dict)
    tools: dict[str, Any] = field(default_factory=dict)
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)
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

    def to_dict(self) -> dict[str, Any]:
        """The manifest (JSON) form."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            out[f.name] = value.to_dict() if isinstance(value, TensorRTRecord) else value
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


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        # mkstemp makes it 0600; give it the mode open() would (a server running as another
        # user, as in the containers, must read the manifest).
        umask = os.umask(0o022)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
