"""The triton service's exact flags and healthcheck, run against a real tritonserver.

The embedded server (Triton 2.51) is started with the `command` of docker-compose.yml's triton
service (ports and repository swapped for test ones); the admin API restriction, the Python
backend settings and docker/healthcheck.py are then exercised for real.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tools import process
from tools.net import LOOPBACK, free_ports
from tools.serve.server import EmbeddedServer, resolve_binary
from tools.serve.server_config import TritonServerConfig, binary_options
from waits import wait_until

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[1]
HEALTHCHECK = ROOT / "docker" / "healthcheck.py"
ADMIN_KEY = "compose-test-key"
# Options of the compose command that Triton 2.51 (the embedded server) predates; the NGC tag the
# compose file pins (>= 25.07) has them.
NEWER_THAN_EMBEDDED = {"--http-max-input-size"}


def _interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}`` interpolation."""
    def one(match: re.Match) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3)
        if env.get(name):
            return env[name]
        if op == ":?":
            raise KeyError(f"{name}: {arg}")
        return arg or ""
    return re.sub(r"\$\{(\w+)(?:(:-|:\?)([^}]*))?\}", one, value)


def _http(url: str, body: dict | None = None, headers: dict | None = None) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers or {},
                                     method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@dataclass
class ComposeTriton:
    url: str
    pid: int
    repository: Path
    args: list[str]
    skipped: list[str]


