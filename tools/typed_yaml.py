"""Strict, typed reading of the project's YAML files (pydantic), and their JSON Schemas.

A file is read with ruamel.yaml's round-trip loader, which keeps where every key and value is;
validation collects every problem of a file as a ``Problem`` with its line and column, and each
file's module words the lines (``repository.yaml:12:7: ...``).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import difflib
import functools
import json
import re
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml as pyyaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError
from ruamel.yaml.resolver import VersionedResolver
from ruamel.yaml.scalarbool import ScalarBoolean

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    PlainValidator,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
)
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue, NoDefault
from pydantic_core import PydanticCustomError, core_schema

T = TypeVar("T")

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
REFERENCE_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"

# Strict types (no "1" for 1, no true for 1) and no key the model does not declare. Files are
# validated as the JSON they load to, which is what the exported JSON Schema describes.
CONFIG = ConfigDict(strict=True, extra="forbid")


def strict(cls: type[T]) -> type[T]:
    """Make ``cls`` a frozen pydantic dataclass that rejects unknown keys and loose types.

    A pydantic dataclass is a real dataclass: ``dataclasses.asdict`` works on it.
    """
    return pydantic_dataclass(frozen=True, config=CONFIG)(cls)


def fail(kind: str, text: str) -> PydanticCustomError:
    """A pydantic error whose message is ``text`` as written (no template placeholders)."""
    return PydanticCustomError(kind, "{text}", {"text": text})


def _not_null(value: Any, info: ValidationInfo) -> Any:
    if value is None and info.mode == "json":
        raise fail("not_null", "must not be null: leave the key out instead")
    return value


# A key that may be left out (the field is then None) but not written as `null`: defaults are
# not validated, so the check runs only on a value the file gives (files are validated as JSON;
# a copy made in Python, `dataclasses.replace`, may pass None). The schema omits the null.
Omittable = Annotated[T | None, AfterValidator(_not_null)]


def null_allowed(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` of a field whose ``null`` means something (not an ``Omittable``):
    the schema, which drops every null, says ``null`` is allowed there."""
    ref = {k: schema.pop(k) for k in ("$ref", "type", "properties") if k in schema}
    schema["anyOf"] = [ref, {"type": "null"}]

Identifier = Annotated[str, Field(pattern=NAME_PATTERN)]
Reference = Annotated[str, Field(pattern=REFERENCE_PATTERN)]
PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]


def _number(value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail("number_type", f"must be a number, got {show(value)}")
    return value


# An integer stays an integer (it may be rendered into a config), a float stays a float.
Number = Annotated[int | float, PlainValidator(_number, json_schema_input_type=float)]


def non_empty(items: tuple[T, ...]) -> tuple[T, ...]:
    """An ``AfterValidator`` for a list that must not be empty.

    Not ``Field(min_length=1)``: pydantic also reports that one when an item is invalid.
    """
    if not items:
        raise fail("empty", "must not be empty")
    return items


# --------------------------------------------------------------------------- reading


class _PyYamlResolver(VersionedResolver):
    """Plain scalars typed as PyYAML types them (YAML 1.1 without ``y``/``n`` booleans and without
    floats that lack a dot), so a file means what it meant before and to the project's other
    readers (``yaml.safe_load``): ``1e-3`` stays a string, ``yes`` a boolean."""

    @property
    def versioned_resolver(self) -> Any:
        return pyyaml.resolver.Resolver.yaml_implicit_resolvers


def round_trip_yaml() -> YAML:
    """ruamel.yaml's round-trip loader, resolving scalars as PyYAML does."""
    parser = YAML(typ="rt")
    parser.Resolver = _PyYamlResolver
    parser.version = (1, 1)  # octal 010 and sexagesimal 1:30 constructed as YAML 1.1 (PyYAML) does
    return parser


class YamlSyntaxError(Exception):
    """The text is not YAML; ``line`` and ``column`` (1-based) say where the parser stopped."""

    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(f"{line}:{column}: {message}")
        self.message, self.line, self.column = message, line, column


def _plain(value: Any) -> Any:
    """ruamel.yaml's round-trip types as the plain types a JSON document holds."""
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, ScalarBoolean):  # an anchored boolean: an int subclass
        return bool(value)
    for kind in (bool, str, int, float):  # bool before int; ruamel's scalars subclass these
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, datetime.datetime):  # ruamel's TimeStamp
        return datetime.datetime.fromisoformat(value.isoformat())
    return value


