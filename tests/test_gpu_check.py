"""The one-command GPU check fails clearly where the GPU path cannot run, and writes its report.

The GPU itself runs only in the ``gpu`` tier; here the seams are driven with fakes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools import gpu_check
from tools.build_repo import onnx2trt

ROOT = Path(__file__).resolve().parents[1]


def test_ort_cuda_runner_refuses_an_onnxruntime_without_the_cuda_provider_naming_the_fix(tmp_path):
    class CpuOnly:
        @staticmethod
        def get_available_providers():
            return ["CPUExecutionProvider"]

    with pytest.raises(RuntimeError, match=r"no CUDAExecutionProvider.*onnxruntime#26996"):
        gpu_check.ort_cuda_runner(tmp_path / "model.onnx", ort=CpuOnly)


def test_ort_cuda_runner_refuses_a_session_that_fell_back_to_the_cpu(tmp_path):
    class Session:
        def __init__(self, *args, **kwargs):
            pass

        def get_providers(self):
            return ["CPUExecutionProvider"]

    class FallsBack:
        InferenceSession = Session

        @staticmethod
        def get_available_providers():
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]

    with pytest.raises(RuntimeError, match="could not create a CUDA session"):
        gpu_check.ort_cuda_runner(tmp_path / "model.onnx", ort=FallsBack)


def test_without_a_gpu_the_check_exits_2_and_still_writes_its_report(tmp_path, monkeypatch):
    def no_gpu():
        raise onnx2trt.NoGpu("no NVIDIA driver: libcuda.so.1 not found")

    monkeypatch.setattr(onnx2trt, "probe_gpu", no_gpu)
    code = gpu_check.main(["--workdir", str(tmp_path), "--json", str(tmp_path / "r.json")])

    assert code == gpu_check.EXIT_NO_GPU
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["failures"] == ["no GPU: no NVIDIA driver: libcuda.so.1 not found"]


def test_gpu_check_script_keeps_only_the_gpu_onnxruntime_wheel_in_its_own_environment():
    script = (ROOT / "scripts" / "gpu-check.sh").read_text()
    assert "venv=.venv-gpu" in script
    assert '-e ".[gpu]"' in script and "constraints-cpu.txt" in script
    assert script.index("uninstall --quiet -y onnxruntime onnxruntime-gpu") < script.index('"onnxruntime-gpu${ort_version')
    assert script.rstrip().endswith('-m tools.gpu_check "$@"')


@pytest.mark.gpu
@pytest.mark.torch
@pytest.mark.timeout(1800)
def test_gpu_check_passes_on_a_gpu_host(tmp_path):
    code = gpu_check.main(["--workdir", str(tmp_path), "--iterations", "10"])
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert code == gpu_check.EXIT_OK, report["failures"]
    assert {p["precision"] for p in report["parity"] if p["verdict"] == "ok"} == {"fp32", "fp16"}
    assert {t["engine"] for t in report["timings"]} >= {"TensorRT fp16", "ONNX Runtime CUDA fp32"}
