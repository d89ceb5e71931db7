"""JSON Schemas of ``repository.yaml`` and ``loadtests/slo.yaml``, and docs tables made from them.

``scripts/generate_docs.py`` writes them all; tests fail when a committed copy is stale.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic.json_schema import JsonSchemaValue

from tools import paths
from tools.build_repo.spec import REPOSITORY_YAML
from tools.slo import SLO_YAML
from tools.typed_yaml import NAME_PATTERN, REFERENCE_PATTERN, json_schema

ROOT = paths.CHECKOUT
REGENERATE = "python scripts/generate_docs.py"
REPOSITORY_SCHEMA = "schemas/repository.schema.json"
SLO_SCHEMA = "schemas/slo.schema.json"
SPEC_DOC = "docs/spec.md"

# Generated block of docs/spec.md -> the schema definition it tables (None: the top level).
DOC_TABLES: dict[str, str | None] = {
    "top": None,
    "tensor": "PaddedTensorSpec",
    "models": "ModelSpec",
    "python_models": "PythonModelSpec",
    "pipelines": "PipelineSpec",
}
# Definitions documented in a section of their own: a field of that type links there.
_LINKS = {
    "ModelSpec": ("model", "#models"),
    "PythonModelSpec": ("python model", "#python_models"),
    "PipelineSpec": ("pipeline", "#pipelines"),
    "TensorSpec": ("tensor", "#tensor-entries"),
    "PaddedTensorSpec": ("tensor", "#tensor-entries"),
}
_PATTERNS = {NAME_PATTERN: "identifier", REFERENCE_PATTERN: "reference", r"^[^/]+$": "file name"}
_BLOCK = re.compile(
    r"(<!-- BEGIN GENERATED: (?P<name>[\w-]+) -->\n).*?(<!-- END GENERATED -->)", re.DOTALL
)


def repository_schema() -> JsonSchemaValue:
    """The JSON Schema of ``repository.yaml``."""
    return json_schema(REPOSITORY_YAML, "repository.yaml")


def slo_schema() -> JsonSchemaValue:
    """The JSON Schema of ``loadtests/slo.yaml``."""
    return json_schema(SLO_YAML, "slo.yaml")


def schema_text(schema: JsonSchemaValue) -> str:
    """A schema as committed: indented JSON, one trailing newline."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


# --------------------------------------------------------------------------- docs tables


