"""Run one Locust scenario headless in a child process, under a hard timeout, and read its gate.

The child runs in its own process group; past the deadline it gets SIGUSR1 (stack dump), then
SIGTERM, then SIGKILL for the whole group, and the run fails with a line naming its log. Ctrl-C
or any other exception while waiting kills the group the same way and is re-raised: no Locust
process outlives the runner.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools import paths
from tools import process
from tools.errors import LoadTestError

LOCUSTFILE = paths.LOCUSTFILE
DEFAULT_SPEC = paths.SPEC_FILE
STARTUP_ALLOWANCE_S = 60.0  # importing locust/tritonclient and connecting, on a busy machine
EXIT_ALLOWANCE_S = 30.0  # the gate, reports, and the in-process exit watchdog
_TERM_WAIT_S = 5.0  # Locust's own shutdown after SIGTERM
_PROGRESS = re.compile(r"^progress (?P<fields>(?:\w+=\S+ ?)+)$")


@dataclass(frozen=True)
class RunSpec:
    """One headless Locust run: a scenario over one protocol at one load.

    Attributes:
        scenario: A pipeline or model of ``spec`` (``tools.load.scenario``).
        protocol: ``http`` or ``grpc``.
        host: ``host:port`` of the endpoint of ``protocol``.
        users: Closed-loop users (ignored when ``rate`` is set, which uses ``dispatchers``).
        rate: Open-loop arrival rate, requests per second over all dispatchers.
        duration_s: Measured seconds after the warm-up.
        warmup_s: Seconds excluded from the gate at the start.
        slo_file: SLO YAML file.
        slo_profile: Profile in the SLO file.
        report_dir: Where this run's reports go.
        stats_url: ``host:port`` of Triton's HTTP endpoint for statistics (default: ``host``).
        stop_timeout_s: How long requests in flight at the end may take to finish.
        dispatchers: Open-loop dispatcher users sharing ``rate``.
        spec: The repository spec the scenario's load is derived from.
        data: Payloads instead of the shipped ones (texts, images folder, JSON lines).
        p99_ms: P99 target over the SLO file's (enough when the file has no entry).
        max_error_ratio: Error-ratio limit over the SLO file's.
        api: ``openai`` or ``tei``: send the scenario through that API's route of the gateway
            at ``host`` (``tools/api``) instead of KServe v2; None: KServe v2 over ``protocol``.
    """

    scenario: str
    protocol: str
    host: str
    users: int | None
    rate: float | None
    duration_s: float
    warmup_s: float
    slo_file: Path
    slo_profile: str
    report_dir: Path
    stats_url: str = ""
    stop_timeout_s: float = 30.0
    dispatchers: int = 1
    spec: Path = DEFAULT_SPEC
    data: Path | None = None
    p99_ms: float | None = None
    max_error_ratio: float | None = None
    api: str | None = None

    @property
    def user_class(self) -> str:
        """The locustfile's user of this protocol (``ScenarioHttpUser``, ``ScenarioGrpcUser``) or
        API (``ScenarioOpenaiUser``, ``ScenarioTeiUser``)."""
        return f"Scenario{(self.api or self.protocol).capitalize()}User"

    @property
    def label(self) -> str:
        """``scenario/protocol``, or ``scenario/api`` through the gateway."""
        return f"{self.scenario}/{self.api or self.protocol}"

    @property
    def hard_timeout_s(self) -> float:
        """Wall-clock limit of the whole child process."""
        return (
            STARTUP_ALLOWANCE_S + self.warmup_s + self.duration_s + self.stop_timeout_s
            + EXIT_ALLOWANCE_S
        )


@dataclass
class RunResult:
    """What one run produced."""

    spec: RunSpec
    exit_code: int
    verdicts: list[str]
    summary: dict[str, Any]
    log_path: Path
    seconds: float
    timed_out: bool = False
    output: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True when the gate passed and the child exited cleanly."""
        return self.exit_code == 0 and not self.timed_out


def locust_command(spec: RunSpec) -> list[str]:
    """The child's command line (same interpreter, this project's locustfile)."""
    users = spec.dispatchers if spec.rate else spec.users
    if not users or users < 1:
        raise LoadTestError(f"{spec.label}: users must be >= 1, got {users}")
    cmd = [
        sys.executable, "-m", "locust",
        "-f", str(paths.project_file(LOCUSTFILE, "the Locust scenarios of tools loadtest")),
        "--headless", "--only-summary",
        "--host", spec.host,
        "-u", str(users), "-r", str(users),
        "-t", f"{spec.warmup_s + spec.duration_s:g}s",
        "--stop-timeout", f"{spec.stop_timeout_s:g}",
        "--html", str(spec.report_dir / "locust.html"),
        "--warmup", f"{spec.warmup_s:g}",
        "--slo-file", str(spec.slo_file),
        "--slo-profile", spec.slo_profile,
        "--report-dir", str(spec.report_dir),
        "--scenario", spec.scenario,
        "--spec", str(Path(spec.spec).resolve()),
    ]
    if spec.data is not None:
        cmd += ["--data", str(Path(spec.data).resolve())]
    if spec.p99_ms is not None:
        cmd += ["--p99-ms", f"{spec.p99_ms:g}"]
    if spec.max_error_ratio is not None:
        cmd += ["--max-error-ratio", f"{spec.max_error_ratio:g}"]
    if spec.rate:
        cmd += ["--arrival-rate", f"{spec.rate:g}"]
    if spec.stats_url:
        cmd += ["--stats-url", spec.stats_url, "--stats-protocol", "http"]
    cmd.append(spec.user_class)
    return cmd


