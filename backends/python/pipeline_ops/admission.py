"""Admission before work: a first pipeline step lets on only what the models after it can take.

Under overload the encoder's queue is full and Triton refuses new requests there, but only after
the tokenizer has tokenized them: at 4x offered load that work took 0.17 of this machine's 2
cores away from the encoder (README, Reliability under faults). A ``QueueGate`` in the first
step reads how many requests the later models already hold queued (Triton's real-time gauge
``nv_inference_pending_request_count`` on the metrics endpoint, polled by a background thread).
Without ``max_wait_s`` it refuses the excess at once with UNAVAILABLE (HTTP 503), before any
tokenization. With it, a batch waits for room; the requests behind it then wait in Triton's own
queue for this step, which refuses the excess in the server (refusing in the stub cost a stub
round trip per request: goodput 0.59-0.84 against 0.74-0.87 holding).

The gate fails open: while the metrics endpoint cannot be read, every request is admitted and
the later models' own queue policies (``max_queue_size``), or this gate's step's, still bound
the backlog.
"""

from __future__ import annotations

import http.client
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .errors import ConfigurationError, Overloaded

METRICS_URL_ENV = "TRITON_FORGE_METRICS_URL"  # host:port; tritonserver's default port otherwise
DEFAULT_METRICS_URL = "127.0.0.1:8002"
DEFAULT_INTERVAL_S = 0.01
# A reading younger than this is not redone when the room runs out: requests admitted just
# before are still on their way from this step to the next one's queue (with 2 ms the encoder's
# own queue refused a fifth of 3,500 req/s of short texts).
MIN_READ_AGE_S = DEFAULT_INTERVAL_S
IDLE_AFTER_S = 1.0  # no request for this long: stop reading the metrics until the next one
_PENDING = re.compile(r'^nv_inference_pending_request_count\{model="([^"]+)",[^}]*\}\s+(\S+)$', re.M)
log = logging.getLogger(__name__)


def pending_requests(metrics_text: str, models: Sequence[str]) -> int:
    """Requests queued (not yet executing) at ``models``, summed over their versions."""
    wanted = set(models)
    return int(sum(float(v) for name, v in _PENDING.findall(metrics_text) if name in wanted))


@dataclass(frozen=True)
class AdmissionSettings:
    """The gate's parameters: ``admission_models`` (comma-separated), ``admission_max_pending``."""

    models: tuple[str, ...]
    max_pending: int
    metrics_url: str = DEFAULT_METRICS_URL
    interval_s: float = DEFAULT_INTERVAL_S
    max_wait_s: float = 0.0  # ``admission_max_wait_ms``: hold a batch this long for room

    @classmethod
    def from_parameters(cls, params: Mapping[str, str], model: str,
                        environ: Mapping[str, str] | None = None) -> AdmissionSettings | None:
        """The settings, or ``None`` when the config names no ``admission_models``.

        Raises:
            ConfigurationError: ``admission_max_pending`` is missing or not a positive integer.
        """
        models = tuple(m.strip() for m in params.get("admission_models", "").split(",") if m.strip())
        if not models:
            return None
        raw = params.get("admission_max_pending", "")
        if not raw.isdigit() or int(raw) < 1:
            raise ConfigurationError(
                f"model '{model}': parameter 'admission_max_pending' must be a positive integer "
                f"when 'admission_models' is set, got {raw!r}"
            )
        wait = params.get("admission_max_wait_ms", "0")
        if not wait.isdigit():
            raise ConfigurationError(
                f"model '{model}': parameter 'admission_max_wait_ms' must be a whole number of "
                f"milliseconds (0 or more), got {wait!r}"
            )
        env = os.environ if environ is None else environ
        return cls(models, int(raw), env.get(METRICS_URL_ENV) or DEFAULT_METRICS_URL,
                   max_wait_s=int(wait) / 1000)


class MetricsReader:
    """``GET /metrics`` over one kept-alive connection (half the CPU of a new one per reading,
    on both sides), reconnecting after any failure. Safe to call from several threads."""

    def __init__(self, timeout_s: float = 1.0) -> None:
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None

    def __call__(self, url: str) -> str:
        with self._lock:
            if self._conn is None:
                self._conn = http.client.HTTPConnection(url, timeout=self._timeout_s)
            try:
                self._conn.request("GET", "/metrics")
                reply = self._conn.getresponse()
                body = reply.read().decode()
            except Exception:
                self._conn.close()
                self._conn = None
                raise
            if reply.status != 200:
                raise OSError(f"GET http://{url}/metrics answered HTTP {reply.status}")
            return body


