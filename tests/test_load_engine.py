"""The load engine (tools/load) against a real tritonserver on the toy repository: closed loops
keep exactly N in flight, open loops count latency from the scheduled send, failures are counted
apart, and the window rule decides what a point counts; on every sender.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from tools import stats
from tools.load import (Background, ClosedLoop, OpenLoop, Request, TritonStats, run,
                        sender_for, text_requests)
from tools.serve.server import EmbeddedServer

PROTOCOLS = ("grpc", "http", "raw-http")


def _url(server: EmbeddedServer, protocol: str) -> str:
    return server.grpc_url if protocol == "grpc" else server.http_url


def _double(delay_ms: float | None = None) -> Request:
    inputs = {"INPUT0": np.arange(4, dtype=np.float32)[None]}
    if delay_ms is not None:
        inputs["DELAY_MS"] = np.array([[delay_ms]], dtype=np.float32)
    return Request("toy_double", inputs, ("OUTPUT0",))


def _in_flight(records, at: float) -> int:
    return sum(1 for r in records if r.start_s <= at < stats.end_s(r))


@pytest.mark.server
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_closed_loop_keeps_exactly_n_requests_in_flight(toy_server, protocol):
    users = 4
    point = run([_double(100.0)], sender_for(protocol, _url(toy_server, protocol)),
                ClosedLoop(users), warmup_s=0.3, duration_s=2.0,
                meters=[TritonStats(toy_server.http_url, ["toy_double"])])

    window = point.summary.window
    instants = np.linspace(window.start_s + 0.2, window.end_s - 0.2, 200)
    seen = [_in_flight(point.records, float(t)) for t in instants]
    assert max(seen) == users, "never more than N in flight"
    assert sum(1 for n in seen if n == users) >= 0.9 * len(seen), seen
    # Triton's own view: it never had more than N to batch (whether the N arrive within its
    # 1 ms queue delay depends on the shared cores, so it may execute fewer at a time)
    batches = point.models["toy_double"].batch_executions
    assert batches and max(batches) <= users, batches
    assert point.errors == 0 and point.concurrency == users and point.offered_rps is None


@pytest.mark.server
@pytest.mark.parametrize("protocol", ("raw-http", "http"))
def test_an_open_loop_counts_latency_from_the_scheduled_send_when_the_server_falls_behind(
    toy_server, protocol
):
    rate, delay_ms = 20.0, 100.0  # one connection: at most ~10 answers/s against 20 sent/s
    point = run([_double(delay_ms)], sender_for(protocol, toy_server.http_url),
                OpenLoop(rate, max_in_flight=1), duration_s=1.5)

    records = sorted(point.records, key=lambda r: r.start_s)
    assert len(records) == 30  # scheduled at i / 20 s for i < 30, whatever came back
    first = records[0].start_s
    assert [round(r.start_s - first, 9) for r in records] == [round(i / rate, 9)
                                                              for i in range(30)]
    # served one after another, each at least delay_ms: request i is answered no earlier than
    # (i + 1) x 100 ms after the start, i.e. (i + 1) x 100 - i x 50 ms after its scheduled time
    for i, record in enumerate(records):
        assert record.ok, record
        assert record.latency_ms >= (i + 1) * delay_ms - i * 1000.0 / rate - 5.0, (i, record)
    # the point's P99 carries the wait for the connection, not only the 100 ms of service; the
    # backlog still in flight at the end of the window is left out and shown apart
    n = point.requests
    assert point.p99_ms >= n * delay_ms - (n - 1) * 1000.0 / rate - 5.0 >= 5 * delay_ms
    assert point.summary.after_window == 30 - n > 0
    assert point.offered_rps == rate and point.concurrency == 0


@pytest.mark.server
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_failed_requests_are_counted_apart_from_throughput_and_latency(toy_server, protocol):
    requests = text_requests("toy_text", ["", "a cat"], outputs=("EMBEDDING",))
    point = run(requests, sender_for(protocol, _url(toy_server, protocol)), ClosedLoop(1),
                duration_s=1.0)

    summary = point.summary
    assert point.requests > 10 and abs(point.errors - point.requests) <= 1  # every other fails
    assert "input 'TEXT': empty text" in point.first_error
    assert list(summary.error_kinds) == [point.first_error]
    assert point.throughput == pytest.approx(point.requests / point.seconds)
    assert summary.latency.count == point.requests  # failures left out of the percentiles
    assert point.error_ratio == pytest.approx(point.errors / (point.errors + point.requests))


@pytest.mark.server
def test_the_window_counts_requests_started_after_the_warmup_and_completed_by_its_end(toy_server):
    point = run([_double(300.0)], sender_for("grpc", toy_server.grpc_url), OpenLoop(20.0),
                warmup_s=1.0, duration_s=1.0)

    summary, window = point.summary, point.summary.window
    assert len(point.records) == 40  # 2 s at 20/s; nothing is sent at or after the end
    assert summary.before_window == 20  # scheduled at 0, 0.05, ..., 0.95 s: the warm-up
    counted = [r for r in point.records if window.counts(r)]
    assert summary.count == len(counted) == point.requests > 0
    # the last ones sent complete after the end (300 ms each): in flight, left out
    assert summary.after_window == 40 - 20 - len(counted) > 0
    assert window.length_s == pytest.approx(1.0)


@pytest.mark.server
def test_max_requests_ends_the_window_when_the_last_of_them_completes(toy_server):
    started = time.monotonic()
    point = run([_double()], sender_for("raw-http", toy_server.http_url), ClosedLoop(4),
                duration_s=30.0, max_requests=40)

    counted = [r for r in point.records if point.summary.window.counts(r)]
    assert len(point.records) == len(counted) == point.requests == 40
    assert point.seconds < 5 and time.monotonic() - started < 5


def test_from_first_measures_every_request_the_same_number_of_times_whatever_the_warmup_sent():
    """The tail ratio's two points (``tools bench --tail-cycles``) compare the same payloads."""
    from tools.load.state import Run

    run_ = Run(None, ["a", "b", "c"], warmup_s=60.0, duration_s=60.0, max_requests=6, stop=None,
               from_first=True)
    warmup = [run_.take(run_.start + 0.1 * i) for i in range(4)]  # a b c a: the warm-up's
    window = [run_.take(run_.window.start_s + i) for i in range(7)]
    assert warmup == ["a", "b", "c", "a"]
    assert window == ["a", "b", "c", "a", "b", "c", None]
    plain = Run(None, ["a", "b", "c"], warmup_s=60.0, duration_s=60.0, max_requests=3, stop=None)
    [plain.take(plain.start) for _ in range(4)]
    assert [plain.take(plain.window.start_s) for _ in range(3)] == ["b", "c", "a"]  # cycling on


