"""The front beside an embedded tritonserver: ``python -m tools.front`` in a session of its own.

``FrontProcess`` renders the config for the served repository into a private run folder (the
runtime API and the controller's log are Unix sockets there), starts the front, waits until
its public HTTP and gRPC ports accept, and stops it. The front ends by itself once tritonserver
is gone, so a detached server (``tools serve --background``) keeps its front.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tools import net, process
from tools.errors import ServerError, UserInputError
from tools.front import haproxy_config
from tools.front.controller import RuntimeApi
from tools.front.plan import FrontPlan

HAPROXY_ENV = "FORGE_HAPROXY"
# Debian puts haproxy in /usr/sbin, which is not on an ordinary user's PATH
_SBIN = ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy")
STOP_GRACE_S = 15.0  # the front's own soft stop takes up to 10 s
INSTALL_HINT = "install it with `apt-get install haproxy` (Debian/Ubuntu) or `brew install haproxy`"


def find_haproxy() -> Path | None:
    """The haproxy binary: ``$FORGE_HAPROXY``, else on PATH, else Debian's sbin; None if none.

    Raises:
        UserInputError: ``$FORGE_HAPROXY`` names something that is not an executable file.
    """
    named = os.environ.get(HAPROXY_ENV)
    if named:
        path = Path(named).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise UserInputError(f"${HAPROXY_ENV}={named} is not an executable file")
        return path
    found = shutil.which("haproxy") or next(
        (p for p in _SBIN if os.access(p, os.X_OK)), None)
    return Path(found) if found else None


def watchers_of(pid: int, module: str) -> list[int]:
    """The pids of the ``python -m <module>`` processes watching tritonserver ``pid``
    (``--watch-pid``): a detached server's front (``tools.front``) or gateway (``tools.api``)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info["cmdline"] or []
        if module in argv and "--watch-pid" in argv and \
                argv[argv.index("--watch-pid") + 1:][:1] == [str(pid)]:
            found.append(proc.pid)
    return found


def fronts_of(pid: int) -> list[int]:
    """The pids of the fronts watching tritonserver ``pid``."""
    return watchers_of(pid, "tools.front")


def stop_fronts_of(pid: int) -> None:
    """Stop the gateway and then the front of tritonserver ``pid`` (each answers what it holds
    first: the gateway's own calls still pass the front)."""
    for gateway in watchers_of(pid, "tools.api"):
        process.stop(gateway, STOP_GRACE_S, group=False)
    for front in fronts_of(pid):
        process.stop(front, STOP_GRACE_S, group=False)


class FrontProcess:
    """HAProxy and the admission controller on ``http_port``/``grpc_port`` of 127.0.0.1, in
    front of tritonserver's own loopback ports.

    Args:
        plan: What the front routes and refuses (``FrontPlan.from_repository``).
        haproxy: The haproxy binary.
        http_port: The public HTTP port.
        grpc_port: The public gRPC port.
        triton_http_port: tritonserver's own HTTP port.
        triton_grpc_port: tritonserver's own gRPC port.
        watch_pid: tritonserver's pid: the front stops once it is gone.
        gateway_port: The OpenAI/TEI gateway's port, when ``plan`` routes paths to one.
    """

    name = "the front (HAProxy)"

    def __init__(self, plan: FrontPlan, haproxy: Path, *, http_port: int, grpc_port: int,
                 triton_http_port: int, triton_grpc_port: int, watch_pid: int,
                 gateway_port: int | None = None) -> None:
        self.plan, self.haproxy = plan, Path(haproxy)
        self.http_port, self.grpc_port = http_port, grpc_port
        self.triton_http_port, self.triton_grpc_port = triton_http_port, triton_grpc_port
        self.watch_pid, self.gateway_port = watch_pid, gateway_port
        self.run_dir: Path | None = None
        self._proc: subprocess.Popen | None = None

    @property
    def admin_socket(self) -> Path:
        """HAProxy's runtime API socket (``level admin``), in the private run folder."""
        if self.run_dir is None:
            raise ServerError("the front has not been started")
        return self.run_dir / "admin.sock"

    def runtime(self) -> RuntimeApi:
        """A client of the front's runtime API."""
        return RuntimeApi(str(self.admin_socket))

    def environment(self) -> dict[str, str]:
        """The environment the front runs with: where it listens and what it forwards to."""
        loop = net.LOOPBACK
        env = dict(os.environ)
        env.update({
            "FORGE_FRONT_HTTP": f"{loop}:{self.http_port}",
            "FORGE_FRONT_GRPC": f"{loop}:{self.grpc_port}",
            "FORGE_TRITON_HTTP": f"{loop}:{self.triton_http_port}",
            "FORGE_TRITON_GRPC": f"{loop}:{self.triton_grpc_port}",
            "FORGE_FRONT_ADMIN": str(self.admin_socket),
            # UDP on loopback, the port chosen when the runner binds it: a Unix datagram
            # socket queues only net.unix.max_dgram_qlen (10) lines, and HAProxy drops the
            # rest while the controller's thread waits for a core
            "FORGE_FRONT_LOG": f"{loop}:0",
        })
        if self.gateway_port is not None:
            env["FORGE_GATEWAY"] = f"{loop}:{self.gateway_port}"
        # the runner imports tools.front from this checkout or installation
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        return env

    def command(self) -> list[str]:
        """The front's argv."""
        return [sys.executable, "-m", "tools.front", "--haproxy", str(self.haproxy),
                "--config", str(self.run_dir / haproxy_config.CONFIG_NAME),
                "--triton-http", f"{net.LOOPBACK}:{self.triton_http_port}",
                "--watch-pid", str(self.watch_pid), "--remove-dir"]

    def start(self, log_path: Path, timeout_s: float = 15.0) -> None:
        """Render its config, start it (output appended to ``log_path``), wait until both public
        ports accept.

        Raises:
            ServerError: it exited or did not listen in time (it is stopped; the log says why).
        """
        self.run_dir = Path(tempfile.mkdtemp(prefix="triton-forge-front-"))
        haproxy_config.write(self.plan, self.run_dir)
        self._proc = process.start(self.command(), env=self.environment(), log_path=log_path,
                                   append=True)
        ready = process.wait_ready(
            self._proc, lambda: net.accepts(self.http_port) and net.accepts(self.grpc_port),
            timeout_s, interval_s=0.05)
        if ready is not process.Readiness.READY:
            self.stop()
            raise ServerError(f"{self.name} did not listen on {net.LOOPBACK}:{self.http_port} "
                              f"and :{self.grpc_port} within {timeout_s:g} s ({ready.value}; "
                              f"server log: {log_path})")

    def poll(self) -> int | None:
        """Its exit code, or None while it runs (or before start)."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def running(self) -> bool:
        """True while it runs."""
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        """SIGTERM (HAProxy stops listening and finishes what runs), SIGKILL after
        ``STOP_GRACE_S``; its run folder goes with it."""
        if self._proc is not None:
            # the runner alone: it soft-stops HAProxy (SIGTERM to the group would hard-stop it)
            process.stop(self._proc, STOP_GRACE_S, group=False)
            self._proc = None
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def detach(self) -> None:
        """Forget it, leaving it running (it ends with tritonserver, removing its run folder)."""
        if self._proc is not None:
            self._proc.returncode = 0  # so Popen.__del__ does not warn; init reaps it later
            self._proc = None
        self.run_dir = None
