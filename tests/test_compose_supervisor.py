"""The triton service's entry point: TensorRT guard first, then tritonserver under a watchdog.

The entry point script and the watchdog run here as they would in the container; the watchdog
test supervises a real tritonserver and kills one of its Python stubs. The watchdog also runs the
front's admission controller: a real HAProxy on a rendered config sends it its log, and the caps
it writes are read back through HAProxy's runtime API.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tools import process
from tools.manifest import MANIFEST_NAME, Manifest, ModelEntry, TensorRTRecord
from tools.net import free_ports
from tools.serve.server import EmbeddedServer, resolve_binary
from waits import wait_until

ROOT = Path(__file__).resolve().parents[1]
ENTRYPOINT = ROOT / "docker" / "triton-entrypoint.sh"
SUPERVISOR = ROOT / "docker" / "triton_supervisor.py"
PLAN = {"version": "10.11.0", "compute_capability": "8.6", "precision": "fp16"}


def _repository(tmp_path: Path, tensorrt: dict | None) -> Path:
    repo = tmp_path / "model_repository"
    (repo / "minilm_encoder" / "1").mkdir(parents=True)
    platform = 'platform: "tensorrt_plan"' if tensorrt else 'backend: "onnxruntime"'
    (repo / "minilm_encoder" / "config.pbtxt").write_text(f'name: "minilm_encoder"\n{platform}\n')
    record = TensorRTRecord(**tensorrt) if tensorrt else None
    entry = ModelEntry(kind="pytorch", target="gpu", tensorrt=record)
    manifest = Manifest(target="gpu", models={"minilm_encoder": entry})
    (repo / MANIFEST_NAME).write_text(manifest.to_text())
    return repo


def _entrypoint(repo: Path, *command: str, **env: str) -> subprocess.CompletedProcess:
    environment = os.environ | {"MODEL_REPOSITORY": str(repo), "PYTHONPATH": str(ROOT)} | env
    return subprocess.run(["sh", str(ENTRYPOINT), *command], capture_output=True, text=True,
                          env=environment, timeout=60, check=False)


def test_entrypoint_refuses_to_start_the_server_when_a_plan_cannot_be_served(tmp_path):
    # The guard's real detection runs: with no GPU visible, every plan must be refused.
    if shutil.which("nvidia-smi") is not None:
        pytest.skip("this machine has a GPU; the refusal needs a mismatch the test cannot force")
    repo = _repository(tmp_path, PLAN)

    result = _entrypoint(repo, "echo", "SERVER STARTED", TRITON_WATCHDOG="off")

    assert result.returncode == 1
    assert "SERVER STARTED" not in result.stdout
    assert "model 'minilm_encoder'" in result.stderr
    assert "docker-compose.gpu.yml" in result.stderr, "points at the gpu stack (rebuild or GPU)"


def test_entrypoint_starts_the_command_when_the_repository_has_no_plans(tmp_path):
    repo = _repository(tmp_path, None)

    result = _entrypoint(repo, "echo", "SERVER STARTED", TRITON_WATCHDOG="off")

    assert result.returncode == 0, result.stderr
    assert "no TensorRT plans" in result.stdout
    assert result.stdout.rstrip().endswith("SERVER STARTED")


def test_supervisor_returns_the_servers_exit_status_when_signalled(tmp_path):
    """SIGTERM reaches the server (Triton drains in-flight requests) and its status comes back."""
    unused = socket.socket()
    unused.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{unused.getsockname()[1]}"  # nothing answers: never healthy
    unused.close()
    started = tmp_path / "server-started"
    proc = subprocess.Popen(
        [sys.executable, str(SUPERVISOR), "--url", url, "--repository", str(tmp_path),
         "--interval", "0.2", "--", "sh", "-c", f"touch {started}; exec sleep 30"],
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        def server_running() -> bool:
            assert proc.poll() is None, proc.stderr.read()
            return started.exists()

        wait_until(server_running, 20, "the supervised server to touch its marker file "
                   "(the supervisor forwards signals from then on)")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=20)
    finally:
        process.stop(proc, grace_s=5)

    assert code == 128 + signal.SIGTERM


def _server_command(toy_repository: Path, ports: list[int], *flags: str,
                    exit_timeout_s: int = 3) -> tuple[list[str], dict]:
    """tritonserver's command line as the container runs it (on loopback ports), and its env."""
    http, grpc, metrics = ports
    embedded = EmbeddedServer(toy_repository)  # not started: lends its backend dir and env
    return [str(resolve_binary()), f"--model-repository={toy_repository}",
            f"--backend-directory={embedded.backend_directory()}",
            "--http-address=127.0.0.1", f"--http-port={http}",
            "--grpc-address=127.0.0.1", f"--grpc-port={grpc}",
            "--metrics-address=127.0.0.1", f"--metrics-port={metrics}",
            f"--exit-timeout-secs={exit_timeout_s}", *flags], embedded.environment()


