"""TensorRT stage: optimization profiles, precision flags, the no-GPU skip and the manifest record.

The GPU calls sit behind ``TensorRTApi``; the logic around them runs here without a GPU. The real
build is the ``gpu``-marked test at the end.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from tools.build_repo import onnx2trt
from tools.manifest import TensorRTRecord
from tools.build_repo.results import StageStatus
from tools.build_repo.spec import load_spec
from cuda_fakes import FakeCudart, FakeTrt, skip_reason_without_gpu
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
    assert opt == (encoder.max_batch_size, axis.opt)


def test_profile_opt_is_the_full_batch_at_the_bucket_where_served_texts_spend_half_their_tokens(spec):
    """TensorRT tunes its kernels at opt: the full batches the batcher forms under load, and the
    gpu tokenizer's length bucket that holds the median padded token of the load-test texts."""
    import itertools

    from tokenizers import Tokenizer

    from tools import paths
    from tools.build_repo.ensemble import render_all

    gpu = spec.for_target("gpu")
    tokenizer_config = render_all(gpu, "gpu")["text_tokenizer"]
    buckets = sorted(int(b) for b in dict(tokenizer_config.parameters)["length_buckets"].split(","))
    tokenizer = Tokenizer.from_file(str(_tokenizer_file(gpu)))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max(buckets))
    texts = [t for t in paths.TEXTS_FILE.read_text().splitlines() if t.strip()]
    padded = sorted(next(b for b in buckets if b >= len(e.ids)) for e in tokenizer.encode_batch(texts))
    work = list(itertools.accumulate(padded))  # padded tokens, shortest bucket first
    median_bucket = padded[next(i for i, w in enumerate(work) if w >= work[-1] / 2)]

    encoder = gpu.find("minilm_encoder")
    _, opt, _ = onnx2trt.optimization_profile(encoder)["input_ids"]
    assert opt == (encoder.max_batch_size, median_bucket)


def _tokenizer_file(spec):
    from tools.build_repo.spec import resolve_file

    return resolve_file(dict(spec.find("text_tokenizer").files)["tokenizer.json"], spec.root)


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
    assert precision == "fp32" and cache == tmp_path / "caches" / "timing-trt10.3.0-sm86-notf32.cache"
    assert workspace == encoder.gpu.workspace_mb
    assert outcome.manifest_record() == TensorRTRecord("10.3.0", "8.6", "fp32")


def test_timing_cache_is_named_by_tensorrt_version_compute_capability_and_builder_flags(tmp_path):
    gpu = onnx2trt.GpuInfo("A", "8.6", "10.3.0")
    a = onnx2trt.timing_cache_path(tmp_path, gpu, "fp16")
    b = onnx2trt.timing_cache_path(tmp_path, onnx2trt.GpuInfo("A", "8.9", "10.3.0"), "fp16")
    c = onnx2trt.timing_cache_path(tmp_path, onnx2trt.GpuInfo("A", "8.6", "10.13.2"), "fp16")
    d = onnx2trt.timing_cache_path(tmp_path, gpu, "fp32")
    assert len({a, b, c, d}) == 4 and all(p.parent == tmp_path for p in (a, b, c, d))
    assert a.name == "timing-trt10.3.0-sm86-fp16.cache" and d.name == "timing-trt10.3.0-sm86-notf32.cache"


def test_fp32_and_fp16_builds_of_one_model_use_separate_timing_caches(spec, tmp_path):
    encoder, api = spec.find("minilm_encoder"), _RecordingApi()
    gpu = onnx2trt.GpuInfo("Test GPU", "8.6", "10.13.2")
    for precision in ("fp32", "fp16", "fp32"):
        onnx2trt.build_plan(encoder, tmp_path / "m.onnx", tmp_path / f"m.{precision}.plan",
                            tmp_path / "caches", precision=precision, probe=lambda: gpu, api=api)
    caches = [cache for _, _, cache, _ in api.calls]
    assert caches[0] == caches[2] != caches[1], "one cache per set of builder flags, reused"


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
        runner = onnx2trt.plan_runner(plan)
        try:
            figures = check_parity(encoder, model, sample, runner,
                                   runtime=f"tensorrt {precision}", atol=atol, rtol=rtol)
        finally:
            runner.close()
        # The parity rule (|plan - torch| <= atol + rtol * |torch|, every element): check_parity
        # raises otherwise; its figures say so too.
        assert figures and all(f.ok for f in figures)


