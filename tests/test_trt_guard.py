"""The TensorRT guard refuses plans built for another TensorRT version or GPU.

Runtimes are injected through the guard's seam; the CLI tests run the real detection code against
a library folder and an ``nvidia-smi`` placed on PATH.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from server_helpers import copy_serving_stage
from tools.errors import TensorRTError
from tools.serve import trt_guard
from tools.serve.trt_guard import Runtime, guard

ROOT = Path(__file__).resolve().parents[1]

TRT_CONFIG = 'name: "{name}"\nplatform: "tensorrt_plan"\nmax_batch_size: 32\n'
ORT_CONFIG = 'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 32\n'


def _repository(tmp_path: Path, models: dict[str, dict | None]) -> Path:
    """A repository whose manifest has one entry per model; a dict value is its tensorrt record."""
    repo = tmp_path / "model_repository"
    entries = {}
    for name, trt in models.items():
        (repo / name / "1").mkdir(parents=True)
        template = TRT_CONFIG if trt is not None else ORT_CONFIG
        (repo / name / "config.pbtxt").write_text(template.format(name=name))
        entries[name] = {"kind": "pytorch", "target": "gpu"} | (
            {"tensorrt": trt} if trt is not None else {})
    manifest = {"format": 1, "models": entries}
    (repo / "build_manifest.json").write_text(json.dumps(manifest))
    return repo


def _runtime(version: str = "10.11.0", caps: tuple[str, ...] = ("8.6",)) -> Runtime:
    return Runtime(version, "libnvinfer.so.test", caps, "nvidia-smi (test)")


PLAN = {"version": "10.11.0", "compute_capability": "8.6", "precision": "fp16"}


def test_guard_passes_when_version_and_compute_capability_match(tmp_path):
    repo = _repository(tmp_path, {"minilm_encoder": PLAN, "text_tokenizer": None})

    records = guard(repo, runtime=_runtime("10.11.0.33", ("8.6", "8.6")))

    assert [r.model for r in records] == ["minilm_encoder"]
    assert records[0].precision == "fp16"


def test_guard_refuses_when_tensorrt_version_differs(tmp_path):
    repo = _repository(tmp_path, {"minilm_encoder": PLAN, "efficientnet_lite0": None})

    with pytest.raises(TensorRTError) as info:
        guard(repo, runtime=_runtime("10.13.2"))

    message = str(info.value)
    assert "model 'minilm_encoder'" in message
    assert "TensorRT 10.11.0" in message and "TensorRT 10.13.2" in message
    assert "the TensorRT version differs" in message and "compute capability differ" not in message
    assert f"`{trt_guard.REBUILD_ALL}`" in message
    assert "--force --only minilm_encoder`" in message
    # Without --force the unchanged spec would skip every model and the guard would refuse again.
    assert trt_guard.REBUILD_ALL.split(" run --rm builder ")[1].endswith("--force")
    assert "efficientnet_lite0" not in message


def test_guard_refuses_when_compute_capability_differs(tmp_path):
    repo = _repository(tmp_path, {"efficientnet_lite0": PLAN})

    with pytest.raises(TensorRTError) as info:
        guard(repo, runtime=_runtime("10.11.0", ("8.9",)))

    message = str(info.value)
    assert "model 'efficientnet_lite0'" in message
    assert "compute capability 8.6" in message and "compute capability 8.9" in message
    assert "the compute capability differs" in message and "TensorRT version differ" not in message


def test_guard_refuses_when_one_of_several_gpus_differs(tmp_path):
    repo = _repository(tmp_path, {"minilm_encoder": PLAN})

    with pytest.raises(TensorRTError, match="8.6, 7.5"):
        guard(repo, runtime=_runtime("10.11.0", ("8.6", "7.5")))


def test_guard_reports_every_mismatching_model_at_once(tmp_path):
    other = PLAN | {"compute_capability": "sm_89"}
    repo = _repository(tmp_path, {"minilm_encoder": PLAN, "efficientnet_lite0": other})

    with pytest.raises(TensorRTError) as info:
        guard(repo, runtime=_runtime("10.3.0", ("8.6",)))

    message = str(info.value)
    assert message.startswith("2 TensorRT plan(s)")
    assert "model 'minilm_encoder'" in message and "model 'efficientnet_lite0'" in message


def test_guard_refuses_when_no_gpu_is_visible(tmp_path):
    repo = _repository(tmp_path, {"minilm_encoder": PLAN})

    with pytest.raises(TensorRTError, match="no GPU is visible"):
        guard(repo, runtime=_runtime("10.11.0", ()))


def test_guard_refuses_when_no_tensorrt_is_found(tmp_path):
    repo = _repository(tmp_path, {"minilm_encoder": PLAN})

    with pytest.raises(TensorRTError, match="no TensorRT was found"):
        guard(repo, runtime=Runtime(None, "nothing searched", ("8.6",), "test"))


def test_guard_refuses_when_a_tensorrt_config_has_no_build_record(tmp_path):
    repo = _repository(tmp_path, {"minilm_encoder": None})
    config = repo / "minilm_encoder" / "config.pbtxt"
    config.write_text(TRT_CONFIG.format(name="minilm_encoder"))

    with pytest.raises(TensorRTError, match="minilm_encoder use TensorRT but have no 'tensorrt'"):
        guard(repo, runtime=_runtime())


def test_guard_refuses_when_manifest_version_is_not_major_minor_patch(tmp_path):
    repo = _repository(tmp_path, {"minilm_encoder": PLAN | {"version": "10.11"}})

    with pytest.raises(TensorRTError, match=r"model 'minilm_encoder' field 'tensorrt'.*'10.11'"):
        guard(repo, runtime=_runtime())


def test_guard_needs_no_gpu_when_repository_has_no_plans(tmp_path):
    repo = _repository(tmp_path, {"text_tokenizer": None, "minilm_encoder": None})

    # No runtime injected: detection must not even be needed on this GPU-less machine.
    assert guard(repo) == []


def test_library_version_is_read_from_the_real_file_name(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libnvinfer.so.10.11.0").write_bytes(b"")
    (lib / "libnvinfer.so.10").symlink_to("libnvinfer.so.10.11.0")

    version, source = trt_guard.tensorrt_version_from_library([str(tmp_path / "empty"), str(lib)])

    assert version == "10.11.0"
    assert source.endswith("libnvinfer.so.10.11.0")


def test_library_probe_refuses_when_a_folder_holds_two_versions(tmp_path):
    for name in ("libnvinfer.so.10.3.0", "libnvinfer.so.10.11.0"):
        (tmp_path / name).write_bytes(b"")

    with pytest.raises(TensorRTError, match="10.3.0, 10.11.0"):
        trt_guard.tensorrt_version_from_library([str(tmp_path)])


def _fake_environment(tmp_path: Path, trt_version: str, caps: list[str]) -> dict[str, str]:
    """A PATH with an ``nvidia-smi`` that prints ``caps`` and a folder holding libnvinfer."""
    bin_dir, lib_dir = tmp_path / "bin", tmp_path / "lib"
    bin_dir.mkdir()
    lib_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '" + "\\n".join(caps) + "\\n'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    (lib_dir / f"libnvinfer.so.{trt_version}").write_bytes(b"")
    env = {k: v for k, v in os.environ.items() if k not in ("TENSORRT_VERSION", "TRT_VERSION")}
    return env | {"PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
                  "LD_LIBRARY_PATH": str(lib_dir), "PYTHONPATH": str(ROOT)}


def _run_cli(repo: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tools.serve.trt_guard", "--repository", str(repo)],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )


def test_cli_exits_nonzero_and_names_the_model_when_versions_differ(tmp_path):
    repo = _repository(tmp_path, {"minilm_encoder": PLAN})

    result = _run_cli(repo, _fake_environment(tmp_path, "10.3.0", ["8.6"]))

    assert result.returncode == 1
    assert "model 'minilm_encoder'" in result.stderr
    assert "TensorRT 10.11.0" in result.stderr and "TensorRT 10.3.0" in result.stderr
    assert "--force --only minilm_encoder" in result.stderr


def test_cli_exits_zero_when_detected_environment_matches(tmp_path):
    repo = _repository(tmp_path, {"minilm_encoder": PLAN})

    result = _run_cli(repo, _fake_environment(tmp_path, "10.11.0", ["8.6", "8.6"]))

    assert result.returncode == 0, result.stderr
    assert "minilm_encoder (TensorRT 10.11.0, sm 8.6)" in result.stdout


def test_cli_refuses_plans_on_this_gpu_less_machine(tmp_path):
    """No fakes: on the CI machine there is no GPU, so a plan must be refused."""
    repo = _repository(tmp_path, {"minilm_encoder": PLAN})
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    if trt_guard.compute_capabilities_from_nvidia_smi()[0]:
        pytest.skip("this machine has a GPU; the GPU-less refusal cannot be observed here")

    result = _run_cli(repo, env)

    assert result.returncode == 1
    assert "model 'minilm_encoder'" in result.stderr


def _compose_service(files: list[str], name: str) -> dict:
    """One service of ``docker compose -f ...``: later files replace ``command`` and replace
    ``volumes`` entries with the same ``target`` (Compose's merge rules)."""
    service: dict = {}
    for file in files:
        part = yaml.safe_load((ROOT / file).read_text())["services"].get(name, {})
        volumes = {v["target"]: v for v in service.get("volumes", []) + part.get("volumes", [])}
        service |= part | ({"volumes": list(volumes.values())} if volumes else {})
    return service


def test_refusal_rebuilds_into_the_folder_the_gpu_triton_serves(tmp_path):
    repo = _repository(tmp_path, {"minilm_encoder": PLAN})
    with pytest.raises(TensorRTError) as info:
        guard(repo, runtime=_runtime("10.13.2"))
    commands = [shlex.split(c) for c in re.findall(r"`([^`]+)`", str(info.value))]
    (everything,) = [c for c in commands if "--only" not in c]
    (one,) = [c for c in commands if "--only" in c]

    files = [everything[i + 1] for i, arg in enumerate(everything) if arg == "-f"]
    assert files == ["docker-compose.yml", "docker-compose.gpu.yml"], "plans are the gpu target"
    assert one == everything + ["--only", "minilm_encoder"]
    builder = _compose_service(files, "builder")
    triton = _compose_service(files, "triton")
    args = everything[everything.index("builder") + 1:]
    assert "--force" in args, "the spec is unchanged: without --force every model is skipped"
    output = args[args.index("--repository") + 1]
    assert args[:2] == ["tools", "build-repo"] and args[args.index("--target") + 1] == "gpu"
    assert output == builder["command"][builder["command"].index("--repository") + 1]
    (mount,) = [v for v in builder["volumes"] if output.startswith(v["target"] + "/")]
    (served,) = [v for v in triton["volumes"] if v["target"] == "/models"]
    assert f"{mount['source']}{output[len(mount['target']):]}" == served["source"]


def test_guard_runs_from_the_files_the_serving_image_copies_with_the_standard_library_only(tmp_path):
    # The NGC image has no triton-forge installed: the guard and the manifest type it reads must
    # work from the copied files alone, without site-packages (-S) or the checkout on sys.path.
    copy_serving_stage(tmp_path)
    repo = _repository(tmp_path / "repo", {"minilm_encoder": PLAN})
    env = {"PATH": os.environ["PATH"], "TENSORRT_VERSION": "10.3.0", "PYTHONPATH": str(tmp_path)}

    proc = subprocess.run(
        [sys.executable, "-S", "-m", "tools.serve.trt_guard", "--repository", str(repo)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )

    assert "No module named" not in proc.stderr, proc.stderr
    assert proc.returncode != 0 and "model 'minilm_encoder'" in proc.stderr + proc.stdout


def test_triton_entrypoint_runs_through_the_nvidia_entrypoint_once_where_it_exists(tmp_path):
    marker = tmp_path / "nv-entrypoint-ran"
    nv = tmp_path / "nvidia_entrypoint.sh"
    nv.write_text(f'#!/bin/sh\necho ran >> "{marker}"\nexec "$@"\n')
    nv.chmod(0o755)
    repo = _repository(tmp_path, {"text_tokenizer": None})  # no plans: the guard passes
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "NVIDIA_ENTRYPOINT": str(nv),
           "MODEL_REPOSITORY": str(repo), "TRITON_WATCHDOG": "off"}

    proc = subprocess.run(
        ["/bin/sh", str(ROOT / "docker" / "triton-entrypoint.sh"), "sh", "-c", "echo served"],
        env=env, capture_output=True, text=True, timeout=60,
    )

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("served")
    assert marker.read_text() == "ran\n", "through NVIDIA's entrypoint exactly once"


def test_triton_entrypoint_runs_directly_where_there_is_no_nvidia_entrypoint(tmp_path):
    repo = _repository(tmp_path, {"text_tokenizer": None})
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "MODEL_REPOSITORY": str(repo),
           "NVIDIA_ENTRYPOINT": str(tmp_path / "absent.sh"), "TRITON_WATCHDOG": "off"}

    proc = subprocess.run(
        ["/bin/sh", str(ROOT / "docker" / "triton-entrypoint.sh"), "sh", "-c", "echo served"],
        env=env, capture_output=True, text=True, timeout=60,
    )

    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "served", proc.stderr


