"""One running tritonserver as per-model recovery sees it: its Python stubs, Triton's
model-repository API behind the admin key, and the watch loop that reloads a model whose stub
died. Shared by the embedded server (``EmbeddedServer``) and the container supervisor
(``docker/triton_supervisor.py``), which runs the server of compose and Kubernetes.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tritonclient.utils import InferenceServerException

from tools import process
from tools.errors import ServerError
from tools.serve import health
from tools.serve.recovery import ModelRecovery, RecoveryEvent
from tools.serve.server_log import one_line

_GRPC_PREFIX = "triton-grpc-protocol-"
# Config parameter that makes a reload build new instances (see ModelControl.load_model).
RELOAD_PARAMETER = "triton_forge_reload"


def admin_headers(header: str, key: str) -> dict[str, str]:
    """Headers that open restricted admin APIs, for HTTP and gRPC alike (gRPC expects the key
    prefixed with ``triton-grpc-protocol-``)."""
    return {header: key, f"{_GRPC_PREFIX}{header}": key}


class ModelControl:
    """The admin calls and stubs of the tritonserver process ``pid`` serving HTTP at ``http_url``.

    Args:
        http_url: ``host:port`` of its HTTP endpoint.
        admin_header: The header name its restricted APIs expect (``--http-restricted-api``).
        admin_key: The key; never logged.
        pid: The tritonserver process (its Python stubs are its children).
        log_hint: Appended to errors (where the server log is).
    """

    def __init__(self, http_url: str, admin_header: str, admin_key: str, pid: int | None,
                 log_hint: str = "") -> None:
        self.http_url = http_url
        self._header = admin_header
        self._key = admin_key
        self.pid = pid
        self._log_hint = log_hint

    @property
    def admin_headers(self) -> dict[str, str]:
        """Headers that open the restricted admin APIs (``admin_headers``)."""
        return admin_headers(self._header, self._key)

    def stub_processes(self) -> dict[str, int]:
        """Python-backend stubs of the server: model instance name (``<model>_0_0``) -> pid."""
        return process.stub_processes(self.pid) if self.pid is not None else {}

    def stale_stubs(self) -> dict[int, str]:
        """Stubs a newer stub of the same instance replaced: pid -> instance (``process.stale_stubs``)."""
        return process.stale_stubs(self.pid) if self.pid is not None else {}

    def kill_stub(self, pid: int) -> None:
        """SIGKILL a stale stub of this server (no longer one, or gone: nothing to do, so a
        reused pid is never hit)."""
        if pid in self.stale_stubs():
            process.kill_one(pid)

    def repository_index(self) -> list[dict[str, Any]]:
        """Triton's ``/v2/repository/index``: name, version, state and reason of every model.

        Raises:
            ServerError: the server refused or did not answer.
        """
        with health.client(self.http_url, timeout_s=5.0) as triton:
            try:
                index = triton.get_model_repository_index(headers=self.admin_headers)
            except (InferenceServerException, OSError) as exc:
                raise ServerError(f"repository index of {self.http_url}: {exc}") from exc
        if not isinstance(index, list):
            raise ServerError(f"repository index of {self.http_url} is not a list: {index}")
        return index

    def load_model(self, model: str, *, timeout_s: float = 60.0,
                   from_repository: bool = False) -> None:
        """Load ``model`` again: Triton builds new instances, switches to them once ready, then
        unloads the old ones, and reloads the ensembles that use the model.

        Triton 2.51 skips a load whose model folder did not change since it was loaded, and a
        load with an identical config keeps the existing instances (its instance update),
        either of which would leave a dead stub in place. The loaded config is therefore sent
        with the load, with one config parameter more, ``RELOAD_PARAMETER`` (a new value each
        time; no model reads it), which makes Triton build every instance anew.

        Args:
            model: The model.
            timeout_s: How long Triton may take.
            from_repository: Load it as its folder holds it, for a model that is not loaded
                now (Triton has no config of it to send).

        Raises:
            ServerError: Triton refused or failed to load it (its reason in the message).
        """
        if from_repository:
            self._admin_call("load", model, timeout_s)
            return
        with health.client(self.http_url, timeout_s=timeout_s) as triton:
            try:
                config = triton.get_model_config(model)
            except (InferenceServerException, OSError) as exc:
                raise ServerError(f"config of model '{model}' on {self.http_url}: {exc}") from exc
        parameters = config.setdefault("parameters", {})
        parameters[RELOAD_PARAMETER] = {"string_value": secrets.token_hex(8)}
        self._admin_call("load", model, timeout_s, config=json.dumps(config))

    def unload_model(self, model: str, *, unload_dependents: bool = True, timeout_s: float = 30.0) -> None:
        """Unload ``model``: it answers no more requests and is not ready.

        Args:
            model: The model.
            unload_dependents: Also unload the ensembles that use it, so their readiness does
                not claim a pipeline that cannot run.
            timeout_s: How long Triton may take.

        Raises:
            ServerError: Triton refused or did not answer.
        """
        self._admin_call("unload", model, timeout_s, unload_dependents=unload_dependents)

    def _admin_call(self, action: str, model: str, timeout_s: float, **options: object) -> None:
        with health.client(self.http_url, timeout_s=timeout_s) as triton:
            call = triton.load_model if action == "load" else triton.unload_model
            try:
                call(model, headers=self.admin_headers, **options)
            except (InferenceServerException, OSError) as exc:
                message = exc.message() if isinstance(exc, InferenceServerException) else exc
                raise ServerError(
                    f"{action} of model '{model}' on {self.http_url} failed: "
                    f"{one_line(str(message))}{self._log_hint}"
                ) from exc

    def health(self, models: Iterable[str], probes: Mapping[str, health.Request] | None = None, *,
               synthetic: bool = False, skip: Iterable[str] = ()) -> health.HealthReport:
        """``health.check`` of ``models`` (``probes``: model -> request to send), leaving out
        the models in ``skip`` and, when there are some, every model Triton lists as unloading
        or unloaded (the ensembles unloaded with them)."""
        skipped = set(skip)
        if skipped:
            try:
                skipped |= {e["name"] for e in self.repository_index()
                            if e.get("state") == "UNLOADING"
                            or (e.get("state") == "UNAVAILABLE" and e.get("reason") == "unloaded")}
            except ServerError:
                pass
        return health.check(
            self.http_url, [m for m in models if m not in skipped],
            probes={m: r for m, r in (probes or {}).items() if m not in skipped},
            synthetic=synthetic, headers=self.admin_headers,
        )


@dataclass(frozen=True)
class WatchEnd:
    """Why ``watch`` returned: the server exited (``exit_code``), or it needs a restart."""

    reason: str
    exit_code: int | None = None


def watch(
    control: ModelControl,
    poll: Callable[[], int | None],
    models: Iterable[str],
    stubs: Mapping[str, int],
    *,
    interval_s: float = 1.0,
    probes: Mapping[str, health.Request] | None = None,
    probe_interval_s: float = 15.0,
    probe_failures: int = 3,
    recovery: ModelRecovery | None = None,
    on_event: Callable[[RecoveryEvent], None] | None = None,
) -> WatchEnd:
    """Block while the server runs well; return when it exited or needs a restart.

    Triton 2.51 neither restarts a crashed Python stub nor reports it through readiness.
    Without ``recovery``, a stub of ``stubs`` that is gone means a restart; with it, the models
    that lost a stub are reloaded (or given up) and watching goes on. With ``probes``,
    ``probe_failures`` failed health checks of ``models`` in a row, one every
    ``probe_interval_s``, also mean a restart (models given up are not probed).

    Args:
        control: The server's stubs and admin calls.
        poll: The server's exit code, or None while it runs.
        models: The models the health checks cover.
        stubs: The stubs to watch (a ``stub_processes()`` snapshot); ignored with ``recovery``,
            which keeps its own.
        interval_s: Seconds between looks at the processes.
        probes: Model -> KServe v2 JSON request sent by each health check (``{}``: readiness
            only); None: no health checks.
        probe_interval_s: Seconds between health checks.
        probe_failures: Failed health checks in a row that call for a restart.
        recovery: Reloads the models whose stub died, within its restart budget.
        on_event: Called with each recovery action (to report it).
    """
    models = list(models)
    failures, next_probe = 0, time.monotonic() + probe_interval_s
    while True:
        time.sleep(interval_s)
        code = poll()
        if code is not None:
            return WatchEnd(f"tritonserver exited (exit code {code})", code)
        if recovery is not None:
            for event in recovery.check():
                if on_event is not None:
                    on_event(event)
        else:
            dead = sorted(set(stubs) - set(control.stub_processes()))
            if dead:
                return WatchEnd(f"Python stub of model instance {', '.join(dead)} died "
                                "(tritonserver 2.51 neither restarts nor reports it)")
        if probes is not None and time.monotonic() >= next_probe:
            given_up = recovery.given_up if recovery is not None else {}
            report = control.health(models, probes, skip=given_up)
            failures = 0 if report.healthy else failures + 1
            next_probe = time.monotonic() + probe_interval_s
            if failures >= probe_failures:
                return WatchEnd(f"{failures} health checks in a row failed: "
                                f"{'; '.join(report.problems)}")
