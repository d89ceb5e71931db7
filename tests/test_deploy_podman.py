"""The rendered Deployment under `podman kube play` with the CPU images and the real artifact.

- The artifact render starts with no build step: the fetch init container copies the packaged
  repository, the verify init container checks it against build_manifest.json, the pod gets
  ready, serves both pipelines through its front (HAProxy on the haproxy.cfg the artifact holds,
  the supervisor running its admission controller) and keeps the admin APIs closed without the
  Secret's key.
- Overload for longer than the liveness window: the rendered liveness and readiness commands,
  run at their periods as a kubelet would, never reach their failure thresholds (busy is not
  dead), and the container is never restarted.
- A killed stub: the readiness command fails, then passes again once the supervisor reloaded the
  model, with no container restart.
- A tampered artifact fails the verify command with the file named.
- The OpenAI/TEI gateway's own Deployment, played as a second pod: it copies and verifies the
  artifact as the triton pod does, gets ready on /health, and the front of the triton pod routes
  /v1/embeddings and /embed to it on the pod's HTTP port while /v2/ stays tritonserver's. Podman
  has no Services: each pod reaches the other by its pod name (the Service names in the
  gateway's --url and the front's FORGE_GATEWAY are swapped for them, tests/podman_helpers.py),
  and the NetworkPolicies are not enforced.

Podman 4.3 runs no readiness probe and runs the liveness probe only as a healthcheck nobody
triggers here (no systemd), so the tests exec the rendered probe commands in the container and
assert their exit codes over time (tests/podman_helpers.py has the other adaptations).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import pytest
import yaml

from podman_helpers import CONTAINERS_CONF, Pod
from tools.deploy import manifests
from tools.deploy.artifact import ArtifactRecord, package
from tools.deploy.render import render_k8s
from tools.net import free_ports

ROOT = Path(__file__).resolve().parents[1]
TAGS = ROOT / "build" / "images" / "tags.env"
REPOSITORY = ROOT / "build" / "model_repositories" / "cpu"
PODMAN = shutil.which("podman")
START_TIMEOUT_S = 600
OVERLOAD_S = 45  # longer than the liveness window: periodSeconds 10 x failureThreshold 3
OVERLOAD_CLIENTS = 200  # text_tokenizer's queue holds 64 requests: most wait or are refused


def _images() -> tuple[str, str, str] | None:
    """The serving, builder and front images scripts/compose-images.sh built, if all are here."""
    if PODMAN is None or not TAGS.is_file():
        return None
    tags = dict(line.split("=", 1) for line in TAGS.read_text().split() if "=" in line)
    images = tuple(f"localhost/{tags.get(k, '')}"
                   for k in ("TRITON_CPU_IMAGE", "BUILDER_CPU_IMAGE", "FRONT_CPU_IMAGE"))
    for image in images:
        if subprocess.run([PODMAN, "image", "exists", image], timeout=60).returncode != 0:
            return None
    return images  # type: ignore[return-value]


IMAGES = _images()
pytestmark = [
    pytest.mark.system,  # a pod of the CPU images under podman kube play
    pytest.mark.server,
    pytest.mark.timeout(START_TIMEOUT_S + 600),
    pytest.mark.skipif(
        IMAGES is None,
        reason="podman or the CPU images (serving, builder, front) are missing (apt-get install "
        "podman runc; scripts/compose-images.sh builds them and writes build/images/tags.env)"),
    pytest.mark.skipif(
        not (REPOSITORY / "build_manifest.json").is_file(),
        reason="no built cpu repository in build/model_repositories/cpu (the compose smoke's "
        "builder writes it; or tools build-repo --target cpu --repository build/model_repositories/cpu)"),
]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    if "CONTAINERS_CONF" not in env:
        conf = ROOT / "build" / "compose-smoke" / "containers.conf"
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(CONTAINERS_CONF)
        env["CONTAINERS_CONF"] = str(conf)
    return env


def _old_supervisor_env(image: str) -> tuple[str, ...]:
    """Environment variables the image's supervisor predates (the status endpoint and retry
    landed beside this branch): dropped, so an older image still starts."""
    found = subprocess.run([PODMAN, "run", "--rm", "--entrypoint", "grep", image, "-c",
                            "forge-metrics-port", "/opt/triton-forge/docker/triton_supervisor.py"],
                           env=_env(), capture_output=True, text=True, timeout=120)
    return () if found.stdout.strip() not in ("", "0") else ("FORGE_METRICS_PORT",)


@pytest.fixture(scope="module")
def record(tmp_path_factory) -> Path:
    image, _, _ = IMAGES
    os.environ.setdefault("CONTAINERS_CONF", _env()["CONTAINERS_CONF"])
    built = package(REPOSITORY, "localhost/triton-forge/models", image, engine="podman")
    path = tmp_path_factory.mktemp("artifact") / "cpu.artifact.json"
    path.write_text(built.to_text())
    return path


@pytest.fixture(scope="module")
def rendered(record, tmp_path_factory) -> Path:
    """The artifact render of the CPU images, with the Debian-built front."""
    image, _, front = IMAGES
    out = tmp_path_factory.mktemp("k8s") / "k8s"
    render_k8s(ROOT / "repository.yaml", "cpu", out, image=image, front_image=front,
               artifact=record)
    return out


@pytest.fixture(scope="module")
def gateway_name() -> str:
    """The name the gateway's pod is played under (the triton pod's front needs it first)."""
    return f"tf-k8s-api-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def pod(rendered, gateway_name, tmp_path_factory):
    image, _, _ = IMAGES
    deployment = yaml.safe_load((rendered / "manifests" / "deployment.yaml").read_text())
    front = next(c for c in deployment["spec"]["template"]["spec"]["containers"]
                 if c["name"] == "front")
    service = next(e["value"] for e in front["env"] if e["name"] == "FORGE_GATEWAY").split(":")[0]
    played = Pod(deployment, tmp_path_factory.mktemp("pod"), PODMAN, env=_env(),
                 drop_env=_old_supervisor_env(image), hosts={service: f"{gateway_name}-pod-0"})
    try:
        played.play(timeout=START_TIMEOUT_S)
        played.ready_s = played.wait_ready(START_TIMEOUT_S)
        yield played
    except BaseException:
        print(f"--- {played.container} log\n{played.logs(tail=80)}")
        print(f"--- {played.front} log\n{played.logs(played.front, tail=30)}")
        raise
    finally:
        played.down()


def _post(url: str, path: str, body: dict, timeout: float = 30) -> tuple[int, dict]:
    host, _, port = url.removeprefix("http://").rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        return response.status, json.loads(data or b"{}")
    finally:
        conn.close()


TEXT = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["hello from a pod"]}]}


def _classify_chelsea(url: str) -> list[int]:
    """image_classification of scikit-image's chelsea.png (a cat) over HTTP: the top-5 classes."""
    import numpy as np
    import skimage
    import tritonclient.http as httpclient

    photo = (Path(skimage.__file__).parent / "data" / "chelsea.png").read_bytes()
    client = httpclient.InferenceServerClient(url.removeprefix("http://"), network_timeout=60)
    try:
        image = httpclient.InferInput("IMAGE", [1, 1], "BYTES")
        image.set_data_from_numpy(np.array([[photo]], dtype=np.object_))
        result = client.infer("image_classification", [image])
        return result.as_numpy("CLASS_INDEX")[0].tolist()
    finally:
        client.close()


