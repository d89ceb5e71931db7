"""Refuse to serve a TensorRT plan built for another TensorRT version or another GPU.

Runs before tritonserver starts (docker/triton-entrypoint.sh): compares each plan's build record
in the manifest with the TensorRT library and the GPUs of the running environment. Standard
library only (it reads the manifest through ``tools.manifest``, also standard library
only), because it runs inside the NGC image where this project is not installed.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.tensorrt_module import import_tensorrt_module
from tools.manifest import MANIFEST_NAME, Manifest, ManifestError, Stage, StageStatus
from tools.errors import TensorRTError

# Plans come only from the gpu target, which docker-compose.gpu.yml builds into the folder its
# triton serves (tests/test_trt_guard.py checks these against the compose files).
_COMPOSE_GPU = "docker compose -f docker-compose.yml -f docker-compose.gpu.yml"
GPU_REPOSITORY = "/repositories/gpu"
_BUILD = (f"{_COMPOSE_GPU} run --rm builder tools build-repo --target gpu --spec repository.yaml "
          f"--repository {GPU_REPOSITORY} --force")
# --force: the spec did not change, so without it every model would be skipped as unchanged.
REBUILD_ALL = _BUILD
# A plan skipped for want of a GPU: the builder of the gpu override (GPU reserved) builds it; the
# skipped build's key had no device, so no --force is needed.
BUILD_WITH_GPU = f"{_COMPOSE_GPU} run --rm builder"
_REBUILD_ONE = f"{_BUILD} --only {{model}}"

# Where the NGC images and the TensorRT tarball put libnvinfer; LD_LIBRARY_PATH is searched first.
_LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/local/tensorrt/lib",
    "/opt/tensorrt/lib",
    "/usr/lib64",
    "/usr/lib",
    "/opt/tritonserver/backends/tensorrt",
)
_VERSION_ENV_VARS = ("TENSORRT_VERSION", "TRT_VERSION")
_LIBRARY_RE = re.compile(r"^libnvinfer\.so\.(\d+\.\d+\.\d+)$")
_TRT_CONFIG_RE = re.compile(
    r'^\s*(platform\s*:\s*"tensorrt_plan"|backend\s*:\s*"tensorrt")\s*$', re.MULTILINE
)


@dataclass(frozen=True)
class PlanRecord:
    """What the manifest says one TensorRT model was built with."""

    model: str
    version: str
    compute_capability: str
    precision: str | None = None


@dataclass(frozen=True)
class Runtime:
    """The TensorRT library and GPUs the server would load plans with.

    Attributes:
        tensorrt_version: e.g. ``"10.11.0"``; None when no TensorRT was found.
        tensorrt_source: where the version came from (library file, env var, module), or what
            was searched when none was found.
        compute_capabilities: one ``"major.minor"`` per visible GPU; empty when none is visible.
        gpu_source: where the GPU list came from, or why it is empty.
    """

    tensorrt_version: str | None
    tensorrt_source: str
    compute_capabilities: tuple[str, ...]
    gpu_source: str


# --- reading the repository -------------------------------------------------------------------


def tensorrt_models_in_configs(repository: Path) -> list[str]:
    """Names of the models whose config.pbtxt selects the TensorRT backend."""
    names = []
    for config in sorted(repository.glob("*/config.pbtxt")):
        if _TRT_CONFIG_RE.search(config.read_text(encoding="utf-8")):
            names.append(config.parent.name)
    return names


def _normalise_capability(value: object, where: str) -> str:
    text = str(value).strip().lower().removeprefix("sm_")
    match = re.fullmatch(r"(\d+)\.(\d+)", text) or re.fullmatch(r"(\d+)(\d)", text)
    if not match:
        raise TensorRTError(f"{where}: compute capability {value!r} is not like '8.6' or 'sm_86'")
    return f"{int(match.group(1))}.{int(match.group(2))}"


def _version_key(version: str, where: str) -> tuple[int, int, int]:
    parts = version.strip().split(".")
    if len(parts) < 3 or not all(p.isdigit() for p in parts[:3]):
        raise TensorRTError(f"{where}: TensorRT version {version!r} is not major.minor.patch")
    return int(parts[0]), int(parts[1]), int(parts[2])


def read_plan_records(repository: Path) -> list[PlanRecord]:
    """Read the TensorRT build record of every TensorRT model in the repository.

    Args:
        repository: the model repository (holds ``build_manifest.json`` and the model folders).

    Returns:
        One record per model that has a ``tensorrt`` entry in the manifest or a TensorRT config.

    Raises:
        TensorRTError: a TensorRT model has no build record, or the manifest is malformed.
    """
    manifest_path = repository / MANIFEST_NAME
    trt_configs = tensorrt_models_in_configs(repository)
    if not manifest_path.is_file():
        if trt_configs:
            raise TensorRTError(
                f"{repository}: models {', '.join(trt_configs)} use TensorRT but {MANIFEST_NAME} "
                f"is missing, so the TensorRT version they were built with is unknown. "
                f"Rebuild: `{REBUILD_ALL}`"
            )
        return []
    try:
        manifest = Manifest.read(repository)
    except ManifestError as exc:
        raise TensorRTError(f"{exc}; rebuild: `{REBUILD_ALL}`") from None

    records = []
    for name, entry in sorted(manifest.models.items()):
        trt = entry.tensorrt
        if trt is None:
            continue
        where = f"{manifest_path}: model '{name}' field 'tensorrt'"
        _version_key(trt.version, where)
        records.append(
            PlanRecord(
                model=name,
                version=trt.version,
                compute_capability=_normalise_capability(trt.compute_capability, where),
                precision=trt.precision,
            )
        )
    missing = sorted(set(trt_configs) - {r.model for r in records})
    skipped = {name: why for name in missing if (why := skipped_plan_reason(manifest, name))}
    if skipped:
        lines = [f"model '{name}': {why}" for name, why in skipped.items()]
        raise TensorRTError(
            f"{manifest_path}: {len(skipped)} TensorRT model(s) have no plan because the build "
            f"skipped it:\n  " + "\n  ".join(lines) + "\n  The same build here would skip them "
            f"again: build the gpu target where the builder sees a GPU: `{BUILD_WITH_GPU}`"
        )
    if missing:
        raise TensorRTError(
            f"{manifest_path}: models {', '.join(missing)} use TensorRT but have no 'tensorrt' "
            f"build record, so the TensorRT version they were built with is unknown. "
            f"Rebuild: `{REBUILD_ALL}`"
        )
    return records


def skipped_plan_reason(manifest: Manifest, model: str) -> str | None:
    """Why the build skipped ``model``'s plan, from its manifest entry; None if it did not."""
    entry = manifest.models.get(model)
    stage = entry.stages.get(Stage.ONNX2TRT) if entry is not None else None
    if stage is None or stage.status is not StageStatus.SKIPPED:
        return None
    built = f", built {entry.built_at}" if entry.built_at else ""
    return f"onnx2trt skipped: {stage.reason or 'no reason recorded'}{built}"


