"""The tuning run: the search asks for settings, the session answers from the results file or
by running a trial within the budget, and the winner becomes a patch to the spec.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tools.build_repo.spec import parse_spec_text
from tools.errors import BuildError, ServerError, ToolkitError, UserInputError
from tools.load.scenario import Request
from tools.serve.server_log import one_line
from tools.tune.knobs import KnobSpace, ModelKnobs, Settings
from tools.tune.results import Trial
from tools.tune.search import BudgetExhausted, Score, SearchOutcome, coordinate_descent
from tools.tune.servers import changed_models
from tools.tune.trial import (
    LoadPlan,
    Point,
    build_trial,
    check_baseline,
    climb,
    level_text,
    level_words,
    measure_point,
    snapshot_baseline,
)

# A trial's build, server start and model load before its first point (measured ones replace it).
SETUP_ESTIMATE_S = 25.0

# settings, trial id -> (points as dicts, model -> build status)
TrialRunner = Callable[[Settings, int], tuple[list[dict[str, Any]], dict[str, str]]]


class TrialFailed(ServerError):
    """A trial's server did not load its repository, or stopped during the load.

    Attributes:
        points: The points measured before it stopped (as dicts).
        build: Model -> build status.
    """

    def __init__(self, message: str, points: Sequence[dict[str, Any]] = (),
                 build: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.points = list(points)
        self.build = dict(build or {})


def first_trial_estimate(plan: LoadPlan) -> float:
    """Seconds one trial takes at most before any was measured: setup plus every point."""
    return SETUP_ESTIMATE_S + plan.points_at_most() * plan.point_seconds()


def check_budget(budget_s: float, plan: LoadPlan) -> None:
    """Refuse a budget that cannot hold one trial.

    Raises:
        UserInputError: naming the budget and what one trial needs.
    """
    need = first_trial_estimate(plan)
    if budget_s < need:
        raise UserInputError(
            f"--budget-minutes {budget_s / 60:g} is too small for one trial: a trial takes about "
            f"{need:.0f} s ({SETUP_ESTIMATE_S:.0f} s to build and serve, then "
            f"{plan.points_at_most()} {'rate' if plan.open_loop else 'concurrency'} points x "
            f"{plan.point_seconds():g} s); give at least {need / 60:.1f} minutes, or fewer "
            f"{'--rate' if plan.open_loop else '--concurrency'} levels")


class Session:
    """Answers the search: a cached trial of the same settings and context, or a new one.

    A new trial whose server does not load it, or stops during it (``ServerError``), is recorded
    as infeasible with the server's reason, and the search goes on.

    Args:
        plan: The load every trial runs.
        context: ``plan.context()`` plus where trials are served.
        trials: Trials already in the results file (any context; only matching ones are reused).
        run_trial: Runs one new trial.
        budget_s: Seconds new trials may take in all.
        max_trials: New trials at most (``None``: as many as the budget holds).
        save_results: Called with every trial after each new one (writes the file).
        on_trial: Called with each new trial (prints its row).
        clock: Monotonic seconds (tests pass a fake).
    """

    def __init__(self, plan: LoadPlan, context: Mapping[str, Any], trials: Sequence[Trial],
                 run_trial: TrialRunner, budget_s: float,
                 save_results: Callable[[Sequence[Trial]], None],
                 on_trial: Callable[[Trial, bool], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 max_trials: int | None = None) -> None:
        self.plan, self.context = plan, dict(context)
        self.trials = list(trials)
        self.run_trial, self.budget_s, self.max_trials = run_trial, budget_s, max_trials
        self.save_results, self.on_trial, self.clock = save_results, on_trial, clock
        self.started = clock()
        self.new_seconds: list[float] = []
        self.reused = 0

    def _cached(self, settings: Settings) -> Trial | None:
        key = Trial(0, settings, self.context, [], 0.0).key
        return next((t for t in self.trials if t.key == key), None)

    def estimate_s(self) -> float:
        """Seconds the next trial should take: the mean of this run's, or the first estimate."""
        if self.new_seconds:
            return sum(self.new_seconds) / len(self.new_seconds)
        return first_trial_estimate(self.plan)

    def out_of_trials(self) -> bool:
        """Whether ``max_trials`` new trials have run."""
        return self.max_trials is not None and len(self.new_seconds) >= self.max_trials

    def left_s(self) -> float:
        """Budget seconds not yet spent."""
        return self.budget_s - (self.clock() - self.started)

    def evaluate(self, settings: Settings) -> Score:
        """The score of ``settings``: from the results file, else a new trial.

        Raises:
            BudgetExhausted: the next trial would not fit in the budget left, or ``max_trials``
                new trials have run.
        """
        cached = self._cached(settings)
        if cached is not None:
            self.reused += 1
            if self.on_trial is not None:
                self.on_trial(cached, True)
            return cached.score()
        if self.estimate_s() > self.left_s() or self.out_of_trials():
            raise BudgetExhausted()
        trial_id = max((t.id for t in self.trials), default=0) + 1
        started = self.clock()
        when = datetime.now(timezone.utc).isoformat(timespec="seconds")
        failure = ""
        try:
            points, build = self.run_trial(settings, trial_id)
        except ServerError as exc:
            points, build = getattr(exc, "points", []), getattr(exc, "build", {})
            failure = one_line(str(exc))
        seconds = self.clock() - started
        self.new_seconds.append(seconds)
        trial = Trial(trial_id, dict(settings), self.context, points, seconds, build, when,
                      failure)
        self.trials.append(trial)
        self.save_results(self.trials)
        if self.on_trial is not None:
            self.on_trial(trial, False)
        return trial.score()

    def trial_of(self, settings: Settings) -> Trial | None:
        """The trial (of this context) that measured ``settings``."""
        return self._cached(settings)

    def own_trials(self) -> list[Trial]:
        """Trials of this run's context (this run's and resumed ones)."""
        return [t for t in self.trials if t.context == self.context]


