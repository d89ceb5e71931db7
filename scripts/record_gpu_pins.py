#!/usr/bin/env python3
"""Record PyPI's view of the GPU wheels, for offline tests of the pins (tests/test_gpu_pins.py).

Writes ``tests/data/gpu_pins/pypi.json`` and the lock ``scripts/gpu-requirements.txt``:

* the releases and files of the TensorRT, CUDA-runtime, cuda-python and ONNX Runtime projects
  (PyPI's JSON API), with ``Requires-Dist`` of the sdist-only TensorRT releases read from their
  PKG-INFO (NVIDIA's wheel-stub copies it from the real wheel's METADATA);
* pip's own resolution (``pip install --dry-run --report``, wheel metadata over HTTP ranges) of
  the builder image's TensorRT requirements for each supported NGC image and architecture, and
  of scripts/gpu-check.sh's environment (the GPU wheels with the project's dependencies);
* what building the ``nvidia-cuda-runtime-cu13`` stub does.

Needs PyPI (not NVIDIA's index): ``python scripts/record_gpu_pins.py`` from the checkout, with
the project's ``.venv`` (pip >= 25 for ``--use-feature=fast-deps``). Review the diff it makes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import platform
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from packaging.version import Version  # noqa: E402

from tools.gpu_check import project_requirements  # noqa: E402
from tools.serve.trt_guard import builder_requirements  # noqa: E402

PYPI = "https://pypi.org"
DATA = ROOT / "tests" / "data" / "gpu_pins" / "pypi.json"
NGC_IMAGES = json.loads((ROOT / "tests" / "data" / "gpu_pins" / "ngc_images.json").read_text())["images"]
LOCK = ROOT / "scripts" / "gpu-requirements.txt"
CONSTRAINTS = ROOT / "scripts" / "constraints-cpu.txt"
# The GPU wheels of scripts/gpu-check.sh: the last TensorRT 10 for CUDA 13 (11 dropped the
# weakly typed builder), the ONNX Runtime GPU wheel with its CUDA and cuDNN wheels, cuda-python.
GPU_CHECK_TOP = ("tensorrt-cu13==10.16.1.11", "onnxruntime-gpu[cuda,cudnn]==1.31.1", "cuda-python==13.4.4")
# tensorrt-cu13 and its -libs are sdists whose wheel comes from pypi.nvidia.com at build time:
# pip cannot read their metadata without that index, so they are resolved from PKG-INFO here.
SDIST_ONLY = ("tensorrt-cu13", "tensorrt-cu13-libs")
# project -> the oldest release kept in the data (older ones matter to no pin)
PROJECTS = {"tensorrt": "10", "tensorrt-cu13": "10", "tensorrt-cu13-libs": "10",
            "tensorrt-cu13-bindings": "10", "tensorrt-cu12-bindings": "10",
            "nvidia-cuda-runtime-cu13": "0", "onnxruntime": "1.20", "onnxruntime-gpu": "1.20",
            "cuda-python": "12", "cuda-bindings": "12"}
STUB = "nvidia-cuda-runtime-cu13==0.0.1"
# Ubuntu 24.04's glibc 2.39 accepts every manylinux tag up to 2_39 (pip takes them as given)
PLATFORMS = {arch: [f"manylinux_2_{minor}_{arch}" for minor in range(39, 16, -1)]
             + [f"manylinux2014_{arch}"] for arch in ("x86_64", "aarch64")}
IMAGE_PYTHON = "3.12"  # the NGC images are Ubuntu 24.04 with Python 3.12


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as response:  # noqa: S310 - PyPI only
        return response.read()


def _pip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=1800, check=check)


def releases(name: str, oldest: str) -> dict:
    """The releases of ``name`` from ``oldest`` on, with their Linux wheels and sdists (PyPI's JSON API)."""
    from packaging.version import InvalidVersion, Version

    base = f"{PYPI}/pypi/{name}/json"
    data = json.loads(_get(base))
    out = {}
    for version, files in data["releases"].items():
        try:
            if Version(version) < Version(oldest):
                continue
        except InvalidVersion:
            continue
        kept = [{"filename": f["filename"], "yanked": bool(f.get("yanked")), "uploaded": f["upload_time"][:10],
                 "url": urllib.parse.urljoin(base, f["url"])}
                for f in files if not f["filename"].endswith(".whl") or "linux" in f["filename"]
                or f["filename"].endswith("-any.whl")]
        if kept:
            out[version] = {"files": kept}
    if data["info"].get("requires_dist") is not None:
        out.setdefault(data["info"]["version"], {"files": []})["requires_dist"] = data["info"]["requires_dist"]
    return out


def sdist_requires(release: dict) -> list[str] | None:
    """``Requires-Dist`` of a release's sdist PKG-INFO (the sdists are a few kB)."""
    sdist = next((f for f in release["files"] if not f["filename"].endswith(".whl")), None)
    if sdist is None:
        return None
    archive = tarfile.open(fileobj=io.BytesIO(_get(sdist["url"])))
    top = next(m for m in archive.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO"))
    text = archive.extractfile(top).read().decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


class _HttpRange(io.RawIOBase):
    """A remote file read through HTTP range requests (a wheel's METADATA without the wheel)."""

    def __init__(self, url: str) -> None:
        self.url, self.position = url, 0
        request = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 - PyPI only
            self.size = int(response.headers["Content-Length"])

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = base + offset
        return self.position

    def readinto(self, buffer) -> int:
        end = min(self.position + len(buffer), self.size) - 1
        if end < self.position:
            return 0
        request = urllib.request.Request(self.url, headers={"Range": f"bytes={self.position}-{end}"})
        with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 - PyPI only
            data = response.read()
        buffer[:len(data)] = data
        self.position += len(data)
        return len(data)


def wheel_requires(release: dict) -> list[str] | None:
    """``Requires-Dist`` of a release's first Linux wheel, read from its METADATA by HTTP ranges."""
    import zipfile

    wheel = next((f for f in release["files"] if f["filename"].endswith(".whl")
                  and "linux" in f["filename"]), None)
    if wheel is None:
        return None
    with zipfile.ZipFile(io.BufferedReader(_HttpRange(wheel["url"]), buffer_size=1 << 16)) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(name).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def resolve(requirements: list[str], *extra: str) -> list[dict]:
    """pip's resolution of ``requirements``: every distribution it would install, with metadata."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        done = _pip("install", "--dry-run", "--ignore-installed", "--use-feature=fast-deps",
                    "--index-url", f"{PYPI}/simple", "--report", str(report), *extra, *requirements,
                    check=False)
        if done.returncode != 0:
            return [{"error": [line for line in done.stderr.splitlines() if line.startswith("ERROR")]}]
        data = json.loads(report.read_text())
    return sorted(({"name": item["metadata"]["name"], "version": item["metadata"]["version"],
                    "requires_dist": item["metadata"].get("requires_dist", []),
                    "requires_python": item["metadata"].get("requires_python"),
                    "requested": item.get("requested", False),
                    "extras": item.get("requested_extras", []),
                    "file": item["download_info"]["url"].rsplit("/", 1)[-1]}
                   for item in data["install"]), key=lambda d: d["name"].lower())


def stub_build() -> dict:
    """What building the deprecated ``nvidia-cuda-runtime-cu13`` stub into a wheel does."""
    with tempfile.TemporaryDirectory() as tmp:
        result = _pip("wheel", "--no-deps", "--index-url", f"{PYPI}/simple", "-w", tmp, STUB, check=False)
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    return {"requirement": STUB, "command": f"pip wheel --no-deps {STUB}", "exit_code": result.returncode,
            "output_tail": lines[-12:]}


def _gpu_check_requirements() -> list[str]:
    base = [r for r in project_requirements(ROOT / "pyproject.toml")]
    return [*GPU_CHECK_TOP, *base]


def main(argv: list[str] | None = None) -> int:
    """Record everything and write the data file and the lock."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--lock", type=Path, default=LOCK)
    parser.add_argument("--torch-wheels", default=None, help="a folder holding the CPU torch wheel")
    args = parser.parse_args(argv)

    projects = {name: releases(name, oldest) for name, oldest in PROJECTS.items()}
    for name in SDIST_ONLY + ("tensorrt",):
        for release in projects[name].values():
            release["requires_dist"] = sdist_requires(release)
            release["requires_source"] = "sdist PKG-INFO"
    for name in ("tensorrt-cu13-bindings", "tensorrt-cu12-bindings"):
        for version, release in projects[name].items():
            if Version(version) >= Version("10.11"):
                release["requires_dist"] = wheel_requires(release)
                release["requires_source"] = "wheel METADATA (HTTP range)"
    for release in (r for p in projects.values() for r in p.values()):
        for file in release["files"]:
            del file["url"]  # recorded to read the sdists; the file names are what tests need

    builder = {}
    for tag, image in NGC_IMAGES.items():
        requirements = builder_requirements(image["tensorrt"], image["cuda"])
        for arch, plat in PLATFORMS.items():
            builder[f"{tag} {arch}"] = {
                "requirements": requirements, "python": IMAGE_PYTHON, "platforms": plat,
                "install": resolve(requirements, "-c", str(CONSTRAINTS), "--only-binary=:all:",
                                   "--python-version", IMAGE_PYTHON,
                                   *[a for p in plat for a in ("--platform", p)],
                                   "--target", tempfile.gettempdir()),
            }

    sdist_pins = [r for r in GPU_CHECK_TOP if r.split("==")[0] in SDIST_ONLY]
    libs_pins = [f"tensorrt-cu13-libs=={r.split('==')[1]}" for r in sdist_pins if r.startswith("tensorrt-cu13==")]
    bindings = [f"tensorrt-cu13-bindings=={r.split('==')[1]}" for r in sdist_pins if r.startswith("tensorrt-cu13==")]
    resolvable = [r for r in _gpu_check_requirements() if r not in sdist_pins] + bindings
    # torch is not in the lock (scripts/gpu-check.sh installs it from TORCH_INDEX_URL or the CPU
    # index), but what needs it must see the CPU build: the local folder of this machine's pip
    # holds it (--find-links TORCH_WHEELS; PyTorch's own index is not reachable here).
    gpu_check = resolve(resolvable, "-c", str(CONSTRAINTS), *(["--find-links", args.torch_wheels] if args.torch_wheels else []))

    recorded = {
        "recorded_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "recorded_with": (f"scripts/record_gpu_pins.py; pip {_pip('--version').stdout.split()[1]} "
                          f"(--use-feature=fast-deps); Python {platform.python_version()} "
                          f"{platform.system().lower()} {platform.machine()}"),
        "sources": [f"{PYPI}/pypi/<project>/json", "the sdists' PKG-INFO (TensorRT releases)",
                    "pip install --dry-run --report (wheel METADATA over HTTP ranges)",
                    f"pip wheel --no-deps {STUB}"],
        "not_reachable": "https://pypi.nvidia.com (where tensorrt-cu13-libs' wheel-stub fetches the libraries)",
        "projects": projects,
        "builder": builder,
        "gpu_check": {"top": list(GPU_CHECK_TOP), "sdist_pins": sdist_pins + libs_pins,
                      "python": platform.python_version(), "install": gpu_check},
        "stub_build": stub_build(),
    }
    args.data.parent.mkdir(parents=True, exist_ok=True)
    args.data.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")

    from packaging.utils import canonicalize_name

    # torch is installed before the lock, from TORCH_INDEX_URL or PyTorch's CPU index
    pins = sorted({f"{canonicalize_name(d['name'])}=={d['version']}" for d in gpu_check
                   if canonicalize_name(d["name"]) != "torch"} | set(libs_pins) | set(sdist_pins))
    extras = {"onnxruntime-gpu": "[cuda,cudnn]"}
    lines = []
    for pin in pins:
        name, version = pin.split("==")
        lines.append(f"{name}{extras.get(name, '')}=={version}")
    args.lock.write_text(
        "# scripts/gpu-check.sh's environment, every version pinned (torch comes from TORCH_INDEX_URL\n"
        "# or PyTorch's CPU index first). Written by scripts/record_gpu_pins.py from pip's resolution\n"
        f"# on {recorded['recorded_at'][:10]} ({recorded['recorded_with']});\n"
        "# tests/test_gpu_pins.py checks it against tests/data/gpu_pins/pypi.json. tensorrt-cu13-libs\n"
        "# is an sdist that fetches the libraries from https://pypi.nvidia.com while it installs.\n"
        + "\n".join(lines) + "\n"
    )
    print(f"wrote {args.data.relative_to(ROOT)} and {args.lock.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
