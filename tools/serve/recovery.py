"""Per-model recovery: reload only the models whose Python stub died, and never give up silently.

Triton 2.51 neither restarts a dead stub nor reports it; ``ModelRecovery`` notices and reloads.
Past the fast-restart budget a model is unloaded (with its ensembles) and retried with
exponential backoff; ``StatusEndpoint`` serves the state of every model (``/status``, JSON) and
Prometheus metrics (``/metrics``). Standard library only: this runs inside the serving images.
"""

from __future__ import annotations

import enum
import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from tools.errors import ServerError

_INSTANCE_SUFFIX = re.compile(r"_\d+_\d+$")  # <model>_<group index>_<instance index>
DEFAULT_METRICS_PORT = 8003


def instance_model(instance: str) -> str:
    """The model of a Python-backend instance name: ``minilm_encoder_0_1`` -> ``minilm_encoder``."""
    return _INSTANCE_SUFFIX.sub("", instance)


@dataclass(frozen=True)
class RestartBudget:
    """How often one model may be reloaded at once before it goes to backoff.

    Attributes:
        max_restarts: Reloads allowed within ``window_s``; the next death unloads the model.
        window_s: The sliding window, in seconds.
    """

    max_restarts: int = 3
    window_s: float = 120.0


@dataclass(frozen=True)
class Backoff:
    """When to retry a model that the restart budget unloaded.

    Retry ``n`` (from 0) comes ``initial_s * factor**n`` seconds after the last failure, at
    most ``max_s``. A model that stays up ``reset_after_s`` after a retry brought it back gets
    its fast-restart budget again; one that dies sooner goes straight back to backoff, one
    step further.

    Attributes:
        initial_s: Delay before the first retry.
        factor: Growth of the delay per retry.
        max_s: The longest delay.
        reset_after_s: Healthy time after a retry that forgets the backoff.
    """

    initial_s: float = 5.0
    factor: float = 2.0
    max_s: float = 300.0
    reset_after_s: float = 600.0

    def delay(self, retry: int) -> float:
        """Seconds before retry number ``retry`` (0 for the first)."""
        return min(self.max_s, self.initial_s * self.factor ** min(retry, 64))


STALE_GRACE_S = 30.0  # a replaced stub's old instance gets this long to finish its requests


class State(enum.Enum):
    """What a model is doing, as ``/status`` reports it."""

    READY = "ready"
    RECOVERING = "recovering"  # a stub died: reloading, or retrying at the next look
    BACKOFF = "backoff"  # unloaded past the restart budget, retried at next_retry_s
    DOWN = "down"  # not loaded: waits for a composing model in backoff


class Outcome(enum.Enum):
    """What recovery did for one model."""

    RELOADED = "reloaded"
    RELOAD_FAILED = "reload failed"
    BACKED_OFF = "unloaded, retrying with backoff"
    RETRIED = "loaded again by a retry"
    RETRY_FAILED = "retry failed"
    STALE_KILLED = "stale stub killed"


