"""Run tritonserver in the container: reload a model whose Python stub died, and stop the
server when its models stop answering.

Per-model recovery (``--recover-models``, the entry point's default): with the server in
``--model-control-mode=explicit`` and its admin key in ``TRITON_ADMIN_KEY``, a dead stub's model
is reloaded within about a second while every other model keeps serving, as ``tools serve`` does
(``tools/serve/model_control.py``); a model that dies more than ``--model-restarts`` times within
``--restart-window`` seconds is unloaded with its ensembles, reported not ready, and loaded
again after ``--retry-backoff`` seconds, doubling while retries fail, up to
``--retry-backoff-max``. Without explicit model control or a key, a dead stub stops the server
at once.

The models' state (ready, recovering, backoff, down) and restart counters are served on
``--forge-metrics-port`` (8003, ``$FORGE_METRICS_PORT``), on the address of Triton's metrics:
``GET /metrics`` (Prometheus text) and ``GET /status`` (JSON).

Compose restarts a container that exits (restart: unless-stopped) but not one that is merely
unhealthy: after ``--failures`` failed checks in a row (tools/serve/health.py, as the
healthcheck; models given up are not checked) this stops the server and exits 1 so the container
restarts. ``--no-restart`` leaves that to the orchestrator (the kubelet's probes).

With ``FORGE_FRONT_ADMIN`` and ``FORGE_FRONT_LOG`` set (compose and the pod set them), the front's
SLO admission controller runs here too, beside tritonserver (``tools.front.controller``): it reads
the per-request log HAProxy sends to ``FORGE_FRONT_LOG``, each model's P99 objective from
tritonserver's own HTTP port (its ``--http-port``), and writes each model's in-flight cap to
HAProxy's runtime API at ``FORGE_FRONT_ADMIN``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # /opt/triton-forge in the image
from tools import process  # noqa: E402
from tools.errors import UserInputError  # noqa: E402
from tools.serve import health  # noqa: E402
from tools.serve.model_control import ModelControl, watch  # noqa: E402
from tools.serve.recovery import (  # noqa: E402
    DEFAULT_METRICS_PORT,
    Backoff,
    ModelRecovery,
    RestartBudget,
    StatusEndpoint,
)

ADMIN_KEY_ENV = "TRITON_ADMIN_KEY"
METRICS_PORT_ENV = "FORGE_METRICS_PORT"
# The front's runtime API and the socket its per-request log goes to (tools/front/haproxy_config.py)
FRONT_ADMIN_ENV, FRONT_LOG_ENV = "FORGE_FRONT_ADMIN", "FORGE_FRONT_LOG"


def _log(message: str) -> None:
    print(f"triton_supervisor: {message}", file=sys.stderr, flush=True)


def stop(server: subprocess.Popen, timeout_s: float) -> int:
    """SIGTERM (Triton finishes in-flight requests), then SIGKILL after ``timeout_s`` for the
    server and every process it started; returns the server's exit code."""
    survivors = process.stop(server, timeout_s, group=False)  # the server shares our group
    if survivors:
        _log(f"processes {survivors} survived SIGKILL")
    return server.returncode


def _recovery_blocker(command: list[str]) -> str | None:
    """Why per-model recovery cannot run for this server command, or None when it can."""
    if "--model-control-mode=explicit" not in command:
        return "the server does not run --model-control-mode=explicit"
    if not os.environ.get(ADMIN_KEY_ENV):
        return f"{ADMIN_KEY_ENV} is not set (the admin key of the model-repository API)"
    return None


def _option(command: list[str], flag: str) -> str | None:
    """The value of ``--flag=value`` or ``--flag value`` in ``command`` (the last one given)."""
    found = None
    for i, arg in enumerate(command):
        if arg.startswith(f"{flag}="):
            found = arg.split("=", 1)[1]
        elif arg == flag and i + 1 < len(command):
            found = command[i + 1]
    return found


