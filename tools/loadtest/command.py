"""``tools loadtest``: run Locust headless on any pipeline or model of the spec, gated on SLOs.

Each scenario and protocol is one Locust child process under a hard timeout; the load is derived
from the spec's inputs (``tools.load.scenario``); the server is given (``--url``/``--grpc-url``)
or started embedded on a built repository (``--repository``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time

from pathlib import Path

import click

from tools.command import (
    HTTP_EXAMPLE,
    HostPort,
    ToolCommand,
    data_option,
    grpc_url_option,
    option,
    protocol_option,
    scenario_names,
    slo_file_option,
    spec_option,
    url_option,
)
from tools.errors import LoadTestError, UserInputError
from tools.load.scenario import Scenario, build_scenario
from tools.loadtest.runner import DEFAULT_SPEC, RunResult, RunSpec, run_locust
from tools.slo import (
    PROTOCOLS,
    NoScenarioSLO,
    default_slo_file,
    load_slo,
    scenario_slo,
)


class _Progress:
    """One live line on a terminal; a line every few seconds otherwise."""

    def __init__(self, stream=sys.stderr, every_s: float = 5.0) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._every_s = every_s
        self._last = 0.0
        self._width = 0

    def __call__(self, spec: RunSpec, fields: dict[str, str]) -> None:
        line = (
            f"[{spec.label}] t={fields.get('t', '?')} {fields.get('phase', '')}"
            f"  requests {fields.get('requests', '?')}  {fields.get('rps', '?')} req/s"
            f"  P99 {fields.get('p99_ms', '-')} ms  errors {fields.get('errors', '0')}"
        )
        if self._tty:
            self._width = max(self._width, len(line))
            self._stream.write("\r" + line.ljust(self._width))
            self._stream.flush()
        elif time.monotonic() - self._last >= self._every_s:
            self._last = time.monotonic()
            self._stream.write(line + "\n")
            self._stream.flush()

    def end(self) -> None:
        if self._tty and self._width:
            self._stream.write("\n")
            self._stream.flush()
            self._width = 0


def run_loadtests(
    *,
    scenarios: tuple[str, ...],
    protocols: tuple[str, ...],
    url: str | None,
    grpc_url: str | None,
    users: int | None,
    rate: float | None,
    duration_s: float | None,
    warmup_s: float | None,
    slo_file: Path,
    slo_profile: str,
    report_dir: Path,
    stop_timeout_s: float = 30.0,
    hard_timeout_s: float | None = None,
    echo_output: bool = True,
    spec_path: Path = DEFAULT_SPEC,
    data: Path | None = None,
    p99_ms: float | None = None,
    max_error_ratio: float | None = None,
    api: str | None = None,
    api_url: str | None = None,
) -> list[RunResult]:
    """Run every scenario over every protocol, one after the other, and return the results.

    Load, duration and warm-up default to the scenario's ``load`` in the SLO file (or
    ``DEFAULT_LOAD`` for a scenario only ``p99_ms`` gives targets to). With ``api``
    (``openai``, ``tei``) each scenario goes through that API's route of the gateway at
    ``api_url`` (default ``url``: a front that routes both), gated on the HTTP targets.

    Raises:
        UserInputError: an endpoint for a requested protocol is missing, a scenario is not in
            the spec, ``data`` does not fit it, or the SLO file is bad or lacks the scenario.
    """
    endpoints = {"http": (api_url or url) if api else url, "grpc": grpc_url}
    for protocol in protocols:
        if not endpoints[protocol]:
            option = "--url" if protocol == "http" else "--grpc-url"
            raise UserInputError(f"protocol {protocol} needs {option} (or --repository)")
    progress = _Progress()
    results = []
    for scenario in scenarios:
        slo = scenario_slo(slo_file, slo_profile, scenario, p99_ms=p99_ms,
                           max_error_ratio=max_error_ratio)
        for protocol in protocols:
            run_users = users if (users or rate) else slo.load.users
            run_rate = rate if (users or rate) else slo.load.rate
            spec = RunSpec(
                scenario=scenario,
                protocol=protocol,
                host=endpoints[protocol],
                users=run_users,
                rate=run_rate,
                duration_s=duration_s if duration_s is not None else slo.load.duration_s,
                warmup_s=warmup_s if warmup_s is not None else slo.load.warmup_s,
                slo_file=slo_file,
                slo_profile=slo_profile,
                report_dir=report_dir / f"{scenario}-{protocol}",
                stats_url=url or "",
                stop_timeout_s=stop_timeout_s,
                spec=spec_path,
                data=data,
                p99_ms=p99_ms,
                max_error_ratio=max_error_ratio,
                api=api,
            )
            if api:
                spec = dataclasses.replace(spec, report_dir=report_dir / f"{scenario}-{api}")
            load = f"{spec.rate:g} req/s open loop" if spec.rate else f"{spec.users} users"
            via = f"through the {api} API" if api else f"over {protocol}"
            click.echo(
                f"== {scenario} {via} at {spec.host}: {load}, "
                f"{spec.warmup_s:g} s warm-up + {spec.duration_s:g} s",
                err=True,
            )
            result = run_locust(spec, on_progress=progress, hard_timeout_s=hard_timeout_s)
            progress.end()
            if echo_output:
                for line in result.output:
                    if line.strip() and not line.startswith(("SLO ", "GATE ")):
                        click.echo(line)
                for line in result.verdicts:
                    click.echo(line)
            results.append(result)
    return results


def write_overview(results: list[RunResult], report_dir: Path) -> Path:
    """Write ``report_dir/summary.json`` listing every run's verdicts and report folder."""
    path = report_dir / "summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    overview = [
        {
            "scenario": r.spec.scenario,
            "protocol": r.spec.protocol,
            "api": r.spec.api,
            "passed": r.passed,
            "exit_code": r.exit_code,
            "timed_out": r.timed_out,
            "seconds": round(r.seconds, 1),
            "report_dir": str(r.spec.report_dir),
            "verdicts": r.verdicts,
            "results": r.summary.get("results", []),
        }
        for r in results
    ]
    path.write_text(json.dumps(overview, indent=2) + "\n", encoding="utf-8")
    return path


