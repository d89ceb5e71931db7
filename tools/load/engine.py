"""The load engine: a pacing drives a sender over prepared requests; meters watch the window.

``run`` (or ``run_async`` inside an event loop, or ``Background`` in a thread) sends
``requests`` in order, cycling, for ``warmup_s`` + ``duration_s`` (or until ``max_requests``
measured requests were sent, or ``stop`` is set), records every request as a
``tools.stats.Record`` on ``time.monotonic`` and returns one ``Point``.

While a load runs, the objects that existed before it are out of the garbage collector's way
(``gc.freeze``): the load generator shares the cores and the interpreter with whatever ran
before it in the process (``tools bench``: the in-process limits, every earlier point's
records), and a full collection over them paused the sends of an open loop for 20-50 ms,
which its latencies, counted from each scheduled send, then carried.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
from collections.abc import Sequence
from typing import Any

from tools import stats
from tools.load.meters import Meter
from tools.load.pacing import Pacing
from tools.load.point import Point
from tools.load.request import Request
from tools.load.senders import Sender
from tools.load.state import Run, one_line

_frozen = 0  # loads running now (gc.freeze is the process's: the first freezes, the last thaws)
_frozen_lock = threading.Lock()


@contextlib.contextmanager
def _older_objects_frozen() -> Any:
    """Keep the objects that exist now out of garbage collections until the block ends (and
    every other load running beside it has ended too)."""
    global _frozen
    with _frozen_lock:
        if _frozen == 0:
            gc.freeze()
        _frozen += 1
    try:
        yield
    finally:
        with _frozen_lock:
            _frozen -= 1
            if _frozen == 0:
                gc.unfreeze()


async def run_async(requests: Sequence[Request], sender: Sender, pacing: Pacing, *,
                    duration_s: float, warmup_s: float = 0.0, max_requests: int | None = None,
                    meters: Sequence[Meter] = (), stop: threading.Event | None = None,
                    records: list[stats.Record] | None = None, from_first: bool = False) -> Point:
    """Run one load on the running event loop and measure it (see ``run``); ``records``, when
    given, is the list the run fills (a caller may read it while the run goes on)."""
    if not requests:
        raise ValueError("a load needs at least one request")
    prepared = [sender.prepare(r) for r in requests]
    await sender.open(pacing.slots)
    try:
        run = Run(sender, prepared, warmup_s=warmup_s, duration_s=duration_s,
                  max_requests=max_requests, stop=stop, records=records, from_first=from_first)
        errors: dict[str, str] = {}
        started = asyncio.ensure_future(_start_meters(meters, run.window.start_s, run.clock,
                                                      errors))
        try:
            with _older_objects_frozen():
                await pacing.drive(run)
        finally:
            if not started.done():
                started.cancel()  # the run ended before its window began: nothing to meter
            await asyncio.gather(started, return_exceptions=True)
        figures: dict[str, Any] = {}
        for meter in meters if not started.cancelled() else ():
            if meter.name in errors:
                continue
            try:
                figures[meter.name] = await asyncio.to_thread(meter.stop)
            except Exception as exc:  # noqa: BLE001 - a meter never fails the load
                errors[meter.name] = one_line(exc)
    finally:
        await sender.close()
    models = sorted({r.model for r in requests})
    return Point.from_records(run.records, run.measured_window(), model=",".join(models),
                              protocol=sender.protocol, concurrency=pacing.concurrency,
                              offered_rps=pacing.offered_rps, meters=figures,
                              meter_errors=errors)


async def _start_meters(meters: Sequence[Meter], at: float, clock: Any,
                        errors: dict[str, str]) -> None:
    await asyncio.sleep(max(0.0, at - clock()))
    for meter in meters:
        try:
            await asyncio.to_thread(meter.start)
        except Exception as exc:  # noqa: BLE001 - a meter never fails the load
            errors[meter.name] = one_line(exc)


def run(requests: Sequence[Request], sender: Sender, pacing: Pacing, *, duration_s: float,
        warmup_s: float = 0.0, max_requests: int | None = None, meters: Sequence[Meter] = (),
        stop: threading.Event | None = None, from_first: bool = False) -> Point:
    """Send ``requests`` (in order, cycling) with ``pacing`` through ``sender``; measure.

    Args:
        requests: Prepared once by the sender before the load.
        sender: How they go (``tools.load.senders``).
        pacing: When they go (``ClosedLoop`` or ``OpenLoop``).
        duration_s: Seconds measured after the warm-up; nothing is sent after them.
        warmup_s: Seconds sent but not measured at the start.
        max_requests: Send at most this many requests inside the window; the window then
            ends when the last of them completes.
        from_first: The window's first request is ``requests[0]`` (whatever the warm-up
            sent): with ``max_requests`` = k x ``len(requests)`` every request is measured
            exactly k times, so two points compare the same payloads.
        meters: Started at the window's start, stopped after the load; their figures go into
            ``Point.meters`` by name (a meter that fails is left out, its error in
            ``Point.meter_errors``: it never fails the load).
        stop: When set, nothing more is sent (requests in flight finish or time out) and the
            window ends there.

    Returns:
        The ``Point``: the window rule over every record, and the meters' figures.
    """
    return run_loop(run_async(requests, sender, pacing, duration_s=duration_s,
                              warmup_s=warmup_s, max_requests=max_requests, meters=meters,
                              stop=stop, from_first=from_first), sender)


def run_loop(main: Any, sender: Sender) -> Any:
    """Run the coroutine ``main`` to its end on a new event loop: uvloop's where the sender
    runs on it (``Sender.uvloop``) and uvloop is importable, else asyncio's. On these shared
    cores the load generator's own CPU is taken from the server it measures; uvloop halves
    the raw-HTTP sender's."""
    if sender.uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(main)
    return asyncio.run(main)


class Background:
    """``run`` in a thread of its own; ``records`` fill while it runs, ``join`` ends it.

    Args:
        requests, sender, pacing: As for ``run``.
        records: The list to fill (default: a new one).
        **options: ``duration_s``, ``warmup_s``, ``max_requests``, ``meters``.
    """

    def __init__(self, requests: Sequence[Request], sender: Sender, pacing: Pacing, *,
                 records: list[stats.Record] | None = None, **options: Any) -> None:
        self.records: list[stats.Record] = records if records is not None else []
        self.point: Point | None = None
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._args = (requests, sender, pacing)
        self._options = options
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        try:
            self.point = run_loop(run_async(*self._args, stop=self._stop, records=self.records,
                                            **self._options), self._args[1])
        except BaseException as exc:  # noqa: BLE001 - handed to join()
            self._error = exc

    def start(self) -> Background:
        """Start sending; returns self."""
        self._thread.start()
        return self

    def join(self, timeout_s: float | None = None) -> Point | None:
        """Wait for the run and return its point.

        Args:
            timeout_s: None waits for the planned duration; otherwise stop sending now and
                wait at most this long (plus the sender's request timeout) for requests in
                flight. Returns None if the thread is still running after that.
        """
        if timeout_s is not None:
            self._stop.set()
            sender = self._args[1]
            timeout_s += sender.timeout_s or 0.0
        self._thread.join(timeout_s)
        if self._error is not None:
            raise self._error
        return self.point
