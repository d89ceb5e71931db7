"""Load and meters for the fault suite and the soak: a cheap keep-alive HTTP client, CPU and RSS.

The client prebuilds each request's bytes and runs on one asyncio loop, so it costs the shared
cores little; every request becomes a ``tools.stats.Record``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

from tools import process
from tools.stats import Record

_TIMEOUT_ERROR = "client timeout"


def infer_request(host: str, model: str, body: Mapping[str, Any] | bytes) -> bytes:
    """The bytes of one keep-alive KServe v2 JSON inference POST to ``model``."""
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("connection closed by the server")
    status = int(status_line.split()[1])
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    return status, await reader.readexactly(length)


@dataclass
class HttpLoad:
    """Keep-alive HTTP load on one model: closed loop (``users``) or open loop (``rate``).

    Open loop sends at ``rate`` requests/s whatever the answers, over ``connections``
    keep-alive connections (one request in flight on each); a request whose send time comes
    while every connection is busy waits for one, and its latency counts from its scheduled
    time (no coordinated omission). Every request gets ``timeout_s``; past it the connection is
    dropped and the request fails with "client timeout".

    Attributes:
        url: ``host:port`` of the HTTP endpoint.
        model: The model to send to.
        bodies: Request bodies (KServe v2 JSON, or ready bytes), sent in turn.
        timeout_s: Per-request client timeout.
        records: One record per request (times on ``time.monotonic``), filled while running.
    """

    url: str
    model: str
    bodies: Sequence[Mapping[str, Any] | bytes]
    timeout_s: float = 10.0
    records: list[Record] = field(default_factory=list)
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def _requests(self) -> list[bytes]:
        return [infer_request(self.url, self.model, b) for b in self.bodies]

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host, _, port = self.url.rpartition(":")
        return await asyncio.open_connection(host, int(port))

    async def _send(self, conn: list, request: bytes, scheduled: float) -> None:
        """Send one request on ``conn`` ([reader, writer] or [None, None]); reconnect if needed."""
        try:
            if conn[0] is None:
                conn[:] = await asyncio.wait_for(self._connection(), self.timeout_s)
            conn[1].write(request)
            status, body = await asyncio.wait_for(_read_response(conn[0]), self.timeout_s)
            ok, error = status == 200, "" if status == 200 else f"HTTP {status} {_error(body)}"
        except asyncio.TimeoutError:
            ok, error = False, _TIMEOUT_ERROR
            self._drop(conn)
        except (OSError, ConnectionError, ValueError, asyncio.IncompleteReadError) as exc:
            ok, error = False, f"{type(exc).__name__}: {exc}"[:200]
            self._drop(conn)
        self.records.append(Record(scheduled, (time.monotonic() - scheduled) * 1000.0, ok, error))

    @staticmethod
    def _drop(conn: list) -> None:
        if conn[1] is not None:
            conn[1].close()
        conn[:] = [None, None]

    async def _closed(self, users: int, duration_s: float, max_requests: int | None) -> None:
        requests, end = self._requests(), time.monotonic() + duration_s
        limit = max_requests if max_requests is not None else float("inf")

        async def user(index: int) -> None:
            conn: list = [None, None]
            sent = index
            while time.monotonic() < end and not self._stop.is_set() and sent < limit:
                await self._send(conn, requests[sent % len(requests)], time.monotonic())
                sent += users
            self._drop(conn)

        await asyncio.gather(*(user(i) for i in range(users)))

    async def _open(self, rate: float, duration_s: float, connections: int) -> None:
        requests, start = self._requests(), time.monotonic()
        idle: asyncio.Queue = asyncio.Queue()
        for _ in range(connections):
            idle.put_nowait([None, None])
        tasks = set()

        async def one(request: bytes, scheduled: float) -> None:
            conn = await idle.get()
            try:
                await self._send(conn, request, scheduled)
            finally:
                idle.put_nowait(conn)

        sent = 0
        while not self._stop.is_set():
            scheduled = start + sent / rate
            if scheduled - start >= duration_s:
                break
            delay = scheduled - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.ensure_future(one(requests[sent % len(requests)], scheduled))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent += 1
        if tasks:
            await asyncio.gather(*tasks)
        while not idle.empty():
            self._drop(idle.get_nowait())

    def run(self, *, users: int = 0, rate: float = 0.0, duration_s: float,
            connections: int = 64, max_requests: int | None = None) -> list[Record]:
        """Run in this thread until done; returns the records.

        Args:
            users: Closed loop with this many users (each sends after its last answer).
            rate: Open loop at this many requests/s (used when ``users`` is 0).
            duration_s: How long to send.
            connections: Open loop: keep-alive connections (the most requests in flight).
            max_requests: Closed loop: stop after sending this many.
        """
        loop = asyncio.new_event_loop()
        try:
            if users:
                loop.run_until_complete(self._closed(users, duration_s, max_requests))
            else:
                loop.run_until_complete(self._open(rate, duration_s, connections))
        finally:
            loop.close()
        return self.records

    def start(self, **kwargs: Any) -> HttpLoad:
        """``run`` in a background thread; ``join`` waits for it."""
        self._thread = threading.Thread(target=self.run, kwargs=kwargs, daemon=True)
        self._thread.start()
        return self

    def join(self, timeout_s: float | None = None) -> list[Record]:
        """Stop sending (requests in flight finish or time out) and return the records.

        Args:
            timeout_s: How long to wait for the thread; None waits for the planned duration.
        """
        if timeout_s is not None:
            self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s if timeout_s is None else timeout_s + self.timeout_s)
        return self.records


def _error(body: bytes) -> str:
    try:
        return str(json.loads(body).get("error", ""))[:200]
    except (ValueError, AttributeError):
        return body[:200].decode(errors="replace")


@dataclass(frozen=True)
class ProcessSample:
    """CPU seconds (user + system) and RSS of one role's processes at one moment."""

    cpu_s: float
    rss_bytes: int


def sample(pids: Iterable[int]) -> ProcessSample:
    """CPU seconds and RSS summed over the live ``pids``."""
    cpu, rss = 0.0, 0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                times = proc.cpu_times()
                cpu += times.user + times.system
                rss += proc.memory_info().rss
        except psutil.Error:
            continue
    return ProcessSample(cpu, rss)


def roles(server_pid: int, client_pid: int) -> dict[str, list[int]]:
    """The processes of a load run by role: tritonserver, each model's stubs, the client."""
    found: dict[str, list[int]] = {"tritonserver": [server_pid], "load generator": [client_pid]}
    for instance, pid in process.stub_processes(server_pid).items():
        found.setdefault(f"stub {instance}", []).append(pid)
    return found


def cpu_share(before: Mapping[str, ProcessSample], after: Mapping[str, ProcessSample],
              seconds: float) -> dict[str, float]:
    """Cores used by each role between two samples (1.0 = one core busy the whole time)."""
    return {
        role: round((after[role].cpu_s - before[role].cpu_s) / seconds, 3)
        for role in after
        if role in before and seconds > 0
    }
