"""The knobs of a pipeline's models, their ladders of values, and the cores constraint.

``Settings`` (model -> ``ModelKnobs``) is what a trial changes; it is read from the spec, moved one
step along one knob at a time by the search, and written back into the spec's YAML by ``spec_patch``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tools.build_repo.spec import ModelSpec, PipelineSpec, PythonModelSpec, RepoSpec
from tools.errors import UserInputError

KNOBS = ("instances", "threads", "max_queue_delay_microseconds", "preferred_batch_size",
         "max_queue_size")
# Ladders the search walks; a start value off the ladder is added to it.
DELAY_LADDER = (0, 500, 1000, 2000, 4000, 8000)
PREFERRED_LADDER = ((), (2,), (4,), (8,), (16,), (32,))
QUEUE_LADDER = (16, 32, 64, 128, 256, 512)
# The order coordinate descent visits knobs in: where the CPU goes first, then batching.
_ORDER = ("instances", "threads", "max_queue_delay_microseconds", "preferred_batch_size",
          "max_queue_size")


@dataclass(frozen=True)
class ModelKnobs:
    """One model's tunable settings (cpu target).

    Attributes:
        instances: ``instances.cpu.count``.
        threads: ``instances.cpu.intra_op_threads`` of an ONNX Runtime model; None for a Python
            model (each instance counts as one thread).
        max_queue_delay_microseconds: The dynamic batcher's delay; None when it has no batcher.
        preferred_batch_size: The batcher's preferred sizes (empty: none).
        max_queue_size: ``default_queue_policy.max_queue_size``.
    """

    instances: int
    threads: int | None
    max_queue_delay_microseconds: int | None
    preferred_batch_size: tuple[int, ...] = ()
    max_queue_size: int | None = None

    def cores(self) -> int:
        """Instances x threads: what the spec checks against ``cpu_cores``."""
        return self.instances * (self.threads or 1)

    def to_dict(self) -> dict[str, object]:
        """Plain dict for JSON (the tuple as a list)."""
        out = dataclasses.asdict(self)
        out["preferred_batch_size"] = list(self.preferred_batch_size)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> ModelKnobs:
        """The reverse of ``to_dict``."""
        return cls(**{**data, "preferred_batch_size": tuple(data.get("preferred_batch_size") or ())})

    def short(self) -> str:
        """``2x1 d2000 p8 q128``: instances x threads, delay, preferred size, queue size."""
        threads = f"x{self.threads}" if self.threads is not None else ""
        parts = [f"{self.instances}{threads}"]
        if self.max_queue_delay_microseconds is not None:
            parts.append(f"d{self.max_queue_delay_microseconds}")
            parts.append("p" + ("/".join(map(str, self.preferred_batch_size)) or "-"))
            parts.append(f"q{self.max_queue_size}")
        return " ".join(parts)


Settings = dict[str, ModelKnobs]


def settings_key(settings: Mapping[str, ModelKnobs]) -> str:
    """A canonical text of ``settings``: the same settings always give the same key."""
    return json.dumps({m: k.to_dict() for m, k in sorted(settings.items())}, sort_keys=True)


def settings_to_dict(settings: Mapping[str, ModelKnobs]) -> dict[str, dict[str, object]]:
    """Model -> knob dict, for JSON."""
    return {m: k.to_dict() for m, k in settings.items()}


def settings_from_dict(data: Mapping[str, Mapping[str, object]]) -> Settings:
    """The reverse of ``settings_to_dict``."""
    return {m: ModelKnobs.from_dict(k) for m, k in data.items()}


def pipeline_models(spec: RepoSpec, scenario: str) -> list[ModelSpec | PythonModelSpec]:
    """The models a trial of ``scenario`` changes: a pipeline's models in step order, or the
    model itself.

    Raises:
        UserInputError: the spec's target has no pipeline or model of that name.
    """
    own = spec.for_target(spec.target)
    pipelines = {p.name: p for p in own.pipelines}
    models = {m.name: m for m in (*own.models, *own.python_models)}
    pipeline: PipelineSpec | None = pipelines.get(scenario)
    if pipeline is not None:
        return [spec.find(step.model) for step in pipeline.steps]
    if scenario in models:
        return [models[scenario]]
    raise UserInputError(
        f"--scenario {scenario}: {spec.path} has no pipeline or model of that name for target "
        f"{spec.target} (has: {', '.join([*pipelines, *models]) or 'none'})"
    )


@dataclass(frozen=True)
class Cores:
    """The cores the instances x threads ladder may use, and where the number came from.

    Attributes:
        host: Cores this process may run on (``os.sched_getaffinity``, else ``os.cpu_count``).
        spec: The spec's ``cpu_cores``.
        source: How ``host`` was read.
    """

    host: int
    spec: int
    source: str

    @property
    def bound(self) -> int:
        """What bounds the ladder: the host's cores (trials run, and are measured, here)."""
        return self.host

    def describe(self) -> str:
        """Which count bounds the ladder, in words."""
        if self.host == self.spec:
            return f"{self.host} cores (this host, {self.source}; the spec's cpu_cores agrees)"
        return (f"{self.host} cores of this host ({self.source}), not the spec's cpu_cores "
                f"{self.spec}: trials run here")

    def to_dict(self) -> dict[str, object]:
        """For the results file."""
        return {"host": self.host, "spec": self.spec, "bound": self.bound, "source": self.source}


