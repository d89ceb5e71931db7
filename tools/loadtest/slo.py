"""Service-level objectives from ``loadtests/slo.yaml``: targets and the load they hold at.

A profile (``cpu``, ``gpu``) maps each scenario to its load (users or arrival rate) and, per
protocol, a P99 target, a maximum error ratio and a minimum throughput.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tools.errors import UserInputError
from tools.loadtest.gate import Targets

PROTOCOLS = ("http", "grpc")
DEFAULT_SLO_FILE = Path(__file__).resolve().parents[2] / "loadtests" / "slo.yaml"
_TARGET_FIELDS = {"p99_ms", "max_error_ratio", "min_throughput_rps"}
_LOAD_FIELDS = {"users", "rate", "duration_s", "warmup_s"}


@dataclass(frozen=True)
class Load:
    """How a scenario is loaded when its SLO is checked.

    Attributes:
        users: Closed-loop concurrent users (each waits for its response), or None.
        rate: Open-loop arrival rate in requests per second, or None.
        duration_s: Measured seconds after the warm-up.
        warmup_s: Seconds excluded at the start.
    """

    users: int | None
    rate: float | None
    duration_s: float
    warmup_s: float


@dataclass(frozen=True)
class ScenarioSLO:
    """The load and the per-protocol targets of one scenario in one profile."""

    scenario: str
    profile: str
    load: Load
    targets: dict[str, Targets]


def _number(value: Any, where: str, *, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise UserInputError(f"{where} must be a number >= {minimum:g}, got {value!r}")
    return float(value)


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UserInputError(f"{where} must be a mapping, got {type(value).__name__}")
    return value


def load_slo(path: Path, profile: str, scenario: str) -> ScenarioSLO:
    """Read one scenario's SLO from an SLO file.

    Args:
        path: The YAML file (``loadtests/slo.yaml``).
        profile: ``cpu`` or ``gpu`` (any profile the file defines).
        scenario: Scenario name, e.g. ``text_embedding``.

    Raises:
        UserInputError: the file is missing or malformed, or lacks the profile or scenario;
            the message names the file and the field.
    """
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserInputError(f"SLO file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise UserInputError(f"SLO file {path} is not valid YAML: {exc}") from exc
    profiles = _mapping(_mapping(data, f"{path}").get("profiles"), f"{path}: profiles")
    if profile not in profiles:
        raise UserInputError(
            f"{path}: no profile {profile!r} (has: {', '.join(sorted(profiles))})"
        )
    scenarios = _mapping(
        _mapping(profiles[profile], f"{path}: profiles.{profile}").get("scenarios"),
        f"{path}: profiles.{profile}.scenarios",
    )
    if scenario not in scenarios:
        raise UserInputError(
            f"{path}: profile {profile!r} has no scenario {scenario!r}"
            f" (has: {', '.join(sorted(scenarios))})"
        )
    where = f"{path}: profiles.{profile}.scenarios.{scenario}"
    entry = _mapping(scenarios[scenario], where)
    load_raw = _mapping(entry.get("load"), f"{where}.load")
    unknown = set(load_raw) - _LOAD_FIELDS
    if unknown:
        raise UserInputError(f"{where}.load: unknown field(s) {', '.join(sorted(unknown))}")
    users = load_raw.get("users")
    rate = load_raw.get("rate")
    if (users is None) == (rate is None):
        raise UserInputError(f"{where}.load: give exactly one of users or rate")
    load = Load(
        users=int(_number(users, f"{where}.load.users", minimum=1)) if users is not None else None,
        rate=_number(rate, f"{where}.load.rate", minimum=0.001) if rate is not None else None,
        duration_s=_number(load_raw.get("duration_s", 30), f"{where}.load.duration_s", minimum=1),
        warmup_s=_number(load_raw.get("warmup_s", 5), f"{where}.load.warmup_s"),
    )
    targets = {}
    for protocol in PROTOCOLS:
        raw = _mapping(entry.get(protocol), f"{where}.{protocol}")
        missing = _TARGET_FIELDS - set(raw)
        extra = set(raw) - _TARGET_FIELDS
        if missing or extra:
            detail = []
            if missing:
                detail.append(f"missing {', '.join(sorted(missing))}")
            if extra:
                detail.append(f"unknown {', '.join(sorted(extra))}")
            raise UserInputError(f"{where}.{protocol}: {'; '.join(detail)}")
        ratio = _number(raw["max_error_ratio"], f"{where}.{protocol}.max_error_ratio")
        if ratio > 1:
            raise UserInputError(f"{where}.{protocol}.max_error_ratio must be <= 1, got {ratio}")
        targets[protocol] = Targets(
            p99_ms=_number(raw["p99_ms"], f"{where}.{protocol}.p99_ms", minimum=1e-9),
            max_error_ratio=ratio,
            min_throughput_rps=_number(
                raw["min_throughput_rps"], f"{where}.{protocol}.min_throughput_rps"
            ),
        )
    return ScenarioSLO(scenario=scenario, profile=profile, load=load, targets=targets)
