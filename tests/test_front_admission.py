"""SLO admission (``tools.front.admission``) and its controller (``tools.front.controller``), on a
clock of the tests' own.

The cap of a model's requests in flight (Little's law: mean latency target x throughput), the
target following the measured P99, the cap turned into requests of the mean size offered, and
the controller that reads the front's log lines and writes the caps that changed to HAProxy's
runtime API. The front with a real HAProxy and tritonserver behind it:
tests/test_front_serving.py.
"""

from __future__ import annotations

import math
import socket
import threading

import pytest

from tools.front import admission, controller
from tools.front.admission import LatencyLimit
from tools.front.controller import AdmissionController, parse_line


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def _serve(limit: LatencyLimit, clock: FakeClock, *, seconds: float, rate: float,
           latency_s: float, ok: bool = True, cost: float = 1.0) -> None:
    """Offer ``rate`` requests/s for ``seconds``, each answered after ``latency_s``."""
    for _ in range(round(seconds * rate)):
        clock.now += 1 / rate
        limit.offer(cost)
        limit.observe(clock.now, latency_s, ok, cost)


def test_until_completions_have_been_counted_for_a_while_the_cap_is_the_initial_one():
    clock = FakeClock()
    limit = LatencyLimit(0.6, clock)
    assert limit.cap_requests() == admission.INITIAL_IN_FLIGHT, "a cold burst is bounded"
    limit.offer()
    limit.observe(clock.now, 0.1, True)
    clock.now += admission.RATE_TAU_S / 2
    assert not limit.measured and limit.cap_requests() == admission.INITIAL_IN_FLIGHT
    clock.now += admission.RATE_TAU_S
    assert limit.cap_requests() >= admission.MIN_IN_FLIGHT and limit.measured


def test_the_cap_is_the_mean_latency_target_times_the_measured_throughput():
    clock = FakeClock()
    limit = LatencyLimit(0.6, clock)
    _serve(limit, clock, seconds=3, rate=100, latency_s=0.3)
    assert limit.rate == pytest.approx(100, rel=0.05)
    assert limit.congested
    assert limit.cap() == pytest.approx(limit.target_s * 100, rel=0.05)
    assert limit.cap_requests() == pytest.approx(limit.target_s * 100, abs=2)


def test_the_target_follows_the_measured_p99_within_its_bounds():
    clock = FakeClock()
    slow, fast = LatencyLimit(0.6, clock), LatencyLimit(0.6, clock)
    start = slow.target_s
    _serve(slow, clock, seconds=5, rate=100, latency_s=0.9)  # P99 1.5x the objective
    assert slow.target_s < start
    assert slow.target_s >= admission.MIN_SHARE * 0.6
    _serve(fast, clock, seconds=5, rate=100, latency_s=0.1)
    assert fast.target_s > start and fast.target_s <= 0.6, "grows, up to the objective"
    for _ in range(20):
        _serve(slow, clock, seconds=2, rate=100, latency_s=5.0)
    assert slow.target_s == pytest.approx(admission.MIN_SHARE * 0.6)


def test_the_cap_keeps_the_best_recent_rate_and_a_slow_model_lowers_it_by_its_target():
    clock = FakeClock()
    limit = LatencyLimit(0.6, clock)
    _serve(limit, clock, seconds=3, rate=200, latency_s=0.1)
    _serve(limit, clock, seconds=3, rate=20, latency_s=0.1)  # quiet again, fast answers
    assert limit.rate == pytest.approx(20, rel=0.1)
    assert limit.cap() > limit.target_s * 150, "room for a burst back to the rate it had"
    # Slow now: the cap comes down through the latency target, not through the rate it got.
    # Capping at target x current rate spirals: fewer in flight, fewer answers per second, a
    # lower cap (a closed loop of 32 users at 1.07x the cap got 0.4 of capacity).
    cap_fast, target_fast = limit.cap(), limit.target_s
    _serve(limit, clock, seconds=3, rate=20, latency_s=2.0)
    assert limit.peak > 100, "the best recent rate is remembered (it decays over PEAK_TAU_S)"
    assert limit.target_s < target_fast and limit.cap() < cap_fast
    _serve(limit, clock, seconds=4 * admission.PEAK_TAU_S, rate=20, latency_s=0.1)
    assert limit.peak == pytest.approx(20, rel=0.2), "a rate that lasts is what remains"


