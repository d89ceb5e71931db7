"""The triton service's entry point: TensorRT guard first, then tritonserver under a watchdog.

The entry point script and the watchdog run here as they would in the container; the watchdog
test supervises a real tritonserver and kills one of its Python stubs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
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


def test_status_endpoint_binds_where_triton_serves_its_metrics():
    spec = importlib.util.spec_from_file_location("triton_supervisor", SUPERVISOR)
    supervisor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(supervisor)

    assert supervisor.metrics_address(["tritonserver", "--metrics-port=8002"]) == "0.0.0.0"
    assert supervisor.metrics_address(["tritonserver", "--http-address=10.1.2.3"]) == "10.1.2.3"
    assert supervisor.metrics_address(["tritonserver", "--http-address", "10.1.2.3",
                                       "--metrics-address=127.0.0.1"]) == "127.0.0.1"
