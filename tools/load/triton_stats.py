"""Triton's own view of a load window, from its statistics endpoint (``/v2/models/stats``).

Two snapshots (before and after) give per-model deltas: requests, executions, mean executed
batch size, and per-request time in the queue versus compute (input + infer + output).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

_DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


@dataclass(frozen=True)
class ModelCounters:
    """Cumulative counters of one model version at one instant."""

    inference_count: int
    execution_count: int
    counts: dict[str, int]  # duration name -> request count
    ns: dict[str, int]  # duration name -> total nanoseconds
    batch_executions: dict[int, int]  # executed batch size -> executions


@dataclass
class ModelWindow:
    """One model's activity between two snapshots, per request where it says so."""

    model: str
    requests: int
    failed: int
    inferences: int
    executions: int
    mean_batch: float | None
    queue_ms: float | None
    compute_ms: float | None
    compute_input_ms: float | None
    compute_infer_ms: float | None
    compute_output_ms: float | None
    request_ms: float | None
    batch_executions: dict[int, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return asdict(self)


def _int(value: Any) -> int:
    # The gRPC client's JSON form renders uint64 counters as strings.
    return int(value or 0)


def parse_statistics(payload: Mapping[str, Any]) -> dict[str, ModelCounters]:
    """Turn a ``/v2/models/stats`` response (HTTP JSON or gRPC ``as_json``) into counters.

    Keys are model names; a model with several versions gets ``name:version`` keys.
    """
    entries = payload.get("model_stats", [])
    names = [e.get("name", "") for e in entries]
    out: dict[str, ModelCounters] = {}
    for entry in entries:
        name = entry.get("name", "")
        key = name if names.count(name) == 1 else f"{name}:{entry.get('version', '')}"
        stats = entry.get("inference_stats", {})
        counts = {d: _int(stats.get(d, {}).get("count")) for d in _DURATIONS}
        ns = {d: _int(stats.get(d, {}).get("ns")) for d in _DURATIONS}
        batches = {
            _int(b.get("batch_size")): _int(b.get("compute_infer", {}).get("count"))
            for b in entry.get("batch_stats", []) or []
        }
        out[key] = ModelCounters(
            inference_count=_int(entry.get("inference_count")),
            execution_count=_int(entry.get("execution_count")),
            counts=counts,
            ns=ns,
            batch_executions=batches,
        )
    return out


def _per_request_ms(ns: int, count: int) -> float | None:
    return ns / count / 1e6 if count > 0 else None


def window(
    before: Mapping[str, ModelCounters], after: Mapping[str, ModelCounters]
) -> dict[str, ModelWindow]:
    """Per-model deltas between two snapshots; models without any request are left out.

    ``mean_batch`` is the change in inference count over the change in execution count, i.e. the
    mean batch size the model actually executed. Times are means per successful request.
    """
    out: dict[str, ModelWindow] = {}
    for key, end in after.items():
        start = before.get(key)
        if start is None:
            start = ModelCounters(0, 0, dict.fromkeys(_DURATIONS, 0), dict.fromkeys(_DURATIONS, 0), {})
        d_count = {d: end.counts[d] - start.counts[d] for d in _DURATIONS}
        d_ns = {d: end.ns[d] - start.ns[d] for d in _DURATIONS}
        requests = d_count["success"]
        if requests == 0 and d_count["fail"] == 0:
            continue
        executions = end.execution_count - start.execution_count
        inferences = end.inference_count - start.inference_count
        compute_parts = [
            _per_request_ms(d_ns[d], d_count[d])
            for d in ("compute_input", "compute_infer", "compute_output")
        ]
        batches = {
            size: count - start.batch_executions.get(size, 0)
            for size, count in sorted(end.batch_executions.items())
            if count - start.batch_executions.get(size, 0) > 0
        }
        out[key] = ModelWindow(
            model=key,
            requests=requests,
            failed=d_count["fail"],
            inferences=inferences,
            executions=executions,
            mean_batch=(inferences / executions) if executions > 0 else None,
            queue_ms=_per_request_ms(d_ns["queue"], d_count["queue"]),
            compute_ms=(
                sum(p for p in compute_parts if p is not None)
                if any(p is not None for p in compute_parts)
                else None
            ),
            compute_input_ms=compute_parts[0],
            compute_infer_ms=compute_parts[1],
            compute_output_ms=compute_parts[2],
            request_ms=_per_request_ms(d_ns["success"], d_count["success"]),
            batch_executions=batches,
        )
    return out


def merged_windows(windows: Sequence[Mapping[str, ModelWindow]]) -> dict[str, ModelWindow]:
    """Several windows' per-model figures as one (passes of one point, measured apart): counts
    and executed batches summed, ``mean_batch`` as inferences over executions, and each time the
    mean per request weighted by each window's successful requests."""
    out: dict[str, ModelWindow] = {}
    for name in dict.fromkeys(key for models in windows for key in models):
        parts = [models[name] for models in windows if name in models]
        requests = sum(w.requests for w in parts)
        inferences, executions = sum(w.inferences for w in parts), sum(w.executions for w in parts)

        def mean(field_name: str) -> float | None:
            known = [(getattr(w, field_name), w.requests) for w in parts
                     if getattr(w, field_name) is not None and w.requests > 0]
            weight = sum(n for _, n in known)
            return sum(v * n for v, n in known) / weight if weight else None

        batches: dict[int, int] = {}
        for w in parts:
            for size, count in w.batch_executions.items():
                batches[size] = batches.get(size, 0) + count
        out[name] = ModelWindow(
            model=name, requests=requests, failed=sum(w.failed for w in parts),
            inferences=inferences, executions=executions,
            mean_batch=(inferences / executions) if executions > 0 else None,
            queue_ms=mean("queue_ms"), compute_ms=mean("compute_ms"),
            compute_input_ms=mean("compute_input_ms"), compute_infer_ms=mean("compute_infer_ms"),
            compute_output_ms=mean("compute_output_ms"), request_ms=mean("request_ms"),
            batch_executions=dict(sorted(batches.items())))
    return out


def format_window(models: Mapping[str, ModelWindow]) -> str:
    """A table of Triton's view: per model requests, mean batch, queue vs compute per request."""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    header = (
        f"  {'model':<22} {'requests':>8} {'execs':>7} {'mean batch':>10} "
        f"{'queue ms':>9} {'compute ms':>10} {'request ms':>10}"
    )
    lines = ["Triton statistics over the measured window (per request):", header]
    for name, m in sorted(models.items()):
        batch = "-" if m.mean_batch is None else f"{m.mean_batch:.2f}"
        lines.append(
            f"  {name:<22} {m.requests:>8} {m.executions:>7} {batch:>10} "
            f"{ms(m.queue_ms):>9} {ms(m.compute_ms):>10} {ms(m.request_ms):>10}"
        )
    return "\n".join(lines)


def fetch_statistics(url: str, protocol: str = "http",
                     headers: Mapping[str, str] | None = None) -> dict[str, ModelCounters]:
    """Snapshot every model's counters from a running server.

    Over HTTP with the standard library (``urllib``): meters fetch this in a thread beside a
    running load, and tritonclient's HTTP client (gevent) held the interpreter long enough
    there to delay the load's own sends: an open loop's first requests after the meter
    started took up to 120 ms more (2026-12-05).

    Args:
        url: ``host:port`` of the server's HTTP or gRPC endpoint.
        protocol: ``http`` or ``grpc``.
        headers: Extra HTTP headers (a server that restricts its statistics endpoint).
    """
    if protocol == "grpc":
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(url)
        try:
            payload = client.get_inference_statistics(as_json=True)
        finally:
            client.close()
        return parse_statistics(payload)
    request = urllib.request.Request(f"http://{url}/v2/models/stats", headers=dict(headers or {}))
    with urllib.request.urlopen(request, timeout=10) as resp:
        return parse_statistics(json.loads(resp.read()))
