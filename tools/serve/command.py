"""``tools serve``: run the embedded tritonserver on a model repository until told to stop.

Foreground by default (Ctrl-C or SIGTERM drains in-flight requests, then exits clean); scripts
use ``--background --pid-file F`` to start and ``--stop --pid-file F`` to stop.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from pathlib import Path

import click

from tools.command import ToolCommand
from tools import cpu_isa, process
from tools.errors import ServerError, UserInputError
from tools.serve import health
from tools.serve.recovery import DEFAULT_METRICS_PORT, Backoff, ModelRecovery, RestartBudget
from tools.serve.recovery import StatusEndpoint
from tools.front.plan import Limits
from tools.front.process import INSTALL_HINT, find_haproxy, stop_fronts_of
from tools.serve.server import STOP_GRACE_S, EmbeddedServer
from tools.serve.server_log import log_tail
from tools.serve.server_config import HTTP_MAX_INPUT_SIZE, LOOPBACK, OPEN_ADMIN_ENV

_WATCH_INTERVAL_S = 1.0
_PROBE_INTERVAL_S = 15.0  # as the compose healthcheck: every 15 s, 3 failures in a row
_PROBE_FAILURES = 3
_ENDED_LOG_LINES = 12  # of the log of a run that ended, quoted when the server is restarted


class _StopRequested(SystemExit):
    """SIGINT or SIGTERM arrived: stop the server and exit cleanly.

    A SystemExit, because tritonclient's HTTP calls run on gevent: a signal handler that raises
    while gevent's hub waits is re-raised in the main greenlet only for SystemExit-like errors;
    any other exception is printed as a traceback by the hub first.
    """


def _describe(server: EmbeddedServer) -> str:
    return "\n".join(
        [
            f"tritonserver ready: pid {server.pid}, log {server.log_path}",
            f"http     {server.http_url}",
            f"grpc     {server.grpc_url}",
            *([f"front    HAProxy: HTTP bodies and gRPC messages up to "
               f"{server.front_limits.max_body_bytes} and "
               f"{server.front_limits.max_grpc_message_bytes} bytes, SLO admission for "
               f"{len(server.front.plan.objectives)} models; tritonserver's own HTTP "
               f"{server.triton_http_url}, gRPC {server.triton_grpc_url}"]
              if server.front is not None else []),
            *([f"api      OpenAI /v1/embeddings, TEI /embed /rerank /predict on the HTTP port "
               f"(docs/api.md; gateway log {server.gateway_log_path})"]
              if server.gateway is not None else []),
            f"metrics  http://{server.metrics_url}/metrics",
            f"models   {', '.join(server.models)}",
        ]
    )


def _stop_from_pid_file(pid_file: Path, exit_timeout: int) -> None:
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError) as exc:
        raise UserInputError(f"pid file {pid_file} does not hold a process id: {exc}") from exc
    argv = process.command_line(pid)
    if not argv or not Path(argv[0]).name.startswith("tritonserver"):
        pid_file.unlink(missing_ok=True)
        raise UserInputError(
            f"pid file {pid_file} names pid {pid}, which is not a running tritonserver "
            "(stale file removed)"
        )
    regions = process.stub_shm_regions(pid)
    stop_fronts_of(pid)  # its front first: requests it holds are answered, idle links closed
    survivors = process.stop(pid, exit_timeout + STOP_GRACE_S)
    if survivors:
        raise ServerError(f"processes {survivors} of tritonserver group {pid} survived SIGKILL")
    process.remove_shm_regions(regions)
    pid_file.unlink(missing_ok=True)
    click.echo(f"stopped tritonserver pid {pid}")


def _prepare_pid_file(pid_file: Path) -> bool:
    """Make sure ``pid_file`` can be written before any server starts; True if it was created.

    Raises:
        UserInputError: its folder cannot be created or the file cannot be written.
    """
    existed = pid_file.exists()
    try:
        pid_file.parent.mkdir(parents=True, exist_ok=True)
        with pid_file.open("a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise UserInputError(
            f"cannot write pid file {pid_file}: {exc.strerror or exc}"
        ) from exc
    return not existed


def _write_pid_file(pid_file: Path, pid: int) -> None:
    pid_file.write_text(f"{pid}\n", encoding="utf-8")


def _start(
    server: EmbeddedServer, start_timeout: float, probes: Mapping[str, health.Request]
) -> None:
    """Start the server and, with ``probes``, send them once: a server that fails them is
    stopped and the failure raised.

    Raises:
        ServerError: the server did not start, or failed a probe (each model named).
    """
    server.start(timeout_s=start_timeout)
    if not probes:
        return
    try:
        report = server.control.health(server.models, probes)
    except BaseException:
        server.stop()
        raise
    if not report.healthy:
        server.stop()
        raise ServerError("; ".join(report.problems) + f" (server log: {server.log_path})")


def _start_in_background(
    server: EmbeddedServer,
    pid_file: Path,
    start_timeout: float,
    probes: Mapping[str, health.Request],
) -> None:
    """Start, record the pid, then let the server outlive this process.

    The pid file is checked before the start and written before the server is detached: a
    server whose pid could not be recorded is stopped, never left running unnamed.

    Raises:
        UserInputError: the pid file cannot be written (any server started is stopped).
    """
    created = _prepare_pid_file(pid_file)
    try:
        _start(server, start_timeout, probes)
    except BaseException:
        if created:
            pid_file.unlink(missing_ok=True)
        raise
    try:
        _write_pid_file(pid_file, server.pid)
    except BaseException as exc:
        server.stop()
        if created:
            pid_file.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise UserInputError(
                f"cannot write pid file {pid_file}: {exc.strerror or exc}; "
                "the server was stopped"
            ) from exc
        raise
    server.detach()


def _serve_until_signal(
    server: EmbeddedServer,
    max_restarts: int,
    start_timeout: float,
    probes: Mapping[str, health.Request],
    budget: RestartBudget,
    backoff: Backoff,
    status: StatusEndpoint,
) -> None:
    """Announce the server and block while it runs.

    A Python stub that dies gets its model reloaded, and only that model (Triton 2.51 neither
    restarts a stub nor reports it through readiness); a model over its restart budget is
    unloaded, reported, and retried with ``backoff``; ``status`` serves the models' state.
    Probes that keep failing, or tritonserver itself exiting, restart the whole server (on the
    same ports).
    """
    recovery = None
    for restart in range(max_restarts + 1):
        # snapshot before announcing, so a death right after the announcement still counts
        recovery = ModelRecovery(
            server.control, budget, backoff=backoff, models=server.models,
            restarts=recovery.total_restarts if recovery else None,
            restart_failures=recovery.restart_failures if recovery else None)
        status.source = recovery.status
        click.echo(_describe(server))
        click.echo(f"status   {status.url}/status, {status.url}/metrics (model recovery)")
        try:
            reason = server.watch(
                recovery.stubs,
                interval_s=_WATCH_INTERVAL_S,
                probes=probes,
                probe_interval_s=_PROBE_INTERVAL_S,
                probe_failures=_PROBE_FAILURES,
                recovery=recovery,
                on_event=lambda event: click.echo(event.describe(), err=True),
            )
        except ServerError as exc:
            if server.poll() is None and server.front_running:
                raise
            # e.g. Triton 2.51 aborts (std::bad_alloc) on a JSON shape whose byte size overflows
            reason = str(exc)
        if restart == max_restarts:
            raise ServerError(
                f"{reason}, and all {max_restarts} restarts are used up "
                f"(server log: {server.log_path})"
            )
        # the next start moves this run's log aside (process.rotate_log): say where, and how
        # it ended, e.g. Triton's "Signal (11) received." and the frames after it
        click.echo(f"{reason}: restarting the server ({restart + 1}/{max_restarts}); the log of "
                   f"the run that ended is kept as {process.previous_log(server.log_path)}, it "
                   f"ends: {log_tail(server.log_path, _ENDED_LOG_LINES)}", err=True)
        server.stop()
        _start(server, start_timeout, probes)


def _seconds_option(name: str, default: float, what: str):
    return click.option(name, type=click.FloatRange(0.1), default=default, show_default=True,
                        help=what)


def _port_option(kind: str, default: int, what: str):
    return click.option(f"--{kind}-port", type=click.IntRange(0, 65535), default=default,
                        show_default=True, help=f"{what} port on 127.0.0.1 (0: a free port).")


@click.command("serve", cls=ToolCommand)
@click.option(
    "--repository",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("model_repository"),
    show_default=True,
    help="Model repository to serve.",
)
@_port_option("http", 8000, "HTTP")
@_port_option("grpc", 8001, "gRPC")
@_port_option("metrics", 8002, "Prometheus metrics")
@click.option(
    "--binary",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="tritonserver binary [default: $TRITONSERVER_BINARY, else the nvidia-pytriton wheel's].",
)
@click.option(
    "--log-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Server log file, kept after exit [default: a new file in the temp folder].",
)
@click.option(
    "--exit-timeout",
    type=click.IntRange(0),
    default=30,
    show_default=True,
    help="Seconds in-flight requests get to finish on stop (plus 10 s to unload), then SIGKILL.",
)
@click.option(
    "--start-timeout",
    type=click.IntRange(1),
    default=300,
    show_default=True,
    help="Seconds the models get to load.",
)
@click.option(
    "--max-restarts",
    type=click.IntRange(0),
    default=3,
    show_default=True,
    help="Foreground only: whole-server restarts when tritonserver exits by itself or --probes "
    "keep failing, before giving up.",
)
@click.option(
    "--model-restarts",
    type=click.IntRange(0),
    default=3,
    show_default=True,
    help="Foreground only: reloads of one model whose Python stub died, within "
    "--restart-window; one more death unloads it (reported not ready) and retries it with "
    "--retry-backoff.",
)
@click.option(
    "--restart-window",
    type=click.FloatRange(1),
    default=120.0,
    show_default=True,
    help="Seconds of the sliding window --model-restarts counts in.",
)
@_seconds_option("--retry-backoff", 5.0,
                 "Foreground only: seconds before the first retry of a model unloaded past "
                 "--model-restarts; the delay doubles while retries fail.")
@_seconds_option("--retry-backoff-max", 300.0,
                 "Foreground only: the longest delay between retries of a model.")
@_port_option("forge-metrics", DEFAULT_METRICS_PORT,
              "Foreground only: model status (/status JSON, /metrics Prometheus)")
@click.option(
    "--background",
    is_flag=True,
    help="Start, wait until ready, print the endpoints, write --pid-file and return.",
)
@click.option(
    "--stop",
    "stop_",
    is_flag=True,
    help="Stop the server named by --pid-file (drains like SIGTERM) and remove the file.",
)
@click.option(
    "--pid-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="With --background / --stop: file holding the tritonserver pid.",
)
@click.option(
    "--probes",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    default=None,
    help="JSON file, model name -> KServe v2 JSON request (as docker/healthcheck_probes.json): "
    "sent after every start and every 15 s; a model that answers with an error is not alive "
    "(3 failures in a row restart the server, as a dead stub does).",
)
@click.option(
    "--allow-open-admin-apis",
    is_flag=True,
    help=f"Run a tritonserver that cannot restrict its admin APIs (no --http-restricted-api / "
    f"--grpc-restricted-protocol), leaving them open to any local caller [also: "
    f"{OPEN_ADMIN_ENV}=1]. Without it such a binary is refused.",
)
@click.option(
    "--front/--no-front",
    default=None,
    help="Put HAProxy in front of tritonserver (request limits, strict HTTP, per-model SLO "
    "admission) [default: on where haproxy is installed; without it tritonserver serves the "
    "ports itself, and this says so].",
)
@click.option(
    "--api/--no-api",
    default=True,
    show_default=True,
    help="With the front, serve OpenAI's /v1/embeddings and TEI's /embed, /rerank, /predict on "
    "the HTTP port too (the gateway, docs/api.md).",
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(1),
    default=HTTP_MAX_INPUT_SIZE,
    show_default=True,
    help="Largest HTTP request body (the front's 413; also --http-max-input-size on Triton "
    "25.x+).",
)
@click.option(
    "--max-grpc-message-bytes",
    type=click.IntRange(1),
    default=HTTP_MAX_INPUT_SIZE,
    show_default=True,
    help="Largest gRPC message (the front's RESOURCE_EXHAUSTED).",
)
def serve(
    repository: Path,
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    binary: Path | None,
    log_file: Path | None,
    exit_timeout: int,
    start_timeout: int,
    max_restarts: int,
    model_restarts: int,
    restart_window: float,
    retry_backoff: float,
    retry_backoff_max: float,
    forge_metrics_port: int,
    background: bool,
    stop_: bool,
    pid_file: Path | None,
    probes: Path | None,
    allow_open_admin_apis: bool,
    front: bool | None,
    api: bool,
    max_body_bytes: int,
    max_grpc_message_bytes: int,
) -> None:
    """Run tritonserver on a model repository, bound to 127.0.0.1.

    Waits until every model is ready, prints the endpoints (lines `http HOST:PORT`,
    `grpc HOST:PORT`, `metrics URL`, `models A, B`) and serves until Ctrl-C or SIGTERM: the
    server then refuses new requests, lets in-flight ones finish within --exit-timeout, and
    exits leaving no tritonserver or Python-stub process behind. Configs are used as written
    (no auto-completion). Every model is loaded at start (explicit model control); when a
    Python stub dies, only its model is reloaded (and the ensembles using it), the other
    models keep serving. A model that dies more than --model-restarts times in
    --restart-window seconds is unloaded with its ensembles, reported not ready, and loaded
    again after --retry-backoff seconds (doubling while retries fail, up to
    --retry-backoff-max). Each model's state and restart counters are served on
    --forge-metrics-port (`status` line: /status JSON, /metrics Prometheus). tritonserver
    exiting by itself, or --probes that keep failing, restart the whole server (up to
    --max-restarts).

    The admin APIs (model repository, shared memory, trace, logging) are closed to callers
    without a per-server key, generated at each start and never printed; only this command
    uses it, to reload models. A binary that cannot close them is refused unless
    --allow-open-admin-apis is given. The key is on tritonserver's command line, readable by
    local users in /proc/PID/cmdline: it guards a loopback-only development server against
    accidents, not against other users of the machine.

    HAProxy holds the public HTTP and gRPC ports, with the configuration tools build-repo
    renders for every path (compose and Kubernetes run the same), and tritonserver listens on
    loopback ports of its own behind it: bodies over --max-body-bytes get 413 and gRPC messages
    over --max-grpc-message-bytes RESOURCE_EXHAUSTED before tritonserver reads them, HTTP is
    parsed strictly (ambiguous framing refused or re-framed), and each model's inference
    requests are admitted by its P99 objective (admission_p99_ms, rendered from the SLO file):
    past latency target x measured throughput in flight a request is refused after a short
    hold (HTTP 503 with Retry-After, gRPC UNAVAILABLE with retry pushback), for direct calls to
    a model as for its pipelines. The HTTP port also answers OpenAI's /v1/embeddings and
    TEI's /embed, /rerank and /predict for the pipelines of the kinds they serve (--no-api to
    leave them out). Without haproxy installed (or with --no-front) tritonserver serves the
    ports itself, on 127.0.0.1 only, with none of this.
    docs/serving.md has what the front refuses and what it costs.

    \b
    For scripts:
      tools serve --background --pid-file run/triton.pid --http-port 0 ...
      tools serve --stop --pid-file run/triton.pid
    """
    if (background or stop_) and pid_file is None:
        raise UserInputError("--background and --stop need --pid-file")
    if background and stop_:
        raise UserInputError("choose one of --background and --stop")
    if stop_:
        _stop_from_pid_file(pid_file, exit_timeout)
        return
    requests = health.read_probes(probes)
    for problem in cpu_isa.mismatches(repository):
        click.echo(f"warning: {problem}", err=True)
    if front is None:
        front = find_haproxy() is not None
        if not front:
            click.echo(f"note: haproxy is not installed, so tritonserver serves 127.0.0.1 itself, "
                       f"without the front (no request limits, no SLO admission): "
                       f"{INSTALL_HINT}", err=True)
    server = EmbeddedServer(
        repository,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        binary=binary,
        log_path=log_file,
        exit_timeout_s=exit_timeout,
        allow_open_admin_apis=allow_open_admin_apis or None,
        front=Limits(max_body_bytes=max_body_bytes, max_grpc_message_bytes=max_grpc_message_bytes)
        if front else None,
        max_body_bytes=max_body_bytes,
        gateway=api,
    )
    if background:
        _start_in_background(server, pid_file, start_timeout, requests)
        click.echo(_describe(server))
        return

    def request_stop(signum: int, _frame: object) -> None:
        # later signals must not interrupt the drain that the first one started
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise _StopRequested(signal.Signals(signum).name)

    status = StatusEndpoint(dict, LOOPBACK, forge_metrics_port)
    try:
        status.start()
    except OSError as exc:
        raise ServerError(
            f"port {forge_metrics_port} (forge metrics) is already in use on {LOOPBACK}; "
            f"choose another --forge-metrics-port, or 0 for a free one ({exc.strerror or exc})"
        ) from exc
    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        _start(server, start_timeout, requests)
        budget = RestartBudget(model_restarts, restart_window)
        _serve_until_signal(server, max_restarts, start_timeout, requests, budget,
                            Backoff(retry_backoff, max_s=retry_backoff_max), status)
    except _StopRequested as stop:
        click.echo(
            f"{stop}: draining in-flight requests (up to {exit_timeout} s) and stopping", err=True
        )
    finally:
        status.stop()
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    click.echo("tritonserver stopped")
