"""Kubernetes objects of one deployment as plain data (dicts), one function per object.

Nothing here writes files or YAML: ``render`` does. The server flags come from
``tools.serve.server_config.TritonServerConfig``, the one flag list of the project; the front runs
the ``haproxy.cfg`` ``tools build-repo`` wrote into the repository, with ``front_environment``;
the OpenAI/TEI gateway is a Deployment of its own behind the front (``api_objects``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from tools.deploy import promql
from tools.deploy.sizing import PodResources
from tools.front import haproxy_config
from tools.serve.server_config import (
    HTTP_MAX_INPUT_SIZE,
    RESTRICTED_APIS,
    Restriction,
    TritonServerConfig,
)

NAME = "triton-forge"
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002  # the front's HTTP and gRPC; Triton's metrics
# tritonserver's own HTTP and gRPC, on the loopback it shares with the front (haproxy_config)
TRITON_HTTP_PORT, TRITON_GRPC_PORT = (
    int(haproxy_config.ENV_DEFAULTS[name].rpartition(":")[2])
    for name in ("FORGE_TRITON_HTTP", "FORGE_TRITON_GRPC"))
LOOPBACK = "127.0.0.1"
STATUS_PORT = 8003  # the supervisor's /status and /metrics (contract 2), port name forge-metrics
STATUS_PORT_NAME = "forge-metrics"
STATUS_URL = f"http://127.0.0.1:{STATUS_PORT}/status"
REPOSITORIES = "/repositories"  # the emptyDir (or claim) the repository is copied to / built in
IMAGE_VOLUME_MOUNT = "/artifact"  # where an image volume mounts the artifact's root
PROJECT = "/opt/triton-forge"  # where the images keep the project (docker/*.Dockerfile)
HEALTHCHECK = f"{PROJECT}/docker/healthcheck.py"
VERIFY = f"{PROJECT}/docker/verify_repository.py"
PROBES = f"{PROJECT}/docker/healthcheck_probes.json"
# The front: the official HAProxy image of the 2.6 LTS branch (Lua built in), the branch the
# rendered config is tested with (Debian's 2.6.12). The same pin as docker-compose.yml's
# x-front-image (tests/test_deploy_front.py): the index digest docker-library/repo-info records
# for haproxy:2.6.34-trixie, not checked against Docker Hub from here (no registry reachable).
FRONT_IMAGE = ("docker.io/library/haproxy:2.6.34-trixie"
               "@sha256:ee0545c18597c68f85594cf27b460b800ed5ccb2b99acf0d61bb8c9090b722a3")
FRONT_CPU = "500m"
FRONT_MEMORY_MIB = 256  # maxconn 4096 x two 16 KiB buffers = 128 MiB at the most, and room
TINI = "/usr/bin/tini"  # Debian's and Ubuntu's tini package, in both serving images
CLIENT_LABEL = {"triton-forge/client": "true"}  # pods allowed to send inferences (NetworkPolicy)
# The OpenAI/TEI gateway (tools/api): a Deployment and Service of their own, which the front of
# every triton pod routes the API paths to, scaled on its own CPU by an HPA. Its work is a few
# hundred microseconds of CPU a request (JSON, tokenizing to count tokens) beside Triton's.
API_NAME = f"{NAME}-api"
API_PORT = 8080  # tools.api.command.DEFAULT_PORT
API_REQUESTS = {"cpu": "250m", "memory": "256Mi"}
API_LIMITS = {"cpu": "1", "memory": "512Mi"}  # the compose `api` service's cpus and mem_limit
API_CPU_UTILIZATION = 70  # the HPA's target, percent of the CPU request
DNS_PORT = 53
DEFAULT_CLUSTER_DOMAIN = "cluster.local"
# Rollouts: a cpu pod surges (a spare node is cheap); a gpu pod replaces one in place, since a
# surge needs a spare GPU. A gpu pod loads TensorRT engines: give the rollout longer.
ROLLOUT = {"cpu": {"maxSurge": 1, "maxUnavailable": 0},
           "gpu": {"maxSurge": 0, "maxUnavailable": 1}}
PROGRESS_DEADLINE_S = {"cpu": 900, "gpu": 1800}
ADMIN_SECRET, ADMIN_SECRET_KEY = f"{NAME}-admin-key", "admin-key"
ADMIN_HEADER = "admin-key"  # as docker-compose.yml: clients send `admin-key: <key>`
EXIT_TIMEOUT_S = 30  # tritonserver --exit-timeout-secs: in-flight requests get this long
# Endpoint removal reaches every kube-proxy / ingress within a few seconds; until then new
# connections still arrive, so Triton must keep serving them (SIGTERM comes after preStop).
PRE_STOP_SLEEP_S = 10
TERMINATION_GRACE_S = PRE_STOP_SLEEP_S + EXIT_TIMEOUT_S + 15  # + unloading the models
RUN_AS = 1000
BUILDER_MEMORY_MIB = {"cpu": 2048, "gpu": 8192}  # cpu: measured peak RSS 0.97 GiB (--force)
VERIFY_MEMORY_MIB = 256  # busybox cp and the streaming sha256 check
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # set by NVIDIA's GPU feature discovery

# Only with --dev-build: images built on the developer's machine (scripts/compose-images.sh),
# which no cluster can pull. Every other render names its images.
DEV_IMAGES = {
    "cpu": ("triton-forge/triton-cpu:local", "triton-forge/builder-cpu:local"),
    "gpu": ("triton-forge/triton:local", "triton-forge/builder:local"),
}
# The front with --dev-build: the Debian-built one beside the Debian CPU images (scripts/
# compose-images.sh); the NGC images pair with the official one, as in docker-compose.yml.
DEV_FRONT_IMAGES = {"cpu": "triton-forge/front-cpu:local", "gpu": FRONT_IMAGE}
SOURCES = ("artifact", "dev-build", "plans-job")

# gRPC keep-alive (milliseconds) of tritonserver's own gRPC port. Clients connect to the front, so
# these now govern the front's connection to tritonserver on the pod's loopback: server pings
# every 60 s, pings every 10 s allowed without GOAWAY "too_many_pings", and every connection
# closed after 5 min with 30 s to finish its calls. A client's own channel is the front's: it is
# closed after the front's idle timeout (tools/front/haproxy_config.py), not after an age.
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
class Capacity:
    """Replica bounds and the HPA target from a tuner measurement (``--from-tune``).

    Attributes:
        scenario: The pipeline the tuner measured.
        per_pod_rps: Measured requests/s of one pod within the P99 target.
        p99_ms: The P99 at that throughput.
        p99_target_ms: The target it was measured against.
        headroom: Fraction of ``per_pod_rps`` a pod is run at (the HPA target).
        target_rps: ``per_pod_rps * headroom``, the HPA's per-pod average.
        peak_rps: The load the bounds are sized for.
        min_replicas, max_replicas: The bounds.
        source: The results file.
        confirmed: Whether the figure comes from the tuner's confirmation repeats.
        lines: The arithmetic, for the rendered README.
    """

    scenario: str
    per_pod_rps: float
    p99_ms: float
    p99_target_ms: float
    headroom: float
    target_rps: float
    peak_rps: float
    min_replicas: int
    max_replicas: int
    source: str
    confirmed: bool
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Deployment:
    """What the objects are rendered from.

    Attributes:
        target: ``cpu`` or ``gpu``.
        namespace: Namespace of every object.
        image: The serving image.
        builder_image: The builder image (``--dev-build`` and the plans Job; same family).
        resources: One replica's resources.
        spec_text: ``repository.yaml`` as given (the ConfigMap's content, dev-build only).
        min_replicas: HPA lower bound.
        max_replicas: HPA upper bound.
        queue_target_us: The HPA target of the queue signal.
        source: Where the pod's repository comes from: ``artifact`` (an init container copies
            the OCI artifact and verifies it, or an image volume), ``dev-build`` (built in the
            pod) or ``plans-job`` (gpu: built once by a Job into a claim).
        artifact_reference: ``image:tag@sha256:...`` of the artifact.
        manifest_sha256: The artifact's manifest hash the verifier expects.
        image_volume: Mount the artifact as a Kubernetes image volume (1.33+) instead of copying.
        gpu_product: ``nvidia.com/gpu.product`` the pods (and the plans Job) are pinned to.
        autoscaler: ``hpa`` or ``keda``: the one rendered.
        monitor_labels: Labels the Prometheus Operator's selectors pick PodMonitor and
            PrometheusRule by (kube-prometheus-stack: ``release``).
        monitoring_namespace: The namespace Prometheus scrapes from (NetworkPolicy).
        capacity: The measured capacity (``--from-tune``), or None.
        prometheus_url: Prometheus the KEDA trigger queries.
        front_image: The front's image (HAProxy 2.6 with Lua).
        api_image: The OpenAI/TEI gateway's image (empty: the serving image).
        cluster_domain: The cluster's DNS domain (the gateway Service's name in the front).
        python_models: The target's Python-backend models (tokenizers, label steps): what a
            dev-build gateway pod builds for itself.
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
    source: str = "artifact"
    artifact_reference: str = ""
    manifest_sha256: str = ""
    image_volume: bool = False
    gpu_product: str | None = None
    autoscaler: str = "hpa"
    monitor_labels: tuple[tuple[str, str], ...] = ()
    monitoring_namespace: str = "monitoring"
    capacity: Capacity | None = None
    prometheus_url: str = ""
    front_image: str = FRONT_IMAGE
    api_image: str = ""
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN
    python_models: tuple[str, ...] = ()

    @property
    def gateway_image(self) -> str:
        """The gateway's image: ``api_image``, else the serving image (which carries it)."""
        return self.api_image or self.image

    @property
    def gateway_address(self) -> str:
        """``host:port`` of the gateway's Service as the front reaches it: the fully qualified
        name, since HAProxy looks it up again while it runs without the pod's search domains."""
        return f"{API_NAME}.{self.namespace}.svc.{self.cluster_domain}:{API_PORT}"

    @property
    def repository(self) -> str:
        """The model repository inside the pod."""
        if self.source == "artifact" and self.image_volume:
            return f"{IMAGE_VOLUME_MOUNT}/repository"
        return f"{REPOSITORIES}/{self.target}"

    @property
    def spec_configmap(self) -> str:
        """The ConfigMap's name: content-hashed, so a new spec rolls out a new ReplicaSet."""
        digest = hashlib.sha256(self.spec_text.encode()).hexdigest()[:10]
        return f"{NAME}-spec-{digest}"

    @property
    def plans_claim(self) -> str:
        """The plans Job's claim: one per GPU product and builder image (so TensorRT version)."""
        key = f"{self.gpu_product}\0{self.builder_image}"
        slug = "".join(c if c.isalnum() else "-" for c in (self.gpu_product or "").lower()).strip("-")
        return f"{NAME}-plans-{slug[:30]}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


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