class YamlDocument:
    """A YAML text as plain data, and the line and column of each of its keys and values."""

    def __init__(self, text: str) -> None:
        """Parse ``text``.

        Raises:
            YamlSyntaxError: the text is not YAML (also: a key given twice in one mapping).
        """
        try:
            self._root = round_trip_yaml().load(text)
        except MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            what = exc.problem or exc.context or "not YAML"
            raise YamlSyntaxError(str(what).split("\n")[0], mark.line + 1 if mark else 1,
                                  mark.column + 1 if mark else 1) from None
        self.data = _plain(self._root)

    def position(self, loc: tuple[str | int, ...], kind: str = "invalid") -> tuple[int, int]:
        """Line and column (1-based) of the field at ``loc``.

        A value's own position for a scalar or list item, its key's for a mapping or list value,
        a key's for an unknown key or a ``[key]`` problem; for a missing field, the key of the
        mapping that should hold it.
        """
        node: Any = self._root
        where = (node.lc.line, node.lc.col) if _collection(node) else (0, 0)
        for index, part in enumerate(loc):
            if part == "[key]":
                break
            last = index == len(loc) - 1
            if isinstance(node, CommentedMap):
                key = next((k for k in node if str(k) == str(part)), _ABSENT)
                if key is _ABSENT:
                    break
                where = node.lc.key(key)
                if last and kind != "unknown" and not _collection(node[key]):
                    where = node.lc.value(key)
                node = node[key]
            elif isinstance(node, CommentedSeq) and isinstance(part, int) and 0 <= part < len(node):
                where, node = node.lc.item(part), node[part]
            else:
                break
        return where[0] + 1, where[1] + 1

    def __repr__(self) -> str:
        return f"YamlDocument({self.data!r})"


_ABSENT = object()


def _collection(node: Any) -> bool:
    return isinstance(node, (CommentedMap, CommentedSeq))