def host_cores(spec_cores: int) -> Cores:
    """The host's usable cores beside the spec's ``cpu_cores``."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return Cores(len(affinity(0)), spec_cores, "os.sched_getaffinity")
    return Cores(os.cpu_count() or 1, spec_cores, "os.cpu_count")


def knobs_of(model: ModelSpec | PythonModelSpec) -> ModelKnobs:
    """The cpu-target knobs a spec entry has now."""
    cpu = model.instances.cpu
    threads = cpu.intra_op_threads if isinstance(model, ModelSpec) else None
    batching = model.dynamic_batching
    if batching is None:
        return ModelKnobs(cpu.count, threads, None, (), None)
    policy = batching.queue_policy
    return ModelKnobs(cpu.count, threads, batching.max_queue_delay_microseconds,
                      tuple(batching.preferred_batch_size),
                      policy.max_queue_size if policy is not None else None)


def start_settings(models: Iterable[ModelSpec | PythonModelSpec]) -> Settings:
    """Every model's knobs as the spec sets them."""
    return {m.name: knobs_of(m) for m in models}


def with_overrides(settings: Mapping[str, ModelKnobs], overrides: Iterable[str],
                   cpu_cores: int) -> Settings:
    """``settings`` with ``MODEL.KNOB=VALUE`` overrides (``tools tune --start``).

    Knob names are those of ``ModelKnobs`` (``intra_op_threads`` is accepted for ``threads``);
    ``preferred_batch_size`` takes ``8`` or ``4/8`` or ``none``.

    Raises:
        UserInputError: an unknown model or knob, a bad value, or a result over ``cpu_cores``.
    """
    out = dict(settings)
    for item in overrides:
        target, equals, value = item.partition("=")
        model, dot, knob = target.partition(".")
        knob = "threads" if knob == "intra_op_threads" else knob
        if not equals or not dot:
            raise UserInputError(f"--start {item!r}: expected MODEL.KNOB=VALUE")
        if model not in out:
            raise UserInputError(f"--start {item!r}: {model!r} is not a model of the pipeline "
                                 f"(has: {', '.join(out)})")
        if knob not in KNOBS:
            raise UserInputError(
                f"--start {item!r}: unknown knob {knob!r} (knobs: {', '.join(KNOBS)})")
        current = out[model]
        if getattr(current, knob) is None:
            raise UserInputError(f"--start {item!r}: model {model!r} has no {knob}")
        try:
            if knob == "preferred_batch_size":
                parsed: object = () if value.lower() in ("", "none") else tuple(
                    int(v) for v in value.split("/"))
            else:
                parsed = int(value)
        except ValueError:
            raise UserInputError(f"--start {item!r}: {value!r} is not an integer") from None
        if knob != "preferred_batch_size" and (parsed < (0 if "delay" in knob else 1)):
            raise UserInputError(f"--start {item!r}: {value!r} is out of range")
        out[model] = dataclasses.replace(current, **{knob: parsed})
        if out[model].cores() > cpu_cores:
            raise UserInputError(f"--start {item!r}: instances x threads of {model!r} would be "
                                 f"{out[model].cores()}, over cpu_cores {cpu_cores}")
    return out


