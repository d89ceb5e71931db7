"""The scenario a Locust process sends: ``--scenario`` of ``--spec`` (and ``--data``).

Built once per process by ``tools.load.scenario`` from the spec's typed inputs, so any pipeline
or model of the spec can be loaded; a worker builds it from the options its master sent.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from tools import paths
from tools.errors import UserInputError
from tools.load.scenario import Scenario, load_scenario

DEFAULT_SPEC = paths.SPEC_FILE


def add_arguments(group: Any) -> None:
    """The locustfile's options that choose the scenario."""
    group.add_argument("--scenario", default="",
                       help="Pipeline or model of --spec to load (default: the user class's).")
    group.add_argument("--spec", default=str(DEFAULT_SPEC), help="The repository spec.")
    group.add_argument("--data", default="",
                       help="Texts (one per line), a folder of images, or JSON lines (one "
                       "request per line) instead of the shipped payloads.")


def name_of(options: Any, default: str = "") -> str:
    """The scenario name the options (or the user class's default) choose.

    Raises:
        UserInputError: neither gives one.
    """
    name = getattr(options, "scenario", "") or default
    if not name:
        raise UserInputError("--scenario: name the pipeline or model to load")
    return name


def chosen(options: Any, default: str = "") -> Scenario:
    """The scenario of the options, built once per process."""
    data = getattr(options, "data", "") or ""
    spec = getattr(options, "spec", "") or str(DEFAULT_SPEC)
    return _build(str(Path(spec).resolve()), name_of(options, default), data)


@functools.lru_cache(maxsize=8)
def _build(spec: str, name: str, data: str) -> Scenario:
    return load_scenario(Path(spec), name, Path(data) if data else None)