def _meta(d: Deployment, name: str = NAME, extra: dict[str, str] | None = None) -> dict[str, Any]:
    return {"name": name, "namespace": d.namespace, "labels": {**labels(d), **(extra or {})}}


def front_environment(gateway: str) -> dict[str, str]:
    """The front's ``FORGE_*`` environment in the pod and in the compose stack (tests compare
    docker-compose.yml's with it): its public ports on every interface of the network namespace
    it shares with tritonserver; tritonserver, the runtime API and the admission controller's log
    on that namespace's loopback (``haproxy_config.ENV_DEFAULTS``); the OpenAI/TEI gateway at
    ``gateway`` (``host:port``: compose's ``api:8080``, the pod's ``Deployment.gateway_address``)."""
    env = dict(haproxy_config.ENV_DEFAULTS)
    env["FORGE_FRONT_HTTP"] = f"0.0.0.0:{HTTP_PORT}"
    env["FORGE_FRONT_GRPC"] = f"0.0.0.0:{GRPC_PORT}"
    env["FORGE_GATEWAY"] = gateway
    return env


CONTROLLER_ENV = ("FORGE_FRONT_ADMIN", "FORGE_FRONT_LOG")  # the supervisor runs the controller


def front_command(repository: str) -> list[str]:
    """HAProxy in the foreground (master-worker) on the config ``tools build-repo`` wrote into
    ``repository`` (``front.lua`` beside it)."""
    return ["haproxy", "-W", "-db", "-f", f"{repository}/{haproxy_config.CONFIG_NAME}"]


