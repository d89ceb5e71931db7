"""The GPU wheels install: the builder image's TensorRT lines and scripts/gpu-check.sh's lock,
checked offline against PyPI's metadata as recorded by scripts/record_gpu_pins.py.

The Dockerfile's lines are run (with ``python3`` and ``pip`` standing in for the image's), not
read; the "pip" answers from the recorded metadata through tests/gpu_pins_helpers.py, whose
resolution must also agree with pip's own recorded one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_pins_helpers import Index, Target, Unresolvable, ngc_images, read_lock, recorded
from tools import gpu_check

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "docker" / "triton.Dockerfile"
LOCK = ROOT / "scripts" / "gpu-requirements.txt"
IMAGES = ngc_images()
MACHINES = ("x86_64", "aarch64")


@pytest.fixture(scope="module")
def index() -> Index:
    return Index()


def _builder_stage() -> str:
    return DOCKERFILE.read_text().split("FROM serve AS builder", 1)[1]


def _tensorrt_run_line() -> str:
    """The builder stage's RUN instruction that installs TensorRT's Python module, as sh runs it."""
    runs = re.findall(r"^RUN (.*?)(?<!\\)$", _builder_stage(), flags=re.MULTILINE | re.DOTALL)
    (line,) = [r for r in runs if "trt_guard --builder-requirements" in r]
    return line.replace("\\\n", " ")


_FAKE_PYTHON = '''#!{python}
"""python3 of the image: `-m pip install` installs what the recorded metadata resolves to
(the TensorRT module as a stub with its version); anything else runs the real interpreter."""
import json, os, sys
sys.path.insert(0, {tests!r})
if sys.argv[1:4] == ["-m", "pip", "install"]:
    from gpu_pins_helpers import Index, Target
    args = sys.argv[4:]
    files = [args[i + 1] for i, a in enumerate(args) if a == "-r"]
    named = [a for i, a in enumerate(args) if not a.startswith("-") and args[i - 1] not in ("-r", "-c")]
    requirements = [l.strip() for f in files for l in open(f) if l.strip()] + named
    chosen = Index().resolve(requirements, Target({python_version!r}, {machine!r}))
    with open({log!r}, "a") as log:
        log.write(json.dumps({{"args": args, "requirements": requirements, "chosen": chosen}}) + "\\n")
    for name, version in chosen.items():
        if name.startswith("tensorrt-cu") and name.endswith("-bindings"):
            os.makedirs({site!r} + "/tensorrt_bindings", exist_ok=True)
            with open({site!r} + "/tensorrt_bindings/__init__.py", "w") as f:
                f.write(f"__version__ = {{version!r}}\\n")
    sys.exit(0)
os.execv({python!r}, [{python!r}, *sys.argv[1:]])
'''


def _run_tensorrt_line(tmp_path: Path, image: dict, machine: str, line: str | None = None):
    """Run the Dockerfile's TensorRT RUN line as in ``image`` (its libnvinfer and CUDA_VERSION)."""
    bin_dir, lib_dir, site = tmp_path / "bin", tmp_path / "lib", tmp_path / "site"
    for d in (bin_dir, lib_dir, site):
        d.mkdir()
    (lib_dir / f"libnvinfer.so.{image['tensorrt']}").write_bytes(b"")
    log = tmp_path / "pip.log"
    python = bin_dir / "python3"
    python.write_text(_FAKE_PYTHON.format(python=sys.executable, tests=str(ROOT / "tests"), log=str(log),
                                          site=str(site), python_version=image["python"], machine=machine))
    python.chmod(0o755)
    (tmp_path / "constraints-cpu.txt").write_text((ROOT / "scripts" / "constraints-cpu.txt").read_text())
    command = (line or _tensorrt_run_line()).replace("/tmp/", f"{tmp_path}/")
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "LD_LIBRARY_PATH": str(lib_dir),
           "CUDA_VERSION": image["cuda"], "PYTHONPATH": f"{ROOT}{os.pathsep}{site}"}
    proc = subprocess.run(["/bin/sh", "-c", command], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    installs = [json.loads(row) for row in log.read_text().splitlines()] if log.exists() else []
    return proc, installs


@pytest.mark.parametrize("machine", MACHINES)
@pytest.mark.parametrize("tag", sorted(IMAGES))
def test_the_builders_tensorrt_line_installs_the_images_own_tensorrt_version(tmp_path, tag, machine):
    image = IMAGES[tag]

    proc, installs = _run_tensorrt_line(tmp_path, image, machine)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    (install,) = installs
    major = image["cuda"].split(".")[0]
    bindings = install["chosen"][f"tensorrt-cu{major}-bindings"]
    assert bindings.startswith(image["tensorrt"] + "."), "the TensorRT of the image's libnvinfer"
    assert "-c" in install["args"], "under the CPU constraints (numpy<2 stays)"
    assert not [n for n in install["chosen"] if n.startswith("tensorrt-cu") and n.endswith("-libs")], \
        "no second TensorRT: the bindings load the image's libnvinfer"
    assert install["chosen"]["cuda-python"].split(".")[0] == major
    assert f"matches {tmp_path}/lib/libnvinfer.so.{image['tensorrt']}" in proc.stdout


@pytest.mark.parametrize("machine", MACHINES)
@pytest.mark.parametrize("tag", sorted(IMAGES))
def test_the_offline_resolution_of_the_builder_line_agrees_with_pips_recorded_one(index, tag, machine):
    image = IMAGES[tag]
    resolution = recorded()["builder"][f"{tag} {machine}"]
    assert resolution["install"] and "error" not in resolution["install"][0], resolution["install"]
    pip_view = {i["name"].lower().replace("_", "-"): i["version"] for i in resolution["install"]}

    ours = index.resolve(resolution["requirements"], Target(image["python"], machine))

    assert ours == pip_view


def test_the_old_full_wheel_line_is_refused_by_the_recorded_metadata(index):
    """The line before this fix (`tensorrt-cu13==10.13.2.*`, the full wheels) does not install:
    its libs depend on nvidia-cuda-runtime-cu13, a stub that refuses to build."""
    image = IMAGES["25.08"]

    with pytest.raises(Unresolvable, match=r"nvidia-cuda-runtime-cu13 0\.0\.1 does not install.*DEPRECATED"):
        index.resolve([f"tensorrt-cu13=={image['tensorrt']}.*"], Target(image["python"]))
    fixed = [v for v in index.projects["tensorrt-cu13"] if v.startswith(image["tensorrt"] + ".")]
    assert fixed and not [v for v in fixed if ".post" in v], \
        "no .post1 rebuild of the image's TensorRT exists: only the bindings match it exactly"


def test_the_old_line_run_as_the_dockerfile_had_it_fails(tmp_path):
    old = ('TRT="$(python3 -c \'from tools.serve.trt_guard import detect_runtime; '
           'print(detect_runtime().tensorrt_version or "")\')" && test -n "$TRT" '
           '&& python3 -m pip install "tensorrt-cu${CUDA_VERSION%%.*}==${TRT}.*" "cuda-python==${CUDA_VERSION%%.*}.*"')

    proc, installs = _run_tensorrt_line(tmp_path, IMAGES["25.08"], "x86_64", old)

    assert proc.returncode != 0 and "nvidia-cuda-runtime-cu13 0.0.1 does not install" in proc.stderr
    assert installs == []


def test_the_builder_runs_its_command_through_ngcs_entrypoint_where_it_exists(tmp_path):
    (entrypoint,) = re.findall(r"^ENTRYPOINT (.+)$", _builder_stage(), flags=re.MULTILINE)
    argv = json.loads(entrypoint)
    marker = tmp_path / "ran"
    nv = tmp_path / "nvidia_entrypoint.sh"
    nv.write_text(f'#!/bin/sh\necho "$@" >> "{marker}"\nexec "$@"\n')
    nv.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "NVIDIA_ENTRYPOINT": str(nv)}

    through = subprocess.run([*argv, "sh", "-c", "echo built"], env=env, capture_output=True, text=True, timeout=30)
    direct = subprocess.run([*argv, "sh", "-c", "echo built"], env=env | {"NVIDIA_ENTRYPOINT": str(tmp_path / "no")},
                            capture_output=True, text=True, timeout=30)

    assert argv[:2] != [] and through.stdout == "built\n" and marker.read_text() == "sh -c echo built\n"
    assert direct.returncode == 0 and direct.stdout == "built\n"
    assert argv[2].count("/opt/nvidia/nvidia_entrypoint.sh") == 1, "NGC's path by default"


