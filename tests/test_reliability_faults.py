"""The fault suite on the embedded server: overload, SIGTERM drain, hostile requests, memory growth.

In the spirit of Triton's L0_model_queue, L0_lifecycle and L0_memory_growth; every load is
bounded in time and requests, on loopback. What is asserted holds on any CPU (refusals, their
form, ratios within one run); the overload figures that depend on the machine are measured by
benchmarks/overload.py into docs/performance.md.
"""

from __future__ import annotations

import json
import select
import shutil
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from server_helpers import slow_bodies
from tools import paths, process
from tools.build_repo.admission import objectives
from tools.build_repo.spec import load_spec
from tools.front import admission
from tools.front.plan import Limits
from tools.serve import faults
from tools.serve.overload import burst_heads, overload_run, scenario_bodies
from tools.serve.server import EmbeddedServer
from tools.stats import Window, latency_summary, summarize
from waits import in_flight, wait_until

pytestmark = [pytest.mark.reliability, pytest.mark.server]

TOY = Path(__file__).parent / "fixtures" / "toy_repository"
# toy_slow's execution time per batch: capacity ~ 2 x 8 per 100 ms, ~160 req/s, so that 4x of it
# stays well within what the Python load generator sends on 2 shared cores (at 50 ms, 4x was
# ~1,150 req/s and one CI run measured 0.76)
DELAY_MS = 100.0
# what toy_slow (_SLOW: 2 instances, batches of 8) serves when both execute full batches back to
# back: a sleep, not CPU, so it does not move with the machine's load
SLOW_CAPACITY_RPS = 2 * 8 * 1000.0 / DELAY_MS
_SLOW = """name: "toy_slow"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
        { name: "DELAY_MS" data_type: TYPE_FP32 dims: [ 1 ] optional: true } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
dynamic_batching {
  max_queue_delay_microseconds: 1000
  default_queue_policy { max_queue_size: 16 default_timeout_microseconds: 500000
                         timeout_action: REJECT }
}
"""


def _double(delay_ms: float | None = None, values: int = 4) -> dict:
    inputs = [{"name": "INPUT0", "shape": [1, values], "datatype": "FP32",
               "data": list(range(values))}]
    if delay_ms is not None:
        inputs.append({"name": "DELAY_MS", "shape": [1, 1], "datatype": "FP32", "data": [delay_ms]})
    return {"inputs": inputs}


