"""Run a real tritonserver on a model repository: loopback only, strict configs, clean shutdown.

``EmbeddedServer`` starts the binary in its own session, waits until every model is ready, turns
the server's own startup errors into one-line causes, and stops it with nothing left behind.

Admin APIs: loading/unloading models, shared memory, tracing and log settings are restricted to
callers sending a per-server key header (``--http-restricted-api`` /
``--grpc-restricted-protocol``). A binary that lacks those options is refused (``ServerError``)
unless the caller opts out with ``allow_open_admin_apis=True`` or ``$TRITON_FORGE_ALLOW_OPEN_ADMIN_APIS=1``.
The key travels on tritonserver's command line, so any local user who can read
``/proc/<pid>/cmdline`` can read it (tritonserver 2.51 offers no file or environment variable
for it): it only keeps casual or accidental callers off the loopback-bound admin APIs of a
development server, and is no protection against other local users.

Request size: Triton from release 25.x (server 2.5x+) has ``--http-max-input-size``; when the
binary's ``--help`` lists it, the server is started with the same bound as docker-compose.yml
(``HTTP_MAX_INPUT_SIZE``, 16 MiB). The 2.51 binary of the nvidia-pytriton wheel lacks the
option, so with it the embedded server's HTTP input size is bounded only by Triton's own
built-in default.
"""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.errors import ServerError, UserInputError
from tools.serve.backend_dir import (
    STUB_NAME,
    default_binary,
    libpython_dir,
    python_backend_dir,
    pytriton_server_dir,
)

if TYPE_CHECKING:  # typing.Self is Python 3.11+; the project supports 3.10
    from typing_extensions import Self

LOOPBACK = "127.0.0.1"
BINARY_ENV = "TRITONSERVER_BINARY"
# Admin API groups closed to callers without the per-server header (loading models, shared
# memory regions, tracing and log settings); health, metadata, config, inference and
# statistics stay open.
RESTRICTED_APIS = ("model-repository", "shared-memory", "trace", "logging")
ADMIN_HEADER = "triton-forge-admin"
# Set to 1 to run a binary that cannot restrict the admin APIs, leaving them open to any caller.
OPEN_ADMIN_ENV = "TRITON_FORGE_ALLOW_OPEN_ADMIN_APIS"
# Same bound as docker-compose.yml's --http-max-input-size; passed only to binaries that have it.
HTTP_MAX_INPUT_SIZE = 16 * 1024 * 1024
_GRPC_PREFIX = "triton-grpc-protocol-"
STOP_GRACE_S = 10  # after tritonserver's own exit timeout: unloading models, stopping stubs


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


