"""The load-test gate: exact latency percentiles from raw per-request records, and SLO checks.

Locust rounds response times before computing percentiles; this module keeps every request's
exact latency (``time.perf_counter``), excludes the warm-up and judges the window against targets.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PERCENTILES = (50.0, 95.0, 99.0, 99.9)
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


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile: the smallest observed value with at least ``pct``% at or below it.

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


def pct_key(pct: float) -> str:
    """Summary key for a percentile: 50 -> ``p50_ms``, 99.9 -> ``p99.9_ms``."""
    return f"p{pct:g}_ms"


@dataclass
class Summary:
    """The gate's view of one scenario and protocol over the measured window."""

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
    """Summarise the records whose send time lies in the window ``[warmup_s, stop_s)``.

    Percentiles and the error ratio are over requests sent in the window; percentiles over the
    successful ones only (a fast error must not improve the tail). Throughput is successful
    responses that arrived within the window per second: a server cannot look faster than it
    answered, even when an open loop queued more requests than it could serve.

    Args:
        records: All records of the run, any order.
        scenario: Scenario the summary is for.
        protocol: Protocol the summary is for.
        warmup_s: Seconds from the start that are excluded.
        stop_s: Seconds from the start at which the load stopped.
    """
    window = [r for r in records if r.scenario == scenario and r.protocol == protocol]
    measured = [r for r in window if warmup_s <= r.start_s < stop_s]
    ok_latencies = sorted(r.latency_ms for r in measured if r.ok)
    errors = [r for r in measured if not r.ok]
    window_s = max(stop_s - warmup_s, 0.0)
    completed = sum(
        1 for r in window if r.ok and warmup_s <= r.start_s + r.latency_ms / 1000.0 <= stop_s
    )
    kinds: dict[str, int] = {}
    for r in errors:
        kinds[r.error] = kinds.get(r.error, 0) + 1
    latency: dict[str, float] = {}
    if ok_latencies:
        for pct in PERCENTILES:
            latency[pct_key(pct)] = percentile(ok_latencies, pct)
        latency["mean_ms"] = sum(ok_latencies) / len(ok_latencies)
        latency["max_ms"] = ok_latencies[-1]
    return Summary(
        scenario=scenario,
        protocol=protocol,
        window_s=window_s,
        warmup_s=warmup_s,
        requests=len(measured),
        ok=len(ok_latencies),
        errors=len(errors),
        error_ratio=(len(errors) / len(measured)) if measured else 0.0,
        throughput_rps=(completed / window_s) if window_s > 0 else 0.0,
        latency_ms=latency,
        excluded_warmup=sum(1 for r in window if r.start_s < warmup_s),
        excluded_after_stop=sum(1 for r in window if r.start_s >= stop_s),
        error_kinds=dict(sorted(kinds.items(), key=lambda kv: -kv[1])[:10]),
    )


@dataclass(frozen=True)
class Targets:
    """Service-level objectives of one scenario and protocol."""

    p99_ms: float
    max_error_ratio: float
    min_throughput_rps: float


def violations(summary: Summary, targets: Targets) -> list[str]:
    """Every target the summary misses, as short phrases (empty when all are met)."""
    if summary.requests == 0:
        return [f"no request was sent in the {summary.window_s:.0f} s after the warm-up"]
    missed = []
    p99 = summary.latency_ms.get(pct_key(99.0))
    if p99 is None:
        missed.append("no successful request to measure P99")
    elif p99 > targets.p99_ms:
        missed.append(f"P99 {p99:.3f} ms > {targets.p99_ms:g} ms")
    if summary.error_ratio > targets.max_error_ratio:
        missed.append(
            f"error ratio {summary.error_ratio:.4f} ({summary.errors}/{summary.requests})"
            f" > {targets.max_error_ratio:g}"
        )
    if summary.throughput_rps < targets.min_throughput_rps:
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
    return (
        f"SLO PASS {where}: P99 {p99:.1f} ms <= {targets.p99_ms:g} ms, errors "
        f"{summary.error_ratio:.4f} <= {targets.max_error_ratio:g}, "
        f"{summary.throughput_rps:.1f} req/s >= {targets.min_throughput_rps:g} req/s"
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
            f"({summary.excluded_warmup} warm-up requests excluded)"
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
