"""The load engine: a pacing drives a sender over prepared requests; meters watch the window.

``run`` (or ``run_async`` inside an event loop, or ``Background`` in a thread) sends
``requests`` in order, cycling, for ``warmup_s`` + ``duration_s`` (or until ``max_requests``
measured requests were sent, or ``stop`` is set), records every request as a
``tools.stats.Record`` on ``time.monotonic`` and returns one ``Point``.
"""

from __future__ import annotations

import asyncio
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


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


class Run:
    """One run's state, shared by the pacing: the clock, the bounds and the records.

    Attributes:
        start: When the run started (``time.monotonic``).
        window: The measured window ``[start + warmup_s, start + warmup_s + duration_s]``.
        records: Every request so far (warm-up included), in completion order.
    """

    def __init__(self, sender: Sender, prepared: Sequence[Any], *, warmup_s: float,
                 duration_s: float, max_requests: int | None, stop: threading.Event | None,
                 records: list[stats.Record] | None = None) -> None:
        self.clock = time.monotonic
        self.start = self.clock()
        self.window = stats.Window(self.start + warmup_s, self.start + warmup_s + duration_s)
        self.records: list[stats.Record] = records if records is not None else []
        self._sender = sender
        self._prepared = prepared
        self._next = 0
        self._max_requests = max_requests
        self._in_window = 0
        self._stop = stop or threading.Event()
        self.stopped_at: float | None = None

    @property
    def count_reached(self) -> bool:
        """True once ``max_requests`` requests were sent inside the window."""
        return self._max_requests is not None and self._in_window >= self._max_requests

    def take(self, at: float) -> Any | None:
        """The next prepared request for a send at ``at``, or None: the run is over."""
        if self._stop.is_set():
            self.stopped_at = self.stopped_at or self.clock()
            return None
        if at >= self.window.end_s or (at >= self.window.start_s and self.count_reached):
            return None
        if at >= self.window.start_s:
            self._in_window += 1
        prepared = self._prepared[self._next % len(self._prepared)]
        self._next += 1
        return prepared

    async def fire(self, prepared: Any, scheduled: float) -> bool:
        """Send ``prepared``; record it with its latency from ``scheduled``. True if it succeeded."""
        try:
            await self._sender.send(prepared)
            error = ""
        except Exception as exc:  # noqa: BLE001 - a failed request is a record, not a crash
            error = _one_line(exc)
        self.records.append(stats.Record(scheduled, (self.clock() - scheduled) * 1000.0,
                                         not error, error))
        return not error

    def measured_window(self) -> stats.Window:
        """The window the figures use: cut short by ``stop`` or by ``max_requests``."""
        end = self.window.end_s
        if self.stopped_at is not None:
            end = min(end, self.stopped_at)
        if self.count_reached:
            inside = [stats.end_s(r) for r in self.records if r.start_s >= self.window.start_s]
            end = min(end, max(inside, default=end))
        return stats.Window(self.window.start_s, max(end, self.window.start_s))


async def run_async(requests: Sequence[Request], sender: Sender, pacing: Pacing, *,
                    duration_s: float, warmup_s: float = 0.0, max_requests: int | None = None,
                    meters: Sequence[Meter] = (), stop: threading.Event | None = None,
                    records: list[stats.Record] | None = None) -> Point:
    """Run one load on the running event loop and measure it (see ``run``); ``records``, when
    given, is the list the run fills (a caller may read it while the run goes on)."""
    if not requests:
        raise ValueError("a load needs at least one request")
    prepared = [sender.prepare(r) for r in requests]
    await sender.open(pacing.slots)
    try:
        run = Run(sender, prepared, warmup_s=warmup_s, duration_s=duration_s,
                  max_requests=max_requests, stop=stop, records=records)
        errors: dict[str, str] = {}
        started = asyncio.ensure_future(_start_meters(meters, run.window.start_s, run.clock,
                                                      errors))
        try:
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
                errors[meter.name] = _one_line(exc)
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
            errors[meter.name] = _one_line(exc)


def run(requests: Sequence[Request], sender: Sender, pacing: Pacing, *, duration_s: float,
        warmup_s: float = 0.0, max_requests: int | None = None, meters: Sequence[Meter] = (),
        stop: threading.Event | None = None) -> Point:
    """Send ``requests`` (in order, cycling) with ``pacing`` through ``sender``; measure.

    Args:
        requests: Prepared once by the sender before the load.
        sender: How they go (``tools.load.senders``).
        pacing: When they go (``ClosedLoop`` or ``OpenLoop``).
        duration_s: Seconds measured after the warm-up; nothing is sent after them.
        warmup_s: Seconds sent but not measured at the start.
        max_requests: Send at most this many requests inside the window; the window then
            ends when the last of them completes.
        meters: Started at the window's start, stopped after the load; their figures go into
            ``Point.meters`` by name (a meter that fails is left out, its error in
            ``Point.meter_errors``: it never fails the load).
        stop: When set, nothing more is sent (requests in flight finish or time out) and the
            window ends there.

    Returns:
        The ``Point``: the window rule over every record, and the meters' figures.
    """
    return asyncio.run(run_async(requests, sender, pacing, duration_s=duration_s,
                                 warmup_s=warmup_s, max_requests=max_requests, meters=meters,
                                 stop=stop))


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
            self.point = asyncio.run(run_async(*self._args, stop=self._stop, records=self.records,
                                               **self._options))
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
