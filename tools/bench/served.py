"""The served side of the benchmark: closed-loop asyncio clients at a fixed concurrency, or an
open loop at a fixed rate.

One event loop drives ``concurrency`` workers (or sends one request every ``1 / rate`` seconds,
whatever is still in flight) with tritonclient's asyncio clients (gRPC or HTTP), one text per
request, over the same texts as the in-process limit; Triton's statistics before and after the
measured window give the encoder's mean executed batch.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tools import stats
from tools.load.request import Request, triton_dtype
from tools.loadtest import triton_stats

MODEL = "text_embedding"
ENCODER = "minilm_encoder"


@dataclass
class ServedResult:
    """One point of the sweep: protocol and concurrency, throughput and latency.

    Figures follow ``tools.stats``: requests (successful) and errors are those that started after
    the warm-up and completed inside the measured window; throughput is requests / ``seconds``.
    """

    protocol: str
    concurrency: int
    requests: int
    errors: int
    seconds: float
    throughput: float
    p50_ms: float | None
    p99_ms: float | None
    encoder_mean_batch: float | None
    encoder_queue_ms: float | None
    encoder_compute_ms: float | None
    first_error: str = ""
    pipeline: str = MODEL
    # Open loop: the offered rate (requests/s); ``concurrency`` is then 0. Latency is counted
    # from each request's scheduled send time, so a client that falls behind shows as latency.
    offered_rps: float | None = None

    @property
    def label(self) -> str:
        """``c=8`` for a closed-loop point, ``r=151`` for an open-loop one."""
        return f"r={self.offered_rps:.0f}" if self.offered_rps else f"c={self.concurrency}"

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return asdict(self)


def _client_module(protocol: str) -> Any:
    if protocol == "grpc":
        import tritonclient.grpc.aio as module
    else:
        import tritonclient.http.aio as module
    return module


async def _sweep_point(
    protocol: str,
    url: str,
    stats_url: str,
    texts: Sequence[str],
    concurrency: int,
    warmup_s: float,
    duration_s: float,
    pipeline: str,
    encoder_model: str,
    rate: float | None = None,
    requests: Sequence[Request] | None = None,
) -> ServedResult:
    mod = _client_module(protocol)
    if requests is None:  # the texts, one per request
        requests = [Request(pipeline, {"TEXT": np.array([[t.encode("utf-8")]], np.object_)},
                            ("EMBEDDING",)) for t in texts]
    if protocol == "grpc":
        client = mod.InferenceServerClient(url)
        outputs = [mod.InferRequestedOutput(name) for name in requests[0].outputs]
    else:
        client = mod.InferenceServerClient(url, conn_limit=concurrency if not rate else 256)
        outputs = [mod.InferRequestedOutput(name, binary_data=True)
                   for name in requests[0].outputs]
    inputs = []
    for request in requests:
        items = []
        for name, array in request.inputs.items():
            item = mod.InferInput(name, list(array.shape), triton_dtype(array))
            item.set_data_from_numpy(array)
            items.append(item)
        inputs.append(items)
    order = itertools.cycle(range(len(inputs)))
    records: list[stats.Record] = []  # every request, warm-up included; start_s from ``start``
    start = time.perf_counter()
    window_start, window_end = start + warmup_s, start + warmup_s + duration_s
    snapshots: dict[str, Any] = {}

    async def snapshot_at(when: float, key: str) -> None:
        await asyncio.sleep(max(0.0, when - time.perf_counter()))
        snapshots[key] = await asyncio.to_thread(triton_stats.fetch_statistics, stats_url, "http")

    async def one(t0: float) -> None:
        try:
            await client.infer(pipeline, inputs[next(order)], outputs=outputs)
            error = ""
        except Exception as exc:  # noqa: BLE001 - counted; the first one is reported
            error = " ".join(str(exc).split())[:200] or type(exc).__name__
        latency_ms = (time.perf_counter() - t0) * 1000.0
        records.append(stats.Record(t0 - start, latency_ms, not error, error))

    async def worker() -> None:
        while (t0 := time.perf_counter()) < window_end:
            await one(t0)

    async def open_loop() -> None:
        sent: list[asyncio.Task] = []
        for i in itertools.count():
            scheduled = start + i / rate
            if scheduled >= window_end:
                break
            await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
            sent.append(asyncio.create_task(one(scheduled)))
        await asyncio.gather(*sent)

    try:
        before = asyncio.create_task(snapshot_at(window_start, "before"))
        if rate:
            await open_loop()
        else:
            await asyncio.gather(*(worker() for _ in range(concurrency)))
        await before
        snapshots["after"] = await asyncio.to_thread(
            triton_stats.fetch_statistics, stats_url, "http"
        )
    finally:
        await client.close()
    encoder = triton_stats.window(snapshots["before"], snapshots["after"]).get(encoder_model)
    measured = stats.Window(warmup_s, warmup_s + duration_s)
    return served_result(protocol, 0 if rate else concurrency, records, measured, encoder,
                         pipeline, rate)


def served_result(protocol: str, concurrency: int, records: Sequence[stats.Timed],
                  window: stats.Window, encoder: triton_stats.ModelWindow | None = None,
                  pipeline: str = MODEL, offered_rps: float | None = None) -> ServedResult:
    """One sweep point's figures from its raw records (``tools.stats``' window rule).

    Args:
        protocol: ``grpc`` or ``http``.
        concurrency: Requests kept in flight.
        records: Every request of the point, warm-up included, on the window's clock.
        window: The measured window.
        encoder: Triton's view of the encoder over the window, if known.
        pipeline: The pipeline measured.
        offered_rps: The open loop's rate (None: closed loop at ``concurrency``).
    """
    return ServedResult(
        offered_rps=offered_rps,
        protocol=protocol,
        concurrency=concurrency,
        encoder_mean_batch=encoder.mean_batch if encoder else None,
        encoder_queue_ms=encoder.queue_ms if encoder else None,
        encoder_compute_ms=encoder.compute_ms if encoder else None,
        pipeline=pipeline,
        **stats.summarize(records, window).point_figures(),
    )


def measure_served(
    protocol: str,
    url: str,
    stats_url: str,
    texts: Sequence[str],
    concurrency: int,
    *,
    warmup_s: float = 3.0,
    duration_s: float = 15.0,
    pipeline: str = MODEL,
    encoder_model: str = ENCODER,
    rate: float | None = None,
    requests: Sequence[Request] | None = None,
) -> ServedResult:
    """Closed-loop load at ``concurrency`` (or, with ``rate``, an open loop of ``rate``
    requests/s) for ``warmup_s`` + ``duration_s``; measure the latter.

    Args:
        protocol: ``grpc`` or ``http``.
        url: ``host:port`` of that protocol's endpoint.
        stats_url: ``host:port`` of the HTTP endpoint (for Triton's statistics).
        texts: Sent in order, one per request, cycling.
        concurrency: Requests kept in flight.
        warmup_s: Seconds not measured at the start.
        duration_s: Seconds measured.
        pipeline: The text pipeline (ensemble) the requests go to.
        encoder_model: Its encoder, whose executed batch and queue time are reported.
        rate: Requests per second of an open loop (None: closed loop).
        requests: Prepared requests (``tools.load.scenario.Request``) instead of ``texts``.
    """
    return asyncio.run(
        _sweep_point(protocol, url, stats_url, texts, concurrency, warmup_s, duration_s, pipeline,
                     encoder_model, rate, requests)
    )
