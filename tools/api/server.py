"""The gateway as a child process: start it (``python -m tools.api``), wait until its
``/health`` answers 200, stop it. ``tools serve``, ``tools loadtest --api``, ``tools bench``
and the tests run it this way.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools import process
from tools.api.state import Limits
from tools.errors import ServerError
from tools.net import LOOPBACK, free_ports, start_choosing_again

HEALTH_PATH = "/health"
STOP_GRACE_S = 5.0  # uvicorn's graceful shutdown: requests in flight finish first
_LOG_TAIL = 30


def command(url: str, repository: Path, host: str, port: int, limits: Limits = Limits(),
            tei_models: tuple[str, ...] = (), python: str = sys.executable,
            watch_pid: int | None = None) -> list[str]:
    """The gateway's command line (what a container runs, with its own interpreter)."""
    argv = [python, "-m", "tools.api", "--url", url, "--repository", str(repository),
            "--host", host, "--port", str(port)]
    defaults = Limits()
    for flag, value, default in (
        ("--max-body-bytes", limits.max_body_bytes, defaults.max_body_bytes),
        ("--openai-max-inputs", limits.openai_max_inputs, defaults.openai_max_inputs),
        ("--tei-max-inputs", limits.tei_max_inputs, defaults.tei_max_inputs),
    ):
        if value != default:
            argv += [flag, str(value)]
    if not limits.auto_truncate:
        argv.append("--no-auto-truncate")
    for name in tei_models:
        argv += ["--tei-model", name]
    if watch_pid is not None:
        argv += ["--watch-pid", str(watch_pid)]
    return argv


class ApiServer:
    """The OpenAI/TEI gateway in front of a Triton server, as a child of this process.

    ``with ApiServer("127.0.0.1:8000", Path("model_repository"), log_path=...) as api:``
    gives a gateway answering at ``api.url`` (``host:port``), stopped at the end.

    Args:
        triton_url: ``host:port`` of Triton's HTTP endpoint.
        repository: The model repository Triton serves.
        host: Address to listen on.
        port: Port (None: a free one).
        log_path: Where its output goes (None: this process's stdout and stderr).
        limits: Per-request limits.
        tei_models: Pipelines the TEI routes prefer.
        env: Its environment (None: this process's).
        watch_pid: It stops by itself once this process is gone (``tools serve``: tritonserver,
            so a detached server keeps its gateway).
    """

    def __init__(self, triton_url: str, repository: Path, *, host: str = LOOPBACK,
                 port: int | None = None, log_path: Path | None = None,
                 limits: Limits = Limits(), tei_models: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, watch_pid: int | None = None) -> None:
        self.triton_url = triton_url
        self.watch_pid = watch_pid
        self.repository = Path(repository)
        self.host = host
        self._auto_port = not port
        self.port = port or free_ports(1)[0]
        self.log_path = log_path
        self.limits = limits
        self.tei_models = tei_models
        self.env = env
        self._proc: Any = None

    @property
    def url(self) -> str:
        """``host:port`` of the gateway."""
        return f"{self.host}:{self.port}"

    @property
    def health_url(self) -> str:
        """Its readiness URL: 200 once Triton and every pipeline found are ready."""
        return f"http://{self.url}{HEALTH_PATH}"

    @property
    def pid(self) -> int | None:
        """The gateway's process id (it leads its own process group)."""
        return self._proc.pid if self._proc is not None else None

    def command(self) -> list[str]:
        """Its command line."""
        return command(self.triton_url, self.repository, self.host, self.port, self.limits,
                       self.tei_models, watch_pid=self.watch_pid)

    def ready(self) -> bool:
        """``/health`` answers 200."""
        try:
            with urllib.request.urlopen(self.health_url, timeout=2) as response:
                return response.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def start(self, timeout_s: float = 120.0,
              until: Callable[[], bool] | None = None) -> ApiServer:
        """Start it and wait until it is ready (``until``, default ``ready``: /health 200).

        A free port it chose that another process bound before the gateway did is chosen
        again (three attempts).

        Raises:
            ServerError: it exited or was not ready within ``timeout_s`` (the end of its log
                in the message); it is stopped first.
        """
        if self._proc is not None:
            raise ServerError(f"the gateway on {self.url} is already started")
        return start_choosing_again(
            lambda: self._start_once(timeout_s, until),
            lambda: {"gateway": self.port} if self._auto_port else {},
            self._choose_port_again)

    def _choose_port_again(self, _taken: dict[str, int]) -> None:
        self.port = free_ports(1)[0]

    def _start_once(self, timeout_s: float, until: Callable[[], bool] | None) -> ApiServer:
        try:
            self._proc = process.start(self.command(), env=self.env, log_path=self.log_path)
        except OSError as exc:
            raise ServerError(f"cannot start the gateway ({self.command()[0]}): {exc}") from exc
        outcome = process.wait_ready(self._proc, until or self.ready, timeout_s)
        if outcome is not process.Readiness.READY:
            code = self._proc.poll()
            self.stop()
            raise ServerError(f"the gateway on {self.url} {outcome.value} (exit code {code}) "
                              f"before it was ready{self._log_tail()}")
        return self

    def poll(self) -> int | None:
        """Its exit code, or None while it runs."""
        return self._proc.poll() if self._proc is not None else None

    def detach(self) -> None:
        """Forget it, leaving it running (with ``watch_pid`` it ends with that process)."""
        if self._proc is not None:
            self._proc.returncode = 0  # so Popen.__del__ does not warn; init reaps it later
            self._proc = None

    def stop(self) -> None:
        """SIGTERM (requests in flight finish), SIGKILL for what is left after the grace."""
        if self._proc is not None:
            process.stop(self._proc, STOP_GRACE_S)
            self._proc = None

    def _log_tail(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        lines = self.log_path.read_text(errors="replace").splitlines()[-_LOG_TAIL:]
        return f"; its log {self.log_path} ends:\n" + "\n".join(lines)

    def __enter__(self) -> ApiServer:
        return self.start() if self._proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