@dataclass
class TuneOutcome:
    """What the run found.

    Attributes:
        search: Where the search ended.
        best: The winning trial; None when no trial met the target.
        trials: The trials of this context, in id order.
    """

    search: SearchOutcome
    best: Trial | None
    trials: list[Trial]


def run_search(space: KnobSpace, session: Session, min_gain: float) -> TuneOutcome:
    """Coordinate descent over ``space`` answered by ``session``.

    Raises:
        ToolkitError: no trial met the target (exit 1), naming the best P99 seen and the target.
    """
    outcome = coordinate_descent(space, session.evaluate, min_gain=min_gain)
    trials = sorted(session.own_trials(), key=lambda t: t.id)
    best = session.trial_of(outcome.best) if outcome.score.feasible else None
    return TuneOutcome(outcome, best, trials)


def no_trial_met(trials: Sequence[Trial], plan: LoadPlan) -> ToolkitError:
    """The error when no trial met the target: the best P99 seen against the target, and the
    trials that failed with their servers' reasons."""
    failed = [t for t in trials if t.failure]
    failures = (f"; {len(failed)} trial(s) failed, e.g. trial {failed[0].id}: {failed[0].failure}"
                if failed else "")
    seen = [(p["p99_ms"], p, t) for t in trials if not t.failure for p in t.points
            if p["p99_ms"] is not None]
    if not seen:
        return ToolkitError(f"no trial answered any request within the target (P99 <= "
                            f"{plan.p99_ms:g} ms){failures}; see the server logs")
    p99, point, trial = min(seen, key=lambda s: s[0])
    return ToolkitError(
        f"no trial met the target: the best P99 seen was {p99:.1f} ms (trial {trial.id}, "
        f"{level_words(point)}, error ratio "
        f"{point['error_ratio']:.3f}) against a target of P99 <= {plan.p99_ms:g} ms with error "
        f"ratio <= {plan.max_error_ratio:g}, over {len(trials)} trial(s){failures}")