def _runner(tmp_path):
    plan = tmp_path / "m.plan"
    plan.write_bytes(b"plan")
    cudart, streams = FakeCudart(), []
    api = onnx2trt._RealTensorRT(trt=FakeTrt(cudart, streams), cudart=cudart)
    return api.runner(plan), cudart, streams


def _minilm_feed(batch, length, dtype=np.int64):
    ids = np.arange(batch * length, dtype=dtype).reshape(batch, length) + 100
    mask = np.ones((batch, length), dtype=np.int64)
    mask[:, length // 2:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def test_plan_runner_feeds_int64_ids_to_an_int32_engine_input_and_returns_float32(tmp_path):
    runner, cudart, streams = _runner(tmp_path)
    feed = _minilm_feed(2, 8)

    out = runner(feed)

    expected = (feed["input_ids"] * feed["attention_mask"]).mean(axis=1, keepdims=True)
    np.testing.assert_allclose(out["embedding"], expected.astype(np.float32))
    assert out["embedding"].dtype == np.float32
    assert streams == [7], "executed on the stream it created, not the legacy default stream"


def test_plan_runner_refuses_ids_that_do_not_fit_the_engines_int32_input(tmp_path):
    runner, _, _ = _runner(tmp_path)
    feed = _minilm_feed(1, 4)
    feed["input_ids"][0, 0] = 2**40

    with pytest.raises(TensorRTError, match=r"input 'input_ids' holds values outside int32"):
        runner(feed)


def test_plan_runner_refuses_a_float_input_where_the_engine_takes_integers(tmp_path):
    runner, _, _ = _runner(tmp_path)
    feed = _minilm_feed(1, 4)
    feed["attention_mask"] = feed["attention_mask"].astype(np.float32)

    with pytest.raises(TensorRTError, match=r"input 'attention_mask' is float32, the engine takes int64"):
        runner(feed)


def test_plan_runner_refuses_a_shape_outside_the_profile_instead_of_running_it(tmp_path):
    runner, cudart, streams = _runner(tmp_path)

    with pytest.raises(TensorRTError, match=r"refused shape \(5, 8\) for input 'input_ids'.*\(1, 2\)"):
        runner(_minilm_feed(5, 8))
    assert streams == [] and "cudaMalloc" not in cudart.calls


def test_plan_runner_allocates_once_per_shape_on_one_stream_with_pinned_host_buffers(tmp_path):
    runner, cudart, streams = _runner(tmp_path)

    for _ in range(3):
        runner(_minilm_feed(2, 8))
    first = cudart.calls.count("cudaMalloc"), cudart.calls.count("cudaMallocHost")
    runner(_minilm_feed(4, 16))
    runner(_minilm_feed(2, 8))

    assert first == (3, 3), "one device and one pinned host buffer per tensor, for three calls"
    assert cudart.calls.count("cudaMalloc") == 6 and cudart.calls.count("cudaMallocHost") == 6
    assert cudart.calls.count("cudaStreamCreate") == 1 and len(streams) == 5
    assert cudart.calls.count("cudaMemcpyAsync H2D") == 10 and cudart.calls.count("cudaMemcpyAsync D2H") == 5
    runner.close()
    assert sorted(cudart.freed) == sorted(cudart.memory) and cudart.calls[-1] == "cudaStreamDestroy"


def test_plan_runner_times_the_execution_alone_and_with_copies_by_cuda_events(tmp_path):
    runner, cudart, _ = _runner(tmp_path)

    timings = runner.time(_minilm_feed(2, 8), iterations=4, warmup=1)

    assert len(timings) == 4
    # fake clock: each copy +1, each execution +10; two inputs in, one output back
    assert all(t.compute_ms == 10.0 and t.total_ms == 13.0 for t in timings)


def test_builder_creation_failing_on_an_old_driver_is_a_tensorrt_error_naming_the_driver(tmp_path):
    class OldDriverTrt(FakeTrt):
        def Builder(self, logger):  # noqa: N802 - TensorRT's name
            raise TypeError("pybind11::init(): factory function returned nullptr")

    api = onnx2trt._RealTensorRT(trt=OldDriverTrt(FakeCudart(), []), cudart=FakeCudart())
    with pytest.raises(TensorRTError, match=r"could not create its Builder \(TypeError: .*nullptr\).*driver"):
        api.build(tmp_path / "m.onnx", tmp_path / "m.plan", {}, "fp16", tmp_path / "c", 64)


def test_a_gpu_build_without_a_gpu_fails_naming_the_tensorrt_models(spec, tmp_path):
    from tools.build_repo.pipeline import build_repository
    from tools.errors import BuildError

    with pytest.raises(BuildError) as info:
        build_repository(REPO_ROOT / "repository.yaml", tmp_path / "out", target="gpu", progress=False,
                         only=["minilm_encoder", "efficientnet_lite0", "text_tokenizer"])
    message = str(info.value)
    assert "TensorRT plans of minilm_encoder, efficientnet_lite0" in message
    assert "--allow-missing-gpu" in message and "docker-compose.gpu.yml" in message
    assert not (tmp_path / "out").exists(), "refused before anything was written"


def test_require_gpu_passes_with_a_gpu_or_without_tensorrt_models(spec):
    gpu = spec.for_target("gpu")

    def no_gpu():
        raise onnx2trt.NoGpu("no NVIDIA driver")

    onnx2trt.require_gpu(gpu, ["minilm_encoder"], probe=lambda: onnx2trt.GpuInfo("G", "8.6", "10.13.2"))
    onnx2trt.require_gpu(gpu, ["text_tokenizer"], probe=no_gpu)


@pytest.mark.light_subprocess("without a GPU the build is refused before any export")
def test_build_repo_cli_without_a_gpu_exits_1_naming_the_models(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "tools.cli", "build-repo", "--target", "gpu", "--spec",
         str(REPO_ROOT / "repository.yaml"), "--repository", str(tmp_path / "out"), "--no-progress"],
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
    )
    if "TensorRT plans of" not in proc.stderr and proc.returncode == 0:
        pytest.skip("this host has a GPU: the plans are built")
    assert proc.returncode == 1, proc.stderr
    assert "minilm_encoder, efficientnet_lite0" in proc.stderr


