"""Run a real tritonserver on a model repository: loopback only, strict configs, clean shutdown.

``EmbeddedServer`` starts, watches and stops the process; its flags and admin policy live in
``server_config``, its log in ``server_log``, its health and admin calls in ``health`` and
``model_control`` (``.control``), its front in ``tools.front``, its processes in
``tools.process``, its ports in ``tools.net``; ``session`` holds a server for the length of one
command.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tritonclient.utils import InferenceServerException

from tools import process
from tools.errors import ServerError, UserInputError
from tools.api.server import ApiServer
from tools.front.plan import FrontPlan, Limits
from tools.front.process import INSTALL_HINT, FrontProcess, find_haproxy
from tools.net import LOOPBACK, choose_ports, start_choosing_again
from tools.serve import health
from tools.serve.backend_dir import (
    backend_directory,
    default_binary,
    installed_backends,
    stub_environment,
)
from tools.serve.model_control import ModelControl, admin_headers
from tools.serve.model_control import watch as watch_server
from tools.serve.server_config import (
    ADMIN_HEADER,
    HTTP_MAX_INPUT_SIZE,
    OPEN_ADMIN_ENV,
    RESTRICTED_APIS,
    Restriction,
    TritonServerConfig,
    for_binary,
)
from tools.serve.server_log import failure_causes, log_tail, pending_models, ports_in_use

if TYPE_CHECKING:  # typing.Self is Python 3.11+; the project supports 3.10
    from typing_extensions import Self

BINARY_ENV = "TRITONSERVER_BINARY"
# Where the stubs' queue gates read the queue gauges (pipeline_ops.admission.METRICS_URL_ENV;
# that package must import without `tools`, so the name is written in both).
METRICS_URL_ENV = "TRITON_FORGE_METRICS_URL"
STOP_GRACE_S = 10  # after tritonserver's own exit timeout: unloading models, stopping stubs
_READY_TIMEOUT_S = 2.0
# tritonserver's own ports when the front holds the public ones
_TRITON_HTTP, _TRITON_GRPC = "Triton HTTP", "Triton GRPC"
_GATEWAY = "Gateway"  # the OpenAI/TEI gateway's own port, behind the front
_FRONT_PORTS = ("HTTP", "GRPC", _GATEWAY)  # bound by the front and the gateway


def resolve_binary(binary: Path | str | None = None) -> Path:
    """The tritonserver to run: ``binary``, else ``$TRITONSERVER_BINARY``, else the wheel's.

    Raises:
        UserInputError: the chosen path is not an executable file.
    """
    chosen = binary or os.environ.get(BINARY_ENV)
    if not chosen:
        return default_binary()
    path = Path(chosen).expanduser()
    if not path.is_file() or not os.access(path, os.X_OK):
        source = "--binary" if binary else f"${BINARY_ENV}"
        raise UserInputError(
            f"tritonserver binary {path} (from {source}) is not an executable file"
        )
    return path


class EmbeddedServer:
    """A tritonserver process serving one model repository on 127.0.0.1.

    Usage::

        with EmbeddedServer(Path("model_repository")) as server:   # start() on enter
            print(server.http_url, server.grpc_url, server.models)

    Admin APIs (loading models, shared memory, tracing, log settings) answer only callers that
    send the per-server key in ``admin_headers``. A binary that cannot restrict them is refused
    unless the caller opts out. The key travels on tritonserver's command line, so any local
    user who can read ``/proc/<pid>/cmdline`` can read it (tritonserver 2.51 offers no file or
    environment variable for it): it keeps casual or accidental callers off the loopback-bound
    admin APIs of a development server, and is no protection against other local users.

    With ``front``, HAProxy (``tools.front``) holds the public HTTP and gRPC ports and
    tritonserver listens on free loopback ports behind it: the front bounds request and message
    sizes, parses HTTP strictly and admits each model's requests by its P99 objective. Binaries
    that have ``--http-max-input-size`` (Triton 25.x+) also get ``max_body_bytes``; the 2.51
    binary of the nvidia-pytriton wheel lacks it and reads any body whole, and no Triton has a
    gRPC message-size flag: without the front, nothing bounds them.

    Args:
        model_repository: The repository folder (one sub-folder per model).
        http_port: HTTP port; 0 picks a free one.
        grpc_port: gRPC port; 0 picks a free one.
        metrics_port: Prometheus metrics port; 0 picks a free one.
        binary: tritonserver to run; defaults to ``$TRITONSERVER_BINARY``, then the one in the
            nvidia-pytriton wheel.
        log_path: Where the server's output goes (kept after stop); defaults to a new file under
            the temp folder.
        exit_timeout_s: How long in-flight requests may take to finish when stopping.
        extra_args: More tritonserver options, appended last.
        allow_open_admin_apis: Run a binary that cannot restrict the admin APIs (no
            ``--http-restricted-api`` / ``--grpc-restricted-protocol``), leaving them open;
            defaults to ``$TRITON_FORGE_ALLOW_OPEN_ADMIN_APIS=1``. Otherwise such a binary is
            refused.
        front: Put the front (HAProxy and its admission controller) on the HTTP and gRPC
            ports, with these limits, and tritonserver's own endpoints on free loopback ports
            behind it. Needs haproxy (``tools.front.process.find_haproxy``).
        gateway: With ``front``, also serve the OpenAI and TEI routes (``tools.api``) on the
            HTTP port: the gateway listens on a free loopback port behind the front and calls
            the pipelines through the front, so their admission applies to it too.
        max_body_bytes: ``--http-max-input-size`` for a binary that has it.

    Attributes:
        model_repository: The repository served.
        log_path: The server's log file (tritonserver's stdout and stderr), kept after stop.
        exit_timeout_s: Drain time given to in-flight requests on stop.
        extra_args: The extra tritonserver options.
    """

    def __init__(
        self,
        model_repository: Path,
        *,
        http_port: int = 0,
        grpc_port: int = 0,
        metrics_port: int = 0,
        binary: Path | None = None,
        log_path: Path | None = None,
        exit_timeout_s: int = 30,
        extra_args: Sequence[str] = (),
        allow_open_admin_apis: bool | None = None,
        front: Limits | None = None,
        max_body_bytes: int = HTTP_MAX_INPUT_SIZE,
        gateway: bool = False,
    ) -> None:
        self.model_repository = Path(model_repository)
        self._requested_ports = {"HTTP": http_port, "GRPC": grpc_port, "Metrics": metrics_port}
        self.front_limits = front
        self.max_body_bytes = max_body_bytes
        if front is not None:  # tritonserver's own ports, behind the front
            self._requested_ports[_TRITON_HTTP] = 0
            self._requested_ports[_TRITON_GRPC] = 0
            self._requested_ports[_GATEWAY] = 0
        self.front: FrontProcess | None = None
        self.want_gateway = gateway and front is not None
        self.gateway: ApiServer | None = None
        self._ports: dict[str, int] = {}
        self._binary = binary
        self.log_path = Path(log_path) if log_path is not None else _default_log_path()
        self.exit_timeout_s = exit_timeout_s
        self.extra_args = tuple(extra_args)
        if allow_open_admin_apis is None:
            allow_open_admin_apis = os.environ.get(OPEN_ADMIN_ENV, "") == "1"
        self.allow_open_admin_apis = allow_open_admin_apis
        self._admin_token = secrets.token_hex(16)
        self._proc: subprocess.Popen | None = None
        self._models: list[str] = []
        self._shm_regions: set[str] = set()
        self._finalizer: weakref.finalize | None = None

    # ---- endpoints and state

    @property
    def http_url(self) -> str:
        """``127.0.0.1:PORT`` of the HTTP endpoint (as tritonclient expects it); with
        ``front``, the front's."""
        return f"{LOOPBACK}:{self._port('HTTP')}"

    @property
    def triton_http_url(self) -> str:
        """``127.0.0.1:PORT`` of tritonserver's own HTTP endpoint (behind the front, if any)."""
        return f"{LOOPBACK}:{self._port(_TRITON_HTTP if self.front_limits else 'HTTP')}"

    @property
    def triton_grpc_url(self) -> str:
        """``127.0.0.1:PORT`` of tritonserver's own gRPC endpoint (behind the front, if any)."""
        return f"{LOOPBACK}:{self._port(_TRITON_GRPC if self.front_limits else 'GRPC')}"

    @property
    def grpc_url(self) -> str:
        """``127.0.0.1:PORT`` of the gRPC endpoint; with ``front``, the front's."""
        return f"{LOOPBACK}:{self._port('GRPC')}"

    @property
    def metrics_url(self) -> str:
        """``127.0.0.1:PORT`` of the Prometheus endpoint (``/metrics``)."""
        return f"{LOOPBACK}:{self._port('Metrics')}"

    @property
    def pid(self) -> int | None:
        """The tritonserver process id (also its process group and session id)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def models(self) -> list[str]:
        """Names of the models that reported ready at start."""
        return list(self._models)

    @property
    def admin_headers(self) -> dict[str, str]:
        """Headers that open the restricted admin APIs of this server to trusted callers, for
        HTTP and gRPC alike."""
        return admin_headers(ADMIN_HEADER, self._admin_token)

    @property
    def binary(self) -> Path:
        """The tritonserver binary this server runs."""
        return resolve_binary(self._binary)

    def _port(self, kind: str) -> int:
        if kind not in self._ports:
            raise ServerError("the server has not been started: its ports are not chosen yet")
        return self._ports[kind]

    def poll(self) -> int | None:
        """The server's exit code, or None while it runs (or before start)."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def control(self) -> ModelControl:
        """Its stubs, repository index, model loads and unloads, and health checks
        (``tools.serve.model_control``); ``control.health(server.models)`` checks the models
        ready at start."""
        return ModelControl(self.triton_http_url, ADMIN_HEADER, self._admin_token, self.pid,
                            f" (server log: {self.log_path})")

    # ---- command line

    def backend_directory(self) -> Path:
        """The ``--backend-directory``: an installed server's own, else the project cache one."""
        return backend_directory(self.binary)

    def config(self) -> TritonServerConfig:
        """The flags ``start`` runs tritonserver with (choosing free ports if not yet done),
        adapted to the options the binary lists (``server_config.for_binary``).

        Raises:
            ServerError: the binary cannot restrict the admin APIs and the caller did not opt out.
        """
        self._choose_ports(keep=True)
        binary = self.binary
        return for_binary(
            binary,
            # The key is visible in /proc/<pid>/cmdline: see the class docstring.
            Restriction(RESTRICTED_APIS, ADMIN_HEADER, self._admin_token),
            allow_open_admin_apis=self.allow_open_admin_apis,
            http_max_input_size=self.max_body_bytes,
            model_repository=str(self.model_repository.resolve()),
            backend_directory=str(self.backend_directory()),
            http_address=LOOPBACK,
            http_port=self._port(_TRITON_HTTP if self.front_limits else "HTTP"),
            grpc_address=LOOPBACK,
            grpc_port=self._port(_TRITON_GRPC if self.front_limits else "GRPC"),
            metrics_address=LOOPBACK,
            metrics_port=self._port("Metrics"),
            # Explicit control with every model loaded at start: the supervisor (and only it,
            # holding the admin key) reloads a model whose Python stub died.
            model_control_mode="explicit",
            load_model=("*",),
            strict_readiness=True,
            exit_on_error=True,
            exit_timeout_secs=self.exit_timeout_s,
        )

    def command(self) -> list[str]:
        """The tritonserver command line ``start`` runs (choosing free ports if not yet done)."""
        return [str(self.binary), *self.config().to_args(), *self.extra_args]

    def environment(self) -> dict[str, str]:
        """The server's environment: this venv's ``bin`` first on ``PATH`` (the stub imports
        packages through it), this interpreter's LIBDIR first on ``LD_LIBRARY_PATH``, and the
        metrics address for the stubs' queue gates (``pipeline_ops.admission``)."""
        env = stub_environment(libpython=installed_backends(self.binary) is None)
        if "Metrics" in self._ports:  # the tokenizer's queue gate reads the queue gauges here
            env[METRICS_URL_ENV] = f"{LOOPBACK}:{self._ports['Metrics']}"
        return env

    # ---- lifecycle

    def _choose_ports(self, *, keep: bool) -> None:
        if not (keep and self._ports):  # a restarted server keeps the ports its clients know
            self._ports = choose_ports(self._requested_ports)

    def start(self, timeout_s: float = 120) -> EmbeddedServer:
        """Start tritonserver and wait until it and every model in the repository are ready.

        Args:
            timeout_s: How long loading may take.

        Returns:
            self, started.

        Raises:
            UserInputError: the repository is missing or empty, or the binary is unusable.
            ServerError: a port is in use, a model failed to load, the server died while
                starting or was not ready in time. The message gives the server's own cause
                and the log path.
        """
        if self._proc is not None and self._proc.poll() is None:
            return self
        check_repository(self.model_repository)
        if self.front_limits is not None and find_haproxy() is None:
            raise UserInputError(f"the front needs haproxy, which is not installed: {INSTALL_HINT}")
        for attempt in range(3):
            self._choose_ports(keep=attempt == 0)
            try:
                return self._start_once(timeout_s)
            except _AutoPortTaken:
                # a free port we picked was taken by someone else before the server bound it
                continue
        raise ServerError(
            f"could not bind free ports after 3 attempts (server log: {self.log_path})"
        )

    def _start_once(self, timeout_s: float) -> EmbeddedServer:
        cmd, env = self.command(), self.environment()
        # own session and process group: stop() reaches every stub
        self._proc = process.start(cmd, env=env, log_path=self.log_path)
        self._finalizer = weakref.finalize(self, process.kill, self._proc.pid)
        outcome = process.wait_ready(self._proc, self._ready, timeout_s)
        if outcome is process.Readiness.EXITED:
            code = self._proc.returncode
            self.stop()  # at once: only stray stubs of the group are left to kill
            raise self._startup_error(code)
        if outcome is process.Readiness.TIMED_OUT:
            pending = self._pending_models()
            self.stop()
            raise ServerError(
                f"tritonserver on {self.model_repository} not ready after {timeout_s:g} s: "
                f"{pending} (server log: {self.log_path})"
            )
        self._shm_regions = process.stub_shm_regions(self._proc.pid)
        self._start_front()
        return self

    def _start_front(self) -> None:
        """Start the front on the public ports, in a session of its own (it outlives a
        ``detach``, and ends by itself once tritonserver is gone).

        Its free ports were chosen before tritonserver loaded the models: when one of them was
        taken by another process in the meantime, they are chosen again (three attempts)."""
        if self.front_limits is None:
            return
        try:
            start_choosing_again(
                self._start_front_once,
                lambda: {kind: self._ports[kind] for kind in _FRONT_PORTS
                         if kind in self._ports and not self._requested_ports[kind]},
                lambda taken: self._ports.update(choose_ports(taken)))
        except ServerError:
            self.stop()
            raise

    def _stop_front(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
            self.gateway = None
        if self.front is not None:
            self.front.stop()
            self.front = None

    def _start_front_once(self) -> None:
        """Start the front and the gateway; on failure stop both (so the ports they hold are
        not mistaken for ports another process took)."""
        self.front = FrontProcess(
            FrontPlan.from_repository(self.model_repository, self.front_limits),
            find_haproxy(), http_port=self._port("HTTP"), grpc_port=self._port("GRPC"),
            triton_http_port=self._port(_TRITON_HTTP), triton_grpc_port=self._port(_TRITON_GRPC),
            watch_pid=self._proc.pid, gateway_port=self._port(_GATEWAY))
        try:
            self.front.start(self.front_log_path)
            if self.want_gateway:
                self.gateway = ApiServer(self.http_url, self.model_repository,
                                         port=self._port(_GATEWAY),
                                         log_path=self.gateway_log_path,
                                         watch_pid=self._proc.pid)
                self.gateway.start()
        except ServerError:
            self._stop_front()
            raise

    def _ready(self) -> bool:
        try:
            with health.client(self.triton_http_url, _READY_TIMEOUT_S) as triton:
                if not triton.is_server_ready():
                    return False
            index = self.control.repository_index()
        except (OSError, ServerError, InferenceServerException):
            return False
        if any(entry.get("state") != "READY" for entry in index):
            return False
        self._models = sorted(entry["name"] for entry in index)
        return True

    def _pending_models(self) -> str:
        try:
            index = self.control.repository_index()
        except ServerError:
            index = None
        return pending_models(index, self.log_path.read_text(errors="replace"))

    def _startup_error(self, code: int) -> ServerError:
        causes = failure_causes(self.log_path.read_text(errors="replace"))
        taken = ports_in_use(causes)
        taken_kinds = [k for k, p in self._ports.items() if p in taken]
        if taken_kinds and all(not self._requested_ports[k] for k in taken_kinds):
            self._ports = {}
            return _AutoPortTaken()
        cause = "; ".join(causes) or log_tail(self.log_path) or "no output"
        return ServerError(
            f"tritonserver exited while starting (exit code {code}): {cause} "
            f"(server log: {self.log_path})"
        )

    def watch(self, stubs: Mapping[str, int], **options: Any) -> str:
        """Block while the server runs well; return why it needs a restart.

        ``model_control.watch`` on this server's models, with its keyword ``options``
        (``interval_s``, ``probes``, ``probe_interval_s``, ``probe_failures``, ``recovery``,
        ``on_event``); no ``probes`` means no health checks.

        Raises:
            ServerError: tritonserver itself exited.
        """
        options["probes"] = options.get("probes") or None
        end = watch_server(self.control, self._poll_with_front, self.models, stubs, **options)
        if end.exit_code is not None:
            if self.poll() is None and self.front is not None and not self.front.running:
                raise ServerError(f"{self.front.name} in front of tritonserver exited (exit code "
                                  f"{end.exit_code}) (its log: {self.front_log_path})")
            if self.poll() is None and self.gateway is not None and \
                    self.gateway.poll() is not None:
                raise ServerError(f"the OpenAI/TEI gateway exited (exit code {end.exit_code}) "
                                  f"(its log: {self.gateway_log_path})")
            raise ServerError(f"tritonserver exited unexpectedly (exit code {end.exit_code}) "
                              f"(server log: {self.log_path})")
        return end.reason

    @property
    def front_log_path(self) -> Path:
        """The front's own log (HAProxy's messages), beside the server's: ``<log>.front.log``."""
        return self.log_path.with_name(f"{self.log_path.stem}.front.log")

    @property
    def gateway_log_path(self) -> Path:
        """The OpenAI/TEI gateway's log, beside the server's: ``<log>.api.log``."""
        return self.log_path.with_name(f"{self.log_path.stem}.api.log")

    @property
    def front_running(self) -> bool:
        """False when this server has a front or a gateway and it is not running."""
        return (self.front is None or self.front.running) and \
            (self.gateway is None or self.gateway.poll() is None)

    def _poll_with_front(self) -> int | None:
        """tritonserver's exit code, else the front's or the gateway's if it has exited, else
        None."""
        code = self.poll()
        for companion in (self.front, self.gateway):
            if code is None and companion is not None:
                code = companion.poll()
        return code

    def stop(self) -> None:
        """Stop the server: in-flight requests get ``exit_timeout_s`` to finish, then SIGKILL
        for whatever remains of its process group (tritonserver and every stub); then remove
        the Python-backend shared memory a killed stub or server left behind.

        Raises:
            ServerError: processes of the server survived SIGKILL.
        """
        if self._proc is None:
            return
        # Also once tritonserver has exited (e.g. it loaded the models, then failed to bind a
        # port): its stubs stay in its process group until killed, and only they name their
        # regions. Only Python-backend stub processes are read, so a reused pid is harmless.
        self._shm_regions |= process.stub_shm_regions(self._proc.pid)
        try:
            # the gateway first (what it holds still passes the front), then the front: it
            # stops listening, lets every request it holds be answered and closes its idle
            # connections, so tritonserver then has nothing left to drain
            self._stop_front()
            survivors = process.stop(self._proc, self.exit_timeout_s + STOP_GRACE_S)
        finally:
            self._forget_finalizer()
        if survivors:
            raise ServerError(
                f"processes {survivors} of tritonserver group {self._proc.pid} survived SIGKILL"
            )
        # a killed stub or server leaves its region behind; nothing else can use it now
        process.remove_shm_regions(self._shm_regions)
        self._shm_regions = set()

    def _forget_finalizer(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None

    def detach(self) -> int:
        """Leave the server running after this object (and this process) ends; returns its pid."""
        if self._proc is None:
            raise ServerError("the server has not been started")
        self._forget_finalizer()
        pid = self._proc.pid
        # forget the children so Popen.__del__ does not warn; init reaps them later
        self._proc.returncode = 0
        if self.gateway is not None:
            self.gateway.detach()
        if self.front is not None:
            self.front.detach()
        return pid

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.http_url if self._ports else "not started"
        return f"EmbeddedServer({str(self.model_repository)!r}, {where}, pid={self.pid})"


def check_repository(repo: Path) -> None:
    """Raises ``UserInputError`` unless ``repo`` is a folder holding a model folder."""
    if not repo.is_dir():
        what = "is not a folder" if repo.exists() else "does not exist"
        raise UserInputError(f"model repository {repo} {what} (build one with `tools build-repo`)")
    if not any(p.is_dir() for p in repo.iterdir()):
        raise UserInputError(f"model repository {repo} holds no model folder")


def _default_log_path() -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return (
        Path(tempfile.gettempdir())
        / "triton-forge-logs"
        / f"tritonserver-{stamp}-{secrets.token_hex(3)}.log"
    )


class _AutoPortTaken(ServerError):
    """A port chosen as free was taken before tritonserver bound it; start retries."""