def server_args(d: Deployment) -> list[str]:
    """tritonserver's command line in the pod (the admin key expanded by the kubelet)."""
    restriction = Restriction(RESTRICTED_APIS, ADMIN_HEADER, "$(TRITON_ADMIN_KEY)")
    config = TritonServerConfig(
        model_repository=d.repository,
        # On the pod's loopback, behind the front; --http-address would move the metrics with
        # it, so they keep every interface (the PodMonitor scrapes them)
        http_address=LOOPBACK,
        http_port=TRITON_HTTP_PORT,
        grpc_address=LOOPBACK,
        grpc_port=TRITON_GRPC_PORT,
        metrics_address="0.0.0.0",
        metrics_port=METRICS_PORT,
        # every model at start; the load API (admin key) only reloads a model whose stub died
        model_control_mode="explicit",
        load_model=("*",),
        strict_readiness=True,
        exit_on_error=True,
        exit_timeout_secs=EXIT_TIMEOUT_S,
        disable_auto_complete_config=True,
        # 16 MiB per HTTP request, as compose (the front refuses larger bodies first; the CPU
        # image's Triton 2.51 has no such flag and its wrapper drops it)
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


def probe_command(d: Deployment, mode: str) -> list[str]:
    """The probe a kubelet execs: ``liveness`` or ``readiness`` (docker/healthcheck.py)."""
    command = ["python3", HEALTHCHECK, "--mode", mode, "--url",
               f"http://{LOOPBACK}:{TRITON_HTTP_PORT}", "--status-url", STATUS_URL]
    if mode == "readiness":
        command += ["--repository", d.repository, "--probes", PROBES]
    # Two requests of 4 s (liveness) or a budget of 8 s (readiness): below the probe's
    # timeoutSeconds (10), so the command ends first, with its own verdict.
    return command + ["--timeout", "4"]


def _probe(d: Deployment, mode: str, period: int, failures: int) -> dict[str, Any]:
    return {"exec": {"command": probe_command(d, mode)}, "periodSeconds": period,
            "timeoutSeconds": 10, "failureThreshold": failures}


def _resources(cpu: int | str, memory_mib: int, gpus: int) -> dict[str, Any]:
    amounts: dict[str, Any] = {"cpu": str(cpu), "memory": f"{memory_mib}Mi"}
    if gpus:
        amounts["nvidia.com/gpu"] = str(gpus)
    return {"requests": dict(amounts), "limits": dict(amounts)}


_CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
_POD_SECURITY = {
    "runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _builder(d: Deployment, output: str) -> dict[str, Any]:
    """``tools build-repo`` in the builder image (dev-build init container, plans Job)."""
    return {
        "name": "build-repository",
        "image": d.builder_image,
        "command": ["tools", "build-repo", "--target", d.target, "--spec",
                    f"{PROJECT}/repository.yaml", "--repository", output, "--no-progress"],
        "workingDir": PROJECT,
        "env": [{"name": "HOME", "value": "/tmp"}],
        "resources": _resources(d.resources.cpu, BUILDER_MEMORY_MIB[d.target], d.resources.gpus),
        "securityContext": _CONTAINER_SECURITY,
        "volumeMounts": [
            {"name": "repositories", "mountPath": REPOSITORIES},
            {"name": "spec", "mountPath": f"{PROJECT}/repository.yaml",
             "subPath": "repository.yaml", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "build-cache", "mountPath": f"{PROJECT}/.cache"},
        ],
    }


def _verifier(d: Deployment) -> dict[str, Any]:
    """Hash every file against build_manifest.json; a mismatch fails the pod's start."""
    command = ["python3", VERIFY, "--repository", d.repository, "--target", d.target]
    if d.manifest_sha256:
        command += ["--manifest-sha256", d.manifest_sha256]
    return {
        "name": "verify-repository",
        "image": d.image,
        "command": command,
        "resources": _resources(1, VERIFY_MEMORY_MIB, 0),
        "securityContext": _CONTAINER_SECURITY,
        "volumeMounts": [_repository_mount(d)],
    }


def _repository_mount(d: Deployment) -> dict[str, Any]:
    if d.source == "artifact" and d.image_volume:
        return {"name": "repositories", "mountPath": IMAGE_VOLUME_MOUNT, "readOnly": True}
    return {"name": "repositories", "mountPath": REPOSITORIES, "readOnly": True}


def _init_containers(d: Deployment) -> list[dict[str, Any]]:
    if d.source == "dev-build":
        return [_builder(d, d.repository)]
    if d.source == "plans-job":
        return [_verifier(d)]
    if d.image_volume:
        return [_verifier(d)]
    fetch = {
        "name": "fetch-repository",
        "image": d.artifact_reference,
        # The artifact holds /repository and a static busybox, nothing else (tools deploy package).
        "command": ["/bin/busybox", "cp", "-R", "/repository", d.repository],
        "resources": _resources(1, VERIFY_MEMORY_MIB, 0),
        "securityContext": _CONTAINER_SECURITY,
        "volumeMounts": [{"name": "repositories", "mountPath": REPOSITORIES}],
    }
    return [fetch, _verifier(d)]


def _build_volumes(d: Deployment) -> list[dict[str, Any]]:
    """What the dev-build's builder init container reads besides the repository and /tmp."""
    if d.source != "dev-build":
        return []
    return [{"name": "spec", "configMap": {"name": d.spec_configmap}},
            {"name": "build-cache", "emptyDir": {"sizeLimit": "4Gi"}}]


def _repository_volume(d: Deployment, weights_mib: int) -> dict[str, Any]:
    if d.source == "artifact" and d.image_volume:
        return {"name": "repositories",
                "image": {"reference": d.artifact_reference, "pullPolicy": "IfNotPresent"}}
    if d.source == "plans-job":
        return {"name": "repositories",
                "persistentVolumeClaim": {"claimName": d.plans_claim, "readOnly": True}}
    return {"name": "repositories", "emptyDir": {"sizeLimit": f"{weights_mib}Mi"}}


def repository_size_mib(d: Deployment) -> int:
    """The repository emptyDir's sizeLimit: the build's output, with room (4 GiB at least)."""
    return max(4096, 2 * sum(mib for name, mib in d.resources.breakdown if " x" in name))


def front(d: Deployment) -> dict[str, Any]:
    """The front container: HAProxy on the pod's HTTP and gRPC ports, running the repository's
    ``haproxy.cfg`` in front of tritonserver on the pod's loopback (the supervisor in the triton
    container runs its admission controller)."""
    return {
        "name": "front",
        "image": d.front_image,
        "command": front_command(d.repository),
        "env": [{"name": k, "value": v} for k, v in front_environment(d.gateway_address).items()],
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
        ],
        "resources": _resources(FRONT_CPU, FRONT_MEMORY_MIB, 0),
        # Ready while a request through it reaches a ready tritonserver (a busy model's cap does
        # not apply: health goes to the shared backend); alive while it accepts connections.
        "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": "http"},
                           "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 2},
        "livenessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 10,
                          "timeoutSeconds": 5, "failureThreshold": 3},
        # New connections still arrive until every proxy has dropped the endpoint; then a
        # graceful stop (SIGUSR1: stop listening, finish what runs) while tritonserver drains.
        # The kubelet's SIGTERM would stop HAProxy at once, dropping what it holds.
        "lifecycle": {"preStop": {"exec": {"command": [
            "/bin/sh", "-c", f"sleep {PRE_STOP_SLEEP_S}; kill -USR1 1; sleep {EXIT_TIMEOUT_S}"]}}},
        "securityContext": _CONTAINER_SECURITY,
        "volumeMounts": [_repository_mount(d)],
    }