class TrialRunnerImpl:
    """Runs real trials: repackage into a trial folder, serve it, climb the load ladder.

    Args:
        spec_path: ``repository.yaml``.
        spec_text: Its text when the run started.
        spec_settings: The knobs ``spec_text`` holds.
        baseline: The built repository whose exports are reused.
        work: Scratch folder for trial repositories (removed by ``close``).
        models: The models a trial changes, in step order.
        pipeline: The pipeline (ensemble) or model the requests go to.
        encoder: The model whose figures ``tools bench`` reports beside.
        target: ``cpu``.
        server: ``EmbeddedTarget`` or ``RemoteTarget``.
        plan: The load.
        requests: The scenario's requests (``tools.load.scenario``).
        echo: Prints one line.
        cpu_cores: ``cpu_cores`` written into each trial spec when the ladder goes past the
            spec's (``Cores.bound``); None leaves the spec's.
    """

    def __init__(self, spec_path: Path, spec_text: str, spec_settings: Mapping[str, ModelKnobs],
                 baseline: Path, work: Path, models: Sequence[str], pipeline: str, encoder: str,
                 target: str, server: Any, plan: LoadPlan, requests: Sequence[Request],
                 echo: Callable[[str], None], cpu_cores: int | None = None) -> None:
        self.spec_path, self.spec_text, self.spec_settings = spec_path, spec_text, spec_settings
        self.baseline, self.work, self.models, self.pipeline = baseline, work, list(models), pipeline
        self.encoder, self.target, self.server, self.plan = encoder, target, server, plan
        self.requests, self.echo, self.cpu_cores = requests, echo, cpu_cores
        self._applied: Settings | None = None
        self._folder: Path | None = None
        self._snapshot: Path | None = None

    @property
    def members(self) -> list[str]:
        """What a trial repository holds: the models and, for a pipeline, the pipeline."""
        return list(dict.fromkeys([*self.models, self.pipeline]))

    def build_folder(self, settings: Settings, name: str) -> tuple[Path, dict[str, str]]:
        """The baseline repackaged with ``settings`` into ``work/name``; each model's status."""
        folder = self.work / name
        shutil.rmtree(folder, ignore_errors=True)
        if self._snapshot is None:
            shutil.rmtree(self.work, ignore_errors=True)  # left by a run that was killed
            self._snapshot = snapshot_baseline(self.baseline, self.work / "baseline", self.members)
        try:  # the build code may have changed since the run started: refuse, never export
            spec = parse_spec_text(self.spec_text, self.spec_path)
            check_baseline(spec, self._snapshot, self.members, self.target)
        except UserInputError as exc:
            raise BuildError(f"{name} would export again, not repackage: {exc}") from exc
        result = build_trial(self.spec_path, self.spec_text, self.spec_settings, settings,
                             self._snapshot, folder, self.members, self.target, self.cpu_cores)
        return folder, {m.name: str(m.status) for m in result.models}

    def measure(self, urls: tuple[str, str], level: float) -> Point:
        """One point of the plan's load at ``level`` on the server at ``urls`` (HTTP, gRPC)."""
        http_url, grpc_url = urls
        url = grpc_url if self.plan.protocol == "grpc" else http_url
        return measure_point(self.plan, url, http_url, self.requests, level, self.pipeline,
                             self.encoder)

    def __call__(self, settings: Settings,
                 trial_id: int) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """Build, serve and load one trial; its points and each model's build status.

        Raises:
            TrialFailed: the server did not load the trial or stopped during it (the server's
                reason, and the points measured until then).
        """
        what = " | ".join(f"{m} {k.short()}" for m, k in settings.items())
        self.echo(f"trial {trial_id}: {what}")
        if self.server.kind == "embedded":
            self.server.close()  # its trial folder can go once the server has stopped
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
        self._folder, build = self.build_folder(settings, f"trial-{trial_id}")
        changed = changed_models(self._applied, settings)
        self._applied = None  # unknown until the reload succeeds
        try:
            urls = self.server.serve(self._folder, changed, trial_id)
        except ServerError as exc:
            self.echo(f"  did not load: {one_line(str(exc))}")
            raise TrialFailed(f"the server did not load trial {trial_id}: {exc}", [],
                              build) from exc
        self._applied = dict(settings)
        points: list[Point] = []

        def measure(level: float) -> Point:
            self._check_alive(trial_id)
            try:
                point = self.measure(urls, level)
            except Exception as exc:
                reason = self.server.stopped()
                if reason:
                    raise ServerError(f"trial {trial_id} stopped: {reason}") from exc
                raise
            self._check_alive(trial_id)
            return point

        def show(point: Point) -> None:
            points.append(point)
            mark = "ok" if point.within_target else "over target"
            p99 = "-" if point.p99_ms is None else f"{point.p99_ms:.0f}"
            self.echo(f"  {level_text(point.to_dict())}: {point.throughput:.1f} req/s, P99 {p99} "
                      f"ms, errors {point.errors} ({mark})")

        try:
            climb(self.plan, measure, show)
        except ServerError as exc:
            self._applied = None
            self.echo(f"  stopped: {one_line(str(exc))}")
            raise TrialFailed(str(exc), [p.to_dict() for p in points], build) from exc
        return [p.to_dict() for p in points], build

    def _check_alive(self, trial_id: int) -> None:
        reason = self.server.stopped()
        if reason:
            raise ServerError(f"trial {trial_id} stopped: {reason}")

    def close(self) -> None:
        """Stop serving and remove the trial folders."""
        try:
            self.server.close()
        finally:
            shutil.rmtree(self.work, ignore_errors=True)