def chosen_scenarios(spec_path: Path, names: tuple[str, ...], data: Path | None,
                     slo_file: Path, slo_profile: str) -> list[Scenario]:
    """The scenarios to run, built (and so checked) before any server starts.

    Without names: every pipeline of the spec that has an entry in the SLO profile.

    Raises:
        UserInputError: a name is not in the spec (the known ones listed), ``data`` does not fit
            a scenario (file, line and input named), or no pipeline has an SLO entry.
    """
    from tools.build_repo.spec import load_spec

    spec = load_spec(spec_path)
    if not names:
        with_slo = []
        for pipeline in spec.for_target(spec.target).pipelines:
            try:
                load_slo(slo_file, slo_profile, pipeline.name)
            except NoScenarioSLO:
                continue
            with_slo.append(pipeline.name)
        if not with_slo:
            raise UserInputError(f"no pipeline of {spec.path} has an SLO in {slo_file} (profile "
                                 f"{slo_profile}); name one with --scenario (and --p99-ms)")
        names = tuple(with_slo)
    return [build_scenario(spec, name, data) for name in names]


@click.command("loadtest", cls=ToolCommand)
@option("--scenario", "scenarios", multiple=True, metavar="NAME",
        help="Pipeline or model of the spec to load (repeatable, or comma-separated) [default: "
        "every pipeline with an SLO entry].")
@spec_option("The spec the scenarios' load is derived from.")
@data_option()
@protocol_option(["http", "grpc", "both"], "both",
                 "Client protocol; both runs them one after the other.")
@url_option("a running server (also used for statistics).")
@grpc_url_option("a running server.")
@option("--repository", type=click.Path(file_okay=False, path_type=Path),
        help="Start the embedded tritonserver on this built repository instead.")
@option("--api", type=click.Choice(["openai", "tei"]),
        help="Send each scenario through this API's route of the gateway (OpenAI's "
        "/v1/embeddings; TEI's /embed, /rerank or /predict, by the pipeline's kind) instead of "
        "KServe v2, gated on the SLO file's HTTP targets (docs/api.md).")
@option("--api-url", type=HostPort(HTTP_EXAMPLE),
        help="The gateway, when it is not behind the same front as --url [default: --url; "
        "with --repository, a gateway started in front of the embedded server].")
@option("--concurrency", type=click.IntRange(min=1), old_names=("--users",),
        help="Closed loop: requests in flight (Locust users, each sending its next request when "
        "the last is answered) [default: the SLO entry's load].")
@option("--rate", type=click.FloatRange(min=0.001),
        help="Open loop: arrivals per second, independent of response times.")
@option("--duration", type=click.FloatRange(min=1),
        help="Measured seconds after warm-up [default: the SLO entry's].")
@option("--warmup", type=click.FloatRange(min=0),
        help="Unmeasured seconds at the start [default: the SLO entry's].")
@option("--p99-ms", type=click.FloatRange(min=0, min_open=True),
        help="P99 target over the SLO file's; enough for a scenario without an entry.")
@option("--max-error-ratio", type=click.FloatRange(min=0, max=1),
        help="Error-ratio limit over the SLO file's (default for a scenario without an "
        "entry: 0).")
@option("--slo-profile", type=click.Choice(["cpu", "gpu"]), default="cpu", show_default=True,
        help="Profile of the SLO file.")
@slo_file_option()
@option("--output", type=click.Path(file_okay=False, path_type=Path),
        default=Path("loadtest-report"), show_default=True, old_names=("--report-dir",),
        help="Folder for the reports: OUTPUT/<scenario>-<protocol>/ per run, and an overview.")
@option("--stop-timeout", type=click.FloatRange(min=0), default=30.0, show_default=True,
        help="Seconds requests in flight at the end may take to finish.")
