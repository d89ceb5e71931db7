"""Locust event listeners: exact per-request recorder, progress line, Triton statistics, the gate.

Imported by the locustfile. The gate runs in the ``quitting`` listener, while the gevent hub still
runs, and sets ``environment.process_exit_code`` (0 pass, 1 a target missed, 2 gate error).
"""

from __future__ import annotations

import faulthandler
import gc
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any

import gevent
from locust import events

from loadtests import scenarios
from loadtests.users import close_grpc_clients
from tools import stats
from tools.errors import UserInputError
from tools.load import triton_stats
from tools.loadtest import gate
from tools.slo import DEFAULT_SLO_FILE, scenario_slo

logger = logging.getLogger("loadtests")
EXIT_PASS, EXIT_SLO_MISSED, EXIT_GATE_ERROR = 0, 1, 2
OPEN_LOOP_THROUGHPUT_SHARE = 0.95  # an open loop cannot beat its offered rate
# Seconds the interpreter gets to exit after Locust's last word. faulthandler's watchdog is a C
# thread: it still fires when the main thread is stuck in native code during finalisation, prints
# every thread's stack and exits 1.
EXIT_WATCHDOG_S = 15.0

# `kill -USR1 <pid>` (the runner does so before killing a run past its hard timeout) prints every
# thread's Python stack, even when the main thread is blocked in native code.
faulthandler.register(signal.SIGUSR1, all_threads=True)


class Recorder:
    """Keeps every request's exact record and the run's time marks (``perf_counter`` seconds)."""

    def __init__(self) -> None:
        self.records: list[gate.RequestRecord] = []
        self.t0: float | None = None
        self.t0_wall: float | None = None
        self.outbox: list[list[Any]] = []  # worker: records not yet sent to the master
        self.final_from: set[str] = set()  # master: workers whose last records arrived
        self.t_stop: float | None = None
        self.stats_before: dict[str, Any] | None = None
        self.stats_after: dict[str, Any] | None = None
        self.verdicts: list[str] = []
        self.greenlets: list[gevent.Greenlet] = []

    def on_request(
        self,
        request_type: str,
        name: str,
        response_time: float,
        response_length: int,
        exception: BaseException | None = None,
        context: dict[str, Any] | None = None,
        **_: Any,
    ) -> None:
        """Request-event listener: keep the exact latency the user measured."""
        ctx = context or {}
        start = ctx.get("start_perf")
        if start is None or self.t0 is None:
            return
        record = gate.RequestRecord(
            scenario=ctx.get("scenario", name),
            protocol=request_type,
            model=name,
            start_s=start - self.t0,
            latency_ms=float(response_time),
            ok=exception is None,
            error="" if exception is None else str(exception),
            payload=str(ctx.get("payload", "")),
            response_bytes=int(response_length or 0),
        )
        self.records.append(record)
        if self.t0_wall is not None:
            # Distributed runs: the master places records on its own clock by wall time.
            fields = [getattr(record, f) for f in gate.RECORD_FIELDS]
            fields[gate.RECORD_FIELDS.index("start_s")] = self.t0_wall + record.start_s
            self.outbox.append(fields)

    def add_remote(self, rows: list[list[Any]]) -> None:
        """Master: add records a worker sent (``start_s`` there is wall-clock time)."""
        if self.t0_wall is None:
            return
        at = gate.RECORD_FIELDS.index("start_s")
        for row in rows:
            row = list(row)
            row[at] = row[at] - self.t0_wall
            self.records.append(gate.RequestRecord(*row))


RECORDER = Recorder()
RECORDS_MESSAGE, FLUSH_MESSAGE = "triton_forge_records", "triton_forge_flush"
STREAM_INTERVAL_S = 1.0


def _role(environment) -> str:
    from locust.runners import MasterRunner, WorkerRunner

    if isinstance(environment.runner, MasterRunner):
        return "master"
    if isinstance(environment.runner, WorkerRunner):
        return "worker"
    return "local"


def _send_records(environment, final: bool) -> None:
    rows, RECORDER.outbox = RECORDER.outbox, []
    environment.runner.send_message(
        RECORDS_MESSAGE, {"rows": rows, "final": final, "worker": environment.runner.client_id}
    )


