"""The admission controller: from the front's per-request log to each model's in-flight cap.

HAProxy logs one line per request to the controller's socket (``haproxy_config.LOG_FORMAT``:
backend, server, status, total time, request bytes, termination state). For each model's
backend the controller feeds a ``LatencyLimit`` (every request offered moves the mean size; every
success its latency and size), and every ``TICK_S`` writes the caps that changed to HAProxy's
runtime API: ``forge cap <backend> <bytes> <floor> <requests>`` (a command of ``front.lua``).
The front does the counting (bytes in flight per model) and the refusing; the controller only
moves the numbers.

The objectives are read from tritonserver's model-config API (``admission_p99_ms``), again every
``CONFIG_TTL_S`` (a model may be reloaded with another). ``tools serve`` runs the controller in
the front's process (``python -m tools.front``), the serving images in their supervisor
(``docker/triton_supervisor.py``). Standard library only, for those images.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from tools.front.admission import MIN_IN_FLIGHT, LatencyLimit

SERVER = "triton"  # the server of every backend (haproxy_config)
TICK_S = 0.1  # caps are computed this often, and written when they changed
RESEND_S = 5.0  # every cap is written again this often (a reloaded HAProxy starts from its file)
CONFIG_TTL_S = 10.0
P99_PARAMETER = "admission_p99_ms"
_PREFIXES = ("h_", "g_")  # haproxy_config.http_backend / grpc_backend
_SHARED = ("h_triton", "g_triton")


def _log(message: str) -> None:
    print(f"front admission: {message}", file=sys.stderr, flush=True)


def parse_address(address: str) -> tuple[int, object]:
    """A socket family and address from HAProxy's notation: ``ipv4@HOST:PORT``, ``HOST:PORT``,
    ``unix@PATH`` or a path."""
    if address.startswith("unix@"):
        return socket.AF_UNIX, address[5:]
    if address.startswith("/"):
        return socket.AF_UNIX, address
    host, _, port = address.removeprefix("ipv4@").rpartition(":")
    return socket.AF_INET, (host or "127.0.0.1", int(port))


class Cap(NamedTuple):
    """A model's admission cap as the front applies it: a request is admitted while the bytes
    in flight stay within ``bytes`` or fewer than ``floor`` requests are in flight; ``requests``
    is the cap in requests of the mean size offered (what a reader compares with a count)."""

    bytes: int
    floor: int
    requests: int


class RuntimeApi:
    """HAProxy's runtime API on its stats socket (``stats socket ... level admin``).

    Args:
        address: The socket, in HAProxy's notation (``parse_address``).
        timeout_s: For connecting and for the answer.
    """

    def __init__(self, address: str, timeout_s: float = 2.0) -> None:
        self.family, self.address = parse_address(address)
        self.timeout_s = timeout_s

    def run(self, *commands: str) -> str:
        """Send ``commands`` on one connection (``;``-separated); HAProxy's answer.

        Raises:
            OSError: the socket cannot be reached.
        """
        with socket.socket(self.family, socket.SOCK_STREAM) as sock:
            sock.settimeout(self.timeout_s)
            sock.connect(self.address)
            sock.sendall(("; ".join(commands) + "\n").encode())
            chunks = []
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def set_caps(self, caps: dict[str, Cap]) -> str:
        """``forge cap <backend> <bytes> <floor> <requests>`` for each backend of ``caps``."""
        return self.run(*(f"forge cap {b} {c.bytes} {c.floor} {c.requests}"
                          for b, c in sorted(caps.items())))

    def _rows(self) -> list[list[int | str]]:
        """``forge caps``: backend, cap bytes, floor, cap requests, bytes and requests in flight."""
        rows = []
        for line in self.run("forge caps").splitlines():
            parts = line.split()
            if len(parts) == 6 and all(p.isdigit() for p in parts[1:]):
                rows.append([parts[0], *map(int, parts[1:])])
        return rows

    def caps(self) -> dict[str, Cap]:
        """Each model backend's cap as the front holds it now."""
        return {row[0]: Cap(*row[1:4]) for row in self._rows()}

    def in_flight(self) -> dict[str, tuple[int, int]]:
        """Each model backend's bytes and requests in flight, as the front counts them."""
        return {row[0]: (row[4], row[5]) for row in self._rows()}


@dataclass(frozen=True)
class Completion:
    """One request as the front logged it."""

    backend: str
    served: bool  # it reached tritonserver (not refused by the front)
    ok: bool  # answered successfully
    latency_s: float
    size: int  # bytes the client sent


def parse_line(line: str) -> Completion | None:
    """A log line (``%b %s %ST %Ta %[var(txn.cost)] %ts``), or None when it is not one."""
    parts = line.split()
    if len(parts) < 5:
        return None
    backend, server, status, total_ms, size = parts[:5]
    try:
        code, latency, nbytes = int(status), int(total_ms) / 1000, int(size)
    except ValueError:
        return None
    return Completion(backend, server == SERVER, 200 <= code < 300, max(latency, 0.0), nbytes)


def read_objective(triton_http: str, model: str, timeout_s: float = 2.0) -> float | None:
    """``model``'s ``admission_p99_ms`` in ms from tritonserver's model-config API, or None.

    Raises:
        OSError: tritonserver did not answer (``urllib.error.URLError`` is one).
    """
    url = f"http://{triton_http}/v2/models/{model}/config"
    with urllib.request.urlopen(url, timeout=timeout_s) as answer:
        config = json.loads(answer.read())
    value = (config.get("parameters") or {}).get(P99_PARAMETER, {}).get("string_value")
    try:
        p99 = float(value) if value is not None else None
    except ValueError:
        return None
    return p99 if p99 and p99 > 0 else None


