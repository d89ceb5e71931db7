"""Admission before work: a first pipeline step lets on only what the models after it can take.

Under overload the encoder's queue is full and Triton refuses new requests there, but only after
the tokenizer has tokenized them: at 4x offered load that work took 0.17 of this machine's 2
cores away from the encoder (docs/reliability.md). A ``QueueGate`` in the first step reads how
many requests the later models already hold queued (Triton's real-time gauge
``nv_inference_pending_request_count``) and how fast they finish them (the counter
``nv_inference_request_success``) on the metrics endpoint, polled by a background thread. By
Little's law their queue is worth ``pending / rate`` seconds; the gate keeps that under its delay
budget (``DRAIN_FACTOR`` times the pipeline's P99 objective, ``admission_p99_ms``) and under
``admission_max_pending``. Without ``max_wait_s`` it refuses the excess at once with UNAVAILABLE
(HTTP 503), before any tokenization. With it, a batch waits for room; the requests behind it
then wait in Triton's own queue for this step, which refuses the excess in the server (refusing
in the stub cost a stub round trip per request: goodput 0.59-0.84 against 0.74-0.87 holding).

Where the guards run (``tools serve``, the CPU image) they admit by latency first
(``tools/serve/admission.py``) and this gate seldom holds; it bounds the backlog where they do
not (tritonserver alone). It fails open: while the metrics endpoint cannot be read, every
request is admitted and the later models' own queue policies, or this step's, still bound it.
"""

from __future__ import annotations

import http.client
import logging
import math
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
# The later models' queue may hold at most this many times the P99 objective of work: what
# queues behind more is certain to be late. Not less: the gate bounds the backlog where no
# guard runs (tritonserver alone: tests, tools bench, the NGC image), and closed-loop clients
# there (60 users in tests/test_deploy_signal.py) wait on a slow, shared machine without being
# refused; the guards keep the P99 itself (tools/serve/admission.py).
DRAIN_FACTOR = 2.0
RATE_TAU_S = 0.5  # time constant of the later models' measured rate
# The rate is measured over windows of at least this much queued time (and one answer), not
# per reading: a first 10 ms slice between two batches answers nothing, and a rate of 0 made the
# room 1 request (a user's cross-encoder at 2 closed-loop users was refused; CI, fourth session).
RATE_WINDOW_S = 0.25
_GAUGE = re.compile(r'^(nv_inference_pending_request_count|nv_inference_request_success)'
                    r'\{model="([^"]+)",[^}]*\}\s+(\S+)$', re.M)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reading:
    """What one metrics reading says of the later models, summed over them and their versions.

    Attributes:
        pending: Requests queued, not yet executing.
        done: Requests they have answered successfully since they loaded (a counter).
    """

    pending: int
    done: float


def read_models(metrics_text: str, models: Sequence[str]) -> Reading:
    """The ``Reading`` of ``models`` in a Prometheus text from tritonserver's metrics port."""
    wanted, pending, done = set(models), 0.0, 0.0
    for family, name, value in _GAUGE.findall(metrics_text):
        if name in wanted:
            if family == "nv_inference_pending_request_count":
                pending += float(value)
            else:
                done += float(value)
    return Reading(int(pending), done)


def pending_requests(metrics_text: str, models: Sequence[str]) -> int:
    """Requests queued (not yet executing) at ``models``, summed over their versions."""
    return read_models(metrics_text, models).pending