def _supervise(tmp_path: Path, toy_repository: Path, server: list[str], env: dict, http: int,
               *options: str) -> tuple[subprocess.Popen, Path]:
    probes = tmp_path / "probes.json"
    probes.write_text(json.dumps({"toy_text": {"inputs": [
        {"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["watchdog"]}]}}))
    log = tmp_path / "supervisor.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(SUPERVISOR), "--url", f"http://127.0.0.1:{http}",
             "--repository", str(toy_repository), "--probes", str(probes),
             "--interval", "0.5", "--failures", "2", "--start-timeout", "120",
             "--stop-timeout", "20", *options, "--", *server],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
    def all_models_ready() -> bool:
        assert proc.poll() is None, log.read_text()[-3000:]
        return "all models" in log.read_text()

    wait_until(all_models_ready, 120, lambda: "the supervisor to log 'all models' ready; log: "
               + log.read_text()[-3000:], interval_s=0.3)
    return proc, log


def _infer(http: int, model: str, body: dict) -> int:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{http}/v2/models/{model}/infer",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


TOY_TEXT = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["hi"]}]}
TOY_DOUBLE = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]},
                       {"name": "DELAY_MS", "datatype": "FP32", "shape": [1, 1], "data": [0]}]}


@pytest.mark.server
def test_supervisor_without_model_control_stops_tritonserver_and_exits_1_when_a_stub_dies(
        toy_repository, tmp_path):
    http, grpc, metrics = free_ports(3)
    server, env = _server_command(toy_repository, [http, grpc, metrics], "--model-control-mode=none")
    proc, log = _supervise(tmp_path, toy_repository, server, env, http, "--recover-models")
    regions: set[str] = set()
    try:
        stubs = process.stub_processes(proc.pid)
        regions = process.stub_shm_regions(proc.pid)
        (toy_text,) = [pid for name, pid in stubs.items() if name.startswith("toy_text")]

        os.kill(toy_text, signal.SIGKILL)
        code = proc.wait(timeout=90)
        deadline = time.monotonic() + 5  # the killed server's stubs may take a moment to go
        while (leftovers := [p.pid for p in process.group_members(proc.pid)]) and (
                time.monotonic() < deadline):
            time.sleep(0.05)
    finally:
        process.stop(proc, grace_s=10)
        process.remove_shm_regions(regions)  # the killed stub's region stays behind

    text = log.read_text()
    assert code == 1, text[-3000:]
    assert "per-model recovery off: the server does not run --model-control-mode=explicit" in text
    assert "Python stub of model instance toy_text_0_0 died" in text
    assert "stopping tritonserver so the container restarts" in text
    assert leftovers == [], f"processes left behind: {leftovers}"


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def _model_ready(http: int, model: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/{model}/ready", timeout=5):
            return True
    except urllib.error.HTTPError:
        return False


def _metric(text: str, name: str) -> float:
    (value,) = [line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(name + " ")]
    return float(value)


@pytest.mark.server
def test_supervisor_reloads_only_the_model_whose_stub_died_and_keeps_serving(toy_repository, tmp_path):
    """As compose runs it: explicit model control, the load API behind the admin key; past the
    restart budget the model is retried with backoff, as the status endpoint reports."""
    key = os.urandom(16).hex()
    http, grpc, metrics, forge = free_ports(4)
    server, env = _server_command(
        toy_repository, [http, grpc, metrics], "--model-control-mode=explicit", "--load-model=*",
        f"--http-restricted-api=model-repository:admin-key={key}")
    proc, log = _supervise(tmp_path, toy_repository, server, env | {"TRITON_ADMIN_KEY": key}, http,
                           "--recover-models", "--model-restarts", "1", "--retry-backoff", "2",
                           "--forge-metrics-port", str(forge))
    status_url = f"http://127.0.0.1:{forge}"  # on the address of Triton's metrics
    regions: set[str] = set()
    try:
        assert _infer(http, "toy_double", TOY_DOUBLE) == 200
        stubs = process.stub_processes(proc.pid)
        regions = process.stub_shm_regions(proc.pid)
        (toy_text,) = [pid for name, pid in stubs.items() if name.startswith("toy_text")]

        os.kill(toy_text, signal.SIGKILL)
        killed, other = time.monotonic(), []
        while _infer(http, "toy_text", TOY_TEXT) != 200:
            other.append(_infer(http, "toy_double", TOY_DOUBLE))
            assert time.monotonic() - killed < 20, log.read_text()[-3000:]
            time.sleep(0.2)
        recovered = time.monotonic() - killed
        still_running = proc.poll() is None
        new_stub = process.stub_processes(proc.pid).get("toy_text_0_0")

        os.kill(new_stub, signal.SIGKILL)  # over the budget of one reload: backoff
        state = lambda: json.loads(_get(f"{status_url}/status"))["models"]["toy_text"]  # noqa: E731
        deadline = time.monotonic() + 20
        while (in_backoff := state())["state"] != "backoff":
            assert time.monotonic() < deadline, (in_backoff, log.read_text()[-3000:])
            time.sleep(0.05)
        down_metrics = _get(f"{status_url}/metrics")
        ready_in_backoff = _model_ready(http, "toy_text")
        other_in_backoff = _infer(http, "toy_double", TOY_DOUBLE)
        while (back := state())["state"] != "ready":
            assert time.monotonic() < deadline, (back, log.read_text()[-3000:])
            time.sleep(0.05)
        answer_after_retry = _infer(http, "toy_text", TOY_TEXT)
        up_metrics = _get(f"{status_url}/metrics")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        process.stop(proc, grace_s=10)
        process.remove_shm_regions(regions)

    text = log.read_text()
    assert "per-model recovery on" in text, text[-3000:]
    assert "reloaded model 'toy_text'" in text
    assert recovered < 5, f"toy_text answered again only after {recovered:.1f} s"
    assert other and set(other) == {200}, f"toy_double failed while toy_text reloaded: {other}"
    assert still_running and new_stub not in (None, toy_text)
    assert "container restarts" not in text
    assert f"model status on {status_url}/metrics and /status" in text
    assert in_backoff["next_retry_s"] <= 2 and in_backoff["restarts"] == 1
    assert _metric(down_metrics, 'triton_forge_model_down{model="toy_text"}') == 1
    assert _metric(down_metrics, 'triton_forge_model_down{model="toy_double"}') == 0
    assert not ready_in_backoff and other_in_backoff == 200
    assert "model 'toy_text' unloaded: its Python stub died 2 times" in text
    assert "model 'toy_text' loaded again by a retry" in text
    assert back["restarts"] == 2 and answer_after_retry == 200
    assert _metric(up_metrics, 'triton_forge_model_down{model="toy_text"}') == 0
    assert _metric(up_metrics, 'triton_forge_model_restarts_total{model="toy_text"}') == 2
    # SIGTERM is forwarded and the server's own status comes back. After a reload Triton 2.51
    # unloads every model at once but then waits out --exit-timeout-secs for the dead
    # instance, and exits 1 ("Exit timeout expired"), as it does under `tools serve`.
    assert code == 1 and "Exit timeout expired" in text, text[-2000:]


def _supervisor_module():
    spec = importlib.util.spec_from_file_location("triton_supervisor", SUPERVISOR)
    supervisor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(supervisor)
    return supervisor


def test_status_endpoint_binds_where_triton_serves_its_metrics():
    supervisor = _supervisor_module()

    assert supervisor.metrics_address(["tritonserver", "--metrics-port=8002"]) == "0.0.0.0"
    assert supervisor.metrics_address(["tritonserver", "--http-address=10.1.2.3"]) == "10.1.2.3"
    assert supervisor.metrics_address(["tritonserver", "--http-address", "10.1.2.3",
                                       "--metrics-address=127.0.0.1"]) == "127.0.0.1"


def test_the_supervisor_reads_tritonservers_own_http_port_from_its_command():
    """The health checks and the admission controller ask tritonserver itself, not the front."""
    supervisor = _supervisor_module()

    assert supervisor.server_http(["tritonserver", "--http-address=127.0.0.1",
                                   "--http-port=18000"]) == "127.0.0.1:18000"
    assert supervisor.server_http(["tritonserver", "--http-port", "9000"]) == "127.0.0.1:9000"
    assert supervisor.server_http(["tritonserver"]) == "127.0.0.1:8000"  # Triton's defaults


def test_without_the_fronts_variables_the_supervisor_runs_no_controller(monkeypatch):
    supervisor = _supervisor_module()
    monkeypatch.delenv("FORGE_FRONT_ADMIN", raising=False)
    monkeypatch.setenv("FORGE_FRONT_LOG", "127.0.0.1:9")

    assert supervisor.start_admission(["tritonserver", "--http-port=18000"]) is None


# A stand-in for tritonserver's HTTP endpoint: the model-config API the controller reads the
# objective from, and an inference that takes INFER_S (near the objective, so the model is
# congested and its cap is target x throughput).
FAKE_TRITON = """
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port = int(next(a for a in sys.argv if a.startswith("--http-port=")).split("=")[1])


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v2/models/toy/config":
            self._answer(200, {"name": "toy", "parameters": {
                "admission_p99_ms": {"string_value": "100"}}})
        else:
            self._answer(404, {"error": "not found"})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        time.sleep(0.06)
        self._answer(200, {"model_name": "toy", "outputs": []})

    def log_message(self, *args):
        pass


ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def test_the_supervisor_runs_the_fronts_admission_controller_which_sets_caps_in_haproxy(tmp_path):
    """As compose and the pod run it: FORGE_FRONT_ADMIN and FORGE_FRONT_LOG set, HAProxy on the
    repository's rendered config in front of "tritonserver" (a stand-in on the port the command
    names). Load through HAProxy moves the model's cap, which only the controller writes."""
    from tools.front import admission, haproxy_config
    from tools.front.controller import RuntimeApi
    from tools.front.plan import FrontPlan
    from tools.front.process import find_haproxy

    haproxy = find_haproxy()
    if haproxy is None:
        pytest.skip("haproxy is not installed (apt-get install haproxy)")
    http, grpc, triton_http, triton_grpc, admin, log = free_ports(6)
    env = os.environ | {
        "FORGE_FRONT_HTTP": f"127.0.0.1:{http}", "FORGE_FRONT_GRPC": f"127.0.0.1:{grpc}",
        "FORGE_TRITON_HTTP": f"127.0.0.1:{triton_http}",
        "FORGE_TRITON_GRPC": f"127.0.0.1:{triton_grpc}",
        "FORGE_FRONT_ADMIN": f"ipv4@127.0.0.1:{admin}", "FORGE_FRONT_LOG": f"127.0.0.1:{log}"}
    haproxy_config.write(FrontPlan({"toy": 100.0}, ("toy",)), tmp_path)
    (tmp_path / "fake_triton.py").write_text(FAKE_TRITON)
    (tmp_path / "repository").mkdir()
    front_log, supervisor_log = tmp_path / "haproxy.log", tmp_path / "supervisor.log"
    with front_log.open("w") as out:
        front = subprocess.Popen([str(haproxy), "-W", "-db", "-f", str(tmp_path / "haproxy.cfg")],
                                 stdout=out, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True)
    with supervisor_log.open("w") as out:
        supervisor = subprocess.Popen(
            [sys.executable, str(SUPERVISOR), "--repository", str(tmp_path / "repository"),
             "--interval", "0.5", "--start-timeout", "120", "--stop-timeout", "5", "--",
             sys.executable, str(tmp_path / "fake_triton.py"), "--http-address=127.0.0.1",
             f"--http-port={triton_http}"],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    runtime = RuntimeApi(f"ipv4@127.0.0.1:{admin}")
    statuses: list[int] = []
    try:
        def started() -> bool:
            assert supervisor.poll() is None, supervisor_log.read_text()
            assert front.poll() is None, front_log.read_text()
            return "front admission on" in supervisor_log.read_text() and _accepts(triton_http)

        wait_until(started, 30, lambda: "the supervisor's controller and the stand-in; log: "
                   + supervisor_log.read_text()[-2000:])
        initial = runtime.caps()["h_toy"].requests
        started_at = time.monotonic()
        stop = started_at + 3

        def client() -> None:
            while time.monotonic() < stop:
                statuses.append(_infer(http, "toy", {"inputs": []}))

        clients = [threading.Thread(target=client) for _ in range(16)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()
        throughput = statuses.count(200) / (time.monotonic() - started_at)
        wait_until(lambda: runtime.caps()["h_toy"].requests != initial, 10,
                   lambda: f"the controller to move h_toy's cap from {initial}; supervisor log: "
                   + supervisor_log.read_text()[-2000:])
        cap = runtime.caps()["h_toy"].requests
        supervisor.send_signal(signal.SIGTERM)
        code = supervisor.wait(timeout=30)
    finally:
        process.stop(supervisor, grace_s=5)
        process.stop(front, grace_s=5)

    text = supervisor_log.read_text()
    assert initial == admission.INITIAL_IN_FLIGHT
    assert statuses and set(statuses) <= {200, 503}, statuses
    # Little's law: the cap is a latency target (at most the 100 ms objective) times the best
    # recent throughput, which the client-side average does not exceed by more than 2x here
    assert admission.MIN_IN_FLIGHT <= cap <= max(admission.MIN_IN_FLIGHT,
                                                 math.ceil(2 * 0.100 * throughput)), (cap, throughput)
    assert cap < initial
    assert (f"front admission on: per-request log from 127.0.0.1:{log}, caps written to the "
            f"runtime API at ipv4@127.0.0.1:{admin}, objectives from tritonserver at "
            f"127.0.0.1:{triton_http}") in text
    assert code == 128 + signal.SIGTERM  # the stand-in's own exit, forwarded


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0
