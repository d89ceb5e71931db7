"""scripts/gpu-check.sh, run: one clear line where no GPU is usable, the driver preflight's branches
(a fake ``nvidia-smi`` on PATH), the offline section stopping where a real GPU is needed, and the
report always written. The GPU itself runs only in the ``gpu`` tier; the CUDA seams are driven
with the fakes of tests/cuda_fakes.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cuda_fakes import FakeCudart
from tools import gpu_check

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"


def _path_without_nvidia_smi() -> str:
    return os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep)
                           if d and not (Path(d) / "nvidia-smi").exists())


def _fake_smi(tmp_path: Path, body: str) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{body}\n")
    smi.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{_path_without_nvidia_smi()}"


def _run_script(tmp_path: Path, path: str, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"PATH": path, "GPU_CHECK_REPORT": str(report), "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(SCRIPT), *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    return proc, json.loads(report.read_text()) if report.exists() else {}


def _lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]


def test_without_a_gpu_the_script_exits_with_one_clear_line_and_writes_its_report(tmp_path):
    if shutil.which("nvidia-smi"):
        pytest.skip("this host has nvidia-smi; the GPU-less line cannot be observed here")

    proc, report = _run_script(tmp_path, _path_without_nvidia_smi())

    (line,) = _lines(proc)
    assert proc.returncode == gpu_check.EXIT_NO_GPU
    assert line.startswith("gpu-check: no NVIDIA GPU here: nvidia-smi is not on PATH")
    assert report["sections"]["preflight"]["status"] == "failed"
    assert list(report["sections"]) == ["preflight"], "nothing after the preflight ran"


def test_a_driver_older_than_the_cuda_13_wheels_need_is_refused_in_one_line(tmp_path):
    path = _fake_smi(tmp_path, 'echo "550.54.15, NVIDIA A10G, 8.6"')

    proc, report = _run_script(tmp_path, path)

    (line,) = _lines(proc)
    assert proc.returncode == gpu_check.EXIT_NO_GPU
    assert "NVIDIA driver 550.54.15 is too old for the CUDA 13 wheels" in line and ">= 580" in line
    assert report["sections"]["preflight"]["driver"] == "550.54.15"


def test_an_nvidia_smi_that_cannot_reach_the_driver_is_one_clear_line(tmp_path):
    path = _fake_smi(tmp_path, "echo 'NVIDIA-SMI has failed because it couldn'\"'\"'t communicate with the "
                               "NVIDIA driver.' >&2; exit 9")

    proc, _ = _run_script(tmp_path, path)

    (line,) = _lines(proc)
    assert proc.returncode == gpu_check.EXIT_NO_GPU
    assert "nvidia-smi found no usable GPU (exit 9: NVIDIA-SMI has failed" in line


@pytest.mark.torch  # its offline section imports torch in the child
def test_a_new_enough_driver_proceeds_to_the_offline_section_which_stops_without_cuda_in_torch(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("torch sees a GPU here: the offline section would run in full")
    path = _fake_smi(tmp_path, 'echo "580.65.06, NVIDIA A10G, 8.6"')

    proc, report = _run_script(tmp_path, path, "--offline")

    first, second = _lines(proc)
    assert first == "gpu-check: driver 580.65.06 (NVIDIA A10G, compute capability 8.6) meets the CUDA 13 floor (>= 580)"
    assert second.startswith(f"gpu-check: offline: torch {torch.__version__} sees no CUDA device")
    assert proc.returncode == gpu_check.EXIT_SKIPPED, "nothing checked is not a pass"
    sections = report["sections"]
    assert sections["preflight"]["status"] == "passed" and sections["offline"]["status"] == "skipped"
    assert "full" not in sections, "--offline never reaches the pinned wheels"


def test_the_venv_gets_the_projects_dependencies_but_onnxruntime_and_torch(monkeypatch):
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    wanted = [d for d in deps if not d.startswith(("onnxruntime", "torch"))]

    assert gpu_check.project_requirements() == wanted
    monkeypatch.setitem(sys.modules, "tomllib", None)  # Python 3.10 has no tomllib
    assert gpu_check.project_requirements() == wanted


def test_the_plan_runner_round_trips_through_the_copy_engine_on_a_cudart():
    cudart = FakeCudart()

    result = gpu_check.plan_runner_on_cudart(cudart)

    assert result["ok"], result
    assert result["shape_outside_profile_refused"] and result["shape_sets_allocated"] == 3
    assert sorted(cudart.freed) == sorted(cudart.memory), "everything freed"


def test_the_plan_runner_check_fails_when_the_device_copies_lose_data():
    class Lossy(FakeCudart):
        def cudaMemcpyAsync(self, dst, src, size, kind, stream):  # noqa: N802
            result = super().cudaMemcpyAsync(dst, src, size, kind, stream)
            if kind == "D2D":
                self.ctypes.memset(dst, 0, size)
            return result

    assert not gpu_check.plan_runner_on_cudart(Lossy())["ok"]


def test_ort_cuda_refuses_an_onnxruntime_without_the_cuda_provider_naming_the_fix():
    class CpuOnly:
        @staticmethod
        def get_available_providers():
            return ["CPUExecutionProvider"]

    with pytest.raises(RuntimeError, match=r"no CUDAExecutionProvider.*onnxruntime-gpu\[cuda,cudnn\].*#26996"):
        gpu_check.onnxruntime_cuda(CpuOnly)


def test_ort_cuda_preloads_the_cuda_and_cudnn_wheels_libraries():
    calls = []

    class Gpu:
        @staticmethod
        def get_available_providers():
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]

        @staticmethod
        def preload_dlls(directory=None):
            calls.append(directory)

    assert gpu_check.onnxruntime_cuda(Gpu) is Gpu and calls == [""]


class _FakeOrt:
    """ONNX Runtime's Python API as the ORT timing path uses it: records what it is asked."""

    def __init__(self, cudart, providers=("CUDAExecutionProvider",)):
        self.cudart, self.created, self.session_providers = cudart, [], list(providers)
        fake = self

        class OrtValue:
            def __init__(self, array):
                self.array = array

            @staticmethod
            def ortvalue_from_shape_and_type(shape, dtype, device, index):
                assert device == "cuda" and index == 0
                pointer = fake.cudart.cudaMalloc(int(np.prod(shape)) * np.dtype(dtype).itemsize)[1]
                import ctypes

                raw = (ctypes.c_uint8 * max(int(np.prod(shape)) * np.dtype(dtype).itemsize, 1)).from_address(pointer)
                value = OrtValue(np.frombuffer(raw, dtype=dtype, count=int(np.prod(shape))).reshape(shape))
                value.pointer = pointer
                return value

            def data_ptr(self):
                return self.pointer

            def shape(self):
                return list(self.array.shape)

            def numpy(self):
                return self.array

        class Binding:
            def __init__(self):
                self.inputs, self.outputs = {}, {}

            def bind_ortvalue_input(self, name, value):
                self.inputs[name] = value

            def bind_output(self, name, device):
                self.outputs[name] = None

            def bind_ortvalue_output(self, name, value):
                self.outputs[name] = value

            def get_outputs(self):
                return [OrtValue(self.inputs["x"].array * 2)]

        class Session:
            def __init__(self, path, providers):
                fake.created.append(providers)

            def get_providers(self):
                return fake.session_providers

            def get_outputs(self):
                return [type("Out", (), {"name": "y"})]

            def io_binding(self):
                return Binding()

            def run_with_iobinding(self, binding, options=None):
                fake.runs.append(options)
                if binding.outputs["y"] is not None:
                    binding.outputs["y"].array[...] = binding.inputs["x"].array * 2
                fake.cudart.clock += 10.0

        class RunOptions:
            def __init__(self):
                self.entries = {}

            def add_run_config_entry(self, key, value):
                self.entries[key] = value

        self.OrtValue, self.InferenceSession, self.RunOptions, self.runs = OrtValue, Session, RunOptions, []


