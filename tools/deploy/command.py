"""``tools deploy``: package the model repository and render deployments of it.

Thin click commands: ``tools deploy package`` (``artifact.package``) and ``tools deploy k8s``
(``render.render_k8s``), one summary line per result.
"""

from __future__ import annotations

from pathlib import Path

import click

from tools.files import write_atomically
from tools.command import ToolGroup, spec_option
from tools.build_repo.spec import TARGETS
from tools.deploy.artifact import default_record_path, package as package_repository
from tools.deploy.render import AUTOSCALERS, DEFAULT_PROMETHEUS_URL, render_k8s


@click.group(cls=ToolGroup)
def deploy() -> None:
    """Package the model repository and render deployments of it."""


@deploy.command("package")
@click.option("--repository", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="A repository tools build-repo wrote (with build_manifest.json).")
@click.option("--name", "image", required=True,
              help="Image name without tag, e.g. registry.example/triton-forge/models.")
@click.option("--copier-image", required=True,
              help="An image with a static /bin/busybox (the serving images carry one).")
@click.option("--engine", type=click.Choice(["podman", "docker"]),
              help="Container engine [default: Docker when its engine answers, else Podman].")
@click.option("--push", is_flag=True, help="Push to the registry and record its digest.")
@click.option("--record", type=click.Path(path_type=Path, dir_okay=False),
              help="Where to write the record [default: <repository>.artifact.json].")
def package(repository: Path, image: str, copier_image: str, engine: str | None, push: bool,
            record: Path | None) -> None:
    """Turn a built repository into a content-addressed OCI image: the repository and its
    manifest (plus one static busybox that copies it into the pod), tagged
    <target>-<manifest sha256>, referenced by digest. Every file is checked against the
    manifest first. The record is what `tools deploy k8s --artifact` reads."""
    built = package_repository(repository, image, copier_image, engine=engine, push=push)
    path = record or default_record_path(repository)
    write_atomically(path, built.to_text())
    click.echo(f"artifact {built.reference}: {built.files} files, {built.bytes / 1e6:.1f} MB "
               f"({built.engine}{', pushed' if built.pushed else ', local store'})")
    click.echo(f"wrote {path}")


@deploy.command("k8s")
@click.option("--target", type=click.Choice(TARGETS), required=True,
              help="cpu (CPU image, embedded Triton 2.51) or gpu (NGC image, nvidia.com/gpu).")
@click.option("--output", type=click.Path(path_type=Path), required=True,
              help="Folder to write: new, empty, or rendered by this command before.")
@spec_option()
@click.option("--artifact", type=click.Path(path_type=Path, dir_okay=False),
              help="The record tools deploy package wrote: pods copy (or mount) that artifact.")
@click.option("--dev-build", is_flag=True,
              help="Development: build the repository in every pod (local :local images allowed).")
@click.option("--plans-job", is_flag=True,
              help="gpu: a Job builds the repository (TensorRT plans) once per GPU product into "
                   "a claim the pods read.")
@click.option("--gpu-product", help="nvidia.com/gpu.product to pin pods (and the plans Job) to.")
@click.option("--image", help="Serving image, as the cluster pulls it (required but with --dev-build).")
@click.option("--builder-image", help="Builder image of the same family (--dev-build, --plans-job).")
@click.option("--front-image",
              help="The front's image (HAProxy 2.6 with Lua) [default: the official haproxy "
                   "image pinned by digest; with --dev-build on cpu the Debian-built "
                   "triton-forge/front-cpu:local].")
@click.option("--api-image",
              help="The OpenAI/TEI gateway's image [default: the serving image, which carries it].")
@click.option("--cluster-domain", default="cluster.local", show_default=True,
              help="The cluster's DNS domain: the front names the gateway's Service by its "
                   "fully qualified name.")
@click.option("--image-volume", is_flag=True,
              help="Mount the artifact as a Kubernetes image volume (1.33+, feature gate "
                   "ImageVolume) instead of copying it.")
@click.option("--k8s-version", default="1.33", show_default=True,
              help="The cluster's Kubernetes version (decides whether --image-volume may be used).")