@pytest.mark.parametrize("reason, says", [
    ("Internal: unable to create TensorRT engine: 1: [stdArchiveReader.cpp::StdArchiveReader::42] "
     "Error Code 1: Serialization (Serialization assertion stdVersionRead == kSERIALIZATION_VERSION "
     "failed.Version tag does not match. Note: Current Version: 239, Serialized Engine Version: 236)",
     "version tag does not match"),
    ("Internal: unable to create TensorRT engine: 6: The engine plan file is not compatible with this "
     "version of TensorRT, expecting library version 10.11.0.33 got 10.3.0.26, please rebuild.",
     "serialised by TensorRT 10.3.0.26 and this server runs 10.11.0.33"),
])
def test_triton_engine_load_failures_are_explained_with_the_rebuild_command(reason, says):
    explanation = trt_guard.explain_engine_failure(reason)
    assert explanation is not None and says in explanation
    assert trt_guard.REBUILD_ALL in explanation


def test_other_load_failures_get_no_tensorrt_explanation():
    assert trt_guard.explain_engine_failure("Invalid argument: unexpected inference input 'x'") is None


def test_the_server_log_reader_adds_the_rebuild_command_to_a_tensorrt_engine_failure():
    from tools.serve.server_log import failure_causes

    log = ('E1201 10:00:00.000000 1 model_lifecycle.cc:654] "failed to load \'minilm_encoder\' '
           'version 1: Internal: unable to create TensorRT engine: 6: The engine plan file is not '
           'compatible with this version of TensorRT, expecting library version 10.11.0.33 got '
           '10.3.0.26, please rebuild."\n')
    (cause,) = failure_causes(log)
    assert cause.startswith("model 'minilm_encoder' version 1 failed to load")
    assert "serialised by TensorRT 10.3.0.26" in cause and trt_guard.REBUILD_ALL in cause


