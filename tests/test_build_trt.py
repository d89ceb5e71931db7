"""TensorRT stage: optimization profiles, precision flags, the no-GPU skip and the manifest record.

The GPU calls sit behind ``TensorRTApi``; the logic around them runs here without a GPU. The real
build is the ``gpu``-marked test at the end.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from tools.build_repo import onnx2trt
from tools.manifest import TensorRTRecord
from tools.build_repo.results import StageStatus
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
    assert outcome.status == StageStatus.SKIPPED
    assert outcome.reason == "no GPU (no NVIDIA driver: libcuda.so.1 not found)"
    assert outcome.manifest_record() is None
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
        encoder, tmp_path / "m.onnx", tmp_path / "m.plan", tmp_path / "caches",
        precision="fp32", probe=lambda: gpu, api=api,
    )
    (profile, precision, cache, workspace), = api.calls
    assert profile == onnx2trt.optimization_profile(encoder)
    assert precision == "fp32" and cache == tmp_path / "caches" / "timing-trt10.3.0-sm86.cache"
    assert workspace == encoder.gpu.workspace_mb
    assert outcome.manifest_record() == TensorRTRecord("10.3.0", "8.6", "fp32")


def test_timing_cache_is_named_by_tensorrt_version_and_compute_capability(tmp_path):
    a = onnx2trt.timing_cache_path(tmp_path, onnx2trt.GpuInfo("A", "8.6", "10.3.0"))
    b = onnx2trt.timing_cache_path(tmp_path, onnx2trt.GpuInfo("A", "8.9", "10.3.0"))
    c = onnx2trt.timing_cache_path(tmp_path, onnx2trt.GpuInfo("A", "8.6", "10.13.2"))
    assert len({a, b, c}) == 3 and all(p.parent == tmp_path for p in (a, b, c))


class _FakeBuilderConfig:
    """A builder config whose set_timing_cache refuses caches made from ``stale`` bytes."""

    def __init__(self, stale: bytes):
        self.stale, self.attached = stale, []

    def create_timing_cache(self, data: bytes):
        return {"from": bytes(data)}

    def set_timing_cache(self, cache, ignore_mismatch):
        assert ignore_mismatch is False
        if cache["from"] and cache["from"] == self.stale:
            return False
        self.attached.append(cache)
        return True


def test_a_timing_cache_tensorrt_refuses_is_replaced_by_a_fresh_one(tmp_path):
    path = tmp_path / "timing.cache"
    path.write_bytes(b"from another GPU")
    config = _FakeBuilderConfig(stale=b"from another GPU")

    cache = onnx2trt.load_timing_cache(config, path)

    assert cache == {"from": b""} and config.attached == [cache]


def test_a_timing_cache_tensorrt_accepts_is_reused(tmp_path):
    path = tmp_path / "timing.cache"
    path.write_bytes(b"this GPU")
    config = _FakeBuilderConfig(stale=b"other")

    assert onnx2trt.load_timing_cache(config, path) == {"from": b"this GPU"}


def test_fp16_on_a_tensorrt_without_precision_flags_is_a_clear_tensorrt_error():
    class BuilderFlag:  # TensorRT 11: the precision-enabling flags are gone
        TF32 = object()

    trt = type("trt", (), {"BuilderFlag": BuilderFlag, "__version__": "11.4.0"})

    assert onnx2trt.builder_flags(trt, ["TF32"]) == [BuilderFlag.TF32]
    with pytest.raises(TensorRTError, match=r"TensorRT 11.4.0 has no BuilderFlag.FP16.*<11"):
        onnx2trt.builder_flags(trt, ["FP16"])


def test_the_gpu_extra_pins_tensorrt_below_11():
    import tomllib

    gpu = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    (tensorrt,) = [d for d in gpu if d.startswith("tensorrt")]
    assert "<11" in tensorrt.replace(" ", "")


def test_build_plan_checks_the_profile_before_touching_the_gpu(spec, tmp_path):
    encoder = spec.find("minilm_encoder")
    # The spec refuses an input axis without a range; build_plan checks again on its own.
    broken = copy.copy(encoder)
    object.__setattr__(broken, "axes", {})

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
        assert outcome.status == StageStatus.DONE, outcome.reason
        atol, rtol = onnx2trt.parity_tolerance(encoder, precision)
        figures = check_parity(encoder, model, sample, onnx2trt.plan_runner(plan),
                               runtime=f"tensorrt {precision}", atol=atol, rtol=rtol)
        assert max(f.max_abs for f in figures) <= atol


class _FakeCudart:
    """cuda-python's runtime API over host memory: records every call the plan runner makes."""

    class cudaMemcpyKind:  # noqa: N801 - cuda-python's names
        cudaMemcpyHostToDevice = "H2D"
        cudaMemcpyDeviceToHost = "D2H"

    def __init__(self):
        import ctypes

        self.ctypes, self.calls, self.memory, self.freed = ctypes, [], {}, []

    def cudaStreamCreate(self):  # noqa: N802
        self.calls.append("cudaStreamCreate")
        return 0, 7  # stream handle 7: not the legacy default stream (0)

    def cudaMalloc(self, size):  # noqa: N802
        buffer = self.ctypes.create_string_buffer(size)
        pointer = self.ctypes.addressof(buffer)
        self.memory[pointer] = buffer
        self.calls.append("cudaMalloc")
        return 0, pointer

    def cudaMemcpyAsync(self, dst, src, size, kind, stream):  # noqa: N802
        assert stream == 7
        self.ctypes.memmove(dst, src, size)
        self.calls.append(f"cudaMemcpyAsync {kind}")
        return (0,)

    def cudaStreamSynchronize(self, stream):  # noqa: N802
        self.calls.append("cudaStreamSynchronize")
        return (0,)

    def cudaFree(self, pointer):  # noqa: N802
        self.freed.append(pointer)
        return (0,)

    def cudaStreamDestroy(self, stream):  # noqa: N802
        self.calls.append("cudaStreamDestroy")
        return (0,)