def test_ort_cuda_timings_run_on_the_runners_stream_with_device_buffers_and_events(tmp_path):
    cudart = FakeCudart()
    ort = _FakeOrt(cudart)

    runner = gpu_check.OrtCudaRunner(tmp_path / "m.onnx", ort, cudart)
    timings = runner.time({"x": np.ones((2, 3), np.float32)}, iterations=3, warmup=1)
    runner.close()

    ((name, options),) = ort.created[0]
    assert name == "CUDAExecutionProvider" and options["user_compute_stream"] == "7"
    assert all(o.entries == {"disable_synchronize_execution_providers": "1"} for o in ort.runs[1:])
    assert [(t.compute_ms, t.total_ms) for t in timings] == [(10.0, 12.0)] * 3  # one copy in, one out
    assert cudart.calls.count("cudaMallocHost") == 2, "pinned host buffers for the input and output"


def test_ort_cuda_refuses_a_session_that_fell_back_to_the_cpu(tmp_path):
    cudart = FakeCudart()
    with pytest.raises(RuntimeError, match="could not create a CUDA session"):
        gpu_check.OrtCudaRunner(tmp_path / "m.onnx", _FakeOrt(cudart, ("CPUExecutionProvider",)), cudart)


def test_the_full_section_writes_its_report_when_its_wheels_are_missing(tmp_path, monkeypatch):
    def no_cuda_ort():
        raise RuntimeError("ONNX Runtime has no CUDAExecutionProvider (available: ['CPUExecutionProvider'])")

    monkeypatch.setattr(gpu_check, "onnxruntime_cuda", no_cuda_ort)

    code = gpu_check.main(["full", "--json", str(tmp_path / "r.json"), "--workdir", str(tmp_path)])

    assert code == gpu_check.EXIT_FAILED
    section = json.loads((tmp_path / "r.json").read_text())["sections"]["full"]
    assert section["status"] == "failed" and "no CUDAExecutionProvider" in section["failures"][0]


@pytest.mark.gpu
@pytest.mark.torch
@pytest.mark.timeout(3600)
def test_gpu_check_passes_on_a_gpu_host(tmp_path):
    report = tmp_path / "r.json"
    for section in ("preflight", "offline", "full"):
        code = gpu_check.main([section, "--json", str(report), "--workdir", str(tmp_path), "--iterations", "10"])
        assert code in (gpu_check.EXIT_OK, gpu_check.EXIT_SKIPPED) if section == "offline" else code == 0, section
    full = json.loads(report.read_text())["sections"]["full"]
    assert {(p["model"], p["engine"]) for p in full["parity"] if p["verdict"] == "ok"} >= {
        (m, e) for m in ("minilm_encoder", "efficientnet_lite0")
        for e in ("TensorRT fp32", "TensorRT fp16", "ONNX Runtime CUDA fp32")}