@dataclass(frozen=True)
class AdmissionSettings:
    """The gate's parameters: ``admission_models`` (comma-separated), ``admission_max_pending``,
    ``admission_max_wait_ms`` and the P99 objective ``admission_p99_ms`` (rendered by
    ``tools build-repo`` from the SLO file)."""

    models: tuple[str, ...]
    max_pending: int
    metrics_url: str = DEFAULT_METRICS_URL
    interval_s: float = DEFAULT_INTERVAL_S
    max_wait_s: float = 0.0  # ``admission_max_wait_ms``: hold a batch this long for room
    p99_s: float | None = None  # ``admission_p99_ms``: the delay budget is DRAIN_FACTOR x it

    @property
    def delay_budget_s(self) -> float | None:
        """How long the later models' queue may take to drain, or None (no objective)."""
        return None if self.p99_s is None else DRAIN_FACTOR * self.p99_s

    @classmethod
    def from_parameters(cls, params: Mapping[str, str], model: str,
                        environ: Mapping[str, str] | None = None) -> AdmissionSettings | None:
        """The settings, or ``None`` when the config names no ``admission_models``.

        Raises:
            ConfigurationError: ``admission_max_pending`` is missing or not a positive integer,
                ``admission_max_wait_ms`` not a whole number, ``admission_p99_ms`` not positive.
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
        p99 = params.get("admission_p99_ms")
        try:
            p99_s = None if p99 is None else float(p99) / 1000
        except ValueError:
            p99_s = -1.0
        if p99_s is not None and not p99_s > 0:
            raise ConfigurationError(
                f"model '{model}': parameter 'admission_p99_ms' must be a positive number of "
                f"milliseconds, got {p99!r}")
        env = os.environ if environ is None else environ
        return cls(models, int(raw), env.get(METRICS_URL_ENV) or DEFAULT_METRICS_URL,
                   max_wait_s=int(wait) / 1000, p99_s=p99_s)


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

    The room of a reading is ``min(max_pending, rate × delay budget) - pending``, ``rate`` being
    the later models' measured throughput while they had a queue (until first measured, and
    without an objective, ``max_pending`` alone). ``admit(n)`` answers how many of ``n``
    requests to let through and counts them against that room, so a burst between two readings
    cannot overfill the queue. When the room runs out before the next reading, the gate reads
    again at once (at most every ``MIN_READ_AGE_S``) rather than refuse on a stale figure: most
    admitted requests have left the queue by then, and refusing on the count alone throttled 32
    closed-loop users at 1,100 req/s.

    Args:
        settings: The gate's parameters.
        fetch: Reads the metrics text of a URL (``MetricsReader`` by default).
        start: Start the polling thread (tests drive ``refresh`` and ``poll_once`` themselves).
        clock: Seconds, monotonic; ``sleep`` waits that many seconds (both injectable for tests).
    """

    def __init__(self, settings: AdmissionSettings,
                 fetch: Callable[[str], str] | None = None, start: bool = True,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.settings = settings
        self._fetch = fetch or MetricsReader()
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._room: int | None = None  # None: no reading yet (or the last one failed): fail open
        self.rate: float | None = None  # the later models' answers/s while they had a queue
        self._last: tuple[float, Reading] | None = None
        self._window = (0.0, 0.0)  # queued seconds and answers not yet in ``rate``
        self._stop = threading.Event()
        self._warned = False
        self._last_admit = -math.inf
        self._read_at = -math.inf
        self._busy = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="queue-gate", daemon=True)
        if start:
            self._thread.start()

    def refresh(self) -> None:
        """Read the metrics once; on failure the gate admits everything until a reading works."""
        try:
            reading = read_models(self._fetch(self.settings.metrics_url), self.settings.models)
        except Exception as exc:  # noqa: BLE001 - any failure to read means: fail open
            with self._lock:
                self._room, self._last = None, None
            if not self._warned:
                log.warning("queue gate: cannot read %s/metrics (%s); admitting every request",
                            self.settings.metrics_url, exc)
                self._warned = True
            return
        now = self._clock()
        with self._lock:
            self._measure(now, reading)
            self._room = max(0, self.limit() - reading.pending)
            self._read_at = now

    def _measure(self, now: float, reading: Reading) -> None:
        """Update ``rate`` from the answers since the last reading, if the models had a queue
        then (only a queue that never ran dry shows how fast they go), once that queued time
        makes a window of ``RATE_WINDOW_S`` with an answer in it (or four windows without)."""
        last, self._last = self._last, (now, reading)
        if last is None or reading.done < last[1].done:  # idle, or the models reloaded
            self._window = (0.0, 0.0)
            return
        if now <= last[0] or last[1].pending == 0:
            return
        seconds = self._window[0] + now - last[0]
        answers = self._window[1] + reading.done - last[1].done
        if seconds < RATE_WINDOW_S or (answers < 1 and seconds < 4 * RATE_WINDOW_S):
            self._window = (seconds, answers)
            return
        self._window = (0.0, 0.0)
        rate = answers / seconds
        keep = math.exp(-seconds / RATE_TAU_S)
        self.rate = rate if self.rate is None else keep * self.rate + (1 - keep) * rate

    def limit(self) -> int:
        """The most requests the later models may hold queued now."""
        budget = self.settings.delay_budget_s
        if budget is None or self.rate is None:
            return self.settings.max_pending
        return min(self.settings.max_pending, max(1, math.floor(self.rate * budget)))

    def poll_once(self) -> float | None:
        """One step of the polling thread: read if due; the seconds until the next step, or None
        when the gate is idle (no request for ``IDLE_AFTER_S``: it waits for the next one)."""
        now = self._clock()
        if now - self._last_admit > IDLE_AFTER_S:
            with self._lock:
                self._room, self._last = None, None  # stale once idle: admitted until read
            return None
        age = now - self._read_at  # a held batch may have just read
        if age >= self._interval():
            self.refresh()
            age = 0.0
        return max(0.0, self._interval() - age)

    def _poll(self) -> None:
        """Read every ``interval_s`` while requests arrive; idle, read nothing until the next
        one, so an idle server spends no CPU on the gate."""
        while not self._stop.is_set():
            wait = self.poll_once()
            if wait is None:
                self._busy.clear()
                self._busy.wait()
            else:
                self._stop.wait(wait)

    def _interval(self) -> float:
        """``interval_s`` while less than half the room is left, five times longer otherwise."""
        room = self._room
        pressed = room is not None and room < self.limit() / 2
        return self.settings.interval_s * (1 if pressed else 5)

    def admit(self, count: int) -> int:
        """How many of ``count`` requests (in order) go on; the rest are to be refused.

        With ``max_wait_s`` the batch is held until there is room for all of it, reading again
        every ``MIN_READ_AGE_S``, and only what is still without room at the deadline is refused.
        Holding is what makes overload cheap: while this step's instances wait, the requests
        behind them wait in Triton's own queue for this model, whose queue policy refuses the
        excess (timeout, ``max_queue_size``) in the server, without a round trip to this stub.
        """
        self._last_admit = now = self._clock()
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
                self._sleep(MIN_READ_AGE_S - age)
            self.refresh()
            now = self._clock()
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
            f"overloaded: {', '.join(self.settings.models)} already hold {self.limit()} queued "
            f"requests; retry later"
        )

    def close(self) -> None:
        self._stop.set()
        self._busy.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
