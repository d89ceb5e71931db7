"""The front on the compose and Kubernetes paths: one config, one environment, one image pin.

docker-compose.yml's `front` service and the pod's `front` container both run HAProxy on the
`haproxy.cfg` `tools build-repo` wrote into the repository tritonserver serves, with the `FORGE_*`
environment of `tools.deploy.manifests.front_environment`; tritonserver listens where that
environment forwards, and the supervisor beside it gets the runtime API and log the front uses.
A real HAProxy checks the rendered config with that environment, and docker/front.sh (compose's
entry point of the front) runs in real network namespaces.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tools.deploy import manifests
from tools.deploy.render import render_k8s
from tools.front import haproxy_config
from tools.front.plan import FrontPlan
from tools.serve.server_config import TritonServerConfig

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
FRONT_SH = ROOT / "docker" / "front.sh"
RECORDS = Path(__file__).parent / "data" / "artifact"
COMPOSE_GATEWAY = "api:8080"  # the `api` service of docker-compose.yml, on the compose network
HAPROXY = shutil.which("haproxy") or next(
    (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if os.access(p, os.X_OK)), None)
needs_haproxy = pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed "
                                   "(apt-get install haproxy; scripts/setup.sh does where it can)")


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))


def _default(value: str) -> str:
    """The default of a ``${VAR:-default}`` Compose interpolation (the text itself otherwise)."""
    match = re.fullmatch(r"\$\{\w+:-(.+)\}", value)
    return match.group(1) if match else value


@pytest.fixture(scope="module", params=["cpu", "gpu"])
def pod(request, tmp_path_factory) -> dict:
    """The pod spec of an artifact render of each target."""
    target = request.param
    output = tmp_path_factory.mktemp(f"front-{target}") / "k8s"
    render_k8s(ROOT / "repository.yaml", target, output, image="registry.example/t:1",
               artifact=RECORDS / f"{target}.artifact.json")
    deployment = yaml.safe_load((output / "manifests" / "deployment.yaml").read_text())
    return deployment["spec"]["template"]["spec"]


def _containers(pod: dict) -> tuple[dict, dict]:
    named = {c["name"]: c for c in pod["containers"]}
    return named["triton"], named["front"]


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def _mount_path(container: dict, volume: str) -> str:
    (path,) = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == volume]
    return path


def test_compose_and_the_pod_run_the_repositorys_haproxy_cfg_with_one_environment(pod):
    services = _compose()["services"]
    triton, front = _containers(pod)
    compose_config = services["front"]["command"][-1]
    pod_config = front["command"][-1]

    # the same command on the config beside the models tritonserver serves
    assert services["front"]["command"] == manifests.front_command("/models")
    repository = next(a.split("=", 1)[1] for a in triton["args"]
                      if a.startswith("--model-repository="))
    assert front["command"] == manifests.front_command(repository)
    assert Path(compose_config).name == Path(pod_config).name == haproxy_config.CONFIG_NAME
    assert Path(pod_config).parent == Path(repository)
    assert _mount_path(front, "repositories") == _mount_path(triton, "repositories")
    assert all(m.get("readOnly") for m in front["volumeMounts"])
    # one environment: the compose file's is the function's, the pod's is rendered from it; only
    # the gateway's address differs (compose's `api` service, the pod's gateway Service)
    gateway = _env(front)["FORGE_GATEWAY"]
    assert services["front"]["environment"] == manifests.front_environment(COMPOSE_GATEWAY)
    assert _env(front) == manifests.front_environment(gateway)
    assert gateway.startswith(f"{manifests.API_NAME}.triton-forge.svc.")
    assert set(manifests.front_environment(gateway)) == set(haproxy_config.ENV_DEFAULTS)


def test_tritonserver_listens_on_loopback_where_the_front_forwards(pod):
    env = manifests.front_environment(COMPOSE_GATEWAY)
    triton, _ = _containers(pod)
    compose_args = [a.replace("${TRITON_ADMIN_KEY:?set TRITON_ADMIN_KEY, see docs/gpu.md}", "k")
                    for a in _compose()["services"]["triton"]["command"][1:]]
    for args in (compose_args, [a.replace("$(TRITON_ADMIN_KEY)", "k") for a in triton["args"][1:]
                                if a.split("=")[0] in {f.split("=")[0] for f in compose_args}]):
        config = TritonServerConfig.from_args(args)
        assert f"{config.http_address}:{config.http_port}" == env["FORGE_TRITON_HTTP"]
        assert f"{config.grpc_address}:{config.grpc_port}" == env["FORGE_TRITON_GRPC"]
        assert config.http_address == config.grpc_address == "127.0.0.1"
        # the front takes the public ports; the metrics keep every interface for Prometheus
        assert env["FORGE_FRONT_HTTP"].endswith(f":{manifests.HTTP_PORT}")
        assert env["FORGE_FRONT_GRPC"].endswith(f":{manifests.GRPC_PORT}")
        assert (config.metrics_address, config.metrics_port) == ("0.0.0.0", manifests.METRICS_PORT)


def test_the_supervisor_beside_tritonserver_gets_the_fronts_runtime_api_and_log(pod):
    services = _compose()["services"]
    triton, front = _containers(pod)
    wanted = {k: manifests.front_environment(COMPOSE_GATEWAY)[k] for k in manifests.CONTROLLER_ENV}

    for supervisor_env, front_env in ((services["triton"]["environment"],
                                       services["front"]["environment"]),
                                      (_env(triton), _env(front))):
        assert {k: supervisor_env[k] for k in wanted} == wanted
        assert {k: front_env[k] for k in wanted} == wanted
        # both on the loopback of the one namespace the two containers share
        assert all("127.0.0.1:" in value for value in wanted.values())


def test_the_service_reaches_the_front_and_monitoring_reaches_tritonserver(pod):
    triton, front = _containers(pod)
    ports = lambda c: {p["name"]: p["containerPort"] for p in c["ports"]}  # noqa: E731

    assert ports(front) == {"http": manifests.HTTP_PORT, "grpc": manifests.GRPC_PORT}
    assert ports(triton) == {"metrics": manifests.METRICS_PORT,
                             manifests.STATUS_PORT_NAME: manifests.STATUS_PORT}
    assert front["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert front["livenessProbe"]["tcpSocket"] == {"port": "http"}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):  # tritonserver itself
        command = triton[probe]["exec"]["command"]
        assert command[command.index("--url") + 1] == (
            f"http://{manifests.front_environment(COMPOSE_GATEWAY)['FORGE_TRITON_HTTP']}")


def test_the_front_image_is_pinned_once_by_digest_to_the_2_6_branch():
    compose_image = _default(_compose()["x-front-image"])

    assert compose_image == manifests.FRONT_IMAGE
    assert re.fullmatch(r"docker\.io/library/haproxy:2\.6\.\d+-\w+@sha256:[0-9a-f]{64}",
                        manifests.FRONT_IMAGE)
    assert manifests.DEV_FRONT_IMAGES == {"cpu": "triton-forge/front-cpu:local",
                                          "gpu": manifests.FRONT_IMAGE}


def test_the_pods_front_image_is_the_official_one_unless_named_or_a_cpu_dev_build(tmp_path):
    def front_image(**options) -> str:
        out = tmp_path / f"k8s-{len(list(tmp_path.iterdir()))}"
        render_k8s(ROOT / "repository.yaml", options.pop("target", "cpu"), out, **options)
        spec = yaml.safe_load((out / "manifests" / "deployment.yaml").read_text())
        return _containers(spec["spec"]["template"]["spec"])[1]["image"]

    cpu_artifact = {"artifact": RECORDS / "cpu.artifact.json", "image": "r.example/t:1"}
    assert front_image(**cpu_artifact) == manifests.FRONT_IMAGE
    assert front_image(**cpu_artifact, front_image="r.example/front-cpu:1") == "r.example/front-cpu:1"
    assert front_image(dev_build=True) == "triton-forge/front-cpu:local"


@needs_haproxy
def test_haproxy_accepts_the_rendered_config_with_the_compose_and_pod_environment(tmp_path):
    """A real HAProxy checks a rendered config (two models with objectives, one without), its
    binds, runtime API and log target expanded from the environment compose and the pod set."""
    plan = FrontPlan({"text_embedding": 600.0, "image_classification": 250.0},
                     ("image_classification", "text_embedding", "text_tokenizer"))
    haproxy_config.write(plan, tmp_path)
    env = {"PATH": os.environ.get("PATH", ""), **manifests.front_environment(COMPOSE_GATEWAY)}

    result = subprocess.run([HAPROXY, "-c", "-f", str(tmp_path / haproxy_config.CONFIG_NAME)],
                            env=env, capture_output=True, text=True, timeout=60)

    assert result.returncode == 0, result.stdout + result.stderr
    text = (tmp_path / haproxy_config.CONFIG_NAME).read_text()
    for name in manifests.front_environment(COMPOSE_GATEWAY):
        assert f"${{{name}-" in text, f"the config no longer reads {name}"


# --- docker/front.sh in real network namespaces -----------------------------------------------

NAMESPACES = os.geteuid() == 0 and all(shutil.which(t) for t in ("unshare", "nsenter", "ip"))
needs_namespaces = pytest.mark.skipif(
    not NAMESPACES, reason="needs root with unshare, nsenter and ip (iproute2) to give the "
    "script a network namespace of its own, as a container has")

HEALTHY_CFG = """global
    maxconn 64