def _stub_pids(pod: Pod, model: str) -> list[int]:
    script = ("import os\nfor p in filter(str.isdigit, os.listdir('/proc')):\n try:\n"
              "  c = open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')\n except OSError:\n  continue\n"
              f" if c[0].endswith(b'stub') and b'/{model}/' in c[1]:\n  print(p)\n")
    out = pod.run("exec", pod.container, "python3", "-c", script, check=True).stdout
    return [int(p) for p in out.split()]


def test_the_artifact_pod_builds_nothing_verifies_and_serves_both_pipelines(pod, record):
    print(f"ready {pod.ready_s:.0f} s after kube play returned")
    reference = json.loads(record.read_text())["reference"]
    init = pod.deployment["spec"]["template"]["spec"]["initContainers"]
    assert [c["name"] for c in init] == ["fetch-repository", "verify-repository"]
    assert init[0]["image"] == reference
    # Podman removes finished init containers (and their logs): run the verify command again on
    # the copy the serving container reads.
    verify = pod.run("exec", pod.container, *init[1]["command"], check=True)
    assert "match build_manifest.json" in verify.stdout, verify.stdout + verify.stderr
    assert "build-repo" not in json.dumps(pod.deployment)
    inspect = json.loads(pod.run("inspect", pod.container, check=True).stdout)[0]
    assert inspect["HostConfig"]["ReadonlyRootfs"] is True
    assert inspect["Config"]["User"].split(":")[0] == str(manifests.RUN_AS)
    top = pod.run("exec", pod.container, "cat", "/proc/1/cmdline", check=True).stdout
    assert top.split("\0")[0] == manifests.TINI  # PID 1 reaps orphans

    # Through the front: HAProxy on the haproxy.cfg the artifact carried, its admission
    # controller in the supervisor beside tritonserver, tritonserver on the pod's loopback alone
    front = json.loads(pod.run("inspect", pod.front, check=True).stdout)[0]
    repository = pod.deployment["spec"]["template"]["spec"]["containers"][0]["env"][1]["value"]
    assert [front["Path"], *front["Args"]] == manifests.front_command(repository)
    assert front["State"]["Running"] and front["HostConfig"]["ReadonlyRootfs"] is True
    assert "front admission on" in pod.logs()
    listening = pod.run("exec", pod.container, "cat", "/proc/net/tcp", check=True).stdout
    local = {line.split()[1] for line in listening.splitlines()[1:] if line.split()[3] == "0A"}
    assert f"0100007F:{manifests.TRITON_HTTP_PORT:04X}" in local  # 127.0.0.1:18000
    assert f"00000000:{manifests.TRITON_HTTP_PORT:04X}" not in local
    assert f"00000000:{manifests.HTTP_PORT:04X}" in local  # the front, on the pod's interfaces
    status, answer = _post(pod.http, "/v2/models/text_embedding/infer", TEXT)
    assert status == 200 and answer["outputs"][0]["shape"] == [1, 384]
    host, _, port = pod.http.removeprefix("http://").rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.putrequest("POST", "/v2/models/text_embedding/infer")
    conn.putheader("Content-Length", str(64 << 20))
    conn.endheaders()  # no body: the front answers from the head alone
    oversized = conn.getresponse()
    assert oversized.status == 413 and "request body over" in json.loads(oversized.read())["error"]
    conn.close()
    top5 = _classify_chelsea(pod.http)
    assert top5[0] in (281, 282, 285), top5  # tabby, tiger cat, Egyptian cat
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/v2/repository/index", body="{}")
    assert conn.getresponse().status == 403  # the admin APIs need the Secret's key
    conn.close()