def deployment(d: Deployment) -> dict[str, Any]:
    """The Deployment: the repository (copied artifact, image volume, claim, or dev build),
    then tritonserver under tini and the supervisor, with busy-aware probes, and the front."""
    r = d.resources
    triton = {
        "name": "triton",
        "image": d.image,
        # tini is PID 1: it reaps orphans (a stub whose server died) and forwards signals.
        "command": [TINI, "-g", "--", "/bin/sh", f"{PROJECT}/docker/triton-entrypoint.sh"],
        "args": server_args(d),
        "env": [
            {"name": "TRITON_ADMIN_KEY", "valueFrom": {"secretKeyRef": {
                "name": ADMIN_SECRET, "key": ADMIN_SECRET_KEY}}},
            {"name": "MODEL_REPOSITORY", "value": d.repository},
            # The watchdog (docker/triton_supervisor.py) only reloads a model whose Python stub
            # died; restarting the container is the kubelet's (liveness) job.
            {"name": "TRITON_WATCHDOG", "value": "recover"},
            # The supervisor's status endpoint (probes, PodMonitor) and its retry of a model
            # past the restart budget: 5 s doubling to 5 min (docker/triton-entrypoint.sh).
            {"name": "FORGE_METRICS_PORT", "value": str(STATUS_PORT)},
            {"name": "TRITON_RETRY_BACKOFF", "value": "5"},
            {"name": "TRITON_RETRY_BACKOFF_MAX", "value": "300"},
            {"name": "HOME", "value": "/tmp"},
            # The front's admission controller runs in the supervisor: the front's runtime API
            # and the log it sends, on the loopback the containers share.
            *({"name": k, "value": v} for k, v in front_environment(d.gateway_address).items()
              if k in CONTROLLER_ENV),
        ],
        # tritonserver's HTTP and gRPC listen on the loopback only, behind the front
        "ports": [
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
            {"name": STATUS_PORT_NAME, "containerPort": STATUS_PORT, "protocol": "TCP"},
        ],
        "resources": _resources(r.cpu, r.memory_mib, r.gpus),
        # Startup: readiness, up to 10 min for loading and warm-up. Readiness: out of the
        # Service 20 s after a model stops being ready or a stub dies (busy answers pass).
        # Liveness: restarted after 30 s without /v2/health/live or with a model given up;
        # a full queue never fails it.
        "startupProbe": _probe(d, "readiness", period=5, failures=120),
        "readinessProbe": _probe(d, "readiness", period=10, failures=2),
        "livenessProbe": _probe(d, "liveness", period=10, failures=3),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRE_STOP_SLEEP_S)]}}},
        "securityContext": _CONTAINER_SECURITY,
        "volumeMounts": [
            _repository_mount(d),
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    volumes = [
        _repository_volume(d, repository_size_mib(d)),
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{r.shm_mib}Mi"}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
        *_build_volumes(d),
    ]
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "securityContext": _POD_SECURITY,
        "initContainers": _init_containers(d),
        "containers": [triton, front(d)],
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway",
             "labelSelector": {"matchLabels": selector(d)},
             "matchLabelKeys": ["pod-template-hash"]}
            for key in ("topology.kubernetes.io/zone", "kubernetes.io/hostname")
        ],
        "volumes": volumes,
    }
    if d.target == "gpu":
        pod_spec["tolerations"] = [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
    if d.gpu_product:
        # TensorRT plans run only on the GPU model they were built for.
        pod_spec["nodeSelector"] = {GPU_PRODUCT_LABEL: d.gpu_product}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(d),
        "spec": {
            # No `replicas`: the autoscaler owns it (re-applying would reset it).
            "selector": {"matchLabels": selector(d)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": dict(ROLLOUT[d.target])},
            "minReadySeconds": 10,
            "progressDeadlineSeconds": PROGRESS_DEADLINE_S[d.target],
            "revisionHistoryLimit": 5,
            "template": {"metadata": {"labels": labels(d)}, "spec": pod_spec},
        },
    }


def plans_job(d: Deployment) -> list[dict[str, Any]]:
    """gpu: the claim and the Job that builds the repository (TensorRT plans included) once per
    GPU product and builder image, on a node with that GPU. Pods only read the claim."""
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _meta(d, d.plans_claim),
        # The Job writes it once; pods on many nodes mount it read-only (an RWX storage class).
        "spec": {"accessModes": ["ReadWriteMany"],
                 "resources": {"requests": {"storage": f"{repository_size_mib(d)}Mi"}}},
    }
    builder = _builder(d, d.repository)
    builder["volumeMounts"][0] = {"name": "repositories", "mountPath": REPOSITORIES}
    pod = {
        "restartPolicy": "OnFailure",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": _POD_SECURITY,
        "nodeSelector": {GPU_PRODUCT_LABEL: d.gpu_product or ""},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [builder],
        "volumes": [
            {"name": "repositories", "persistentVolumeClaim": {"claimName": d.plans_claim}},
            {"name": "spec", "configMap": {"name": d.spec_configmap}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "4Gi"}},
            {"name": "build-cache", "emptyDir": {"sizeLimit": "4Gi"}},
        ],
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(d, d.plans_claim),
        "spec": {"backoffLimit": 2, "ttlSecondsAfterFinished": 86400,
                 "template": {"metadata": {"labels": {**labels(d), "app.kubernetes.io/component": "plans"}},
                              "spec": pod}},
    }
    return [claim, job]


