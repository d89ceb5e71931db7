"""One trial: repackage the spec with the trial's knobs into a trial folder, then load it.

The build is ``tools build-repo``'s own (repackage only: the exports of the baseline folder are
reused); the load is the scenario's requests (``tools.load.scenario``) in ``tools bench``'s
closed loop at increasing concurrency, or its open loop at increasing rates (``tools.stats``).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tools.bench.served import measure
from tools.build_repo.builders import builder_for
from tools.manifest import MANIFEST_NAME, load_manifest
from tools.build_repo.pipeline import build_repository
from tools.build_repo.results import BuildResult, ModelKind, ModelStatus
from tools.build_repo.spec import ModelSpec, RepoSpec
from tools.errors import BuildError, UserInputError
from tools.load.scenario import Request
from tools.load import triton_stats
from tools.tune.knobs import ModelKnobs, Settings
from tools.tune.search import Score
from tools.tune.spec_patch import apply_settings, set_cpu_cores

# Stop climbing the concurrency ladder when a step gains less than this: the server is saturated.
SATURATION_GAIN = 0.05
# Only a PyTorch model is exported; an ONNX file as the source is copied again (no export).
EXPORTING_KINDS = (ModelKind.PYTORCH,)
DEFAULT_REFINE = 2


@dataclass(frozen=True)
class LoadPlan:
    """The bounded load of every trial and what a point must meet.

    Attributes:
        protocol: ``grpc`` or ``http``.
        concurrency: Closed-loop levels, ascending; climbing stops at the first point over the
            target or when throughput stops growing.
        warmup_s: Unmeasured seconds before each point.
        duration_s: Measured seconds of each point.
        p99_ms: The P99 target.
        max_error_ratio: The error-ratio limit.
        rates: Open loop instead: arrival rates (requests/s), ascending, climbed until one
            misses the target; then ``refine`` bisection steps between the last rate met and
            the first missed find the highest rate that meets it.
        refine: Bisection steps of the open loop.
    """

    protocol: str
    concurrency: tuple[int, ...]
    warmup_s: float
    duration_s: float
    p99_ms: float
    max_error_ratio: float
    rates: tuple[float, ...] = ()
    refine: int = DEFAULT_REFINE

    @property
    def open_loop(self) -> bool:
        """True when the plan climbs arrival rates, not concurrency."""
        return bool(self.rates)

    @property
    def levels(self) -> tuple[float, ...]:
        """The rungs climbed: rates in open loop, concurrency levels otherwise."""
        return self.rates if self.open_loop else self.concurrency

    def context(self) -> dict[str, Any]:
        """What makes two trials of the same settings comparable (stored with each trial):
        the load and the target a trial's figure was judged against."""
        load = {"rates": list(self.rates), "refine": self.refine} if self.open_loop else {
            "concurrency": list(self.concurrency)}
        return {"protocol": self.protocol, **load, "warmup_s": self.warmup_s,
                "duration_s": self.duration_s, "p99_ms": self.p99_ms,
                "max_error_ratio": self.max_error_ratio}

    def point_seconds(self) -> float:
        """Seconds one point takes."""
        return self.warmup_s + self.duration_s

    def points_at_most(self) -> int:
        """Points one trial measures at most."""
        return len(self.levels) + (self.refine if self.open_loop else 0)

    def describe(self) -> str:
        """``concurrency 4, 8, 16`` or ``open loop at 10, 20, 40 req/s (+2 bisections)``."""
        if self.open_loop:
            return (f"open loop at {', '.join(f'{r:g}' for r in self.rates)} req/s "
                    f"(+{self.refine} bisection steps)")
        return f"concurrency {', '.join(map(str, self.concurrency))}"


@dataclass
class Point:
    """One load level of a trial: the client's figures and Triton's, per model.

    ``concurrency`` is 0 for an open-loop point, whose level is ``rate``.
    """

    concurrency: int
    requests: int
    errors: int
    error_ratio: float
    throughput: float
    p50_ms: float | None
    p99_ms: float | None
    within_target: bool
    first_error: str = ""
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    rate: float | None = None

    @property
    def level(self) -> float:
        """The rate of an open-loop point, else its concurrency."""
        return self.rate if self.rate else self.concurrency

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return asdict(self)


