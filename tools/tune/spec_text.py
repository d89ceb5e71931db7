"""Write knob settings into the spec's YAML text, keeping its comments and layout, as a diff.

Values are replaced where PyYAML's composer says they are (line and column marks), and missing keys
are inserted beside their siblings; the result is read back and checked before it is used.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from tools.errors import ToolkitError
from tools.tune.knobs import ModelKnobs

# knob -> its path under a model entry of repository.yaml
PATHS = {
    "instances": ("instances", "cpu", "count"),
    "threads": ("instances", "cpu", "intra_op_threads"),
    "max_queue_delay_microseconds": ("dynamic_batching", "max_queue_delay_microseconds"),
    "preferred_batch_size": ("dynamic_batching", "preferred_batch_size"),
    "max_queue_size": ("dynamic_batching", "default_queue_policy", "max_queue_size"),
}
SECTIONS = ("models", "python_models")


class SpecEditError(ToolkitError):
    """The spec's text could not be edited to hold the settings (the message says where)."""


def _flow(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    return str(value)


@dataclass
class _Edit:
    start: int
    end: int
    text: str


def _child(node: yaml.MappingNode, key: str) -> tuple[yaml.Node, yaml.Node] | None:
    for k, v in node.value:
        if isinstance(k, yaml.ScalarNode) and k.value == key:
            return k, v
    return None


def _nested(path: Sequence[str], value: Any) -> Any:
    for key in reversed(path):
        value = {key: value}
    return value


def _line_start(text: str, index: int) -> int:
    return text.rfind("\n", 0, index) + 1


def _edit_for(text: str, node: yaml.Node, path: Sequence[str], value: Any, where: str) -> _Edit:
    """One text edit that sets ``path`` under mapping ``node`` to ``value``."""
    key, rest = path[0], path[1:]
    found = _child(node, key)
    if found is not None:
        key_node, child = found
        if rest:
            if isinstance(child, yaml.ScalarNode) and child.tag.endswith(":null"):
                # e.g. `default_queue_policy: null` (none): the knob brings a policy of its own
                return _Edit(child.start_mark.index, child.end_mark.index,
                             _flow(_nested(rest, value)))
            if not isinstance(child, yaml.MappingNode):
                raise SpecEditError(f"{where}: {key!r} is not a mapping")
            return _edit_for(text, child, rest, value, f"{where}.{key}")
        if isinstance(child, yaml.ScalarNode) or getattr(child, "flow_style", False):
            return _Edit(child.start_mark.index, child.end_mark.index, _flow(value))
        raise SpecEditError(f"{where}.{key}: a block collection; write it in flow style "
                            f"(e.g. [4, 8]) for tools tune to edit it")
    entry = f"{key}: {_flow(_nested(rest, value))}"
    if node.flow_style:
        close = node.end_mark.index - 1  # the closing brace
        if text[close] != "}":
            raise SpecEditError(f"{where}: cannot find the end of its flow mapping")
        separator = ", " if node.value else ""
        return _Edit(close, close, separator + entry)
    if not node.value:
        raise SpecEditError(f"{where}: an empty block mapping")
    first_key = node.value[0][0]
    indent = first_key.start_mark.column
    last_value = node.value[-1][1]
    # After the last entry's line: the end mark of a block value is the next token's start.
    end = last_value.end_mark.index
    if isinstance(last_value, yaml.ScalarNode) or getattr(last_value, "flow_style", False):
        newline = text.find("\n", end)
        end = len(text) if newline < 0 else newline + 1
    else:
        end = _line_start(text, end)
    prefix = "" if end == 0 or text[end - 1] == "\n" else "\n"
    return _Edit(end, end, f"{prefix}{' ' * indent}{entry}\n")


def _model_node(text: str, root: yaml.Node, model: str) -> yaml.MappingNode:
    if not isinstance(root, yaml.MappingNode):
        raise SpecEditError("the spec is not a mapping")
    for section in SECTIONS:
        found = _child(root, section)
        if found is not None and isinstance(found[1], yaml.MappingNode):
            entry = _child(found[1], model)
            if entry is not None and isinstance(entry[1], yaml.MappingNode):
                return entry[1]
    raise SpecEditError(f"model {model!r} is not under {' or '.join(SECTIONS)}")


def _wanted(text: str, model: str, before: ModelKnobs | None, after: ModelKnobs) -> dict[str, Any]:
    """The knobs to write: those that differ from both ``before`` and what the text holds."""
    written = read_back(text, model)
    written["preferred_batch_size"] = tuple(written["preferred_batch_size"] or ())
    out = {}
    for knob in PATHS:
        value = getattr(after, knob)
        if value is None or value == written[knob] or (
                before is not None and getattr(before, knob) == value):
            continue
        out[knob] = list(value) if knob == "preferred_batch_size" else value
    return out


def apply_settings(text: str, settings: Mapping[str, ModelKnobs],
                   current: Mapping[str, ModelKnobs] | None = None, target: str = "cpu") -> str:
    """``text`` (a repository.yaml) with every knob of ``settings`` written in.

    Knobs equal in ``current`` (the spec's own values, defaults included) or to what the text
    already holds are left untouched, so the diff shows only what changes. One key at a time is
    edited and the text recomposed, so inserted keys become the siblings of later ones.

    Raises:
        SpecEditError: the text cannot be edited there, or reads back different.
    """
    if target != "cpu":
        raise SpecEditError("tools tune edits the cpu target's instances only")
    for model, knobs in settings.items():
        for knob, value in _wanted(text, model, (current or {}).get(model), knobs).items():
            root = yaml.compose(text)
            node = _model_node(text, root, model)
            edit = _edit_for(text, node, PATHS[knob], value, f"model {model!r}")
            text = text[: edit.start] + edit.text + text[edit.end:]
    _check(text, settings)
    return text


def set_cpu_cores(text: str, cores: int) -> str:
    """``text`` with the top-level ``cpu_cores`` set to ``cores`` (added when missing)."""
    edit = _edit_for(text, yaml.compose(text), ("cpu_cores",), cores, "the spec")
    return text[: edit.start] + edit.text + text[edit.end:]


def read_back(text: str, model: str) -> dict[str, Any]:
    """The knob values ``text`` gives ``model`` (absent ones as None)."""
    data = yaml.safe_load(text) or {}
    entry = next((data[s][model] for s in SECTIONS if model in (data.get(s) or {})), {})
    out = {}
    for knob, path in PATHS.items():
        value: Any = entry
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        out[knob] = value
    return out


def _check(text: str, settings: Mapping[str, ModelKnobs]) -> None:
    try:
        yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecEditError(f"the edited spec is not valid YAML: {exc}") from exc
    for model, knobs in settings.items():
        got = read_back(text, model)
        for knob in PATHS:
            want = getattr(knobs, knob)
            have = got[knob]
            if knob == "preferred_batch_size":
                have = tuple(have or ())
            if want is not None and have is not None and have != want:
                raise SpecEditError(f"model {model!r}: {knob} reads back {have!r}, not {want!r}")


def unified_patch(before: str, after: str, name: str = "repository.yaml") -> str:
    """A ``git apply``-able unified diff from ``before`` to ``after`` (empty when equal)."""
    return "".join(difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True),
        fromfile=f"a/{name}", tofile=f"b/{name}",
    ))