class QueueGate:
    """How many more requests the later models can take, refreshed every ``interval_s``.

    ``admit(n)`` answers how many of ``n`` requests to let through and counts them against the
    room of the last reading, so a burst between two readings cannot overfill the queue. When
    the room runs out before the next reading, the gate reads again at once (at most every
    ``MIN_READ_AGE_S``) rather than refuse on a stale figure: most admitted requests have left
    the queue by then, and refusing on the count alone throttled 32 closed-loop users at
    1,100 req/s.
    """

    def __init__(self, settings: AdmissionSettings,
                 fetch: Callable[[str], str] | None = None, start: bool = True) -> None:
        self.settings = settings
        self._fetch = fetch or MetricsReader()
        self._lock = threading.Lock()
        self._room: int | None = None  # None: no reading yet (or the last one failed): fail open
        self._stop = threading.Event()
        self._warned = False
        self._last_admit = 0.0
        self._read_at = 0.0
        self._busy = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="queue-gate", daemon=True)
        if start:
            self._thread.start()

    def refresh(self) -> None:
        """Read the metrics once; on failure the gate admits everything until a reading works."""
        try:
            pending = pending_requests(self._fetch(self.settings.metrics_url), self.settings.models)
        except Exception as exc:  # noqa: BLE001 - any failure to read means: fail open
            with self._lock:
                self._room = None
            if not self._warned:
                log.warning("queue gate: cannot read %s/metrics (%s); admitting every request",
                            self.settings.metrics_url, exc)
                self._warned = True
            return
        with self._lock:
            self._room = max(0, self.settings.max_pending - pending)
            self._read_at = time.monotonic()

    def _poll(self) -> None:
        """Read every ``interval_s`` while requests arrive; idle (none for ``IDLE_AFTER_S``), read
        nothing until the next one, so an idle server spends no CPU on the gate."""
        while not self._stop.is_set():
            if time.monotonic() - self._last_admit > IDLE_AFTER_S:
                with self._lock:
                    self._room = None  # stale once idle: the next burst is admitted until read
                self._busy.clear()
                self._busy.wait()
                continue
            age = time.monotonic() - self._read_at  # a held batch may have just read
            if age >= self._interval():
                self.refresh()
                age = 0.0
            self._stop.wait(max(0.0, self._interval() - age))

    def _interval(self) -> float:
        """``interval_s`` while less than half the room is left, five times longer otherwise."""
        room = self._room
        pressed = room is not None and room < self.settings.max_pending / 2
        return self.settings.interval_s * (1 if pressed else 5)

    def admit(self, count: int) -> int:
        """How many of ``count`` requests (in order) go on; the rest are to be refused.

        With ``max_wait_s`` the batch is held until there is room for all of it, reading again
        every ``MIN_READ_AGE_S``, and only what is still without room at the deadline is refused.
        Holding is what makes overload cheap: while this step's instances wait, the requests
        behind them wait in Triton's own queue for this model, whose queue policy refuses the
        excess (timeout, ``max_queue_size``) in the server, without a round trip to this stub.
        """
        self._last_admit = now = time.monotonic()
        if not self._busy.is_set():
            self._busy.set()
        deadline = now + self.settings.max_wait_s
        while True:
            with self._lock:
                if self._room is None:
                    return count
                if self._room >= count:
                    self._room -= count
                    return count
                age = now - self._read_at
            if age <= MIN_READ_AGE_S:
                if now + MIN_READ_AGE_S - age > deadline:
                    break
                time.sleep(MIN_READ_AGE_S - age)
            self.refresh()
            now = time.monotonic()
            if now > deadline:
                break
        with self._lock:
            if self._room is None:
                return count
            admitted = min(count, self._room)
            self._room -= admitted
            return admitted

    def refusal(self) -> Overloaded:
        """The error a refused request gets."""
        return Overloaded(
            f"overloaded: {', '.join(self.settings.models)} already hold "
            f"{self.settings.max_pending} queued requests; retry later"
        )

    def close(self) -> None:
        self._stop.set()
        self._busy.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