def test_overload_longer_than_the_liveness_window_restarts_nothing(pod):
    container = pod.deployment["spec"]["template"]["spec"]["containers"][0]
    live, ready = container["livenessProbe"], container["readinessProbe"]
    assert OVERLOAD_S > live["periodSeconds"] * live["failureThreshold"]
    statuses: Counter = Counter()
    stop = time.monotonic() + OVERLOAD_S
    lock = threading.Lock()

    def client() -> None:
        while time.monotonic() < stop:
            try:
                status, _ = _post(pod.http, "/v2/models/text_embedding/infer", TEXT, timeout=10)
            except OSError as exc:
                status = type(exc).__name__
            with lock:
                statuses[status] += 1

    clients = [threading.Thread(target=client, daemon=True) for _ in range(OVERLOAD_CLIENTS)]
    for t in clients:
        t.start()
    time.sleep(3)  # the queues fill
    results: dict[str, list[int]] = {"livenessProbe": [], "readinessProbe": [], "full": []}
    verdicts: Counter = Counter()
    full = ["python3", manifests.HEALTHCHECK, "--url",
            f"http://127.0.0.1:{manifests.TRITON_HTTP_PORT}", "--repository",
            pod.deployment["spec"]["template"]["spec"]["containers"][0]["env"][1]["value"],
            "--probes", manifests.PROBES, "--timeout", "5"]
    while time.monotonic() < stop:
        tick = time.monotonic()
        for kind in ("livenessProbe", "readinessProbe"):
            code, verdict = pod.probe_verdict(kind)
            results[kind].append(code)
            verdicts[f"{kind} {verdict}"] += 1
        # The probe every container ran before this change: any refused inference fails it.
        results["full"].append(pod.run("exec", pod.container, *full, timeout=60).returncode)
        time.sleep(max(0.0, live["periodSeconds"] - (time.monotonic() - tick)))
    for t in clients:
        t.join(timeout=30)

    def worst_run(codes: list[int]) -> int:
        run = worst = 0
        for code in codes:
            run = run + 1 if code else 0
            worst = max(worst, run)
        return worst

    print(f"overload {OVERLOAD_S} s, {OVERLOAD_CLIENTS} clients: answers {dict(statuses)}; probe "
          f"exit codes liveness {results['livenessProbe']}, readiness {results['readinessProbe']}, "
          f"the old full probe {results['full']}; verdicts {dict(verdicts)}")
    refused = sum(n for s, n in statuses.items() if s != 200)
    assert refused > 0, f"the load did not overload the pod (all answered): {dict(statuses)}"
    assert worst_run(results["livenessProbe"]) < live["failureThreshold"]
    assert worst_run(results["readinessProbe"]) < ready["failureThreshold"]
    assert pod.restarts() == 0
    assert _post(pod.http, "/v2/models/text_embedding/infer", TEXT)[0] == 200