def test_work_is_weighed_by_size_so_a_mix_of_long_requests_gets_fewer_of_them_in_flight():
    # bytes per second is the throughput: the cap holds the same work in flight (and so about
    # the same queueing time) whether the requests are long or short
    clock = FakeClock()
    short = LatencyLimit(0.6, clock)
    _serve(short, clock, seconds=3, rate=100, latency_s=0.5, cost=10.0)
    assert short.rate == pytest.approx(1000, rel=0.05), "cost per second, not requests"
    assert short.mean_cost == pytest.approx(10.0) and short.congested
    cap_short = short.cap_requests()
    assert cap_short == pytest.approx(short.target_s * 100, abs=2)
    for _ in range(200):  # the mix turns to requests seven times the size
        short.offer(70.0)
    assert short.mean_cost > 60
    assert short.cap_requests() == pytest.approx(cap_short * 10 / short.mean_cost, abs=2)
    assert short.cap_requests() >= admission.MIN_IN_FLIGHT, "never under the floor"


def test_errors_say_nothing_of_throughput():
    clock = FakeClock()
    limit = LatencyLimit(0.6, clock)
    _serve(limit, clock, seconds=3, rate=100, latency_s=0.3)
    before = limit.rate
    _serve(limit, clock, seconds=2, rate=100, latency_s=0.001, ok=False)
    assert limit.rate < before / 2
    assert limit.cap_requests() >= admission.MIN_IN_FLIGHT


def test_a_light_load_is_not_capped_at_its_own_rate_and_a_queueing_one_is():
    # image_classification at 11 req/s answering in ~60 ms: target x rate is about 2, so bursts
    # of 5 would be refused at half the capacity
    clock = FakeClock()
    light = LatencyLimit(0.25, clock)
    _serve(light, clock, seconds=5, rate=11, latency_s=0.06)
    assert not light.congested
    assert light.target_s * light.rate < admission.MIN_IN_FLIGHT
    assert light.cap_requests() == admission.INITIAL_IN_FLIGHT, "bursts up to the cold-start cap"
    queueing = LatencyLimit(0.25, clock)
    _serve(queueing, clock, seconds=5, rate=100, latency_s=0.2)  # at the target: queueing
    assert queueing.congested
    assert queueing.cap_requests() == pytest.approx(queueing.target_s * queueing.rate, abs=2)


def test_a_p99_over_the_objective_without_queueing_does_not_lower_the_target():
    clock = FakeClock()
    limit = LatencyLimit(0.25, clock)
    start = limit.target_s
    for _ in range(10):  # a mean of 62 ms, one request in 20 taking 300 ms: slow work, no queue
        _serve(limit, clock, seconds=0.95, rate=20, latency_s=0.05)
        _serve(limit, clock, seconds=0.05, rate=20, latency_s=0.3)
    assert not limit.congested and limit.target_s >= start


# ---------------------------------------------------------------- the controller


def test_a_log_line_is_read_as_the_front_writes_it():
    served = parse_line("h_text_embedding triton 200 35 1234 ----")
    assert served == controller.Completion("h_text_embedding", True, True, 0.035, 1234)
    refused = parse_line("h_text_embedding triton 503 201 410 PT--")
    assert refused.served and not refused.ok  # a tarpit: the server is named, the status says
    by_lua = parse_line("g_text_embedding <lua.grpc_overloaded> 200 200 90 LR--")
    assert by_lua.ok and not by_lua.served, "the front answered it itself"
    assert parse_line("garbage") is None and parse_line("h_x triton two 1 1 --") is None


class RecordingRuntime:
    """HAProxy's runtime API as the controller sees it: what it was told to set."""

    def __init__(self, fail: bool = False) -> None:
        self.sets: list[dict[str, controller.Cap]] = []
        self.fail = fail

    def set_caps(self, caps: dict[str, controller.Cap]) -> str:
        if self.fail:
            raise ConnectionRefusedError("no HAProxy")
        self.sets.append(dict(caps))
        return ""


def _controller(objectives: dict[str, float | None], clock: FakeClock,
                runtime: RecordingRuntime | None = None) -> AdmissionController:
    reads: list[str] = []

    def objective(model: str) -> float | None:
        reads.append(model)
        return objectives[model]

    made = AdmissionController(runtime or RecordingRuntime(), objective, clock)
    made.reads = reads  # type: ignore[attr-defined]
    return made


