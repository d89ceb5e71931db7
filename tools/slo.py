"""Service-level objectives from ``loadtests/slo.yaml``: targets and the load they hold at.

A profile (``cpu``, ``gpu``) maps each scenario to its load (users or arrival rate) and, per
protocol, a P99 target, a maximum error ratio and an optional minimum throughput. ``tools add``
writes the entry of a new pipeline (``plan_new_scenario``), keeping the file's comments.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Annotated

from pydantic import Field, TypeAdapter, model_validator

from tools import paths
from tools.errors import UserInputError
from tools.yaml_edit import YamlEditError, block_lines, find, set_value
from tools.typed_yaml import (
    InvalidFile,
    Omittable,
    PositiveInt,
    Problem,
    YamlSyntaxError,
    dotted,
    fail,
    YamlDocument,
    strict,
    validate,
)

PROTOCOLS = ("http", "grpc")
DEFAULT_SLO_FILE = paths.SLO_FILE


@dataclasses.dataclass(frozen=True)
class Targets:
    """Service-level objectives of one scenario and protocol (no throughput target: None)."""

    p99_ms: float
    max_error_ratio: float
    min_throughput_rps: float | None = None


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
    min_throughput_rps: Omittable[Annotated[float, Field(ge=0)]] = Field(
        None,
        description="Successful answers per second in the window must be ≥ this (in open loop "
        "the target is capped at 95% of the offered rate). Left out: throughput is reported, "
        "not gated (what `tools add` writes until you measure and set one).",
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
    """The load and the per-protocol targets of one scenario in one profile.

    Attributes:
        source: Where the targets come from: the SLO file, or the command line (``--p99-ms``).
    """

    scenario: str
    profile: str
    load: Load
    targets: dict[str, Targets]
    source: str = ""


class NoScenarioSLO(UserInputError):
    """The SLO file is missing, or has no entry for the scenario in the profile."""


# The load of a scenario the SLO file has no entry for (``--p99-ms`` alone).
DEFAULT_LOAD = Load(users=4, duration_s=30.0, warmup_s=5.0)
# What `tools add` writes for a new pipeline: a generous start (the shipped text pipeline's P99
# target is 600 ms at 8 users here), no error allowed, throughput left for the user to measure.
NEW_P99_MS = 1000.0
NEW_MAX_ERROR_RATIO = 0.0
NEW_PROFILE = "cpu"


def problem_line(path: Path, problem: Problem) -> str:
    """``<file>:<line>:<column>: <field path> <problem>``, or ``...: <mapping>: missing <key>``."""
    at = problem.where(path)
    if problem.kind == "missing":
        return f"{at} {dotted(problem.loc[:-1]) or '(top level)'}: missing {problem.loc[-1]}"
    where = dotted(problem.loc)
    return f"{at} {where} {problem.text}" if where else f"{at} {problem.text}"


def _parse(text: str, path: Path) -> SLOYaml:
    try:
        document = YamlDocument(text)
    except YamlSyntaxError as exc:
        raise UserInputError(f"SLO file {path} is not valid YAML: {exc}") from exc
    try:
        return validate(SLO_YAML, document.data, document)
    except InvalidFile as exc:
        raise UserInputError("\n".join(problem_line(path, p) for p in exc.problems)) from None


def _read(path: Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise NoScenarioSLO(f"SLO file {path}: {exc.strerror}") from exc
    except OSError as exc:
        raise UserInputError(f"SLO file {path}: {exc.strerror}") from exc


def load_slo(path: Path, profile: str, scenario: str) -> ScenarioSLO:
    """Read one scenario's SLO from an SLO file.

    Args:
        path: The YAML file (``loadtests/slo.yaml``).
        profile: ``cpu`` or ``gpu`` (any profile the file defines).
        scenario: Scenario name, e.g. ``text_embedding``.

    Raises:
        NoScenarioSLO: the file does not exist, or lacks the profile or scenario.
        UserInputError: the file is malformed (every problem of the file, one line each, naming
            the file and the field).
    """
    file = _parse(_read(path), path)
    if profile not in file.profiles:
        have = ", ".join(sorted(file.profiles)) or "none"
        raise NoScenarioSLO(f"{path}: no profile {profile!r} (has: {have})")
    scenarios = file.profiles[profile].scenarios
    if scenario not in scenarios:
        raise NoScenarioSLO(
            f"{path}: profile {profile!r} has no scenario {scenario!r}"
            f" (has: {', '.join(sorted(scenarios)) or 'none'})"
        )
    entry = scenarios[scenario]
    targets = {}
    for protocol in PROTOCOLS:
        t: ProtocolTargets = getattr(entry, protocol)
        targets[protocol] = Targets(t.p99_ms, t.max_error_ratio, t.min_throughput_rps)
    return ScenarioSLO(scenario=scenario, profile=profile, load=entry.load, targets=targets,
                       source=str(path))


def scenario_slo(path: Path, profile: str, scenario: str, *, p99_ms: float | None = None,
                 max_error_ratio: float | None = None) -> ScenarioSLO:
    """The scenario's SLO with targets given on the command line over the file's.

    ``p99_ms`` alone is enough for a scenario the file has no entry for: error ratio
    ``max_error_ratio`` (default 0), no throughput target, load ``DEFAULT_LOAD``.

    Raises:
        NoScenarioSLO: no entry and no ``p99_ms`` (naming the file and the way out).
        UserInputError: the file is malformed.
    """
    try:
        slo = load_slo(path, profile, scenario)
    except NoScenarioSLO as exc:
        if p99_ms is None:
            raise NoScenarioSLO(f"{exc}; add one (tools add writes it for a new pipeline) or "
                                f"give --p99-ms") from None
        ratio = NEW_MAX_ERROR_RATIO if max_error_ratio is None else max_error_ratio
        targets = {p: Targets(p99_ms, ratio, None) for p in PROTOCOLS}
        return ScenarioSLO(scenario, profile, DEFAULT_LOAD, targets, "--p99-ms")
    if p99_ms is None and max_error_ratio is None:
        return slo
    targets = {
        p: dataclasses.replace(t, p99_ms=t.p99_ms if p99_ms is None else p99_ms,
                               max_error_ratio=t.max_error_ratio if max_error_ratio is None
                               else max_error_ratio)
        for p, t in slo.targets.items()
    }
    return dataclasses.replace(slo, targets=targets, source=f"{slo.source} and the command line")


def slo_file_for(spec_path: Path) -> Path:
    """The SLO file of a spec: ``loadtests/slo.yaml`` beside it (this project's layout), else
    ``slo.yaml`` beside it (also where a new one goes)."""
    folder = Path(spec_path).resolve().parent
    nested = folder / "loadtests" / "slo.yaml"
    return nested if nested.is_file() else folder / "slo.yaml"


def default_slo_file(spec_path: Path) -> Path:
    """``slo_file_for(spec_path)`` when it exists, else this project's ``loadtests/slo.yaml``."""
    found = slo_file_for(spec_path)
    return found if found.is_file() else DEFAULT_SLO_FILE


# --------------------------------------------------------------------------- a new entry


@dataclasses.dataclass(frozen=True)
class PlannedSLO:
    """An SLO entry ready to be written (``text`` None: the file has it already).

    Attributes:
        path: The SLO file.
        text: Its new text, comments and layout kept.
        line: What to tell the user.
    """

    path: Path
    text: str | None
    line: str

    def write(self) -> str:
        """Write the file (atomically) when it changes; the line for the user."""
        if self.text is not None:
            from tools.files import write_atomically

            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self.path, self.text)
        return self.line