@pytest.mark.server
def test_a_background_run_stops_when_joined_and_its_window_ends_there(toy_server):
    load = Background([_double(50.0)], sender_for("raw-http", toy_server.http_url),
                      ClosedLoop(2), duration_s=60.0).start()
    deadline = time.monotonic() + 10
    while len(load.records) < 10:  # the records fill while it runs
        assert time.monotonic() < deadline, "no request completed"
        time.sleep(0.05)
    point = load.join(timeout_s=0)

    assert point is not None and point.seconds < 10 and point.errors == 0
    assert len(point.records) >= 10 and point.records == tuple(load.records)


def test_a_request_is_read_only_and_renders_its_kserve_json():
    (request,) = text_requests("enc", ["héllo"], outputs=("EMBEDDING",))
    assert request.http_path == "/v2/models/enc/infer"
    assert request.http_body() == (b'{"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": '
                                   b'"BYTES", "data": ["h\\u00e9llo"]}], "outputs": [{"name": '
                                   b'"EMBEDDING"}]}')
    with pytest.raises(TypeError):
        request.inputs["OTHER"] = np.zeros(1)  # type: ignore[index]
    raw = Request.json("fastapi", {"text": "x"}, path="/embed")
    assert (raw.http_body(), raw.http_path) == (b'{"text": "x"}', "/embed")


