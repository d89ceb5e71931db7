"""The guard processes in front of the embedded tritonserver's public ports.

``http_guard`` (request size, JSON shapes and HTTP framing) and ``grpc_guard`` (message size)
each run as a child of their own, started, waited for and stopped through ``tools.process``, and
end by themselves once tritonserver is gone (so a detached server keeps its guards).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tools import net, process
from tools.errors import ServerError
from tools.serve.http_guard import GuardLimits

STOP_GRACE_S = 5.0  # a guard exits at once on SIGTERM when tritonserver is gone


class GuardProcess:
    """One guard: ``command`` listening on ``listen_port`` of 127.0.0.1 (or the address in it).

    Args:
        name: For messages, e.g. "the HTTP guard".
        command: Its argv.
        listen_port: The port it serves; it is ready once that port accepts connections.
    """

    def __init__(self, name: str, command: list[str], listen_port: int) -> None:
        self.name = name
        self.command = command
        self.listen_port = listen_port
        self._proc: subprocess.Popen | None = None

    def start(self, log_path: Path, timeout_s: float = 10.0) -> None:
        """Start it (its output appended to ``log_path``), in a session of its own, and wait
        until it listens.

        Raises:
            ServerError: it exited or did not listen within ``timeout_s`` (it is stopped).
        """
        self._proc = process.start(self.command, log_path=log_path, append=True)
        ready = process.wait_ready(self._proc, lambda: net.accepts(self.listen_port), timeout_s,
                                   interval_s=0.05)
        if ready is not process.Readiness.READY:
            self.stop()
            raise ServerError(f"{self.name} did not listen on {net.LOOPBACK}:{self.listen_port} "
                              f"within {timeout_s:g} s ({ready.value}; server log: {log_path})")

    def poll(self) -> int | None:
        """Its exit code, or None while it runs (or before start)."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def running(self) -> bool:
        """True while it runs."""
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``STOP_GRACE_S``."""
        if self._proc is not None:
            process.stop(self._proc, STOP_GRACE_S)
            self._proc = None

    def detach(self) -> None:
        """Forget it, leaving it running (it ends with tritonserver)."""
        if self._proc is not None:
            self._proc.returncode = 0  # so Popen.__del__ does not warn; init reaps it later
            self._proc = None


class Guards:
    """The guards of one server, started together and stopped together."""

    def __init__(self) -> None:
        self._guards: list[GuardProcess] = []

    def start(self, guards: list[GuardProcess], log_path: Path) -> None:
        """Start ``guards`` one after the other (``GuardProcess.start``).

        Raises:
            ServerError: one did not listen (every guard started is stopped again).
        """
        for guard in guards:
            self._guards.append(guard)
            try:
                guard.start(log_path)
            except ServerError:
                self.stop()
                raise

    def exited(self) -> GuardProcess | None:
        """The first guard that has exited, or None."""
        return next((g for g in self._guards if g.poll() is not None), None)

    @property
    def running(self) -> bool:
        """True while every guard runs (also when there is none)."""
        return all(guard.running for guard in self._guards)

    def stop(self) -> None:
        """Stop every guard."""
        for guard in self._guards:
            guard.stop()
        self._guards = []

    def detach(self) -> None:
        """Forget every guard, leaving them running."""
        for guard in self._guards:
            guard.detach()
        self._guards = []


def http_guard(limits: GuardLimits, listen_port: int, upstream_port: int,
               watch_pid: int) -> GuardProcess:
    """``tools.serve.http_guard`` on ``listen_port`` in front of tritonserver's HTTP port."""
    return GuardProcess("the HTTP guard", [
        sys.executable, "-m", "tools.serve.http_guard",
        "--listen-port", str(listen_port), "--upstream-port", str(upstream_port),
        "--max-body-bytes", str(limits.max_body_bytes),
        "--max-buffered-bytes", str(limits.max_buffered_bytes),
        "--read-timeout-s", str(limits.read_timeout_s),
        "--watch-pid", str(watch_pid),
    ], listen_port)


def grpc_guard(max_message_bytes: int, listen_port: int, upstream_port: int,
               watch_pid: int, triton_http_port: int) -> GuardProcess:
    """``tools.serve.grpc_guard`` on ``listen_port`` in front of tritonserver's gRPC port; it
    reads the models' latency targets from tritonserver's HTTP port (``tools.serve.admission``)."""
    return GuardProcess("the gRPC guard", [
        sys.executable, "-m", "tools.serve.grpc_guard",
        "--listen-port", str(listen_port), "--upstream-port", str(upstream_port),
        "--max-message-bytes", str(max_message_bytes),
        "--watch-pid", str(watch_pid), "--triton-http-port", str(triton_http_port),
    ], listen_port)
