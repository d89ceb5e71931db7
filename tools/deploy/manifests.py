"""Kubernetes objects of one deployment as plain data (dicts), one function per object.

Nothing here writes files or YAML: ``render`` does. The server flags come from
``tools.serve.server_config.TritonServerConfig``, the one flag list of the project.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from tools.deploy import promql
from tools.deploy.sizing import PodResources
from tools.serve.server_config import (
    HTTP_MAX_INPUT_SIZE,
    RESTRICTED_APIS,
    Restriction,
    TritonServerConfig,
)

NAME = "triton-forge"
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
REPOSITORIES = "/repositories"  # the emptyDir the builder writes and triton reads
PROJECT = "/opt/triton-forge"  # where the images keep the project (docker/*.Dockerfile)
HEALTHCHECK = f"{PROJECT}/docker/healthcheck.py"
PROBES = f"{PROJECT}/docker/healthcheck_probes.json"
ADMIN_SECRET, ADMIN_SECRET_KEY = f"{NAME}-admin-key", "admin-key"
ADMIN_HEADER = "admin-key"  # as docker-compose.yml: clients send `admin-key: <key>`
EXIT_TIMEOUT_S = 30  # tritonserver --exit-timeout-secs: in-flight requests get this long
# Endpoint removal reaches every kube-proxy / ingress within a few seconds; until then new
# connections still arrive, so Triton must keep serving them (SIGTERM comes after preStop).
PRE_STOP_SLEEP_S = 10
TERMINATION_GRACE_S = PRE_STOP_SLEEP_S + EXIT_TIMEOUT_S + 15  # + unloading the models
RUN_AS = 1000
BUILDER_MEMORY_MIB = {"cpu": 2048, "gpu": 8192}  # cpu: measured peak RSS 0.97 GiB (--force)

DEFAULT_IMAGES = {
    "cpu": ("triton-forge/triton-cpu:local", "triton-forge/builder-cpu:local"),
    "gpu": ("triton-forge/triton:local", "triton-forge/builder:local"),
}

# gRPC keep-alive (milliseconds). Server pings every 60 s so a peer that vanished (node gone,
# conntrack entry dropped by a NAT or a rollout) is found in about 80 s, not Triton's default
# 2 h; clients may ping every 10 s without the server answering GOAWAY "too_many_pings"
# (Triton's default minimum is 5 min); every connection is closed after 5 min, with 30 s to
# finish its calls, so long-lived channels re-resolve and spread over new replicas after a
# scale-out (the Service balances per connection, not per request).
GRPC_KEEPALIVE_FLAGS = (
    "--grpc-keepalive-time=60000",
    "--grpc-keepalive-timeout=20000",
    "--grpc-keepalive-permit-without-calls=1",
    "--grpc-http2-max-pings-without-data=0",
    "--grpc-http2-min-recv-ping-interval-without-data=10000",
    "--grpc-http2-max-ping-strikes=2",
    "--grpc-max-connection-age=300000",
    f"--grpc-max-connection-age-grace={EXIT_TIMEOUT_S * 1000}",
)


@dataclass(frozen=True)
class Deployment:
    """What the objects are rendered from.

    Attributes:
        target: ``cpu`` or ``gpu``.
        namespace: Namespace of every object.
        image: The serving image.
        builder_image: The builder image (same family: ``builder`` is ``FROM serve``).
        resources: One replica's resources.
        spec_text: ``repository.yaml`` as given (the ConfigMap's content).
        min_replicas: HPA lower bound.
        max_replicas: HPA upper bound.
        queue_target_us: The HPA target of the queue signal.
    """

    target: str
    namespace: str
    image: str
    builder_image: str
    resources: PodResources
    spec_text: str
    min_replicas: int
    max_replicas: int
    queue_target_us: int

    @property
    def repository(self) -> str:
        """The model repository inside the pod."""
        return f"{REPOSITORIES}/{self.target}"

    @property
    def spec_configmap(self) -> str:
        """The ConfigMap's name: content-hashed, so a new spec rolls out a new ReplicaSet."""
        digest = hashlib.sha256(self.spec_text.encode()).hexdigest()[:10]
        return f"{NAME}-spec-{digest}"


def labels(d: Deployment) -> dict[str, str]:
    """The labels every object carries; the selector uses the first three."""
    return {
        "app.kubernetes.io/name": NAME,
        "app.kubernetes.io/component": "inference",
        "triton-forge/target": d.target,
        "app.kubernetes.io/part-of": NAME,
    }


def selector(d: Deployment) -> dict[str, str]:
    """The pod selector of the Service, PDB, PodMonitor and Deployment."""
    return {k: v for k, v in labels(d).items() if k != "app.kubernetes.io/part-of"}


def _meta(d: Deployment, name: str = NAME) -> dict[str, Any]:
    return {"name": name, "namespace": d.namespace, "labels": labels(d)}


def server_args(d: Deployment) -> list[str]:
    """tritonserver's command line in the pod (the admin key expanded by the kubelet)."""
    restriction = Restriction(RESTRICTED_APIS, ADMIN_HEADER, "$(TRITON_ADMIN_KEY)")
    config = TritonServerConfig(
        model_repository=d.repository,
        http_port=HTTP_PORT,
        grpc_port=GRPC_PORT,
        metrics_port=METRICS_PORT,
        # every model at start; the load API (admin key) only reloads a model whose stub died
        model_control_mode="explicit",
        load_model=("*",),
        strict_readiness=True,
        exit_on_error=True,
        exit_timeout_secs=EXIT_TIMEOUT_S,
        disable_auto_complete_config=True,
        # 16 MiB per HTTP request, as compose; the CPU image's 2.51 turns it into its HTTP guard
        http_max_input_size=HTTP_MAX_INPUT_SIZE,
        http_restricted_api=restriction,
        grpc_restricted_protocol=restriction,
        allow_metrics=True,
        allow_gpu_metrics=d.target == "gpu",
        allow_cpu_metrics=True,
        backend_config=(
            "python,shm-default-byte-size=16777216",
            "python,shm-growth-byte-size=16777216",
        ),
    )
    # Per-model P99 summaries feed the latency SLO rules (promql.P99_RECORD).
    return ["tritonserver", *config.to_args(), "--metrics-config=summary_latencies=true",
            *GRPC_KEEPALIVE_FLAGS]


def _health_probe(d: Deployment, period: int, failures: int) -> dict[str, Any]:
    command = ["python3", HEALTHCHECK, "--url", f"http://127.0.0.1:{HTTP_PORT}",
               "--repository", d.repository, "--probes", PROBES, "--timeout", "5"]
    return {"exec": {"command": command}, "periodSeconds": period, "timeoutSeconds": 10,
            "failureThreshold": failures}


def _resources(cpu: int, memory_mib: int, gpus: int) -> dict[str, Any]:
    amounts: dict[str, Any] = {"cpu": str(cpu), "memory": f"{memory_mib}Mi"}
    if gpus:
        amounts["nvidia.com/gpu"] = str(gpus)
    return {"requests": dict(amounts), "limits": dict(amounts)}


_CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def deployment(d: Deployment) -> dict[str, Any]:
    """The Deployment: builder init container, then tritonserver with the health probe."""
    r = d.resources
    builder = {
        "name": "build-repository",
        "image": d.builder_image,
        "command": ["tools", "build-repo", "--target", d.target, "--spec",
                    f"{PROJECT}/repository.yaml", "--output", d.repository, "--no-progress"],
        "workingDir": PROJECT,
        "env": [{"name": "HOME", "value": "/tmp"}],
        "resources": _resources(r.cpu, BUILDER_MEMORY_MIB[d.target], r.gpus),
        "securityContext": _CONTAINER_SECURITY,
        "volumeMounts": [
            {"name": "repositories", "mountPath": REPOSITORIES},
            {"name": "spec", "mountPath": f"{PROJECT}/repository.yaml",
             "subPath": "repository.yaml", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "build-cache", "mountPath": f"{PROJECT}/.cache"},
        ],
    }
    triton = {
        "name": "triton",
        "image": d.image,
        "command": ["/bin/sh", f"{PROJECT}/docker/triton-entrypoint.sh"],
        "args": server_args(d),
        "env": [
            {"name": "TRITON_ADMIN_KEY", "valueFrom": {"secretKeyRef": {
                "name": ADMIN_SECRET, "key": ADMIN_SECRET_KEY}}},
            {"name": "MODEL_REPOSITORY", "value": d.repository},
            # The watchdog (docker/triton_supervisor.py) only reloads a model whose Python stub
            # died; restarting the container on failed checks is the kubelet's probes' job.
            {"name": "TRITON_WATCHDOG", "value": "recover"},
            {"name": "HOME", "value": "/tmp"},
        ],
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": _resources(r.cpu, r.memory_mib, r.gpus),
        # Up to 10 min for loading and warm-up; then ready within 20 s of a dead stub, and
        # restarted after a minute of failures.
        "startupProbe": _health_probe(d, period=5, failures=120),
        "readinessProbe": _health_probe(d, period=10, failures=2),
        "livenessProbe": _health_probe(d, period=15, failures=4),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRE_STOP_SLEEP_S)]}}},
        "securityContext": _CONTAINER_SECURITY,
        "volumeMounts": [
            {"name": "repositories", "mountPath": REPOSITORIES, "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "securityContext": {
            "runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "initContainers": [builder],
        "containers": [triton],
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway",
             "labelSelector": {"matchLabels": selector(d)},
             "matchLabelKeys": ["pod-template-hash"]}
            for key in ("topology.kubernetes.io/zone", "kubernetes.io/hostname")
        ],
        "volumes": [
            {"name": "repositories", "emptyDir": {}},
            {"name": "spec", "configMap": {"name": d.spec_configmap}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{r.shm_mib}Mi"}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
            {"name": "build-cache", "emptyDir": {"sizeLimit": "4Gi"}},
        ],
    }
    if d.target == "gpu":
        pod_spec["tolerations"] = [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(d),
        "spec": {
            # No `replicas`: the autoscaler owns it (re-applying would reset it).
            "selector": {"matchLabels": selector(d)},
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "minReadySeconds": 10,
            "revisionHistoryLimit": 5,
            "template": {"metadata": {"labels": labels(d)}, "spec": pod_spec},
        },
    }


