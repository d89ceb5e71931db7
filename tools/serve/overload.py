"""Overload against a P99 objective: capacity in a closed loop, then open loops at multiples of it.

One way to measure for ``benchmarks/overload.py`` and the reliability tier's overload tests:
capacity is a ``tools.serve.faults.HttpLoad`` closed loop (raw keep-alive HTTP); each open loop
runs in C (``tools.load.native``, ``generator="c"``, the default) or on the same Python engine
(``generator="python"``). Every point is summarised by ``tools.stats`` (nearest-rank
percentiles over the measured window), with every refusal attributed to where it happened (the
message names it) and the CPU time of each process role over the point (the C loop's own from
``wait4``, under "load generator").
"""

from __future__ import annotations

import os
import socket
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tools import process
from tools.errors import UserInputError
from tools.load import native
from tools.load.scenario import load_scenario
from tools.serve import faults
from tools.stats import Window, summarize

# Where a refusal happened, by the words of its message (first match wins).
REFUSED_BY = (
    ("front", "is over its latency target"),  # the front's admission (tools/front)
    ("triton queue", "Exceeds maximum queue size"),  # a model's max_queue_size
    ("triton queue timeout", "Request timeout expired"),  # a model's queue timeout
    ("gate", "overloaded: "),  # a first step's queue gate (pipeline_ops/admission.py)
    ("client timeout", "client timeout"),
)
GOODPUT_TARGET = 0.85  # accepted throughput / capacity, at every multiple
P99_FACTOR = 1.5  # accepted P99 <= this x the P99 objective
# The open loops' load generators: C costs the shared cores little (tools/load/native.py).
GENERATORS = ("c", "python")


def refused_by(error: str) -> str:
    """Where a failed request was refused (``REFUSED_BY``), else ``other``."""
    return next((where for where, words in REFUSED_BY if words in error), "other")


@dataclass(frozen=True)
class OverloadPoint:
    """One load point.

    Attributes:
        label: ``capacity`` or the multiple (``4x``).
        offered_rps: The open loop's arrival rate (None for the closed loop).
        accepted_rps: Successful answers per second in the window.
        p50_ms: P50 of the successful requests (None: none succeeded).
        p99_ms: P99 of the successful requests.
        counted: Requests the window counts.
        refused: Failed requests by where they were refused (``refused_by``).
        cores: Cores used per process role over the point (1.0: one core busy throughout).
        load_average: The machine's 1-minute load average at the end of the point.
    """

    label: str
    offered_rps: float | None
    accepted_rps: float
    p50_ms: float | None
    p99_ms: float | None
    counted: int
    refused: Mapping[str, int] = field(default_factory=dict)
    cores: Mapping[str, float] = field(default_factory=dict)
    load_average: float = 0.0


def scenario_bodies(spec: Path, name: str, count: int | None = None,
                    max_length: int | None = None) -> list[bytes]:
    """The HTTP bodies of the spec's scenario for ``name`` (the first ``count``; ``max_length``:
    only those whose tensors are at most that long in their last dimension)."""
    requests = [r for r in load_scenario(spec, name).requests
                if max_length is None or all(a.shape[-1] <= max_length for a in r.inputs.values())]
    return [r.http_body() for r in requests[:count]]


def burst_heads(url: str, request: bytes, count: int, timeout_s: float = 30.0) -> list[bytes]:
    """The response heads of ``count`` copies of ``request`` sent at once, each on its own
    connection to ``url`` (``host:port``): a burst past a latency cap, to read its refusals."""
    host, _, port = url.rpartition(":")
    sockets = [socket.create_connection((host, int(port)), timeout=timeout_s)
               for _ in range(count)]
    heads = []
    try:
        for sock in sockets:
            sock.sendall(request)
        for sock in sockets:
            reply = b""
            while b"\r\n\r\n" not in reply:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                reply += chunk
            heads.append(reply.partition(b"\r\n\r\n")[0])
    finally:
        for sock in sockets:
            sock.close()
    return heads


def roles(server_pid: int, models: Sequence[str]) -> dict[str, list[int]]:
    """The processes of a load run by role: tritonserver, the stubs of each model, the front of
    this server (its runner and HAProxy), and this process (the load generator)."""
    from tools.front.process import fronts_of

    found: dict[str, list[int]] = {"tritonserver": [server_pid], "load generator": [os.getpid()]}
    by_length = sorted(models, key=len, reverse=True)
    for instance, pid in process.stub_processes(server_pid).items():
        model = next((m for m in by_length if instance.startswith(f"{m}_")), instance)
        found.setdefault(f"stubs {model}", []).append(pid)
    for front in fronts_of(server_pid):
        try:  # HAProxy's master and worker are its children
            children = [p.pid for p in psutil.Process(front).children(recursive=True)]
        except psutil.Error:
            children = []
        found.setdefault("front", []).extend([front, *children])
    return found