def _stream_loop(environment) -> None:
    while True:
        gevent.sleep(STREAM_INTERVAL_S)
        if RECORDER.outbox:
            _send_records(environment, final=False)


def _check_scenarios(environment) -> None:
    """Build every user's scenario now: a bad --scenario or --data ends the run at once (2)."""
    for cls in environment.user_classes:
        try:
            scenarios.chosen(environment.parsed_options, getattr(cls, "default_scenario", ""))
        except UserInputError as exc:
            print(f"SCENARIO ERROR: {exc}", file=sys.stderr, flush=True)
            sys.exit(EXIT_GATE_ERROR)


@events.init.add_listener
def _on_init(environment, **_: Any) -> None:
    role = _role(environment)
    if role != "worker" and environment.parsed_options is not None:
        _check_scenarios(environment)
    # The hub's clock was last read before the imports and the scenario build; Locust's -t timer
    # is set from it right after init, so a stale clock would end the run seconds early.
    gevent.get_hub().loop.update_now()
    if role == "master":

        def on_records(msg, **_kw: Any) -> None:
            RECORDER.add_remote(msg.data["rows"])
            if msg.data["final"]:
                RECORDER.final_from.add(msg.data["worker"])

        environment.runner.register_message(RECORDS_MESSAGE, on_records)
    elif role == "worker":

        def on_flush(msg, **_kw: Any) -> None:
            # The master is stopping: stop our users (gracefully), then send the last records.
            def stop_and_send() -> None:
                environment.runner.stop()
                _send_records(environment, final=True)

            gevent.spawn(stop_and_send)

        environment.runner.register_message(FLUSH_MESSAGE, on_flush)


def _collect_final_records(environment) -> None:
    """Master: ask every worker to stop and send its last records; wait for all of them."""
    workers = {client.id for client in environment.runner.clients.all}
    if not workers:
        return
    environment.runner.send_message(FLUSH_MESSAGE, None)
    deadline = time.monotonic() + (environment.stop_timeout or 0) + 15
    while not workers <= RECORDER.final_from and time.monotonic() < deadline:
        gevent.sleep(0.1)
    missing = workers - RECORDER.final_from
    if missing:
        logger.warning("no final records from worker(s) %s: the last requests may be missing",
                       ", ".join(sorted(missing)))


@events.init_command_line_parser.add_listener
def _add_arguments(parser) -> None:
    group = parser.add_argument_group("triton-forge gate")
    group.add_argument("--arrival-rate", type=float, default=0.0,
                       help="Open loop: total requests/s over all users (0: closed loop).")
    group.add_argument("--max-inflight", type=int, default=256,
                       help="Open loop: outstanding requests per user before arrivals are dropped.")
    group.add_argument("--warmup", type=float, default=5.0,
                       help="Seconds from the start excluded from the gate.")
    group.add_argument("--slo-file", default=str(DEFAULT_SLO_FILE), help="SLO YAML file.")
    group.add_argument("--slo-profile", default="cpu", help="SLO profile (cpu, gpu).")
    group.add_argument("--p99-ms", type=float, default=None,
                       help="P99 target over the SLO file's (enough for a scenario it lacks).")
    group.add_argument("--max-error-ratio", type=float, default=None,
                       help="Error-ratio limit over the SLO file's.")
    scenarios.add_arguments(group)
    group.add_argument("--report-dir", default="loadtest-report",
                       help="Where requests.csv/.json and summary.json are written.")
    group.add_argument("--stats-url", default="",
                       help="host:port for Triton's statistics (default: --host).")
    group.add_argument("--stats-protocol", default="", choices=["", "http", "grpc"],
                       help="Protocol of --stats-url (default: the users' protocol).")
    group.add_argument("--progress-interval", type=float, default=1.0,
                       help="Seconds between progress lines (0: none).")


def _options(environment) -> Any:
    return environment.parsed_options


def _protocols(environment) -> list[str]:
    return sorted({cls.protocol for cls in environment.user_classes if getattr(cls, "protocol", "")})


