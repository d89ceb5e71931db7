"""The embedded tritonserver, for real: answers, loopback only, refusals with the server's reasons.

Tests that only read (answers, readiness, ports, metrics, probes) share the session's server on
the toy repository (tests/fixtures/toy_repository); tests that kill, stop, break or crowd a
server start their own.
"""

from __future__ import annotations

import os
import shutil
import signal
import sysconfig
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tools import process
from tools.errors import ServerError
from tools.serve.health import health_check
from tools.serve.server import ADMIN_HEADER, LOOPBACK
from waits import wait_until

pytestmark = pytest.mark.server

SITE_PACKAGES = Path(sysconfig.get_paths()["purelib"]).resolve()


def _toy_copy(toy_repository: Path, tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(toy_repository, repo, ignore=shutil.ignore_patterns("__pycache__", "*.md"))
    return repo


def _add_model(repo: Path, name: str, source: str, config_extra: str = "") -> None:
    """A copy of toy_double named ``name`` with its own model.py (and extra config text)."""
    shutil.copytree(repo / "toy_double", repo / name)
    config = (repo / name / "config.pbtxt").read_text().replace('"toy_double"', f'"{name}"')
    (repo / name / "config.pbtxt").write_text(config + config_extra)
    (repo / name / "1" / "model.py").write_text(source)


_alive = process.is_alive


def _processes_using(path: Path) -> list[int]:
    """Live processes whose command line mentions ``path`` (tritonserver, stubs)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if str(path) in cmdline and _alive(proc.info["pid"]):
            found.append(proc.info["pid"])
    return found


def _listening_addresses(port: int) -> set[str]:
    # gRPC listens on an IPv6 socket: 127.0.0.1 shows as the v4-mapped ::ffff:127.0.0.1
    return {
        c.laddr.ip.removeprefix("::ffff:")
        for c in psutil.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    }


def test_server_doubles_input_over_http_and_grpc_when_toy_repository_served(toy_server):
    server = toy_server
    x = np.arange(6, dtype=np.float32).reshape(2, 3)

    http = httpclient.InferenceServerClient(server.http_url)
    http_in = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    http_in.set_data_from_numpy(x)
    http_out = http.infer("toy_double", [http_in]).as_numpy("OUTPUT0")
    http.close()

    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    grpc_in = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    grpc_in.set_data_from_numpy(x)
    grpc_out = grpc.infer("toy_double", [grpc_in]).as_numpy("OUTPUT0")
    grpc.close()

    np.testing.assert_array_equal(http_out, 2 * x)
    np.testing.assert_array_equal(grpc_out, 2 * x)


def test_server_reports_every_model_of_the_repository_ready_after_start(
    toy_server, toy_repository
):
    server = toy_server

    expected = sorted(p.name for p in toy_repository.iterdir() if (p / "config.pbtxt").exists())
    assert server.models == expected
    assert set(server.control.stub_processes()) == {f"{name}_0_0" for name in expected}


def test_server_listens_only_on_loopback(toy_server):
    server = toy_server

    for url in (server.http_url, server.grpc_url, server.metrics_url):
        assert _listening_addresses(int(url.rsplit(":", 1)[1])) == {LOOPBACK}


def test_metrics_endpoint_serves_prometheus_text(toy_server):
    server = toy_server

    with urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=5) as resp:
        body = resp.read().decode()

    assert "nv_inference_request_success" in body


def test_admin_repository_api_is_refused_without_the_servers_admin_header(toy_server):
    server = toy_server
    url = f"http://{server.http_url}/v2/repository/index"

    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=5)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match=ADMIN_HEADER):
        grpc.get_model_repository_index()
    allowed = grpc.get_model_repository_index(headers=server.admin_headers)
    grpc.close()

    assert refused.value.code == 403
    assert sorted(m.name for m in allowed.models) == server.models


def test_start_raises_with_the_models_own_reason_when_initialize_raises(
    server_factory, toy_repository, tmp_path
):
    repo = _toy_copy(toy_repository, tmp_path)
    _add_model(
        repo,
        "toy_broken",
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        "        raise FileNotFoundError('weights file w.bin is missing')\n",
    )

    with pytest.raises(ServerError) as info:
        server_factory(repo)

    message = str(info.value)
    assert "model 'toy_broken' version 1 failed to load" in message
    assert "FileNotFoundError: weights file w.bin is missing" in message
    assert "\n" not in message
    log = server_factory.servers[-1].log_path
    assert f"server log: {log}" in message and log.exists()
    assert _processes_using(repo) == []


def test_start_raises_with_the_parse_error_when_a_config_names_an_unknown_field(
    server_factory, toy_repository, tmp_path
):
    repo = _toy_copy(toy_repository, tmp_path)
    source = (toy_repository / "toy_double" / "1" / "model.py").read_text()
    _add_model(repo, "toy_misspelt", source, config_extra="max_batch_sizes: 4\n")

    with pytest.raises(ServerError) as info:
        server_factory(repo)

    message = str(info.value)
    assert "model 'toy_misspelt'" in message
    assert 'no field named "max_batch_sizes"' in message
    assert "\n" not in message


def test_start_raises_when_tritonserver_dies_while_starting(server_factory, toy_repository):
    with pytest.raises(ServerError, match="exited while starting") as info:
        server_factory(toy_repository, extra_args=["--no-such-option=1"])

    assert "no-such-option" in str(info.value)


def test_start_recognises_a_port_in_use_from_the_server_log(
    server_factory, toy_repository, tmp_path
):
    first = server_factory(toy_repository)
    taken = first.http_url.rsplit(":", 1)[1]
    regions_before = {p.name for p in Path("/dev/shm").glob(f"{process.SHM_PREFIX}*")}

    # the extra option overrides the (free) HTTP port the pre-check saw
    with pytest.raises(ServerError) as info:
        server_factory(toy_repository, extra_args=[f"--http-port={taken}"])

    assert f"port {taken} (HTTP) is already in use on {LOOPBACK}" in str(info.value)
    # it loaded the models before failing to bind: their stubs' shared memory is removed too
    regions_after = {p.name for p in Path("/dev/shm").glob(f"{process.SHM_PREFIX}*")}
    assert regions_after <= regions_before


def test_start_raises_naming_pending_models_when_loading_exceeds_the_timeout(
    server_factory, toy_repository, tmp_path
):
    repo = _toy_copy(toy_repository, tmp_path)
    _add_model(
        repo,
        "toy_slow_load",
        "import time\n"
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        "        time.sleep(60)\n",
    )

    with pytest.raises(ServerError) as info:
        server_factory(repo, timeout_s=3, exit_timeout_s=1)

    assert "not ready after 3 s" in str(info.value)
    assert "'toy_slow_load'" in str(info.value)
    assert _processes_using(repo) == []


def test_health_check_answers_ok_for_every_model_when_all_stubs_run(toy_server):
    server = toy_server

    report = health_check(server)

    assert [m.model for m in report.models] == server.models
    assert all(m.alive and m.probed for m in report.models)
    assert report.healthy and report.problems == []


def test_health_check_fails_a_model_that_answers_its_probe_with_an_error(toy_server):
    """One definition of alive: an error answer to the probe is a failure, not a sign of life."""
    server = toy_server
    empty_text = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": [""]}]}

    with pytest.raises(ServerError) as info:
        health_check(server, probes={"toy_text": empty_text})

    message = str(info.value)
    assert "model 'toy_text' failed its probe inference: HTTP 400" in message
    assert "input 'TEXT': empty text" in message
    assert "toy_double" not in message and "toy_classify" not in message
    assert f"(server log: {server.log_path})" in message


def test_health_check_fails_naming_the_model_whose_stub_died_while_readiness_stays_200(
    server_factory, toy_repository
):
    server = server_factory(toy_repository, exit_timeout_s=2)
    stub = server.control.stub_processes()["toy_text_0_0"]
    os.kill(stub, signal.SIGKILL)
    wait_until(lambda: not process.is_alive(stub), 10, f"the killed toy_text stub {stub} to be gone")

    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/toy_text/ready") as resp:
        assert resp.status == 200  # the trap: Triton 2.51 still reports the model ready
    with pytest.raises(ServerError) as info:
        health_check(server)

    assert "model 'toy_text' failed its probe inference" in str(info.value)
    assert "toy_double" not in str(info.value)


def test_stop_leaves_no_tritonserver_or_stub_process(server_factory, toy_repository):
    server = server_factory(toy_repository)
    pids = [server.pid, *server.control.stub_processes().values()]
    assert all(_alive(pid) for pid in pids)

    server.stop()

    assert [pid for pid in pids if _alive(pid)] == []


def test_backend_directory_of_a_running_server_is_outside_site_packages(toy_server):
    server = toy_server
    cmdline = psutil.Process(server.pid).cmdline()

    backend = Path(
        next(a for a in cmdline if a.startswith("--backend-directory=")).split("=", 1)[1]
    )
    stub_exe = Path(psutil.Process(next(iter(server.control.stub_processes().values()))).cmdline()[0])

    assert SITE_PACKAGES not in backend.resolve().parents
    assert stub_exe.parent == backend / "python"
    assert not (
        SITE_PACKAGES
        / "pytriton"
        / "tritonserver"
        / "backends"
        / "python"
        / "triton_python_backend_stub"
    ).exists()


def test_watch_returns_naming_the_instance_whose_python_stub_died(server_factory, toy_repository):
    server = server_factory(toy_repository, exit_timeout_s=2)
    stubs = server.control.stub_processes()
    os.kill(stubs["toy_text_0_0"], signal.SIGKILL)

    reason = server.watch(stubs, interval_s=0.05)

    assert reason.startswith("Python stub of model instance toy_text_0_0 died")
    assert server.poll() is None  # Triton itself keeps running: the caller restarts it


def test_watch_returns_after_consecutive_probe_failures_naming_the_model(toy_server):
    server = toy_server
    empty_text = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": [""]}]}

    reason = server.watch(
        server.control.stub_processes(), interval_s=0.05, probes={"toy_text": empty_text},
        probe_interval_s=0.1, probe_failures=2,
    )

    assert reason.startswith(
        "2 health checks in a row failed: model 'toy_text' failed its probe inference: HTTP 400"
    )


def test_watch_raises_when_tritonserver_itself_exits(server_factory, toy_repository):
    server = server_factory(toy_repository, exit_timeout_s=2)
    os.kill(server.pid, signal.SIGKILL)

    with pytest.raises(ServerError, match=r"tritonserver exited unexpectedly \(exit code -9\)"):
        server.watch(server.control.stub_processes(), interval_s=0.05)


def _shm_left(regions: set[str]) -> list[str]:
    return sorted(name for name in regions if (Path("/dev/shm") / name).exists())


def test_stop_removes_the_shared_memory_a_killed_stub_left_behind(server_factory, toy_repository):
    server = server_factory(toy_repository, exit_timeout_s=2)
    regions = process.stub_shm_regions(server.pid)
    assert len(regions) == len(server.models) and _shm_left(regions) == sorted(regions)
    os.kill(server.control.stub_processes()["toy_text_0_0"], signal.SIGKILL)

    server.stop()

    assert _shm_left(regions) == []


def test_stop_removes_the_shared_memory_of_a_server_that_was_killed(server_factory, toy_repository):
    server = server_factory(toy_repository, exit_timeout_s=2)
    regions, stubs = process.stub_shm_regions(server.pid), server.control.stub_processes()
    os.kill(server.pid, signal.SIGKILL)

    server.stop()

    assert regions and _shm_left(regions) == []
    assert stubs and [pid for pid in stubs.values() if _alive(pid)] == []
