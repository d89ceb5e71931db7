"""``tools tune``: search a pipeline's instances, threads and batching for the most throughput
within the P99 target, by real trials; print the table, write results, plot and patch.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import click

from tools import paths
from tools.build_repo.spec import ModelSpec, load_spec, parse_spec_text
from tools.command import ToolCommand
from tools.errors import SpecError, UserInputError
from tools.loadtest.slo import load_slo
from tools.tune.knobs import (
    KnobSpace,
    pipeline_models,
    settings_to_dict,
    start_settings,
    with_overrides,
)
from tools.tune.results import (
    PATCH_NAME,
    PLOT_NAME,
    RESULTS_NAME,
    format_table,
    load_trials,
    save,
    save_plot,
)
from tools.tune.search import MIN_GAIN
from tools.tune.servers import COMPOSE_ADMIN_HEADER, EmbeddedTarget, RemoteTarget
from tools.tune.spec_patch import apply_settings, unified_patch
from tools.tune.trial import LoadPlan, check_baseline
from tools.tune.tuner import Session, TrialRunnerImpl, check_budget, no_trial_met, run_search

MAX_POINT_S = 60.0


def _levels(value: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise UserInputError(
            f"--concurrency: expected comma-separated integers, got {value!r}") from None
    if not levels or min(levels) < 1 or list(levels) != sorted(set(levels)):
        raise UserInputError(f"--concurrency: expected ascending integers >= 1, got {value!r}")
    return levels


def _text_pipeline(spec, scenario: str) -> None:
    pipeline = next(p for p in spec.pipelines if p.name == scenario)
    inputs = [t.name for t in pipeline.inputs]
    outputs = [t.name for t in pipeline.outputs]
    if inputs != ["TEXT"] or "EMBEDDING" not in outputs:
        raise UserInputError(
            f"--scenario {scenario}: tools tune loads text pipelines (TEXT -> EMBEDDING) with "
            f"tools bench's load; {scenario} takes {', '.join(inputs)}")


@click.command("tune", cls=ToolCommand)
@click.option("--scenario", required=True, help="Pipeline of the spec with targets in the SLO "
              "file, e.g. text_embedding.")
@click.option("--protocol", type=click.Choice(["grpc", "http"]), default="grpc", show_default=True)
@click.option("--budget-minutes", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="Wall time new trials may take (resumed trials cost nothing).")
@click.option("--url", help="HTTP host:port of a running server to tune (models reloaded through "
              "its admin API; needs $TRITON_ADMIN_KEY). Default: the embedded server.")
@click.option("--grpc-url", help="gRPC host:port of that server (default: its host, port 8001).")
@click.option("--admin-header", default=COMPOSE_ADMIN_HEADER, show_default=True,
              help="With --url: the header the server expects the admin key in.")
@click.option("--spec", "spec_path", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("repository.yaml"), show_default=True)
@click.option("--repository", type=click.Path(file_okay=False, path_type=Path),
              default=Path("model_repository"), show_default=True,
              help="Built repository of the spec: its exports are reused by every trial.")
@click.option("--output", type=click.Path(file_okay=False, path_type=Path),
              default=Path("reports/tune"), show_default=True,
              help="Results go to OUTPUT/<scenario>/.")
@click.option("--start", "overrides", multiple=True, metavar="MODEL.KNOB=VALUE",
              help="Start from other values than the spec's (repeatable), e.g. "
              "minilm_encoder.threads=1. Knobs: instances, threads, max_queue_delay_microseconds, "
              "preferred_batch_size (8, 4/8 or none), max_queue_size.")
@click.option("--concurrency", default="4,8,16", show_default=True,
              help="Closed-loop levels of each trial, climbed until P99 misses the target or "
              "throughput stops growing.")
@click.option("--warmup", type=click.FloatRange(min=0), default=2.0, show_default=True,
              help="Unmeasured seconds before each point.")
@click.option("--duration", type=click.FloatRange(min=1, max=MAX_POINT_S), default=8.0,
              show_default=True, help="Measured seconds of each point.")
@click.option("--slo", "slo_file", type=click.Path(dir_okay=False, path_type=Path),
              default=paths.SLO_FILE, show_default="loadtests/slo.yaml")
@click.option("--profile", default="cpu", show_default=True, help="SLO profile.")
@click.option("--p99-ms", type=click.FloatRange(min=0, min_open=True),
              help="Override the SLO file's P99 target.")
@click.option("--min-gain", type=click.FloatRange(min=0), default=MIN_GAIN, show_default=True,
              help="Relative throughput gain a change must show to be kept.")
@click.option("--fresh", is_flag=True, help="Ignore the results file's trials (no resume).")
@click.option("--write", is_flag=True, help="Apply the patch to the spec (comments kept).")
def tune(scenario: str, protocol: str, budget_minutes: float, url: str | None,
         grpc_url: str | None, admin_header: str, spec_path: Path, repository: Path,
         output: Path, overrides: tuple[str, ...], concurrency: str, warmup: float,
         duration: float, slo_file: Path, profile: str, p99_ms: float | None, min_gain: float,
         fresh: bool, write: bool) -> None:
    """Find the instances, threads and batching of SCENARIO's models that give the most
    throughput with P99 and errors within the SLO target, by measurement.

    Each trial writes the spec with some knobs changed, repackages it into a trial folder with
    tools build-repo's code (the exports of --repository are reused, never redone), serves it and
    climbs the --concurrency levels with tools bench's load. Coordinate descent moves one knob a
    rung at a time and keeps a move only if throughput grows by --min-gain. Every trial goes to
    OUTPUT/<scenario>/results.json as it completes; a rerun resumes from it.
    """
    slo = load_slo(slo_file, profile, scenario)
    spec = load_spec(spec_path)
    models = pipeline_models(spec, scenario)
    _text_pipeline(spec, scenario)
    if spec.target != "cpu":
        raise UserInputError(f"{spec.path}: target {spec.target}: tools tune tunes the cpu target")
    targets = slo.targets[protocol]
    plan = LoadPlan(protocol, _levels(concurrency), warmup, duration,
                    p99_ms if p99_ms is not None else targets.p99_ms, targets.max_error_ratio)
    budget_s = budget_minutes * 60.0
    check_budget(budget_s, plan)
    names = [m.name for m in models]
    spec_settings = start_settings(models)
    start = with_overrides(spec_settings, overrides, spec.cpu_cores)
    spec_text = spec.path.read_text(encoding="utf-8")
    if start != spec_settings:  # the start must be a valid spec too (preferred <= max batch, ...)
        try:
            parse_spec_text(apply_settings(spec_text, start, spec_settings), spec.path)
        except SpecError as exc:
            raise UserInputError(f"--start {' '.join(overrides)}: {exc}") from exc
    space = KnobSpace(spec.cpu_cores, {m.name: m.max_batch_size for m in models}, start)
    encoder = next((m.name for m in models if isinstance(m, ModelSpec)), names[-1])

    folder = output / scenario
    results_path = folder / RESULTS_NAME
    trials = [] if fresh else load_trials(results_path)
    if url:
        host = url.rsplit(":", 1)[0]
        server = RemoteTarget(url, grpc_url or f"{host}:8001", names, scenario, admin_header)
        where = {"served": "remote", "url": url}
    else:
        if grpc_url:
            raise UserInputError("--grpc-url needs --url (the embedded server picks its own ports)")
        server = EmbeddedTarget(folder / "logs")
        where = {"served": "embedded"}
    check_baseline(spec, repository.resolve(), [*names, scenario], spec.target)
    texts_file = paths.project_file(paths.TEXTS_FILE, "the load's texts")
    texts = [t for t in texts_file.read_text(encoding="utf-8").splitlines() if t.strip()]
    context = {**plan.context(), **where}
    header = {
        "scenario": scenario, "profile": profile, "spec": str(spec.path),
        "target": {"p99_ms": plan.p99_ms, "max_error_ratio": plan.max_error_ratio},
        "start": settings_to_dict(start), "spec_settings": settings_to_dict(spec_settings),
        "machine": {"cpus": os.cpu_count(), "cpu_cores_in_spec": spec.cpu_cores,
                    "platform": platform.platform()},
        "search": {"method": "coordinate descent", "min_gain": min_gain,
                   "grid_size": space.grid_size(),
                   "coordinates": [str(c) for c in space.coordinates()]},
    }
    click.echo(f"tuning {scenario} over {protocol}: target P99 <= {plan.p99_ms:g} ms, error ratio "
               f"<= {plan.max_error_ratio:g}; budget {budget_minutes:g} min; "
               f"{len(space.coordinates())} knobs (full grid {space.grid_size()} settings); "
               f"{len(trials)} trial(s) in {results_path}", err=True)
    if isinstance(server, RemoteTarget):
        server.check()

    def saver(all_trials):
        save(results_path, header, all_trials, None)

    def shown(trial, reused: bool) -> None:
        if reused:
            click.echo(f"trial {trial.id}: from {results_path} (not rerun)", err=True)

    runner = TrialRunnerImpl(spec.path, spec_text, spec_settings, repository.resolve(),
                             folder / ".work", names, scenario, encoder, spec.target, server, plan,
                             texts, lambda line: click.echo(line, err=True))
    session = Session(plan, context, trials, runner, budget_s, saver, shown)
    try:
        outcome = run_search(space, session, min_gain)
    finally:
        runner.close()

    best = outcome.best
    search = {**header["search"], "complete": outcome.search.complete,
              "trials_in_context": len(outcome.trials), "new_trials": len(session.new_seconds),
              "reused_trials": session.reused}
    save(results_path, {**header, "search": search}, session.trials, best)
    title = f"{scenario} ({protocol}): throughput vs P99 per trial"
    save_plot(outcome.trials, best, plan.p99_ms, title, folder / PLOT_NAME)
    click.echo(format_table(outcome.trials, names, best, plan.p99_ms))
    if not outcome.search.complete:
        click.echo("the budget ran out before the search converged; rerun to resume", err=True)
    if best is None:
        raise no_trial_met(outcome.trials, plan)
    patched = apply_settings(spec_text, best.settings, spec_settings, spec.target)
    patch = unified_patch(spec_text, patched, spec.path.name)
    patch_path = folder / PATCH_NAME
    patch_path.write_text(patch, encoding="utf-8")
    point = best.best_point()
    start_trial = session.trial_of(start)
    first = start_trial.best_point() if start_trial is not None else None
    gain = f" ({point['throughput'] / first['throughput']:.2f}x the start, trial {start_trial.id})" \
        if first else ""
    click.echo(f"winner: trial {best.id}: {point['throughput']:.1f} req/s{gain}, P99 "
               f"{point['p99_ms']:.1f} ms at concurrency {point['concurrency']}")
    if not patch:
        click.echo(f"{spec.path.name} already holds the winning settings: no patch")
    else:
        click.echo(patch, nl=False)
        if write:
            if spec.path.read_text(encoding="utf-8") != spec_text:
                raise UserInputError(f"{spec.path} changed during tuning; apply {patch_path} by "
                                     f"hand (git apply)")
            from tools.files import write_atomically

            write_atomically(spec.path, patched)
            click.echo(f"applied to {spec.path}")
    click.echo(f"wrote {results_path}, {folder / PLOT_NAME} and {patch_path}")