def _plain(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def new_entry() -> dict:
    """The SLO entry of a pipeline just added: a P99 and an error ratio per protocol."""
    targets = {"p99_ms": _plain(NEW_P99_MS), "max_error_ratio": NEW_MAX_ERROR_RATIO}
    return {"load": {"users": DEFAULT_LOAD.users, "duration_s": _plain(DEFAULT_LOAD.duration_s),
                     "warmup_s": _plain(DEFAULT_LOAD.warmup_s)},
            "http": dict(targets), "grpc": dict(targets)}


_NEW_ENTRY_COMMENT = "# tools add: a start; measure (tools loadtest), set yours, min_throughput_rps"


def _new_file(path: Path, profile: str, name: str, entry: dict) -> str:
    schema = Path(os.path.relpath(paths.SCHEMAS / "slo.schema.json", path.parent)).as_posix()
    head = "\n".join([
        f"# yaml-language-server: $schema={schema}",
        "# Service-level objectives of `tools loadtest` and `tools tune`, per profile and scenario",
        "# (what each field means: loadtests/slo.yaml of triton-forge).",
        "profiles:",
        f"  {profile}:",
        "    scenarios:",
    ])
    return "\n".join([head, *block_lines([name], entry, 6, _NEW_ENTRY_COMMENT)]) + "\n"


def _with_entry(text: str, path: Path, profile: str, name: str, entry: dict) -> str:
    """``text`` with ``entry`` as the last scenario of ``profile`` (added when missing)."""
    has_profile = find(text, ("profiles", profile)) is not None
    mapping, keys = (("profiles", profile, "scenarios"), (name,)) if has_profile else \
        (("profiles",), (profile, "scenarios", name))
    try:
        return set_value(text, mapping, keys, entry, block=True, comment=_NEW_ENTRY_COMMENT)
    except YamlEditError as exc:
        raise UserInputError(f"{path}: cannot add scenario {name!r} to profile {profile!r} "
                             f"here ({exc}); add it by hand") from None


def plan_new_scenario(path: Path, name: str, profile: str = NEW_PROFILE) -> PlannedSLO:
    """The SLO file with an entry for the new pipeline ``name`` (``new_entry``), not yet written.

    An existing entry is kept as it is; a missing file is created. The new text is read back
    through the SLO model before it is returned.

    Raises:
        UserInputError: the existing file is malformed, or laid out so that the entry cannot be
            placed (naming the file).
    """
    path = Path(path)
    entry = new_entry()
    if path.exists():
        text = _read(path)
        current = _parse(text, path)
        have = current.profiles.get(profile)
        if have is not None and name in have.scenarios:
            return PlannedSLO(path, None, f"SLO of {name} kept as {path} has it "
                                          f"(profile {profile})")
        text = _with_entry(text, path, profile, name, entry)
    else:
        text = _new_file(path, profile, name, entry)
    written = _parse(text, path).profiles[profile].scenarios.get(name)
    if written is None or written.http.p99_ms != NEW_P99_MS:
        raise UserInputError(f"{path}: the entry for {name!r} did not read back; add it by hand")
    return PlannedSLO(path, text, f"SLO of {name} in {path} (profile {profile}: P99 <= "
                                  f"{NEW_P99_MS:g} ms, error ratio <= {NEW_MAX_ERROR_RATIO:g}; "
                                  f"throughput for you to set)")
