"""Reading ``repository.yaml``: the file, its entries' names, and every problem worded at once.

Each problem is one line naming the file, its line and column, the entry and the field, e.g.
``repository.yaml:12:7: model 'encoder': field 'inputs[0].dtype' must be ...``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tools.build_repo.spec.repository import REPOSITORY_YAML, SECTIONS, RepoSpec
from tools.errors import SpecError
from tools.typed_yaml import (
    InvalidFile,
    Problem,
    YamlDocument,
    YamlSyntaxError,
    dotted,
    unknown_field,
    validate,
)


def problem_line(path: Path, problem: Problem) -> str:
    """``<file>:<line>:<column>: <model|python model|pipeline> '<name>': field '<path>' <problem>``."""
    loc, owner = problem.loc, ""
    if len(loc) >= 2 and loc[0] in SECTIONS and loc[2:3] != ("[key]",):
        owner, loc = f" {SECTIONS[str(loc[0])]} {loc[1]!r}:", loc[2:]
    field = f" field {dotted(loc)!r}" if dotted(loc) else ""
    return f"{problem.where(path)}{owner}{field} {problem.text}"


def _with_loader_keys(data: Any, path: Path) -> tuple[Any, list[Problem]]:
    """The document with what the loader fills in: the file's path and each entry's name (its
    key); the file itself may give neither (such a key is reported as unknown)."""
    if not isinstance(data, dict):
        return data, []
    problems = []
    if "path" in data:
        problems.append(unknown_field(REPOSITORY_YAML, ("path",)))
    out = {**data, "path": str(path)}
    for section in SECTIONS:
        entries = data.get(section)
        if not isinstance(entries, dict):
            continue
        named = {}
        for key, entry in entries.items():
            if isinstance(key, str) and isinstance(entry, dict):
                if "name" in entry:
                    problems.append(unknown_field(REPOSITORY_YAML, (section, key, "name")))
                entry = {"name": key, **{k: v for k, v in entry.items() if k != "name"}}
            named[key] = entry
        out[section] = named
    return out, problems


def parse_spec(data: Any, path: Path, document: YamlDocument | None = None) -> RepoSpec:
    """Validate a loaded spec document.

    Args:
        data: The YAML document (plain data).
        path: The file it came from (named in every error; relative paths resolve against it).
        document: The parsed file, when there is one: every error then names its line and column.

    Raises:
        SpecError: one line per problem, each naming the file, the entry and the field.
    """
    path = Path(path)
    named, problems = _with_loader_keys(data, path)
    try:
        return validate(REPOSITORY_YAML, named, document, problems)
    except InvalidFile as exc:
        raise SpecError("\n".join(problem_line(path, p) for p in exc.problems)) from None


def parse_spec_text(text: str, path: Path) -> RepoSpec:
    """Parse and validate the text of a spec file read from (or meant for) ``path``.

    Raises:
        SpecError: the text is not YAML, or is not a valid spec (every problem, one per line,
            with its line and column).
    """
    try:
        document = YamlDocument(text)
    except YamlSyntaxError as exc:
        raise SpecError(f"{path}:{exc.line}:{exc.column}: not valid YAML: {exc.message}") from None
    return parse_spec(document.data, path, document)


def load_spec(path: Path) -> RepoSpec:
    """Read and validate ``repository.yaml``.

    Raises:
        SpecError: the file is missing, is not YAML, or is invalid (every problem, one per line).
    """
    path = Path(path).resolve()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the spec: {exc.strerror}") from exc
    return parse_spec_text(text, path)