TEXT = {"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["a cat"]}]}


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """The toy repository plus ``toy_slow``: toy_double with a bounded queue (16, 500 ms)."""
    repo = tmp_path / "repo"
    shutil.copytree(TOY, repo, ignore=shutil.ignore_patterns("__pycache__", "README.md"))
    shutil.copytree(repo / "toy_double", repo / "toy_slow")
    (repo / "toy_slow" / "config.pbtxt").write_text(_SLOW)
    return repo


def _server_rss(server) -> int:
    pids = [server.pid, *server.control.stub_processes().values()]
    return faults.sample(pids).rss_bytes


def _post(url: str, body: bytes, timeout_s: float = 60.0) -> tuple[int, str]:
    """One HTTP request on its own connection: (status, error message).

    The body is sent only while no answer has come: a front that refuses on the head answers
    and closes with the body unread, and a client still writing then draws a reset that can
    discard the answer it had not read yet (curl stops sending on an early answer too).
    """
    host, _, port = url.rpartition(":")
    head, sep, payload = body.partition(b"\r\n\r\n")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(head + sep)
        view, sent, deadline = memoryview(payload), 0, time.monotonic() + timeout_s
        while sent < len(view) and time.monotonic() < deadline:
            readable, writable, _ = select.select([sock], [sock], [], 1.0)
            if readable:
                break  # answered before the body was read
            if writable:
                try:
                    sent += sock.send(view[sent:sent + 65536])
                except (BrokenPipeError, ConnectionResetError):
                    break  # refused before the body was read: the answer is waiting
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
        head, _, rest = reply.partition(b"\r\n\r\n")
        assert head, f"no answer after {sent} of {len(view)} body bytes"
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length")), 0)
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
    return int(head.split()[1]), rest.decode(errors="replace")


@pytest.mark.system  # goodput and P99 bars depend on the CPU; the front's refusals are below
def test_overload_keeps_its_goodput_and_rejects_fast_with_a_bounded_accepted_p99(
    server_factory, repository
):
    # Two instances: with one, Triton 2.51's batcher misses the wake-up of an instance that
    # finishes while the queue is full and leaves it idle for up to 500 ms (goodput 0.36-0.46
    # here; README, Reliability under faults); `tools build-repo` notes such configs.
    server = server_factory(repository)
    body = [_double(DELAY_MS)]
    closed = faults.HttpLoad(server.http_url, "toy_slow", body, timeout_s=5)
    start = time.monotonic()
    closed.run(users=16, duration_s=5)
    capacity = summarize(closed.records, Window(start + 1, start + 5))
    capacity_rps = capacity.ok / capacity.window.length_s

    offered = 4 * capacity_rps
    opened = faults.HttpLoad(server.http_url, "toy_slow", body, timeout_s=5)
    start = time.monotonic()
    opened.run(rate=offered, duration_s=6, connections=256)
    over = summarize(opened.records, Window(start + 1, start + 6))
    goodput_rps = over.ok / over.window.length_s
    rejected = [r.latency_ms for r in opened.records if not r.ok]

    # at capacity a shared 2-core machine may let a few requests pass the 500 ms queue timeout;
    # the closed loop (16 users, two batches of 8) keeps toy_slow at least half busy
    assert capacity.errors <= 0.05 * capacity.count, capacity
    assert capacity_rps > 0.5 * SLOW_CAPACITY_RPS, (capacity_rps, SLOW_CAPACITY_RPS)
    # two instances keep most of the capacity at 4x (the stall of one instance left 0.36-0.46);
    # how much depends on the CPU and on what else runs (the Python load generator shares the
    # cores): a machine busy with other work measured 0.47, so the bar only catches the loss of
    # most of it
    assert goodput_rps >= 0.4 * capacity_rps, (goodput_rps, capacity_rps)
    # queue policy: 16 queued (two batches of 8) + two executing, each batch 100 ms, 500 ms max
    assert over.latency.p99_ms <= 500 + 2 * DELAY_MS + 150, over.latency
    assert rejected and all("HTTP 503" in r.error for r in opened.records if not r.ok)
    assert latency_summary(rejected).p50_ms < 50, "a full queue answers at once"
    assert max(r.latency_ms for r in opened.records) < 5000, "no request reaches the client timeout"


def _failures_by_reason(server, model: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=10).read().decode()
    prefix = f'nv_inference_request_failure{{model="{model}",reason="'
    return {line[len(prefix):].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith(prefix)}


@pytest.fixture(scope="module")
def fronted_server(built_repository, tmp_path_factory):
    """The built repository served as ``tools serve`` serves it: the front before it."""
    server = EmbeddedServer(built_repository, exit_timeout_s=10, front=Limits(),
                            log_path=tmp_path_factory.mktemp("fronted") / "tritonserver.log")
    server.start(timeout_s=300)
    try:
        yield server
    finally:
        server.stop()


def _objective_s(name: str) -> float:
    """The P99 objective the build rendered for ``name`` (from the SLO file), in seconds."""
    return objectives(load_spec(paths.SPEC_FILE).for_target("cpu"), "cpu")[name] / 1000


def _bodies(scenario: str, count: int, max_length: int | None = None) -> list[bytes]:
    return scenario_bodies(paths.SPEC_FILE, scenario, count, max_length)


def _judge(server: EmbeddedServer, model: str, run, hold_s: float, objective_s: float) -> None:
    """What admission does on any CPU at 4x: the excess is refused by the front alone, each
    refusal well-formed and held about ``hold_s`` (not left to time out), every accepted request
    answered, and the model's cap brought down from the cold-start one by its objective. The
    figures (goodput, accepted P99 against the objective) depend on the CPU: the overload
    benchmark measures them (benchmarks/overload.py, docs/performance.md)."""
    over = run.points[0]
    refused = sum(over.refused.values())
    assert refused and set(over.refused) == {"front"}, over.refused
    assert over.accepted_rps > 0 and over.p99_ms is not None, over
    # the cap follows the objective: by Little's law at most the objective's worth of what the
    # model answers a second, and the controller moved it from the cold-start cap
    caps = {b: c.requests for b, c in server.front.runtime().caps().items()}
    most = objective_s * max(run.capacity.accepted_rps, over.accepted_rps)
    assert admission.MIN_IN_FLIGHT <= caps[f"h_{model}"] <= max(1.5 * most, 2 * admission.MIN_IN_FLIGHT), \
        (caps[f"h_{model}"], most)
    assert caps[f"h_{model}"] != admission.INITIAL_IN_FLIGHT, caps
    print(f"{model}: capacity {run.capacity.accepted_rps:.1f} req/s; 4x: {over.accepted_rps:.1f} "
          f"req/s (goodput {run.goodput(over):.2f}), P99 {over.p99_ms:.0f} ms, refused "
          f"{over.refused}, cap {caps[f'h_{model}']}, hold {hold_s:g} s")


def test_text_overload_is_refused_by_the_front_before_any_stub_sees_it(fronted_server):
    server = fronted_server
    encoder_before = _failures_by_reason(server, "minilm_encoder")
    run = overload_run(server.http_url, server.triton_http_url, "text_embedding",
                       _bodies("text_embedding", 200), server.pid, server.models, [4.0],
                       users=32, duration_s=9, warmup_s=3)
    encoder_failures = {k: v - encoder_before.get(k, 0)
                        for k, v in _failures_by_reason(server, "minilm_encoder").items()}
    # capacity: a closed loop on tritonserver's own port (the first step's gate may refuse a
    # stray request of it on a slow machine)
    assert sum(run.capacity.refused.values()) <= 0.01 * run.capacity.counted, run.capacity
    _judge(server, "text_embedding", run, Limits().refusal_hold_s, _objective_s("text_embedding"))
    assert not any(encoder_failures.values()), encoder_failures


def test_a_direct_call_to_the_encoder_is_bounded_by_the_front_refused_with_retry_after(
    fronted_server,
):
    # minilm_encoder has no queue policy (so Triton prefetches its batches): without the front's
    # cap, requests sent straight to it queue without bound
    server = fronted_server
    bodies = _bodies("minilm_encoder", 100, max_length=64)  # as long as the shipped texts' tokens
    run = overload_run(server.http_url, server.triton_http_url, "minilm_encoder", bodies,
                       server.pid, server.models, [4.0], users=16, duration_s=9, warmup_s=3)
    _judge(server, "minilm_encoder", run, Limits().refusal_hold_s, _objective_s("minilm_encoder"))
    # a burst past the cap gets the hint with each refusal, after the hold
    cap = server.front.runtime().caps()["h_minilm_encoder"].requests
    started = time.monotonic()
    heads = burst_heads(server.http_url, faults.infer_request(server.http_url, "minilm_encoder",
                                                              bodies[0]), cap + 64)
    refusals = [h for h in heads if h.startswith(b"HTTP/1.1 503")]
    assert refusals and all(b"\r\nretry-after: 1" in h.lower() for h in refusals), heads[:3]
    assert time.monotonic() - started >= Limits().refusal_hold_s


EXIT_TIMEOUT_S = 20


def test_sigterm_drains_every_in_flight_request_of_keep_alive_clients(
    server_factory, repository, toy_started
):
    # through the front, as tools serve runs it: the front stops listening and lets every
    # request it holds be answered, then tritonserver unloads the models (up to 3 s on a busy
    # machine): the exit timeout leaves room above that
    server = server_factory(repository, exit_timeout_s=EXIT_TIMEOUT_S, front=Limits())
    regions = process.stub_shm_regions(server.pid)
    pid = server.pid
    load = faults.HttpLoad(server.http_url, "toy_double", [_double(1000.0)], timeout_s=15)
    load.start(users=8, duration_s=4)  # keeps sending while the server drains: not longer
    wait_until(lambda: in_flight(server.metrics_url, "toy_double", toy_started) >= 8, 3.5,
               "every user to hold a request in flight (queued or executing in toy_double)")

    stopping_at = time.monotonic()
    server.stop()
    stopped_after = time.monotonic() - stopping_at
    records = load.join(timeout_s=0)

    sent_before_stop = [r for r in records if r.start_s < stopping_at]
    assert len(sent_before_stop) >= 8
    assert [r.error for r in sent_before_stop if not r.ok] == []
    assert stopped_after < EXIT_TIMEOUT_S - 1, "drained before the exit timeout forced it"
    assert not process.is_alive(pid) and process.group_members(pid) == []
    assert [n for n in regions if (Path("/dev/shm") / n).exists()] == []


def test_hostile_bodies_and_shapes_get_client_errors_while_others_are_served(
    server_factory, repository
):
    server = server_factory(repository, front=Limits())
    load = faults.HttpLoad(server.http_url, "toy_double", [_double()], timeout_s=10)
    load.start(users=2, duration_s=60)

    def text_of(size: int) -> bytes:  # a text of ``size`` bytes under a shape of two elements
        return faults.infer_request(server.http_url, "toy_text", json.dumps(
            {"inputs": [{"name": "TEXT", "shape": [1, 2], "datatype": "BYTES",
                         "data": ["x" * size]}]}).encode())

    # 48 MiB: over the front's 16 MiB, refused unread; 12 MiB: read by Triton 2.51, then refused
    huge, big = text_of(48 << 20), text_of(12 << 20)
    # [1, 2**40] and [2**31, 2**31] abort Triton 2.51 (std::bad_alloc while sizing the JSON data):
    # the front refuses a shape with more elements than its body has bytes
    shapes = [[-1, 4], [1, -4], [0, 4], [2 ** 62, 4], [1, 2 ** 40], [2 ** 31, 2 ** 31]]
    absurd = [faults.infer_request(server.http_url, "toy_double", {"inputs": [
        {"name": "INPUT0", "shape": shape, "datatype": "FP32", "data": [1, 2, 3, 4]}]})
        for shape in shapes]
    baseline = _server_rss(server)
    try:
        peaks, statuses = [], []
        for request, rounds in ((huge, 3), (big, 6)):
            for _round in range(rounds):
                results: list[tuple[int, str]] = []
                senders = [threading.Thread(target=lambda: results.append(
                    _post(server.http_url, request))) for _ in range(4)]
                for sender in senders:
                    sender.start()
                peak = baseline
                while any(s.is_alive() for s in senders):
                    peak = max(peak, _server_rss(server))
                    time.sleep(0.05)
                peaks.append(peak)
                statuses += [(request is huge, *result) for result in results]
        after = _server_rss(server)
        shape_replies = [_post(server.http_url, request, timeout_s=10) for request in absurd]
    finally:
        records = load.join(timeout_s=0)

    assert [s for is_huge, s, _ in statuses if is_huge] == [413] * 12
    assert [s for is_huge, s, _ in statuses if not is_huge] == [400] * 24, statuses[-1][2][:300]
    assert all("expected" in m for is_huge, _, m in statuses if not is_huge)
    # Triton answers a negative dim with 500 "Unable to parse 'shape'", a wrong size with 400;
    # the front the shapes no body can hold
    assert [s for s, _ in shape_replies] == [500, 500, 400, 400, 400, 400], shape_replies
    assert all("more than the request body" in m for _, m in shape_replies[3:])
    assert all('"error"' in m for _, m in shape_replies) and server.poll() is None
    # bounded: four bodies in flight cost at most ~4x their size; and nothing accumulates: 24
    # bodies of 12 MiB were read, four at a time, and what stays is what the allocator's pools
    # keep of a round of four (how much varies from run to run), under half of the 24 bodies
    assert max(peaks) - baseline < 4 * 4 * (12 << 20), (baseline, peaks)
    assert after - baseline < 12 * (12 << 20), (baseline, after)
    assert len(records) > 50 and [r.error for r in records if not r.ok] == []


def test_slow_clients_holding_connections_do_not_stop_others_being_served(
    server_factory, repository
):
    server = server_factory(repository, front=Limits())
    slow = slow_bodies(server.http_url, 64, 1_000_000)
    try:
        load = faults.HttpLoad(server.http_url, "toy_double", [_double()], timeout_s=5)
        start = time.monotonic()
        load.run(users=4, duration_s=3)
        served = summarize(load.records, Window(start, start + 3))
    finally:
        for sock in slow:
            sock.close()

    assert served.errors == 0 and served.ok > 100, served
    assert served.latency.p99_ms < 500, served.latency


def test_memory_of_server_and_stubs_stays_flat_over_thousands_of_requests(
    server_factory, repository
):
    server = server_factory(repository)
    bodies = [TEXT, {"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES",
                                 "data": ["word " * 500]}]}]

    def batch(requests: int) -> None:
        load = faults.HttpLoad(server.http_url, "toy_text", bodies, timeout_s=10)
        load.run(users=4, duration_s=30, max_requests=requests)
        assert len(load.records) == requests and all(r.ok for r in load.records)

    batch(1500)  # warm up: allocator pools, shm regions grown to their working size
    warm = _server_rss(server)
    batch(3000)
    grown = _server_rss(server) - warm

    assert grown < 8 << 20, f"server + stubs grew {grown / 2**20:.1f} MiB over 3000 requests"