# --- scripts/gpu-check.sh's lock ------------------------------------------------------------------


@pytest.fixture(scope="module")
def lock():
    return read_lock(LOCK)


@pytest.mark.parametrize("python", ["3.11", "3.12"])
def test_the_gpu_check_lock_resolves_together_on_its_own_pins(index, lock, python):
    versions, extras = lock
    requirements = [f"{n}[{','.join(sorted(extras[n]))}]=={v}" if extras[n] else f"{n}=={v}"
                    for n, v in versions.items()]

    chosen = index.resolve(requirements, Target(python), pinned=versions, skip={"torch"})

    assert chosen == versions, "every pin is needed and no requirement escapes the lock"


def test_the_gpu_check_lock_is_pips_own_resolution(lock):
    versions, _ = lock
    pip_view = {i["name"].lower().replace("_", "-").replace(".", "-"): i["version"]
                for i in recorded()["gpu_check"]["install"] if i["name"].lower() != "torch"}
    sdist_only = {"tensorrt-cu13", "tensorrt-cu13-libs"}  # their wheels come from pypi.nvidia.com
    assert {n.replace(".", "-"): v for n, v in versions.items() if n not in sdist_only} == pip_view


def test_onnxruntime_gpu_is_pinned_to_a_gpu_release_with_its_cuda_and_cudnn_extras(index, lock):
    versions, extras = lock
    assert "onnxruntime" not in versions and "torch" not in versions
    version = versions["onnxruntime-gpu"]
    assert extras["onnxruntime-gpu"] == {"cuda", "cudnn"}
    for python in ("3.11", "3.12"):
        assert index.best(f"onnxruntime-gpu=={version}", Target(python))[2].endswith(".whl")
    markers = " ".join(index.metadata[("onnxruntime-gpu", version)])
    assert 'extra == "cuda"' in markers and 'extra == "cudnn"' in markers


