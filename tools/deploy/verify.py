"""Check a model repository against its ``build_manifest.json``: every file it records is there
with its recorded size and sha256, and nothing else sits in a model folder.

Standard library only (with ``tools.manifest`` and ``tools.files``): the serving images run it in the init
container that verifies a copied artifact (``docker/verify_repository.py``), and ``tools deploy
package`` runs it before it builds the artifact.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from tools.files import sha256_file
from tools.manifest import MANIFEST_NAME, Manifest, ManifestError


@dataclass(frozen=True)
class Verified:
    """What ``verify_repository`` found.

    Attributes:
        repository: The folder checked.
        manifest_sha256: sha256 of ``build_manifest.json``'s bytes ("" when it is missing).
        target: The manifest's target.
        files: Files checked.
        bytes: Their total size.
        problems: One line per mismatch, missing or unexpected file; empty when it verifies.
    """

    repository: Path
    manifest_sha256: str
    target: str
    files: int
    bytes: int
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """Every recorded file matches and nothing else is there."""
        return not self.problems


def manifest_sha256(repository: Path) -> str:
    """sha256 of the repository's ``build_manifest.json`` (the artifact's tag is made from it)."""
    return sha256_file(Path(repository) / MANIFEST_NAME)


def _ignored(relative: Path) -> bool:
    return "__pycache__" in relative.parts or relative.suffix == ".pyc"


def verify_repository(repository: Path, *, target: str | None = None,
                      expected_manifest_sha256: str | None = None) -> Verified:
    """Hash every file the manifest records and compare.

    Args:
        repository: The model repository (holding ``build_manifest.json``).
        target: The target the repository must have been built for, if given.
        expected_manifest_sha256: The manifest's sha256 (or a prefix of it) the caller was
            promised, e.g. from the artifact's tag.

    Returns:
        The result; ``problems`` names each file and what was wrong with it.
    """
    repository = Path(repository)
    path = repository / MANIFEST_NAME
    try:
        text = path.read_bytes()
        manifest = Manifest.from_text(text.decode("utf-8"), str(path))
    except FileNotFoundError:
        return Verified(repository, "", "", 0, 0, (f"{path}: missing (not a built repository)",))
    except (OSError, UnicodeDecodeError, ManifestError) as exc:
        return Verified(repository, "", "", 0, 0, (f"{path}: unreadable: {exc}",))
    digest = hashlib.sha256(text).hexdigest()
    problems: list[str] = []
    if expected_manifest_sha256 and not digest.startswith(expected_manifest_sha256):
        problems.append(f"{path}: sha256 {digest} is not the expected {expected_manifest_sha256}")
    if target is not None and manifest.target != target:
        problems.append(f"{path}: built for target {manifest.target!r}, not {target!r}")
    if not manifest.models:
        problems.append(f"{path}: records no model")
    files = total = 0
    for name, entry in sorted(manifest.models.items()):
        folder = repository / name
        if not entry.artifacts:
            problems.append(f"model '{name}': the manifest records no file for it")
        for relative, info in sorted(entry.artifacts.items()):
            file = folder / relative
            if not file.is_file():
                problems.append(f"{file}: missing")
                continue
            size = file.stat().st_size
            if size != info.get("bytes"):
                problems.append(f"{file}: {size} bytes, the manifest says {info.get('bytes')}")
                continue
            actual = sha256_file(file)
            if actual != info.get("sha256"):
                problems.append(f"{file}: sha256 {actual}, the manifest says {info.get('sha256')}")
                continue
            files += 1
            total += size
        if folder.is_dir() and not any(p.is_dir() and p.name.isdigit() for p in folder.iterdir()):
            problems.append(f"{folder}: no version folder (Triton loads none of model '{name}')")
        if folder.is_dir():
            for extra in sorted(p for p in folder.rglob("*") if p.is_file()):
                relative = extra.relative_to(folder)
                if not _ignored(relative) and str(relative) not in entry.artifacts:
                    problems.append(f"{extra}: not recorded in the manifest")
    for folder in sorted(p for p in repository.iterdir() if p.is_dir()):
        if folder.name not in manifest.models and not folder.name.startswith("."):
            problems.append(f"{folder}: a folder the manifest does not record")
    return Verified(repository, digest, manifest.target, files, total, tuple(problems))