def test_a_plan_the_build_skipped_is_refused_with_the_skip_reason_not_a_rebuild_that_skips_again(tmp_path):
    repo = _repository(tmp_path, {"minilm_encoder": None, "efficientnet_lite0": None})
    manifest = json.loads((repo / "build_manifest.json").read_text())
    reason = "no GPU (no NVIDIA driver: libcuda.so.1 not found)"
    for name in ("minilm_encoder", "efficientnet_lite0"):
        (repo / name / "config.pbtxt").write_text(TRT_CONFIG.format(name=name))
        manifest["models"][name] |= {"stages": {"onnx2trt": {"status": "skipped", "reason": reason}},
                                     "built_at": "2026-12-01T10:00:00+00:00"}
    (repo / "build_manifest.json").write_text(json.dumps(manifest))

    with pytest.raises(TensorRTError) as info:
        guard(repo, runtime=_runtime())

    message = str(info.value)
    assert "2 TensorRT model(s) have no plan because the build skipped it" in message
    assert f"model 'minilm_encoder': onnx2trt skipped: {reason}, built 2026-12-01T10:00:00+00:00" in message
    assert "model 'efficientnet_lite0'" in message
    assert f"`{trt_guard.BUILD_WITH_GPU}`" in message and "--force" not in message
    files = shlex.split(trt_guard.BUILD_WITH_GPU)
    assert [files[i + 1] for i, a in enumerate(files) if a == "-f"] == ["docker-compose.yml", "docker-compose.gpu.yml"]


