"""The wheel's build step that copies the project's top-level folders into ``tools/_project/``.

setuptools runs it as ``build_py`` (``[tool.setuptools.cmdclass]`` in pyproject.toml) and loads it
from this file alone, before ``tools`` is importable: it imports nothing from ``tools``.
``tools/paths.py`` reads the copies when no checkout is around; an editable install copies
nothing (the checkout's own folders are read).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools.command.build_py import build_py

PACKAGED = "_project"  # tools/_project/ in the wheel: the checkout's layout below it
# What a wheel carries, as globs from the project root (checkout or unpacked sdist).
PROJECT_DATA = (
    "backends/python/**/*",
    "loadtests/*.py",
    "loadtests/slo.yaml",
    "loadtests/data/**/*",
    "schemas/*.schema.json",
)
_CACHES = ("__pycache__", ".pyc")


def project_files(root: Path) -> list[Path]:
    """The files of ``PROJECT_DATA`` under ``root``, relative to it, without bytecode caches."""
    found = {p for pattern in PROJECT_DATA for p in root.glob(pattern) if p.is_file()}
    return sorted(p.relative_to(root) for p in found
                  if not any(part == _CACHES[0] or part.endswith(_CACHES[1]) for part in p.parts))


class BuildPyWithProjectData(build_py):
    """``build_py`` that also copies ``PROJECT_DATA`` to ``<build_lib>/tools/_project/``."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        root = Path.cwd()  # setuptools builds from the project root
        target = Path(self.build_lib) / "tools" / PACKAGED
        shutil.rmtree(target, ignore_errors=True)  # no stale file from an earlier build
        files = project_files(root)
        if not any(f.parts[:2] == ("backends", "python") for f in files):
            raise FileNotFoundError(f"{root}: no backends/python/ to put into the wheel")
        for relative in files:
            self.mkpath(str((target / relative).parent))
            self.copy_file(str(root / relative), str(target / relative))