@functools.lru_cache(maxsize=8)
def binary_options(binary: Path) -> frozenset[str]:
    """The ``--options`` a tritonserver binary lists in its ``--help`` (run once per binary)."""
    try:
        out = subprocess.run(
            [str(binary), "--help"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServerError(f"cannot run {binary} --help: {exc}") from exc
    return frozenset(re.findall(r"^\s*(--[a-z0-9-]+)", out.stdout + out.stderr, re.MULTILINE))


def port_in_use(port: int, host: str = LOOPBACK) -> bool:
    """True when ``host:port`` cannot be bound (some process listens there)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports on 127.0.0.1 that were free a moment ago (bound together)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((LOOPBACK, 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


# ---------------------------------------------------------------------------- processes (/proc)


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgid) of a process, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[2])


def command_line(pid: int) -> list[str]:
    """The argv of a process (empty when it is gone or a zombie)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def process_group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _proc_stat(int(entry.name))
            if stat is not None and stat[2] == pgid and stat[0] != "Z":
                members.append(int(entry.name))
    return members


def stub_processes(pgid: int) -> dict[str, int]:
    """Python-backend stubs of a server's process group: model instance name -> pid."""
    stubs = {}
    for pid in process_group_members(pgid):
        argv = command_line(pid)
        if argv and argv[0].endswith(STUB_NAME) and len(argv) >= 3:
            stubs[argv[-2]] = pid  # argv: stub, model.py, shm..., instance name, "DEFAULT"
    return stubs


def _wait_gone(pids: Iterable[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    alive = list(pids)
    while alive:
        alive = [p for p in alive if (s := _proc_stat(p)) is not None and s[0] != "Z"]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return alive


def terminate_process_group(pid: int, timeout_s: float) -> None:
    """Stop a tritonserver that leads its own session and leave no process of it behind.

    SIGTERM makes tritonserver refuse new requests, finish in-flight ones within its
    ``--exit-timeout-secs`` and stop its stubs. Whatever is still alive after ``timeout_s`` (the
    server or any stub) gets SIGKILL through the process group.

    Raises:
        ServerError: processes of the group survived SIGKILL.
    """
    pgid = pid
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    _wait_gone([pid], timeout_s)
    leftover = process_group_members(pgid)
    if leftover:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        survivors = _wait_gone(leftover, 5)
        if survivors:
            raise ServerError(
                f"processes {survivors} of tritonserver group {pgid} survived SIGKILL"
            )


# ------------------------------------------------------------------------- the server's log


def _unquote(message: str) -> str:
    try:
        return json.loads(f'"{message}"')
    except ValueError:
        return message


def _one_line(reason: str) -> str:
    """First line of a Triton reason, plus the first Python frame if it carries a traceback."""
    lines = [line.strip() for line in reason.strip().splitlines() if line.strip()]
    if not lines:
        return reason.strip()
    text = lines[0]
    if "At:" in lines:
        frames = lines[lines.index("At:") + 1 :]
        if frames:
            text += f" (at {frames[0]})"
    return text


_LOG_LINE = re.compile(r'^([IWE])\d{4} [\d:.]+\s+\d+ [^\]]+\] "(.*)"\s*$')
_PORT_IN_USE = re.compile(r"failed to start (\w+) service: .*Socket '([^']+)' already in use")
_MODEL_FAILED = re.compile(r"^failed to load '([^']+)' version (\d+): (.*)", re.DOTALL)
_POLL_FAILED = re.compile(r"^Poll failed for model directory '([^']+)': (.*)", re.DOTALL)
_PROTO_ERROR = re.compile(r"Error parsing text-format inference\.ModelConfig: (.*)$")
_CREATING = re.compile(r"^error: creating server: (.*)$")
_UNRECOGNIZED = re.compile(r"(unrecognized option '[^']+')")
_BAD_OPTION = re.compile(r'^Bad option: "([^"]+)"')
_LOADING = re.compile(r"^loading: (.+):(\d+)$")
_LOADED = re.compile(r"^(?:successfully loaded|failed to load) '([^']+)'")
_BENIGN = ("CudaDriverHelper has not been initialized.",)


def failure_causes(log_text: str) -> list[str]:
    """The causes a tritonserver log gives for failing to start, one line each.

    Recognises ports already in use, models that failed to load (with Triton's reason, e.g. the
    exception raised in ``initialize``) and configs that do not parse; falls back on the
    server's last error line.
    """
    causes: list[str] = []
    errors: list[str] = []
    creating = None
    proto_error = None
    bad_option = None
    for raw in log_text.splitlines():
        if bad_option is not None and raw.strip():
            causes.append(f"bad option {bad_option}: {raw.strip()}")
            bad_option = None
            continue
        if m := _BAD_OPTION.match(raw):
            bad_option = m.group(1)
            continue
        if m := _UNRECOGNIZED.search(raw):
            causes.append(m.group(1))
            continue
        if m := _PROTO_ERROR.search(raw):
            proto_error = m.group(1).strip()
            continue
        if m := _CREATING.match(raw.strip()):
            creating = m.group(1).strip()
            continue
        m = _LOG_LINE.match(raw)
        if not m:
            continue
        level, message = m.group(1), _unquote(m.group(2))
        if m2 := _PORT_IN_USE.search(message):
            service, address = m2.groups()
            port = address.rsplit(":", 1)[-1]
            causes.append(
                f"port {port} ({service}) is already in use on {address.rsplit(':', 1)[0]}"
            )
        elif m2 := _MODEL_FAILED.match(message):
            model, version, reason = m2.groups()
            causes.append(f"model '{model}' version {version} failed to load: {_one_line(reason)}")
        elif m2 := _POLL_FAILED.match(message):
            model, reason = m2.groups()
            detail = f" ({proto_error})" if proto_error else ""
            causes.append(f"model '{model}': {_one_line(reason)}{detail}")
            proto_error = None
        elif level == "E" and message not in _BENIGN:
            errors.append(_one_line(message))
    if not causes and errors:
        causes.append(errors[-1])
    if not causes and creating:
        causes.append(creating)
    return list(dict.fromkeys(causes))


def loading_models(log_text: str) -> list[str]:
    """Models the log shows as started loading but neither loaded nor failed yet."""
    pending: dict[str, None] = {}
    for raw in log_text.splitlines():
        m = _LOG_LINE.match(raw)
        if not m:
            continue
        message = _unquote(m.group(2))
        if m2 := _LOADING.match(message):
            pending[m2.group(1)] = None
        elif m2 := _LOADED.match(message):
            pending.pop(m2.group(1), None)
    return list(pending)


def _log_tail(path: Path, lines: int = 1) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


# ------------------------------------------------------------------------------- HTTP (stdlib)


def _request(
    url: str,
    *,
    method: str = "GET",
    body: Any = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 5.0,
) -> tuple[int, Any]:
    """One JSON request to the server's HTTP endpoint: (status, decoded body or text)."""
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    req = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


# ---------------------------------------------------------------------------------- the server


class EmbeddedServer:
    """A tritonserver process serving one model repository on 127.0.0.1.

    Usage::

        with EmbeddedServer(Path("model_repository")) as server:   # start() on enter
            print(server.http_url, server.grpc_url, server.models)

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
            refused. The admin key is visible in the server's ``/proc/<pid>/cmdline`` (see the
            module docstring).

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
    ) -> None:
        self.model_repository = Path(model_repository)
        self._requested_ports = {"HTTP": http_port, "GRPC": grpc_port, "Metrics": metrics_port}
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
        self._finalizer: weakref.finalize | None = None

    # ---- endpoints and state

    @property
    def http_url(self) -> str:
        """``127.0.0.1:PORT`` of the HTTP endpoint (as tritonclient expects it)."""
        return f"{LOOPBACK}:{self._port('HTTP')}"

    @property
    def grpc_url(self) -> str:
        """``127.0.0.1:PORT`` of the gRPC endpoint."""
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
        HTTP and gRPC alike (gRPC expects the key prefixed with ``triton-grpc-protocol-``)."""
        return {ADMIN_HEADER: self._admin_token, f"{_GRPC_PREFIX}{ADMIN_HEADER}": self._admin_token}

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

    def stub_processes(self) -> dict[str, int]:
        """Python-backend stubs of this server: model instance name (``<model>_0_0``) -> pid."""
        return stub_processes(self.pid) if self.pid is not None else {}

    def repository_index(self) -> list[dict[str, Any]]:
        """Triton's ``/v2/repository/index``: name, version, state and reason of every model."""
        status, body = _request(
            f"http://{self.http_url}/v2/repository/index",
            method="POST",
            headers=self.admin_headers,
        )
        if status != 200 or not isinstance(body, list):
            raise ServerError(f"repository index of {self.http_url} answered {status}: {body}")
        return body

    # ---- command line

    def _installed_backends(self) -> Path | None:
        """``../backends`` of an installed server such as the NGC image's ``/opt/tritonserver``
        (its Python backend brings its own stub); None for the wheel's binary."""
        home = self.binary.resolve().parent.parent
        own = home / "backends"
        if home != pytriton_server_dir().resolve() and (own / "python").is_dir():
            return own
        return None

    def backend_directory(self) -> Path:
        """The ``--backend-directory``: an installed server's own, else the project cache one."""
        return self._installed_backends() or python_backend_dir()

    def command(self) -> list[str]:
        """The tritonserver command line ``start`` runs (choosing free ports if not yet done)."""
        self._choose_ports(keep=True)
        binary = self.binary
        options = binary_options(binary)
        grpc_flag = next(
            (f for f in ("--grpc-restricted-protocol", "--grpc-restricted-api") if f in options),
            None,
        )
        missing = [
            flag
            for flag, present in (
                ("--http-restricted-api", "--http-restricted-api" in options),
                ("--grpc-restricted-protocol", grpc_flag is not None),
            )
            if not present
        ]
        if missing and not self.allow_open_admin_apis:
            raise ServerError(
                f"tritonserver {binary} has no {' / '.join(missing)}, so its admin APIs "
                f"({', '.join(RESTRICTED_APIS)}) would be open to any caller; use a Triton that "
                f"has it, or accept open admin APIs with `tools serve --allow-open-admin-apis` "
                f"or {OPEN_ADMIN_ENV}=1"
            )
        cmd = [
            str(binary),
            f"--model-repository={self.model_repository.resolve()}",
            f"--backend-directory={self.backend_directory()}",
            f"--http-address={LOOPBACK}",
            f"--http-port={self._port('HTTP')}",
            f"--grpc-address={LOOPBACK}",
            f"--grpc-port={self._port('GRPC')}",
            f"--metrics-address={LOOPBACK}",
            f"--metrics-port={self._port('Metrics')}",
            "--model-control-mode=none",
            "--strict-readiness=true",
            "--exit-on-error=true",
            f"--exit-timeout-secs={self.exit_timeout_s}",
        ]
        # No config auto-completion: every config.pbtxt must be complete, as built.
        if "--disable-auto-complete-config" in options:
            cmd.append("--disable-auto-complete-config")
        else:
            cmd.append("--strict-model-config=true")
        if "--http-max-input-size" in options:  # Triton 25.x+; absent from 2.51
            cmd.append(f"--http-max-input-size={HTTP_MAX_INPUT_SIZE}")
        # The key is visible in /proc/<pid>/cmdline: see the module docstring.
        restriction = f"{','.join(RESTRICTED_APIS)}:{ADMIN_HEADER}={self._admin_token}"
        if "--http-restricted-api" in options:
            cmd.append(f"--http-restricted-api={restriction}")
        if grpc_flag is not None:
            cmd.append(f"{grpc_flag}={restriction}")
        return [*cmd, *self.extra_args]

    def environment(self) -> dict[str, str]:
        """The server's environment: this venv's ``bin`` first on ``PATH`` (the stub imports
        packages through it) and this interpreter's LIBDIR first on ``LD_LIBRARY_PATH``."""
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join(
            p for p in (str(Path(sys.executable).parent), env.get("PATH", "")) if p
        )
        if self._installed_backends() is None:  # the wheel's stub loads libpython3.X.so.1.0
            env["LD_LIBRARY_PATH"] = os.pathsep.join(
                p for p in (str(libpython_dir()), env.get("LD_LIBRARY_PATH", "")) if p
            )
        return env

    # ---- lifecycle

    def _check_repository(self) -> None:
        repo = self.model_repository
        if not repo.is_dir():
            what = "is not a folder" if repo.exists() else "does not exist"
            raise UserInputError(
                f"model repository {repo} {what} (build one with `tools build-repo`)"
            )
        if not any(p.is_dir() for p in repo.iterdir()):
            raise UserInputError(f"model repository {repo} holds no model folder")

    def _choose_ports(self, *, keep: bool) -> None:
        if keep and self._ports:
            return  # a restarted server keeps the ports its clients know
        for kind, port in self._requested_ports.items():
            if port and port_in_use(port):
                raise ServerError(
                    f"port {port} ({kind}) is already in use on {LOOPBACK}; "
                    f"choose another --{kind.lower()}-port, or 0 for a free one"
                )
        auto = [k for k, p in self._requested_ports.items() if not p]
        chosen = dict(zip(auto, free_ports(len(auto))))
        self._ports = {k: p or chosen[k] for k, p in self._requested_ports.items()}

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
        self._check_repository()
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
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # own process group: stop() reaches every stub
            )
        self._finalizer = weakref.finalize(self, _kill_group, self._proc.pid)
        deadline = time.monotonic() + timeout_s
        while True:
            code = self._proc.poll()
            if code is not None:
                self._finish()
                raise self._startup_error(code)
            if self._ready():
                return self
            if time.monotonic() > deadline:
                pending = self._pending_models()
                self.stop()
                raise ServerError(
                    f"tritonserver on {self.model_repository} not ready after {timeout_s:g} s: "
                    f"{pending} (server log: {self.log_path})"
                )
            time.sleep(0.2)

    def _ready(self) -> bool:
        try:
            status, _ = _request(f"http://{self.http_url}/v2/health/ready", timeout_s=2)
            if status != 200:
                return False
            index = self.repository_index()
        except (OSError, ServerError):
            return False
        if any(entry.get("state") != "READY" for entry in index):
            return False
        self._models = sorted(entry["name"] for entry in index)
        return True

    def _pending_models(self) -> str:
        try:
            index = self.repository_index()
        except (OSError, ServerError):
            # tritonserver opens its endpoints only after loading every model
            loading = loading_models(self.log_path.read_text(errors="replace"))
            if loading:
                return "still loading " + ", ".join(f"'{name}'" for name in loading)
            return "the server does not answer"
        pending = [
            f"'{e['name']}' {e.get('state', 'UNKNOWN')}"
            + (f" ({_one_line(e['reason'])})" if e.get("reason") else "")
            for e in index
            if e.get("state") != "READY"
        ]
        return "models not ready: " + ", ".join(pending) if pending else "server not ready"

    def _startup_error(self, code: int) -> ServerError:
        log_text = self.log_path.read_text(errors="replace")
        causes = failure_causes(log_text)
        taken = {int(m) for c in causes for m in re.findall(r"^port (\d+) .* already in use", c)}
        taken_kinds = [k for k, p in self._ports.items() if p in taken]
        if taken_kinds and all(not self._requested_ports[k] for k in taken_kinds):
            self._ports = {}
            return _AutoPortTaken()
        cause = "; ".join(causes) or _log_tail(self.log_path) or "no output"
        return ServerError(
            f"tritonserver exited while starting (exit code {code}): {cause} "
            f"(server log: {self.log_path})"
        )

    def stop(self) -> None:
        """Stop the server: in-flight requests get ``exit_timeout_s`` to finish, then SIGKILL
        for whatever remains of its process group (tritonserver and every stub)."""
        if self._proc is None:
            return
        try:
            terminate_process_group(self._proc.pid, self.exit_timeout_s + STOP_GRACE_S)
        finally:
            self._finish()

    def _finish(self) -> None:
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            if process_group_members(self._proc.pid):
                _kill_group(self._proc.pid)
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None

    def detach(self) -> int:
        """Leave the server running after this object (and this process) ends; returns its pid."""
        if self._proc is None:
            raise ServerError("the server has not been started")
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        pid = self._proc.pid
        # forget the child so Popen.__del__ does not warn; init reaps it later
        self._proc.returncode = 0
        return pid

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.http_url if self._ports else "not started"
        return f"EmbeddedServer({str(self.model_repository)!r}, {where}, pid={self.pid})"


def _default_log_path() -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return (
        Path(tempfile.gettempdir())
        / "triton-forge-logs"
        / f"tritonserver-{stamp}-{secrets.token_hex(3)}.log"
    )


class _AutoPortTaken(ServerError):
    """A port chosen as free was taken before tritonserver bound it; start retries."""


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ------------------------------------------------------------------------------- health check

# How this Triton release answers a request for a model whose Python stub has died.
_DEAD_STUB_MARKERS = ("is not healthy", "Stub process", "stub process")
_JSON_DTYPES = {"TYPE_STRING": "BYTES"}


def _probe_request(config: Mapping[str, Any]) -> dict[str, Any]:
    """A minimal valid-shaped request from a model config: zeros, one row, strings "health"."""
    batching = int(config.get("max_batch_size", 0)) > 0
    inputs = []
    for spec in config.get("input", []):
        if spec.get("optional"):
            continue
        dims = [1 if int(d) < 0 else int(d) for d in spec.get("dims", [])]
        shape = ([1] if batching else []) + dims
        count = 1
        for d in shape:
            count *= d
        dtype = spec["data_type"]
        datatype = _JSON_DTYPES.get(dtype, dtype.removeprefix("TYPE_"))
        if datatype == "BOOL":
            data: list[Any] = [False] * count
        elif datatype == "BYTES":
            data = ["health"] * count
        else:
            data = [0] * count
        inputs.append({"name": spec["name"], "shape": shape, "datatype": datatype, "data": data})
    return {"inputs": inputs}


def health_check(
    server: EmbeddedServer | str,
    models: Iterable[str] | None = None,
    *,
    infer: bool = True,
    requests: Mapping[str, Mapping[str, Any]] | None = None,
    timeout_s: float = 10.0,
) -> dict[str, str]:
    """Probe a server model by model: readiness, and a real inference through each model.

    Triton 2.51 keeps reporting a model ready after its Python stub died; only a request
    reaches the stub. A model that answers a probe with its own error (say, INVALID_ARG for a
    placeholder image) is alive; one whose stub is gone is not.

    Args:
        server: An ``EmbeddedServer`` or the ``host:port`` of an HTTP endpoint.
        models: Models to probe; defaults to every model in the repository index.
        infer: Also send one inference request per model.
        requests: KServe v2 JSON bodies to send per model instead of the synthetic probe
            (zeros, one row, the string "health").
        timeout_s: Per-request timeout.

    Returns:
        model -> "ok", or "answered with an error: <message>" (alive, probe rejected).

    Raises:
        ServerError: the server is not live, or some model is not ready or did not answer;
            the message names each such model.
    """
    url = server.http_url if isinstance(server, EmbeddedServer) else server
    headers = server.admin_headers if isinstance(server, EmbeddedServer) else {}
    log_hint = f" (server log: {server.log_path})" if isinstance(server, EmbeddedServer) else ""
    base = f"http://{url}/v2"
    try:
        status, _ = _request(f"{base}/health/live", timeout_s=timeout_s)
    except OSError as exc:
        raise ServerError(f"server at {url} does not answer: {exc}{log_hint}") from exc
    if status != 200:
        raise ServerError(f"server at {url} is not live (HTTP {status}){log_hint}")
    if models is None:
        status, index = _request(
            f"{base}/repository/index", method="POST", headers=headers, timeout_s=timeout_s
        )
        if status != 200:
            raise ServerError(
                f"cannot list the models of {url} (HTTP {status}: {index}); name them"
            )
        models = [entry["name"] for entry in index]
    results: dict[str, str] = {}
    problems: list[str] = []
    for model in models:
        status, body = _request(f"{base}/models/{model}/ready", timeout_s=timeout_s)
        if status != 200:
            problems.append(f"model '{model}' is not ready")
            continue
        if not infer:
            results[model] = "ok"
            continue
        if requests and model in requests:
            payload = dict(requests[model])
        else:
            _, config = _request(f"{base}/models/{model}/config", timeout_s=timeout_s)
            payload = _probe_request(config if isinstance(config, dict) else {})
        try:
            status, body = _request(
                f"{base}/models/{model}/infer", method="POST", body=payload, timeout_s=timeout_s
            )
        except OSError as exc:
            problems.append(f"model '{model}' did not answer an inference: {exc}")
            continue
        if status == 200:
            results[model] = "ok"
            continue
        message = body.get("error", body) if isinstance(body, dict) else body
        if any(marker in str(message) for marker in _DEAD_STUB_MARKERS):
            problems.append(f"model '{model}' failed an inference: {message}")
        else:
            results[model] = f"answered with an error: {message}"
    if problems:
        raise ServerError("; ".join(problems) + log_hint)
    return results
