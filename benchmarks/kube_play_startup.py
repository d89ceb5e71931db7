"""Pod create -> ready under `podman kube play`: the artifact render against the in-pod build.

    .venv/bin/python benchmarks/kube_play_startup.py [--rounds N]

Needs Podman and the CPU images (scripts/compose-images.sh) and a built cpu repository in
build/model_repositories/cpu (packaged here with `tools deploy package`, reused when its tag
exists). Each round plays the artifact render, then the --dev-build render (A, B, A, B on shared
cores), each from `podman kube play` until the rendered readiness command first passes, and
takes the pod down. Prints one line per run and the medians side by side.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the pod tests' podman kube play harness
from podman_helpers import CONTAINERS_CONF, Pod  # noqa: E402
from tools.deploy.artifact import package  # noqa: E402
from tools.deploy.render import render_k8s  # noqa: E402


def _images() -> tuple[str, str, str]:
    tags = dict(line.split("=", 1) for line in (ROOT / "build" / "images" / "tags.env").read_text().split())
    return tuple(f"localhost/{tags[k]}" for k in ("TRITON_CPU_IMAGE", "BUILDER_CPU_IMAGE",
                                                    "FRONT_CPU_IMAGE"))  # type: ignore[return-value]


def _one(kind: str, image: str, builder: str, front: str, record: Path,
         work: Path) -> tuple[float, float]:
    out = work / f"{kind}-{time.monotonic_ns()}"
    options = {"artifact": record} if kind == "artifact" else {"dev_build": True, "builder_image": builder}
    render_k8s(ROOT / "repository.yaml", "cpu", out / "k8s", image=image, front_image=front,
               **options)
    deployment = yaml.safe_load((out / "k8s" / "manifests" / "deployment.yaml").read_text())
    pod = Pod(deployment, out / "pod", spec=ROOT / "repository.yaml",
              drop_env=("FORGE_METRICS_PORT",))
    try:
        started = time.monotonic()
        played = pod.play(timeout=1200)
        pod.wait_ready(timeout=1200, period=0.5)
        return played, time.monotonic() - started
    except BaseException:
        print(pod.logs(tail=40), file=sys.stderr)
        raise
    finally:
        pod.down()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    if "CONTAINERS_CONF" not in os.environ:
        conf = ROOT / "build" / "compose-smoke" / "containers.conf"
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(CONTAINERS_CONF)
        os.environ["CONTAINERS_CONF"] = str(conf)
    image, builder, front = _images()
    with tempfile.TemporaryDirectory(prefix="tf-startup-") as tmp:
        work = Path(tmp)
        started = time.monotonic()
        built = package(ROOT / "build" / "model_repositories" / "cpu", "localhost/triton-forge/models",
                        image, engine="podman")
        print(f"artifact {built.reference}: {built.bytes / 1e6:.0f} MB, "
              f"{'reused' if built.reused else 'built'} in {time.monotonic() - started:.1f} s")
        record = work / "cpu.artifact.json"
        record.write_text(built.to_text())
        results: dict[str, list[float]] = {"artifact": [], "dev-build": []}
        for round_ in range(1, args.rounds + 1):
            for kind in results:
                played, ready = _one(kind, image, builder, front, record, work)
                results[kind].append(ready)
                print(f"round {round_} {kind:9}: kube play returned after {played:6.1f} s "
                      f"(init containers), ready after {ready:6.1f} s", flush=True)
    a, b = statistics.median(results["artifact"]), statistics.median(results["dev-build"])
    print(f"{datetime.date.today()}, {os.cpu_count()} cores, podman kube play, pod create -> ready "
          f"(median of {args.rounds}): artifact {a:.1f} s, in-pod build {b:.1f} s, "
          f"ratio {b / a:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