def server_http(command: list[str]) -> str:
    """tritonserver ``command``'s own HTTP endpoint as ``HOST:PORT``: its ``--http-address``
    (loopback when it listens on every interface) and ``--http-port`` (Triton's defaults: every
    interface, 8000)."""
    address = _option(command, "--http-address") or "0.0.0.0"
    host = "127.0.0.1" if address in ("0.0.0.0", "::", "[::]") else address
    return f"{host}:{_option(command, '--http-port') or 8000}"


def start_admission(command: list[str]) -> tuple[threading.Thread, threading.Event] | None:
    """The front's admission controller as a thread, when ``FORGE_FRONT_ADMIN`` and
    ``FORGE_FRONT_LOG`` are set; None (logged) otherwise or when it cannot start. Objectives are
    read from tritonserver ``command``'s own HTTP port."""
    admin, log = os.environ.get(FRONT_ADMIN_ENV), os.environ.get(FRONT_LOG_ENV)
    if not (admin and log):
        return None
    triton = server_http(command)
    try:
        from tools.front.controller import run_in_thread

        handle = run_in_thread(admin, log, triton)
    except (ImportError, OSError, ValueError) as exc:
        _log(f"front admission off: cannot start its controller ({exc})")
        return None
    _log(f"front admission on: per-request log from {log}, caps written to the runtime API at "
         f"{admin}, objectives from tritonserver at {triton}")
    return handle


def stop_admission(handle: tuple[threading.Thread, threading.Event] | None) -> None:
    """Stop the controller ``start_admission`` started (nothing when it did not)."""
    if handle is not None:
        thread, stopping = handle
        stopping.set()
        thread.join(2.0)


def metrics_address(command: list[str]) -> str:
    """Where tritonserver ``command`` serves its metrics: ``--metrics-address``, else its
    ``--http-address``, else every interface (Triton's defaults)."""
    return _option(command, "--metrics-address") or _option(command, "--http-address") or "0.0.0.0"


def _serve_status(recovery: ModelRecovery, command: list[str], port: int) -> StatusEndpoint | None:
    """Start the status endpoint beside Triton's metrics; None (logged) when it cannot listen."""
    endpoint = StatusEndpoint(recovery.status, metrics_address(command), port)
    try:
        endpoint.start()
    except OSError as exc:
        _log(f"model status endpoint not started: cannot listen on "
             f"{metrics_address(command)}:{port}: {exc.strerror or exc}")
        return None
    _log(f"model status on {endpoint.url}/metrics and /status")
    return endpoint


def supervise(command: list[str], args: argparse.Namespace) -> int:
    """Run ``command`` until it exits or is signalled; reload models whose stub died; stop it
    when ``args.failures`` checks in a row fail or (without recovery) a stub dies.

    Returns:
        The server's own exit code (128 + N when signal N ended it), 1 when the watchdog
        stopped it, or 2 when the probe file is unusable (the server is not started).
    """
    try:
        probes = health.read_probes(args.probes)
    except UserInputError as exc:
        _log(str(exc))
        return 2
    blocker = _recovery_blocker(command) if args.recover_models else "--recover-models is off"
    server: subprocess.Popen | None = None
    stopping = False

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        if server is not None:
            server.send_signal(signum)

    # before the server starts: a signal in between must reach it, not end this process alone
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    server = process.start(command, new_session=False, stdin=None)
    if stopping:
        server.send_signal(signal.SIGTERM)
    admission = start_admission(command)
    try:
        return _watch(server, command, args, probes, blocker, lambda: stopping)
    finally:
        stop_admission(admission)


