"""``tools tune``: the options of a tuning run and its printout; the run is ``tools.tune.run``."""

from __future__ import annotations

from pathlib import Path

import click

from tools.command import (
    ToolCommand,
    data_option,
    grpc_url_option,
    option,
    protocol_option,
    slo_file_option,
    spec_option,
    url_option,
)
from tools.errors import UserInputError
from tools.tune.confirm import MIN_REPEATS
from tools.tune.run import TuneOptions, tune as run_tune
from tools.tune.search import MIN_GAIN
from tools.tune.servers import COMPOSE_ADMIN_HEADER
from tools.tune.trial import DEFAULT_REFINE

MAX_POINT_S = 60.0


def _ascending(value: str | None, option: str, kind: type) -> tuple:
    if not value:
        return ()
    try:
        levels = tuple(kind(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise UserInputError(f"{option}: expected comma-separated numbers, got {value!r}") from None
    if not levels or min(levels) <= 0 or list(levels) != sorted(set(levels)):
        what = "integers >= 1" if kind is int else "numbers > 0"
        raise UserInputError(f"{option}: expected ascending {what}, got {value!r}")
    return levels


@click.command("tune", cls=ToolCommand)
@option("--scenario", required=True, metavar="NAME",
        help="Pipeline (or model) of the spec's cpu target, e.g. text_embedding.")
@protocol_option(["http", "grpc"], "grpc", "Client protocol of every point.")
@click.option("--budget-minutes", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="Wall time new trials may take (resumed trials cost nothing; the winner's "
              "confirmation comes after).")
@click.option("--max-trials", type=click.IntRange(min=1), default=None, metavar="N",
              help="Stop the search after N new trials, within the budget (default: as many as "
              "the budget holds).")
@url_option("a running server to tune (models reloaded through its admin API; needs "
            "$TRITON_ADMIN_KEY). Default: the embedded server.")
@grpc_url_option("that server (default: its host, port 8001).")
@click.option("--admin-header", default=COMPOSE_ADMIN_HEADER, show_default=True,
              help="With --url: the header the server expects the admin key in.")
@spec_option("The spec to tune (--write patches it).")
@click.option("--repository", type=click.Path(file_okay=False, path_type=Path),
              default=Path("model_repository"), show_default=True,
              help="Built repository of the spec: its exports are reused by every trial.")
@click.option("--output", type=click.Path(file_okay=False, path_type=Path),
              default=Path("reports/tune"), show_default=True,
              help="Results go to OUTPUT/<scenario>/.")
@data_option()
@click.option("--start", "overrides", multiple=True, metavar="MODEL.KNOB=VALUE",
              help="Start from other values than the spec's (repeatable), e.g. "
              "minilm_encoder.threads=1. Knobs: instances, threads, max_queue_delay_microseconds, "
              "preferred_batch_size (8, 4/8 or none), max_queue_size.")
@option("--concurrency", default="4,8,16", show_default=True,
        help="Closed loop: requests in flight, the levels of each trial, climbed until P99 "
        "misses the target or throughput stops growing.")
@click.option("--rate", "rates", default=None, metavar="R1,R2,...",
              help="Open loop instead: arrival rates (req/s) climbed until one misses the "
              "target, then bisected (--refine) to the highest rate that meets it.")
@click.option("--refine", type=click.IntRange(min=0), default=DEFAULT_REFINE, show_default=True,
              help="With --rate: bisection steps between the last rate met and the first missed.")
@click.option("--warmup", type=click.FloatRange(min=0), default=2.0, show_default=True,
              help="Unmeasured seconds before each point.")
@click.option("--duration", type=click.FloatRange(min=1, max=MAX_POINT_S), default=8.0,
              show_default=True, help="Measured seconds of each point.")
@slo_file_option(old_names=("--slo",))
@option("--slo-profile", default="cpu", show_default=True, old_names=("--profile",),
        help="Profile of the SLO file.")
@click.option("--p99-ms", type=click.FloatRange(min=0, min_open=True),
              help="P99 target over the SLO file's; enough alone for a scenario without an entry.")
@click.option("--max-error-ratio", type=click.FloatRange(min=0, max=1),
              help="Error-ratio limit over the SLO file's (default without an entry: 0).")
@click.option("--min-gain", type=click.FloatRange(min=0), default=MIN_GAIN, show_default=True,
              help="Relative throughput gain a change must show to be kept.")
@click.option("--repeats", type=click.IntRange(min=MIN_REPEATS), default=MIN_REPEATS,
              show_default=True, help="Interleaved repeats of the start and of the winner that "
              "confirm the winner.")
@click.option("--fresh", is_flag=True, help="Ignore the results file's trials (no resume).")
@click.option("--write", is_flag=True, help="Apply a confirmed winner's patch to the spec "
              "(comments kept).")
def tune(scenario: str, protocol: str, budget_minutes: float, max_trials: int | None,
         url: str | None, grpc_url: str | None, admin_header: str, spec_path: Path, repository: Path,
         output: Path, data: Path | None, overrides: tuple[str, ...], concurrency: str,
         rates: str | None, refine: int, warmup: float, duration: float, slo_file: Path | None,
         slo_profile: str, p99_ms: float | None, max_error_ratio: float | None, min_gain: float,
         repeats: int, fresh: bool, write: bool) -> None:
    """Find the instances, threads and batching of SCENARIO's models that give the most
    throughput with P99 and errors within the target, by measurement.

    Each trial writes the spec with some knobs changed, repackages it into a trial folder with
    tools build-repo's code (the exports of --repository are reused, never redone), serves it and
    climbs the --concurrency levels (or --rate arrival rates) with the scenario's requests,
    derived from its inputs as tools loadtest does. Coordinate descent moves one knob a rung at
    a time and keeps a move only if throughput grows by --min-gain; a trial the server does not
    load, or that crashes it, is recorded as infeasible with the server's reason. The winner is
    then measured against the start in interleaved repeats. Every trial goes to
    OUTPUT/<scenario>/results.json as it completes; a rerun with the same load, target, spec
    and exports resumes from it.
    """
    options = TuneOptions(
        scenario=scenario, protocol=protocol, budget_minutes=budget_minutes,
        max_trials=max_trials, url=url,
        grpc_url=grpc_url, admin_header=admin_header, spec_path=spec_path,
        repository=repository, output=output, overrides=overrides,
        concurrency=_ascending(concurrency, "--concurrency", int),
        rates=_ascending(rates, "--rate", float), refine=refine, warmup_s=warmup,
        duration_s=duration, slo_file=slo_file, profile=slo_profile, p99_ms=p99_ms,
        max_error_ratio=max_error_ratio, min_gain=min_gain, fresh=fresh, write=write, data=data,
        repeats=repeats)
    if not options.concurrency and not options.rates:
        raise UserInputError("--concurrency: give at least one level (or --rate)")
    report = run_tune(options, lambda line: click.echo(line, err=True))
    click.echo(report.table)
    for line in report.lines:
        click.echo(line)
    if report.error is not None:
        raise report.error