def test_the_cpu_wheels_version_does_not_exist_for_the_gpu_wheel(index):
    """What the script did before: pin onnxruntime-gpu to the CPU wheel's version."""
    from packaging.version import Version

    cpu_latest = max((Version(v) for v in index.projects["onnxruntime"] if not Version(v).is_prerelease))
    with pytest.raises(Unresolvable, match="no recorded release of onnxruntime-gpu matches"):
        index.best(f"onnxruntime-gpu=={cpu_latest}", Target("3.11"))


def test_the_lock_agrees_on_one_cuda_major_and_the_preflight_floor_follows_it(lock):
    versions, _ = lock
    major = gpu_check.pinned_cuda_major(LOCK)
    assert versions[f"tensorrt-cu{major}"] and versions["cuda-python"].split(".")[0] == str(major)
    assert versions["nvidia-cuda-runtime"].split(".")[0] == str(major)
    assert gpu_check.DRIVER_FLOOR[major] == 580


def test_the_lock_keeps_tensorrt_10_whose_builder_still_has_the_precision_flags(lock):
    versions, _ = lock
    assert all(v.startswith("10.") for n, v in versions.items() if n.startswith("tensorrt"))


def test_the_recording_says_where_and_when_it_was_made():
    data = recorded()
    assert re.match(r"\d{4}-\d{2}-\d{2}T", data["recorded_at"]) and "pip" in data["recorded_with"]
    assert LOCK.read_text().count(data["recorded_at"][:10]) == 1