def read_yaml(path: Path) -> YamlDocument:
    """Read and parse a YAML file (``OSError`` and ``YamlSyntaxError`` are the caller's to word)."""
    return YamlDocument(Path(path).read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- problems


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong in a file.

    Attributes:
        loc: Keys and list indices from the top of the file to the field; ``"[key]"`` last when
            the mapping key itself is wrong.
        text: What is wrong, e.g. ``must be an integer, got 'sixteen'``.
        kind: ``missing`` (a required key), ``unknown`` (a key no model declares) or ``invalid``.
        line: Where in the file (1-based), when the file was read as a ``YamlDocument``.
        column: See ``line``.
    """

    loc: tuple[str | int, ...]
    text: str
    kind: str = "invalid"
    line: int | None = None
    column: int | None = None

    def where(self, path: Path | str) -> str:
        """``<file>:<line>:<column>:``, or ``<file>:`` when the position is not known."""
        return f"{path}:{self.line}:{self.column}:" if self.line is not None else f"{path}:"


class InvalidFile(Exception):
    """Raised by ``validate`` with every problem of the file; callers word them per file."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__(f"{len(problems)} problem(s)")
        self.problems = problems


class Rules:
    """Cross-field problems of one object, raised together from a pydantic validator.

    Pydantic keeps one error per validator; this one carries every problem (each with its own
    location below the validated object), and ``validate`` unpacks them into ``Problem``\\ s.
    """

    def __init__(self) -> None:
        self._problems: list[tuple[tuple[str | int, ...], str]] = []

    def add(self, loc: tuple[str | int, ...], text: str) -> None:
        """Record that the field at ``loc`` (relative to the validated object) has a problem."""
        self._problems.append((loc, text))

    def raise_any(self) -> None:
        """Raise the recorded problems, if any, as one pydantic error."""
        if self._problems:
            context = {"count": len(self._problems), "problems": tuple(self._problems)}
            raise PydanticCustomError("rules", "{count} problem(s)", context)


def show(value: Any) -> str:
    """A short ``repr`` of an input value for a message."""
    text = repr(list(value) if isinstance(value, tuple) else value)
    return text if len(text) <= 80 else text[:77] + "..."


def unknown_key(key: str, known: list[str] | tuple[str, ...], what: str = "a known field") -> str:
    """``is not a known field; did you mean 'x'?`` (or the allowed keys when none is close)."""
    close = difflib.get_close_matches(str(key), list(known), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f" (allowed: {sorted(known)})"
    return f"is not {what}{hint}"


def dotted(loc: tuple[str | int, ...]) -> str:
    """``('outputs', 0, 'dtype')`` as ``outputs[0].dtype`` (the ``[key]`` marker dropped)."""
    out = ""
    for part in loc:
        if part == "[key]":
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# YAML 1.1 (PyYAML) reads a float with an exponent only with a dot and a signed exponent.
_YAML_EXPONENT = re.compile(r"^([-+]?\d+)(\.\d*)?[eE]([-+]?)(\d+)$")
_PATTERN_NAMES = {
    NAME_PATTERN: "an identifier",
    REFERENCE_PATTERN: "a reference 'package.module:function'",
}


def _text(error: dict[str, Any]) -> str:
    """The wording of one pydantic error."""
    kind, ctx, value = error["type"], error.get("ctx", {}), error.get("input")
    got = f", got {show(value)}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return "must be an integer" + got
    if kind in ("float_type", "float_parsing"):
        exponent = _YAML_EXPONENT.match(value) if isinstance(value, str) else None
        if exponent:
            mantissa, fraction, sign, power = exponent.groups()
            fraction = fraction if fraction and len(fraction) > 1 else ".0"
            return (f"must be a number, got the string {value!r} (YAML needs a dot and a signed "
                    f"exponent: write {mantissa}{fraction}e{sign or '+'}{power})")
        return "must be a number" + got
    simple = {
        "string_type": "must be a string",
        "bool_type": "must be true or false",
        "list_type": "must be a list",
        "tuple_type": "must be a list",
        "dict_type": "must be a mapping",
        "dataclass_type": "must be a mapping",
        "dataclass_exact_type": "must be a mapping",
        "model_type": "must be a mapping",
    }
    if kind in simple:
        return simple[kind] + got
    if kind == "literal_error":
        return f"must be {ctx['expected']}{got}"
    if kind == "greater_than":
        return ("must be positive" if ctx["gt"] == 0 else f"must be > {ctx['gt']}") + got
    if kind == "greater_than_equal":
        return ("must be zero or positive" if ctx["ge"] == 0 else f"must be >= {ctx['ge']}") + got
    if kind == "less_than_equal":
        return f"must be <= {ctx['le']}{got}"
    if kind == "less_than":
        return f"must be < {ctx['lt']}{got}"
    if kind == "string_pattern_mismatch":
        return f"must be {_PATTERN_NAMES.get(ctx['pattern'], 'match ' + ctx['pattern'])}{got}"
    return error["msg"]  # the project's own errors are already worded


# --------------------------------------------------------------------------- validation


def validate(adapter: TypeAdapter[T], data: Any, document: YamlDocument | None = None,
             extra: list[Problem] | None = None) -> T:
    """Validate a loaded YAML document strictly, collecting every problem.

    Args:
        adapter: The ``TypeAdapter`` of the file's top-level type.
        data: The document as plain data (``YamlDocument.data``, or what ``yaml.safe_load`` gave).
        document: Where each key and value is: every problem then carries its line and column.
        extra: Problems the caller found in ``data`` before validating (and took out of it),
            reported with the others.

    Raises:
        InvalidFile: with one ``Problem`` per thing wrong (all of them, not the first).
    """
    problems = _not_json(data, ())
    if not problems:
        try:
            result = adapter.validate_json(json.dumps(data))
        except ValidationError as exc:
            problems = _problems(exc, adapter)
        else:
            if not extra:
                return result
    problems += extra or []
    if document is not None:
        problems = [dataclasses.replace(p, line=line, column=column)
                    for p in problems for line, column in [document.position(p.loc, p.kind)]]
    raise InvalidFile(problems)


def _not_json(value: Any, loc: tuple[str | int, ...]) -> list[Problem]:
    """Keys and values YAML produced that JSON (and so the schema) cannot hold."""
    if isinstance(value, dict):
        problems = []
        for key, item in value.items():
            if not isinstance(key, str):
                text = f"must be a string key, got {key!r} (quote it in the YAML)"
                problems.append(Problem((*loc, str(key), "[key]"), text))
            problems += _not_json(item, (*loc, str(key)))
        return problems
    if isinstance(value, list):
        return [p for i, item in enumerate(value) for p in _not_json(item, (*loc, i))]
    if value is None or isinstance(value, (str, bool, int, float)):
        return []
    kind = type(value).__name__
    return [Problem(loc, f"is a YAML {kind} ({value!s}); quote it to make it a string")]


def _problems(exc: ValidationError, adapter: TypeAdapter[Any]) -> list[Problem]:
    problems = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        if error["type"] == "rules":
            problems += [Problem((*loc, *sub), text) for sub, text in error["ctx"]["problems"]]
        elif error["type"] in ("missing", "missing_argument"):
            problems.append(Problem(loc, "is required", "missing"))
        elif error["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
            problems.append(unknown_field(adapter, loc))
        else:
            problems.append(Problem(loc, _text(error)))
    return problems


def unknown_field(adapter: TypeAdapter[Any], loc: tuple[str | int, ...]) -> Problem:
    """The problem of a key at ``loc`` that the file's type does not declare, with the closest
    key it does declare."""
    known = known_keys(_schema(adapter), loc[:-1])
    return Problem(loc, unknown_key(str(loc[-1]), known), "unknown")


def known_keys(schema: JsonSchemaValue, loc: tuple[str | int, ...]) -> list[str]:
    """The keys the schema declares for the mapping at ``loc``."""
    node = _resolve(schema, schema)
    for part in loc:
        if isinstance(part, int):
            node = node.get("items", {})
        elif part in node.get("properties", {}):
            node = node["properties"][part]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return []
        node = _resolve(node, schema)
    return list(node.get("properties", {}))


def _resolve(node: JsonSchemaValue, root: JsonSchemaValue) -> JsonSchemaValue:
    while "$ref" in node:
        node = root["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    return node


# --------------------------------------------------------------------------- JSON Schema


@functools.cache
def _schema(adapter: TypeAdapter[Any]) -> JsonSchemaValue:
    return adapter.json_schema(schema_generator=_SchemaGenerator)


class _SchemaGenerator(GenerateJsonSchema):
    """Pydantic's generator, tuned for editors and for the generated docs tables.

    No per-field titles (the key is the title). Defaults from factories shown; ``None`` defaults
    and ``null`` (an ``Omittable`` key) not. A mapping's key constraints become ``propertyNames``
    (with the title the docs use as the key's ``<placeholder>``) and its values
    ``additionalProperties``, so a key that does not match is refused, as the parser does.
    """

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        if "default_factory" in schema and not schema.get("default_factory_takes_data"):
            value = schema["default_factory"]()  # type: ignore[call-arg]
        else:
            value = schema.get("default", NoDefault)
        return NoDefault if value is None else value

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])  # `Omittable`: null is refused

    def dict_schema(self, schema: core_schema.DictSchema) -> JsonSchemaValue:
        keys = dict(self.generate_inner(schema["keys_schema"])) if "keys_schema" in schema else {}
        values = {}
        if "values_schema" in schema:
            values = dict(self.generate_inner(schema["values_schema"]))
        out: JsonSchemaValue = {"type": "object", "additionalProperties": values or True}
        keys.pop("type", None)
        if keys:
            out["propertyNames"] = keys
        return out


def json_schema(adapter: TypeAdapter[Any], title: str) -> JsonSchemaValue:
    """The JSON Schema (draft 2020-12) of a file's top-level type, titled with the file's name."""
    schema = copy.deepcopy(_schema(adapter))
    head = {"$schema": JSON_SCHEMA_DIALECT, "title": title}
    return {**head, **{k: v for k, v in schema.items() if k not in head}}

