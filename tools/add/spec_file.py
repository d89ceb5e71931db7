"""Write ``tools add``'s entries into a spec file, keeping the user's comments and layout.

The entries are appended as text (``tools/yaml_edit.py``); the new text is validated as a whole
spec (``load_spec`` on a copy beside the file) before it atomically replaces the file, so any
error leaves the spec as it was.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tools.build_repo.spec import SECTIONS, RepoSpec, load_spec
from tools.errors import SpecError, UserInputError
from tools.yaml_edit import YamlEditError, append_entries


def new_spec_text() -> str:
    """The text of a spec created by ``tools add`` (no ``backends``: the installed ones)."""
    return ("# The repository spec, created by `tools add`: see docs/spec.md.\n"
            "target: cpu\ncpu_cores: 2\n")


def write_spec(spec_path: Path, blocks: dict[str, list[str]], names: list[str]) -> RepoSpec:
    """Append ``blocks`` to the spec, validate the result, then replace the file atomically.

    Args:
        spec_path: the spec (created when missing).
        blocks: per section, the entry texts to append.
        names: the entry names the blocks define (each must be new to the spec).

    Returns:
        The new spec, as loaded.

    Raises:
        UserInputError: a name is already in the spec, or the new spec is invalid; the file is
            unchanged.
    """
    spec_path = Path(spec_path).resolve()
    old = spec_path.read_text(encoding="utf-8") if spec_path.exists() else None
    if old is not None:
        taken = sorted(set(names) & set(load_spec(spec_path).names()))
        if taken:
            raise UserInputError(
                f"{spec_path}: already has {taken}; choose another --name or remove those entries"
            )
    try:
        text = append_entries(old if old is not None else new_spec_text(),
                              {s: blocks[s] for s in SECTIONS if s in blocks})
    except YamlEditError as exc:
        raise UserInputError(f"{spec_path}: {exc} (file unchanged)") from None
    handle, temp = tempfile.mkstemp(prefix=f".{spec_path.name}.", suffix=".add",
                                    dir=spec_path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        try:
            load_spec(Path(temp))
        except SpecError as exc:
            raise UserInputError(
                f"{spec_path}: the entries tools add wrote would make the spec invalid "
                f"(file unchanged):\n{str(exc).replace(temp, str(spec_path))}"
            ) from None
        if spec_path.exists():
            os.chmod(temp, spec_path.stat().st_mode & 0o7777)
        os.replace(temp, spec_path)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
    return load_spec(spec_path)