def spec_configmap(d: Deployment) -> dict[str, Any]:
    """The repository spec the builder reads."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(d, d.spec_configmap),
            "data": {"repository.yaml": d.spec_text}, "immutable": True}


def service(d: Deployment) -> dict[str, Any]:
    """HTTP, gRPC and metrics behind one ClusterIP."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(d),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(d),
            "ports": [
                {"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc", "protocol": "TCP",
                 "appProtocol": "grpc"},
                {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics",
                 "protocol": "TCP"},
            ],
        },
    }


def pod_disruption_budget(d: Deployment) -> dict[str, Any]:
    """At most one replica down for a voluntary disruption (drain, upgrade)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(d),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(d)},
                 "unhealthyPodEvictionPolicy": "AlwaysAllow"},
    }


def pod_monitor(d: Deployment) -> dict[str, Any]:
    """Prometheus Operator PodMonitor: scrapes `metrics`, attaches namespace and pod labels."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _meta(d),
        "spec": {
            "selector": {"matchLabels": selector(d)},
            "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s",
                                     "scrapeTimeout": "10s"}],
        },
    }


def prometheus_rule(d: Deployment, objectives: tuple[promql.Objective, ...]) -> dict[str, Any]:
    """Prometheus Operator PrometheusRule holding ``promql.rule_groups``."""
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": _meta(d), "spec": {"groups": promql.rule_groups(objectives)}}