def test_a_killed_stub_fails_readiness_then_the_reload_makes_it_ready(pod):
    readiness = pod.deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["exec"]["command"]
    stubs = _stub_pids(pod, "text_tokenizer")
    assert len(stubs) == 2, stubs  # two tokenizer instances on the cpu target
    # The rendered readiness command in a loop inside the container (no exec round trip per run).
    loop = ("import subprocess, sys, time, os, signal\n"
            f"cmd = {readiness!r}\n"
            f"for pid in {stubs!r}:\n    os.kill(pid, signal.SIGKILL)\n"
            "t0 = time.monotonic(); seen = []\n"
            "while time.monotonic() - t0 < 60:\n"
            "    code = subprocess.run(cmd, capture_output=True).returncode\n"
            "    seen.append((round(time.monotonic() - t0, 2), code))\n"
            "    if code == 0 and any(c for _, c in seen):\n        break\n"
            "    time.sleep(0.1)\n"
            "print(seen)\n")
    out = pod.run("exec", pod.container, "python3", "-c", loop, timeout=120, check=True).stdout
    seen = eval(out.strip().splitlines()[-1])  # noqa: S307 - our own list of tuples
    print(f"readiness after killing both text_tokenizer stubs (s, exit code): {seen}")
    failed = [t for t, code in seen if code]
    assert failed, "readiness never failed after the stubs were killed"
    assert seen[-1][1] == 0, "readiness did not pass again within 60 s"
    assert set(_stub_pids(pod, "text_tokenizer")).isdisjoint(stubs)  # new stubs: reloaded
    assert pod.restarts() == 0
    assert "reloaded model 'text_tokenizer'" in pod.logs()


