"""One ``tools tune`` run, from options to report: check the inputs, search, confirm, patch.

The command only parses options and prints; everything it decides is here.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.build_repo.spec import load_spec, parse_spec_text
from tools.errors import SpecError, ToolkitError, UserInputError
from tools.load.scenario import build_scenario
from tools.slo import default_slo_file, scenario_slo
from tools.tune.confirm import MIN_REPEATS, Confirmation, confirm
from tools.tune.context import export_hashes, resume_context, spec_hash
from tools.tune.knobs import (
    KnobSpace,
    host_cores,
    pipeline_models,
    settings_key,
    settings_to_dict,
    start_settings,
    with_overrides,
)
from tools.tune.results import (
    PATCH_NAME,
    PLOT_NAME,
    RESULTS_NAME,
    Trial,
    format_table,
    load_trials,
    save,
    save_plot,
)
from tools.tune.search import MIN_GAIN
from tools.tune.servers import COMPOSE_ADMIN_HEADER, EmbeddedTarget, RemoteTarget
from tools.tune.spec_patch import apply_settings, set_cpu_cores, unified_patch
from tools.tune.trial import DEFAULT_REFINE, LoadPlan, check_baseline, level_text
from tools.tune.tuner import Session, TrialRunnerImpl, check_budget, no_trial_met, run_search


@dataclass(frozen=True)
class TuneOptions:
    """What ``tools tune`` was asked (see its ``--help`` for each)."""

    scenario: str
    protocol: str = "grpc"
    budget_minutes: float = 10.0
    max_trials: int | None = None
    url: str | None = None
    grpc_url: str | None = None
    admin_header: str = COMPOSE_ADMIN_HEADER
    spec_path: Path = Path("repository.yaml")
    repository: Path = Path("model_repository")
    output: Path = Path("reports/tune")
    overrides: tuple[str, ...] = ()
    concurrency: tuple[int, ...] = (4, 8, 16)
    rates: tuple[float, ...] = ()
    refine: int = DEFAULT_REFINE
    warmup_s: float = 2.0
    duration_s: float = 8.0
    slo_file: Path | None = None
    profile: str = "cpu"
    p99_ms: float | None = None
    max_error_ratio: float | None = None
    min_gain: float = MIN_GAIN
    fresh: bool = False
    write: bool = False
    data: Path | None = None
    repeats: int = MIN_REPEATS


@dataclass
class TuneReport:
    """What a run found, for the command to print.

    Attributes:
        table: One row per trial.
        lines: The winner, the confirmation, the patch and the files written.
        error: Raised by the command after printing (no trial met the target, a refused write).
    """

    table: str = ""
    lines: list[str] = field(default_factory=list)
    error: ToolkitError | None = None


def _start_checked(spec: Any, spec_text: str, start: dict, spec_settings: dict,
                   cpu_cores: int | None, overrides: tuple[str, ...]) -> None:
    """The start must be a valid spec too (preferred <= max batch, ...)."""
    if start == spec_settings:
        return
    text = apply_settings(spec_text, start, spec_settings)
    if cpu_cores is not None:
        text = set_cpu_cores(text, cpu_cores)
    try:
        parse_spec_text(text, spec.path)
    except SpecError as exc:
        raise UserInputError(f"--start {' '.join(overrides)}: {exc}") from exc


def tune(options: TuneOptions, echo: Callable[[str], None]) -> TuneReport:
    """Search the knobs of ``options.scenario``'s models by real trials, confirm the winner
    against the start, and write the results, the plot and the patch.

    Args:
        options: The run's options.
        echo: Prints one progress line (to stderr in the CLI).

    Raises:
        UserInputError: bad options, a scenario not in the spec, no SLO and no ``--p99-ms``, a
            baseline that is missing or stale, a budget too small for one trial.
    """
    spec = load_spec(options.spec_path)
    if spec.target != "cpu":
        raise UserInputError(f"{spec.path}: target {spec.target}: tools tune tunes the cpu target")
    scenario = build_scenario(spec, options.scenario, options.data)
    models = pipeline_models(spec, options.scenario)
    slo_file = options.slo_file or default_slo_file(options.spec_path)
    slo = scenario_slo(slo_file, options.profile, options.scenario, p99_ms=options.p99_ms,
                       max_error_ratio=options.max_error_ratio)
    targets = slo.targets[options.protocol]
    plan = LoadPlan(options.protocol, () if options.rates else options.concurrency,
                    options.warmup_s, options.duration_s, targets.p99_ms,
                    targets.max_error_ratio, options.rates, options.refine)
    budget_s = options.budget_minutes * 60.0
    check_budget(budget_s, plan)

    cores = host_cores(spec.cpu_cores)
    trial_cores = cores.bound if cores.bound > spec.cpu_cores else None
    names = [m.name for m in models]
    members = list(dict.fromkeys([*names, options.scenario]))
    spec_settings = start_settings(models)
    start = with_overrides(spec_settings, options.overrides, cores.bound)
    spec_text = spec.path.read_text(encoding="utf-8")
    _start_checked(spec, spec_text, start, spec_settings, trial_cores, options.overrides)
    space = KnobSpace(cores.bound, {m.name: m.max_batch_size for m in models}, start)
    encoder = next((m.name for m in models if not hasattr(m, "backend")), names[-1])

    folder = options.output / options.scenario
    results_path = folder / RESULTS_NAME
    trials = [] if options.fresh else load_trials(results_path)
    if options.url:
        host = options.url.rsplit(":", 1)[0]
        server: Any = RemoteTarget(options.url, options.grpc_url or f"{host}:8001", names,
                                   options.scenario, options.admin_header)
        where = {"served": "remote", "url": options.url}
    else:
        if options.grpc_url:
            raise UserInputError("--grpc-url needs --url (the embedded server picks its own ports)")
        server = EmbeddedTarget(folder / "logs")
        where = {"served": "embedded"}
    repository = options.repository.resolve()
    check_baseline(spec, repository, members, spec.target)
    context = resume_context(plan.context(), where, options.scenario, scenario.digest,
                             spec_hash(spec_text, members), export_hashes(repository, members),
                             cores.bound)
    header = {
        "scenario": options.scenario, "profile": options.profile, "spec": str(spec.path),
        "target": {"p99_ms": plan.p99_ms, "max_error_ratio": plan.max_error_ratio,
                   "from": slo.source},
        "load": {"plan": plan.describe(), "data": str(options.data) if options.data else None,
                 "inputs": scenario.describe(), "requests": len(scenario.requests)},
        "start": settings_to_dict(start), "spec_settings": settings_to_dict(spec_settings),
        "machine": {"cores": cores.to_dict(), "platform": platform.platform()},
        "resume_key": context,
        "search": {"method": "coordinate descent", "min_gain": options.min_gain,
                   "grid_size": space.grid_size(),
                   "coordinates": [str(c) for c in space.coordinates()]},
    }
    trial_limit = f" or {options.max_trials} new trial(s)" if options.max_trials else ""
    echo(f"tuning {options.scenario} over {options.protocol}: target P99 <= {plan.p99_ms:g} ms, "
         f"error ratio <= {plan.max_error_ratio:g} ({slo.source}); {plan.describe()}; budget "
         f"{options.budget_minutes:g} min{trial_limit}; {len(space.coordinates())} knobs (full grid "
         f"{space.grid_size()} settings); {len(trials)} trial(s) in {results_path}")
    echo(f"ladder bounded by {cores.describe()}")
    for line in scenario.describe():
        echo(f"load {line}")
    if isinstance(server, RemoteTarget):
        server.check()

    def saver(all_trials):
        save(results_path, header, all_trials, None)

    def shown(trial: Trial, reused: bool) -> None:
        if reused:
            echo(f"trial {trial.id}: from {results_path} (not rerun)")
        elif trial.failure:
            echo(f"trial {trial.id}: infeasible: {trial.failure}")

    runner = TrialRunnerImpl(spec.path, spec_text, spec_settings, repository, folder / ".work",
                             names, options.scenario, encoder, spec.target, server, plan,
                             scenario.requests, echo, trial_cores)
    session = Session(plan, context, trials, runner, budget_s, saver, shown,
                      max_trials=options.max_trials)
    confirmation: Confirmation | None = None
    try:
        outcome = run_search(space, session, options.min_gain)
        best = outcome.best
        start_trial = session.trial_of(start)
        if best is not None and start_trial is not None and \
                settings_key(best.settings) != settings_key(start_trial.settings):
            confirmation = confirm(runner, start_trial, best, options.repeats, echo)
    finally:
        runner.close()

    search = {**header["search"], "complete": outcome.search.complete,
              "trials_in_context": len(outcome.trials), "new_trials": len(session.new_seconds),
              "reused_trials": session.reused,
              "failed_trials": sum(1 for t in outcome.trials if t.failure)}
    save(results_path, {**header, "search": search}, session.trials, best,
         {"confirmation": confirmation.to_dict() if confirmation else None})
    title = f"{options.scenario} ({options.protocol}): throughput vs P99 per trial"
    save_plot(outcome.trials, best, plan.p99_ms, title, folder / PLOT_NAME)
    report = TuneReport(format_table(outcome.trials, names, best, plan.p99_ms))
    if not outcome.search.complete:
        limit = "the trial limit" if session.out_of_trials() else "the budget"
        report.lines.append(f"{limit} ran out before the search converged; rerun to resume")
    if best is None:
        report.error = no_trial_met(outcome.trials, plan)
        return report
    _winner_lines(report, best, start_trial, confirmation)
    _patch(report, options, spec, spec_text, best, spec_settings, cores.bound, confirmation,
           folder)
    report.lines.append(f"wrote {results_path}, {folder / PLOT_NAME} and {folder / PATCH_NAME}")
    return report


def _winner_lines(report: TuneReport, best: Trial, start: Trial | None,
                  confirmation: Confirmation | None) -> None:
    point = best.best_point()
    first = start.best_point() if start is not None else None
    gain = f" ({point['throughput'] / first['throughput']:.2f}x the start, trial {start.id})" \
        if first and start is not None and start.id != best.id else ""
    report.lines.append(f"winner: trial {best.id}: {point['throughput']:.1f} req/s{gain}, P99 "
                        f"{point['p99_ms']:.1f} ms at {level_text(point)}")
    if confirmation is not None:
        report.lines.extend(confirmation.lines())
    elif start is not None and start.id == best.id:
        report.lines.append("the start is the winner: no move paid, nothing to confirm")


def _patch(report: TuneReport, options: TuneOptions, spec: Any, spec_text: str, best: Trial,
           spec_settings: dict, bound: int, confirmation: Confirmation | None,
           folder: Path) -> None:
    patched = apply_settings(spec_text, best.settings, spec_settings, spec.target)
    needs = max(k.cores() for k in best.settings.values())
    if needs > spec.cpu_cores:
        patched = set_cpu_cores(patched, bound)
        report.lines.append(f"the winner uses {needs} cores per model, over the spec's cpu_cores "
                            f"{spec.cpu_cores}: the patch sets cpu_cores to this host's {bound}")
    patch = unified_patch(spec_text, patched, spec.path.name)
    patch_path = folder / PATCH_NAME
    patch_path.write_text(patch, encoding="utf-8")
    if not patch:
        report.lines.append(f"{spec.path.name} already holds the winning settings: no patch")
        return
    report.lines.append(patch.rstrip("\n"))
    if not options.write:
        return
    if confirmation is not None and not confirmation.confirmed:
        report.error = ToolkitError(f"not applied to {spec.path}: the winner was not confirmed "
                                    f"against the start ({confirmation.reason}); {patch_path} "
                                    f"holds the patch")
        return
    if spec.path.read_text(encoding="utf-8") != spec_text:
        report.error = UserInputError(f"{spec.path} changed during tuning; apply {patch_path} by "
                                      f"hand (git apply)")
        return
    from tools.files import write_atomically

    write_atomically(spec.path, patched)
    report.lines.append(f"applied to {spec.path}")