def run_point(url: str, model: str, bodies: Sequence[bytes], server_pid: int,
              models: Sequence[str], label: str, *, duration_s: float, warmup_s: float,
              users: int = 0, rate: float = 0.0, connections: int = 1024,
              timeout_s: float = 10.0, generator: str = "c") -> OverloadPoint:
    """Load ``model`` at ``url`` in a closed loop (``users``) or an open loop (``rate``, sent
    by ``generator``: one of ``GENERATORS``, over at most ``connections``). The open loop's
    connections must exceed what the guard admits plus what it holds refused: an encoder called
    directly at ~450 req/s and a 0.55 s mean latency holds ~250 in flight (Little's law), and with
    256 connections the excess waited in the client, unseen by the guard (P99 5 s)."""
    if generator not in GENERATORS:
        raise UserInputError(f"unknown load generator {generator!r}: one of {', '.join(GENERATORS)}")
    processes = roles(server_pid, models)
    before = {role: faults.sample(pids) for role, pids in processes.items()}
    load = faults.HttpLoad(url, model, list(bodies), timeout_s=timeout_s)
    child_cpu_s = 0.0
    start = began = time.monotonic()
    if users:
        records = load.run(users=users, duration_s=duration_s)
    elif generator == "c":
        host, _, _ = url.rpartition(":")
        sent = native.open_loop(url, [faults.infer_request(host, model, b) for b in bodies],
                                rate=rate, duration_s=duration_s, connections=connections,
                                timeout_s=timeout_s)
        records, child_cpu_s = sent.records, sent.cpu_s
        start = min((r.start_s for r in records), default=start)  # the C loop's t0
    else:
        records = load.run(rate=rate, duration_s=duration_s, connections=connections)
    seconds = time.monotonic() - began
    after = {role: faults.sample(pids) for role, pids in processes.items()}
    counted = Window(start + warmup_s, start + duration_s)
    summary = summarize(records, counted)
    refused = Counter(refused_by(r.error) for r in records if not r.ok and counted.counts(r))
    latency = summary.latency
    cores = faults.cpu_share(before, after, seconds)
    if child_cpu_s:
        cores["load generator"] = cores.get("load generator", 0.0) + child_cpu_s / seconds
    return OverloadPoint(
        label=label, offered_rps=rate or None,
        accepted_rps=summary.ok / max(summary.window.length_s, 1e-9),
        p50_ms=latency.p50_ms if latency else None, p99_ms=latency.p99_ms if latency else None,
        counted=summary.count, refused=dict(refused),
        cores=cores, load_average=os.getloadavg()[0])


@dataclass(frozen=True)
class OverloadRun:
    """Capacity, then each multiple of it, in one run."""

    capacity: OverloadPoint
    points: tuple[OverloadPoint, ...]

    def goodput(self, point: OverloadPoint) -> float:
        """``point``'s accepted throughput over the capacity."""
        return point.accepted_rps / max(self.capacity.accepted_rps, 1e-9)

    def misses(self, p99_objective_ms: float) -> list[str]:
        """Every target a point of this run missed, in words (none: the run passed)."""
        found = []
        for point in self.points:
            goodput = self.goodput(point)
            if goodput < GOODPUT_TARGET:
                found.append(f"{point.label}: goodput {goodput:.2f} < {GOODPUT_TARGET}")
            limit = P99_FACTOR * p99_objective_ms
            if point.p99_ms is None or point.p99_ms > limit:
                found.append(f"{point.label}: accepted P99 {point.p99_ms or 0:.0f} ms > "
                             f"{limit:.0f} ms ({P99_FACTOR} x the {p99_objective_ms:g} ms objective)")
        return found


def overload_run(public_url: str, capacity_url: str, model: str, bodies: Sequence[bytes],
                 server_pid: int, models: Sequence[str], factors: Sequence[float], *,
                 users: int = 32, duration_s: float = 12.0, warmup_s: float = 3.0,
                 pause_s: float = 2.0, generator: str = "c") -> OverloadRun:
    """Capacity with ``users`` closed-loop users at ``capacity_url``, then an open loop at each
    of ``factors`` times it at ``public_url``, sent by ``generator`` (``GENERATORS``).

    Capacity is measured on tritonserver's own port when a guard holds the public one: the
    guard's admission would refuse a closed loop past its cap, and each refused user would send
    again at once. The guard's own cost for accepted requests then counts against the goodput.
    """
    capacity = run_point(capacity_url, model, bodies, server_pid, models, "capacity",
                         users=users, duration_s=duration_s, warmup_s=warmup_s)
    points = []
    for factor in factors:
        time.sleep(pause_s)  # what the last point left queued drains
        points.append(run_point(public_url, model, bodies, server_pid, models, f"{factor:g}x",
                                rate=factor * capacity.accepted_rps, duration_s=duration_s,
                                warmup_s=warmup_s, generator=generator))
    return OverloadRun(capacity, tuple(points))