def _stats_endpoint(environment) -> tuple[str, str]:
    from loadtests.users import strip_scheme

    opts = _options(environment)
    url = strip_scheme(opts.stats_url or environment.host or "")
    protocols = _protocols(environment)
    protocol = opts.stats_protocol or (protocols[0] if len(protocols) == 1 else "http")
    return url, protocol


def _snapshot(environment) -> dict[str, Any] | None:
    url, protocol = _stats_endpoint(environment)
    if not url:
        return None
    try:
        return triton_stats.fetch_statistics(url, protocol)
    except Exception as exc:  # noqa: BLE001 - Triton's view is advisory, the gate is not
        logger.warning("Triton statistics from %s (%s) unavailable: %s", url, protocol, exc)
        return None


def _progress_loop(environment, interval: float) -> None:
    warmup = _options(environment).warmup
    seen = 0
    last = time.perf_counter()
    while True:
        gevent.sleep(interval)
        now = time.perf_counter()
        records = RECORDER.records
        elapsed = now - RECORDER.t0
        new = len(records) - seen
        rps = new / (now - last) if now > last else 0.0
        seen, last = len(records), now
        live = stats.summarize(records, stats.Window(warmup, elapsed)).latency
        p99 = f"{live.p99_ms:.1f}" if live else "-"
        errors = sum(1 for r in records if not r.ok)
        phase = "warmup" if elapsed < warmup else "measure"
        print(
            f"progress t={elapsed:.0f}s phase={phase} requests={len(records)} rps={rps:.1f} "
            f"p99_ms={p99} errors={errors}",
            flush=True,
        )


@events.request.add_listener
def _on_request(**kwargs: Any) -> None:
    RECORDER.on_request(**kwargs)


@events.test_start.add_listener
def _on_test_start(environment, **_: Any) -> None:
    RECORDER.t0 = time.perf_counter()
    role = _role(environment)
    if role != "local":
        RECORDER.t0_wall = time.time()
    if role == "worker":
        RECORDER.greenlets.append(gevent.spawn(_stream_loop, environment))
        return
    opts = _options(environment)

    def take_before() -> None:
        RECORDER.stats_before = _snapshot(environment)

    RECORDER.greenlets.append(gevent.spawn_later(opts.warmup, take_before))
    if opts.progress_interval > 0:
        RECORDER.greenlets.append(gevent.spawn(_progress_loop, environment, opts.progress_interval))


@events.test_stopping.add_listener
def _on_test_stopping(environment, **_: Any) -> None:
    if RECORDER.t_stop is None:
        RECORDER.t_stop = time.perf_counter()


@events.test_stop.add_listener
def _on_test_stop(environment, **_: Any) -> None:
    for greenlet in RECORDER.greenlets:
        greenlet.kill(block=False)
    role = _role(environment)
    if role == "worker":
        return
    if role == "master":
        _collect_final_records(environment)
    if RECORDER.stats_before is not None:
        RECORDER.stats_after = _snapshot(environment)


def _load_described(environment) -> dict[str, Any]:
    """Per scenario: what each input sends, how many distinct requests, their digest."""
    out = {}
    for cls in environment.user_classes:
        scenario = scenarios.chosen(_options(environment), cls.default_scenario)
        out[scenario.name] = {"spec": str(Path(_options(environment).spec).resolve()),
                              "inputs": scenario.describe(), "requests": len(scenario.requests),
                              "digest": scenario.digest}
    return out