@pytest.mark.parametrize("trt, cuda, expected", [
    ("10.13.2", "13.0.0.044", ["tensorrt-cu13-bindings==10.13.2.*", "cuda-python==13.*"]),
    ("10.11.0", "12.9.1.010", ["tensorrt-cu12-bindings==10.11.0.*", "cuda-python==12.*"]),
])
def test_builder_requirements_are_the_bindings_of_the_images_own_tensorrt(trt, cuda, expected):
    assert trt_guard.builder_requirements(trt, cuda) == expected


def test_builder_requirements_refuse_an_image_without_a_cuda_version():
    with pytest.raises(TensorRTError, match="CUDA_VERSION ''"):
        trt_guard.builder_requirements("10.13.2", "")


def test_cli_prints_the_builder_requirements_from_the_library_it_finds(tmp_path):
    env = _fake_environment(tmp_path, "10.13.2", ["8.6"]) | {"CUDA_VERSION": "13.0.0.044"}

    proc = subprocess.run([sys.executable, "-m", "tools.serve.trt_guard", "--builder-requirements"],
                          capture_output=True, text=True, env=env, timeout=60)

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["tensorrt-cu13-bindings==10.13.2.*", "cuda-python==13.*"]


def test_module_check_refuses_a_python_module_of_another_tensorrt(monkeypatch):
    module = type("tensorrt_bindings", (), {"__version__": "10.14.1.48", "__file__": "/x/__init__.py"})
    monkeypatch.setattr(trt_guard, "import_tensorrt_module", lambda: (module, "tensorrt_bindings"))

    assert "10.14.1.48" in trt_guard.check_module(_runtime("10.14.1"))
    with pytest.raises(TensorRTError, match=r"module is 10.14.1.48 .* library is 10.13.2"):
        trt_guard.check_module(_runtime("10.13.2"))


def test_module_check_says_what_was_tried_when_no_tensorrt_module_imports():
    if trt_guard.import_tensorrt_module()[0] is not None:
        pytest.skip("a TensorRT Python module is installed here")
    with pytest.raises(TensorRTError, match=r"no TensorRT Python module \(tensorrt or tensorrt_bindings\)"):
        trt_guard.check_module(_runtime())