def test_ort_tensorrt_accelerator_has_engine_cache_and_profile_shapes_of_the_whole_range(spec):
    from tools.build_repo import config as cfg

    encoder = dataclasses.replace(spec.find("minilm_encoder"), gpu=dataclasses.replace(
        spec.find("minilm_encoder").gpu, backend="onnxruntime", onnxruntime_tensorrt_accelerator=True))
    message = cfg.model_config(encoder, "gpu").to_message()
    (accelerator,) = message.optimization.execution_accelerators.gpu_execution_accelerator
    params = dict(accelerator.parameters)

    assert accelerator.name == "tensorrt"
    assert params["trt_engine_cache_enable"] == "1" and params["trt_engine_cache_path"].endswith("/minilm_encoder")
    assert params["trt_timing_cache_enable"] == "1"
    axis = encoder.axis("sequence")
    assert params["trt_profile_min_shapes"] == f"input_ids:1x{axis.min},attention_mask:1x{axis.min}"
    assert params["trt_profile_max_shapes"] == (f"input_ids:{encoder.max_batch_size}x{axis.max},"
                                                f"attention_mask:{encoder.max_batch_size}x{axis.max}")
    lo, opt, hi = onnx2trt.optimization_profile(encoder)["input_ids"]
    assert params["trt_profile_opt_shapes"].startswith(f"input_ids:{opt[0]}x{opt[1]},")
    assert params["precision_mode"] == "FP16"
    assert params["max_workspace_size_bytes"] == str(encoder.gpu.workspace_mb << 20)


def test_every_ort_tensorrt_key_is_one_tritons_onnxruntime_backend_reads(spec):
    """A key the backend does not know is ignored silently; these are the r25.08 backend's."""
    import json

    recorded = json.loads((REPO_ROOT / "tests" / "data" / "gpu_pins" / "onnxruntime_backend_trt_keys.json").read_text())
    for name in ("minilm_encoder", "efficientnet_lite0"):
        params = onnx2trt.ort_tensorrt_parameters(spec.find(name))
        assert set(params) <= set(recorded["keys"]), sorted(set(params) - set(recorded["keys"]))
    image = onnx2trt.optimization_profile(spec.find("efficientnet_lite0"))["pixel_values"]
    assert onnx2trt.ort_tensorrt_parameters(spec.find("efficientnet_lite0"))["trt_profile_opt_shapes"] == (
        "pixel_values:" + "x".join(map(str, image[1])))


@pytest.mark.torch
@pytest.mark.timeout(900)
def test_a_model_added_with_tools_add_fails_a_gpu_build_without_a_gpu_and_the_guard_says_why(tmp_path):
    """Generic: the refusal, --allow-missing-gpu and the guard's skip reason for a model a user
    adds (a tiny BERT through `tools add hf-text-embedding`), not only the shipped ones."""
    from tests.add_helpers import tiny_bert_folder
    from tools.add.command import add_model
    from tools.build_repo.pipeline import build_repository
    from tools.errors import BuildError
    from tools.serve.trt_guard import BUILD_WITH_GPU, guard

    reason = skip_reason_without_gpu()
    spec = tmp_path / "repository.yaml"
    add_model("hf-text-embedding", str(tiny_bert_folder(tmp_path / "tiny")), "tiny", spec)
    text = spec.read_text()  # the user asks for a TensorRT plan on gpu (tools add writes onnxruntime)
    assert text.count("gpu: {backend: onnxruntime}") == 1
    spec.write_text(text.replace("gpu: {backend: onnxruntime}", "gpu: {backend: tensorrt}"))
    output = tmp_path / "gpu"

    with pytest.raises(BuildError, match=r"TensorRT plans of tiny_encoder, but there is none here"):
        build_repository(spec, output, target="gpu", progress=False)
    result = build_repository(spec, output, target="gpu", progress=False, allow_missing_gpu=True)

    assert result["tiny_encoder"].note == f"onnx2trt skipped: {reason}"
    with pytest.raises(TensorRTError) as info:
        guard(output)
    assert f"model 'tiny_encoder': onnx2trt skipped: {reason}" in str(info.value)
    assert BUILD_WITH_GPU in str(info.value)


def test_a_plan_runner_dropped_without_close_frees_its_device_memory(tmp_path):
    import gc

    runner, cudart, _ = _runner(tmp_path)
    runner(_minilm_feed(2, 8))
    del runner
    gc.collect()
    assert sorted(cudart.freed) == sorted(cudart.memory) and "cudaStreamDestroy" in cudart.calls


@pytest.mark.parametrize("argv, env, allowed", [
    ([], {}, False),
    (["--allow-missing-gpu"], {}, True),
    ([], {"TRITON_FORGE_ALLOW_MISSING_GPU": "1"}, True),  # compose/Kubernetes dev mode, no new argument
    ([], {"TRITON_FORGE_ALLOW_MISSING_GPU": ""}, False),
])
def test_build_repo_passes_allow_missing_gpu_from_the_flag_or_the_environment(monkeypatch, argv, env, allowed):
    from click.testing import CliRunner

    from tools.build_repo import command

    seen = {}
    monkeypatch.setattr(command, "build_repository", lambda *a, **k: seen.update(k))
    monkeypatch.delenv("TRITON_FORGE_ALLOW_MISSING_GPU", raising=False)
    result = CliRunner().invoke(command.build_repo, ["--target", "gpu", *argv], env=env)
    assert result.exit_code == 0, result.output
    assert seen == {"allow_missing_gpu": allowed}