# --- Triton's own words for a plan it cannot load ---------------------------------------------

# Triton wraps TensorRT's deserialisation error in "unable to create TensorRT engine: ..."; the
# TensorRT text says which mismatch it was. Both spellings of TensorRT's messages are matched.
_ENGINE_FAILURE = re.compile(r"unable to create TensorRT engine", re.IGNORECASE)
_VERSION_MISMATCH = re.compile(
    r"expecting library version (?P<expected>[\d.]+) got (?P<got>[\d.]+)"
    r"|serialization assertion .*version tag does not match"
    r"|version tag does not match",
    re.IGNORECASE,
)


def explain_engine_failure(reason: str) -> str | None:
    """What to do about a model that failed to load with a TensorRT engine error, or None.

    Args:
        reason: Triton's load failure text for one model (from its log or repository index).
    """
    if not _ENGINE_FAILURE.search(reason) and not _VERSION_MISMATCH.search(reason):
        return None
    match = _VERSION_MISMATCH.search(reason)
    if match and match.group("expected"):
        what = (f"the plan was serialised by TensorRT {match.group('got')} and this server runs "
                f"{match.group('expected')}")
    elif match:
        what = "the plan was built with another TensorRT version (version tag does not match)"
    else:
        what = "TensorRT could not deserialise the plan (another TensorRT version or GPU)"
    return f"{what}: rebuild it inside the serving image: `{REBUILD_ALL}`"


# --- detecting the running environment (each probe is a seam tests can call directly) ----------


def tensorrt_version_from_library(directories: Iterable[str]) -> tuple[str | None, str]:
    """Find the TensorRT version from the real ``libnvinfer.so.X.Y.Z`` file name.

    Args:
        directories: folders to search, in order; the first one holding the library wins.

    Returns:
        ``(version, source)``; version is None when no library was found.
    """
    searched = []
    for directory in directories:
        if not directory:
            continue
        searched.append(directory)
        versions = sorted(
            {m.group(1) for path in glob.glob(os.path.join(directory, "libnvinfer.so.*"))
             if (m := _LIBRARY_RE.match(os.path.basename(path)))},
            key=lambda v: tuple(int(p) for p in v.split(".")),
        )
        if len(versions) > 1:
            raise TensorRTError(
                f"{directory} holds several TensorRT libraries ({', '.join(versions)}); "
                f"cannot tell which one tritonserver loads"
            )
        if versions:
            return versions[0], os.path.join(directory, f"libnvinfer.so.{versions[0]}")
    return None, f"no libnvinfer.so.X.Y.Z in {', '.join(searched) or '(no folders)'}"


