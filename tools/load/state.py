"""One run's state, shared by the engine and the pacing: the clock, the window, the records."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from tools import stats
from tools.load.senders import Sender


def one_line(exc: BaseException) -> str:
    """An exception as one short line (its text, or its class name)."""
    return " ".join(str(exc).split())[:200] or type(exc).__name__


class Run:
    """One run's state, shared by the pacing: the clock, the bounds and the records.

    Attributes:
        start: When the run started (``time.monotonic``).
        window: The measured window ``[start + warmup_s, start + warmup_s + duration_s]``.
            With ``from_first`` its first request is ``prepared[0]``, whatever the warm-up
            sent, so ``max_requests`` = k x ``len(prepared)`` measures each exactly k times.
        records: Every request so far (warm-up included), in completion order.
    """

    def __init__(self, sender: Sender, prepared: Sequence[Any], *, warmup_s: float,
                 duration_s: float, max_requests: int | None, stop: threading.Event | None,
                 records: list[stats.Record] | None = None, from_first: bool = False) -> None:
        self.clock = time.monotonic
        self.start = self.clock()
        self.window = stats.Window(self.start + warmup_s, self.start + warmup_s + duration_s)
        self.records: list[stats.Record] = records if records is not None else []
        self._sender = sender
        self._prepared = prepared
        self._next = 0
        self._max_requests = max_requests
        self._in_window = 0
        self._from_first = from_first
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
            if self._from_first and not self._in_window:
                self._next = 0  # the window starts at the first request
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
            error = one_line(exc)
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
