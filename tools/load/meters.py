"""What else a load run measures over its window: Triton's per-model view, CPU by role, load.

A meter is started at the window's start (the end of the warm-up) and stopped after the load;
what ``stop`` returns goes into ``Point.meters`` under the meter's ``name``. Meters run in a
worker thread, off the event loop that sends.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import psutil

from tools.load import triton_stats


class Meter(ABC):
    """One measurement over a run's window."""

    name: str = ""

    @abstractmethod
    def start(self) -> None:
        """Take the first reading (at the window's start)."""

    @abstractmethod
    def stop(self) -> Any:
        """Take the last reading; return the figures of the window."""


class TritonStats(Meter):
    """Triton's statistics over the window: per model, requests, executions, mean executed
    batch, and queue vs compute time per request (``tools.load.triton_stats``).

    Args:
        url: ``host:port`` of the server's HTTP endpoint.
        models: Keep only these models (None: every model that saw requests).
        headers: Extra HTTP headers (a server that restricts its statistics endpoint).
    """

    name = "triton"

    def __init__(self, url: str, models: Collection[str] | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        self.url = url
        self.models = set(models) if models is not None else None
        self.headers = dict(headers or {})
        self._before: dict[str, triton_stats.ModelCounters] | None = None

    def _fetch(self) -> dict[str, triton_stats.ModelCounters]:
        return triton_stats.fetch_statistics(self.url, "http", self.headers)

    def start(self) -> None:
        self._before = self._fetch()

    def stop(self) -> dict[str, triton_stats.ModelWindow]:
        window = triton_stats.window(self._before or {}, self._fetch())
        return {k: v for k, v in window.items() if self.models is None or k in self.models}


@dataclass(frozen=True)
class ProcessSample:
    """CPU seconds (user + system) and RSS of one role's processes at one moment."""

    cpu_s: float
    rss_bytes: int


def sample(pids: Iterable[int]) -> ProcessSample:
    """CPU seconds and RSS summed over the live ``pids``."""
    cpu, rss = 0.0, 0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                times = proc.cpu_times()
                cpu += times.user + times.system
                rss += proc.memory_info().rss
        except psutil.Error:
            continue
    return ProcessSample(cpu, rss)


def cpu_share(before: Mapping[str, ProcessSample], after: Mapping[str, ProcessSample],
              seconds: float) -> dict[str, float]:
    """Cores used by each role between two samples (1.0 = one core busy the whole time)."""
    return {
        role: round((after[role].cpu_s - before[role].cpu_s) / seconds, 3)
        for role in after
        if role in before and seconds > 0
    }


class Cores(Meter):
    """Cores used by each role over the window (``cpu_share``) and each role's RSS at its end.

    Args:
        roles: Role -> pids, or a callable giving that mapping (read at the start).
    """

    name = "cores"

    def __init__(self, roles: Mapping[str, Iterable[int]]
                 | Callable[[], Mapping[str, Iterable[int]]]) -> None:
        self._roles = roles
        self._pids: dict[str, list[int]] = {}
        self._before: dict[str, ProcessSample] = {}
        self._at = 0.0

    def start(self) -> None:
        roles = self._roles() if callable(self._roles) else self._roles
        self._pids = {role: list(pids) for role, pids in roles.items()}
        self._at = time.monotonic()
        self._before = {role: sample(pids) for role, pids in self._pids.items()}

    def stop(self) -> dict[str, float]:
        after = {role: sample(pids) for role, pids in self._pids.items()}
        return cpu_share(self._before, after, time.monotonic() - self._at)


class LoadAverage(Meter):
    """The host's 1-minute load average at the window's start and after the load."""

    name = "load_average"

    def __init__(self) -> None:
        self._before: float | None = None

    def start(self) -> None:
        self._before = os.getloadavg()[0]

    def stop(self) -> dict[str, float | None]:
        return {"before": self._before, "after": os.getloadavg()[0]}
