"""Per-model recovery: reload only the models whose Python stub died, within a restart budget.

Triton 2.51 neither restarts a dead stub nor reports it; ``ModelRecovery`` notices and reloads.
"""

from __future__ import annotations

import enum
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from tools.errors import ServerError

_INSTANCE_SUFFIX = re.compile(r"_\d+_\d+$")  # <model>_<group index>_<instance index>


def instance_model(instance: str) -> str:
    """The model of a Python-backend instance name: ``minilm_encoder_0_1`` -> ``minilm_encoder``."""
    return _INSTANCE_SUFFIX.sub("", instance)


@dataclass(frozen=True)
class RestartBudget:
    """How often one model may be reloaded before it is given up.

    Attributes:
        max_restarts: Reloads allowed within ``window_s``; the next death unloads the model.
        window_s: The sliding window, in seconds.
    """

    max_restarts: int = 3
    window_s: float = 120.0


class Outcome(enum.Enum):
    """What recovery did for one model."""

    RELOADED = "reloaded"
    RELOAD_FAILED = "reload failed"
    GAVE_UP = "given up"


@dataclass(frozen=True)
class RecoveryEvent:
    """One action of ``ModelRecovery``.

    Attributes:
        model: The model acted on.
        outcome: What was done.
        instances: The instances whose stubs died.
        restarts: Reloads of this model within the budget window, this one included.
        seconds: How long the reload or unload call took.
        detail: Triton's reason when a call failed, or why the model was given up.
    """

    model: str
    outcome: Outcome
    instances: tuple[str, ...]
    restarts: int
    seconds: float
    detail: str = ""

    def describe(self) -> str:
        """One line for people."""
        dead = ", ".join(self.instances)
        if self.outcome is Outcome.RELOADED:
            return (
                f"Python stub of {dead} died: reloaded model '{self.model}' in "
                f"{self.seconds:.1f} s (restart {self.restarts} in the budget window)"
            )
        if self.outcome is Outcome.RELOAD_FAILED:
            return f"Python stub of {dead} died: reloading model '{self.model}' failed: {self.detail}"
        return f"model '{self.model}' given up and left unloaded: {self.detail}"


class _Reloadable(Protocol):
    def stub_processes(self) -> dict[str, int]: ...

    def load_model(self, model: str, *, timeout_s: float = ...) -> None: ...

    def unload_model(self, model: str, *, unload_dependents: bool = ..., timeout_s: float = ...
                     ) -> None: ...


class ModelRecovery:
    """Watches a server's Python stubs; reloads the model of each one that died.

    Only that model is reloaded (Triton also reloads the ensembles using it, serving with the
    old ones until the new are ready); every other model keeps its instances. A model that
    needs more than ``budget.max_restarts`` reloads within ``budget.window_s`` is unloaded,
    with the ensembles that use it, and left so: it reports not ready while the rest serve.

    Args:
        server: A ``ModelControl`` (``EmbeddedServer.control``), or anything with its stub and
            load/unload methods.
        budget: The restart budget per model.
        clock: Monotonic seconds (a test may pass a fake).
        reload_timeout_s: How long one reload may take.
    """

    def __init__(
        self,
        server: _Reloadable,
        budget: RestartBudget = RestartBudget(),
        *,
        clock: Callable[[], float] = time.monotonic,
        reload_timeout_s: float = 60.0,
    ) -> None:
        self._server = server
        self.budget = budget
        self._clock = clock
        self._reload_timeout_s = reload_timeout_s
        self._stubs: dict[str, int] = server.stub_processes()
        self._restarts: dict[str, deque[float]] = {}
        self.given_up: dict[str, str] = {}
        self.total_restarts: dict[str, int] = {}

    @property
    def stubs(self) -> dict[str, int]:
        """The stubs being watched: model instance -> pid."""
        return dict(self._stubs)

    def dead_instances(self, current: Mapping[str, int] | None = None) -> list[str]:
        """Watched instances that have no stub any more.

        An instance whose stub was replaced by another process is not dead: Triton 2.51 never
        restarts a stub, so a new one means someone else reloaded the model (``tools tune``
        with the admin key); ``check`` watches the new stub instead.
        """
        current = self._server.stub_processes() if current is None else current
        return sorted(inst for inst in self._stubs if inst not in current)

    def check(self) -> list[RecoveryEvent]:
        """Look once; reload (or give up) each model that lost an instance.

        Returns:
            One event per model acted on (empty when every stub lives).
        """
        current = self._server.stub_processes()
        for inst, pid in current.items():  # reloaded by someone else: watch the new stubs
            if inst in self._stubs and self._stubs[inst] != pid:
                self._stubs[inst] = pid
        by_model: dict[str, list[str]] = {}
        for inst in self.dead_instances(current):
            by_model.setdefault(instance_model(inst), []).append(inst)
        events = [self._recover(model, tuple(insts)) for model, insts in sorted(by_model.items())]
        if events:
            self._refresh(by_model)
        return events

    def _recover(self, model: str, instances: tuple[str, ...]) -> RecoveryEvent:
        now = self._clock()
        window = self._restarts.setdefault(model, deque())
        while window and now - window[0] > self.budget.window_s:
            window.popleft()
        started = time.monotonic()
        if len(window) >= self.budget.max_restarts:
            reason = (
                f"its Python stub died {len(window) + 1} times within "
                f"{self.budget.window_s:g} s (budget: {self.budget.max_restarts} reloads)"
            )
            try:
                self._server.unload_model(model, unload_dependents=True)
            except ServerError as exc:
                reason += f"; unloading it failed: {exc}"
            self.given_up[model] = reason
            return RecoveryEvent(model, Outcome.GAVE_UP, instances, len(window),
                                 time.monotonic() - started, reason)
        window.append(now)
        self.total_restarts[model] = self.total_restarts.get(model, 0) + 1
        try:
            self._server.load_model(model, timeout_s=self._reload_timeout_s)
        except ServerError as exc:
            return RecoveryEvent(model, Outcome.RELOAD_FAILED, instances, len(window),
                                 time.monotonic() - started, str(exc))
        return RecoveryEvent(model, Outcome.RELOADED, instances, len(window),
                             time.monotonic() - started)

    def _refresh(self, models: Iterable[str]) -> None:
        """Watch the new stubs of the models acted on (none for a model given up)."""
        models = set(models)
        current = self._server.stub_processes()
        kept = {i: p for i, p in self._stubs.items() if instance_model(i) not in models}
        for inst, pid in current.items():
            model = instance_model(inst)
            if model in models and model not in self.given_up:
                kept[inst] = pid
        # a reload that failed leaves the dead instance watched, so the next look retries it
        for inst, pid in self._stubs.items():
            model = instance_model(inst)
            if model in models and model not in self.given_up and inst not in kept:
                kept[inst] = pid
        self._stubs = kept
