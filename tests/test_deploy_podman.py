"""The rendered Deployment run by `podman kube play` with the CPU images: the builder init
container builds the repository, the pod gets healthy, answers inferences, and a killed stub
is reloaded by the watchdog (only that model) without a container restart.

Podman is not Kubernetes: no kubelet, scheduler, Service or HPA runs here. Podman 4.3 also lacks
a few kubelet features, so the test adapts a copy of the Deployment (see ``_for_podman``).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from tools.deploy import manifests
from tools.deploy.render import render_k8s
from tools.net import free_ports

ROOT = Path(__file__).resolve().parents[1]
TAGS = ROOT / "build" / "images" / "tags.env"
PODMAN = shutil.which("podman")
START_TIMEOUT_S = 900  # builder (torch export, ~40 s here) + loading + warm-up, on shared cores
CONTAINERS_CONF = """[containers]
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"
"""


def _images() -> tuple[str, str] | None:
    if PODMAN is None or not TAGS.is_file():
        return None
    tags = dict(line.split("=", 1) for line in TAGS.read_text().split() if "=" in line)
    images = tuple(f"localhost/{tags.get(k, '')}" for k in ("TRITON_CPU_IMAGE", "BUILDER_CPU_IMAGE"))
    for image in images:
        if subprocess.run([PODMAN, "image", "exists", image], timeout=60).returncode != 0:
            return None
    return images  # type: ignore[return-value]


IMAGES = _images()
pytestmark = [
    pytest.mark.server,
    pytest.mark.timeout(START_TIMEOUT_S + 300),
    pytest.mark.skipif(
        IMAGES is None,
        reason="podman or the CPU images are missing (apt-get install podman runc; "
        "scripts/compose-images.sh builds them and writes build/images/tags.env)",
    ),
]


def _for_podman(doc: dict, *, name: str, secret: str, key: str, ports: list[int], volumes: Path) -> dict:
    """Podman 4.3 adaptations of a copy of the rendered Deployment (the rendered one is tested
    against Kubernetes' schemas): it publishes every containerPort on 0.0.0.0 (so: hostPort on
    127.0.0.1), mounts no ConfigMap subPath (so: the spec file by hostPath), turns emptyDirs into
    shared root-owned named volumes (so: fresh world-writable host folders, /dev/shm ones on the
    host's tmpfs), restarts init containers under restartPolicy Always, and does not expand
    $(VAR) in args (so: expanded here, as the kubelet would)."""
    doc = json.loads(json.dumps(doc).replace("$(TRITON_ADMIN_KEY)", key))
    doc["metadata"]["name"] = name
    pod = doc["spec"]["template"]["spec"]
    pod["restartPolicy"] = "OnFailure"
    triton = pod["containers"][0]
    for port, host_port in zip(triton["ports"], ports):
        port.update(hostIP="127.0.0.1", hostPort=host_port)
    for env in triton["env"]:
        if "valueFrom" in env:
            env["valueFrom"]["secretKeyRef"]["name"] = secret
    for container in pod["initContainers"]:
        for mount in container["volumeMounts"]:
            mount.pop("subPath", None)
    for volume in pod["volumes"]:
        if volume["name"] == "spec":
            volume.pop("configMap")
            volume["hostPath"] = {"path": str(ROOT / "repository.yaml"), "type": "File"}
        elif "emptyDir" in volume:
            memory = volume.pop("emptyDir").get("medium") == "Memory"
            path = (Path("/dev/shm") / f"{name}-{volume['name']}") if memory else volumes / volume["name"]
            path.mkdir(parents=True)
            path.chmod(0o1777)
            volume["hostPath"] = {"path": str(path), "type": "Directory"}
    return doc


def _http(url: str, body: dict | None = None, headers: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method="POST" if body is not None else "GET",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, {}


@pytest.fixture
def pod(tmp_path):
    env = dict(os.environ)
    if "CONTAINERS_CONF" not in env:
        (tmp_path / "containers.conf").write_text(CONTAINERS_CONF)
        env["CONTAINERS_CONF"] = str(tmp_path / "containers.conf")

    def podman(*args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess:
        return subprocess.run([PODMAN, *args], env=env, capture_output=True, text=True,
                              timeout=timeout, check=check)

    image, builder = IMAGES
    render_k8s(ROOT / "repository.yaml", "cpu", tmp_path / "k8s", image=image, builder_image=builder)
    rendered = yaml.safe_load((tmp_path / "k8s" / "manifests" / "deployment.yaml").read_text())
    suffix = uuid.uuid4().hex[:8]
    name, secret, key = f"tf-k8s-test-{suffix}", f"tf-k8s-test-admin-{suffix}", uuid.uuid4().hex
    ports = free_ports(3)
    play = tmp_path / "play.yaml"
    play.write_text(yaml.safe_dump(_for_podman(rendered, name=name, secret=secret, key=key,
                                               ports=ports, volumes=tmp_path / "volumes")))
    # Podman reads a secretKeyRef's secret as JSON: key -> base64 value.
    (tmp_path / "secret.json").write_text(json.dumps(
        {manifests.ADMIN_SECRET_KEY: base64.b64encode(key.encode()).decode()}))
    podman("secret", "create", secret, str(tmp_path / "secret.json"), check=True)
    container = f"{name}-pod-0-triton"
    try:
        result = podman("kube", "play", str(play), timeout=START_TIMEOUT_S)
        assert result.returncode == 0, result.stdout + result.stderr
        yield {"podman": podman, "container": container, "http": f"http://127.0.0.1:{ports[0]}",
               "key": key, "deployment": rendered}
    except BaseException:
        logs = podman("logs", "--tail", "80", container)
        print(f"--- {container} log\n{logs.stdout}{logs.stderr}")
        raise
    finally:
        podman("kube", "down", str(play), timeout=180)
        podman("secret", "rm", secret)
        for path in Path("/dev/shm").glob(f"{name}-*"):
            shutil.rmtree(path, ignore_errors=True)


def _wait_healthy(pod) -> float:
    started = time.monotonic()
    while time.monotonic() - started < START_TIMEOUT_S:
        if pod["podman"]("healthcheck", "run", pod["container"], timeout=60).returncode == 0:
            return time.monotonic() - started
        time.sleep(5)
    pytest.fail(f"{pod['container']} not healthy after {START_TIMEOUT_S} s")


def _stub_pids(pod, model: str) -> list[int]:
    script = ("import os\nfor p in filter(str.isdigit, os.listdir('/proc')):\n try:\n"
              "  c = open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')\n except OSError:\n  continue\n"
              f" if c[0].endswith(b'stub') and b'/{model}/' in c[1]:\n  print(p)\n")
    out = pod["podman"]("exec", pod["container"], "python3", "-c", script, check=True).stdout
    return [int(p) for p in out.split()]


def _announced_body_status(url: str, length: int) -> int:
    """The status a POST announcing ``length`` body bytes gets before sending any of them."""
    host, _, port = url.removeprefix("http://").rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.putrequest("POST", "/v2/models/text_embedding/infer")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(length))
        conn.endheaders()
        return conn.getresponse().status
    finally:
        conn.close()


def test_pod_gets_ready_serves_inferences_and_a_killed_stub_is_reloaded_in_place(pod):
    podman, container = pod["podman"], pod["container"]
    waited = _wait_healthy(pod)
    print(f"healthy {waited:.0f} s after kube play returned (it waits for the builder init container)")
    inspect = json.loads(podman("inspect", container, check=True).stdout)[0]
    assert inspect["HostConfig"]["ReadonlyRootfs"] is True
    assert inspect["Config"]["User"].split(":")[0] == str(manifests.RUN_AS)

    status, answer = _http(f"{pod['http']}/v2/models/text_embedding/infer", {"inputs": [
        {"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["hello from a pod"]}]})
    assert status == 200 and answer["outputs"][0]["shape"] == [1, 384]
    index = f"{pod['http']}/v2/repository/index"
    assert _http(index, {})[0] == 403  # admin APIs closed without the Secret's key
    assert _http(index, {}, {manifests.ADMIN_HEADER: pod["key"]})[0] == 200

    readiness = pod["deployment"]["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["exec"]["command"]
    assert podman("exec", container, *readiness).returncode == 0
    assert _announced_body_status(pod["http"], 80_000_000) == 413, "the cpu image's HTTP guard"
    stubs = _stub_pids(pod, "text_tokenizer")
    assert len(stubs) == 2, stubs  # two tokenizer instances on the cpu target
    stub = stubs[0]
    podman("exec", container, "python3", "-c", f"import os, signal; os.kill({stub}, signal.SIGKILL)", check=True)
    killed = time.monotonic()
    # The watchdog (TRITON_WATCHDOG=recover) reloads text_tokenizer alone: a new stub, and the
    # pipeline answers again, with no container restart.
    body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["again"]}]}
    while _http(f"{pod['http']}/v2/models/text_embedding/infer", body)[0] != 200 or not (
            set(_stub_pids(pod, "text_tokenizer")) - set(stubs)):
        assert time.monotonic() - killed < 30, "text_embedding did not answer again within 30 s"
        time.sleep(0.5)
    recovered = time.monotonic() - killed
    print(f"text_embedding answered again {recovered:.1f} s after its tokenizer's stub was killed")
    assert podman("exec", container, *readiness).returncode == 0
    logs = podman("logs", container)
    assert "reloaded model 'text_tokenizer'" in logs.stdout + logs.stderr
    restarts = json.loads(podman("inspect", container, check=True).stdout)[0].get("RestartCount", 0)
    assert restarts == 0, "the container was restarted instead of the model reloaded"
