"""Atomic model-repository writes: build in a hidden sibling folder, swap in only on success.

A failed build removes its staging folder and leaves every existing model folder (and the
manifest) byte-identical. Also copies Python-backend code and data files into version folders.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from tools.files import write_atomically
from tools.manifest import MANIFEST_NAME
from tools.errors import BuildError, SpecError

VERSION = "1"
PIPELINE_OPS = "pipeline_ops"


def _sibling(output: Path, kind: str, build_id: str) -> Path:
    """``<parent>/.<name>.<kind>-<id>``: beside the repository, never inside it.

    Triton takes every folder inside the repository for a model, hidden ones included, so a
    staging folder left there by a killed build would break the next server start.
    """
    output = Path(output)
    return output.parent / f".{output.name}.{kind}-{build_id}"


@contextlib.contextmanager
def locked(output: Path) -> Iterator[None]:
    """Hold ``<output>/.build.lock`` so two builds never write one repository at once.

    Raises:
        ToolkitError: another build holds the lock.
    """
    Path(output).mkdir(parents=True, exist_ok=True)
    with open(Path(output) / ".build.lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise BuildError(f"{output}: another `tools build-repo` is writing it") from exc
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recover_interrupted(output: Path) -> list[str]:
    """Clean up after a build that was killed: drop its staging folder, restore parked models.

    A folder belongs to a dead build when the pid recorded in it no longer runs. Parked models
    (``.previous-<id>/<name>``) go back where they were if nothing replaced them.

    Returns:
        Names of the models put back.
    """
    restored = []
    output = Path(output)
    builds = sorted(output.parent.glob(f".{output.name}.build-*"))
    parked_folders = sorted(output.parent.glob(f".{output.name}.previous-*"))
    for folder in builds + parked_folders:
        build_id = folder.name.rsplit("-", 1)[1]
        pid_file = _sibling(output, "build", build_id) / ".pid"
        try:
            pid = int(pid_file.read_text())
        except (OSError, ValueError):
            pid = 0
        if pid and _alive(pid):
            continue
        if folder in parked_folders:
            for parked in folder.iterdir():
                if not (Path(output) / parked.name).exists():
                    os.rename(parked, Path(output) / parked.name)
                    restored.append(parked.name)
        shutil.rmtree(folder, ignore_errors=True)
    return restored


class Staging:
    """A staging folder beside the repository (same filesystem, so renames are atomic).

    ``.<repository>.build-<id>`` lies outside the folder Triton scans; it records the building
    process's pid so that ``recover_interrupted`` can tell a dead build from a running one.
    """

    def __init__(self, output: Path) -> None:
        self.output = Path(output)
        self.output.mkdir(parents=True, exist_ok=True)
        self.id = uuid.uuid4().hex[:12]
        self.root = _sibling(self.output, "build", self.id)
        self.root.mkdir()
        (self.root / ".pid").write_text(str(os.getpid()))
        self.models: list[str] = []

    def model_dir(self, name: str) -> Path:
        """A fresh folder for ``name`` inside the staging area."""
        path = self.root / name
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        self.models.append(name)
        return path

    def abort(self) -> None:
        """Drop everything staged; the repository is untouched."""
        shutil.rmtree(self.root, ignore_errors=True)

    def commit(self, manifest_text: str) -> None:
        """Move every staged model into place, then write the manifest.

        Each model folder moves with one ``rename``; old folders are parked in
        ``.<repository>.previous-<id>/`` until all moves succeeded, and put back if any fails.

        Raises:
            ToolkitError: a move failed (after restoring the previous folders).
        """
        parked = _sibling(self.output, "previous", self.id)
        moved: list[str] = []
        try:
            for name in self.models:
                target = self.output / name
                if target.exists():
                    parked.mkdir(exist_ok=True)
                    os.rename(target, parked / name)
                os.rename(self.root / name, target)
                moved.append(name)
            write_atomically(self.output / MANIFEST_NAME, manifest_text)
        except OSError as exc:
            for name in reversed(moved):
                shutil.rmtree(self.output / name, ignore_errors=True)
            for name in self.models:
                if (parked / name).exists():
                    os.rename(parked / name, self.output / name)
            shutil.rmtree(parked, ignore_errors=True)
            self.abort()
            raise BuildError(f"{self.output}: could not swap the new build in: {exc}") from exc
        shutil.rmtree(parked, ignore_errors=True)
        self.abort()


def _ignore_caches(_dir: str, names: list[str]) -> list[str]:
    return [n for n in names if n == "__pycache__" or n.endswith(".pyc")]


def backend_source(backends_root: Path, backend: str, owner: str) -> Path:
    """``backends/python/<backend>/model.py``.

    Raises:
        SpecError: it does not exist (naming the model and the path).
    """
    path = backends_root / backend / "model.py"
    if not path.is_file():
        raise SpecError(f"{owner}: backend {backend!r} has no {path}")
    return path


def copy_python_backend(
    backends_root: Path, backend: str, version_dir: Path, files: dict[str, Path], owner: str
) -> None:
    """Copy ``model.py``, the ``pipeline_ops`` package and data files into ``version_dir``."""
    version_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(backend_source(backends_root, backend, owner), version_dir / "model.py")
    ops = backends_root / PIPELINE_OPS
    if not (ops / "__init__.py").is_file():
        raise SpecError(f"{owner}: the shared package {ops} is missing")
    shutil.copytree(ops, version_dir / PIPELINE_OPS, ignore=_ignore_caches)
    for name, source in files.items():
        shutil.copy2(source, version_dir / name)
