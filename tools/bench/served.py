"""The served side of the benchmark: one point of the load engine, closed or open loop.

``measure`` sends prepared requests with tritonclient's asyncio clients (gRPC or HTTP) at a
fixed concurrency, or at a fixed rate (latency from each scheduled send), and meters Triton's
statistics of every model over the window (``tools.load``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tools import load
from tools.load import Point, Request

MODEL = "text_embedding"
TEXT_OUTPUT = "EMBEDDING"


def measure(requests: Sequence[Request], protocol: str, url: str, stats_url: str | None, *,
            concurrency: int = 0, rate: float | None = None, warmup_s: float = 3.0,
            duration_s: float = 15.0, label: str | None = None, cycles: int = 0,
            meters: Sequence[load.Meter] = ()) -> Point:
    """A closed loop at ``concurrency`` (or, with ``rate``, an open loop of ``rate``
    requests/s) for ``warmup_s`` + ``duration_s``; measure the latter.

    Args:
        requests: Sent in order, one per request, cycling.
        protocol: ``grpc`` or ``http`` (tritonclient asyncio clients).
        url: ``host:port`` of that protocol's endpoint.
        stats_url: ``host:port`` of the HTTP endpoint for Triton's statistics (None: none).
        concurrency: Requests kept in flight (closed loop).
        rate: Requests per second of an open loop (None: closed loop).
        warmup_s: Seconds not measured at the start.
        duration_s: Seconds measured.
        label: The protocol as the point reports it (e.g. ``http-direct``).
        cycles: When > 0, measure every request of ``requests`` exactly this many times from
            the first (``duration_s`` is then only a bound).
        meters: More meters over the window, beside Triton's statistics.
    """
    pacing = load.OpenLoop(rate) if rate else load.ClosedLoop(concurrency)
    watching = [*([load.TritonStats(stats_url)] if stats_url else []), *meters]
    point = load.run(requests, load.sender_for(protocol, url), pacing, warmup_s=warmup_s,
                     duration_s=duration_s, meters=watching,
                     max_requests=cycles * len(requests) if cycles else None,
                     from_first=bool(cycles))
    return dataclasses.replace(point, protocol=label) if label else point


def measure_served(protocol: str, url: str, stats_url: str, texts: Sequence[str],
                   concurrency: int, *, warmup_s: float = 3.0, duration_s: float = 15.0,
                   pipeline: str = MODEL, rate: float | None = None) -> Point:
    """``measure`` with one text per request (``TEXT`` -> ``EMBEDDING``) to a text pipeline;
    ``Point.models`` holds Triton's window of every model that served it."""
    requests = load.text_requests(pipeline, texts, outputs=(TEXT_OUTPUT,))
    return measure(requests, protocol, url, stats_url, concurrency=concurrency, rate=rate,
                   warmup_s=warmup_s, duration_s=duration_s)