@click.option("--namespace", default="triton-forge", show_default=True)
@click.option("--cpu", type=click.IntRange(min=1), help="Cores per replica [default: the spec's cpu_cores].")
@click.option("--gpus", type=click.IntRange(min=1), help="GPUs per replica (gpu target) [default: what the instance groups use].")
@click.option("--memory", "memory_mib", type=click.IntRange(min=1), help="MiB per replica [default: computed].")
@click.option("--min-replicas", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--max-replicas", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--autoscaler", type=click.Choice(AUTOSCALERS), default="hpa", show_default=True,
              help="The one autoscaler rendered: HPA (prometheus-adapter) or KEDA.")
@click.option("--monitor-label", "monitor_labels", multiple=True, metavar="KEY=VALUE",
              help="Label for the Prometheus Operator's selectors on the PodMonitor and "
                   "PrometheusRule (kube-prometheus-stack: release=<release name>); repeatable.")
@click.option("--monitoring-namespace", default="monitoring", show_default=True,
              help="Namespace Prometheus scrapes from (NetworkPolicy).")
@click.option("--from-tune", type=click.Path(path_type=Path),
              help="A tools tune folder (reports/tune/<scenario>): HPA target and replica bounds "
                   "from its measured per-pod throughput.")
@click.option("--peak-rps", type=click.FloatRange(min=0, min_open=True),
              help="With --from-tune: the peak load to size maxReplicas for.")
@click.option("--slo-profile", help="Profile of loadtests/slo.yaml for the SLO rules [default: the target].")
@click.option("--prometheus-url", default=DEFAULT_PROMETHEUS_URL, show_default=True,
              help="Prometheus the KEDA trigger queries.")
def k8s(target: str, output: Path, spec_path: Path, artifact: Path | None, dev_build: bool,
        plans_job: bool, gpu_product: str | None, image: str | None, builder_image: str | None,
        front_image: str | None, api_image: str | None, cluster_domain: str, image_volume: bool, k8s_version: str, namespace: str, cpu: int | None, gpus: int | None,
        memory_mib: int | None, min_replicas: int, max_replicas: int, autoscaler: str,
        monitor_labels: tuple[str, ...], monitoring_namespace: str, from_tune: Path | None,
        peak_rps: float | None, slo_profile: str | None, prometheus_url: str) -> None:
    """Render Kubernetes manifests: Deployment (Guaranteed QoS, the repository from an artifact),
    Service, NetworkPolicy, PDB, PodMonitor, PrometheusRule, one autoscaler, and the OpenAI/TEI
    gateway's own Deployment, Service and HPA behind the front.

    \b
    Apply:  kubectl apply -f OUTPUT/manifests    (OUTPUT/README.md: the Secret, the adapter)
    """
    rendered = render_k8s(
        spec_path, target, output, image=image, builder_image=builder_image,
        front_image=front_image, api_image=api_image, cluster_domain=cluster_domain,
        artifact=artifact,
        dev_build=dev_build, plans_job=plans_job, gpu_product=gpu_product,
        image_volume=image_volume, k8s_version=k8s_version, namespace=namespace, cpu=cpu,
        gpus=gpus, memory_mib=memory_mib, min_replicas=min_replicas, max_replicas=max_replicas,
        slo_profile=slo_profile, prometheus_url=prometheus_url, autoscaler=autoscaler,
        monitor_labels=monitor_labels, monitoring_namespace=monitoring_namespace,
        from_tune=from_tune, peak_rps=peak_rps,
    )
    r = rendered.resources
    gpu = f", {r.gpus} GPU" if r.gpus else ""
    click.echo(f"replica: {r.cpu} cores, {r.memory_mib} MiB (/dev/shm {r.shm_mib} MiB){gpu}")
    if not monitor_labels:
        click.echo("note: no --monitor-label: a Prometheus Operator selecting by label "
                   "(kube-prometheus-stack: release=<name>) will not load the PodMonitor or rules",
                   err=True)
    for relative in rendered.files:
        if not relative.startswith("."):
            click.echo(f"wrote {rendered.output / relative}")