class _FakeTrt:
    """TensorRT's runtime objects for a plan that doubles its input (float32, same shape)."""

    class TensorIOMode:  # noqa: N801
        INPUT, OUTPUT = "in", "out"

    class Logger:
        WARNING = 2

        def __init__(self, level):
            pass

    def __init__(self, streams):
        self.streams = streams
        fake = self

        class Context:
            def __init__(self):
                self.addresses, self.shape = {}, None

            def set_input_shape(self, name, shape):
                self.shape = shape

            def get_tensor_shape(self, name):
                return self.shape

            def set_tensor_address(self, name, pointer):
                self.addresses[name] = pointer

            def execute_async_v3(self, stream):
                import ctypes

                fake.streams.append(stream)
                count = int(np.prod(self.shape))
                src = (ctypes.c_float * count).from_address(self.addresses["x"])
                dst = (ctypes.c_float * count).from_address(self.addresses["y"])
                for i in range(count):
                    dst[i] = 2 * src[i]
                return True

        class Engine:
            num_io_tensors = 2

            def get_tensor_name(self, i):
                return ["x", "y"][i]

            def get_tensor_mode(self, name):
                return fake.TensorIOMode.INPUT if name == "x" else fake.TensorIOMode.OUTPUT

            def get_tensor_dtype(self, name):
                return "float32"

            def create_execution_context(self):
                return Context()

        class Runtime:
            def __init__(self, logger):
                pass

            def deserialize_cuda_engine(self, data):
                return Engine()

        self.Runtime = Runtime

    @staticmethod
    def nptype(dtype):
        return np.float32


def test_plan_runner_uses_cuda_python_on_a_dedicated_stream_and_frees_everything(tmp_path):
    import inspect

    plan = tmp_path / "m.plan"
    plan.write_bytes(b"plan")
    cudart, streams = _FakeCudart(), []
    api = onnx2trt._RealTensorRT(trt=_FakeTrt(streams), cudart=cudart)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)

    out = api.runner(plan)({"x": x})

    np.testing.assert_array_equal(out["y"], 2 * x)
    assert streams == [7], "executed on the stream it created, not the legacy default stream"
    assert cudart.calls[0] == "cudaStreamCreate" and cudart.calls[-1] == "cudaStreamDestroy"
    assert cudart.calls.count("cudaMemcpyAsync H2D") == 1 and cudart.calls.count("cudaMemcpyAsync D2H") == 1
    assert cudart.calls.index("cudaStreamSynchronize") > cudart.calls.index("cudaMemcpyAsync D2H")
    assert sorted(cudart.freed) == sorted(cudart.memory)
    # The builder image carries CPU torch: nothing on the plan's path may ask torch for CUDA.
    assert "torch" not in inspect.getsource(onnx2trt._RealTensorRT)
