"""Edit a YAML text in place, keeping its comments and layout: set a value, append entries.

Where to edit comes from ruamel.yaml's round-trip composer (the start and end of every node);
only the edited span of the text changes, so ``unified_patch`` of the result is a reviewable diff.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ruamel.yaml.error import YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode

from tools.errors import ToolkitError
from tools.typed_yaml import round_trip_yaml


class YamlEditError(ToolkitError):
    """The text could not be edited there (the message says where and why)."""


def flow(value: Any) -> str:
    """``value`` as YAML flow text: ``[4, 8]``, ``{a: 1}``, ``2``."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(flow(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {flow(v)}" for k, v in value.items()) + "}"
    return str(value)


def compose(text: str) -> Node | None:
    """The node tree of ``text`` (None for an empty document).

    Raises:
        YamlEditError: the text is not YAML.
    """
    try:
        return round_trip_yaml().compose(text)
    except YAMLError as exc:
        raise YamlEditError(f"not valid YAML: {exc}") from None


def child(node: Node | None, key: str) -> tuple[ScalarNode, Node] | None:
    """The key and value nodes of ``key`` in mapping ``node`` (None when absent or no mapping)."""
    if not isinstance(node, MappingNode):
        return None
    for k, v in node.value:
        if isinstance(k, ScalarNode) and k.value == key:
            return k, v
    return None


def find(text: str, path: Sequence[str]) -> Node | None:
    """The node at ``path`` (keys from the top), or None when a key on the way is absent."""
    node = compose(text)
    for key in path:
        found = child(node, key)
        if found is None:
            return None
        node = found[1]
    return node


def _is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and str(getattr(node.tag, "value", node.tag)).endswith(":null")


def _nested(path: Sequence[str], value: Any) -> Any:
    for key in reversed(path):
        value = {key: value}
    return value


@dataclass
class _Edit:
    start: int
    end: int
    text: str

    def apply(self, text: str) -> str:
        return text[: self.start] + self.text + text[self.end:]


def _line_start(text: str, index: int) -> int:
    return text.rfind("\n", 0, index) + 1


def _edit_for(text: str, node: MappingNode, path: Sequence[str], value: Any, where: str,
              block: bool = False, comment: str = "") -> _Edit:
    """One text edit that sets ``path`` under mapping ``node`` to ``value``."""
    key, rest = path[0], path[1:]
    found = child(node, key)
    if found is not None:
        _, value_node = found
        if rest:
            if _is_null(value_node):
                # e.g. `default_queue_policy: null` (none): the new value brings a mapping of its own
                return _Edit(value_node.start_mark.index, value_node.end_mark.index,
                             flow(_nested(rest, value)))
            if not isinstance(value_node, MappingNode):
                raise YamlEditError(f"{where}: {key!r} is not a mapping")
            return _edit_for(text, value_node, rest, value, f"{where}.{key}", block, comment)
        if isinstance(value_node, ScalarNode) or value_node.flow_style:
            return _Edit(value_node.start_mark.index, value_node.end_mark.index, flow(value))
        raise YamlEditError(f"{where}.{key}: a block collection; write it in flow style "
                            f"(e.g. [4, 8]) to have it edited")
    entry = f"{key}: {flow(_nested(rest, value))}"
    if node.flow_style:
        close = node.end_mark.index - 1  # the closing brace
        if text[close] != "}":
            raise YamlEditError(f"{where}: cannot find the end of its flow mapping")
        separator = ", " if node.value else ""
        return _Edit(close, close, separator + entry)
    if not node.value:
        raise YamlEditError(f"{where}: an empty block mapping")
    indent = node.value[0][0].start_mark.column
    last_value = node.value[-1][1]
    # After the last entry's line: the end mark of a block value is the next token's start.
    end = last_value.end_mark.index
    if isinstance(last_value, ScalarNode) or last_value.flow_style:
        newline = text.find("\n", end)
        end = len(text) if newline < 0 else newline + 1
    else:
        end = _line_start(text, end)
    prefix = "" if end == 0 or text[end - 1] == "\n" else "\n"
    if block and isinstance(value, Mapping):
        lines = block_lines([key, *rest], value, indent, comment)
        return _Edit(end, end, prefix + "\n".join(lines) + "\n")
    return _Edit(end, end, f"{prefix}{' ' * indent}{entry}\n")


