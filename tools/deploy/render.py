"""Render the Kubernetes deployment of a repository spec into a folder, all or nothing.

Objects come from ``manifests`` (plain data) and are written as YAML into a temporary sibling
folder that is renamed into place, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tools.build_repo.spec import TARGETS, load_spec
from tools.deploy import manifests, promql
from tools.deploy.sizing import PodResources, size_pod
from tools.errors import UserInputError

MARKER = ".triton-forge-k8s"  # lists the files of a rendered folder; only such a folder is replaced
DEFAULT_PROMETHEUS_URL = "http://prometheus-operated.monitoring.svc:9090"


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


def files_of(d: manifests.Deployment, objectives: tuple[promql.Objective, ...],
             prometheus_url: str) -> dict[str, str]:
    """Relative path -> YAML text of every file of the rendered folder."""
    header = (f"# Rendered by `tools deploy k8s --target {d.target}` from repository.yaml; "
              "do not edit, re-render.\n")
    objects = {
        "manifests/configmap-spec.yaml": manifests.spec_configmap(d),
        "manifests/deployment.yaml": manifests.deployment(d),
        "manifests/service.yaml": manifests.service(d),
        "manifests/poddisruptionbudget.yaml": manifests.pod_disruption_budget(d),
        "manifests/podmonitor.yaml": manifests.pod_monitor(d),
        "manifests/prometheusrule.yaml": manifests.prometheus_rule(d, objectives),
        "manifests/hpa.yaml": manifests.horizontal_pod_autoscaler(d),
        # The alternative to manifests/hpa.yaml (both would fight over the replica count).
        "keda/scaledobject.yaml": manifests.scaled_object(d, prometheus_url),
        # Not Kubernetes objects: prometheus-adapter's config and a plain Prometheus rule file.
        "prometheus-adapter/rules.yaml": promql.adapter_rules(),
        "prometheus/rules.yaml": promql.rule_file(objectives),
    }
    return {path: header + to_yaml(obj) for path, obj in objects.items()}


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


def render_k8s(
    spec_path: Path,
    target: str,
    output: Path,
    *,
    image: str | None = None,
    builder_image: str | None = None,
    namespace: str = "triton-forge",
    cpu: int | None = None,
    gpus: int | None = None,
    memory_mib: int | None = None,
    min_replicas: int = 2,
    max_replicas: int = 8,
    slo_profile: str | None = None,
    prometheus_url: str = DEFAULT_PROMETHEUS_URL,
) -> Rendered:
    """Render the manifests of ``spec_path`` for ``target`` into ``output``.

    Args:
        spec_path: ``repository.yaml``.
        target: ``cpu`` or ``gpu``.
        output: The folder to write (new, empty, or rendered by this function before).
        image: Serving image; default ``manifests.DEFAULT_IMAGES[target][0]``.
        builder_image: Builder image of the same family; default ``DEFAULT_IMAGES[target][1]``.
        namespace: Namespace of every object (and of the KEDA query).
        cpu: Cores per replica (default the spec's ``cpu_cores``).
        gpus: GPUs per replica (gpu target; default what the instance groups use).
        memory_mib: Memory per replica (default the computed need).
        min_replicas: Autoscaler lower bound.
        max_replicas: Autoscaler upper bound.
        slo_profile: Profile of ``loadtests/slo.yaml`` for the SLO rules; default the target.
        prometheus_url: Prometheus the KEDA trigger queries.

    Returns:
        What was written.

    Raises:
        UserInputError: an unknown target, a bad spec, instances that do not fit, bad replica
            bounds, or an output folder holding other files; nothing is written then.
    """
    if target not in TARGETS:
        raise UserInputError(f"--target {target!r}: unknown target (known: {', '.join(TARGETS)})")
    if not 1 <= min_replicas <= max_replicas:
        raise UserInputError(
            f"replicas: need 1 <= --min-replicas ({min_replicas}) <= --max-replicas ({max_replicas})"
        )
    output = Path(output).absolute()
    _check_output(output)
    spec = load_spec(spec_path)
    resources = size_pod(spec, target, cpu=cpu, gpus=gpus, memory_mib=memory_mib)
    objectives = promql.objectives(slo_profile or target)
    default_image, default_builder = manifests.DEFAULT_IMAGES[target]
    deployment = manifests.Deployment(
        target=target, namespace=namespace, image=image or default_image,
        builder_image=builder_image or default_builder, resources=resources,
        spec_text=spec.path.read_text(encoding="utf-8"), min_replicas=min_replicas,
        max_replicas=max_replicas, queue_target_us=promql.queue_target_us(objectives),
    )
    files = files_of(deployment, objectives, prometheus_url)
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