defaults
    mode http
    timeout client 5s
    timeout connect 5s
    timeout server 5s
frontend http
    bind 127.0.0.1:8000
    http-request return status 200 content-type text/plain string ok
"""


def _front_in_a_namespace(tmp_path: Path, *, interface: bool) -> subprocess.Popen:
    """docker/front.sh on a real haproxy, in a new network namespace holding loopback and (with
    ``interface``) a veth pair standing for the container's eth0."""
    config = tmp_path / "haproxy.cfg"
    config.write_text(HEALTHY_CFG)
    setup = "ip link set lo up" + (" && ip link add eth0 type veth peer name eth1"
                                   if interface else "")
    return subprocess.Popen(
        ["unshare", "--net", "sh", "-c",
         f'{setup} && exec sh "$0" {HAPROXY} -W -db -f {config}', str(FRONT_SH)],
        env={"PATH": os.environ["PATH"], "FRONT_NETNS_CHECK_S": "0.2"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _in_namespace(proc: subprocess.Popen, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["nsenter", "-t", str(proc.pid), "-n", *command], capture_output=True,
                          text=True, timeout=30)


def _wait_listening(proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 15
    while "127.0.0.1:8000" not in _in_namespace(proc, "ss", "-Hltn").stdout:
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "haproxy did not listen within 15 s"
        time.sleep(0.1)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@needs_haproxy
@needs_namespaces
def test_the_front_stops_haproxy_and_exits_1_when_its_namespace_loses_its_interfaces(tmp_path):
    """What a restart of the triton container leaves the front in (Docker): a namespace with
    loopback alone. The entry point notices, stops HAProxy gracefully and exits 1, so the
    service's restart policy starts it again in the triton container's new namespace."""
    proc = _front_in_a_namespace(tmp_path, interface=True)
    try:
        _wait_listening(proc)
        assert proc.poll() is None
        _in_namespace(proc, "ip", "link", "del", "eth0")
        code = proc.wait(15)
    finally:
        _stop(proc)
    output = proc.stdout.read()

    assert code == 1, output
    assert "the network namespace shared with triton is gone" in output
    assert "All workers exited" in output, "HAProxy was not stopped gracefully"


@needs_haproxy
@needs_namespaces
def test_the_front_stops_haproxy_gracefully_on_its_stop_signal_and_exits_0(tmp_path):
    proc = _front_in_a_namespace(tmp_path, interface=True)
    try:
        _wait_listening(proc)
        answer = _in_namespace(proc, "python3", "-c", "import urllib.request; print("
                               "urllib.request.urlopen('http://127.0.0.1:8000/').read().decode())")
        os.kill(proc.pid, signal.SIGUSR1)  # compose's stop_signal
        code = proc.wait(15)
    finally:
        _stop(proc)
    output = proc.stdout.read()

    assert answer.stdout.strip() == "ok", answer.stderr
    assert code == 0, output
    assert "namespace shared with triton is gone" not in output


@needs_haproxy
@needs_namespaces
def test_the_front_serves_on_without_watching_when_it_starts_with_loopback_alone(tmp_path):
    """network_mode none or host-like setups: nothing to watch, and no restart loop."""
    proc = _front_in_a_namespace(tmp_path, interface=False)
    try:
        _wait_listening(proc)
        time.sleep(1)  # five check intervals
        running = proc.poll() is None
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(15)
    finally:
        _stop(proc)

    assert running
    assert "not watching" in proc.stdout.read()


# --- the gateway by name: another container (compose's `api`) or a Service --------------------

# Run in a network and mount namespace of its own (root): a name server on its loopback answers
# `gateway.test` with the address in a file (none: NXDOMAIN), two stand-in gateways answer on
# 127.0.0.2 and 127.0.0.3, a stand-in tritonserver on 127.0.0.1, and HAProxy runs the rendered
# config with FORGE_GATEWAY=gateway.test:8080 and the namespace's resolv.conf naming that server.
# It prints what /v1/models and /v2/health/ready answered at each step, as JSON.
GATEWAY_BY_NAME = r'''
import http.client, http.server, json, os, socket, struct, subprocess, sys, threading, time

here, haproxy = sys.argv[1], sys.argv[2]
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
with open(f"{here}/resolv.conf", "w") as f:
    f.write("nameserver 127.0.0.1\n")
subprocess.run(["mount", "--bind", f"{here}/resolv.conf", "/etc/resolv.conf"], check=True)
answer = {"address": None}

def name_server():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 53))
    while True:
        query, peer = sock.recvfrom(4096)
        end = 12
        while query[end]:
            end += query[end] + 1
        question = query[12:end + 5]
        labels, i = [], 12
        while query[i]:
            labels.append(query[i + 1:i + 1 + query[i]].decode())
            i += query[i] + 1
        qtype = struct.unpack(">H", query[end + 1:end + 3])[0]
        known = ".".join(labels).lower() == "gateway.test" and answer["address"]
        records = b""
        if known and qtype == 1:  # A
            records = struct.pack(">HHHIH", 0xC00C, 1, 1, 1, 4) + socket.inet_aton(answer["address"])
        flags = 0x8180 if known else 0x8183  # NOERROR or NXDOMAIN
        sock.sendto(query[:2] + struct.pack(">HHHHH", flags, 1, 1 if records else 0, 0, 0)
                    + question + records, peer)

def stand_in(address, port, text):
    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *args):
            pass
    http.server.ThreadingHTTPServer((address, port), Answer).serve_forever()

for target, args in ((name_server, ()), (stand_in, ("127.0.0.1", 18000, "tritonserver")),
                     (stand_in, ("127.0.0.2", 8080, "gateway one")),
                     (stand_in, ("127.0.0.3", 8080, "gateway two"))):
    threading.Thread(target=target, args=args, daemon=True).start()
env = {"PATH": os.environ["PATH"], "FORGE_FRONT_HTTP": "127.0.0.1:8000",
       "FORGE_FRONT_GRPC": "127.0.0.1:8001", "FORGE_GATEWAY": "gateway.test:8080"}
front = subprocess.Popen([haproxy, "-W", "-db", "-f", f"{here}/haproxy.cfg"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

def get(path):
    try:
        conn = http.client.HTTPConnection("127.0.0.1", 8000, timeout=5)
        conn.request("GET", path)
        response = conn.getresponse()
        return [response.status, response.read().decode()]
    except OSError as exc:
        return [0, type(exc).__name__]

def until(path, text, seconds=30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = get(path)
        if text in got[1]:
            return got
        time.sleep(0.2)
    return got

steps = {"started": [until("/v2/health/ready", "tritonserver"), get("/v1/models")]}
answer["address"] = "127.0.0.2"
steps["resolves"] = [until("/v1/models", "gateway one"), get("/v2/health/ready")]
answer["address"] = "127.0.0.3"
steps["moved"] = [until("/v1/models", "gateway two"), get("/v2/health/ready")]
answer["address"] = None
gone = time.monotonic()
steps["gone"] = [until("/v1/models", "gateway is not running"), get("/v2/health/ready"),
                 round(time.monotonic() - gone, 1)]
front.terminate()
steps["alive"] = front.poll() is None or front.wait(10) == 0
print(json.dumps(steps))
'''


def _front_env(gateway: str, ports: list[int]) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", ""), "FORGE_FRONT_HTTP": f"127.0.0.1:{ports[0]}",
            "FORGE_FRONT_GRPC": f"127.0.0.1:{ports[1]}", "FORGE_TRITON_HTTP": f"127.0.0.1:{ports[2]}",
            "FORGE_FRONT_ADMIN": f"ipv4@127.0.0.1:{ports[3]}",
            "FORGE_FRONT_LOG": f"127.0.0.1:{ports[4]}", "FORGE_GATEWAY": gateway}


@needs_haproxy
def test_the_front_starts_and_serves_triton_while_the_gateway_s_name_does_not_resolve(tmp_path):
    """Compose starts the front before the `api` container exists: HAProxy must not refuse to
    start on a gateway name nobody answers yet. /v2/ is served; the API paths answer 503."""
    import http.server
    import threading
    import urllib.error
    import urllib.request

    from tools.net import free_ports

    haproxy_config.write(FrontPlan({}, ("toy",)), tmp_path)
    ports = free_ports(5)

    class Triton(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    triton = http.server.ThreadingHTTPServer(("127.0.0.1", ports[2]), Triton)
    threading.Thread(target=triton.serve_forever, daemon=True).start()
    front = subprocess.Popen([HAPROXY, "-W", "-db", "-f", str(tmp_path / haproxy_config.CONFIG_NAME)],
                             env=_front_env("no-such-gateway.invalid:8080", ports),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    try:
        url = f"http://127.0.0.1:{ports[0]}"
        deadline = time.monotonic() + 15
        while True:
            try:
                ready = urllib.request.urlopen(f"{url}/v2/health/ready", timeout=5).status
                break
            except OSError:
                assert front.poll() is None, front.stdout.read()
                assert time.monotonic() < deadline, "the front did not serve within 15 s"
                time.sleep(0.1)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}/v1/models", timeout=5)
        body = json.loads(refused.value.read())
    finally:
        _stop(front)
        triton.shutdown()

    assert ready == 200
    assert refused.value.code == 503 and body == {"error": "the OpenAI/TEI gateway is not running"}


@needs_haproxy
@needs_namespaces
def test_the_front_finds_the_gateway_once_its_name_resolves_and_follows_it_to_a_new_address(tmp_path):
    """What compose does to the `api` container: it appears after the front started, a restart
    gives it a new address (measured with Podman), and a stopped one's name stops resolving. The
    front resolves the name again while it runs: the API paths reach the gateway once the name
    answers, the new address after it moved, and answer 503 within seconds once the name is
    gone (not after connect timeouts to the old address); /v2/ is served throughout."""
    haproxy_config.write(FrontPlan({}, ("toy",)), tmp_path)
    script = tmp_path / "gateway_by_name.py"
    script.write_text(GATEWAY_BY_NAME)

    result = subprocess.run(["unshare", "--net", "--mount", sys.executable, str(script),
                             str(tmp_path), HAPROXY], capture_output=True, text=True, timeout=180)

    assert result.returncode == 0, result.stderr
    steps = json.loads(result.stdout)
    (triton, api) = steps["started"]
    assert triton == [200, "tritonserver"]
    assert api[0] == 503 and "gateway is not running" in api[1]
    assert steps["resolves"] == [[200, "gateway one"], [200, "tritonserver"]]
    assert steps["moved"] == [[200, "gateway two"], [200, "tritonserver"]]
    refused, triton_after, seconds = steps["gone"]
    assert refused[0] == 503 and "gateway is not running" in refused[1]
    assert triton_after == [200, "tritonserver"] and seconds < 10, seconds
    print(f"the front answered 503 {seconds} s after the gateway's name stopped resolving")
