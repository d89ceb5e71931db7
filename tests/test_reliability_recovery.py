"""Per-model recovery (tools/serve/recovery.py): a dead Python stub reloads only its model.

In the spirit of Triton's L0_lifecycle: real servers on the toy repository plus an ensemble,
stubs SIGKILLed under load; the restart budget is also checked with a fake server.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from tools.errors import ServerError
from tools.serve.faults import HttpLoad
from tools.serve.recovery import ModelRecovery, Outcome, RestartBudget, instance_model

pytestmark = pytest.mark.reliability

TOY = Path(__file__).parent / "fixtures" / "toy_repository"
CLIENT_TIMEOUT_S = 10.0
RECOVERY_TARGET_S = 5.0
_ENSEMBLE = """name: "toy_pipeline"
platform: "ensemble"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling {
  step [
    { model_name: "toy_double" model_version: -1
      input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "mid" } },
    { model_name: "toy_double" model_version: -1
      input_map { key: "INPUT0" value: "mid" } output_map { key: "OUTPUT0" value: "OUTPUT0" } }
  ]
}
"""
DOUBLE = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
TEXT = {"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["a cat"]}]}


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """The toy repository plus ``toy_pipeline``, an ensemble of toy_double twice."""
    repo = tmp_path / "repo"
    shutil.copytree(TOY, repo, ignore=shutil.ignore_patterns("__pycache__", "README.md"))
    (repo / "toy_pipeline" / "1").mkdir(parents=True)
    (repo / "toy_pipeline" / "config.pbtxt").write_text(_ENSEMBLE)
    return repo


class _Watcher:
    """``server.watch`` with recovery, in a thread, as ``tools serve`` runs it."""

    def __init__(self, server, budget: RestartBudget) -> None:
        self.recovery = ModelRecovery(server.control, budget)
        self.events = []
        self._thread = threading.Thread(target=self._run, args=(server,), daemon=True)
        self._thread.start()

    def _run(self, server) -> None:
        try:
            server.watch(self.recovery.stubs, interval_s=0.1, recovery=self.recovery,
                         on_event=self.events.append)
        except ServerError:
            pass  # the server was stopped at teardown


def _first_ok_after(records, t: float) -> float | None:
    starts = [r.start_s for r in records if r.ok and r.start_s > t]
    return min(starts) - t if starts else None


@pytest.mark.server
def test_a_killed_stub_reloads_only_its_model_while_another_model_under_load_never_fails(
    server_factory, repository
):
    server = server_factory(repository, exit_timeout_s=3)
    watcher = _Watcher(server, RestartBudget(max_restarts=3, window_s=60))
    other = HttpLoad(server.http_url, "toy_text", [TEXT], CLIENT_TIMEOUT_S).start(
        users=4, duration_s=8)
    pipeline = HttpLoad(server.http_url, "toy_pipeline", [DOUBLE], CLIENT_TIMEOUT_S).start(
        users=4, duration_s=8)
    untouched = {i: p for i, p in server.control.stub_processes().items()
                 if not i.startswith("toy_double")}
    time.sleep(2.0)

    killed_at = time.monotonic()
    os.kill(server.control.stub_processes()["toy_double_0_0"], signal.SIGKILL)
    other_records, pipeline_records = other.join(), pipeline.join()

    assert [e.outcome for e in watcher.events] == [Outcome.RELOADED]
    assert watcher.events[0].model == "toy_double"
    assert len(other_records) > 200 and [r for r in other_records if not r.ok] == []
    recovered_after = _first_ok_after(pipeline_records, killed_at)
    assert recovered_after is not None and recovered_after < RECOVERY_TARGET_S
    late = [r for r in pipeline_records if r.start_s > killed_at + RECOVERY_TARGET_S and not r.ok]
    assert late == [], "the ensemble answers again once its composing model is reloaded"
    assert max(r.latency_ms for r in pipeline_records + other_records) < CLIENT_TIMEOUT_S * 1000
    stubs = server.control.stub_processes()
    assert {i: p for i, p in stubs.items() if not i.startswith("toy_double")} == untouched
    assert "toy_double_0_0" in stubs


@pytest.mark.server
def test_a_model_that_keeps_crashing_is_left_unloaded_and_reported_while_the_rest_serve(
    server_factory, repository
):
    server = server_factory(repository, exit_timeout_s=3)
    watcher = _Watcher(server, RestartBudget(max_restarts=2, window_s=60))
    other = HttpLoad(server.http_url, "toy_text", [TEXT], CLIENT_TIMEOUT_S).start(
        users=2, duration_s=60)
    try:
        for death in range(3):
            deadline = time.monotonic() + 15
            while "toy_double_0_0" not in watcher.recovery.stubs or len(watcher.events) < death:
                assert time.monotonic() < deadline, watcher.events
                time.sleep(0.05)
            os.kill(watcher.recovery.stubs["toy_double_0_0"], signal.SIGKILL)
            deadline = time.monotonic() + 15
            while len(watcher.events) <= death:
                assert time.monotonic() < deadline, watcher.events
                time.sleep(0.05)
    finally:
        records = other.join(timeout_s=0)

    assert [e.outcome for e in watcher.events] == [
        Outcome.RELOADED, Outcome.RELOADED, Outcome.GAVE_UP]
    assert "died 3 times within 60 s" in watcher.events[-1].detail
    assert watcher.recovery.given_up.keys() == {"toy_double"}
    deadline = time.monotonic() + 10  # Triton unloads in the background
    while "UNLOADING" in (
        index := {e["name"]: e["state"] for e in server.control.repository_index()}
    ).values() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert index["toy_double"] == "UNAVAILABLE" and index["toy_pipeline"] == "UNAVAILABLE"
    assert index["toy_text"] == index["toy_classify"] == "READY"
    problems = server.control.health(server.models).problems
    assert "model 'toy_double' not ready" in "; ".join(problems)
    assert "model 'toy_pipeline' not ready" in "; ".join(problems)
    assert len(records) > 50 and [r for r in records if not r.ok] == []
    assert server.control.health(server.models, skip=watcher.recovery.given_up).healthy


class _FakeServer:
    """Stubs that the test kills by hand; load and unload calls recorded."""

    def __init__(self) -> None:
        self.stubs = {"a_0_0": 1, "a_0_1": 2, "b_0_0": 3}
        self._configured = list(self.stubs)  # a load starts every configured instance
        self.calls: list[tuple[str, str]] = []
        self.fail_load = False
        self._next = 100

    def stub_processes(self) -> dict[str, int]:
        return dict(self.stubs)

    def load_model(self, model: str, *, timeout_s: float = 60) -> None:
        self.calls.append(("load", model))
        if self.fail_load:
            raise ServerError(f"load of model '{model}' failed: boom")
        for inst in [i for i in self._configured if instance_model(i) == model]:
            self._next += 1
            self.stubs[inst] = self._next

    def unload_model(self, model: str, *, unload_dependents: bool = True,
                     timeout_s: float = 30) -> None:
        self.calls.append(("unload", model))
        self.stubs = {i: p for i, p in self.stubs.items() if instance_model(i) != model}


def test_instance_names_map_to_their_model():
    assert instance_model("minilm_encoder_0_0") == "minilm_encoder"
    assert instance_model("model_2_0_11") == "model_2"


def test_recovery_reloads_each_model_once_however_many_of_its_instances_died():
    server = _FakeServer()
    recovery = ModelRecovery(server, RestartBudget(3, 60))
    del server.stubs["a_0_0"], server.stubs["a_0_1"]

    events = recovery.check()

    assert [(e.model, e.outcome, e.instances) for e in events] == [
        ("a", Outcome.RELOADED, ("a_0_0", "a_0_1"))]
    assert server.calls == [("load", "a")]
    assert recovery.check() == [] and recovery.stubs == server.stubs


def test_recovery_gives_up_past_the_budget_and_forgets_deaths_older_than_the_window():
    now = [0.0]
    server = _FakeServer()
    recovery = ModelRecovery(server, RestartBudget(2, 60), clock=lambda: now[0])
    outcomes = []
    for t in (0, 10, 80, 90, 95):  # the death at 0 leaves the window before the one at 80
        now[0] = t
        server.stubs.pop("b_0_0", None)  # died (a reload below starts it again)
        outcomes.append(recovery.check()[0].outcome)

    assert outcomes == [Outcome.RELOADED, Outcome.RELOADED, Outcome.RELOADED,
                        Outcome.RELOADED, Outcome.GAVE_UP]
    assert server.calls[-1] == ("unload", "b") and "b" in recovery.given_up
    assert "b_0_0" not in recovery.stubs and recovery.check() == []
    assert recovery.total_restarts == {"b": 4}


def test_a_stub_replaced_by_someone_elses_reload_is_watched_anew_and_not_reloaded():
    # tools tune (with the admin key) reloads models on a compose server: new stubs, same names.
    server = _FakeServer()
    recovery = ModelRecovery(server, RestartBudget(1, 60))
    server.stubs["b_0_0"] = 4242

    assert recovery.check() == [] and server.calls == []
    assert recovery.stubs["b_0_0"] == 4242 and recovery.total_restarts == {}
    del server.stubs["b_0_0"]  # and when that new stub dies, it is this model's death
    assert [e.outcome for e in recovery.check()] == [Outcome.RELOADED]


def test_a_failed_reload_is_retried_at_the_next_look_and_counts_against_the_budget():
    server = _FakeServer()
    recovery = ModelRecovery(server, RestartBudget(1, 60))
    server.fail_load = True
    del server.stubs["b_0_0"]

    first, second = recovery.check(), recovery.check()

    assert first[0].outcome is Outcome.RELOAD_FAILED and "boom" in first[0].detail
    assert second[0].outcome is Outcome.GAVE_UP
    assert server.calls == [("load", "b"), ("unload", "b")]