def block_lines(keys: Sequence[str], value: Mapping[str, Any], indent: int, comment: str) -> list[str]:
    """``keys`` as nested block mappings, the last holding ``value``'s items one per line (flow)."""
    lines = []
    for depth, key in enumerate(keys):
        note = f"  {comment}" if comment and depth == len(keys) - 1 else ""
        lines.append(f"{' ' * (indent + 2 * depth)}{key}:{note}")
    pad = " " * (indent + 2 * len(keys))
    return [*lines, *(f"{pad}{k}: {flow(v)}" for k, v in value.items())]


def set_value(text: str, mapping: Sequence[str], path: Sequence[str], value: Any,
              where: str = "", *, block: bool = False, comment: str = "") -> str:
    """``text`` with ``path`` under the mapping at ``mapping`` set to ``value``.

    An existing scalar or flow value is replaced; a missing key is added beside its siblings (in
    the braces of a flow mapping, on a line of its own in a block mapping), with any missing
    mappings below it written as one flow mapping. Nothing else of the text changes.

    Args:
        text: The YAML text.
        mapping: Keys from the top to the mapping that holds ``path`` (it must exist).
        path: Keys below that mapping.
        value: The new value (a scalar, a list or a mapping, written in flow style).
        where: How messages name the mapping (default: its dotted keys).
        block: A missing key of a block mapping whose new value is a mapping is written as
            block mappings (one line per key of ``path`` and per item of ``value``, each item's
            value in flow style) instead of one flow line.
        comment: With ``block``, a comment (``# ...``) after the last key of ``path``.

    Raises:
        YamlEditError: the mapping is missing, or the value cannot be edited there.
    """
    where = where or ".".join(mapping)
    node = find(text, mapping)
    if not isinstance(node, MappingNode):
        raise YamlEditError(f"{where}: not a mapping in the text")
    return _edit_for(text, node, list(path), value, where, block, comment).apply(text)


def _top_level_end(lines: list[str], start: int, stop: int) -> int:
    """Where the entries of the section on line ``start`` end: before line ``stop`` (the next
    top-level key) and the blank lines and top-level comments just above it."""
    end = stop
    while end > start + 1 and (not lines[end - 1].strip() or lines[end - 1].startswith("#")):
        end -= 1
    return end


def append_entries(text: str, blocks: Mapping[str, Sequence[str]]) -> str:
    """``text`` with each block (an entry's indented text) appended at the end of its section.

    The sections are top-level keys, edited in the order of ``blocks``. A missing section is
    added at the end of the text; an empty one (``section: {}``, ``null`` or no value) becomes a
    block section. Comments and the layout of everything else are kept.

    Raises:
        YamlEditError: the text is not YAML, or a section is not a block mapping of entries.
    """
    for section, entries in blocks.items():
        if not entries:
            continue
        new = [line for block in entries for line in ["", *block.rstrip("\n").splitlines()]]
        found = child(compose(text), section)
        if found is None:
            lines = text.splitlines()
            while lines and not lines[-1].strip():
                lines.pop()
            text = "\n".join([*lines, "", f"{section}:", *new[1:]]) + "\n"
            continue
        value = found[1]
        empty = _is_null(value) or (isinstance(value, MappingNode) and not value.value)
        if not empty and not (isinstance(value, MappingNode) and not value.flow_style):
            raise YamlEditError(f"{section}: not a block mapping of entries; write its entries "
                                "as a block to have entries added")
        if empty:  # drop `{}` or `null`, keeping a comment after it
            before = text[: value.start_mark.index].rstrip(" ")
            text = before + text[value.end_mark.index:]
        root = compose(text)
        lines = text.splitlines()
        start = child(root, section)[0].start_mark.line
        later = [k.start_mark.line for k, _ in root.value if k.start_mark.line > start]
        end = _top_level_end(lines, start, later[0] if later else len(lines))
        lines[end:end] = new[1:] if end == start + 1 else new
        text = "\n".join(lines) + "\n"
    return text


def unified_patch(before: str, after: str, name: str = "repository.yaml") -> str:
    """A ``git apply``-able unified diff from ``before`` to ``after`` (empty when equal)."""
    return "".join(difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True),
        fromfile=f"a/{name}", tofile=f"b/{name}",
    ))