@pytest.mark.parametrize("kwargs, message", [
    ({"model": "m"}, "give inputs or a raw body"),
    ({"model": "m", "inputs": {"X": [1, 2]}}, "input 'X' must be a numpy array"),
    ({"model": "m", "inputs": {"X": np.array([1 + 2j])}}, "no Triton datatype"),
])
def test_a_request_that_cannot_be_sent_is_refused_naming_the_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Request(**kwargs)


def test_binary_bytes_cannot_go_as_kserve_json_and_the_message_says_what_to_use():
    request = Request("img", {"IMAGE": np.array([[b"\xff\xd8\xff"]], dtype=np.object_)})
    with pytest.raises(ValueError, match="input 'IMAGE' holds bytes that are not UTF-8"):
        request.http_body()


def test_an_unknown_sender_names_the_known_ones():
    with pytest.raises(ValueError, match="known: grpc, http, raw-http"):
        sender_for("quic", "127.0.0.1:1")


@pytest.mark.server
def test_the_triton_meter_reads_the_window_after_the_warmup_for_every_model(toy_server):
    point = run([_double()], sender_for("grpc", toy_server.grpc_url), OpenLoop(20.0),
                warmup_s=1.0, duration_s=1.0, meters=[TritonStats(toy_server.http_url)])

    # 20 requests scheduled in the warm-up, 20 after: Triton's window holds only the latter
    assert abs(point.models["toy_double"].requests - 20) <= 2, point.models
    assert point.models["toy_double"].mean_batch >= 1.0
    assert point.to_dict()["meters"]["triton"]["toy_double"]["requests"] == \
        point.models["toy_double"].requests


@pytest.mark.server
def test_a_meter_that_fails_is_reported_and_the_load_goes_on(toy_server):
    point = run([_double()], sender_for("raw-http", toy_server.http_url), ClosedLoop(1),
                duration_s=0.5, meters=[TritonStats("127.0.0.1:1")])

    assert point.requests > 0 and point.errors == 0
    assert point.models == {} and "triton" in point.meter_errors


@pytest.mark.parametrize("kind, loop_module", [("raw-http", "uvloop"), ("http", "asyncio"),
                                               ("grpc", "asyncio")])
def test_the_raw_http_sender_runs_on_uvloop_and_the_tritonclient_senders_on_asyncio(
        kind, loop_module):
    pytest.importorskip("uvloop", reason="uvloop is a dependency on Linux; this platform has none")
    import asyncio

    from tools.load import run_loop

    async def loop_type() -> str:
        return type(asyncio.get_running_loop()).__module__

    sender = sender_for(kind, "127.0.0.1:1")
    assert run_loop(loop_type(), sender).split(".")[0] == loop_module


@pytest.mark.server
def test_a_load_keeps_older_objects_out_of_collections_until_the_last_load_beside_it_ends(
        toy_server):
    """``gc.freeze`` while loads run (a full collection over what ran before paused an open
    loop's sends); loads in threads beside each other thaw only when the last one ends."""
    import gc

    from tools.load import engine

    assert gc.get_freeze_count() == 0
    seen: list[int] = []

    class Watching(ClosedLoop):
        async def drive(self, run_state):
            seen.append(gc.get_freeze_count())
            await super().drive(run_state)

    with engine._older_objects_frozen():
        assert gc.get_freeze_count() > 0
        with engine._older_objects_frozen():  # a second load beside the first
            pass
        assert gc.get_freeze_count() > 0, "the first load is still running"
    assert gc.get_freeze_count() == 0
    point = run([_double()], sender_for("grpc", toy_server.grpc_url), Watching(1), duration_s=0.3)
    assert point.requests > 0 and seen and seen[0] > 0
    assert gc.get_freeze_count() == 0, "thawed after the load"
