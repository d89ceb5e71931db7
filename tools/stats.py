"""One way to measure: exact latency percentiles and the measured-window rule of every report.

The load-test gate, ``tools bench``, the server comparison and the GPU check all summarise here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

PERCENTILES = (50.0, 95.0, 99.0, 99.9)
METHOD = (
    "nearest-rank percentiles of the successful requests that started at or after the end of "
    "the warm-up and completed by the end of the measured window"
)


class Timed(Protocol):
    """What a summary needs of one request (``Record``, the gate's ``RequestRecord``, ...)."""

    @property
    def start_s(self) -> float: ...

    @property
    def latency_ms(self) -> float: ...

    @property
    def ok(self) -> bool: ...

    @property
    def error(self) -> str: ...


class Record(NamedTuple):
    """One request: when it started, how long it took and whether it succeeded.

    Attributes:
        start_s: Start (send) time in seconds, on the same clock as the window.
        latency_ms: Exact time from ``start_s`` to the complete response (or the failure), in ms.
        ok: True when the request succeeded.
        error: One-line error of a failed request, else empty.
    """

    start_s: float
    latency_ms: float
    ok: bool
    error: str = ""


def end_s(record: Timed) -> float:
    """When ``record`` completed, in seconds on the window's clock."""
    return record.start_s + record.latency_ms / 1000.0


@dataclass(frozen=True)
class Window:
    """The measured window ``[start_s, end_s]``: from the end of the warm-up to the stop.

    The rule, for every report: a request counts when it started at or after ``start_s`` and
    completed at or before ``end_s``. Requests started during the warm-up are left out even when
    they complete inside the window (they carry the cold start and would credit the window with
    work begun before it); requests still in flight at ``end_s`` are left out (the window did not
    see them finish), and are reported apart so a backlog at the stop stays visible.

    Attributes:
        start_s: End of the warm-up.
        end_s: End of the measured window (the stop); at most ``start_s`` gives an empty window.
    """

    start_s: float
    end_s: float

    @property
    def length_s(self) -> float:
        """Seconds measured (0 when the run stopped before the warm-up ended)."""
        return max(self.end_s - self.start_s, 0.0)

    def counts(self, record: Timed) -> bool:
        """True when ``record`` started in the window and completed by its end."""
        return record.start_s >= self.start_s and end_s(record) <= self.end_s


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile: the smallest observed value with at least ``pct``% at or below it.

    This is the one percentile method of the project (numpy's ``method="inverted_cdf"``). It was
    chosen over numpy's default linear interpolation because a latency target is a statement
    about requests that happened: "at least 99% of the requests completed within P99", and P99
    is the latency one of them actually had. Linear interpolation invents a value between two
    samples, which in a sparse tail (P99.9 of a few thousand requests) is a blend of the slowest
    requests that no request saw. On large samples the two differ by far less than run-to-run
    noise.

    Args:
        sorted_values: Ascending values (not empty).
        pct: Percentile in (0, 100].

    Returns:
        One of the observed values, never an interpolation.

    Raises:
        ValueError: ``sorted_values`` is empty or ``pct`` is out of range.
    """
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0.0 < pct <= 100.0:
        raise ValueError(f"percentile {pct} is outside (0, 100]")
    # round() guards against 0.99 * 1000 = 989.9999999 style float noise.
    rank = math.ceil(round(pct / 100.0 * len(sorted_values), 9))
    return float(sorted_values[max(rank, 1) - 1])


@dataclass(frozen=True)
class Latency:
    """Exact latency figures of a set of successful requests, in milliseconds."""

    count: int
    min_ms: float
    mean_ms: float
    max_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    p99_9_ms: float

    def percentiles(self) -> dict[float, float]:
        """``PERCENTILES`` -> value, e.g. ``{50.0: p50_ms, ..., 99.9: p99_9_ms}``."""
        return dict(zip(PERCENTILES, (self.p50_ms, self.p95_ms, self.p99_ms, self.p99_9_ms)))


def latency_summary(latencies_ms: Iterable[float]) -> Latency | None:
    """Min, mean, max and the ``PERCENTILES`` (nearest-rank) of ``latencies_ms``; None if empty.

    For timings that need no window (consecutive timed calls in one process); requests under load
    go through ``summarize``.
    """
    ordered = sorted(float(v) for v in latencies_ms)
    if not ordered:
        return None
    p50, p95, p99, p99_9 = (percentile(ordered, pct) for pct in PERCENTILES)
    return Latency(
        count=len(ordered),
        min_ms=ordered[0],
        mean_ms=sum(ordered) / len(ordered),
        max_ms=ordered[-1],
        p50_ms=p50,
        p95_ms=p95,
        p99_ms=p99,
        p99_9_ms=p99_9,
    )


@dataclass(frozen=True)
class Summary:
    """The requests a window counts, and what they show.

    Attributes:
        window: The measured window.
        count: Requests counted (successful and failed) under the window rule.
        ok: Counted requests that succeeded.
        errors: Counted requests that failed.
        before_window: Requests started before the window (the warm-up), left out.
        after_window: Requests started at or after the window start that had not completed by
            its end (in flight at the stop, or started after it), left out.
        latency: Figures of the ``ok`` requests (failed ones are left out: a fast error must
            not improve the tail); None when none succeeded.
        error_kinds: Error message -> count among the counted failures, most frequent first.
        first_error: The first counted failure's message (in record order), else empty.
        in_flight_ages_ms: For each request started inside the window that had not completed
            by its end, how long it had been waiting at the end (its latency is at least that).
        ok_latencies_ms: The exact latencies of the successful counted requests, ascending.
    """

    window: Window
    count: int
    ok: int
    errors: int
    before_window: int
    after_window: int
    latency: Latency | None
    error_kinds: Mapping[str, int] = field(default_factory=dict)
    first_error: str = ""
    in_flight_ages_ms: tuple[float, ...] = ()
    ok_latencies_ms: tuple[float, ...] = ()

    def point_figures(self) -> dict[str, object]:
        """The figures every load report prints for one point: requests (successful), errors,
        seconds, throughput, P50/P99 (None without a success) and the first error."""
        latency = self.latency
        return {"requests": self.ok, "errors": self.errors, "seconds": self.window.length_s,
                "throughput": self.throughput_rps,
                "p50_ms": latency.p50_ms if latency else None,
                "p99_ms": latency.p99_ms if latency else None,
                "first_error": self.first_error}

    def tail_lower_bound(self, pct: float) -> float | None:
        """A lower bound of the ``pct`` percentile over every request started in the window.

        The window rule leaves out requests still in flight at its end, so under overload the
        slowest requests would vanish from the percentiles. Each of them took at least its age
        at the end; counting it at that age gives a percentile the true one cannot be below.
        A gate compares this with its target too, so a backlog at the stop cannot hide.
        """
        values = sorted(self.ok_latencies_ms + self.in_flight_ages_ms)
        return percentile(values, pct) if values else None

    @property
    def error_ratio(self) -> float:
        """Failed over counted requests (0 when none was counted)."""
        return self.errors / self.count if self.count else 0.0

    @property
    def throughput_rps(self) -> float:
        """Successful counted requests per second of the window: what the server answered in it.

        Failures are left out so that a server that fails fast cannot look fast.
        """
        length = self.window.length_s
        return self.ok / length if length > 0 else 0.0


def summarize(records: Iterable[Timed], window: Window) -> Summary:
    """Apply the window rule (``Window``) to raw records and summarise the counted ones.

    Args:
        records: Raw records of one load (one server, protocol and scenario), any order; the
            order decides only ``first_error``.
        window: The measured window, on the records' clock.

    Returns:
        Counts, error ratio, throughput (successes per second of the window) and the exact
        latency figures of the successful counted requests.
    """
    ok_latencies: list[float] = []
    ages: list[float] = []
    kinds: dict[str, int] = {}
    first_error = ""
    before = after = failed = 0
    for record in records:
        if record.start_s < window.start_s:
            before += 1
        elif not window.counts(record):
            after += 1
            if record.start_s < window.end_s:
                ages.append((window.end_s - record.start_s) * 1000.0)
        elif record.ok:
            ok_latencies.append(record.latency_ms)
        else:
            failed += 1
            kinds[record.error] = kinds.get(record.error, 0) + 1
            first_error = first_error or record.error
    return Summary(
        window=window,
        count=len(ok_latencies) + failed,
        ok=len(ok_latencies),
        errors=failed,
        before_window=before,
        after_window=after,
        latency=latency_summary(ok_latencies),
        error_kinds=dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
        first_error=first_error,
        in_flight_ages_ms=tuple(sorted(ages)),
        ok_latencies_ms=tuple(sorted(ok_latencies)),
    )


def median(values: Iterable[float | None]) -> float | None:
    """The usual median (mean of the middle two for an even count) of known values; None if none.

    For one figure over repeated runs (req/s or P99 of each round), not for latencies of
    requests: those take ``percentile``.
    """
    known = sorted(v for v in values if v is not None)
    if not known:
        return None
    mid = len(known) // 2
    return known[mid] if len(known) % 2 else (known[mid - 1] + known[mid]) / 2
