"""The bench run: in-process limits, then the served sweep of every pipeline, in one process.

``run_bench`` measures each text pipeline's tokenizer + encoder in this process at several batch
sizes, then starts the embedded server (with the front where ``tools serve`` would put it) or
uses the given one, and sweeps every pipeline over each protocol at each concurrency,
ending each protocol with an open loop at half of its best served throughput.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.bench.api_cost import ApiCost
from tools.bench.inprocess import InProcessEncoder, LimitResult, measure as measure_limit
from tools.bench.served import measure
from tools.bench.targets import Target, resolve
from tools.errors import UserInputError
from tools.load import Cores, Point
from tools.load.point import pooled

Say = Callable[[str], None]
Roles = dict[str, list[int]]  # role -> pids of the processes a load run keeps busy
DIRECT = "http-direct"  # HTTP on tritonserver's own port, around the front
DIRECT_GRPC = "grpc-direct"  # gRPC on tritonserver's own port, around the front
# The labels measured around the front (--front-cost) -> the protocol they are sent with.
AROUND = {DIRECT: "http", DIRECT_GRPC: "grpc"}
TRITON_HTTP = "triton-http"  # tritonserver's own HTTP port (what the API gateway calls)
# The longest a tail point sending whole cycles of the requests may take (then it is cut short,
# and the tail line says its P99s are not over the same requests).
TAIL_BOUND_S = 600.0


@dataclass(frozen=True)
class BenchPlan:
    """What one bench run measures (the command's options, checked).

    Attributes:
        repository: The repository built from the spec (its configs and files give the
            in-process limit).
        spec_path: The spec: each pipeline's requests are its scenario (``tools.load.scenario``).
        data: Payloads instead of the shipped ones (``--data``), or None.
        pipelines: Pipelines or models to measure, in order; ``explicit`` when the user named
            them (an unknown one is then an error, not skipped).
        batch_sizes: In-process batch sizes.
        levels: Served concurrency sweep.
        protocols: ``grpc`` and/or ``http``.
        duration_s, warmup_s: Of each served point.
        min_seconds: In-process: at least this long per batch size.
        half_load: End each protocol's sweep with an open loop at half its best throughput.
        tail_cycles: The tail ratio's two points (c=1, half load) are measured in this many
            passes each, alternating (c=1, half load, half load, c=1, ...), each pass sending
            every distinct request once from the first (bounded by ``TAIL_BOUND_S``), and
            pooled; 0: one pass each, lasting ``duration_s``.
        output: Folder for the server log (and the report).
        url, grpc_url: A running server (both or neither); None: the embedded server.
        front: The embedded server's front: None as ``tools serve`` decides (on where haproxy
            is installed).
        front_cost: Also sweep each protocol on tritonserver's own port, around the front.
        api_cost: Also measure each pipeline the OpenAI/TEI routes serve through the API
            gateway and straight to Triton's HTTP (``tools.bench.api_cost``).
        api_rounds: Interleaved rounds of that comparison at each concurrency.
    """

    repository: Path
    spec_path: Path
    data: Path | None
    pipelines: tuple[str, ...]
    explicit: bool
    batch_sizes: tuple[int, ...]
    levels: tuple[int, ...]
    protocols: tuple[str, ...]
    duration_s: float
    warmup_s: float
    min_seconds: float
    half_load: bool
    output: Path
    tail_cycles: int = 1
    url: str | None = None
    grpc_url: str | None = None
    front: bool | None = None
    front_cost: bool = False
    api_cost: bool = False
    api_rounds: int = 3


@dataclass
class BenchRun:
    """Everything one bench run measured, in order.

    Attributes:
        plan: What was asked.
        targets: The pipelines measured.
        limits: In-process results of the text pipelines.
        served: Served points (closed loop, then the open loop at half load), per pipeline and
            protocol.
        limit_na: Pipeline -> why it has no in-process limit.
        conditions: How it was measured (server, front, load average, cores).
        notes: Pipelines left out and why.
        started: Start time (epoch seconds).
        api_costs: The API gateway's cost (``--api-cost``), per pipeline and concurrency.
    """

    plan: BenchPlan
    targets: list[Target]
    limits: list[LimitResult] = field(default_factory=list)
    served: list[Point] = field(default_factory=list)
    limit_na: dict[str, str] = field(default_factory=dict)
    conditions: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    started: float = 0.0
    api_costs: list[ApiCost] = field(default_factory=list)


@contextlib.contextmanager
def _server(plan: BenchPlan, say: Say,
            conditions: dict[str, Any]) -> Iterator[tuple[dict[str, str], Roles | None]]:
    """Protocol -> endpoint of the server measured (through the front if it has one), and the
    processes of the run by role, found once at the start (None for a server given by URL: not
    ours to watch)."""
    if plan.url and plan.grpc_url:
        conditions.update(server=f"given: http {plan.url}, grpc {plan.grpc_url}", front=None)
        yield {"grpc": plan.grpc_url, "http": plan.url, "stats": plan.url,
               TRITON_HTTP: plan.url}, None
        return
    from tools.front.plan import Limits
    from tools.front.process import find_haproxy
    from tools.serve.overload import roles
    from tools.serve.server import EmbeddedServer

    front = find_haproxy() is not None if plan.front is None else plan.front
    server = EmbeddedServer(plan.repository, log_path=plan.output / "tritonserver.log",
                            exit_timeout_s=10, front=Limits() if front else None)
    conditions.update(server="embedded", front=front)
    say(f"starting the embedded tritonserver on {plan.repository} "
        f"({'through the front' if front else 'no front'}) ...")
    server.start(timeout_s=300)
    try:
        say(f"tritonserver ready: http {server.http_url}, grpc {server.grpc_url}")
        found = {"grpc": server.grpc_url, "http": server.http_url, "stats": server.http_url,
                 TRITON_HTTP: server.triton_http_url}
        if plan.front_cost and front:
            found[DIRECT] = server.triton_http_url
            found[DIRECT_GRPC] = server.triton_grpc_url
        yield found, roles(server.pid, server.models)
    finally:
        server.stop()


def _limits(run: BenchRun, say: Say) -> None:
    plan = run.plan
    for target in run.targets:
        setup = target.setup
        if setup is None:
            run.limit_na[target.name] = target.limit_na
            continue
        say(f"in-process limit of {setup.pipeline} ({setup.encoder}, {setup.onnx_file}, "
            f"{setup.runtime}): {len(target.texts)} texts, one session with "
            f"{setup.limit_threads} intra-op threads (served: {setup.instances} x "
            f"{setup.intra_op_threads}), max_length {setup.max_length}")
        try:
            encoder = InProcessEncoder(setup)
        except UserInputError as exc:
            run.limit_na[target.name] = str(exc)
            say(f"  no in-process limit: {exc}")
            continue
        for size in plan.batch_sizes:
            for chunked in ([False, True] if (size > 1 and encoder.can_chunk) else [False]):
                result = measure_limit(encoder, target.texts, size, chunked=chunked,
                                       min_seconds=plan.min_seconds)
                run.limits.append(result)
                say(f"  {result.variant} b={size}: {result.throughput:.1f} texts/s")
        del encoder  # free the session's threads and memory before the next one and the server


def _point_line(point: Point) -> str:
    p99 = point.p99_ms if point.p99_ms is not None else float("nan")
    return (f"{point.throughput:.1f} req/s, P99 {p99:.1f} ms, errors {point.errors}"
            f"{' (' + point.first_error + ')' if point.first_error else ''}")


def _sweep(run: BenchRun, target: Target, endpoints: dict[str, str], say: Say,
           roles: Roles | None = None) -> None:
    plan = run.plan
    protocols = list(plan.protocols)
    for around, protocol in AROUND.items():
        if around in endpoints and protocol in protocols:
            protocols.insert(protocols.index(protocol) + 1, around)
    for label in protocols:
        sender = AROUND.get(label, label)
        endpoint = endpoints[label]
        timing = {"warmup_s": plan.warmup_s, "duration_s": plan.duration_s}
        # the tail ratio's points: every distinct request, the same number of times
        whole = ({"warmup_s": plan.warmup_s, "duration_s": TAIL_BOUND_S, "cycles": 1}
                 if plan.tail_cycles else timing)
        pair = plan.half_load and 1 in plan.levels  # c=1 and half load, interleaved below
        own: dict[int, Point] = {}
        for level in plan.levels:
            if pair and level == 1:
                continue
            own[level] = measure(target.requests, sender, endpoint, endpoints["stats"],
                                 concurrency=level, label=label, **timing)
            say(f"  served {target.name} {label} c={level}: {_point_line(own[level])}")
        if not plan.half_load:
            run.served.extend(own[level] for level in plan.levels)
            continue
        # The tail ratio divides one point's P99 by another's: measured minutes apart, a machine
        # that slows in between moves it. So they alternate, pass by pass (c=1, half load, then
        # half load, c=1, ...), each pass sending every request once, and are pooled.
        singles: list[Point] = []
        halves: list[Point] = []

        def cores() -> list[Cores]:
            """How busy the machine's cores were in each tail pass, by process role: queueing
            at half load depends on it, not on the load's fraction of the best throughput."""
            return [Cores(roles)] if roles else []

        def single() -> None:
            singles.append(measure(target.requests, sender, endpoint, endpoints["stats"],
                                   concurrency=1, label=label, meters=cores(), **whole))

        best = 0.0
        for round_ in range(max(plan.tail_cycles, 1)):
            c1_first = round_ % 2 == 0
            if pair and c1_first:
                single()
            if round_ == 0:  # half of the best throughput, c=1's first pass included
                best = max(p.throughput for p in [*own.values(), *singles])
            halves.append(measure(target.requests, sender, endpoint, endpoints["stats"],
                                  rate=max(best / 2, 1.0), label=label, meters=cores(),
                                  **whole))
            if pair and not c1_first:
                single()
        if singles:
            own[1] = pooled(singles)
            say(f"  served {target.name} {label} c=1: {_point_line(own[1])}"
                + (f" ({len(singles)} passes, alternating with the half-load ones: P99 "
                   f"{_p99s(singles)})" if len(singles) > 1 else ""))
        run.served.extend(own[level] for level in plan.levels)
        half = pooled(halves)
        run.served.append(half)
        say(f"  served {target.name} {label} {half.label} (half of {best:.1f}): "
            f"{_point_line(half)}" + (f" ({len(halves)} passes: P99 {_p99s(halves)})"
                                      if len(halves) > 1 else ""))