@pytest.fixture(scope="module")
def compose_triton(toy_repository, tmp_path_factory) -> ComposeTriton:
    """tritonserver started with the compose file's triton command on the toy repository."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    command = [_interpolate(a, {"TRITON_ADMIN_KEY": ADMIN_KEY})
               for a in compose["services"]["triton"]["command"]]
    assert command[0] == "tritonserver"
    config = TritonServerConfig.from_args(command[1:])
    # Mutation guard: these are the values the test replaces with its own (tritonserver's own
    # loopback ports behind the front, and the metrics port).
    assert (config.model_repository, config.http_port, config.grpc_port,
            config.metrics_port) == ("/models", 18000, 18001, 8002)
    binary = resolve_binary()
    options = binary_options(binary)
    http, grpc, metrics = free_ports(3)
    embedded = EmbeddedServer(toy_repository)  # not started: lends its backend dir and env
    config = dataclasses.replace(
        config, model_repository=str(toy_repository),
        backend_directory=str(embedded.backend_directory()),
        # Loopback, as in the container (the front holds the public ports there).
        http_address=LOOPBACK, http_port=http, grpc_address=LOOPBACK, grpc_port=grpc,
        metrics_address=LOOPBACK, metrics_port=metrics,
        # A killed stub makes shutdown wait the whole exit timeout; keep the test short.
        exit_timeout_secs=3)
    args = config.to_args()
    skipped = [a for a in args if a.split("=", 1)[0] not in options]
    args = [a for a in args if a not in skipped]
    log = tmp_path_factory.mktemp("compose-triton") / "tritonserver.log"
    proc = process.start([str(binary), *args], env=embedded.environment(), log_path=log)
    url = f"http://127.0.0.1:{http}"
    regions: set[str] = set()
    try:
        outcome = process.wait_ready(proc, lambda: _ready(url), timeout_s=120, interval_s=0.5)
        if outcome is not process.Readiness.READY:
            pytest.fail(f"tritonserver with the compose flags did not become ready "
                        f"(exit {proc.poll()}):\n{log.read_text()[-4000:]}")
        regions = process.stub_shm_regions(proc.pid)
        yield ComposeTriton(url, proc.pid, toy_repository, args, skipped)
    finally:
        process.stop(proc, grace_s=40)
        process.remove_shm_regions(regions)  # the killed stub's region stays behind


def _ready(url: str) -> bool:
    try:
        return _http(f"{url}/v2/health/ready")[0] == 200
    except (urllib.error.URLError, OSError):
        return False


def _healthcheck(server: ComposeTriton, repository: Path, probes: dict | None,
                 tmp_path: Path) -> subprocess.CompletedProcess:
    args = [sys.executable, str(HEALTHCHECK), "--url", server.url,
            "--repository", str(repository)]
    if probes is not None:
        probe_file = tmp_path / "probes.json"
        probe_file.write_text(json.dumps(probes))
        args += ["--probes", str(probe_file)]
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)


TEXT_PROBE = {"toy_text": {"inputs": [
    {"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["healthcheck"]}]}}


def test_real_tritonserver_accepts_the_compose_flags(compose_triton):
    assert {a.split("=", 1)[0] for a in compose_triton.skipped} <= NEWER_THAN_EMBEDDED
    # Mutation guard: the swap table above must have matched the compose command.
    assert not any(a.endswith(("=/models", "=18000", "=18001", "=8002")) for a in
                   compose_triton.args)
    for model in ("toy_double", "toy_text", "toy_classify"):
        assert _http(f"{compose_triton.url}/v2/models/{model}/ready")[0] == 200


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/v2/repository/index"),
    ("POST", "/v2/repository/models/toy_text/unload"),
    ("GET", "/v2/logging"),
    ("GET", "/v2/trace/setting"),
    ("GET", "/v2/systemsharedmemory/status"),
    ("GET", "/v2/cudasharedmemory/status"),
])
def test_admin_apis_refuse_requests_without_the_operator_key(compose_triton, method, path):
    body = {} if method == "POST" else None

    status, text = _http(f"{compose_triton.url}{path}", body)

    assert status == 403
    assert "admin-key" in text


def test_admin_api_answers_with_the_operator_key(compose_triton):
    status, text = _http(f"{compose_triton.url}/v2/repository/index", {},
                         headers={"admin-key": ADMIN_KEY})

    assert status == 200
    assert {m["name"] for m in json.loads(text)} == {"toy_double", "toy_text", "toy_classify"}


def test_inference_stays_open_without_the_key(compose_triton):
    status, text = _http(f"{compose_triton.url}/v2/models/toy_text/infer",
                         TEXT_PROBE["toy_text"])

    assert status == 200
    assert json.loads(text)["outputs"][0]["shape"] == [1, 8]


def test_healthcheck_passes_when_every_model_is_ready_and_the_probe_answers(
        compose_triton, tmp_path):
    result = _healthcheck(compose_triton, compose_triton.repository, TEXT_PROBE, tmp_path)

    assert result.returncode == 0, result.stderr
    assert "healthy: 3 models ready" in result.stdout


def test_healthcheck_fails_naming_a_model_the_server_does_not_serve(compose_triton, tmp_path):
    repository = tmp_path / "repository"
    for name in ("toy_double", "toy_text", "toy_classify", "ghost_model"):
        (repository / name).mkdir(parents=True)
        (repository / name / "config.pbtxt").write_text(f'name: "{name}"\n')

    result = _healthcheck(compose_triton, repository, None, tmp_path)

    assert result.returncode == 1
    assert ("model 'ghost_model' not ready: Request for unknown model: 'ghost_model' is not found"
            in result.stderr)
    assert "toy_text" not in result.stderr


def test_healthcheck_fails_when_the_probe_request_is_refused(compose_triton, tmp_path):
    bad = {"toy_text": {"inputs": [
        {"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": [""]}]}}

    result = _healthcheck(compose_triton, compose_triton.repository, bad, tmp_path)

    assert result.returncode == 1
    assert "model 'toy_text' failed its probe inference: HTTP 400" in result.stderr


def test_healthcheck_fails_when_a_python_stub_died(compose_triton, tmp_path):
    """Runs last in this module: it kills a stub of the shared server."""
    stubs = process.stub_processes(compose_triton.pid)
    (instance,) = [name for name in stubs if name.startswith("toy_text")]

    os.kill(stubs[instance], signal.SIGKILL)
    wait_until(lambda: not process.is_alive(stubs[instance]), 10,
               f"the killed {instance} stub {stubs[instance]} to be gone")
    result = _healthcheck(compose_triton, compose_triton.repository, TEXT_PROBE, tmp_path)

    assert result.returncode == 1
    assert "model 'toy_text'" in result.stderr


@pytest.mark.torch
def test_healthcheck_probe_file_answers_on_the_built_repository(
        triton_server, built_repository, tmp_path):
    """docker/healthcheck_probes.json is a valid request for the real text_embedding pipeline."""
    probes = json.loads((ROOT / "docker" / "healthcheck_probes.json").read_text())
    served = ComposeTriton(f"http://{triton_server.http_url}", triton_server.pid,
                           built_repository, [], [])

    result = _healthcheck(served, built_repository, probes, tmp_path)

    models = sorted(p.parent.name for p in built_repository.glob("*/config.pbtxt"))
    assert "text_embedding" in models and set(probes) <= set(models)
    assert result.returncode == 0, result.stderr
    assert f"healthy: {len(models)} models ready" in result.stdout