def network_policy(d: Deployment) -> dict[str, Any]:
    """Inference ports from labelled client pods only, and HTTP from the gateway's pods (it calls
    the pipelines through the front); metrics ports from the monitoring namespace only.
    Everything else into the pods is dropped."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(d),
        "spec": {
            "podSelector": {"matchLabels": selector(d)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": dict(CLIENT_LABEL)}}],
                 "ports": [{"protocol": "TCP", "port": HTTP_PORT},
                           {"protocol": "TCP", "port": GRPC_PORT}]},
                {"from": [{"podSelector": {"matchLabels": api_selector(d)}}],
                 "ports": [{"protocol": "TCP", "port": HTTP_PORT}]},
                {"from": [{"namespaceSelector": {"matchLabels": {
                    "kubernetes.io/metadata.name": d.monitoring_namespace}}}],
                 "ports": [{"protocol": "TCP", "port": METRICS_PORT},
                           {"protocol": "TCP", "port": STATUS_PORT}]},
            ],
        },
    }


def spec_configmap(d: Deployment) -> dict[str, Any]:
    """The repository spec the builder reads."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(d, d.spec_configmap),
            "data": {"repository.yaml": d.spec_text}, "immutable": True}


def service(d: Deployment) -> dict[str, Any]:
    """HTTP and gRPC (the front's ports) and metrics behind one ClusterIP."""
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