def fill_blocks(text: str, tables: Mapping[str, Callable[[], str]], doc: str) -> str:
    """``text`` with every ``<!-- BEGIN GENERATED: name -->`` block replaced by ``tables[name]()``.

    Raises:
        ValueError: a block names no known table, or a known table has no block (naming ``doc``).
    """
    seen = set()

    def table(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in tables:
            raise ValueError(f"{doc}: unknown generated block {name!r} (known: {list(tables)})")
        seen.add(name)
        return match[1] + tables[name]() + match[3]

    out = _BLOCK.sub(table, text)
    missing = sorted(set(tables) - seen)
    if missing:
        raise ValueError(f"{doc}: no generated block for {missing}")
    return out


def spec_doc(text: str) -> str:
    """``docs/spec.md`` with every generated block replaced by the table the schema gives.

    Raises:
        ValueError: a block names no known table, or a known table has no block.
    """
    schema = repository_schema()

    def table(definition: str | None) -> Callable[[], str]:
        node = schema if definition is None else schema["$defs"][definition]
        return lambda: fields_table(node, schema, expand=definition is not None)

    return fill_blocks(text, {name: table(d) for name, d in DOC_TABLES.items()}, SPEC_DOC)


def fields_table(node: JsonSchemaValue, root: JsonSchemaValue, *, expand: bool = True) -> str:
    """A Markdown table of an object's fields: key, type, required, default, meaning.

    Args:
        node: The object's schema.
        root: The whole schema (``$defs``).
        expand: Also list the fields of nested mappings and list items (``a.b``, ``a[].b``).
    """
    lines = ["| key | type | req. | default | meaning |", "|---|---|---|---|---|"]
    for key, type_, required, default, meaning in _rows(node, root, "", expand):
        cells = [f"`{key}`", type_, required, default, meaning.replace("|", "\\|")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _rows(
    node: JsonSchemaValue, root: JsonSchemaValue, prefix: str, expand: bool
) -> list[tuple[str, ...]]:
    node = _deref(node, root)
    required = set(node.get("required", ()))
    rows = []
    for key, prop in node.get("properties", {}).items():
        path = prefix + key
        rows.append((path, _type(prop, root), "yes" if key in required else "no",
                     "" if key in required else _default(prop), description(prop, root)))
        if not expand:
            continue
        target = _deref(prop, root)
        if _is_nested(prop):
            rows += _rows(target, root, path + ".", expand)
        elif target.get("type") == "array" and _is_nested(target.get("items", {})):
            rows += _rows(target["items"], root, path + "[].", expand)
        elif target.get("type") == "object" and _is_nested(target.get("additionalProperties", {})):
            values = target["additionalProperties"]
            placeholder = f"{path}.<{target.get('propertyNames', {}).get('title', 'name')}>"
            rows.append((placeholder, "mapping", "", "", description(values, root)))
            rows += _rows(values, root, placeholder + ".", expand)
    return rows


def description(node: JsonSchemaValue, root: JsonSchemaValue) -> str:
    """A field's description; pydantic leaves it out when it equals its type's docstring."""
    return node.get("description") or _deref(node, root).get("description", "")


def _or_null(node: JsonSchemaValue) -> JsonSchemaValue:
    """The object of a field that may also be ``null`` (``typed_yaml.null_allowed``)."""
    options = node.get("anyOf", ()) if isinstance(node, dict) else ()
    refs = [o for o in options if "$ref" in o]
    if len(refs) == 1 and len(options) == 2 and {"type": "null"} in options:
        return refs[0]
    return node


def _is_nested(node: Any) -> bool:
    """A reference to an object documented inline (not in a section of its own)."""
    node = _or_null(node)
    return isinstance(node, dict) and "$ref" in node and _ref_name(node) not in _LINKS


def _ref_name(node: JsonSchemaValue) -> str:
    return node["$ref"].rsplit("/", 1)[-1]


def _deref(node: JsonSchemaValue, root: JsonSchemaValue) -> JsonSchemaValue:
    node = _or_null(node)
    while "$ref" in node:
        node = root["$defs"][_ref_name(node)]
    return node


def _type(node: JsonSchemaValue, root: JsonSchemaValue) -> str:
    """A short, readable type: ``int > 0``, ``list of identifier``, ``mapping name → string``."""
    if "$ref" in node:
        if _ref_name(node) in _LINKS:
            label, anchor = _LINKS[_ref_name(node)]
            return f"[{label}]({anchor})"
        return "mapping"
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    if "anyOf" in node:
        return " \\| ".join(_type(n, root) for n in node["anyOf"])
    kind = node.get("type")
    if kind in ("integer", "number"):
        return ("int" if kind == "integer" else "number") + _range(node)
    if kind == "string":
        return _PATTERNS.get(node.get("pattern", ""), "string")
    if kind == "boolean":
        return "bool"
    if kind == "array":
        item = _type(node.get("items", {}), root)
        link = re.fullmatch(r"\[(\w+)\]\((#[\w-]+)\)", item)
        item = f"[{link[1]}s]({link[2]})" if link else item
        head = "non-empty list" if node.get("minItems") else "list"
        if "prefixItems" in node:
            first = ", ".join(f"`{p['const']}`" for p in node["prefixItems"])
            return f"{head}: {first}, then {item}"
        return f"{head} of {item}"
    if kind == "object":
        values = node.get("additionalProperties")
        if isinstance(values, dict):
            key = node.get("propertyNames", {}).get("title", "name")
            return f"mapping {key} → {_type(values, root)}"
        return "mapping"
    if kind == "null":
        return "`null`"
    return "any"


def _range(node: JsonSchemaValue) -> str:
    low, high = node.get("minimum"), node.get("maximum")
    if node.get("exclusiveMinimum") == 0:
        return " > 0"
    if low is not None and high is not None:
        return f" {low:g}..{high:g}"
    if low is not None:
        return f" ≥ {low:g}"
    if high is not None:
        return f" ≤ {high:g}"
    return ""


def _default(node: JsonSchemaValue) -> str:
    if "default" not in node:
        return "none"
    value = node["default"]
    if isinstance(value, dict):
        return "`{}`" if not value else "all defaults"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{json.dumps(value)}`" if isinstance(value, list) else f"`{value}`"


# --------------------------------------------------------------------------- files


def generated(root: Path = ROOT) -> dict[Path, str]:
    """Every generated file under ``root`` with the content the models give it now."""
    return {
        root / REPOSITORY_SCHEMA: schema_text(repository_schema()),
        root / SLO_SCHEMA: schema_text(slo_schema()),
        root / SPEC_DOC: spec_doc((root / SPEC_DOC).read_text(encoding="utf-8")),
    }


def stale(root: Path = ROOT, files: Mapping[Path, str] | None = None) -> list[Path]:
    """The generated files (``files``, default ``generated(root)``) whose committed content
    differs from what they are generated from."""
    return [
        path for path, text in (generated(root) if files is None else files).items()
        if not path.is_file() or path.read_text(encoding="utf-8") != text
    ]


def write_schemas(root: Path = ROOT, files: Mapping[Path, str] | None = None) -> list[Path]:
    """Write the JSON Schemas and the docs tables made from them (``files``, default
    ``generated(root)``); returns the files that changed."""
    changed = []
    for path, text in (generated(root) if files is None else files).items():
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed
