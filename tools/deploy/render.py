"""Render the Kubernetes deployment of a repository spec into a folder, all or nothing.

Objects come from ``manifests`` (plain data) and are written as YAML into a temporary sibling
folder that is renamed into place, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tools.build_repo.spec import TARGETS, load_spec
from tools.typed_yaml import REFERENCE_PATTERN
from tools.deploy import manifests, promql
from tools.deploy.sizing import PodResources, size_pod
from tools.errors import UserInputError

MARKER = ".triton-forge-k8s"  # lists the files of a rendered folder; only such a folder is replaced
DEFAULT_PROMETHEUS_URL = "http://prometheus-operated.monitoring.svc:9090"
AUTOSCALERS = ("hpa", "keda")


class OutputFolderError(UserInputError):
    """The output folder holds files this command did not write."""


@dataclass(frozen=True)
class Rendered:
    """What ``render_k8s`` wrote.

    Attributes:
        output: The folder.
        files: Relative paths of the files written, sorted.
        resources: One replica's resources.
    """

    output: Path
    files: tuple[str, ...]
    resources: PodResources


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings (the spec, alert expressions), no anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(*documents: dict[str, Any]) -> str:
    """YAML documents, ``---`` separated, keys in the order the data gives them."""
    return yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False, width=100)


def files_of(d: manifests.Deployment, objectives: tuple[promql.Objective, ...]) -> dict[str, str]:
    """Relative path -> text of every file of the rendered folder."""
    header = (f"# Rendered by `tools deploy k8s --target {d.target}` from repository.yaml; "
              "do not edit, re-render.\n")
    objects: dict[str, Any] = {
        "manifests/deployment.yaml": manifests.deployment(d),
        "manifests/service.yaml": manifests.service(d),
        "manifests/networkpolicy.yaml": manifests.network_policy(d),
        "manifests/poddisruptionbudget.yaml": manifests.pod_disruption_budget(d),
        "manifests/podmonitor.yaml": manifests.pod_monitor(d),
        # The OpenAI/TEI gateway: its Deployment, Service, HPA, PDB and NetworkPolicy.
        "manifests/api.yaml": manifests.api_objects(d),
        "manifests/prometheusrule.yaml": manifests.prometheus_rule(d, objectives),
        # Not Kubernetes objects: a plain Prometheus rule file (promtool test rules).
        "prometheus/rules.yaml": promql.rule_file(objectives, d.namespace,
                                                  d.capacity.scenario if d.capacity else None),
    }
    if d.source in ("dev-build", "plans-job"):
        objects["manifests/configmap-spec.yaml"] = manifests.spec_configmap(d)
    if d.source == "plans-job":
        objects["jobs/plans.yaml"] = manifests.plans_job(d)
    # One autoscaler per render: two would fight over the replica count.
    if d.autoscaler == "hpa":
        objects["manifests/hpa.yaml"] = manifests.horizontal_pod_autoscaler(d)
        objects["prometheus-adapter/rules.yaml"] = promql.adapter_rules(d.capacity is not None)
    else:
        objects["manifests/scaledobject.yaml"] = manifests.scaled_object(d)
    files = {path: header + (to_yaml(*obj) if isinstance(obj, list) else to_yaml(obj))
             for path, obj in objects.items()}
    files["README.md"] = readme(d, sorted(files))
    return files


def readme(d: manifests.Deployment, paths: list[str]) -> str:
    """The rendered folder's README: what it holds, how to apply it, the sizing arithmetic."""
    r = d.resources
    source = {
        "artifact": (f"the artifact `{d.artifact_reference}`, "
                     + ("mounted as an image volume and verified against its manifest by an init "
                        "container" if d.image_volume else
                        "copied into an emptyDir and verified against its build manifest by two "
                        "init containers (fetch-repository, verify-repository)")),
        "dev-build": "built in the pod by `tools build-repo` (development mode, --dev-build)",
        "plans-job": (f"built once by the Job in jobs/plans.yaml on a `{d.gpu_product}` node into "
                      f"the claim `{d.plans_claim}`, verified by an init container"),
    }[d.source]
    lines = [
        f"# triton-forge on Kubernetes ({d.target} target)",
        "",
        f"Rendered by `tools deploy k8s`; re-render rather than edit. The repository is {source}.",
        "",
        "## Apply",
        "",
        "```sh",
        f"kubectl create namespace {d.namespace}",
        f"kubectl -n {d.namespace} create secret generic {manifests.ADMIN_SECRET} "
        f"--from-literal={manifests.ADMIN_SECRET_KEY}=\"$(openssl rand -hex 16)\"",
    ]
    if d.source == "plans-job":
        lines += ["kubectl apply -f manifests/configmap-spec.yaml -f jobs/plans.yaml",
                  f"kubectl -n {d.namespace} wait --for=condition=complete job/{d.plans_claim} "
                  "--timeout=60m"]
    lines += ["kubectl apply -f manifests/", "```", ""]
    if not d.monitor_labels:
        lines += ["PodMonitor and PrometheusRule carry no `--monitor-label`: a Prometheus "
                  "Operator that selects by label (kube-prometheus-stack: `release=<release>`) "
                  "will not load them, and the autoscaler's signal will be missing.", ""]
    else:
        shown = ", ".join(f"`{k}={v}`" for k, v in d.monitor_labels)
        lines += [f"PodMonitor and PrometheusRule carry {shown} for the Operator's selectors.", ""]
    lines += [
        f"Clients need the label `{next(iter(manifests.CLIENT_LABEL))}: \"true\"` (NetworkPolicy:"
        f" ports {manifests.HTTP_PORT}/{manifests.GRPC_PORT}); ports {manifests.METRICS_PORT}/"
        f"{manifests.STATUS_PORT} answer only the `{d.monitoring_namespace}` namespace.",
        "",
        f"Autoscaler: {'HPA through prometheus-adapter (prometheus-adapter/rules.yaml)' if d.autoscaler == 'hpa' else 'KEDA ScaledObject (fails closed: no series is an error, fallback ' + str(manifests.fallback_replicas(d)) + ' replicas)'};"
        f" {d.min_replicas}-{d.max_replicas} replicas.",
        "",
        "## One replica",
        "",
        f"{r.cpu} cores, {r.memory_mib} MiB (requests = limits), /dev/shm {r.shm_mib} MiB"
        + (f", {r.gpus} GPU" if r.gpus else "") + ":",
        "",
        *[f"- {name}: {mib} MiB" for name, mib in r.breakdown],
        "",
        f"And the front (HAProxy, `{d.front_image}`): {manifests.FRONT_CPU} CPU, "
        f"{manifests.FRONT_MEMORY_MIB} MiB. It holds ports {manifests.HTTP_PORT}/"
        f"{manifests.GRPC_PORT} and runs the `haproxy.cfg` `tools build-repo` wrote into the "
        "repository; tritonserver listens on the pod's loopback behind it.",
        "",
        "## The OpenAI/TEI gateway",
        "",
        f"`{manifests.API_NAME}` (manifests/api.yaml, image `{d.gateway_image}`): OpenAI's "
        "/v1/embeddings and TEI's /embed, /rerank, /predict on port "
        f"{manifests.HTTP_PORT} of the `{manifests.NAME}` Service, where each pod's front routes "
        f"those paths to the gateway's Service (`{d.gateway_address}`); /v2/ stays Triton's. "
        f"It calls the pipelines through `{manifests.NAME}:{manifests.HTTP_PORT}`, so their "
        "admission applies to it too. Requests "
        f"{manifests.API_REQUESTS['cpu']} CPU / {manifests.API_REQUESTS['memory']}, limits "
        f"{manifests.API_LIMITS['cpu']} CPU / {manifests.API_LIMITS['memory']}; its own HPA "
        f"scales it at {manifests.API_CPU_UTILIZATION}% of the CPU request, "
        f"{d.min_replicas}-{d.max_replicas} replicas (the metrics server's CPU, no adapter).",
        "",
    ]
    if d.capacity:
        lines += ["## Capacity from measurement (--from-tune)", "", *[f"- {x}" for x in d.capacity.lines], ""]
    lines += ["## Files", "", *[f"- `{p}`" for p in paths], ""]
    return "\n".join(lines)


def _check_output(output: Path) -> None:
    if not output.exists():
        return
    if not output.is_dir():
        raise OutputFolderError(f"--output {output}: exists and is not a folder")
    present = sorted(str(p.relative_to(output)) for p in output.rglob("*") if p.is_file())
    if not present:
        return
    marker = output / MARKER
    if not marker.is_file():
        raise OutputFolderError(
            f"--output {output}: holds files this command did not write "
            f"({', '.join(present[:5])}{', ...' if len(present) > 5 else ''}); "
            "give an empty or new folder, or one rendered before"
        )
    ours = set(marker.read_text(encoding="utf-8").split()) | {MARKER}
    others = [p for p in present if p not in ours]
    if others:
        raise OutputFolderError(
            f"--output {output}: files not rendered by this command: {', '.join(others[:5])}; "
            "move them away (nothing was written)"
        )


def _labels(pairs: Sequence[str], option: str) -> tuple[tuple[str, str], ...]:
    out = []
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise UserInputError(f"{option} {pair!r}: give KEY=VALUE (e.g. release=kube-prometheus-stack)")
        out.append((key, value))
    return tuple(out)


def _version(text: str) -> tuple[int, int]:
    try:
        major, minor = (int(x) for x in text.removeprefix("v").split(".")[:2])
    except ValueError:
        raise UserInputError(f"--k8s-version {text!r}: give MAJOR.MINOR, e.g. 1.33") from None
    return major, minor


DOMAIN = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*")
IMAGE_VOLUME_SINCE = (1, 33)  # image volumes are beta (feature gate ImageVolume) from 1.33


def _in_image(path: Path, root: Path) -> bool:
    """A spec path the builder image holds: under the project folders it copies."""
    try:
        relative = path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return bool(relative.parts) and relative.parts[0] in BUILDER_IMAGE_FOLDERS


BUILDER_IMAGE_FOLDERS = ("tools", "backends", "loadtests")  # docker/*.Dockerfile `builder` COPY


def dev_build_files(spec: Any, target: str) -> list[str]:
    """Local files the spec makes the in-pod build read that the builder image lacks, one line
    each naming the model and field (a recipe's folder, an ONNX file, a Python model's files,
    quality and calibration texts)."""
    reference = re.compile(REFERENCE_PATTERN)  # `package.module:function`

    missing = []
    root = Path(spec.path).parent
    for m in (*spec.for_target(target).models, *spec.for_target(target).python_models):
        found: list[tuple[str, str]] = []
        if getattr(m, "recipe", None) is not None and m.recipe.path:
            found.append(("recipe.path", m.recipe.path))
        if getattr(m, "onnx", ""):
            found.append(("onnx", m.onnx))
        found += [(f"files.{name}", location) for name, location in dict(getattr(m, "files", None) or {}).items()]
        cpu = getattr(m, "cpu", None)
        gate = getattr(cpu, "quality", None)
        if gate is not None:
            found += [("cpu.quality.texts", gate.texts), ("cpu.quality.tokenizer", gate.tokenizer)]
        if getattr(cpu, "calibration_texts", None):
            found.append(("cpu.calibration_texts", cpu.calibration_texts))
        for field_name, location in found:
            if reference.match(str(location).partition("/")[0]) and not (root / str(location)).exists():
                continue  # resolved by an installed package inside the image
            path = Path(location) if Path(location).is_absolute() else root / location
            if not _in_image(path, root):
                missing.append(f"model {m.name!r} field {field_name}: {path}")
    return missing


def render_k8s(
    spec_path: Path,
    target: str,
    output: Path,
    *,
    image: str | None = None,
    builder_image: str | None = None,
    front_image: str | None = None,
    api_image: str | None = None,
    cluster_domain: str = manifests.DEFAULT_CLUSTER_DOMAIN,
    artifact: Path | None = None,
    dev_build: bool = False,
    plans_job: bool = False,
    gpu_product: str | None = None,
    image_volume: bool = False,
    k8s_version: str = "1.33",
    namespace: str = "triton-forge",
    cpu: int | None = None,
    gpus: int | None = None,
    memory_mib: int | None = None,
    min_replicas: int = 2,
    max_replicas: int = 8,
    slo_profile: str | None = None,
    prometheus_url: str = DEFAULT_PROMETHEUS_URL,
    autoscaler: str = "hpa",
    monitor_labels: Sequence[str] = (),
    monitoring_namespace: str = "monitoring",
    from_tune: Path | None = None,
    peak_rps: float | None = None,
) -> Rendered:
    """Render the manifests of ``spec_path`` for ``target`` into ``output``.

    Args:
        spec_path: ``repository.yaml``.
        target: ``cpu`` or ``gpu``.
        output: The folder to write (new, empty, or rendered by this function before).
        image: Serving image (required; with ``dev_build`` default ``DEV_IMAGES``).
        builder_image: Builder image of the same family (``dev_build``, ``plans_job``).
        front_image: The front's image (HAProxy 2.6 with Lua) [default: the official image
            ``manifests.FRONT_IMAGE``; with ``dev_build`` ``DEV_FRONT_IMAGES``].
        api_image: The OpenAI/TEI gateway's image [default: the serving image, which carries
            it].
        cluster_domain: The cluster's DNS domain: the front names the gateway's Service by its
            fully qualified name.
        artifact: The record ``tools deploy package`` wrote: the pods copy (or mount) that
            artifact and build nothing.
        dev_build: Build the repository in the pod (development mode).
        plans_job: gpu: a Job builds the repository once per GPU product into a claim.
        gpu_product: ``nvidia.com/gpu.product`` to pin the pods (and the Job) to.
        image_volume: Mount the artifact as an image volume (Kubernetes 1.33+).
        k8s_version: The cluster's version (decides what ``image_volume`` may use).
        namespace: Namespace of every object (and of the KEDA query).
        cpu: Cores per replica (default the spec's ``cpu_cores``).
        gpus: GPUs per replica (gpu target; default what the instance groups use).
        memory_mib: Memory per replica (default the computed need).
        min_replicas: Autoscaler lower bound (``from_tune`` sets it).
        max_replicas: Autoscaler upper bound (``from_tune`` sets it).
        slo_profile: Profile of ``loadtests/slo.yaml`` for the SLO rules; default the target.
        prometheus_url: Prometheus the KEDA trigger queries.
        autoscaler: ``hpa`` (prometheus-adapter) or ``keda``; only that one is rendered.
        monitor_labels: ``KEY=VALUE`` labels for the Prometheus Operator's selectors.
        monitoring_namespace: Where Prometheus runs (the NetworkPolicy lets it scrape).
        from_tune: A ``tools tune`` output folder: HPA target and bounds from its measurement.
        peak_rps: The load ``from_tune`` sizes the upper bound for.

    Returns:
        What was written.

    Raises:
        UserInputError: a missing image or artifact, an unknown target, a bad spec, instances
            that do not fit, bad replica bounds, an output folder holding other files; nothing
            is written then.
    """
    from tools.deploy.artifact import ArtifactRecord
    from tools.deploy.capacity import capacity_from_tune

    if target not in TARGETS:
        raise UserInputError(f"--target {target!r}: unknown target (known: {', '.join(TARGETS)})")
    if autoscaler not in AUTOSCALERS:
        raise UserInputError(f"--autoscaler {autoscaler!r}: give one of {', '.join(AUTOSCALERS)}")
    modes = [name for name, on in (("--artifact", artifact is not None), ("--dev-build", dev_build),
                                   ("--plans-job", plans_job)) if on]
    if len(modes) != 1:
        raise UserInputError(
            f"give exactly one of --artifact RECORD (tools deploy package writes it), --plans-job "
            f"(gpu) or --dev-build (the repository built in every pod), not "
            f"{' and '.join(modes) if modes else 'none'}")
    source = {"--artifact": "artifact", "--dev-build": "dev-build", "--plans-job": "plans-job"}[modes[0]]
    dev_image, dev_builder = manifests.DEV_IMAGES[target]
    if image is None and not dev_build:
        raise UserInputError(
            "--image is required: the serving image as the cluster pulls it (registry/name:tag or "
            f"@sha256:...); only --dev-build falls back to the local {dev_image}")
    if source == "plans-job":
        if target != "gpu":
            raise UserInputError("--plans-job builds TensorRT plans: it needs --target gpu")
        if not gpu_product or not builder_image:
            raise UserInputError("--plans-job needs --gpu-product (the nodes' nvidia.com/gpu.product, "
                                 "e.g. NVIDIA-A10) and --builder-image")
    if image_volume:
        if source != "artifact":
            raise UserInputError("--image-volume mounts the artifact: it needs --artifact")
        if _version(k8s_version) < IMAGE_VOLUME_SINCE:
            raise UserInputError(
                f"--image-volume: Kubernetes {k8s_version} has no image volumes (beta, feature "
                f"gate ImageVolume, from 1.33; --k8s-version says which the cluster runs); "
                "leave it out to copy the artifact with an init container")
    _version(k8s_version)
    if not DOMAIN.fullmatch(cluster_domain):
        raise UserInputError(f"--cluster-domain {cluster_domain!r}: give the cluster's DNS domain, "
                             "e.g. cluster.local")
    output = Path(output).absolute()
    _check_output(output)
    spec = load_spec(spec_path)
    record = ArtifactRecord.read(artifact) if artifact is not None else None
    if record is not None and record.target != target:
        raise UserInputError(f"--artifact {artifact}: built for target {record.target!r}, "
                             f"not --target {target!r}")
    if dev_build:
        missing = dev_build_files(spec, target)
        if missing:
            raise UserInputError(
                "--dev-build: the pod's builder would not find these files, which the builder "
                f"image does not hold: {'; '.join(missing)}. Build the repository here and ship "
                "it: tools build-repo, tools deploy package, then --artifact")
    capacity = capacity_from_tune(from_tune, peak_rps) if from_tune is not None else None
    if capacity is not None:
        min_replicas, max_replicas = capacity.min_replicas, capacity.max_replicas
    if not 1 <= min_replicas <= max_replicas:
        raise UserInputError(
            f"replicas: need 1 <= --min-replicas ({min_replicas}) <= --max-replicas ({max_replicas})"
        )
    resources = size_pod(spec, target, cpu=cpu, gpus=gpus, memory_mib=memory_mib,
                         built_weights=record.weights_bytes if record else None)
    objectives = promql.objectives(slo_profile or target)
    deployment = manifests.Deployment(
        target=target, namespace=namespace, image=image or dev_image,
        builder_image=builder_image or dev_builder, resources=resources,
        spec_text=spec.path.read_text(encoding="utf-8"), min_replicas=min_replicas,
        max_replicas=max_replicas, queue_target_us=promql.queue_target_us(objectives),
        source=source, artifact_reference=record.reference if record else "",
        manifest_sha256=record.manifest_sha256 if record else "", image_volume=image_volume,
        gpu_product=gpu_product, autoscaler=autoscaler,
        monitor_labels=_labels(monitor_labels, "--monitor-label"),
        monitoring_namespace=monitoring_namespace, capacity=capacity,
        prometheus_url=prometheus_url,
        front_image=front_image or (manifests.DEV_FRONT_IMAGES[target] if dev_build
                                    else manifests.FRONT_IMAGE),
        api_image=api_image or "", cluster_domain=cluster_domain,
        python_models=tuple(m.name for m in spec.for_target(target).python_models),
    )
    files = files_of(deployment, objectives)
    files[MARKER] = "".join(f"{p}\n" for p in sorted(files))
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        for relative, text in files.items():
            path = staging / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        staging.chmod(0o755)
        if output.exists():
            old = output.with_name(f".{output.name}.old-{os.getpid()}")
            output.rename(old)
            staging.rename(output)
            shutil.rmtree(old)
        else:
            staging.rename(output)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return Rendered(output, tuple(sorted(files)), resources)
