"""The OpenAI/TEI gateway in `tools deploy k8s`: a Deployment and Service of its own behind the
front of every triton pod, scaled by its own HPA on CPU, reading the repository as the triton
pods get it.

Objects are read from real renders (the artifact, image-volume, plans-Job and dev-build paths);
tests/test_deploy_validate.py checks them against the Kubernetes schemas, and
tests/test_deploy_podman.py plays them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tools.deploy import manifests
from tools.deploy.render import render_k8s
from tools.errors import UserInputError

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "repository.yaml"
RECORDS = Path(__file__).parent / "data" / "artifact"
IMAGE = "registry.example/triton-forge/triton-cpu:2.51"
# Every way the repository reaches the pods: (target, options).
SOURCES = {
    "artifact": ("cpu", {"artifact": RECORDS / "cpu.artifact.json", "image": IMAGE}),
    "image-volume": ("cpu", {"artifact": RECORDS / "cpu.artifact.json", "image": IMAGE,
                             "image_volume": True}),
    "plans-job": ("gpu", {"plans_job": True, "gpu_product": "NVIDIA-A10", "image": IMAGE,
                          "builder_image": "registry.example/triton-forge/builder:25.08"}),
    "dev-build": ("cpu", {"dev_build": True}),
}


def _render(folder: Path, source: str = "artifact", **extra) -> dict[str, dict]:
    """``kind/name`` -> object of every manifest of a render."""
    target, options = SOURCES[source]
    render_k8s(SPEC, target, folder, **options, **extra)
    return {f"{d['kind']}/{d['metadata']['name']}": d
            for p in sorted((folder / "manifests").glob("*.yaml"))
            for d in yaml.safe_load_all(p.read_text())}


@pytest.fixture(scope="module", params=sorted(SOURCES))
def rendered(request, tmp_path_factory) -> tuple[str, dict[str, dict]]:
    return request.param, _render(tmp_path_factory.mktemp("api") / "k8s", request.param)


def _pod(objects: dict[str, dict], name: str) -> dict:
    return objects[f"Deployment/{name}"]["spec"]["template"]["spec"]


def _container(objects: dict[str, dict], name: str, container: str) -> dict:
    return next(c for c in _pod(objects, name)["containers"] if c["name"] == container)


def _arg(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_the_front_of_every_triton_pod_forwards_the_api_paths_to_the_gateway_service(rendered):
    _, objects = rendered
    service = objects[f"Service/{manifests.API_NAME}"]
    (port,) = service["spec"]["ports"]
    gateway = {e["name"]: e.get("value") for e in
               _container(objects, manifests.NAME, "front")["env"]}["FORGE_GATEWAY"]
    api_pods = objects[f"Deployment/{manifests.API_NAME}"]["spec"]["template"]["metadata"]["labels"]
    triton_pods = objects[f"Deployment/{manifests.NAME}"]["spec"]["template"]["metadata"]["labels"]
    (api,) = _pod(objects, manifests.API_NAME)["containers"]

    # the Service's fully qualified name (HAProxy looks it up again without search domains)
    assert gateway == f"{manifests.API_NAME}.triton-forge.svc.cluster.local:{port['port']}"
    assert _matches(service["spec"]["selector"], api_pods)
    assert not _matches(service["spec"]["selector"], triton_pods)
    assert not _matches(objects[f"Service/{manifests.NAME}"]["spec"]["selector"], api_pods)
    assert {p["name"]: p["containerPort"] for p in api["ports"]} == {port["targetPort"]: port["port"]}
    assert _arg(api["command"], "--port") == str(port["port"])
    assert _arg(api["command"], "--host") == "0.0.0.0"


def test_the_gateway_calls_the_pipelines_through_the_triton_service_s_http_port_the_front(rendered):
    _, objects = rendered
    (api,) = _pod(objects, manifests.API_NAME)["containers"]
    service = objects[f"Service/{manifests.NAME}"]["spec"]
    front_ports = {p["name"]: p["containerPort"]
                   for p in _container(objects, manifests.NAME, "front")["ports"]}

    assert api["command"][:3] == ["python3", "-m", "tools.api"]
    host, _, port = _arg(api["command"], "--url").rpartition(":")
    (http,) = [p for p in service["ports"] if p["port"] == int(port)]
    assert host == manifests.NAME and front_ports[http["targetPort"]] == http["port"]


def test_the_gateway_reads_the_repository_the_triton_pods_serve_read_only(rendered):
    source, objects = rendered
    triton = _container(objects, manifests.NAME, "triton")
    (api,) = _pod(objects, manifests.API_NAME)["containers"]
    pod, triton_pod = _pod(objects, manifests.API_NAME), _pod(objects, manifests.NAME)
    repository = next(a.split("=", 1)[1] for a in triton["args"]
                      if a.startswith("--model-repository="))
    (mount,) = [m for m in api["volumeMounts"] if m["name"] == "repositories"]
    volume = lambda p: next(v for v in p["volumes"] if v["name"] == "repositories")  # noqa: E731

    assert _arg(api["command"], "--repository") == repository
    assert mount["readOnly"] is True and repository.startswith(mount["mountPath"])
    assert volume(pod) == volume(triton_pod)
    init = [c["name"] for c in pod["initContainers"]]
    if source == "dev-build":
        # the gateway reads the Python models' files (tokenizers, labels): it builds those alone
        (builder,) = pod["initContainers"]
        only = [builder["command"][i + 1] for i, a in enumerate(builder["command"]) if a == "--only"]
        assert only == ["text_tokenizer", "image_preprocess", "image_postprocess"]
        assert _arg(builder["command"], "--repository") == repository
    else:
        assert init == [c["name"] for c in triton_pod["initContainers"]]
        assert "verify-repository" in init


def test_the_gateway_scales_on_its_own_cpu_in_its_own_bounds(rendered):
    _, objects = rendered
    hpa = objects[f"HorizontalPodAutoscaler/{manifests.API_NAME}"]["spec"]
    deployment = objects[f"Deployment/{manifests.API_NAME}"]["spec"]
    (api,) = deployment["template"]["spec"]["containers"]

    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                     "name": manifests.API_NAME}
    assert hpa["metrics"] == [{"type": "Resource", "resource": {
        "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}}]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 8)
    assert "replicas" not in deployment  # the HPA owns it
    # utilization is of the request; the limit leaves room above it
    assert api["resources"] == {"requests": {"cpu": "250m", "memory": "256Mi"},
                                "limits": {"cpu": "1", "memory": "512Mi"}}
    assert not any("nvidia.com/gpu" in str(c["resources"]) for c in
                   deployment["template"]["spec"]["initContainers"] + [api])
    assert "nodeSelector" not in deployment["template"]["spec"]  # any node, GPU or not


def test_the_gateway_is_ready_on_health_alive_on_its_socket_and_hardened(rendered):
    _, objects = rendered
    pod = _pod(objects, manifests.API_NAME)
    (api,) = pod["containers"]

    assert api["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert api["livenessProbe"]["tcpSocket"] == {"port": "http"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == manifests.RUN_AS
    assert pod["automountServiceAccountToken"] is False
    for container in pod["containers"] + pod["initContainers"]:
        assert container["securityContext"] == {"allowPrivilegeEscalation": False,
                                                "readOnlyRootFilesystem": True,
                                                "capabilities": {"drop": ["ALL"]}}
    # the preStop drain, then uvicorn's graceful stop, within the grace period
    assert pod["terminationGracePeriodSeconds"] > int(api["lifecycle"]["preStop"]["exec"]["command"][1])
    assert objects[f"PodDisruptionBudget/{manifests.API_NAME}"]["spec"]["maxUnavailable"] == 1


def test_only_the_fronts_reach_the_gateway_and_it_reaches_only_the_front_and_dns(rendered):
    _, objects = rendered
    policy = objects[f"NetworkPolicy/{manifests.API_NAME}"]["spec"]
    triton_pods = objects[f"Deployment/{manifests.NAME}"]["spec"]["template"]["metadata"]["labels"]
    api_pods = objects[f"Deployment/{manifests.API_NAME}"]["spec"]["template"]["metadata"]["labels"]

    assert _matches(policy["podSelector"]["matchLabels"], api_pods)
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = policy["ingress"]
    (source,) = ingress["from"]
    assert _matches(source["podSelector"]["matchLabels"], triton_pods) and "namespaceSelector" not in source
    assert ingress["ports"] == [{"protocol": "TCP", "port": manifests.API_PORT}]
    to_front, dns = policy["egress"]
    assert _matches(to_front["to"][0]["podSelector"]["matchLabels"], triton_pods)
    assert to_front["ports"] == [{"protocol": "TCP", "port": manifests.HTTP_PORT}]
    assert "to" not in dns and {p["port"] for p in dns["ports"]} == {53}


def test_the_gateway_runs_from_the_serving_image_unless_named(tmp_path):
    default = _render(tmp_path / "default")
    named = _render(tmp_path / "named", api_image="registry.example/triton-forge/api:1",
                    cluster_domain="k8s.example.org", namespace="search")
    image = lambda objects: _pod(objects, manifests.API_NAME)["containers"][0]["image"]  # noqa: E731
    front = {e["name"]: e.get("value") for e in
             _container(named, manifests.NAME, "front")["env"]}

    assert image(default) == IMAGE == _container(default, manifests.NAME, "triton")["image"]
    assert image(named) == "registry.example/triton-forge/api:1"
    assert front["FORGE_GATEWAY"] == f"{manifests.API_NAME}.search.svc.k8s.example.org:8080"
    with pytest.raises(UserInputError, match=r"--cluster-domain 'Cluster_Local'"):
        _render(tmp_path / "bad", cluster_domain="Cluster_Local")


def test_the_pod_s_gateway_runs_the_compose_api_service_s_command(tmp_path):
    """One command on both paths; only where Triton and the repository are differ."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    objects = _render(tmp_path / "k8s")
    (api,) = _pod(objects, manifests.API_NAME)["containers"]
    without = lambda c: [a for i, a in enumerate(c)  # noqa: E731
                         if a not in ("--url", "--repository")
                         and (i == 0 or c[i - 1] not in ("--url", "--repository"))]

    assert without(compose["api"]["command"]) == without(api["command"])
    assert compose["api"]["working_dir"] == api["workingDir"] == manifests.PROJECT
    gateway = compose["front"]["environment"]["FORGE_GATEWAY"]
    assert gateway == f"api:{_arg(compose['api']['command'], '--port')}"
    assert _arg(compose["api"]["command"], "--url") == "triton:8000"  # the front's port