@dataclass(frozen=True)
class Coordinate:
    """One knob of one model: what a single search step moves."""

    model: str
    knob: str

    def __str__(self) -> str:
        return f"{self.model}.{self.knob}"


def _ladder(base: Iterable, start: object, key=None) -> list:
    values = list(base)
    if start not in values:
        values.append(start)
    return sorted(set(values), key=key)


@dataclass
class KnobSpace:
    """The values each knob may take, and the rule instances x threads <= ``cpu_cores``.

    Attributes:
        cpu_cores: The cores that bound the ladder (``Cores.bound``: this host's).
        max_batch: Model -> its ``max_batch_size`` (preferred sizes above it are left out).
        start: The settings the search starts from (their values join the ladders).
    """

    cpu_cores: int
    max_batch: dict[str, int]
    start: Settings

    def coordinates(self) -> list[Coordinate]:
        """The knobs the search moves: most influential first, exported models before Python ones."""
        out = []
        # ONNX Runtime models (those with threads) first: on a small CPU they bound throughput.
        models = sorted(self.start.items(), key=lambda item: item[1].threads is None)
        for knob in _ORDER:
            for model, knobs in models:
                if getattr(knobs, knob) is not None and len(self.values(model, knob)) > 1:
                    out.append(Coordinate(model, knob))
        return out

    def values(self, model: str, knob: str) -> list:
        """The ladder of ``knob`` of ``model``, ascending."""
        start = getattr(self.start[model], knob)
        if knob in ("instances", "threads"):
            return _ladder(range(1, self.cpu_cores + 1), start)
        if knob == "max_queue_delay_microseconds":
            return _ladder(DELAY_LADDER, start)
        if knob == "max_queue_size":
            return _ladder(QUEUE_LADDER, start)
        limit = self.max_batch[model]
        sizes = [p for p in PREFERRED_LADDER if all(n <= limit for n in p)]
        return _ladder(sizes, start, key=lambda p: (max(p, default=0), len(p), p))

    def fits(self, settings: Mapping[str, ModelKnobs]) -> bool:
        """Every model's instances x threads is at most ``cpu_cores``."""
        return all(k.cores() <= self.cpu_cores for k in settings.values())

    def step(self, settings: Mapping[str, ModelKnobs], coordinate: Coordinate,
             direction: int) -> Settings | None:
        """``settings`` with one knob one rung up (+1) or down (-1), or None at the ladder's end.

        The cores rule couples instances and threads: more instances than fit with the current
        threads lowers the threads to fit, and more threads than fit with the current instances
        lowers the instances (with 2 cores, 2x1 and 1x2 are one step apart either way).
        """
        current = settings[coordinate.model]
        ladder = self.values(coordinate.model, coordinate.knob)
        index = ladder.index(getattr(current, coordinate.knob)) + direction
        if not 0 <= index < len(ladder):
            return None
        moved = dataclasses.replace(current, **{coordinate.knob: ladder[index]})
        if coordinate.knob == "instances" and moved.threads is not None:
            moved = dataclasses.replace(moved, threads=min(moved.threads,
                                                           max(self.cpu_cores // moved.instances, 1)))
        if coordinate.knob == "threads" and direction > 0:
            moved = dataclasses.replace(moved, instances=min(moved.instances,
                                                             max(self.cpu_cores // moved.threads, 1)))
        out = {**settings, coordinate.model: moved}
        return out if self.fits(out) else None

    def grid_size(self) -> int:
        """How many settings a full grid over every knob would try (for the report)."""
        total = 1
        for coordinate in self.coordinates():
            total *= len(self.values(coordinate.model, coordinate.knob))
        return total