@dataclass(frozen=True)
class RecoveryEvent:
    """One action of ``ModelRecovery``.

    Attributes:
        model: The model acted on.
        outcome: What was done.
        instances: The instances whose stubs died (empty for a retry).
        restarts: Reloads of this model within the budget window, this one included.
        seconds: How long the reload, unload or retry took.
        detail: Triton's reason when a call failed, or why the model was unloaded.
        retry_in_s: When the model is in backoff: seconds until its next retry.
        dependents: Ensembles unloaded with it (``BACKED_OFF``) or loaded again (``RETRIED``).
    """

    model: str
    outcome: Outcome
    instances: tuple[str, ...]
    restarts: int
    seconds: float
    detail: str = ""
    retry_in_s: float | None = None
    dependents: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for people."""
        dead = ", ".join(self.instances)
        with_them = f" (with {', '.join(self.dependents)})" if self.dependents else ""
        if self.outcome is Outcome.RELOADED:
            return (
                f"Python stub of {dead} died: reloaded model '{self.model}' in "
                f"{self.seconds:.1f} s (restart {self.restarts} in the budget window)"
            )
        if self.outcome is Outcome.RELOAD_FAILED:
            return f"Python stub of {dead} died: reloading model '{self.model}' failed: {self.detail}"
        if self.outcome is Outcome.BACKED_OFF:
            return (f"model '{self.model}' unloaded{with_them}: {self.detail}; "
                    f"retrying in {self.retry_in_s:g} s")
        if self.outcome is Outcome.STALE_KILLED:
            return (f"stale Python stub of {dead} killed: {self.detail} (Triton had not "
                    f"unloaded the old instance of model '{self.model}')")
        if self.outcome is Outcome.RETRIED:
            return f"model '{self.model}' loaded again by a retry in {self.seconds:.1f} s{with_them}"
        return (f"retry of model '{self.model}' failed: {self.detail}; "
                f"next retry in {self.retry_in_s:g} s")


@dataclass(frozen=True)
class ModelStatus:
    """One model as ``/status`` reports it.

    Attributes:
        state: What it is doing.
        restarts: Reloads and retries of it so far (failed ones included).
        restart_failures: Those that failed.
        dead_stubs: Its instances whose stub is gone and not yet replaced.
        next_retry_s: Seconds until its next retry (or its composing model's), else None.
        reason: Why it is not ready (empty when it is).
    """

    state: State
    restarts: int = 0
    restart_failures: int = 0
    dead_stubs: tuple[str, ...] = ()
    next_retry_s: float | None = None
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        """The ``/status`` entry of the model."""
        return {"state": self.state.value, "restarts": self.restarts,
                "restart_failures": self.restart_failures, "dead_stubs": list(self.dead_stubs),
                "next_retry_s": None if self.next_retry_s is None else round(self.next_retry_s, 1),
                "reason": self.reason}


class _Reloadable(Protocol):
    def stub_processes(self) -> dict[str, int]: ...

    def repository_index(self) -> list[dict[str, Any]]: ...

    def load_model(self, model: str, *, timeout_s: float = ..., from_repository: bool = ...
                   ) -> None: ...

    def unload_model(self, model: str, *, unload_dependents: bool = ..., timeout_s: float = ...
                     ) -> None: ...

    def stale_stubs(self) -> dict[int, str]: ...

    def kill_stub(self, pid: int) -> None: ...


@dataclass
class _Track:
    """What recovery remembers of one model."""

    window: deque[float] = field(default_factory=deque)  # times of reloads in the budget window
    retries: int = 0  # backoff retries in this episode (0: not in an episode)
    retry_at: float | None = None  # in backoff: when the next retry is due
    back_since: float | None = None  # when the last retry brought it back
    failing: bool = False  # a stub died and the reload failed (retried at the next look)
    busy: bool = False  # a reload or retry call is under way
    reason: str = ""
    dependents: tuple[str, ...] = ()  # unloaded with it, loaded again after it


class ModelRecovery:
    """Watches a server's Python stubs; reloads the model of each one that died.

    Only that model is reloaded (Triton also reloads the ensembles using it, serving with the
    old ones until the new are ready); every other model keeps its instances. A model that
    needs more than ``budget.max_restarts`` reloads within ``budget.window_s`` is unloaded,
    with the ensembles that use it (they report not ready while the rest serve), and loaded
    again from its folder after ``backoff``'s delays, which grow while retries fail. After a
    retry brought it back, the ensembles unloaded with it are loaded too.

    ``check`` acts (from one thread); ``status`` may be read from any other.

    Args:
        server: A ``ModelControl`` (or anything with its stub, index and load/unload calls).
        budget: The fast-restart budget per model.
        backoff: Retry delays once the budget is spent.
        clock: Monotonic seconds (a test may pass a fake).
        reload_timeout_s: How long one reload may take.
        models: Every model served (ensembles too): the models ``status`` reports; the
            models of the watched stubs are always included.
        restarts: Restart counts to start from (a restarted server keeps its counters).
        restart_failures: Failed-restart counts to start from.
        stale_grace_s: How long a stub may run on after a newer stub of its instance started
            (the old instance finishing its requests) before it is killed as stale.
    """

    def __init__(
        self,
        server: _Reloadable,
        budget: RestartBudget = RestartBudget(),
        *,
        backoff: Backoff = Backoff(),
        clock: Callable[[], float] = time.monotonic,
        reload_timeout_s: float = 60.0,
        models: Iterable[str] = (),
        restarts: Mapping[str, int] | None = None,
        restart_failures: Mapping[str, int] | None = None,
        stale_grace_s: float = STALE_GRACE_S,
    ) -> None:
        self._server = server
        self.budget = budget
        self.backoff = backoff
        self._clock = clock
        self._reload_timeout_s = reload_timeout_s
        self._stubs: dict[str, int] = server.stub_processes()
        self._models = sorted(set(models) | {instance_model(i) for i in self._stubs})
        self._tracks: dict[str, _Track] = {}
        self.total_restarts: dict[str, int] = dict(restarts or {})
        self.restart_failures: dict[str, int] = dict(restart_failures or {})
        self._lock = threading.Lock()
        self._stale_grace_s = stale_grace_s
        self._stale_since: dict[int, float] = {}  # stale stub pid -> when it was first seen

    @property
    def stubs(self) -> dict[str, int]:
        """The stubs being watched: model instance -> pid."""
        return dict(self._stubs)

    @property
    def models(self) -> list[str]:
        """The models ``status`` reports."""
        return list(self._models)

    @property
    def given_up(self) -> dict[str, str]:
        """Models unloaded by recovery, in backoff or waiting for one that is: model -> reason
        (health checks leave them out)."""
        with self._lock:
            down = {m: t.reason for m, t in self._tracks.items() if t.retry_at is not None}
            for model, track in list(self._tracks.items()):
                if track.retry_at is not None:
                    down.update({d: f"unloaded with '{model}'" for d in track.dependents})
            return down

    def dead_instances(self, current: Mapping[str, int] | None = None) -> list[str]:
        """Watched instances that have no stub any more.

        An instance whose stub was replaced by another process is not dead: Triton 2.51 never
        restarts a stub, so a new one means someone else reloaded the model (``tools tune``
        with the admin key); ``check`` watches the new stub instead.
        """
        current = self._server.stub_processes() if current is None else current
        return sorted(inst for inst in self._stubs if inst not in current)

    def check(self) -> list[RecoveryEvent]:
        """Look once: reload (or back off) each model that lost an instance, retry each model
        whose backoff delay has passed, and forget the backoff of models up long enough.

        Returns:
            One event per model acted on (empty when nothing was done).
        """
        current = self._server.stub_processes()
        for inst, pid in current.items():  # reloaded by someone else: watch the new stubs
            if inst in self._stubs and self._stubs[inst] != pid:
                self._stubs[inst] = pid
        by_model: dict[str, list[str]] = {}
        for inst in self.dead_instances(current):
            by_model.setdefault(instance_model(inst), []).append(inst)
        events = [self._recover(model, tuple(insts)) for model, insts in sorted(by_model.items())]
        now = self._clock()
        due = sorted(m for m, t in self._tracks.items()
                     if t.retry_at is not None and t.retry_at <= now)
        events += [self._retry(model) for model in due]
        if events:
            self._refresh({e.model for e in events})
        self._forget_old_backoffs()
        return events + self._kill_stale(now)

    def _kill_stale(self, now: float) -> list[RecoveryEvent]:
        """Kill each stub a newer one replaced more than ``stale_grace_s`` ago.

        Triton 2.51 reloads a model by starting new instances and unloading the old version
        once its requests are done; when one stub of a model with several instances died under
        traffic, that never happens and the old version's other stubs run on with their memory
        (seen in the chaos soak: 2.4 GB after 8 such reloads in 30 minutes).
        """
        stale = self._server.stale_stubs()
        for pid in [p for p in self._stale_since if p not in stale]:
            del self._stale_since[pid]
        events = []
        for pid, instance in sorted(stale.items()):
            since = self._stale_since.setdefault(pid, now)
            if now - since < self._stale_grace_s:
                continue
            self._server.kill_stub(pid)
            del self._stale_since[pid]
            events.append(RecoveryEvent(
                instance_model(instance), Outcome.STALE_KILLED, (instance,), 0, 0.0,
                f"pid {pid} ran on {now - since:.0f} s after a newer stub of {instance} started"))
        return events

    # ---- acting

    def _track(self, model: str) -> _Track:
        with self._lock:  # status() iterates the tracks from another thread
            return self._tracks.setdefault(model, _Track())

    def _count_restart(self, model: str, failed: bool) -> None:
        with self._lock:
            self.total_restarts[model] = self.total_restarts.get(model, 0) + 1
            if failed:
                self.restart_failures[model] = self.restart_failures.get(model, 0) + 1

    def _recover(self, model: str, instances: tuple[str, ...]) -> RecoveryEvent:
        track, now = self._track(model), self._clock()
        window = track.window
        while window and now - window[0] > self.budget.window_s:
            window.popleft()
        if track.retries:
            return self._back_off(model, instances, (
                f"its Python stub died {now - (track.back_since or now):.0f} s after a retry "
                f"brought it back (within the {self.backoff.reset_after_s:g} s that reset "
                "the backoff)"))
        if len(window) >= self.budget.max_restarts:
            return self._back_off(model, instances, (
                f"its Python stub died {len(window) + 1} times within "
                f"{self.budget.window_s:g} s (budget: {self.budget.max_restarts} reloads)"))
        window.append(now)
        started = time.monotonic()
        with self._lock:
            track.busy = True
        try:
            self._server.load_model(model, timeout_s=self._reload_timeout_s)
        except ServerError as exc:
            self._count_restart(model, failed=True)
            with self._lock:
                track.busy, track.failing, track.reason = False, True, str(exc)
            return RecoveryEvent(model, Outcome.RELOAD_FAILED, instances, len(window),
                                 time.monotonic() - started, str(exc))
        self._count_restart(model, failed=False)
        with self._lock:
            track.busy, track.failing, track.reason = False, False, ""
        return RecoveryEvent(model, Outcome.RELOADED, instances, len(window),
                             time.monotonic() - started)

    def _ready_models(self) -> set[str] | None:
        try:
            return {e["name"] for e in self._server.repository_index() if e.get("state") == "READY"}
        except ServerError:
            return None

    def _back_off(self, model: str, instances: tuple[str, ...], reason: str) -> RecoveryEvent:
        """Unload ``model`` and its ensembles; schedule the next retry."""
        track, started = self._track(model), time.monotonic()
        ready_before = self._ready_models()
        try:
            self._server.unload_model(model, unload_dependents=True)
        except ServerError as exc:
            reason += f"; unloading it failed: {exc}"
        ready_after = self._ready_models()
        dependents = () if ready_before is None or ready_after is None else tuple(
            sorted(ready_before - ready_after - {model}))
        delay = self.backoff.delay(track.retries)
        with self._lock:
            track.window.clear()
            track.failing, track.back_since, track.reason = False, None, reason
            track.dependents = tuple(sorted(set(track.dependents) | set(dependents)))
            track.retry_at = self._clock() + delay
        return RecoveryEvent(model, Outcome.BACKED_OFF, instances, 0, time.monotonic() - started,
                             reason, delay, track.dependents)

    def _retry(self, model: str) -> RecoveryEvent:
        """Load ``model`` from its folder, then the ensembles unloaded with it."""
        track, started = self._track(model), time.monotonic()
        with self._lock:
            track.busy = True
        try:
            self._server.load_model(model, timeout_s=self._reload_timeout_s, from_repository=True)
        except ServerError as exc:
            self._count_restart(model, failed=True)
            delay = self.backoff.delay(track.retries + 1)
            with self._lock:
                track.busy, track.retries = False, track.retries + 1
                track.reason = f"retry {track.retries} failed: {exc}"
                track.retry_at = self._clock() + delay
            return RecoveryEvent(model, Outcome.RETRY_FAILED, (), 0, time.monotonic() - started,
                                 str(exc), delay)
        self._count_restart(model, failed=False)
        with self._lock:
            track.busy, track.retries = False, track.retries + 1
            track.retry_at, track.back_since, track.reason = None, self._clock(), ""
            dependents, track.dependents = track.dependents, ()
        return RecoveryEvent(model, Outcome.RETRIED, (), 0, time.monotonic() - started,
                             dependents=self._load_dependents(dependents))

    def _load_dependents(self, dependents: Iterable[str]) -> tuple[str, ...]:
        """Load the ensembles that were unloaded with a model that is back and are not loaded
        yet (Triton 2.51 loads them with it); one that still waits for another model in backoff
        stays with it, and one that fails to load gets a backoff of its own. Returns those
        that are back."""
        loaded = []
        waiting = {d for t in self._tracks.values() if t.retry_at is not None for d in t.dependents}
        ready = self._ready_models() or set()
        for dependent in dependents:
            if dependent in waiting:
                continue
            if dependent in ready:
                loaded.append(dependent)
                continue
            try:
                self._server.load_model(dependent, timeout_s=self._reload_timeout_s,
                                        from_repository=True)
            except ServerError as exc:
                track = self._track(dependent)
                with self._lock:
                    track.reason = f"loading it again failed: {exc}"
                    track.retry_at = self._clock() + self.backoff.delay(track.retries)
                continue
            loaded.append(dependent)
        return tuple(loaded)

    def _forget_old_backoffs(self) -> None:
        now = self._clock()
        with self._lock:
            for track in self._tracks.values():
                if (track.retry_at is None and track.back_since is not None
                        and now - track.back_since >= self.backoff.reset_after_s):
                    track.retries, track.back_since = 0, None

    def _refresh(self, models: set[str]) -> None:
        """Watch the new stubs of the models acted on (none for a model in backoff)."""
        current = self._server.stub_processes()
        unloaded = {m for m, t in self._tracks.items() if t.retry_at is not None}
        kept = {i: p for i, p in self._stubs.items() if instance_model(i) not in models}
        for inst, pid in current.items():
            model = instance_model(inst)
            if model in models and model not in unloaded:
                kept[inst] = pid
        # a reload that failed leaves the dead instance watched, so the next look retries it
        for inst, pid in self._stubs.items():
            model = instance_model(inst)
            if model in models and model not in unloaded and inst not in kept:
                kept[inst] = pid
        self._stubs = kept
        self._models = sorted(set(self._models) | {instance_model(i) for i in current})

    # ---- reporting

    def status(self, current: Mapping[str, int] | None = None) -> dict[str, ModelStatus]:
        """Every model's state now (safe to call from another thread than ``check``).

        Args:
            current: The stubs alive now (instance -> pid); read from the server by default.
                A watched stub missing from it makes its model ``recovering`` at once, before
                ``check`` sees it.
        """
        current = self._server.stub_processes() if current is None else current
        now = self._clock()
        with self._lock:
            dead: dict[str, list[str]] = {}
            for inst in dict(self._stubs):  # check() may replace entries meanwhile
                if inst not in current:
                    dead.setdefault(instance_model(inst), []).append(inst)
            waits: dict[str, list[tuple[str, float]]] = {}
            for model, track in self._tracks.items():
                if track.retry_at is not None:
                    for dependent in track.dependents:
                        waits.setdefault(dependent, []).append((model, track.retry_at))
            report = {}
            for model in sorted(set(self._models) | set(self._tracks)):
                track = self._tracks.get(model, _Track())
                counts = {"restarts": self.total_restarts.get(model, 0),
                          "restart_failures": self.restart_failures.get(model, 0),
                          "dead_stubs": tuple(sorted(dead.get(model, ())))}
                if track.retry_at is not None and not track.busy:
                    report[model] = ModelStatus(State.BACKOFF, **counts, reason=track.reason,
                                                next_retry_s=max(0.0, track.retry_at - now))
                elif model in waits:
                    blockers = sorted(waits[model], key=lambda w: w[1])
                    report[model] = ModelStatus(
                        State.DOWN, **counts, next_retry_s=max(0.0, blockers[0][1] - now),
                        reason="unloaded with " + ", ".join(f"'{m}'" for m, _ in blockers)
                        + " (loaded again after it)")
                elif track.busy or track.failing or counts["dead_stubs"]:
                    report[model] = ModelStatus(State.RECOVERING, **counts, reason=track.reason
                                                or "a Python stub died: reloading")
                else:
                    report[model] = ModelStatus(State.READY, **counts)
            return report


# ---- the status endpoint


def status_json(models: Mapping[str, ModelStatus]) -> dict[str, Any]:
    """``/status``: ``{"ready": bool, "models": {name: ModelStatus.to_json()}}``."""
    return {"ready": bool(models) and all(s.state is State.READY for s in models.values()),
            "models": {name: status.to_json() for name, status in sorted(models.items())}}


_METRICS = (
    ("triton_forge_model_restarts_total", "counter",
     "Restarts of the model by per-model recovery (reloads after a Python stub died, and "
     "backoff retries), failed ones included.", lambda s: s.restarts),
    ("triton_forge_model_restart_failures_total", "counter",
     "Restarts of the model that failed (Triton could not load it).", lambda s: s.restart_failures),
    ("triton_forge_model_down", "gauge",
     "1 while the model is unloaded: in backoff, or waiting for a composing model in backoff.",
     lambda s: int(s.state in (State.BACKOFF, State.DOWN))),
    ("triton_forge_model_next_retry_seconds", "gauge",
     "Seconds until the next retry of the model (or of the model it waits for); 0 when none "
     "is scheduled.", lambda s: s.next_retry_s or 0.0),
    ("triton_forge_model_dead_stubs", "gauge",
     "Instances of the model whose Python stub is dead and not yet replaced.",
     lambda s: len(s.dead_stubs)),
)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:.3f}".rstrip("0").rstrip(".")


def metrics_text(models: Mapping[str, ModelStatus]) -> str:
    """``/metrics`` in the Prometheus text format (0.0.4)."""
    lines = []
    for name, kind, help_text, value in _METRICS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines += [f'{name}{{model="{_label(m)}"}} {_number(value(s))}'
                  for m, s in sorted(models.items())]
    name = "triton_forge_model_state"
    lines += [f"# HELP {name} 1 for the model's current state (ready, recovering, backoff, down).",
              f"# TYPE {name} gauge"]
    for model, status in sorted(models.items()):
        lines += [f'{name}{{model="{_label(model)}",state="{state.value}"}} '
                  f"{int(status.state is state)}" for state in State]
    return "\n".join(lines) + "\n"


class StatusEndpoint:
    """HTTP ``GET /metrics`` (Prometheus text) and ``GET /status`` (JSON) of a server's
    models, in a daemon thread.

    Args:
        source: The models' status now (e.g. ``ModelRecovery.status``); it may be swapped
            (``source = ...``) while serving, as ``tools serve`` does after a whole-server restart.
        host: The address to listen on (that of Triton's own metrics).
        port: The port; 0 picks a free one.

    Raises:
        OSError: the address cannot be bound (from ``start``).
    """

    def __init__(self, source: Callable[[], Mapping[str, ModelStatus]], host: str,
                 port: int = DEFAULT_METRICS_PORT) -> None:
        self.source = source
        self._host, self._port = host, port
        self._httpd: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        """``http://host:port`` it listens on."""
        if self._httpd is None:
            raise ServerError("the status endpoint is not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> StatusEndpoint:
        """Listen and serve in a daemon thread."""
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                path = self.path.split("?", 1)[0]
                if path not in ("/metrics", "/status"):
                    self._send(404, "text/plain", b"not found: try /metrics or /status\n")
                    return
                try:
                    models = endpoint.source()
                except Exception as exc:  # noqa: BLE001 - a scrape must get an answer
                    self._send(500, "text/plain", f"status unavailable: {exc}\n".encode())
                    return
                if path == "/metrics":
                    self._send(200, "text/plain; version=0.0.4; charset=utf-8",
                               metrics_text(models).encode())
                else:
                    self._send(200, "application/json",
                               json.dumps(status_json(models)).encode())

            def _send(self, code: int, kind: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: object) -> None:
                pass  # scrapes every few seconds would flood the server log

        self._httpd = ThreadingHTTPServer((self._host, self._port), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, name="forge-metrics",
                         daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