class AdmissionController:
    """Each model backend's ``LatencyLimit``, fed from the log, written to HAProxy.

    Args:
        runtime: HAProxy's runtime API.
        objective: Model name -> its P99 objective in ms, or None (not capped). Called from a
            thread of its own, at most every ``CONFIG_TTL_S`` per model.
        clock: Seconds, monotonic.
    """

    def __init__(self, runtime: RuntimeApi, objective: Callable[[str], float | None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.runtime = runtime
        self.objective = objective
        self.clock = clock
        self.limits: dict[str, LatencyLimit] = {}
        self.written: dict[str, Cap] = {}
        self._objectives: dict[str, float | None] = {}
        self._read_at: dict[str, float] = {}
        self._asking: set[str] = set()
        self._resend_at = 0.0
        self._lock = threading.Lock()

    def feed(self, line: str) -> None:
        """Learn from one log line."""
        done = parse_line(line)
        if done is None or not done.backend.startswith(_PREFIXES) or done.backend in _SHARED:
            return
        limit = self._limit(done.backend)
        if limit is None:
            return
        cost = float(max(done.size, 1))
        limit.offer(cost)
        if done.served:
            limit.observe(self.clock(), done.latency_s, done.ok, cost)

    def _limit(self, backend: str) -> LatencyLimit | None:
        model = backend[2:]
        now = self.clock()
        with self._lock:
            stale = now - self._read_at.get(model, -CONFIG_TTL_S) >= CONFIG_TTL_S
            if stale and model not in self._asking:
                self._asking.add(model)
                threading.Thread(target=self._read, args=(model,), name=f"front-objective-{model}",
                                 daemon=True).start()
            p99_ms = self._objectives.get(model)
        if p99_ms is None:
            return None
        limit = self.limits.get(backend)
        if limit is None or limit.p99_s != p99_ms / 1000:
            limit = self.limits[backend] = LatencyLimit(p99_ms / 1000, self.clock)
        return limit

    def _read(self, model: str) -> None:
        try:
            p99 = self.objective(model)
        except (OSError, ValueError) as exc:
            with self._lock:
                known = model in self._objectives
            if not known:
                _log(f"no latency objective for model {model!r} yet ({exc}); its cap stays "
                     f"where it is")
            p99 = self._objectives.get(model)
        with self._lock:
            self._objectives[model] = p99
            self._read_at[model] = self.clock()
            self._asking.discard(model)

    def caps(self) -> dict[str, Cap]:
        """Each model backend's cap now."""
        now = self.clock()
        return {backend: Cap(math.ceil(limit.cap(now)), MIN_IN_FLIGHT, limit.cap_requests(now))
                for backend, limit in self.limits.items()}

    def tick(self) -> dict[str, Cap]:
        """Write the caps that changed (all of them every ``RESEND_S``); returns what was
        written. A runtime API that cannot be reached is retried at the next tick."""
        caps = self.caps()
        now = self.clock()
        resend = now >= self._resend_at
        changed = {b: c for b, c in caps.items() if resend or self.written.get(b) != c}
        if not changed:
            return {}
        try:
            answer = self.runtime.set_caps(changed)
        except OSError as exc:
            _log(f"runtime API not reachable ({exc}); caps not written")
            return {}
        if answer.strip():
            _log(f"runtime API: {answer.strip()[:200]}")
        self.written.update(changed)
        if resend:
            self._resend_at = now + RESEND_S
        return changed

    def serve(self, log_socket: socket.socket, stop: threading.Event) -> None:
        """Read log lines from ``log_socket`` (datagrams) and tick, until ``stop`` is set."""
        log_socket.settimeout(TICK_S)
        next_tick = self.clock() + TICK_S
        while not stop.is_set():
            try:
                datagram = log_socket.recv(65536)
            except socket.timeout:
                datagram = b""
            except OSError:
                if stop.is_set():
                    return
                raise
            for line in datagram.decode(errors="replace").splitlines():
                self.feed(line)
            if self.clock() >= next_tick:
                self.tick()
                next_tick = self.clock() + TICK_S


def log_socket(address: str) -> socket.socket:
    """A datagram socket bound where HAProxy sends its log (``FORGE_FRONT_LOG``)."""
    family, where = parse_address(address)
    sock = socket.socket(family, socket.SOCK_DGRAM)
    if family == socket.AF_UNIX:
        try:
            os.unlink(where)
        except FileNotFoundError:
            pass
    else:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    sock.bind(where)
    return sock


def run_in_thread(admin: str, log: str, triton_http: str) -> tuple[threading.Thread, threading.Event]:
    """Start a controller for the front whose runtime API is ``admin`` and whose log goes to
    ``log``, reading objectives from ``triton_http``; returns its thread and the event that
    stops it (the supervisor of the serving images calls this).

    Raises:
        OSError: the log socket cannot be bound.
    """
    sock = log_socket(log)
    controller = AdmissionController(RuntimeApi(admin),
                                     lambda model: read_objective(triton_http, model))
    stop = threading.Event()

    def loop() -> None:
        try:
            controller.serve(sock, stop)
        finally:
            sock.close()

    thread = threading.Thread(target=loop, name="front-admission", daemon=True)
    thread.start()
    return thread, stop