def parse_progress(line: str) -> dict[str, str] | None:
    """Fields of a ``progress k=v ...`` line printed by the locustfile, else None."""
    match = _PROGRESS.match(line.strip())
    if not match:
        return None
    return dict(item.split("=", 1) for item in match.group("fields").split())


def _kill_group(proc: subprocess.Popen, log: Any, *, dump_stacks: bool = True) -> None:
    """SIGUSR1 (stack dump, optional), SIGTERM, then SIGKILL to the child's process group and
    any descendant that left it; each step waits for the child, and SIGKILL goes to the group
    even when the child is gone, so no worker or grandchild survives it."""
    survivors = process.stop(
        proc, _TERM_WAIT_S, first_signal=(signal.SIGUSR1, 1.0) if dump_stacks else None
    )
    if survivors:
        log.write(f"process group {proc.pid} did not die after SIGKILL: {survivors}\n")


def _read_summary(path: Path) -> dict[str, Any]:
    """The gate's summary.json, or {} when the run wrote none.

    Raises:
        LoadTestError: the file exists but is not a JSON object (say, half-written by a run
            that was killed).
    """
    if not path.exists():
        return {}
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LoadTestError(f"gate summary {path} is unreadable or not JSON: {exc}") from exc
    if not isinstance(summary, dict):
        raise LoadTestError(f"gate summary {path} is not a JSON object")
    return summary


def run_locust(
    spec: RunSpec,
    *,
    on_progress: Callable[[RunSpec, dict[str, str]], None] | None = None,
    hard_timeout_s: float | None = None,
) -> RunResult:
    """Run one scenario and return its gate's result; never waits past the hard timeout.

    Args:
        spec: What to run.
        on_progress: Called with each progress line's fields (requests, rps, p99_ms, ...).
        hard_timeout_s: Override of ``spec.hard_timeout_s``.

    Raises:
        LoadTestError: Locust could not be started.
    """
    spec.report_dir.mkdir(parents=True, exist_ok=True)
    log_path = spec.report_dir / "locust.log"
    for stale in ("summary.json", "verdict.txt", "requests.csv", "requests.json"):
        (spec.report_dir / stale).unlink(missing_ok=True)
    cmd = locust_command(spec)
    limit = hard_timeout_s if hard_timeout_s is not None else spec.hard_timeout_s
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    output: list[str] = []
    start = time.monotonic()
    with log_path.open("w", encoding="utf-8") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        try:
            proc = process.start(
                cmd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                encoding="utf-8",
                errors="replace",
            )
        except OSError as exc:
            raise LoadTestError(f"cannot start locust ({cmd[0]}): {exc}") from exc

        failure: list[BaseException] = []

        def pump() -> None:
            assert proc.stdout is not None
            try:
                for line in proc.stdout:
                    fields = parse_progress(line)
                    if fields is not None:
                        if on_progress is not None:
                            on_progress(spec, fields)
                        continue
                    output.append(line.rstrip("\n"))
                    log.write(line)
                    log.flush()
            except BaseException as exc:  # noqa: BLE001 - re-raised by the main thread
                failure.append(exc)
                process.kill(proc.pid)

        reader = threading.Thread(target=pump, daemon=True)
        timed_out = False
        try:
            reader.start()
            try:
                proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                timed_out = True
                log.write(
                    f"\nhard timeout: locust still running after {limit:.0f} s; killing group\n"
                )
                _kill_group(proc, log)
            reader.join(timeout=10)
            if failure:
                raise failure[0]
        except BaseException as exc:  # Ctrl-C, a failing callback, anything: no orphan Locust
            log.write(f"\ninterrupted ({type(exc).__name__}); killing group {proc.pid}\n")
            _kill_group(proc, log, dump_stacks=False)
            raise
    seconds = time.monotonic() - start
    summary = _read_summary(spec.report_dir / "summary.json")
    verdicts = list(summary.get("verdicts", []))
    code = proc.returncode if proc.returncode is not None else -9
    log_text = log_path.read_text(encoding="utf-8", errors="replace")
    if timed_out:
        verdicts.append(
            f"LOCUST TIMEOUT {spec.label}: still running after {limit:.0f} s,"
            f" process group killed (stacks and log: {log_path})"
        )
    elif "Timeout (0:" in log_text and summary:
        verdicts.append(
            f"LOCUST EXIT HANG {spec.label}: the gate ran but the interpreter"
            f" hung while exiting; the exit watchdog ended it (stacks in {log_path})"
        )
    elif not summary:
        tail = [line for line in log_text.splitlines() if line.strip()][-3:]
        verdicts.append(
            f"LOCUST ERROR {spec.label}: exit code {code} without a gate"
            f" summary; log {log_path}: " + " | ".join(tail)[-400:]
        )
    return RunResult(
        spec=spec,
        exit_code=code,
        verdicts=verdicts,
        summary=summary,
        log_path=log_path,
        seconds=seconds,
        timed_out=timed_out,
        output=output,
    )