def level_text(point: Mapping[str, Any]) -> str:
    """``c=8`` or ``r=40`` of a point dict."""
    rate = point.get("rate")
    return f"r={rate:g}" if rate else f"c={point['concurrency']}"


def level_words(point: Mapping[str, Any]) -> str:
    """``concurrency 8`` or ``rate 40 req/s`` of a point dict."""
    rate = point.get("rate")
    return f"rate {rate:g} req/s" if rate else f"concurrency {point['concurrency']}"


def within(p99_ms: float | None, error_ratio: float, requests: int, plan: LoadPlan) -> bool:
    """A point meets the target: it answered, its P99 and its error ratio are within limits."""
    return requests > 0 and p99_ms is not None and p99_ms <= plan.p99_ms \
        and error_ratio <= plan.max_error_ratio


def score(points: Sequence[Point]) -> tuple[Score, Point | None]:
    """A trial's score and its best point (highest throughput within target), if any."""
    good = [p for p in points if p.within_target]
    if good:
        best = max(good, key=lambda p: p.throughput)
        return Score(True, best.throughput, best.p99_ms), best
    seen = [p.p99_ms for p in points if p.p99_ms is not None]
    return Score(False, 0.0, min(seen) if seen else None), None


def _model_figures(models: Mapping[str, triton_stats.ModelWindow]) -> dict[str, dict[str, Any]]:
    keep = ("requests", "failed", "executions", "mean_batch", "queue_ms", "compute_ms")
    return {name: {k: getattr(m, k) for k in keep} for name, m in sorted(models.items())}


def measure_point(plan: LoadPlan, url: str, stats_url: str, requests: Sequence[Request],
                  level: float, pipeline: str, encoder: str) -> Point:
    """One point (closed loop at ``level`` concurrency, or open loop at ``level`` req/s) with
    ``tools bench``'s load, and Triton's view of every model. The trial's one load call.

    Triton's counters are metered over the measured window (``tools.load.TritonStats``), so the
    mean executed batch and the queue/compute split cover each model of the pipeline.

    Args:
        plan: The load and the target.
        url: ``host:port`` of the protocol's endpoint.
        stats_url: ``host:port`` of the HTTP endpoint (Triton's statistics).
        requests: The scenario's requests (``tools.load.scenario``), sent in turn.
        level: Concurrency (closed loop) or arrival rate (open loop).
        pipeline: The model the requests go to.
        encoder: The model whose figures ``tools bench`` reports beside.
    """
    rate = float(level) if plan.open_loop else None
    concurrency = 0 if plan.open_loop else int(level)
    result = measure(requests, plan.protocol, url, stats_url, concurrency=concurrency, rate=rate,
                     warmup_s=plan.warmup_s, duration_s=plan.duration_s)
    models = _model_figures(result.models)
    count = result.requests + result.errors
    ratio = result.errors / count if count else 0.0
    return Point(concurrency, result.requests, result.errors, ratio, result.throughput,
                 result.p50_ms, result.p99_ms, within(result.p99_ms, ratio, result.requests, plan),
                 result.first_error, models, rate)


def climb(plan: LoadPlan, measure: Callable[[float], Point],
          on_point: Callable[[Point], None] | None = None) -> list[Point]:
    """Measure ``plan.levels`` in order until a point misses the target (or, closed loop,
    saturates); in open loop then bisect between the last rate met and the first missed.

    Args:
        plan: The levels and the target.
        measure: Level -> its point (``measure_point`` bound to a server).
        on_point: Called with each point as it is measured.
    """
    points: list[Point] = []

    def take(level: float) -> Point:
        point = measure(level)
        points.append(point)
        if on_point is not None:
            on_point(point)
        return point

    for level in plan.levels:
        point = take(level)
        if not point.within_target:
            break
        previous = [p for p in points[:-1] if p.within_target]
        if not plan.open_loop and previous and \
                point.throughput < max(p.throughput for p in previous) * (1 + SATURATION_GAIN):
            break
    if plan.open_loop and points[-1].within_target is False and len(points) > 1:
        met, missed = points[-2].level, points[-1].level
        for _ in range(plan.refine):
            middle = round((met + missed) / 2, 1)
            if middle in (met, missed):
                break
            if take(middle).within_target:
                met = middle
            else:
                missed = middle
    return points