def _scaling_behavior() -> dict[str, Any]:
    # Up at once (a new replica takes the builder plus loading to help); down slowly, one pod
    # per minute after 5 min of low signal, so a lull between bursts does not drop capacity.
    return {
        "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                    "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60},
                                 {"type": "Percent", "value": 100, "periodSeconds": 60}]},
        "scaleDown": {"stabilizationWindowSeconds": 300,
                      "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]},
    }


def horizontal_pod_autoscaler(d: Deployment) -> dict[str, Any]:
    """autoscaling/v2 HPA on the queue signal through prometheus-adapter (Pods metric)."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _meta(d),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": NAME},
            "minReplicas": d.min_replicas,
            "maxReplicas": d.max_replicas,
            "metrics": [{"type": "Pods", "pods": {
                "metric": {"name": promql.QUEUE_METRIC},
                "target": {"type": "AverageValue", "averageValue": str(d.queue_target_us)},
            }}],
            "behavior": _scaling_behavior(),
        },
    }


def scaled_object(d: Deployment, prometheus_url: str) -> dict[str, Any]:
    """KEDA ScaledObject: the same signal and target through KEDA's Prometheus trigger."""
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": _meta(d),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": NAME},
            "minReplicaCount": d.min_replicas,
            "maxReplicaCount": d.max_replicas,
            "pollingInterval": 15,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _scaling_behavior()}},
            "triggers": [{
                "type": "prometheus",
                "metricType": "AverageValue",
                "metadata": {
                    "serverAddress": prometheus_url,
                    "query": promql.keda_query(d.namespace, NAME),
                    "threshold": str(d.queue_target_us),
                },
            }],
        },
    }
