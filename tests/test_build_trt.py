"""TensorRT stage: optimization profiles, precision flags, the no-GPU skip and the manifest record.

The GPU calls sit behind ``TensorRTApi``; the logic around them runs here without a GPU. The real
build is the ``gpu``-marked test at the end.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tools.build_repo import onnx2trt
from tools.build_repo.spec import load_spec
from tools.errors import TensorRTError

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def spec():
    return load_spec(REPO_ROOT / "repository.yaml")


def test_profile_covers_batch_one_to_max_and_the_sequence_range(spec):
    encoder = spec.find("minilm_encoder")
    profile = onnx2trt.optimization_profile(encoder)
    assert set(profile) == {"input_ids", "attention_mask"}
    lo, opt, hi = profile["input_ids"]
    axis = encoder.axis("sequence")
    assert lo == (1, axis.min)
    assert hi == (encoder.max_batch_size, axis.max)
    assert lo[0] <= opt[0] <= hi[0] and opt[1] == axis.opt


def test_profile_keeps_fixed_dims_fixed(spec):
    image = spec.find("efficientnet_lite0")
    lo, opt, hi = onnx2trt.optimization_profile(image)["pixel_values"]
    assert lo[1:] == opt[1:] == hi[1:] == (3, 224, 224)
    assert hi[0] == image.max_batch_size


def test_profile_check_rejects_a_batch_range_short_of_max_batch_size(spec):
    encoder = spec.find("minilm_encoder")
    profile = onnx2trt.optimization_profile(encoder)
    lo, opt, hi = profile["input_ids"]
    profile["input_ids"] = (lo, opt, (encoder.max_batch_size - 1, hi[1]))
    with pytest.raises(TensorRTError, match=r"'input_ids' profile batch range \[1, 31\] does not cover"):
        onnx2trt.check_profile(encoder, profile)


def test_profile_check_rejects_a_sequence_range_short_of_the_spec(spec):
    encoder = spec.find("minilm_encoder")
    profile = onnx2trt.optimization_profile(encoder)
    lo, opt, hi = profile["attention_mask"]
    profile["attention_mask"] = (lo, opt, (hi[0], 128))
    with pytest.raises(TensorRTError, match=r"axis 'sequence' profile \[2, 128\] does not cover"):
        onnx2trt.check_profile(encoder, profile)


def test_precision_flags_set_fp16_or_clear_tf32():
    assert onnx2trt.precision_flags("fp16") == (["FP16"], [])
    assert onnx2trt.precision_flags("fp32") == ([], ["TF32"])
    with pytest.raises(TensorRTError, match="int4"):
        onnx2trt.precision_flags("int4")


def test_fp16_plans_use_the_gpu_tolerances(spec):
    encoder = spec.find("minilm_encoder")
    assert onnx2trt.parity_tolerance(encoder, "fp32") == (encoder.atol, encoder.rtol)
    assert onnx2trt.parity_tolerance(encoder, "fp16") == (encoder.gpu.fp16_atol, encoder.gpu.fp16_rtol)


def test_build_plan_is_skipped_with_the_reason_when_there_is_no_gpu(spec, tmp_path):
    def no_gpu():
        raise onnx2trt.NoGpu("no NVIDIA driver: libcuda.so.1 not found")

    outcome = onnx2trt.build_plan(
        spec.find("minilm_encoder"), tmp_path / "m.onnx", tmp_path / "m.plan", tmp_path / "cache",
        probe=no_gpu,
    )
    assert outcome.status == "skipped"
    assert outcome.reason == "no GPU (no NVIDIA driver: libcuda.so.1 not found)"
    assert outcome.manifest_entry() is None
    assert not (tmp_path / "m.plan").exists()


def test_probe_on_this_host_reports_a_reason_or_a_gpu():
    try:
        info = onnx2trt.probe_gpu()
    except onnx2trt.NoGpu as exc:
        assert str(exc)  # a reason, never silence
    else:
        assert info.compute_capability.count(".") == 1


class _RecordingApi:
    """Stands in for the GPU: records what the real API would be asked to build."""

    def __init__(self):
        self.calls = []

    def build(self, onnx_path, plan_path, profile, precision, timing_cache, workspace_mb):
        self.calls.append((profile, precision, timing_cache, workspace_mb))
        plan_path.write_bytes(b"plan")

    def runner(self, plan_path):
        raise AssertionError("not used")


def test_build_plan_passes_profile_precision_and_cache_and_records_the_manifest_entry(spec, tmp_path):
    encoder = spec.find("minilm_encoder")
    api = _RecordingApi()
    gpu = onnx2trt.GpuInfo("Test GPU", "8.6", "10.3.0")
    outcome = onnx2trt.build_plan(
        encoder, tmp_path / "m.onnx", tmp_path / "m.plan", tmp_path / "timing.cache",
        precision="fp32", probe=lambda: gpu, api=api,
    )
    (profile, precision, cache, workspace), = api.calls
    assert profile == onnx2trt.optimization_profile(encoder)
    assert precision == "fp32" and cache == tmp_path / "timing.cache"
    assert workspace == encoder.gpu.workspace_mb
    assert outcome.manifest_entry() == {"version": "10.3.0", "compute_capability": "8.6", "precision": "fp32"}


def test_build_plan_checks_the_profile_before_touching_the_gpu(spec, tmp_path):
    encoder = spec.find("minilm_encoder")
    broken = dataclasses.replace(encoder, axes=())

    def probe():
        raise AssertionError("probed the GPU with an invalid profile")

    with pytest.raises(TensorRTError, match=r"axis 'sequence' has no range"):
        onnx2trt.build_plan(broken, tmp_path / "m.onnx", tmp_path / "m.plan", tmp_path / "c", probe=probe)


@pytest.mark.gpu
@pytest.mark.torch
@pytest.mark.timeout(900)
def test_minilm_plan_matches_pytorch_on_a_real_gpu(spec, tmp_path):
    from tools.build_repo.parity import check_parity
    from tools.build_repo.spec import resolve_reference
    from tools.build_repo.torch2onnx import export_onnx

    encoder = spec.find("minilm_encoder")
    model = resolve_reference(encoder.source)()
    sample = resolve_reference(encoder.sample_inputs)
    onnx_path = export_onnx(model, sample(2, {"sequence": 32}), encoder, tmp_path / "model.onnx")
    for precision in ("fp32", "fp16"):
        plan = tmp_path / f"model.{precision}.plan"
        outcome = onnx2trt.build_plan(encoder, onnx_path, plan, tmp_path / "timing.cache", precision=precision)
        assert outcome.status == "built", outcome.reason
        atol, rtol = onnx2trt.parity_tolerance(encoder, precision)
        figures = check_parity(encoder, model, sample, onnx2trt.plan_runner(plan),
                               runtime=f"tensorrt {precision}", atol=atol, rtol=rtol)
        assert max(f.max_abs for f in figures) <= atol