def tensorrt_version_from_module() -> tuple[str | None, str]:
    """TensorRT version of the TensorRT Python module, if one is installed."""
    module, note = import_tensorrt_module()
    if module is None:
        return None, note
    return str(module.__version__), f"{note} Python module {module.__file__}"


def builder_requirements(tensorrt_version: str, cuda_version: str) -> list[str]:
    """The pip requirements that give the builder image this image's TensorRT in Python.

    Only the bindings wheel (``tensorrt-cuXX-bindings``, binary wheels on PyPI, no dependencies):
    it loads the image's own ``libnvinfer``, so a plan is built by the very library tritonserver
    loads it with. The full ``tensorrt-cuXX`` wheels would bring a second TensorRT, and those for
    CUDA 13 released before November 2025 depend on ``nvidia-cuda-runtime-cu13``, a stub that
    refuses to install. ``.*`` also matches a ``.postN`` rebuild of the same release.
    cuda-python of the same CUDA major gives the parity check its device memory.

    Args:
        tensorrt_version: ``major.minor.patch`` of the image's libnvinfer (``detect_runtime``).
        cuda_version: the image's ``$CUDA_VERSION`` (``13.0.0.044``).

    Raises:
        TensorRTError: a version that is not ``major.minor.patch``, or no CUDA major.
    """
    major, minor, patch = _version_key(tensorrt_version, "the image's TensorRT")
    cuda_major = cuda_version.strip().split(".")[0]
    if not cuda_major.isdigit():
        raise TensorRTError(f"CUDA_VERSION {cuda_version!r} does not start with a major version")
    return [f"tensorrt-cu{cuda_major}-bindings=={major}.{minor}.{patch}.*",
            f"cuda-python=={cuda_major}.*"]


