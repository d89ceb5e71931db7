"""SLO admission: per model, work in flight <= latency target x throughput.

Little's law: the work a model holds (queued, batched, executing, on their way back) is its
throughput times its latency. The front counts the bytes in flight to each model (``front.lua``),
and the controller (``tools.front.controller``) learns from every answered request, weighed by
its size in bytes (a text of 256 tokens is about ten times the work of one of 20, and its body
about ten times the bytes), how many bytes' worth the model answers per second, so it keeps each
model's latency at its target by capping the bytes in flight at ``target x throughput``: a
request over the cap is refused (HTTP 503 with ``Retry-After``, gRPC ``UNAVAILABLE`` with retry pushback) before
tritonserver parses it. The target comes from the model's P99 objective in the SLO file,
rendered into its config as the parameter ``admission_p99_ms``: an ensemble and each model called
directly have their own cap, so a direct call to an encoder is bounded like the pipeline in
front of it.

Little's law holds per class of requests sharing a queue, so HTTP and gRPC, each capped on its
own backend, still keep the latency of both at the target. Before a model has measured its
throughput the cap is ``INITIAL_IN_FLIGHT`` requests (a cold burst at 4x would otherwise queue
seconds of work at a model without a queue policy, and the target would then chase those
latencies down).

Standard library only: it runs in the supervisor of the serving images too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

# The mean latency the cap starts at, as a share of the P99 objective: at the cap the queue is
# held full, so latencies spread little around the mean. From there the measured P99 moves it.
TARGET_SHARE = 0.75
MIN_SHARE = 0.1  # the mean target never goes below this share of the P99 objective
TICK_S = 0.1  # completions are counted per tick
RATE_TAU_S = 0.5  # time constant of the throughput average; also how long it is measured first
PEAK_TAU_S = 30.0  # how long the best throughput seen is remembered (a decaying maximum)
ADAPT_S = 1.0  # at most this often the mean target is corrected from the measured P99 ...
ADAPT_SAMPLES = 50  # ... of at least this many successes since the last correction
MIN_IN_FLIGHT = 4  # the cap never goes below this (a model that answers slowly still gets some)
# A model whose mean latency is under this share of the target is not queueing: its completions/s
# are what arrives, not what it can answer, so target x rate would cap a light load's bursts (at
# 11 req/s and a 190 ms target: 2 in flight). The cap is then at least INITIAL_IN_FLIGHT, and the
# measured P99 does not lower the target (what is slow then is the work, not the queue).
UNCONGESTED_SHARE = 0.5
INITIAL_IN_FLIGHT = 32  # the cap until the throughput is measured (as a closed loop of 32 users)
COST_SHARE = 0.02  # weight of each offered request in the mean cost (about the last 50)


class LatencyLimit:
    """The cap on one model's work in flight: mean latency target × throughput.

    By Little's law the work in flight is throughput × latency, so capping it at
    ``target_s × rate`` keeps the mean latency at ``target_s``. Work is counted in cost units:
    each request weighs its ``cost`` (the controller passes its size in bytes; 1 counts requests), so a
    burst of long texts fills the cap sooner than one of short texts and the queue ahead of a
    request holds about the same time of work whatever the mix (counted in requests, 54 texts
    in flight of 3-256 tokens held ±15 % of work from one moment to the next). ``rate`` is the
    average of the cost completed per tick (time constant ``RATE_TAU_S``); the best rate of the
    last ``PEAK_TAU_S`` (a maximum decaying with that time constant) counts instead, so that a
    load that grows is not held to what it got so far, and a slow phase does not spiral: with
    the current rate alone, less in flight meant fewer answers a second and a lower cap again
    (a closed loop of 32 users at 1.07x the cap got 0.4 of capacity). A model that has slowed,
    or that other clients share, is capped lower through ``target_s``. ``target_s`` starts at
    ``TARGET_SHARE`` of the P99 objective and follows the measured P99 of the successes: every
    ``ADAPT_S`` (given ``ADAPT_SAMPLES``) it is multiplied by ``sqrt(objective / measured P99)``,
    within ``[MIN_SHARE, 1] × objective``. The floors are in requests of the mean cost
    (``mean_cost``, averaged over the requests offered): until completions have been counted
    for ``RATE_TAU_S`` the cap is ``INITIAL_IN_FLIGHT`` of them, never below ``MIN_IN_FLIGHT``
    (fewer requests than that in flight are always admitted, however large), and while the mean
    latency is under ``UNCONGESTED_SHARE`` of the target (nothing is queueing) at least
    ``INITIAL_IN_FLIGHT``, the target then only raised.

    Args:
        p99_s: The P99 objective.
        clock: Seconds, monotonic (``time.monotonic``; tests pass their own).
    """

    def __init__(self, p99_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.p99_s = p99_s
        self.target_s = p99_s * TARGET_SHARE
        self.clock = clock
        self.mean_cost: float | None = None  # of the requests offered, averaged
        self.rate: float | None = None  # cost completed per second, averaged; None until measured
        self.peak = 0.0  # the best recent ``rate`` while on target
        self.latency_s = 0.0  # mean latency of the successes, averaged
        self._first: float | None = None  # the first success
        self._tick_end = 0.0
        self._done = 0.0  # cost of the successes in the tick (before the rate: since the first)
        self._count = 0  # how many successes that is
        self._latency_sum = 0.0  # their latencies
        self._recent: list[float] = []  # success latencies since the last correction
        self._adapt_at = 0.0

    def _roll(self, now: float) -> None:
        """Close the ticks that ended before ``now``."""
        if self.rate is None:
            if self._first is None or now - self._first < RATE_TAU_S:
                return
            self.rate = self.peak = self._done / (now - self._first)
            self.latency_s = self._latency_sum / self._count
            self._done, self._count, self._latency_sum = 0.0, 0, 0.0
            self._tick_end, self._adapt_at = now + TICK_S, now + ADAPT_S
            return
        if now < self._tick_end:
            return
        ticks = 1 + int((now - self._tick_end) // TICK_S)
        keep = math.exp(-TICK_S / RATE_TAU_S)
        self.rate = keep * self.rate + (1 - keep) * self._done / TICK_S
        self.rate *= keep ** (ticks - 1)  # the ticks after it, without completions
        if self._count:
            self.latency_s = keep * self.latency_s + (1 - keep) * self._latency_sum / self._count
        self.peak = max(self.rate, self.peak * math.exp(-ticks * TICK_S / PEAK_TAU_S))
        self._done, self._count, self._latency_sum = 0.0, 0, 0.0
        self._tick_end += ticks * TICK_S
        if now >= self._adapt_at and len(self._recent) >= ADAPT_SAMPLES:
            self._adapt()
            self._adapt_at = now + ADAPT_S

    def _adapt(self) -> None:
        """Move ``target_s`` so that the P99 of the recent successes meets the objective."""
        ordered = sorted(self._recent)
        p99 = ordered[math.ceil(0.99 * len(ordered)) - 1]  # nearest rank, as tools.stats
        scale = math.sqrt(self.p99_s / max(p99, 1e-3))
        if scale < 1 and not self.congested:
            scale = 1.0
        self.target_s = min(self.p99_s, max(MIN_SHARE * self.p99_s, self.target_s * scale))
        self._recent.clear()

    @property
    def measured(self) -> bool:
        """Whether the throughput has been measured (before: the cap is ``INITIAL_IN_FLIGHT``)."""
        return self.rate is not None

    @property
    def congested(self) -> bool:
        """Whether requests queue: the mean latency is at least ``UNCONGESTED_SHARE`` of the
        target (at the cap it is the target, by Little's law)."""
        return self.latency_s >= UNCONGESTED_SHARE * self.target_s

    def cap(self, now: float | None = None) -> float:
        """The most work in flight at ``now`` (None: the clock's now), in cost units: a request
        is admitted while the work in flight stays within it, or while fewer than
        ``MIN_IN_FLIGHT`` requests are in flight."""
        absolute, floor = self.cap_terms(now)
        return max(floor * (self.mean_cost or 1.0), absolute)

    def cap_terms(self, now: float | None = None) -> tuple[float, int]:
        """The cap as ``(cost units, requests)`` at ``now`` (None: the clock's now): it is the
        larger of the first and that many requests of the mean cost."""
        self._roll(self.clock() if now is None else now)
        if self.rate is None:
            return 0.0, INITIAL_IN_FLIGHT
        return (self.target_s * max(self.rate, self.peak),
                MIN_IN_FLIGHT if self.congested else INITIAL_IN_FLIGHT)

    def offer(self, cost: float = 1.0) -> None:
        """One request of ``cost`` was offered to the model (admitted or not): it moves the
        mean cost, which turns the cap into requests (``cap_requests``)."""
        self.mean_cost = cost if self.mean_cost is None else \
            (1 - COST_SHARE) * self.mean_cost + COST_SHARE * cost

    def cap_requests(self, now: float | None = None) -> int:
        """The cap in requests of the mean size (what a reader compares with a count): the cap
        in cost units over the mean cost of the requests offered, at least the floor."""
        absolute, floor = self.cap_terms(now)
        if self.mean_cost is None or self.mean_cost <= 0:
            return floor
        return max(floor, math.ceil(absolute / self.mean_cost))

    def observe(self, now: float, latency: float, ok: bool, cost: float = 1.0) -> None:
        """Learn from one request of ``cost`` answered at ``now`` after ``latency`` seconds
        (``ok``: successfully): the controller reads each from the front's log."""
        self._roll(now)
        if not ok:  # an error says nothing of how fast the model answers
            return
        if self._first is None:
            self._first = now
        self._done += cost
        self._count += 1
        self._latency_sum += latency
        self._recent.append(latency)
        if len(self._recent) > 100 * ADAPT_SAMPLES:  # bounded between corrections
            del self._recent[:len(self._recent) // 2]

    @property
    def retry_after_s(self) -> float:
        """When a refused client may try again: by then what is in flight has been answered."""
        return self.target_s
