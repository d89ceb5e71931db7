"""The load-test gate: per-request records (CSV/JSON), SLO targets and the verdict.

Locust rounds response times; the gate keeps every exact latency and summarises via tools.stats.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tools import stats
from tools.slo import Targets  # noqa: F401 - the gate checks a summary against them
from tools.stats import PERCENTILES, percentile  # noqa: F401 - re-exported for the gate's users

RECORD_FIELDS = (
    "scenario",
    "protocol",
    "model",
    "start_s",
    "latency_ms",
    "ok",
    "error",
    "payload",
    "response_bytes",
)


@dataclass(frozen=True)
class RequestRecord:
    """One request as the load generator saw it.

    Attributes:
        scenario: Scenario name (``text_embedding``).
        protocol: ``http`` or ``grpc``.
        model: Model the request went to.
        start_s: Send time in seconds since the test started (open loop: the scheduled time).
        latency_ms: Exact time from ``start_s`` to the complete response, in milliseconds.
        ok: True when the response arrived and passed the scenario's check.
        error: One-line error for a failed request, else empty.
        payload: Which payload was sent (file name or text index).
        response_bytes: Size of the response payload as the client saw it.
    """

    scenario: str
    protocol: str
    model: str
    start_s: float
    latency_ms: float
    ok: bool
    error: str = ""
    payload: str = ""
    response_bytes: int = 0


def pct_key(pct: float) -> str:
    """Summary key for a percentile: 50 -> ``p50_ms``, 99.9 -> ``p99.9_ms``."""
    return f"p{pct:g}_ms"


@dataclass
class Summary:
    """The gate's view of one scenario and protocol over the measured window.

    ``requests`` are the requests the window counts (``tools.stats.Window``); ``excluded_warmup``
    started before it, ``excluded_after_stop`` had not completed by the stop.
    """

    scenario: str
    protocol: str
    window_s: float
    warmup_s: float
    requests: int
    ok: int
    errors: int
    error_ratio: float
    throughput_rps: float
    latency_ms: dict[str, float] = field(default_factory=dict)
    excluded_warmup: int = 0
    excluded_after_stop: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    in_flight_at_stop: int = 0
    oldest_in_flight_ms: float = 0.0
    p99_lower_bound_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return asdict(self)


def summarize(
    records: Iterable[RequestRecord],
    *,
    scenario: str,
    protocol: str,
    warmup_s: float,
    stop_s: float,
) -> Summary:
    """Summarise one scenario and protocol over the measured window ``[warmup_s, stop_s]``.

    The window rule and the percentile method are ``tools.stats``' (``stats.METHOD``): a request
    counts when it started at or after ``warmup_s`` and completed by ``stop_s``. The error ratio
    is over the counted requests, the percentiles over the successful ones among them (a fast
    error must not improve the tail), and throughput is the successful ones per second of the
    window: a server cannot look faster than it answered, even when an open loop queued more
    requests than it could serve.

    Args:
        records: All records of the run, any order.
        scenario: Scenario the summary is for.
        protocol: Protocol the summary is for.
        warmup_s: Seconds from the start that are excluded.
        stop_s: Seconds from the start at which the load stopped.
    """
    mine = [r for r in records if r.scenario == scenario and r.protocol == protocol]
    counted = stats.summarize(mine, stats.Window(warmup_s, stop_s))
    latency: dict[str, float] = {}
    if counted.latency is not None:
        for pct, value in counted.latency.percentiles().items():
            latency[pct_key(pct)] = value
        latency["min_ms"] = counted.latency.min_ms
        latency["mean_ms"] = counted.latency.mean_ms
        latency["max_ms"] = counted.latency.max_ms
    return Summary(
        scenario=scenario,
        protocol=protocol,
        window_s=counted.window.length_s,
        warmup_s=warmup_s,
        requests=counted.count,
        ok=counted.ok,
        errors=counted.errors,
        error_ratio=counted.error_ratio,
        throughput_rps=counted.throughput_rps,
        latency_ms=latency,
        excluded_warmup=counted.before_window,
        excluded_after_stop=counted.after_window,
        error_kinds=dict(list(counted.error_kinds.items())[:10]),
        in_flight_at_stop=len(counted.in_flight_ages_ms),
        oldest_in_flight_ms=max(counted.in_flight_ages_ms, default=0.0),
        p99_lower_bound_ms=counted.tail_lower_bound(99.0),
    )


def violations(summary: Summary, targets: Targets) -> list[str]:
    """Every target the summary misses, as short phrases (empty when all are met)."""
    if summary.requests == 0:
        return [f"no request completed in the {summary.window_s:.0f} s after the warm-up"]
    missed = []
    p99 = summary.latency_ms.get(pct_key(99.0))
    if p99 is None:
        missed.append("no successful request to measure P99")
    elif p99 > targets.p99_ms:
        missed.append(f"P99 {p99:.3f} ms > {targets.p99_ms:g} ms")
    elif summary.p99_lower_bound_ms is not None and summary.p99_lower_bound_ms > targets.p99_ms:
        # The window leaves out requests still in flight at the stop; under overload those are
        # the slowest. Counted at their age at the stop, they alone already miss the target.
        missed.append(
            f"backlog: {summary.in_flight_at_stop} request(s) still in flight at the stop "
            f"(oldest {summary.oldest_in_flight_ms:.0f} ms), so P99 over every request started "
            f"in the window is at least {summary.p99_lower_bound_ms:.3f} ms > {targets.p99_ms:g} ms"
        )
    if summary.error_ratio > targets.max_error_ratio:
        missed.append(
            f"error ratio {summary.error_ratio:.4f} ({summary.errors}/{summary.requests})"
            f" > {targets.max_error_ratio:g}"
        )
    if targets.min_throughput_rps is not None and \
            summary.throughput_rps < targets.min_throughput_rps:
        missed.append(
            f"throughput {summary.throughput_rps:.1f} req/s < {targets.min_throughput_rps:g} req/s"
        )
    return missed


def verdict_line(summary: Summary, targets: Targets, profile: str) -> str:
    """One line: ``SLO PASS ...`` or ``SLO FAIL <scenario>/<protocol> (<profile>): reasons``."""
    missed = violations(summary, targets)
    where = f"{summary.scenario}/{summary.protocol} ({profile} profile)"
    if missed:
        return f"SLO FAIL {where}: " + "; ".join(missed)
    p99 = summary.latency_ms[pct_key(99.0)]
    throughput = f"{summary.throughput_rps:.1f} req/s " + (
        "(no throughput target)" if targets.min_throughput_rps is None
        else f">= {targets.min_throughput_rps:g} req/s")
    return (
        f"SLO PASS {where}: P99 {p99:.1f} ms <= {targets.p99_ms:g} ms, errors "
        f"{summary.error_ratio:.4f} <= {targets.max_error_ratio:g}, {throughput}"
    )


def format_summary(summary: Summary) -> str:
    """A short human-readable block: percentiles, throughput and errors."""
    lat = summary.latency_ms
    if lat:
        pcts = "  ".join(f"P{p:g} {lat[pct_key(p)]:.2f}" for p in PERCENTILES)
        latency = f"{pcts}  max {lat['max_ms']:.2f} ms"
    else:
        latency = "no successful request"
    lines = [
        (
            f"{summary.scenario}/{summary.protocol}: {summary.requests} requests in "
            f"{summary.window_s:.1f} s after {summary.warmup_s:g} s warm-up "
            f"({summary.excluded_warmup} warm-up and {summary.excluded_after_stop} unfinished "
            "requests excluded)"
        ),
        f"  latency ms  {latency}",
        (
            f"  throughput {summary.throughput_rps:.1f} req/s   errors {summary.errors} "
            f"({summary.error_ratio:.2%})"
        ),
    ]
    for kind, count in summary.error_kinds.items():
        lines.append(f"  error x{count}: {kind}")
    return "\n".join(lines)


def write_records(records: Sequence[RequestRecord], csv_path: Path, json_path: Path) -> None:
    """Write the raw records as CSV (one row per request) and as a JSON list."""
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with csv_path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(RECORD_FIELDS)
        for r in records:
            writer.writerow(
                [
                    r.scenario,
                    r.protocol,
                    r.model,
                    f"{r.start_s:.6f}",
                    f"{r.latency_ms:.6f}",
                    int(r.ok),
                    r.error,
                    r.payload,
                    r.response_bytes,
                ]
            )
    json_path.write_text(json.dumps([asdict(r) for r in records]), encoding="utf-8")


def read_records(csv_path: Path) -> list[RequestRecord]:
    """Read records written by ``write_records`` (for re-checking a run independently)."""
    with csv_path.open(newline="", encoding="utf-8") as fh:
        return [
            RequestRecord(
                scenario=row["scenario"],
                protocol=row["protocol"],
                model=row["model"],
                start_s=float(row["start_s"]),
                latency_ms=float(row["latency_ms"]),
                ok=row["ok"] == "1",
                error=row["error"],
                payload=row["payload"],
                response_bytes=int(row["response_bytes"]),
            )
            for row in csv.DictReader(fh)
        ]


def write_summary(path: Path, payload: Mapping[str, Any]) -> None:
    """Write the run's summary JSON (gate, targets, verdict, Triton's view)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n", encoding="utf-8")
