"""The fault suite's shorthand for load: KServe v2 JSON bodies to one model over raw HTTP.

``HttpLoad`` runs the load engine (``tools.load``) with its raw keep-alive HTTP sender, so the
bodies go exactly as written, and keeps every request as a ``tools.stats.Record`` (times on
``time.monotonic``). The CPU and RSS meters live in ``tools.load.meters``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tools import process
from tools.load import Background, ClosedLoop, OpenLoop, RawHttp, Request, run_async, run_loop
from tools.load.meters import ProcessSample, cpu_share, sample
from tools.load.senders import http_request_bytes
from tools.stats import Record

__all__ = ["HttpLoad", "ProcessSample", "cpu_share", "infer_request", "roles", "sample"]


def infer_request(host: str, model: str, body: Mapping[str, Any] | bytes) -> bytes:
    """The bytes of one keep-alive KServe v2 JSON inference POST to ``model``."""
    request = Request.json(model, body)
    return http_request_bytes(host, request.http_path, request.http_body())


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
    _background: Background | None = None

    def _load(self, users: int, rate: float, connections: int) -> tuple[Any, ...]:
        requests = [Request.json(self.model, body) for body in self.bodies]
        pacing = ClosedLoop(users) if users else OpenLoop(rate, max_in_flight=connections)
        return requests, RawHttp(self.url, timeout_s=self.timeout_s), pacing

    def run(self, *, users: int = 0, rate: float = 0.0, duration_s: float,
            connections: int = 64, max_requests: int | None = None) -> list[Record]:
        """Run in this thread until done; returns the records.

        Args:
            users: Closed loop with this many users (each sends after its last answer).
            rate: Open loop at this many requests/s (used when ``users`` is 0).
            duration_s: How long to send.
            connections: Open loop: keep-alive connections (the most requests in flight).
            max_requests: Stop after sending this many.
        """
        requests, sender, pacing = self._load(users, rate, connections)
        run_loop(run_async(requests, sender, pacing, duration_s=duration_s,
                           max_requests=max_requests, records=self.records), sender)
        return self.records

    def start(self, *, users: int = 0, rate: float = 0.0, duration_s: float,
              connections: int = 64, max_requests: int | None = None) -> HttpLoad:
        """``run`` in a background thread; ``join`` waits for it."""
        self._background = Background(*self._load(users, rate, connections),
                                      records=self.records, duration_s=duration_s,
                                      max_requests=max_requests).start()
        return self

    def join(self, timeout_s: float | None = None) -> list[Record]:
        """Stop sending (requests in flight finish or time out) and return the records.

        Args:
            timeout_s: How long to wait for the thread; None waits for the planned duration.
        """
        if self._background is not None:
            self._background.join(timeout_s)
        return self.records


def roles(server_pid: int, client_pid: int) -> dict[str, list[int]]:
    """The processes of a load run by role: tritonserver, each model's stubs, the client."""
    found: dict[str, list[int]] = {"tritonserver": [server_pid], "load generator": [client_pid]}
    for instance, pid in process.stub_processes(server_pid).items():
        found.setdefault(f"stub {instance}", []).append(pid)
    return found
