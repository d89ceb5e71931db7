"""Knob settings written into the spec's YAML text as a reviewable patch (``tools tune --write``).

Which spec key each knob is, and what the text holds for it; the edits themselves (comments and
layout kept) are ``tools/yaml_edit.py``'s. The result is read back and checked before it is used.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tools.tune.knobs import ModelKnobs
from tools.typed_yaml import YamlDocument, YamlSyntaxError
from tools.yaml_edit import YamlEditError, child, compose, set_value, unified_patch

# knob -> its path under a model entry of repository.yaml
PATHS = {
    "instances": ("instances", "cpu", "count"),
    "threads": ("instances", "cpu", "intra_op_threads"),
    "max_queue_delay_microseconds": ("dynamic_batching", "max_queue_delay_microseconds"),
    "preferred_batch_size": ("dynamic_batching", "preferred_batch_size"),
    "max_queue_size": ("dynamic_batching", "default_queue_policy", "max_queue_size"),
}
SECTIONS = ("models", "python_models")

__all__ = ["PATHS", "SECTIONS", "apply_settings", "read_back", "set_cpu_cores", "unified_patch"]


def _section_of(text: str, model: str) -> str:
    root = compose(text)
    for section in SECTIONS:
        found = child(root, section)
        if found is not None and child(found[1], model) is not None:
            return section
    raise YamlEditError(f"model {model!r} is not under {' or '.join(SECTIONS)}")


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
        YamlEditError: the text cannot be edited there, or reads back different.
    """
    if target != "cpu":
        raise YamlEditError("tools tune edits the cpu target's instances only")
    for model, knobs in settings.items():
        for knob, value in _wanted(text, model, (current or {}).get(model), knobs).items():
            entry = (_section_of(text, model), model)
            text = set_value(text, entry, PATHS[knob], value, f"model {model!r}")
    _check(text, settings)
    return text


def set_cpu_cores(text: str, cores: int) -> str:
    """``text`` with the top-level ``cpu_cores`` set to ``cores`` (added when missing)."""
    return set_value(text, (), ("cpu_cores",), cores, "the spec")


def read_back(text: str, model: str) -> dict[str, Any]:
    """The knob values ``text`` gives ``model`` (absent ones as None)."""
    data = YamlDocument(text).data or {}
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
        YamlDocument(text)
    except YamlSyntaxError as exc:
        raise YamlEditError(f"the edited spec is not valid YAML: {exc}") from exc
    for model, knobs in settings.items():
        got = read_back(text, model)
        for knob in PATHS:
            want = getattr(knobs, knob)
            have = got[knob]
            if knob == "preferred_batch_size":
                have = tuple(have or ())
            if want is not None and have is not None and have != want:
                raise YamlEditError(f"model {model!r}: {knob} reads back {have!r}, not {want!r}")
