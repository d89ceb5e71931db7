"""What ``tools bench`` measures for each pipeline: its scenario from the spec, its limit from
the built repository.

The requests are the scenario of ``tools.load.scenario`` (the spec's typed inputs and the backend
that consumes each, as ``tools loadtest`` and ``tools tune`` send them; ``--data`` replaces the
shipped payloads). The in-process limit is derived from the repository where it can be: text
pipelines of two steps (tokenizer -> encoder); other pipelines say why not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.bench.inprocess import EncoderSetup, model_config, pipeline_models, read_setup
from tools.errors import UserInputError
from tools.load import Request
from tools.load.scenario import InputKind, Scenario, build_scenario, scenario_names

# The shipped spec's text variants, measured side by side when no --scenario is given.
DEFAULT_PIPELINES = ("text_embedding", "text_embedding_int8", "text_embedding_bf16")
_PAYLOADS = {InputKind.TEXT: "texts", InputKind.IMAGE: "images", InputKind.TENSOR: "tensors"}


@dataclass(frozen=True)
class Target:
    """One pipeline (or model) of the spec, as the bench will measure it.

    Attributes:
        name: The pipeline or model.
        scenario: Its load (requests, and what each input carries).
        setup: The text pipeline's tokenizer and encoder for the in-process limit, or None.
        limit_na: Why there is no in-process limit ("" when there is one).
        steps: The models that serve it (an ensemble's steps, else the model itself).
    """

    name: str
    scenario: Scenario
    setup: EncoderSetup | None
    limit_na: str
    steps: tuple[str, ...]

    @property
    def requests(self) -> tuple[Request, ...]:
        """The scenario's requests, sent in order, cycling."""
        return self.scenario.requests

    @property
    def payload(self) -> str:
        """What the requests carry: ``texts``, ``images``, ``tensors`` (joined by ``+``)."""
        return payload_of(self.scenario)

    @property
    def texts(self) -> tuple[str, ...]:
        """The texts of the requests' one text input, in order (what the in-process limit
        encodes); empty unless every input is text and there is one."""
        if self.payload != "texts" or len(self.scenario.sources) != 1:
            return ()
        name = self.scenario.sources[0].name
        return tuple(value.decode("utf-8") for request in self.requests
                     for value in request.inputs[name].reshape(-1))


def payload_of(scenario: Scenario) -> str:
    """``texts``, ``images`` or ``tensors`` (several joined by ``+``): what ``scenario`` sends."""
    kinds = dict.fromkeys(_PAYLOADS[s.kind] for s in scenario.sources)
    return "+".join(kinds)


def known_models(repository: Path) -> list[str]:
    """Every model folder of ``repository`` with a ``config.pbtxt``, sorted."""
    if not repository.is_dir():
        return []
    return sorted(p.parent.name for p in repository.glob("*/config.pbtxt"))


def default_names(spec: Any) -> tuple[str, ...]:
    """What the bench measures without ``--scenario``: the shipped text variants the spec has,
    else every pipeline of the spec's target."""
    known = scenario_names(spec)
    shipped = tuple(n for n in DEFAULT_PIPELINES if n in known)
    return shipped or tuple(p.name for p in spec.for_target(spec.target).pipelines)


def _steps(config: Mapping[str, Any], name: str) -> tuple[str, ...]:
    steps = config.get("ensemble_scheduling", {}).get("step", [])
    return tuple(s["model_name"] for s in steps) or (name,)


def _limit_setup(repository: Path, name: str, config: Mapping[str, Any],
                 scenario: Scenario) -> tuple[EncoderSetup | None, str]:
    if "ensemble_scheduling" not in config:
        return None, "not an ensemble: the in-process limit is derived for tokenizer -> encoder"
    if payload_of(scenario) != "texts" or len(scenario.sources) != 1:
        return None, "the in-process limit is derived for pipelines of one text input only"
    try:
        pipeline_models(repository, name)
        return read_setup(repository, name), ""
    except UserInputError as exc:
        return None, str(exc)


def resolve(repository: Path, spec: Any, names: Sequence[str], data: Path | None = None, *,
            explicit: bool) -> tuple[list[Target], list[str]]:
    """The targets of ``names``, and notes on the ones left out.

    Args:
        repository: The repository built from ``spec`` (its configs give the limit's setup).
        spec: The spec (``load_spec``'s object): each target's requests are its scenario.
        names: Pipelines or models, in the order to measure.
        data: ``--data`` of every scenario (None: the shipped texts and images, generated
            tensors).
        explicit: The user named them: a name the spec or the repository lacks is an error
            (else it is skipped with a note).

    Raises:
        UnknownScenario: an explicit name is not in the spec (naming the known ones).
        DataError: ``data`` does not fit a scenario (naming the file, line and input).
        UserInputError: an explicit name is not built in ``repository``, or none of the names
            can be measured.
    """
    built = known_models(repository)
    in_spec = scenario_names(spec)
    notes = []
    chosen = []
    for name in names:
        if name not in in_spec and not explicit:
            notes.append(f"pipeline {name} is not in {spec.path}: skipped")
        elif name in in_spec and name not in built:
            if explicit:
                raise UserInputError(
                    f"--scenario {name}: not in {repository} (built: {', '.join(built) or 'none'};"
                    f" build it first: tools build-repo --spec {spec.path} --repository "
                    f"{repository})")
            notes.append(f"pipeline {name} is not in {repository}: skipped")
        else:
            chosen.append(name)  # an unknown explicit name: build_scenario names the known ones
    targets = []
    for name in chosen:
        scenario = build_scenario(spec, name, data)
        config = model_config(repository / name / "config.pbtxt")
        setup, limit_na = _limit_setup(repository, name, config, scenario)
        targets.append(Target(name, scenario, setup, limit_na, _steps(config, name)))
    if not targets:
        raise UserInputError(f"--scenario {','.join(names)}: none is built in {repository} "
                             f"(build it first: tools build-repo --spec {spec.path} --repository "
                             f"{repository})")
    return targets, notes


def compute_model(point_models: Mapping[str, Any], pipeline: str) -> str | None:
    """The model of ``pipeline`` that computed most in a window (an ensemble's encoder, say).

    Args:
        point_models: Triton's per-model window (``Point.models``).
        pipeline: The pipeline measured (an ensemble is left out for its steps).
    """
    candidates = {k: m for k, m in point_models.items() if k != pipeline} or dict(point_models)
    timed = {k: (m.compute_ms or 0.0) * m.requests for k, m in candidates.items()}
    return max(timed, key=timed.get) if timed else None