def _api_cost(run: BenchRun, triton_url: str, say: Say) -> list[ApiCost]:
    """The gateway in front of Triton's own HTTP port; each pipeline it serves through it and
    direct, rounds interleaved."""
    from tools.api.server import ApiServer
    from tools.bench import api_cost

    plan = run.plan
    gateway = ApiServer(triton_url, plan.repository, log_path=plan.output / "api.log")
    say(f"starting the API gateway in front of {triton_url} (log {gateway.log_path}) ...")
    with gateway:
        say(f"API gateway ready: http {gateway.url}; {plan.api_rounds} rounds per concurrency, "
            "direct and through it alternating")
        return api_cost.measure(run.targets, triton_url, gateway.url, levels=plan.levels,
                                rounds=plan.api_rounds, warmup_s=plan.warmup_s,
                                duration_s=plan.duration_s, say=say,
                                gateway_pid=gateway.pid)


def _p99s(passes: list[Point]) -> str:
    return " / ".join("-" if p.p99_ms is None else f"{p.p99_ms:.1f}" for p in passes) + " ms"


def run_bench(plan: BenchPlan, say: Say) -> BenchRun:
    """Measure the in-process limits, then serve and sweep every pipeline of ``plan``.

    Args:
        plan: What to measure.
        say: Progress lines (stderr in the command).

    Raises:
        UserInputError: the spec is invalid, a pipeline is unknown or not built, ``data`` does not
            fit one, or ``front_cost`` is asked without an embedded server with a front.
    """
    if plan.front_cost and (plan.url or plan.front is False):
        raise UserInputError("--front-cost measures around the front of the embedded server: "
                             "leave out --url/--grpc-url and --no-front")
    from tools.build_repo.spec import load_spec

    targets, notes = resolve(plan.repository, load_spec(plan.spec_path), plan.pipelines,
                             plan.data, explicit=plan.explicit)
    run = BenchRun(plan, targets, notes=notes, started=time.time())
    for note in notes:
        say(note)
    for target in targets:
        say(f"{target.name}: {len(target.requests)} distinct requests")
        for line in target.scenario.describe():
            say(f"  {line}")
    plan.output.mkdir(parents=True, exist_ok=True)
    _limits(run, say)
    run.conditions["load_average_start"] = round(os.getloadavg()[0], 2)
    with _server(plan, say, run.conditions) as (endpoints, roles):
        if plan.front_cost and not set(AROUND) & set(endpoints):
            raise UserInputError("--front-cost: the server has no front (haproxy is not "
                                 "installed); nothing to measure around")
        for target in targets:
            _sweep(run, target, endpoints, say, roles)
        if plan.api_cost:
            run.api_costs = _api_cost(run, endpoints[TRITON_HTTP], say)
    run.conditions["load_average_end"] = round(os.getloadavg()[0], 2)
    run.conditions["cpus"] = os.cpu_count()
    return run