def test_a_tampered_artifact_fails_the_verify_command_naming_the_file(tmp_path):
    image, _, _ = IMAGES
    copy = tmp_path / "cpu"
    shutil.copytree(REPOSITORY, copy)
    target = next(copy.glob("minilm_encoder/1/*.onnx"))
    with open(target, "r+b") as handle:
        handle.seek(1000)
        handle.write(b"\0\1\2\3")
    result = subprocess.run(
        [PODMAN, "run", "--rm", "--network", "none", "-v", f"{copy}:/repositories/cpu:ro", image,
         "python3", manifests.VERIFY, "--repository", "/repositories/cpu", "--target", "cpu"],
        env=_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert f"/repositories/cpu/minilm_encoder/1/{target.name}: sha256" in result.stderr
    assert "refusing to serve it" in result.stderr


def test_the_artifact_is_content_addressed(record):
    built = ArtifactRecord.read(record)
    inspect = json.loads(subprocess.run([PODMAN, "image", "inspect", built.reference], env=_env(),
                                        capture_output=True, text=True, timeout=60, check=True).stdout)[0]
    assert inspect["Labels"]["org.triton-forge.manifest.sha256"] == built.manifest_sha256
    assert built.tag.startswith("cpu-") and built.manifest_sha256.startswith(built.tag[4:])



@pytest.fixture(scope="module")
def gateway(pod, rendered, gateway_name, tmp_path_factory):
    """The gateway's Deployment (manifests/api.yaml) played beside the triton pod, ready."""
    api = next(d for d in yaml.safe_load_all((rendered / "manifests" / "api.yaml").read_text())
               if d["kind"] == "Deployment")
    played = Pod(api, tmp_path_factory.mktemp("api"), PODMAN, env=_env(), name=gateway_name,
                 hosts={manifests.NAME: pod.host})
    container = f"{played.host}-api"
    try:
        played.play_s = played.play(timeout=START_TIMEOUT_S)
        started = time.monotonic()
        probe = api["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]
        url = f"http://127.0.0.1:{played.ports[probe['port']]}{probe['path']}"
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            assert time.monotonic() < deadline, f"{url} not 200 within 120 s"
            time.sleep(1)
        played.ready_s = time.monotonic() - started
        played.api_container = container
        yield played
    except BaseException:
        print(f"--- {container} log\n{played.logs(container, tail=40)}")
        print(f"--- {pod.front} log\n{pod.logs(pod.front, tail=30)}")
        raise
    finally:
        played.down()


def test_the_front_routes_openai_and_tei_to_the_gateway_pod_and_v2_to_tritonserver(pod, gateway):
    status, openai = _post(pod.http, "/v1/embeddings",
                           {"model": "text_embedding", "input": ["a cat", "a dog"]})
    assert status == 200, openai
    assert [len(item["embedding"]) for item in openai["data"]] == [384, 384]
    assert openai["usage"]["prompt_tokens"] > 0
    host, _, port = pod.http.removeprefix("http://").rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/embed", body=json.dumps({"inputs": ["a cat on a mat"]}),
                 headers={"Content-Type": "application/json"})
    embed = conn.getresponse()
    vectors = json.loads(embed.read())
    conn.close()
    assert embed.status == 200 and [len(v) for v in vectors] == [384]
    status, answer = _post(pod.http, "/v2/models/text_embedding/infer", TEXT)
    assert status == 200 and answer["outputs"][0]["shape"] == [1, 384]  # Triton's own API

    # the gateway pod: the serving image, read-only root, uid 1000, the artifact verified
    image, _, _ = IMAGES
    inspect = json.loads(gateway.run("inspect", gateway.api_container, check=True).stdout)[0]
    assert inspect["ImageName"].removeprefix("localhost/") == image.removeprefix("localhost/")
    assert inspect["HostConfig"]["ReadonlyRootfs"] is True
    assert inspect["Config"]["User"].split(":")[0] == str(manifests.RUN_AS)
    init = gateway.deployment["spec"]["template"]["spec"]["initContainers"]
    assert [c["name"] for c in init] == ["fetch-repository", "verify-repository"]
    verify = gateway.run("exec", gateway.api_container, *init[1]["command"], check=True)
    assert "match build_manifest.json" in verify.stdout, verify.stdout + verify.stderr
    rss = gateway.run("exec", gateway.api_container, "grep", "VmRSS", "/proc/1/status").stdout
    print(f"gateway pod: kube play {gateway.play_s:.0f} s (artifact copied and verified), ready "
          f"{gateway.ready_s:.0f} s later; through the front: /v1/embeddings 2 x 384, "
          f"prompt_tokens {openai['usage']['prompt_tokens']}, /embed 1 x 384; gateway "
          f"{' '.join(rss.split()[1:]) or 'RSS unknown'}")
