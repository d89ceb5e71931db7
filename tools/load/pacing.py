"""When the next request goes: one class per pacing (perf_analyzer's load managers).

``ClosedLoop`` keeps a fixed number of requests in flight (each worker sends its next request
when its last one is answered); ``OpenLoop`` sends at a fixed arrival rate whatever is still in
flight, and a request's latency counts from its *scheduled* send time, so a client or server
that falls behind shows as latency (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import itertools
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tools.load.state import Run


class Pacing(ABC):
    """How requests are paced; ``drive`` sends through ``run`` until it says stop."""

    @property
    @abstractmethod
    def slots(self) -> int:
        """The most requests in flight the sender must hold connections for."""

    @property
    def concurrency(self) -> int:
        """What a ``Point`` reports as concurrency (0 for an open loop)."""
        return 0

    @property
    def offered_rps(self) -> float | None:
        """What a ``Point`` reports as the offered rate (None for a closed loop)."""
        return None

    @abstractmethod
    async def drive(self, run: Run) -> None:
        """Send requests through ``run`` until ``run.take`` refuses; return when all are done."""


@dataclass(frozen=True)
class ClosedLoop(Pacing):
    """``concurrency`` workers, each sending its next request as soon as its last one returned.

    Attributes:
        users: Requests kept in flight.
        pause_after_error_s: A worker waits this long after a failed request (against a server
            that is down, so the workers do not spin on refused connections).
    """

    users: int
    pause_after_error_s: float = 0.0

    def __post_init__(self) -> None:
        if self.users < 1:
            raise ValueError(f"a closed loop needs at least 1 user, got {self.users}")

    @property
    def slots(self) -> int:
        return self.users

    @property
    def concurrency(self) -> int:
        return self.users

    async def drive(self, run: Run) -> None:
        async def worker() -> None:
            while (taken := run.take(now := run.clock())) is not None:
                ok = await run.fire(taken, now)
                if not ok and self.pause_after_error_s > 0:
                    await asyncio.sleep(self.pause_after_error_s)

        await asyncio.gather(*(worker() for _ in range(self.users)))


@dataclass(frozen=True)
class OpenLoop(Pacing):
    """One request every ``1 / rate`` seconds from the start, whatever is still in flight.

    Attributes:
        rate: Arrival rate, requests per second.
        max_in_flight: Connections the sender holds (raw HTTP / tritonclient HTTP): a request
            whose time comes while all are busy waits for one, its latency still counted from
            its scheduled time. gRPC multiplexes one channel and does not wait.
    """

    rate: float
    max_in_flight: int = 256

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"an open loop needs a rate > 0, got {self.rate}")

    @property
    def slots(self) -> int:
        return self.max_in_flight

    @property
    def offered_rps(self) -> float | None:
        return self.rate

    async def drive(self, run: Run) -> None:
        sent: set[asyncio.Task] = set()
        for i in itertools.count():
            scheduled = run.start + i / self.rate
            taken = run.take(scheduled)
            if taken is None:
                break
            delay = scheduled - run.clock()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.ensure_future(run.fire(taken, scheduled))
            sent.add(task)
            task.add_done_callback(sent.discard)
        if sent:
            await asyncio.gather(*sent)
