"""``tools loadtest``: run the Locust scenarios headless against a server and gate them on SLOs.

Each scenario and protocol is one Locust child process under a hard timeout; the server is given
(``--url``/``--grpc-url``) or started embedded on a built repository (``--repository``).
"""

from __future__ import annotations

import json
import sys
import time

from pathlib import Path

import click

from tools.command import ToolCommand
from tools.errors import LoadTestError, UserInputError
from tools.loadtest.runner import RunResult, RunSpec, run_locust
from tools.loadtest.slo import DEFAULT_SLO_FILE, PROTOCOLS, load_slo

SCENARIO_NAMES = ("text_embedding", "image_classification")


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
            f"[{spec.scenario}/{spec.protocol}] t={fields.get('t', '?')} {fields.get('phase', '')}"
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
) -> list[RunResult]:
    """Run every scenario over every protocol, one after the other, and return the results.

    Load, duration and warm-up default to the scenario's ``load`` in the SLO file.

    Raises:
        UserInputError: an endpoint for a requested protocol is missing, or the SLO file is bad.
    """
    endpoints = {"http": url, "grpc": grpc_url}
    for protocol in protocols:
        if not endpoints[protocol]:
            option = "--url" if protocol == "http" else "--grpc-url"
            raise UserInputError(f"protocol {protocol} needs {option} (or --repository)")
    progress = _Progress()
    results = []
    for scenario in scenarios:
        slo = load_slo(slo_file, slo_profile, scenario)
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
            )
            load = f"{spec.rate:g} req/s open loop" if spec.rate else f"{spec.users} users"
            click.echo(
                f"== {scenario} over {protocol} at {spec.host}: {load}, "
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


@click.command("loadtest", cls=ToolCommand)
@click.option("--scenario", "scenarios", multiple=True, type=click.Choice(SCENARIO_NAMES),
              help="Scenario to run (repeatable) [default: all].")
@click.option("--protocol", type=click.Choice(["http", "grpc", "both"]), default="both",
              show_default=True, help="Client protocol; both runs them one after the other.")
@click.option("--url", help="HTTP endpoint host:port of a running server (also used for statistics).")
@click.option("--grpc-url", help="gRPC endpoint host:port of a running server.")
@click.option("--repository", type=click.Path(file_okay=False, path_type=Path),
              help="Start the embedded tritonserver on this built repository instead.")
@click.option("--users", type=click.IntRange(min=1), help="Closed loop: concurrent users.")
@click.option("--rate", type=click.FloatRange(min=0.001),
              help="Open loop: arrivals per second, independent of response times.")
@click.option("--duration", type=click.FloatRange(min=1), help="Measured seconds after warm-up.")
@click.option("--warmup", type=click.FloatRange(min=0), help="Seconds excluded at the start.")
@click.option("--slo-profile", type=click.Choice(["cpu", "gpu"]), default="cpu", show_default=True)
@click.option("--slo-file", type=click.Path(dir_okay=False, path_type=Path),
              default=DEFAULT_SLO_FILE, show_default="loadtests/slo.yaml of this project",
              help="SLO targets and default loads per profile and scenario.")
@click.option("--report-dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("loadtest-report"), show_default=True)
@click.option("--stop-timeout", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds requests in flight at the end may take to finish.")
@click.option("--timeout", "hard_timeout", type=click.FloatRange(min=1),
              help="Hard wall-clock limit per run [default: warm-up + duration + allowances].")
def loadtest(
    scenarios: tuple[str, ...],
    protocol: str,
    url: str | None,
    grpc_url: str | None,
    repository: Path | None,
    users: int | None,
    rate: float | None,
    duration: float | None,
    warmup: float | None,
    slo_profile: str,
    slo_file: Path,
    report_dir: Path,
    stop_timeout: float,
    hard_timeout: float | None,
) -> None:
    """Run Locust scenarios headless and gate them on exact P99, error ratio and throughput.

    Latencies are each request's exact time (not Locust's rounded buckets); the warm-up is left
    out. Per run, REPORT_DIR/<scenario>-<protocol>/ gets requests.csv/.json (raw records),
    summary.json (percentiles, targets, Triton's queue/compute view and mean executed batch),
    locust.html and locust.log. Exits 1 with one line per missed target.

    \b
    Examples:
      tools loadtest --repository model_repository
      tools loadtest --url 127.0.0.1:8000 --grpc-url 127.0.0.1:8001 --scenario text_embedding \\
          --protocol grpc --rate 40 --duration 60
    """
    if users and rate:
        raise UserInputError("give --users (closed loop) or --rate (open loop), not both")
    if repository is not None and (url or grpc_url):
        raise UserInputError("give --repository (embedded server) or --url/--grpc-url, not both")
    if repository is None and not (url or grpc_url):
        raise UserInputError("give --url/--grpc-url of a running server, or --repository")
    chosen = scenarios or SCENARIO_NAMES
    protocols = PROTOCOLS if protocol == "both" else (protocol,)
    for scenario in chosen:  # fail on a bad SLO file before starting anything
        load_slo(slo_file, slo_profile, scenario)
    from tools.serve.session import endpoints

    say = lambda line: click.echo(line, err=True)  # noqa: E731
    with endpoints(repository, url, grpc_url, report_dir / "tritonserver.log", say) as (
        http_url, grpc_endpoint
    ):
        results = run_loadtests(
            scenarios=tuple(chosen),
            protocols=protocols,
            url=http_url,
            grpc_url=grpc_endpoint,
            users=users,
            rate=rate,
            duration_s=duration,
            warmup_s=warmup,
            slo_file=slo_file,
            slo_profile=slo_profile,
            report_dir=report_dir,
            stop_timeout_s=stop_timeout,
            hard_timeout_s=hard_timeout,
        )
    overview = write_overview(results, report_dir)
    click.echo(f"reports: {report_dir}/ (overview {overview})", err=True)
    failed = [r for r in results if not r.passed]
    if failed:
        reasons = []
        for r in failed:
            bad = [v for v in r.verdicts if not v.startswith("SLO PASS")]
            reasons.extend(bad or [f"{r.spec.scenario}/{r.spec.protocol}: exit code {r.exit_code}"])
        raise LoadTestError(f"{len(failed)} of {len(results)} runs failed: " + " | ".join(reasons))
