"""Append entries to the sections of a spec file as text, keeping the user's comments and layout.

The new text is validated as a whole spec (``load_spec`` on a copy beside the file) before it
atomically replaces the file, so any error leaves the spec as it was.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from tools.build_repo.spec import RepoSpec, load_spec
from tools.errors import SpecError, UserInputError

SECTIONS = ("models", "python_models", "pipelines")


def _section_line(lines: list[str], section: str) -> int | None:
    pattern = re.compile(rf"^{section}:\s*(\{{\s*\}})?\s*(#.*)?$")
    return next((i for i, line in enumerate(lines) if pattern.match(line)), None)


def _section_end(lines: list[str], start: int) -> int:
    """The index where a section's entries end: before the next top-level key and its comments."""
    end = next((i for i in range(start + 1, len(lines))
                if lines[i] and not lines[i][0].isspace() and not lines[i].startswith("#")),
               len(lines))
    while end > start + 1 and (not lines[end - 1].strip() or lines[end - 1].startswith("#")):
        end -= 1
    return end


def append_entries(text: str, blocks: dict[str, list[str]]) -> str:
    """``text`` with each block (indented entry text) appended at the end of its section.

    A missing section is added at the end of the file; ``section: {}`` becomes a block section.
    """
    lines = text.splitlines()
    for section in SECTIONS:
        if not blocks.get(section):
            continue
        new = [line for block in blocks[section] for line in ["", *block.rstrip("\n").splitlines()]]
        start = _section_line(lines, section)
        if start is None:
            while lines and not lines[-1].strip():
                lines.pop()
            lines += ["", f"{section}:", *new[1:]]
            continue
        lines[start] = re.sub(r"\{\s*\}", "", lines[start]).rstrip()
        end = _section_end(lines, start)
        if end == start + 1:
            new = new[1:]  # the first entry of an empty section: no blank line after the key
        lines[end:end] = new
    return "\n".join(lines) + "\n"


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
    text = append_entries(old if old is not None else new_spec_text(), blocks)
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