# --------------------------------------------------------------------------- the repository


def check_baseline(spec: RepoSpec, baseline: Path, models: Sequence[str], target: str) -> None:
    """The baseline folder holds every model of the pipeline, with exports a repackage can reuse.

    Raises:
        UserInputError: a model folder is missing, or its export is stale (naming the rebuild).
    """
    from tools.build_repo import config as cfg
    from tools.build_repo.ensemble import render_all

    rebuild = f"tools build-repo --spec {spec.path} --repository {baseline}"
    missing = [m for m in models if not (baseline / m / "config.pbtxt").is_file()]
    if missing or not (baseline / MANIFEST_NAME).is_file():
        raise UserInputError(f"--repository {baseline}: no built {', '.join(missing) or 'manifest'}"
                             f" (build it first: {rebuild})")
    manifest = load_manifest(baseline)
    configs = render_all(spec, target)
    for name in models:
        entry = spec.find(name)
        if not isinstance(entry, ModelSpec):
            continue
        builder = builder_for(spec, entry, target, cfg.render(configs[name].to_message()))
        if builder.kind not in EXPORTING_KINDS:
            continue
        previous = manifest.models.get(name)
        plan = builder.plan(previous)
        if builder.reusable_export(baseline / name, previous, plan) is None:
            raise UserInputError(
                f"--repository {baseline}: the export of {name!r} does not match {spec.path} "
                f"(a trial would export it again); rebuild it first: {rebuild}")


def _copy_model(source: Path, destination: Path) -> None:
    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)  # builds never write a file in place, so a hard link is safe
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, destination, copy_function=link,
                    ignore=shutil.ignore_patterns("__pycache__"))


def snapshot_baseline(baseline: Path, folder: Path, models: Sequence[str]) -> Path:
    """Hard-link the baseline's pipeline models and manifest into ``folder``, once per run, so a
    rebuild of the baseline during tuning cannot change the trials' exports."""
    folder.mkdir(parents=True)
    for name in models:
        _copy_model(baseline / name, folder / name)
    shutil.copy2(baseline / MANIFEST_NAME, folder / MANIFEST_NAME)
    return folder


def build_trial(spec_path: Path, spec_text: str, start: Mapping[str, ModelKnobs],
                settings: Settings, baseline: Path, folder: Path, models: Sequence[str],
                target: str, cpu_cores: int | None = None) -> BuildResult:
    """Write the trial's repository: the baseline's models, repackaged with ``settings``.

    The trial spec is a copy of the spec's text with the knobs written in, saved beside the
    spec (its relative paths resolve against its folder) for the length of the build.

    Args:
        spec_path: ``repository.yaml``.
        spec_text: Its text.
        start: The knob values ``spec_text`` holds (left untouched in the copy).
        settings: The trial's knobs.
        baseline: The built repository whose exports are reused.
        folder: The trial repository (created; must not exist).
        models: The pipeline and its models: what is copied and built.
        target: ``cpu``.
        cpu_cores: ``cpu_cores`` of the trial spec (the host's, when the ladder goes past the
            spec's); None keeps the spec's.

    Raises:
        BuildError: the build exported a model again (it must only repackage).
        ToolkitError: the build failed (its own error).
    """
    snapshot_baseline(baseline, folder, models)
    trial_spec = spec_path.parent / f".{spec_path.stem}.tune-{uuid.uuid4().hex[:8]}.yaml"
    text = apply_settings(spec_text, settings, start, target)
    if cpu_cores is not None:
        text = set_cpu_cores(text, cpu_cores)
    trial_spec.write_text(text, encoding="utf-8")
    try:
        # The build's summary table would repeat for every trial; results.json keeps the statuses.
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            result = build_repository(trial_spec, folder, target=target, only=list(models),
                                      progress=False)
    finally:
        trial_spec.unlink(missing_ok=True)
    exported = [m.name for m in result.models
                if m.kind in EXPORTING_KINDS and m.status == ModelStatus.BUILT]
    if exported:
        raise BuildError(f"trial build in {folder} exported {', '.join(exported)} again instead of "
                         f"repackaging; rebuild the baseline with tools build-repo")
    return result