def _monitor_meta(d: Deployment) -> dict[str, Any]:
    """PodMonitor / PrometheusRule metadata: the Operator's selectors pick them by these labels."""
    return _meta(d, extra=dict(d.monitor_labels))


def pod_monitor(d: Deployment) -> dict[str, Any]:
    """Prometheus Operator PodMonitor: Triton's `metrics` and the supervisor's `forge-metrics`,
    job ``triton-forge`` (the pods' name label), namespace and pod labels attached."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _monitor_meta(d),
        "spec": {
            "jobLabel": "app.kubernetes.io/name",
            "selector": {"matchLabels": selector(d)},
            "podMetricsEndpoints": [
                {"port": port, "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}
                for port in ("metrics", STATUS_PORT_NAME)
            ],
        },
    }


def prometheus_rule(d: Deployment, objectives: tuple[promql.Objective, ...]) -> dict[str, Any]:
    """Prometheus Operator PrometheusRule holding ``promql.rule_groups``."""
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": _monitor_meta(d),
            "spec": {"groups": promql.rule_groups(objectives, d.namespace, _rate_model(d))}}


def _rate_model(d: Deployment) -> str | None:
    return d.capacity.scenario if d.capacity else None


def _scaling_behavior() -> dict[str, Any]:
    # Up at once (a new replica takes the artifact copy plus loading to help); down slowly, one
    # pod per minute after 5 min of low signal, so a lull between bursts does not drop capacity.
    return {
        "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                    "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60},
                                 {"type": "Percent", "value": 100, "periodSeconds": 60}]},
        "scaleDown": {"stabilizationWindowSeconds": 300,
                      "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]},
    }


def horizontal_pod_autoscaler(d: Deployment) -> dict[str, Any]:
    """autoscaling/v2 HPA through prometheus-adapter (Pods metrics): the queue signal, and with
    ``--from-tune`` the measured per-pod request rate too (the HPA takes the larger count)."""
    metrics = [{"type": "Pods", "pods": {
        "metric": {"name": promql.QUEUE_METRIC},
        "target": {"type": "AverageValue", "averageValue": str(d.queue_target_us)},
    }}]
    if d.capacity:
        metrics.append({"type": "Pods", "pods": {
            "metric": {"name": promql.RATE_METRIC},
            "target": {"type": "AverageValue", "averageValue": _quantity(d.capacity.target_rps)},
        }})
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _meta(d),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": NAME},
            "minReplicas": d.min_replicas,
            "maxReplicas": d.max_replicas,
            "metrics": metrics,
            "behavior": _scaling_behavior(),
        },
    }


def _quantity(value: float) -> str:
    """A Kubernetes quantity in milli-units (``1234m``), exact for fractional rates."""
    return f"{round(value * 1000)}m"


def fallback_replicas(d: Deployment) -> int:
    """KEDA's replicas while the signal is missing: fail closed at the capacity for the peak."""
    return d.capacity.max_replicas if d.capacity else d.max_replicas


