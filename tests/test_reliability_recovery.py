"""Per-model recovery (tools/serve/recovery.py): a dead Python stub reloads only its model.

In the spirit of Triton's L0_lifecycle: real servers on the toy repository plus an ensemble,
stubs SIGKILLed under load (the integration tier); the restart policy is also checked with a
fake server (the fast tier).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from tools import process
from tools.cli import cli
from tools.errors import ServerError
from tools.serve import health
from tools.serve.faults import HttpLoad
from tools.net import free_ports
from tools.serve.recovery import (
    Backoff,
    ModelRecovery,
    ModelStatus,
    Outcome,
    RestartBudget,
    State,
    StatusEndpoint,
    instance_model,
    metrics_text,
    status_json,
)
from waits import wait_until


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
    """``server.watch`` with recovery, in a thread, as ``tools serve`` runs it, with the model
    status endpoint on a free port."""

    def __init__(self, server, budget: RestartBudget, backoff: Backoff = Backoff(),
                 stale_grace_s: float = 30.0) -> None:
        self.recovery = ModelRecovery(server.control, budget, backoff=backoff,
                                      models=server.models, stale_grace_s=stale_grace_s)
        self.events = []
        self.endpoint = StatusEndpoint(self.recovery.status, "127.0.0.1", 0).start()
        self._thread = threading.Thread(target=self._run, args=(server,), daemon=True)
        self._thread.start()

    def _run(self, server) -> None:
        try:
            server.watch(self.recovery.stubs, interval_s=0.1, recovery=self.recovery,
                         on_event=self.events.append)
        except ServerError:
            pass  # the server was stopped at teardown
        finally:
            self.endpoint.stop()

    def outcomes(self) -> list[Outcome]:
        return [e.outcome for e in self.events]

    def status(self) -> dict:
        with urllib.request.urlopen(f"{self.endpoint.url}/status", timeout=5) as response:
            return json.loads(response.read())["models"]

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"{self.endpoint.url}/metrics", timeout=5) as response:
            lines = response.read().decode().splitlines()
        return {k: float(v) for k, v in (l.rsplit(" ", 1) for l in lines if not l.startswith("#"))}


def _first_ok_after(records, t: float) -> float | None:
    starts = [r.start_s for r in records if r.ok and r.start_s > t]
    return min(starts) - t if starts else None


def _ok(records) -> int:
    return sum(1 for r in list(records) if r.ok)


@pytest.mark.reliability
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
    untouched = {i: p for i, p in server.control.stub_processes().items() if not i.startswith("toy_double")}
    wait_until(lambda: _ok(other.records) >= 20 and _ok(pipeline.records) >= 20, 10,
               "both loads to get 20 answers each")

    killed_at = time.monotonic()
    os.kill(server.control.stub_processes()["toy_double_0_0"], signal.SIGKILL)
    other_records, pipeline_records = other.join(), pipeline.join()

    assert watcher.outcomes() == [Outcome.RELOADED]
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
    assert watcher.status()["toy_double"] == {"state": "ready", "restarts": 1,
                                              "restart_failures": 0, "dead_stubs": [],
                                              "next_retry_s": None, "reason": ""}


@pytest.mark.reliability
@pytest.mark.server
def test_no_stub_of_a_reloaded_two_instance_model_runs_on_beside_its_replacement(
    server_factory, repository
):
    # Triton 2.51 under traffic: one of two stubs killed, the reload starts both anew and may
    # never unload the old version, whose surviving stub then runs on (docs/reliability.md)
    config = repository / "toy_double" / "config.pbtxt"
    config.write_text(config.read_text().replace("count: 1", "count: 2"))
    server = server_factory(repository, exit_timeout_s=3)
    watcher = _Watcher(server, RestartBudget(max_restarts=3, window_s=60), stale_grace_s=2.0)
    slow = dict(DOUBLE, inputs=DOUBLE["inputs"] + [
        {"name": "DELAY_MS", "shape": [1, 1], "datatype": "FP32", "data": [300]}])
    load = HttpLoad(server.http_url, "toy_double", [slow], CLIENT_TIMEOUT_S).start(
        users=6, duration_s=12)
    wait_until(lambda: _ok(load.records) >= 10, 10, "the load to get 10 answers")
    before = server.control.stub_processes()
    os.kill(before["toy_double_0_0"], signal.SIGKILL)
    wait_until(lambda: Outcome.RELOADED in watcher.outcomes(), 10, "the reload")
    wait_until(lambda: not server.control.stale_stubs(), 15,
               "no stub of the old version beside the new ones")
    load.join()
    stubs = {i: p for i, p in server.control.stub_processes().items()
             if instance_model(i) == "toy_double"}
    killed = [e for e in watcher.events if e.outcome is Outcome.STALE_KILLED]
    print(f"stale stubs killed: {[e.describe() for e in killed]}")

    assert sorted(stubs) == ["toy_double_0_0", "toy_double_0_1"]
    assert before["toy_double_0_1"] not in stubs.values(), "both instances are new"
    assert before["toy_double_0_1"] not in [p.pid for p in process.family(server.pid)], \
        "the old version's surviving stub is gone (unloaded by Triton, or killed as stale)"
    assert watcher.status()["toy_double"]["restarts"] == 1, "a stale stub is not a restart"
    assert {e.instances for e in killed} <= {("toy_double_0_1",)}


def _ready(server, model: str) -> bool:
    with health.client(server.http_url, 5) as triton:
        return triton.is_model_ready(model)


@pytest.mark.reliability
@pytest.mark.server
def test_a_model_that_keeps_crashing_backs_off_and_a_retry_brings_it_back_while_the_rest_serve(
    server_factory, repository
):
    server = server_factory(repository, exit_timeout_s=3)
    watcher = _Watcher(server, RestartBudget(max_restarts=2, window_s=60),
                       Backoff(initial_s=2, factor=2, max_s=30))
    other = HttpLoad(server.http_url, "toy_text", [TEXT], CLIENT_TIMEOUT_S).start(
        users=2, duration_s=120)
    model_py = repository / "toy_double" / "1" / "model.py"
    source = model_py.read_text()
    try:
        for death in range(3):
            wait_until(lambda: "toy_double_0_0" in watcher.recovery.stubs
                       and len(watcher.events) == death, 15,
                       lambda: f"a live toy_double stub after {death} deaths; events {watcher.events}")
            os.kill(watcher.recovery.stubs["toy_double_0_0"], signal.SIGKILL)
            wait_until(lambda: len(watcher.events) > death, 15,
                       lambda: f"the watcher to see death {death + 1}; events {watcher.events}")
        # while it is unloaded its code breaks: the first retry fails with Triton's reason
        model_py.write_text('raise RuntimeError("broken on purpose")\n')
        in_backoff, metrics_down = watcher.status(), watcher.metrics()
        ready_down = {m: _ready(server, m) for m in ("toy_double", "toy_pipeline", "toy_text")}
        wait_until(lambda: len(watcher.events) > 3, 15,
                   lambda: f"the first retry of the broken model; events {watcher.events}")
        failed_retry = watcher.status()["toy_double"]
        model_py.write_text(source)
        wait_until(lambda: len(watcher.events) > 4, 30, lambda: "a retry of the mended model; "
                   f"events {watcher.events}, status {watcher.status()}")
        back, metrics_up = watcher.status(), watcher.metrics()
        answer = _infer_double(server)
    finally:
        model_py.write_text(source)
        records = other.join(timeout_s=0)

    assert watcher.outcomes() == [Outcome.RELOADED, Outcome.RELOADED, Outcome.BACKED_OFF,
                                  Outcome.RETRY_FAILED, Outcome.RETRIED]
    assert "died 3 times within 60 s" in watcher.events[2].detail
    assert watcher.events[2].dependents == ("toy_pipeline",)
    assert in_backoff["toy_double"]["state"] == "backoff"
    assert 0 < in_backoff["toy_double"]["next_retry_s"] <= 2
    assert in_backoff["toy_pipeline"]["state"] == "down"
    assert in_backoff["toy_text"]["state"] == in_backoff["toy_classify"]["state"] == "ready"
    assert ready_down == {"toy_double": False, "toy_pipeline": False, "toy_text": True}
    assert metrics_down['triton_forge_model_down{model="toy_double"}'] == 1
    assert metrics_down['triton_forge_model_down{model="toy_pipeline"}'] == 1
    assert metrics_down['triton_forge_model_down{model="toy_text"}'] == 0
    assert 0 < metrics_down['triton_forge_model_next_retry_seconds{model="toy_double"}'] <= 2
    assert "broken on purpose" in watcher.events[3].detail  # Triton's own reason
    assert watcher.events[3].retry_in_s == 4
    assert failed_retry["state"] == "backoff" and "broken on purpose" in failed_retry["reason"]
    assert {m: s["state"] for m, s in back.items()} == dict.fromkeys(
        ["toy_classify", "toy_double", "toy_pipeline", "toy_text"], "ready")
    assert metrics_up['triton_forge_model_down{model="toy_double"}'] == 0
    assert metrics_up['triton_forge_model_down{model="toy_pipeline"}'] == 0
    assert metrics_up['triton_forge_model_next_retry_seconds{model="toy_double"}'] == 0
    # every restart counted: two reloads, the failed retry and the one that brought it back
    assert metrics_up['triton_forge_model_restarts_total{model="toy_double"}'] == 4
    assert metrics_up['triton_forge_model_restart_failures_total{model="toy_double"}'] == 1
    assert answer == [2.0, 4.0, 6.0, 8.0]
    assert server.control.health(server.models).healthy
    assert len(records) > 50 and [r for r in records if not r.ok] == []


def _infer_double(server) -> list[float]:
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/toy_pipeline/infer", data=json.dumps(DOUBLE).encode(),
        headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return [x / 2 for x in json.loads(response.read())["outputs"][0]["data"]]


@pytest.mark.reliability
@pytest.mark.server
def test_tools_serve_retries_a_model_past_its_budget_and_reports_it_on_its_status_port(
    toy_repository, tmp_path
):
    (forge,) = free_ports(1)
    serve = subprocess.Popen(
        [sys.executable, "-m", "tools.cli", "serve", "--repository", str(toy_repository),
         "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--exit-timeout", "2",
         "--forge-metrics-port", str(forge), "--model-restarts", "0", "--retry-backoff", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines: list[str] = []
    errors: list[str] = []
    readers = [threading.Thread(target=lambda: lines.extend(serve.stdout), daemon=True),
               threading.Thread(target=lambda: errors.extend(serve.stderr), daemon=True)]
    for reader in readers:
        reader.start()
    url = f"http://127.0.0.1:{forge}"
    try:
        wait_until(lambda: any(l.startswith("status ") for l in lines), 120,
                   lambda: f"tools serve to print its status endpoint; stderr {errors}")
        (server_pid,) = [int(l.split()[3].rstrip(",")) for l in lines if l.startswith("tritonserver ready")]
        state = lambda: json.loads(urllib.request.urlopen(f"{url}/status", timeout=5).read())  # noqa: E731
        ready_before = state()
        os.kill(process.stub_processes(server_pid)["toy_text_0_0"], signal.SIGKILL)
        wait_until(lambda: state()["models"]["toy_text"]["state"] == "backoff", 20,
                   lambda: f"toy_text in backoff; status {state()}, stderr {errors}")
        in_backoff = state()
        wait_until(lambda: state()["ready"], 20,
                   lambda: f"every model ready again; status {state()}, stderr {errors}")
        back = state()
        # the status port reports the model ready before the watcher prints the retry's line
        wait_until(lambda: any("loaded again by a retry" in l for l in errors), 10,
                   lambda: f"the retry's line on stderr; stderr {errors}")
        serve.send_signal(signal.SIGTERM)
        code = serve.wait(timeout=60)
        for reader in readers:  # every line the server wrote before it exited
            reader.join(timeout=10)
    finally:
        if serve.poll() is None:
            serve.kill()
        process.stop(serve.pid, 10)

    assert f"status   {url}/status, {url}/metrics (model recovery)\n" in lines
    assert ready_before["ready"] and set(ready_before["models"]) == {
        "toy_classify", "toy_double", "toy_text"}
    assert in_backoff["ready"] is False and in_backoff["models"]["toy_double"]["state"] == "ready"
    assert back["models"]["toy_text"]["restarts"] == 1
    assert any("model 'toy_text' unloaded" in l and "retrying in 1 s" in l for l in errors)
    assert any("model 'toy_text' loaded again by a retry" in l for l in errors)
    assert code == 0, errors


def test_tools_serve_refuses_a_status_port_in_use_in_one_line_before_starting_a_server(
    toy_repository
):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["serve", "--repository", str(toy_repository),
                                          "--forge-metrics-port", str(port)])

    assert result.exit_code == 1
    assert f"port {port} (forge metrics) is already in use on 127.0.0.1" in result.output
    assert "tritonserver ready" not in result.output


class _FakeServer:
    """Stubs that the test kills by hand; load and unload calls recorded; ``pipe_a`` is an
    ensemble of ``a``, unloaded with it."""

    def __init__(self) -> None:
        self.stubs = {"a_0_0": 1, "a_0_1": 2, "b_0_0": 3}
        self._configured = list(self.stubs)  # a load starts every configured instance
        self.loaded = {"a", "b", "pipe_a"}
        self.calls: list[tuple[str, str]] = []
        self.fail_load: set[str] = set()
        self._next = 100
        self.stale: dict[int, str] = {}  # old stubs a reload left running: pid -> instance
        self.killed: list[int] = []

    def stub_processes(self) -> dict[str, int]:
        return dict(self.stubs)

    def stale_stubs(self) -> dict[int, str]:
        return dict(self.stale)

    def kill_stub(self, pid: int) -> None:
        self.killed.append(pid)
        self.stale.pop(pid, None)

    def repository_index(self) -> list[dict]:
        return [{"name": m, "state": "READY" if m in self.loaded else "UNAVAILABLE"}
                for m in ("a", "b", "pipe_a")]

    def load_model(self, model: str, *, timeout_s: float = 60, from_repository: bool = False
                   ) -> None:
        self.calls.append(("load" if not from_repository else "load from folder", model))
        if model in self.fail_load:
            raise ServerError(f"load of model '{model}' failed: boom")
        self.loaded.add(model)
        for inst in [i for i in self._configured if instance_model(i) == model]:
            self._next += 1
            self.stubs[inst] = self._next

    def unload_model(self, model: str, *, unload_dependents: bool = True,
                     timeout_s: float = 30) -> None:
        self.calls.append(("unload", model))
        self.loaded -= {model, "pipe_a"} if model == "a" else {model}
        self.stubs = {i: p for i, p in self.stubs.items() if instance_model(i) != model}


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _kill(server: _FakeServer, model: str) -> None:
    for inst in [i for i in server.stubs if instance_model(i) == model]:
        del server.stubs[inst]


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


def test_past_the_budget_a_model_backs_off_and_deaths_older_than_the_window_are_forgotten():
    clock, server = _Clock(), _FakeServer()
    recovery = ModelRecovery(server, RestartBudget(2, 60), clock=clock)
    outcomes = []
    for t in (0, 10, 80, 90, 95):  # the death at 0 leaves the window before the one at 80
        clock.now = t
        _kill(server, "b")  # died (a reload below starts it again)
        outcomes.append(recovery.check()[0].outcome)

    assert outcomes == [Outcome.RELOADED, Outcome.RELOADED, Outcome.RELOADED,
                        Outcome.RELOADED, Outcome.BACKED_OFF]
    assert server.calls[-1] == ("unload", "b") and "b" in recovery.given_up
    assert "b_0_0" not in recovery.stubs
    assert recovery.total_restarts == {"b": 4}


def test_a_model_in_backoff_is_retried_after_doubling_delays_capped_and_counted():
    clock, server = _Clock(), _FakeServer()
    backoff = Backoff(initial_s=5, factor=2, max_s=30, reset_after_s=600)
    recovery = ModelRecovery(server, RestartBudget(0, 60), backoff=backoff, clock=clock)
    server.fail_load.add("b")
    _kill(server, "b")

    first = recovery.check()
    assert [(e.outcome, e.retry_in_s) for e in first] == [(Outcome.BACKED_OFF, 5)]
    retries = []
    for _ in range(400):  # one look a second for 400 s; every retry fails
        clock.now += 1
        retries += [(clock.now, e.outcome, e.retry_in_s) for e in recovery.check()]

    assert [t for t, _, _ in retries][:6] == [5, 15, 35, 65, 95, 125]  # +10, +20, then 30 cap
    assert {o for _, o, _ in retries} == {Outcome.RETRY_FAILED}
    assert all(e[2] == 30 for e in retries[2:])
    status = recovery.status()["b"]
    assert status.state is State.BACKOFF and status.restarts == len(retries)
    assert status.restart_failures == len(retries) and "boom" in status.reason
    assert 0 < status.next_retry_s <= 30

    server.fail_load.clear()
    clock.now += status.next_retry_s
    (back,) = recovery.check()

    assert back.outcome is Outcome.RETRIED and server.calls[-1] == ("load from folder", "b")
    assert recovery.status()["b"] == ModelStatus(State.READY, len(retries) + 1, len(retries))
    assert recovery.stubs["b_0_0"] == server.stubs["b_0_0"] and recovery.given_up == {}


def test_a_model_that_dies_soon_after_a_retry_backs_off_further_and_stays_up_to_reset():
    clock, server = _Clock(), _FakeServer()
    backoff = Backoff(initial_s=5, factor=2, max_s=300, reset_after_s=100)
    recovery = ModelRecovery(server, RestartBudget(1, 60), backoff=backoff, clock=clock)

    def die_and_look() -> list:
        _kill(server, "b")
        return [(e.outcome, e.retry_in_s) for e in recovery.check()]

    assert die_and_look() == [(Outcome.RELOADED, None)]
    assert die_and_look() == [(Outcome.BACKED_OFF, 5)]
    clock.now = 5
    assert [e.outcome for e in recovery.check()] == [Outcome.RETRIED]
    clock.now = 50  # back for 45 s only: no fast reload, the next delay
    assert die_and_look() == [(Outcome.BACKED_OFF, 10)]
    clock.now = 60
    assert [e.outcome for e in recovery.check()] == [Outcome.RETRIED]
    clock.now = 160  # up 100 s after the retry: the backoff and the budget start over
    recovery.check()
    assert die_and_look() == [(Outcome.RELOADED, None)]
    assert die_and_look() == [(Outcome.BACKED_OFF, 5)]


def test_ensembles_unloaded_with_a_model_are_down_until_its_retry_loads_them_again():
    clock, server = _Clock(), _FakeServer()
    recovery = ModelRecovery(server, RestartBudget(0, 60), backoff=Backoff(5), clock=clock,
                             models=["a", "b", "pipe_a"])
    _kill(server, "a")

    (event,) = recovery.check()
    clock.now = 2
    status = recovery.status()

    assert event.outcome is Outcome.BACKED_OFF and event.dependents == ("pipe_a",)
    assert "model 'a' unloaded (with pipe_a)" in event.describe()
    assert status["a"].state is State.BACKOFF and status["a"].next_retry_s == 3
    assert status["pipe_a"].state is State.DOWN and status["pipe_a"].next_retry_s == 3
    assert "unloaded with 'a'" in status["pipe_a"].reason
    assert status["b"].state is State.READY
    assert recovery.given_up.keys() == {"a", "pipe_a"}

    clock.now = 5
    (back,) = recovery.check()

    assert back.outcome is Outcome.RETRIED and back.dependents == ("pipe_a",)
    assert server.calls[-2:] == [("load from folder", "a"), ("load from folder", "pipe_a")]
    assert {m: s.state for m, s in recovery.status().items()} == {
        "a": State.READY, "b": State.READY, "pipe_a": State.READY}


def test_a_dead_stub_shows_as_recovering_before_the_watch_loop_sees_it():
    server = _FakeServer()
    recovery = ModelRecovery(server, RestartBudget(3, 60))
    _kill(server, "a")

    status = recovery.status()

    assert status["a"].state is State.RECOVERING
    assert status["a"].dead_stubs == ("a_0_0", "a_0_1")
    assert status["b"].state is State.READY


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
    server.fail_load.add("b")
    del server.stubs["b_0_0"]

    first = recovery.check()
    recovering = recovery.status()["b"]
    second = recovery.check()

    assert first[0].outcome is Outcome.RELOAD_FAILED and "boom" in first[0].detail
    assert recovering.state is State.RECOVERING and "boom" in recovering.reason
    assert second[0].outcome is Outcome.BACKED_OFF
    assert server.calls == [("load", "b"), ("unload", "b")]
    assert recovery.restart_failures == {"b": 1}


def test_metrics_and_status_json_name_every_model_and_its_state():
    statuses = {"a": ModelStatus(State.BACKOFF, 3, 1, (), 12.25, "died"),
                "p\"q": ModelStatus(State.READY)}

    text = metrics_text(statuses)
    body = status_json(statuses)

    assert 'triton_forge_model_restarts_total{model="a"} 3' in text
    assert 'triton_forge_model_down{model="a"} 1' in text
    assert 'triton_forge_model_next_retry_seconds{model="a"} 12.25' in text
    assert 'triton_forge_model_down{model="p\\"q"} 0' in text
    assert 'triton_forge_model_state{model="a",state="backoff"} 1' in text
    assert "# TYPE triton_forge_model_restarts_total counter" in text
    assert body == {"ready": False, "models": {
        "a": {"state": "backoff", "restarts": 3, "restart_failures": 1, "dead_stubs": [],
              "next_retry_s": 12.2, "reason": "died"},
        "p\"q": {"state": "ready", "restarts": 0, "restart_failures": 0, "dead_stubs": [],
                 "next_retry_s": None, "reason": ""}}}


def test_status_endpoint_serves_metrics_and_status_and_follows_a_new_source():
    endpoint = StatusEndpoint(lambda: {"a": ModelStatus(State.READY, 1)}, "127.0.0.1", 0).start()
    try:
        with urllib.request.urlopen(f"{endpoint.url}/metrics", timeout=5) as response:
            kind, text = response.headers["Content-Type"], response.read().decode()
        endpoint.source = lambda: {"a": ModelStatus(State.DOWN, 2, next_retry_s=4.0)}
        with urllib.request.urlopen(f"{endpoint.url}/status", timeout=5) as response:
            status = json.loads(response.read())
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"{endpoint.url}/other", timeout=5)
    finally:
        endpoint.stop()

    assert kind.startswith("text/plain; version=0.0.4")
    assert 'triton_forge_model_restarts_total{model="a"} 1' in text
    assert status["models"]["a"]["state"] == "down" and status["models"]["a"]["restarts"] == 2
    assert missing.value.code == 404


def test_a_stub_the_reload_left_running_beside_its_replacement_is_killed_after_the_grace():
    # Triton 2.51, a model of two instances, one stub killed under traffic: the reload starts
    # both anew and the old version is never unloaded, so its surviving stub runs on
    server, clock = _FakeServer(), _Clock()
    recovery = ModelRecovery(server, RestartBudget(3, 60), clock=clock, stale_grace_s=30)
    del server.stubs["a_0_0"]
    old_survivor = server.stubs["a_0_1"]
    assert [e.outcome for e in recovery.check()] == [Outcome.RELOADED]
    server.stale = {old_survivor: "a_0_1"}  # beside the new a_0_1
    clock.now += 1
    assert recovery.check() == [], "first seen: the grace starts"
    clock.now += 29
    assert recovery.check() == [] and server.killed == [], "within the grace: finishing requests"
    clock.now += 2
    events = recovery.check()
    assert server.killed == [old_survivor]
    assert [(e.model, e.outcome, e.instances) for e in events] == [
        ("a", Outcome.STALE_KILLED, ("a_0_1",))]
    assert "stale Python stub of a_0_1 killed" in events[0].describe()
    assert recovery.check() == [] and server.killed == [old_survivor]
    assert recovery.status()["a"].restarts == 1, "a stale stub is not a restart"