@option("--timeout", "hard_timeout", type=click.FloatRange(min=1),
        help="Hard wall-clock limit per run [default: warm-up + duration + allowances].")
def loadtest(
    scenarios: tuple[str, ...],
    spec_path: Path,
    data: Path | None,
    protocol: str,
    url: str | None,
    grpc_url: str | None,
    repository: Path | None,
    concurrency: int | None,
    rate: float | None,
    duration: float | None,
    warmup: float | None,
    p99_ms: float | None,
    max_error_ratio: float | None,
    slo_profile: str,
    slo_file: Path | None,
    output: Path,
    stop_timeout: float,
    hard_timeout: float | None,
    api: str | None,
    api_url: str | None,
) -> None:
    """Load pipelines or models of the spec with Locust and gate them on exact P99, error ratio
    and throughput.

    The load is derived from each scenario's typed inputs: texts for a string input a tokenizer
    reads, the shipped photos for one an image step reads, text pairs for two text inputs,
    generated tensors within the spec's shape ranges for a raw model; --data replaces them.
    Latencies are each request's exact time (not Locust's rounded buckets); the warm-up is left
    out. Per run, OUTPUT/<scenario>-<protocol>/ gets requests.csv/.json (raw records),
    summary.json (percentiles, targets, what was sent, Triton's queue/compute view and mean
    executed batch), locust.html and locust.log. Exits 1 with one line per missed target.

    \b
    Examples:
      tools loadtest --repository model_repository
      tools loadtest --url 127.0.0.1:8000 --grpc-url 127.0.0.1:8001 --scenario text_embedding \\
          --protocol grpc --rate 40 --duration 60
      tools loadtest --repository model_repository --scenario minilm_encoder --p99-ms 500
      tools loadtest --repository model_repository --scenario text_embedding --api openai
    """
    if concurrency and rate:
        raise UserInputError("give --concurrency (closed loop) or --rate (open loop), not both")
    if repository is not None and (url or grpc_url):
        raise UserInputError("give --repository (embedded server) or --url/--grpc-url, not both")
    if repository is None and not (url or grpc_url):
        raise UserInputError("give --url/--grpc-url of a running server, or --repository")
    if api and protocol == "grpc":
        raise UserInputError("--api sends JSON over HTTP: leave out --protocol grpc")
    if api_url and not api:
        raise UserInputError("--api-url is the gateway of --api: give --api openai or tei")
    slo_file = slo_file if slo_file is not None else default_slo_file(spec_path)
    chosen = chosen_scenarios(spec_path, scenario_names(scenarios), data, slo_file, slo_profile)
    protocols = ("http",) if api else PROTOCOLS if protocol == "both" else (protocol,)
    if api:
        from tools.api.client import scenario_route

        for scenario in chosen:  # refuse a kind the API does not serve before starting anything
            scenario_route(scenario, api)
    for scenario in chosen:  # fail on a bad SLO file before starting anything
        scenario_slo(slo_file, slo_profile, scenario.name, p99_ms=p99_ms,
                     max_error_ratio=max_error_ratio)
        click.echo(f"{scenario.name}: {len(scenario.requests)} distinct requests", err=True)
        for line in scenario.describe():
            click.echo(f"  {line}", err=True)
    from tools.serve.session import endpoints

    say = lambda line: click.echo(line, err=True)  # noqa: E731
    with contextlib.ExitStack() as stack:
        http_url, grpc_endpoint = stack.enter_context(
            endpoints(repository, url, grpc_url, output / "tritonserver.log", say))
        if api and repository is not None:
            from tools.api.server import ApiServer

            gateway = ApiServer(http_url, repository, log_path=output / "api.log")
            say(f"starting the API gateway in front of it (log {gateway.log_path}) ...")
            api_url = stack.enter_context(gateway).url
            say(f"gateway ready: http {api_url}")
        results = run_loadtests(
            scenarios=tuple(s.name for s in chosen),
            protocols=protocols,
            url=http_url,
            grpc_url=grpc_endpoint,
            users=concurrency,
            rate=rate,
            duration_s=duration,
            warmup_s=warmup,
            slo_file=slo_file,
            slo_profile=slo_profile,
            report_dir=output,
            stop_timeout_s=stop_timeout,
            hard_timeout_s=hard_timeout,
            spec_path=spec_path,
            data=data,
            p99_ms=p99_ms,
            max_error_ratio=max_error_ratio,
            api=api,
            api_url=api_url,
        )
    overview = write_overview(results, output)
    click.echo(f"reports: {output}/ (overview {overview})", err=True)
    failed = [r for r in results if not r.passed]
    if failed:
        reasons = []
        for r in failed:
            bad = [v for v in r.verdicts if not v.startswith("SLO PASS")]
            reasons.extend(bad or [f"{r.spec.label}: exit code {r.exit_code}"])
        raise LoadTestError(f"{len(failed)} of {len(results)} runs failed: " + " | ".join(reasons))