def _watch(server: subprocess.Popen, command: list[str], args: argparse.Namespace,
           probes: dict, blocker: str | None, is_stopping: Callable[[], bool]) -> int:
    """``supervise`` once the server runs: wait for its models, then watch them."""

    def exit_code() -> int | None:
        # Once stopping, wait for the exit: nothing is reloaded while Triton unloads its models.
        code = server.wait() if is_stopping() else server.poll()
        return None if code is None else (code if code >= 0 else 128 - code)

    started = time.monotonic()
    while True:  # until every model answers once (looked at every 2 s at most: recovery starts then)
        try:
            server.wait(timeout=min(args.interval, 2.0))
            return exit_code()
        except subprocess.TimeoutExpired:
            pass
        if is_stopping():
            continue
        problems = health.check_repository(args.url, args.repository, probes, args.timeout).problems
        if not problems:
            break
        if time.monotonic() - started > args.start_timeout:
            _log(f"not healthy after {args.start_timeout:g}s: {'; '.join(problems)}")
            stop(server, args.stop_timeout)
            return 1
    control = ModelControl(args.url.removeprefix("http://").rstrip("/"), args.admin_header,
                           os.environ.get(ADMIN_KEY_ENV, ""), server.pid)
    models = health.repository_models(args.repository)
    recovery = None if blocker else ModelRecovery(
        control, RestartBudget(args.model_restarts, args.restart_window),
        backoff=Backoff(args.retry_backoff, max_s=args.retry_backoff_max), models=models)
    _log(f"all models of {args.repository} ready; "
         + (f"per-model recovery on (budget {args.model_restarts} reloads in "
            f"{args.restart_window:g}s, then retries after {args.retry_backoff:g}s doubling "
            f"to {args.retry_backoff_max:g}s)" if recovery else f"per-model recovery off: {blocker}")
         + (f"; checking every {args.interval:g}s" if not args.no_restart else ""))
    endpoint = _serve_status(recovery, command, args.forge_metrics_port) if recovery else None
    try:
        end = watch(control, exit_code, models, control.stub_processes(),
                    interval_s=min(1.0, args.interval),
                    probes=None if args.no_restart else probes,
                    probe_interval_s=args.interval, probe_failures=args.failures,
                    recovery=recovery, on_event=lambda event: _log(event.describe()))
    finally:
        if endpoint is not None:
            endpoint.stop()
    if end.exit_code is not None:
        return end.exit_code
    _log(f"{end.reason}: stopping tritonserver so the container restarts")
    stop(server, args.stop_timeout)
    return 1


def main(argv: list[str] | None = None) -> int:
    """``triton_supervisor.py [options] -- tritonserver ...``"""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", help="tritonserver's own HTTP URL [default: from the server "
                        "command's --http-address and --http-port]")
    parser.add_argument("--repository", type=Path, default=Path("/models"))
    parser.add_argument("--probes", type=Path, help="JSON: model name -> KServe v2 JSON request")
    parser.add_argument("--interval", type=float, default=15.0, help="seconds between checks")
    parser.add_argument("--failures", type=int, default=3, help="failed checks in a row to act")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    parser.add_argument("--start-timeout", type=float, default=900.0,
                        help="seconds the server may take to become healthy the first time")
    parser.add_argument("--stop-timeout", type=float, default=45.0)
    parser.add_argument("--recover-models", action="store_true",
                        help=f"reload a model whose Python stub died (needs the server in "
                             f"--model-control-mode=explicit and ${ADMIN_KEY_ENV})")
    parser.add_argument("--admin-header", default="admin-key",
                        help="the header of --http-restricted-api (docker-compose.yml's)")
    parser.add_argument("--model-restarts", type=int, default=3,
                        help="reloads of one model within --restart-window before it is given up")
    parser.add_argument("--restart-window", type=float, default=120.0)
    parser.add_argument("--retry-backoff", type=float, default=5.0,
                        help="seconds before the first retry of a model past its budget "
                             "(doubling while retries fail)")
    parser.add_argument("--retry-backoff-max", type=float, default=300.0,
                        help="the longest delay between retries, in seconds")
    parser.add_argument("--forge-metrics-port", type=int,
                        default=int(os.environ.get(METRICS_PORT_ENV) or DEFAULT_METRICS_PORT),
                        help=f"port of the model status endpoint (/metrics, /status), on the "
                             f"address of Triton's metrics (0: a free one) "
                             f"[default: ${METRICS_PORT_ENV}, else {DEFAULT_METRICS_PORT}]")
    parser.add_argument("--no-restart", action="store_true",
                        help="never stop the server for failed checks (the kubelet's probes do)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- tritonserver ...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the server command after --")
    args.url = args.url or f"http://{server_http(command)}"
    return supervise(command, args)


if __name__ == "__main__":
    sys.exit(main())