def run_gate(environment) -> int:
    """Summarise, write the reports, print the verdicts and return the exit code."""
    opts = _options(environment)
    if RECORDER.t0 is None:
        RECORDER.verdicts = ["GATE ERROR: the test never started"]
        return EXIT_GATE_ERROR
    stop_s = (RECORDER.t_stop or time.perf_counter()) - RECORDER.t0
    report_dir = Path(opts.report_dir)
    records = sorted(RECORDER.records, key=lambda r: r.start_s)
    gate.write_records(records, report_dir / "requests.csv", report_dir / "requests.json")
    pairs = sorted({(scenarios.name_of(opts, cls.default_scenario), cls.protocol)
                    for cls in environment.user_classes})
    results, verdicts, code = [], [], EXIT_PASS
    for scenario, protocol in pairs:
        summary = gate.summarize(
            records, scenario=scenario, protocol=protocol, warmup_s=opts.warmup, stop_s=stop_s
        )
        slo = scenario_slo(Path(opts.slo_file), opts.slo_profile, scenario, p99_ms=opts.p99_ms,
                           max_error_ratio=opts.max_error_ratio)
        targets = slo.targets[protocol]
        if opts.arrival_rate > 0 and targets.min_throughput_rps is not None:
            capped = min(targets.min_throughput_rps, OPEN_LOOP_THROUGHPUT_SHARE * opts.arrival_rate)
            targets = gate.Targets(targets.p99_ms, targets.max_error_ratio, capped)
        missed = gate.violations(summary, targets)
        line = gate.verdict_line(summary, targets, opts.slo_profile)
        # The scenario's requests go to the model of its own name (the request event's name).
        stats_entry = environment.stats.entries.get((scenario, protocol))
        locust_p99 = stats_entry.get_response_time_percentile(0.99) if stats_entry else None
        print(gate.format_summary(summary), flush=True)
        results.append(
            {
                "summary": summary.to_dict(),
                "targets": vars(targets),
                "targets_from": slo.source,
                "violations": missed,
                "verdict": line,
                "locust_rounded_p99_ms_all_requests": locust_p99,
            }
        )
        verdicts.append(line)
        if missed:
            code = EXIT_SLO_MISSED
    exceptions = list(getattr(environment.runner, "exceptions", {}).values())
    if exceptions:
        first = " ".join(str(exceptions[0].get("msg", "")).split())[:200]
        verdicts.append(f"GATE ERROR: user code raised {len(exceptions)} kind(s) of exception: {first}")
        code = max(code, EXIT_GATE_ERROR)
    triton: dict[str, Any] = {}
    if RECORDER.stats_before is not None and RECORDER.stats_after is not None:
        models = triton_stats.window(RECORDER.stats_before, RECORDER.stats_after)
        triton = {name: m.to_dict() for name, m in models.items()}
        print(triton_stats.format_window(models), flush=True)
    gate.write_summary(
        report_dir / "summary.json",
        {
            "profile": opts.slo_profile,
            "slo_file": str(Path(opts.slo_file).resolve()),
            "host": environment.host,
            "mode": "open" if opts.arrival_rate > 0 else "closed",
            "users": opts.num_users,
            "arrival_rate": opts.arrival_rate or None,
            "warmup_s": opts.warmup,
            "stop_s": stop_s,
            "percentile_method": stats.METHOD,
            "load": _load_described(environment),
            "results": results,
            "triton": triton,
            "exit_code": code,
            "verdicts": verdicts,
        },
    )
    gate.write_summary(report_dir / "triton_stats.json", triton)
    (report_dir / "verdict.txt").write_text("\n".join(verdicts) + "\n", encoding="utf-8")
    RECORDER.verdicts = verdicts
    return code


@events.quitting.add_listener
def _on_quitting(environment, **_: Any) -> None:
    if _role(environment) == "worker":  # the master gates the records workers sent it
        close_grpc_clients()
        gc.collect()
        return
    try:
        code = run_gate(environment)
    except Exception as exc:
        logger.exception("gate failed")
        RECORDER.verdicts = [f"GATE ERROR: {type(exc).__name__}: {exc}"]
        code = EXIT_GATE_ERROR
    finally:
        close_grpc_clients()
        # Finalise leftover gRPC objects now, while gevent can still drive their completion.
        gc.collect()
    environment.process_exit_code = code
    for line in RECORDER.verdicts:
        print(line, flush=True)


@events.quit.add_listener
def _on_quit(exit_code: int, **_: Any) -> None:
    # Repeat the verdicts after Locust's own summary tables, so the last lines say why.
    for line in RECORDER.verdicts:
        print(line, file=sys.stdout, flush=True)
    faulthandler.dump_traceback_later(EXIT_WATCHDOG_S, exit=True)