def _known(made: AdmissionController, *models: str) -> None:
    """Wait for the objective reads the first lines started (threads of their own)."""
    for line in (f"h_{m} triton 200 10 100 ----" for m in models):
        made.feed(line)
    for thread in threading.enumerate():
        if thread.name.startswith("front-objective-"):
            thread.join(2)


def test_the_controller_caps_each_model_by_its_own_objective_and_leaves_one_without_alone():
    clock = FakeClock()
    runtime = RecordingRuntime()
    made = _controller({"fast": 100.0, "plain": None}, clock, runtime)
    _known(made, "fast", "plain")
    for _ in range(300):  # one request every 10 ms, each answered after 50 ms: 100/s
        clock.now += 0.01
        made.feed("h_fast triton 200 50 400 ----")
        made.feed("h_plain triton 200 50 400 ----")
        made.feed("h_triton triton 200 50 400 ----")  # models without objective share it
    written = made.tick()
    limit = made.limits["h_fast"]
    assert set(made.limits) == {"h_fast"}, "no objective: no cap"
    assert limit.rate == pytest.approx(100 * 400, rel=0.1), "bytes per second"
    floor = admission.MIN_IN_FLIGHT
    assert written == {"h_fast": controller.Cap(math.ceil(limit.cap()), floor, limit.cap_requests())}
    assert runtime.sets == [written]
    absolute, floor_requests = limit.cap_terms()
    assert written["h_fast"].bytes == math.ceil(max(absolute, floor_requests * 400)), \
        "target x bytes per second, or that many requests of the mean size (400 bytes)"
    assert made.tick() == {}, "a cap written is not written again until it changes"
    clock.now += controller.RESEND_S
    assert set(made.tick()) == {"h_fast"}, "every cap again after RESEND_S (a reloaded HAProxy)"


def test_http_and_grpc_of_one_model_are_capped_apart_and_refusals_count_as_offered_only():
    clock = FakeClock()
    made = _controller({"m": 300.0}, clock)
    _known(made, "m")
    made.feed("g_m triton 200 10 100 ----")
    for _ in range(200):
        clock.now += 0.01
        made.feed("h_m triton 200 250 1000 ----")
        made.feed("g_m triton 200 20 100 ----")
    assert set(made.limits) == {"h_m", "g_m"}
    before = made.limits["g_m"].rate
    for _ in range(100):
        made.feed("g_m <lua.grpc_overloaded> 200 200 5000 LR--")
    assert made.limits["g_m"].rate == before, "a refusal is no completion"
    assert made.limits["g_m"].mean_cost > 1000, "but it was offered: it moves the mean size"


def test_an_objective_is_read_again_after_its_ttl_and_a_runtime_api_down_is_retried():
    clock = FakeClock()
    runtime = RecordingRuntime(fail=True)
    made = _controller({"m": 300.0}, clock, runtime)
    _known(made, "m")
    assert made.reads == ["m"]
    clock.now += controller.CONFIG_TTL_S + 1
    _known(made, "m")
    assert made.reads == ["m", "m"], "read again (a reload may change it)"
    assert made.tick() == {}, "not reachable: nothing recorded as written"
    runtime.fail = False
    cold = admission.INITIAL_IN_FLIGHT
    assert made.tick() == {"h_m": controller.Cap(cold * 100, admission.MIN_IN_FLIGHT, cold)}, \
        "before a measure: 32 requests of the mean size"


def test_the_controller_serves_log_datagrams_and_stops_when_told(tmp_path):
    runtime = RecordingRuntime()
    made = AdmissionController(runtime, lambda model: 300.0)
    sock = controller.log_socket(str(tmp_path / "log.sock"))
    stop = threading.Event()
    thread = threading.Thread(target=made.serve, args=(sock, stop), daemon=True)
    thread.start()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        for _ in range(50):
            sender.sendto(b"h_m triton 200 20 100 ----", str(tmp_path / "log.sock"))
    for _ in range(100):
        if runtime.sets:
            break
        threading.Event().wait(0.05)
    stop.set()
    thread.join(2)
    sock.close()
    assert not thread.is_alive()
    cold = admission.INITIAL_IN_FLIGHT
    assert runtime.sets and runtime.sets[0] == {
        "h_m": controller.Cap(cold * 100, admission.MIN_IN_FLIGHT, cold)}