def scaled_object(d: Deployment) -> dict[str, Any]:
    """KEDA ScaledObject: the same signals and targets through KEDA's Prometheus trigger; a
    missing series is an error (``ignoreNullValues: false``), and errors fall back to
    ``fallback_replicas`` (never below the current count)."""
    triggers = [{
        "type": "prometheus",
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": d.prometheus_url,
            "query": promql.keda_query(d.namespace, NAME),
            "threshold": str(d.queue_target_us),
            "ignoreNullValues": "false",
        },
    }]
    if d.capacity:
        triggers.append({
            "type": "prometheus",
            "metricType": "AverageValue",
            "metadata": {
                "serverAddress": d.prometheus_url,
                "query": promql.keda_rate_query(d.namespace, NAME),
                "threshold": f"{d.capacity.target_rps:g}",
                "ignoreNullValues": "false",
            },
        })
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": _meta(d),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": NAME},
            "minReplicaCount": d.min_replicas,
            "maxReplicaCount": d.max_replicas,
            "pollingInterval": 15,
            "fallback": {"failureThreshold": 3, "replicas": fallback_replicas(d),
                         "behavior": "currentReplicasIfHigher"},
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _scaling_behavior()}},
            "triggers": triggers,
        },
    }


# ------------------------------------------------------------------ the OpenAI/TEI gateway


def api_labels(d: Deployment) -> dict[str, str]:
    """The gateway's labels: the deployment's, with its own component."""
    return {**labels(d), "app.kubernetes.io/component": "api"}


def api_selector(d: Deployment) -> dict[str, str]:
    """The gateway pods' selector (never the triton pods': the component differs)."""
    return {k: v for k, v in api_labels(d).items() if k != "app.kubernetes.io/part-of"}


def api_command(d: Deployment) -> list[str]:
    """``python3 -m tools.api`` calling the triton Service's HTTP port (the front, so each
    pipeline's SLO admission applies to API traffic too), on the repository in the pod."""
    return ["python3", "-m", "tools.api", "--url", f"{NAME}:{HTTP_PORT}",
            "--repository", d.repository, "--host", "0.0.0.0", "--port", str(API_PORT)]


def _api_init_containers(d: Deployment) -> list[dict[str, Any]]:
    """The repository as the triton pods get it (copied artifact and verified, image volume or
    claim verified), but for --dev-build: the gateway reads only the Python models' files
    (tokenizers, labels), so it builds those alone (about a second, under 100 MB measured)."""
    if d.source != "dev-build":
        return _init_containers(d)
    builder = _builder(d, d.repository)
    for name in d.python_models:
        builder["command"] += ["--only", name]
    builder["resources"] = _resources(1, VERIFY_MEMORY_MIB, 0)
    return [builder]


