"""``tools deploy``: render deployments of the model repository (``tools deploy k8s``).

Thin click commands: options in, ``render.render_k8s`` out, one summary line per file.
"""

from __future__ import annotations

from pathlib import Path

import click

from tools.command import ToolGroup
from tools.build_repo.spec import TARGETS
from tools.deploy.render import DEFAULT_PROMETHEUS_URL, render_k8s


@click.group(cls=ToolGroup)
def deploy() -> None:
    """Render deployments of the model repository."""


@deploy.command("k8s")
@click.option("--target", type=click.Choice(TARGETS), required=True,
              help="cpu (CPU image, embedded Triton 2.51) or gpu (NGC image, nvidia.com/gpu).")
@click.option("--output", type=click.Path(path_type=Path), required=True,
              help="Folder to write: new, empty, or rendered by this command before.")
@click.option("--spec", "spec_path", type=click.Path(path_type=Path), default=Path("repository.yaml"),
              show_default=True, help="The repository spec.")
@click.option("--image", help="Serving image [default: triton-forge/triton-cpu:local or triton-forge/triton:local].")
@click.option("--builder-image", help="Builder image of the same family (builds the repository in an init container).")
@click.option("--namespace", default="triton-forge", show_default=True)
@click.option("--cpu", type=click.IntRange(min=1), help="Cores per replica [default: the spec's cpu_cores].")
@click.option("--gpus", type=click.IntRange(min=1), help="GPUs per replica (gpu target) [default: what the instance groups use].")
@click.option("--memory", "memory_mib", type=click.IntRange(min=1), help="MiB per replica [default: computed from the spec].")
@click.option("--min-replicas", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--max-replicas", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--slo-profile", help="Profile of loadtests/slo.yaml for the SLO rules [default: the target].")
@click.option("--prometheus-url", default=DEFAULT_PROMETHEUS_URL, show_default=True,
              help="Prometheus the KEDA trigger queries.")
def k8s(target: str, output: Path, spec_path: Path, image: str | None, builder_image: str | None,
        namespace: str, cpu: int | None, gpus: int | None, memory_mib: int | None,
        min_replicas: int, max_replicas: int, slo_profile: str | None, prometheus_url: str) -> None:
    """Render Kubernetes manifests: Deployment (Guaranteed QoS), Service, PDB, PodMonitor,
    PrometheusRule, an HPA on Triton's queue time (prometheus-adapter) or a KEDA ScaledObject.

    \b
    Apply:  kubectl apply -f OUTPUT/manifests    (docs/kubernetes.md: the admin-key Secret,
            prometheus-adapter with OUTPUT/prometheus-adapter/rules.yaml, or KEDA instead)
    """
    rendered = render_k8s(
        spec_path, target, output, image=image, builder_image=builder_image, namespace=namespace,
        cpu=cpu, gpus=gpus, memory_mib=memory_mib, min_replicas=min_replicas,
        max_replicas=max_replicas, slo_profile=slo_profile, prometheus_url=prometheus_url,
    )
    r = rendered.resources
    gpu = f", {r.gpus} GPU" if r.gpus else ""
    click.echo(f"replica: {r.cpu} cores, {r.memory_mib} MiB (/dev/shm {r.shm_mib} MiB){gpu}")
    for relative in rendered.files:
        if not relative.startswith("."):
            click.echo(f"wrote {rendered.output / relative}")
