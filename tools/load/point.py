"""The one result of a load run: a ``Point`` (what was sent, how, and what the window counted).

Its figures come from ``tools.stats`` (the window rule, nearest-rank percentiles); the raw
records and the summary ride along for callers that look closer (fault tests, gates).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tools import stats
from tools.load.triton_stats import merged_windows


@dataclass
class Point:
    """One load run at one pacing over one sender: throughput, latency, errors and meters.

    Figures follow ``tools.stats``: ``requests`` (successful) and ``errors`` are those that
    started at or after the warm-up and completed inside the measured window; ``throughput``
    is ``requests`` / ``seconds``; P50/P99 are nearest-rank percentiles of exact latencies.
    In an open loop a latency counts from the request's scheduled send time.

    Attributes:
        model: The model the requests went to (several: joined with ``,``).
        protocol: The wire protocol (``grpc``, ``http``; the raw HTTP sender's is ``http``),
            or the label the caller gave the run (``http-unguarded``).
        concurrency: Closed loop: requests kept in flight; 0 for an open loop.
        offered_rps: Open loop: the arrival rate (requests/s); None for a closed loop.
        requests: Successful counted requests.
        errors: Failed counted requests.
        seconds: Length of the measured window.
        throughput: ``requests`` / ``seconds``.
        p50_ms: P50 of the successful counted requests (None without one).
        p99_ms: P99 of the same.
        first_error: The first counted failure's one-line message, else empty.
        meters: Meter name -> what it measured over the window (``triton``: Triton's
            per-model window; ``cores``: CPU share per role; ...).
        meter_errors: Meter name -> why it measured nothing (its reading failed).
        summary: The window's full ``tools.stats.Summary`` (not serialised).
        records: Every request of the run, warm-up included (not serialised).
        passes: The passes ``pooled`` made this point of (empty for a single run); each one's
            requests, seconds, P50 and P99 are serialised with it.
    """

    model: str
    protocol: str
    concurrency: int
    offered_rps: float | None
    requests: int
    errors: int
    seconds: float
    throughput: float
    p50_ms: float | None
    p99_ms: float | None
    first_error: str = ""
    meters: dict[str, Any] = field(default_factory=dict)
    meter_errors: dict[str, str] = field(default_factory=dict)
    summary: stats.Summary | None = field(default=None, repr=False, compare=False)
    records: tuple[stats.Record, ...] = field(default=(), repr=False, compare=False)
    passes: tuple[Point, ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def from_records(cls, records: Sequence[stats.Timed], window: stats.Window, *, model: str,
                     protocol: str, concurrency: int = 0, offered_rps: float | None = None,
                     meters: Mapping[str, Any] | None = None,
                     meter_errors: Mapping[str, str] | None = None) -> Point:
        """Apply the window rule to raw ``records`` and keep the figures every report prints.

        Args:
            records: Every request of the run, warm-up included, on the window's clock.
            window: The measured window.
            model: What the requests went to.
            protocol: The sender's protocol.
            concurrency: Closed loop's in-flight count (0 for an open loop).
            offered_rps: Open loop's rate (None for a closed loop).
            meters: What the meters measured.
            meter_errors: Meters that measured nothing, and why.
        """
        summary = stats.summarize(records, window)
        return cls(model=model, protocol=protocol, concurrency=concurrency,
                   offered_rps=offered_rps, meters=dict(meters or {}),
                   meter_errors=dict(meter_errors or {}), summary=summary,
                   records=tuple(records), **summary.point_figures())

    @property
    def label(self) -> str:
        """``c=8`` for a closed-loop point, ``r=151`` for an open-loop one."""
        return f"r={self.offered_rps:.0f}" if self.offered_rps else f"c={self.concurrency}"

    @property
    def error_ratio(self) -> float:
        """Failed over counted requests (0 when none was counted)."""
        counted = self.requests + self.errors
        return self.errors / counted if counted else 0.0

    @property
    def models(self) -> Mapping[str, Any]:
        """Triton's per-model window (the ``triton`` meter), empty when not metered."""
        return self.meters.get("triton") or {}

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON (the summary and the raw records left out)."""
        return {
            "model": self.model, "protocol": self.protocol, "concurrency": self.concurrency,
            "offered_rps": self.offered_rps, "requests": self.requests, "errors": self.errors,
            "seconds": self.seconds, "throughput": self.throughput, "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms, "first_error": self.first_error,
            "error_ratio": self.error_ratio, "meters": _plain(self.meters),
            **({"meter_errors": dict(self.meter_errors)} if self.meter_errors else {}),
            **({"passes": [{"requests": p.requests, "seconds": p.seconds, "p50_ms": p.p50_ms,
                            "p99_ms": p.p99_ms} for p in self.passes]} if self.passes else {}),
        }


def pooled(points: Sequence[Point]) -> Point:
    """Passes of one point measured apart (interleaved with another's) as one point: their
    counted requests pooled, P50/P99 over every pass's latencies, the windows laid end to end
    (``seconds`` their sum, ``throughput`` the successes over it), Triton's per-model windows
    merged (``triton_stats.merged_windows``) and any other meter kept per pass, in order.

    Raises:
        ValueError: no points, or points of different models, protocols or pacings.
    """
    if not points:
        raise ValueError("pooled: no points")
    first = points[0]
    if len({(p.model, p.protocol, p.concurrency, p.offered_rps) for p in points}) != 1:
        raise ValueError("pooled: the passes of one point share model, protocol and pacing")
    if len(points) == 1:
        return first
    summaries = [p.summary for p in points]
    if any(s is None for s in summaries):
        raise ValueError("pooled: every pass needs its summary (Point.from_records)")
    ok = sorted(v for s in summaries for v in s.ok_latencies_ms)
    kinds: dict[str, int] = {}
    for s in summaries:
        for kind, count in s.error_kinds.items():
            kinds[kind] = kinds.get(kind, 0) + count
    seconds = sum(s.window.length_s for s in summaries)
    summary = stats.Summary(
        window=stats.Window(0.0, seconds), count=sum(s.count for s in summaries),
        ok=len(ok), errors=sum(s.errors for s in summaries),
        before_window=sum(s.before_window for s in summaries),
        after_window=sum(s.after_window for s in summaries),
        latency=stats.latency_summary(ok),
        error_kinds=dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
        first_error=next((s.first_error for s in summaries if s.first_error), ""),
        in_flight_ages_ms=tuple(sorted(a for s in summaries for a in s.in_flight_ages_ms)),
        ok_latencies_ms=tuple(ok))
    meters: dict[str, Any] = {}
    for name in dict.fromkeys(k for p in points for k in p.meters):
        values = [p.meters[name] for p in points if name in p.meters]
        meters[name] = merged_windows(values) if name == "triton" else values
    errors = {k: v for p in points for k, v in p.meter_errors.items()}
    return Point(model=first.model, protocol=first.protocol, concurrency=first.concurrency,
                 offered_rps=first.offered_rps, meters=meters, meter_errors=errors,
                 summary=summary, records=tuple(r for p in points for r in p.records),
                 passes=tuple(points), **summary.point_figures())


def _plain(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