def compute_capabilities_from_nvidia_smi(
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
) -> tuple[tuple[str, ...], str]:
    """Compute capability of every visible GPU, as reported by ``nvidia-smi``.

    Args:
        run: the subprocess runner (``subprocess.run``).

    Returns:
        ``(capabilities, source)``; capabilities is empty when no GPU is visible.
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return (), "nvidia-smi not found (no NVIDIA GPU visible)"
    try:
        result = run(
            [exe, "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return (), f"nvidia-smi failed: {exc}"
    if result.returncode != 0:
        return (), f"nvidia-smi exited {result.returncode}: {result.stderr.strip()[:200]}"
    caps = tuple(
        _normalise_capability(line, "nvidia-smi") for line in result.stdout.split() if line.strip()
    )
    return caps, "nvidia-smi --query-gpu=compute_cap"


def detect_runtime() -> Runtime:
    """Detect the TensorRT version and GPU compute capabilities of this environment."""
    dirs = [*os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep), *_LIBRARY_DIRS]
    version, source = tensorrt_version_from_library(dirs)
    notes = [source]
    if version is None:
        for var in _VERSION_ENV_VARS:
            if os.environ.get(var):
                version, source = os.environ[var], f"${var}"
                break
        else:
            notes.append(f"no ${' or $'.join(_VERSION_ENV_VARS)}")
    if version is None:
        version, source = tensorrt_version_from_module()
        notes.append(source)
        source = source if version else "; ".join(notes)
    caps, gpu_source = compute_capabilities_from_nvidia_smi()
    return Runtime(version, source, caps, gpu_source)


def check_module(runtime: Runtime) -> str:
    """Say which TensorRT Python module builds plans here, if it is the library's version.

    Raises:
        TensorRTError: no module imports, or its version differs from the library's.
    """
    module_version, source = tensorrt_version_from_module()
    if module_version is None:
        raise TensorRTError(source)
    if runtime.tensorrt_version is not None and _version_key(
            module_version, source) != _version_key(runtime.tensorrt_version, runtime.tensorrt_source):
        raise TensorRTError(
            f"the TensorRT Python module is {module_version} ({source}) but the library is "
            f"{runtime.tensorrt_version} ({runtime.tensorrt_source}): plans built here would not "
            f"load in this server"
        )
    return f"TensorRT Python module {module_version} ({source}) matches {runtime.tensorrt_source}"


# --- the check --------------------------------------------------------------------------------


def mismatches(records: Sequence[PlanRecord], runtime: Runtime) -> list[str]:
    """One message per TensorRT model that the running environment cannot load safely."""
    problems = []
    for record in records:
        rebuild = (f"rebuild it inside the serving image: `{REBUILD_ALL}` "
                   f"(this model only: `{_REBUILD_ONE.format(model=record.model)}`).")
        built = (f"model '{record.model}': plan built with TensorRT {record.version} "
                 f"for compute capability {record.compute_capability}")
        if runtime.tensorrt_version is None:
            problems.append(f"{built}, but no TensorRT was found here ({runtime.tensorrt_source}); "
                            f"serve a build without TensorRT plans, or {rebuild}")
            continue
        if not runtime.compute_capabilities:
            problems.append(f"{built}, but no GPU is visible ({runtime.gpu_source}); a plan needs "
                            f"the GPU it was built for: start triton with docker-compose.gpu.yml.")
            continue
        wrong_version = _version_key(record.version, f"model '{record.model}'") != _version_key(
            runtime.tensorrt_version, runtime.tensorrt_source
        )
        wrong_gpu = any(c != record.compute_capability for c in runtime.compute_capabilities)
        if wrong_version or wrong_gpu:
            runs = (f"this server runs TensorRT {runtime.tensorrt_version} "
                    f"({runtime.tensorrt_source}) on GPUs with compute capability "
                    f"{', '.join(runtime.compute_capabilities)} ({runtime.gpu_source})")
            what = {(True, False): "the TensorRT version differs",
                    (False, True): "the compute capability differs",
                    (True, True): "the TensorRT version and the compute capability differ"}
            problems.append(f"{built}, but {runs}: {what[wrong_version, wrong_gpu]}; {rebuild}")
    return problems


def guard(repository: Path, runtime: Runtime | None = None) -> list[PlanRecord]:
    """Raise unless every TensorRT plan in the repository matches the running environment.

    Args:
        repository: the model repository.
        runtime: the environment to check against; detected when None (tests pass their own).

    Returns:
        The TensorRT records that were checked (empty when the repository has no plans, in
        which case neither TensorRT nor a GPU is required).

    Raises:
        TensorRTError: naming every mismatching model, what it was built with, what runs, and
            the command that rebuilds it.
    """
    records = read_plan_records(Path(repository))
    if not records:
        return []
    runtime = runtime if runtime is not None else detect_runtime()
    problems = mismatches(records, runtime)
    if problems:
        raise TensorRTError(
            f"{len(problems)} TensorRT plan(s) in {repository} cannot be served here:\n  "
            + "\n  ".join(problems)
        )
    return records


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m tools.serve.trt_guard --repository PATH``; exit 1 on mismatch."""
    parser = argparse.ArgumentParser(prog="python -m tools.serve.trt_guard", description=__doc__)
    parser.add_argument("--repository", type=Path, help="model repository")
    parser.add_argument("--print-runtime", action="store_true",
                        help="print the detected TensorRT version and GPUs, then exit")
    parser.add_argument("--builder-requirements", action="store_true",
                        help="print the pip requirements of this image's TensorRT Python module "
                             "(docker/triton.Dockerfile), one per line, then exit")
    parser.add_argument("--check-module", action="store_true",
                        help="exit 1 unless the TensorRT Python module imports and is the "
                             "version of the TensorRT library found here")
    args = parser.parse_args(argv)
    if args.check_module:
        try:
            print(f"trt_guard: {check_module(detect_runtime())}")
        except TensorRTError as exc:
            print(f"trt_guard: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.print_runtime:
        print(json.dumps(detect_runtime().__dict__, indent=2))
        return 0
    if args.builder_requirements:
        runtime = detect_runtime()
        try:
            if runtime.tensorrt_version is None:
                raise TensorRTError(f"no TensorRT library found ({runtime.tensorrt_source})")
            print("\n".join(builder_requirements(runtime.tensorrt_version,
                                                 os.environ.get("CUDA_VERSION", ""))))
        except TensorRTError as exc:
            print(f"trt_guard: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.repository is None:
        parser.error("--repository is required")
    try:
        records = guard(args.repository)
    except TensorRTError as exc:
        print(f"trt_guard: {exc}", file=sys.stderr)
        return 1
    if records:
        print(f"trt_guard: {len(records)} TensorRT plan(s) match this server: "
              + ", ".join(f"{r.model} (TensorRT {r.version}, sm {r.compute_capability})"
                          for r in records))
    else:
        print(f"trt_guard: no TensorRT plans in {args.repository}; nothing to check")
    return 0


if __name__ == "__main__":
    sys.exit(main())
