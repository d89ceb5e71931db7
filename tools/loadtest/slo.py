"""Service-level objectives from ``loadtests/slo.yaml``: targets and the load they hold at.

A profile (``cpu``, ``gpu``) maps each scenario to its load (users or arrival rate) and, per
protocol, a P99 target, a maximum error ratio and a minimum throughput.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

from pydantic import Field, TypeAdapter, model_validator

from tools import paths
from tools.errors import UserInputError
from tools.loadtest.gate import Targets
from tools.typed_yaml import (
    InvalidFile,
    Omittable,
    PositiveInt,
    Problem,
    YamlSyntaxError,
    dotted,
    fail,
    read_yaml,
    strict,
    validate,
)

PROTOCOLS = ("http", "grpc")
DEFAULT_SLO_FILE = paths.SLO_FILE


@strict
class Load:
    """How a scenario is loaded when its SLO is checked (``users`` or ``rate`` is None)."""

    users: Omittable[PositiveInt] = Field(
        None,
        description="Closed loop: concurrent users, each sends, waits for the answer, sends "
        "again. Give exactly one of `users` and `rate`.",
    )
    rate: Omittable[Annotated[float, Field(ge=0.001)]] = Field(
        None,
        description="Open loop: arrival rate in requests per second. Give exactly one of `users` "
        "and `rate`.",
    )
    duration_s: float = Field(
        30.0,
        ge=1,
        description="Default measured seconds after the warm-up (`tools loadtest --duration`).",
    )
    warmup_s: float = Field(
        5.0, ge=0, description="Default seconds excluded at the start (`tools loadtest --warmup`)."
    )

    @model_validator(mode="after")
    def _one_kind(self) -> Load:
        if (self.users is None) == (self.rate is None):
            given = "both" if self.users is not None else "neither"
            raise fail("load_kind", f"must give exactly one of users or rate, got {given}")
        return self


@strict
class ProtocolTargets:
    """The targets of one scenario over one protocol, judged over the measured window."""

    p99_ms: float = Field(
        gt=0,
        description="Exact P99 latency (nearest rank over every successful request sent after "
        "the warm-up; no Locust rounding) must be ≤ this, in milliseconds.",
    )
    max_error_ratio: float = Field(
        ge=0, le=1, description="Failed / sent in the window must be ≤ this."
    )
    min_throughput_rps: float = Field(
        ge=0,
        description="Successful answers per second in the window must be ≥ this (in open loop "
        "the target is capped at 95% of the offered rate).",
    )


@strict
class ScenarioTargets:
    """One scenario in one profile: its load and its targets per protocol."""

    load: Load = Field(description="The load the targets hold at.")
    http: ProtocolTargets = Field(description="Targets over tritonclient HTTP.")
    grpc: ProtocolTargets = Field(description="Targets over tritonclient gRPC.")


@strict
class Profile:
    """The targets of every scenario on one kind of deployment."""

    scenarios: dict[Annotated[str, Field(title="scenario")], ScenarioTargets] = Field(
        description="Scenarios by name (the locustfile's scenario names)."
    )
    description: str = Field(
        "", description="What was measured, where, or that the numbers are estimates."
    )


@strict
class SLOYaml:
    """loadtests/slo.yaml: service-level objectives of the load-test scenarios, per profile."""

    profiles: dict[Annotated[str, Field(title="profile")], Profile] = Field(
        description="Profiles by name (`tools loadtest --slo-profile`), e.g. `cpu` and `gpu`."
    )


SLO_YAML = TypeAdapter(SLOYaml)


@dataclasses.dataclass(frozen=True)
class ScenarioSLO:
    """The load and the per-protocol targets of one scenario in one profile."""

    scenario: str
    profile: str
    load: Load
    targets: dict[str, Targets]


def problem_line(path: Path, problem: Problem) -> str:
    """``<file>:<line>:<column>: <field path> <problem>``, or ``...: <mapping>: missing <key>``."""
    at = problem.where(path)
    if problem.kind == "missing":
        return f"{at} {dotted(problem.loc[:-1]) or '(top level)'}: missing {problem.loc[-1]}"
    where = dotted(problem.loc)
    return f"{at} {where} {problem.text}" if where else f"{at} {problem.text}"


def load_slo(path: Path, profile: str, scenario: str) -> ScenarioSLO:
    """Read one scenario's SLO from an SLO file.

    Args:
        path: The YAML file (``loadtests/slo.yaml``).
        profile: ``cpu`` or ``gpu`` (any profile the file defines).
        scenario: Scenario name, e.g. ``text_embedding``.

    Raises:
        UserInputError: the file is missing or malformed (every problem of the file, one line
            each, naming the file and the field), or lacks the profile or scenario.
    """
    try:
        document = read_yaml(Path(path))
    except OSError as exc:
        raise UserInputError(f"SLO file {path}: {exc.strerror}") from exc
    except YamlSyntaxError as exc:
        raise UserInputError(f"SLO file {path} is not valid YAML: {exc}") from exc
    try:
        file = validate(SLO_YAML, document.data, document)
    except InvalidFile as exc:
        raise UserInputError("\n".join(problem_line(path, p) for p in exc.problems)) from None
    if profile not in file.profiles:
        have = ", ".join(sorted(file.profiles)) or "none"
        raise UserInputError(f"{path}: no profile {profile!r} (has: {have})")
    scenarios = file.profiles[profile].scenarios
    if scenario not in scenarios:
        raise UserInputError(
            f"{path}: profile {profile!r} has no scenario {scenario!r}"
            f" (has: {', '.join(sorted(scenarios)) or 'none'})"
        )
    entry = scenarios[scenario]
    targets = {}
    for protocol in PROTOCOLS:
        t: ProtocolTargets = getattr(entry, protocol)
        targets[protocol] = Targets(t.p99_ms, t.max_error_ratio, t.min_throughput_rps)
    return ScenarioSLO(scenario=scenario, profile=profile, load=entry.load, targets=targets)
