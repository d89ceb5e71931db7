"""The build manifest (``model_repository/build_manifest.json``): provenance and skip decisions.

Per model: source and weights hashes, spec hash, tool versions, opset, parity figures, time per
stage, artifact hashes, and a fingerprint of every input; an unchanged fingerprint skips a model.
A PyTorch model also records an export fingerprint (what model.onnx/model.plan and parity depend
on): when only that matches, the model is repackaged around its previous, hash-checked export.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import tempfile
from pathlib import Path
from typing import Any

MANIFEST_NAME = "build_manifest.json"
FORMAT = 1
TOOLS = ("torch", "onnx", "onnxruntime", "tensorrt", "tritonclient")


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
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    if versions["onnxruntime"] is None:
        for alt in ("onnxruntime-gpu", "tensorrt-cu12"):
            try:
                key = "onnxruntime" if alt.startswith("onnx") else "tensorrt"
                versions[key] = versions[key] or importlib.metadata.version(alt)
            except importlib.metadata.PackageNotFoundError:
                pass
    return versions


def module_file(reference: str) -> Path | None:
    """The source file of the module in ``package.module:function`` (without importing it)."""
    spec = importlib.util.find_spec(reference.partition(":")[0])
    return Path(spec.origin) if spec and spec.origin else None


def fingerprint(parts: dict[str, Any]) -> str:
    """A stable hash of everything a model's build depends on."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def load_manifest(output: Path) -> dict[str, Any]:
    """The manifest in ``output``, or an empty one (missing or unreadable files start fresh)."""
    path = Path(output) / MANIFEST_NAME
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"format": FORMAT, "models": {}}
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return {"format": FORMAT, "models": {}}
    data.setdefault("models", {})
    return data


def manifest_text(data: dict[str, Any]) -> str:
    """The manifest's JSON text (sorted keys, so diffs between builds are readable)."""
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
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