def api_deployment(d: Deployment) -> dict[str, Any]:
    """The gateway's Deployment: non-root, read-only root, ready once Triton and every pipeline
    answer through the front (``/health``), alive while it accepts connections. Burstable: it
    requests a quarter core and may use one, so the HPA's CPU target has room above it."""
    container = {
        "name": "api",
        "image": d.gateway_image,
        "command": api_command(d),
        "workingDir": PROJECT,  # where the serving image keeps tools/
        "env": [{"name": "HOME", "value": "/tmp"}],
        "ports": [{"name": "http", "containerPort": API_PORT, "protocol": "TCP"}],
        "resources": {"requests": dict(API_REQUESTS), "limits": dict(API_LIMITS)},
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"},
                           "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 2},
        "livenessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 10,
                          "timeoutSeconds": 5, "failureThreshold": 3},
        # Serve while the endpoint removal reaches every front, then SIGTERM: uvicorn stops
        # accepting and finishes what it holds (Triton gives a request as long).
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRE_STOP_SLEEP_S)]}}},
        "securityContext": _CONTAINER_SECURITY,
        "volumeMounts": [_repository_mount(d), {"name": "tmp", "mountPath": "/tmp"}],
    }
    pod_spec = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": PRE_STOP_SLEEP_S + EXIT_TIMEOUT_S,
        "securityContext": _POD_SECURITY,
        "initContainers": _api_init_containers(d),
        "containers": [container],
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway",
             "labelSelector": {"matchLabels": api_selector(d)},
             "matchLabelKeys": ["pod-template-hash"]}
            for key in ("topology.kubernetes.io/zone", "kubernetes.io/hostname")
        ],
        # No GPU and no node selector: the gateway runs on any node.
        "volumes": [
            _repository_volume(d, repository_size_mib(d)),
            {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}},
            *_build_volumes(d),
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(d, API_NAME, api_labels(d)),
        "spec": {
            # No `replicas`: its HPA owns it.
            "selector": {"matchLabels": api_selector(d)},
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "minReadySeconds": 5,
            "progressDeadlineSeconds": PROGRESS_DEADLINE_S[d.target],
            "revisionHistoryLimit": 5,
            "template": {"metadata": {"labels": api_labels(d)}, "spec": pod_spec},
        },
    }


def api_service(d: Deployment) -> dict[str, Any]:
    """The gateway's ClusterIP Service, which the front of every triton pod forwards to."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(d, API_NAME, api_labels(d)),
        "spec": {
            "type": "ClusterIP",
            "selector": api_selector(d),
            "ports": [{"name": "http", "port": API_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def api_autoscaler(d: Deployment) -> dict[str, Any]:
    """autoscaling/v2 HPA on the gateway's own CPU (the metrics server's, no adapter), within
    the deployment's replica bounds."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _meta(d, API_NAME, api_labels(d)),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": API_NAME},
            "minReplicas": d.min_replicas,
            "maxReplicas": d.max_replicas,
            "metrics": [{"type": "Resource", "resource": {
                "name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": API_CPU_UTILIZATION},
            }}],
            "behavior": _scaling_behavior(),
        },
    }


def api_disruption_budget(d: Deployment) -> dict[str, Any]:
    """At most one gateway pod down for a voluntary disruption."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(d, API_NAME, api_labels(d)),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": api_selector(d)},
                 "unhealthyPodEvictionPolicy": "AlwaysAllow"},
    }


def api_network_policy(d: Deployment) -> dict[str, Any]:
    """Into the gateway: its port from the triton pods' fronts only. Out of it: the triton pods'
    HTTP port (the front) and DNS, nothing else."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(d, API_NAME, api_labels(d)),
        "spec": {
            "podSelector": {"matchLabels": api_selector(d)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": selector(d)}}],
                         "ports": [{"protocol": "TCP", "port": API_PORT}]}],
            "egress": [
                {"to": [{"podSelector": {"matchLabels": selector(d)}}],
                 "ports": [{"protocol": "TCP", "port": HTTP_PORT}]},
                {"ports": [{"protocol": "UDP", "port": DNS_PORT},
                           {"protocol": "TCP", "port": DNS_PORT}]},
            ],
        },
    }


def api_objects(d: Deployment) -> list[dict[str, Any]]:
    """Every object of the gateway: Deployment, Service, HPA, PDB, NetworkPolicy."""
    return [api_deployment(d), api_service(d), api_autoscaler(d), api_disruption_budget(d),
            api_network_policy(d)]
