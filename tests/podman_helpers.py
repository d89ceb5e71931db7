"""Run a rendered Deployment with ``podman kube play`` on this machine (the pod tests and
benchmarks/kube_play_startup.py).

Podman 4.3 is not a kubelet. ``adapt`` changes a copy of the rendered Deployment only where
Podman lacks a kubelet feature, each change said below; the rendered files themselves are the
ones validated against Kubernetes' schemas. ``Pod`` plays it, runs the rendered probe commands
in the container (Podman runs no readiness probe, and a liveness probe only as a healthcheck
nobody triggers without systemd), and takes it down again: no container, pod, volume, secret or
/dev/shm folder is left.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tools.deploy import manifests

CONTAINERS_CONF = """[containers]
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"
"""


def adapt(doc: dict[str, Any], *, name: str, secret: str, key: str, ports: dict[str, int],
          volumes: Path, spec: Path | None = None, drop_env: tuple[str, ...] = (),
          hosts: dict[str, str] | None = None) -> dict[str, Any]:
    """A copy of the rendered Deployment that Podman 4.3 runs as the kubelet would.

    Podman publishes every containerPort on 0.0.0.0 (so: hostPort on 127.0.0.1, ``ports`` maps
    each container port's name to it: the front's http and grpc, triton's metrics), mounts no
    ConfigMap ``subPath`` (so: the spec file by hostPath), turns emptyDirs into shared root-owned
    named volumes (so: fresh world-writable host folders, memory ones on the host's /dev/shm),
    restarts finished init containers under ``restartPolicy: Always`` (so: OnFailure), and does
    not expand ``$(VAR)`` in args (so: expanded here, as the kubelet would). ``drop_env`` removes
    environment variables an older image does not know. Podman has no Services: a played pod
    reaches another by its pod name (``<name>-pod-0``) on Podman's kube network, so ``hosts``
    maps a Service's host name to the pod name behind it, in every ``host:port`` of a command,
    its args and the environment.
    """
    doc = json.loads(json.dumps(doc).replace("$(TRITON_ADMIN_KEY)", key))
    doc["metadata"]["name"] = name
    pod = doc["spec"]["template"]["spec"]
    pod["restartPolicy"] = "OnFailure"
    for service, pod_name in (hosts or {}).items():
        for container in pod["containers"] + pod.get("initContainers", []):
            swap = lambda value: (pod_name + value[len(service):]  # noqa: E731
                                  if value.startswith(f"{service}:") else value)
            for field_name in ("command", "args"):
                if field_name in container:
                    container[field_name] = [swap(v) for v in container[field_name]]
            for env in container.get("env", []):
                if "value" in env:
                    env["value"] = swap(env["value"])
    for container in pod["containers"]:
        for port in container.get("ports", []):
            port.update(hostIP="127.0.0.1", hostPort=ports[port["name"]])
    triton = pod["containers"][0]
    triton["env"] = [e for e in triton["env"] if e["name"] not in drop_env]
    for env in triton["env"]:
        if "valueFrom" in env:
            env["valueFrom"]["secretKeyRef"]["name"] = secret
    for container in pod["initContainers"]:
        for mount in container["volumeMounts"]:
            mount.pop("subPath", None)
    for volume in pod["volumes"]:
        if volume["name"] == "spec":
            volume.pop("configMap")
            volume["hostPath"] = {"path": str(spec), "type": "File"}
        elif "emptyDir" in volume:
            memory = volume.pop("emptyDir").get("medium") == "Memory"
            path = (Path("/dev/shm") / f"{name}-{volume['name']}") if memory else volumes / volume["name"]
            path.mkdir(parents=True)
            path.chmod(0o1777)
            volume["hostPath"] = {"path": str(path), "type": "Directory"}
    return doc


@dataclass
class Pod:
    """One played Deployment (``play`` then ``down``).

    Attributes:
        deployment: The rendered Deployment (as rendered, not adapted).
        workdir: A fresh folder for the adapted YAML and the emptyDir folders.
        podman: The podman binary.
        spec: repository.yaml for a dev-build pod.
        drop_env: Environment variables to leave out (an image older than the render).
        hosts: Service host name -> the played pod's name standing in for it (``adapt``).
    """

    deployment: dict[str, Any]
    workdir: Path
    podman: str = "podman"
    spec: Path | None = None
    drop_env: tuple[str, ...] = ()
    hosts: dict[str, str] = field(default_factory=dict)
    name: str = field(default_factory=lambda: f"tf-k8s-test-{uuid.uuid4().hex[:8]}")
    key: str = field(default_factory=lambda: uuid.uuid4().hex)
    ports: dict[str, int] = field(default_factory=dict)  # container port name -> host port
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))

    @property
    def host(self) -> str:
        """The played pod's name: what other pods on Podman's kube network resolve."""
        return f"{self.name}-pod-0"

    @property
    def container(self) -> str:
        """The serving container's name."""
        return f"{self.host}-triton"

    @property
    def front(self) -> str:
        """The front container's name."""
        return f"{self.host}-front"

    @property
    def secret(self) -> str:
        """The admin-key Secret's name in Podman."""
        return f"{self.name}-admin"

    @property
    def http(self) -> str:
        """The pod's HTTP endpoint (the front's) on the host."""
        return f"http://127.0.0.1:{self.ports['http']}"

    def run(self, *args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess:
        """One podman command (with the machine's containers.conf)."""
        return subprocess.run([self.podman, *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=check)

    def play(self, timeout: float = 900) -> float:
        """``podman kube play`` (which returns once the init containers finished and the
        containers started); returns its seconds. Raises ``RuntimeError`` with podman's output."""
        from tools.net import free_ports

        self.workdir.mkdir(parents=True, exist_ok=True)
        if "CONTAINERS_CONF" not in self.env:
            (self.workdir / "containers.conf").write_text(CONTAINERS_CONF)
            self.env["CONTAINERS_CONF"] = str(self.workdir / "containers.conf")
        names = [port["name"] for container in
                 self.deployment["spec"]["template"]["spec"]["containers"]
                 for port in container.get("ports", [])]
        self.ports = dict(zip(names, free_ports(len(names))))
        adapted = adapt(self.deployment, name=self.name, secret=self.secret, key=self.key,
                        ports=self.ports, volumes=self.workdir / "volumes", spec=self.spec,
                        drop_env=self.drop_env, hosts=self.hosts)
        (self.workdir / "play.yaml").write_text(yaml.safe_dump(adapted))
        # Podman reads a secretKeyRef's secret as JSON: key -> base64 value.
        (self.workdir / "secret.json").write_text(json.dumps(
            {manifests.ADMIN_SECRET_KEY: base64.b64encode(self.key.encode()).decode()}))
        self.run("secret", "create", self.secret, str(self.workdir / "secret.json"), check=True)
        started = time.monotonic()
        result = self.run("kube", "play", str(self.workdir / "play.yaml"), timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"podman kube play failed: {result.stdout}{result.stderr}")
        return time.monotonic() - started

    def probe(self, kind: str) -> int:
        """Run the rendered ``startupProbe``/``readinessProbe``/``livenessProbe`` command in the
        container; its exit code."""
        return self.probe_verdict(kind)[0]

    def probe_verdict(self, kind: str) -> tuple[int, str]:
        """The probe's exit code and the verdict it printed (``ok``, ``busy``, ``fail``)."""
        command = self.deployment["spec"]["template"]["spec"]["containers"][0][kind]["exec"]["command"]
        try:
            result = self.run("exec", self.container, *command, timeout=60)
        except subprocess.TimeoutExpired:
            return 124, "timeout"
        words = result.stdout.split()
        return result.returncode, words[-1] if words else ""

    def front_ready(self) -> bool:
        """The front container's rendered readiness probe (an httpGet through it), sent from
        the host to its published port as the kubelet sends it to the pod's."""
        import urllib.error
        import urllib.request

        containers = self.deployment["spec"]["template"]["spec"]["containers"]
        probe = next(c for c in containers if c["name"] == "front")["readinessProbe"]["httpGet"]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[probe['port']]}"
                                        f"{probe['path']}", timeout=5) as answer:
                return 200 <= answer.status < 400
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout: float = 900, period: float = 1.0) -> float:
        """Seconds until the rendered readiness command and then the front's readiness probe
        first pass (the pod is ready when every container is)."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.probe("readinessProbe") == 0 and self.front_ready():
                return time.monotonic() - started
            if self.restarts():
                raise RuntimeError(f"{self.container} restarted before it was ready:\n"
                                   f"{self.logs(tail=30)}")
            time.sleep(period)
        raise TimeoutError(f"{self.container} not ready after {timeout:g} s")

    def logs(self, container: str | None = None, tail: int = 0) -> str:
        """A container's log (stdout and stderr)."""
        args = ["logs"] + (["--tail", str(tail)] if tail else []) + [container or self.container]
        result = self.run(*args)
        return result.stdout + result.stderr

    def restarts(self) -> int:
        """The serving container's restart count."""
        data = json.loads(self.run("inspect", self.container, check=True).stdout)[0]
        return int(data.get("RestartCount", 0))

    def down(self) -> None:
        """Remove the pod, its volumes, the secret and the /dev/shm folders."""
        if (self.workdir / "play.yaml").exists():
            self.run("kube", "down", str(self.workdir / "play.yaml"), timeout=180)
        self.run("secret", "rm", self.secret)
        for path in Path("/dev/shm").glob(f"{self.name}-*"):
            shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(self.workdir / "volumes", ignore_errors=True)
