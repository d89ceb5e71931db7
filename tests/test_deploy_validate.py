"""The rendered manifests against real schemas: Kubernetes 1.29-1.33 OpenAPI (strict, unknown
fields are errors) through kubernetes-validate, and the CRDs against their published schemas.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from tools.deploy.manifests import API_NAME
from tools.deploy.render import render_k8s

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed (pip install -e .[test])"
)
jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parents[1]
CRDS = Path(__file__).parent / "data" / "crds"
K8S_VERSIONS = ("1.29.0", "1.30.0", "1.31.0", "1.32.0", "1.33.0")
CRD_KINDS = {"PodMonitor", "PrometheusRule", "ScaledObject"}


RECORDS = Path(__file__).parent / "data" / "artifact"
IMAGE = "registry.example/triton-forge/triton:1"
# Every way the repository reaches the pod, and both autoscalers: (name, target, options).
RENDERS = {
    "cpu-artifact-hpa": ("cpu", {"artifact": RECORDS / "cpu.artifact.json", "image": IMAGE}),
    "cpu-artifact-keda": ("cpu", {"artifact": RECORDS / "cpu.artifact.json", "image": IMAGE,
                                  "autoscaler": "keda"}),
    "cpu-dev-build": ("cpu", {"dev_build": True}),
    "gpu-artifact": ("gpu", {"artifact": RECORDS / "gpu.artifact.json", "image": IMAGE,
                             "gpu_product": "NVIDIA-A10"}),
    "gpu-plans-job-keda": ("gpu", {"plans_job": True, "gpu_product": "NVIDIA-A10", "image": IMAGE,
                                   "builder_image": IMAGE, "autoscaler": "keda"}),
}


def _render(name: str, folder: Path, **extra) -> list[dict]:
    target, options = RENDERS[name]
    output = folder / name
    render_k8s(ROOT / "repository.yaml", target, output, **options, **extra)
    paths = sorted((output / "manifests").glob("*.yaml")) + sorted((output / "jobs").glob("*.yaml"))
    return [doc for p in paths for doc in yaml.safe_load_all(p.read_text())]


@pytest.fixture(scope="module", params=sorted(RENDERS))
def documents(request, tmp_path_factory) -> list[dict]:
    return _render(request.param, tmp_path_factory.mktemp("validate"))


def _strict(schema: dict) -> dict:
    """A CRD schema that rejects unknown fields, as `kubectl apply --validate=strict` does."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node and not node.get(
                "x-kubernetes-preserve-unknown-fields"
            ) and "additionalProperties" not in node:
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def _crd_schemas() -> dict[tuple[str, str], dict]:
    schemas = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = _strict(version["schema"]["openAPIV3Schema"])
            schema["properties"]["metadata"] = {"type": "object"}  # checked by the API server
            schemas[(f"{group}/{version['name']}", kind)] = schema
    return schemas


def _validator(schema: dict):
    # Not check_schema: the CRDs hold Go regexes such as '^(?i)(abort|warn)?$' that Python's
    # re refuses; patterns of fields these objects set are plain.
    return jsonschema.Draft7Validator(schema)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_builtin_objects_are_valid_and_strict_on_kubernetes(documents, version):
    builtin = [d for d in documents if d["kind"] not in CRD_KINDS]
    assert {"Deployment", "Service", "NetworkPolicy", "PodDisruptionBudget"} <= {d["kind"] for d in builtin}
    # the OpenAI/TEI gateway's own objects, its CPU autoscaler included
    assert {(kind, API_NAME) for kind in ("Deployment", "Service", "HorizontalPodAutoscaler",
                                          "PodDisruptionBudget", "NetworkPolicy")} <= {
        (d["kind"], d["metadata"]["name"]) for d in builtin}
    for doc in builtin:
        kubernetes_validate.validate(doc, version, strict=True)


def test_an_image_volume_is_valid_on_1_33_and_the_field_is_unknown_to_1_29(tmp_path):
    docs = _render("cpu-artifact-hpa", tmp_path, image_volume=True, k8s_version="1.33")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    kubernetes_validate.validate(deployment, "1.33.0", strict=True)
    with pytest.raises(kubernetes_validate.ValidationError, match="image"):
        kubernetes_validate.validate(deployment, "1.29.0", strict=True)


def test_strict_validation_rejects_a_misspelt_field_so_the_check_can_fail(documents):
    deployment = copy.deepcopy(next(d for d in documents if d["kind"] == "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)


def test_custom_resources_are_valid_against_their_published_crd_schemas(documents):
    schemas = _crd_schemas()
    custom = [d for d in documents if d["kind"] in CRD_KINDS]
    assert {"PodMonitor", "PrometheusRule"} <= {d["kind"] for d in custom}
    for doc in custom:
        _validator(schemas[(doc["apiVersion"], doc["kind"])]).validate(doc)


def test_crd_validation_rejects_an_unknown_field_so_the_check_can_fail(documents):
    schemas = _crd_schemas()
    monitor = copy.deepcopy(next(d for d in documents if d["kind"] == "PodMonitor"))
    monitor["spec"]["podMetricsEndpoints"][0]["prot"] = "metrics"
    with pytest.raises(jsonschema.ValidationError, match="prot"):
        _validator(schemas[(monitor["apiVersion"], "PodMonitor")]).validate(monitor)
