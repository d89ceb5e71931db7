"""``cpu.runtime: openvino``: the spec's rules, the served runner's OpenVINO session (real
OpenVINO CPU plugin on small ONNX graphs and on the built MiniLM), and what the build records."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pipeline_ops.onnx_session import (
    ConfigurationError,
    OnnxRunner,
    OpenVinoSession,
    RunnerConfig,
    load_runner,
    make_session,
    openvino_properties,
)
from spec_helpers import project_spec, write_spec
from test_pipeline_ops_onnx import _encoder_config, _linear_model, _masked_mean_model

from tools.build_repo.spec import load_spec
from tools.errors import SpecError

ROOT = Path(__file__).resolve().parents[1]


def _bf16_on_this_cpu() -> bool:
    import openvino

    return "BF16" in openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


# --- spec ------------------------------------------------------------------------------------


def _spec_with_cpu(tmp_path, **cpu):
    data = project_spec()
    entry = data["models"]["minilm_encoder_bf16"]["cpu"]
    entry.update(cpu)
    for key in [k for k, v in entry.items() if v is None]:
        entry.pop(key)
    return write_spec(tmp_path, data)


def test_bf16_on_onnx_runtime_is_refused_naming_the_field(tmp_path):
    with pytest.raises(SpecError, match=r"model 'minilm_encoder_bf16': field 'cpu.precision' "
                                        r"bf16 needs runtime: openvino"):
        load_spec(_spec_with_cpu(tmp_path, runtime="onnxruntime"))


def test_openvino_on_an_onnx_runtime_graph_is_refused_naming_the_field(tmp_path):
    with pytest.raises(SpecError, match=r"field 'cpu.runtime' openvino needs optimize: none or "
                                        r"int8, got optimize: fused"):
        load_spec(_spec_with_cpu(tmp_path, optimize="fused"))


def test_openvino_int8_without_calibration_texts_is_refused_naming_the_field(tmp_path):
    with pytest.raises(SpecError, match=r"model 'minilm_encoder_bf16': field "
                                        r"'cpu.calibration_texts' is required with runtime: "
                                        r"openvino and optimize: int8"):
        load_spec(_spec_with_cpu(tmp_path, optimize="int8"))


@pytest.mark.parametrize("cpu", [{"runtime": "onnxruntime", "precision": "fp32", "optimize": "int8"},
                                 {"optimize": "none"}])
def test_calibration_texts_where_nothing_calibrates_are_refused_naming_the_field(tmp_path, cpu):
    with pytest.raises(SpecError, match=r"field 'cpu.calibration_texts' is used only with "
                                        r"runtime: openvino and optimize: int8"):
        load_spec(_spec_with_cpu(tmp_path, calibration_texts="loadtests/data/texts.txt", **cpu))


def test_bf16_without_a_quality_set_is_refused_naming_the_field(tmp_path):
    with pytest.raises(SpecError, match=r"model 'minilm_encoder_bf16': field 'cpu.quality' is "
                                        r"required with precision: bf16"):
        load_spec(_spec_with_cpu(tmp_path, quality=None))


def test_bf16_on_a_model_without_an_embedding_output_is_refused(tmp_path):
    data = project_spec()
    entry = data["models"]["minilm_encoder_bf16"]
    entry["outputs"].append({"name": "tokens", "dtype": "int64", "shape": ["batch", 1]})
    with pytest.raises(SpecError) as info:
        load_spec(write_spec(tmp_path, data))
    assert "model 'minilm_encoder_bf16': field 'cpu.precision' bf16 needs one embedding-like" in str(info.value)


def test_the_shipped_openvino_encoders_render_the_runtime_parameters_and_the_exact_one_does_not():
    from tools.build_repo.ensemble import render_all

    rendered = render_all(load_spec(ROOT / "repository.yaml"), "cpu")
    params = {name: {k: v.string_value for k, v in c.to_message().parameters.items()}
              for name, c in rendered.items()}
    assert params["minilm_encoder_bf16"]["runtime"] == "openvino"
    assert params["minilm_encoder_bf16"]["inference_precision"] == "bf16"
    assert params["minilm_encoder_bf16"]["onnx_file"] == "model.onnx"
    assert params["minilm_encoder_int8"]["onnx_file"] == "model.int8.xml"
    assert params["minilm_encoder_int8"]["runtime"] == "openvino"
    assert "runtime" not in params["minilm_encoder"]


# --- the served runner's config --------------------------------------------------------------


def test_runner_config_reads_runtime_and_precision_with_onnx_runtime_fp32_by_default():
    plain = RunnerConfig.from_model_config(_encoder_config())
    assert (plain.runtime, plain.inference_precision) == ("onnxruntime", "fp32")
    ov = RunnerConfig.from_model_config(_encoder_config(runtime="openvino", inference_precision="bf16"))
    assert (ov.runtime, ov.inference_precision) == ("openvino", "bf16")


@pytest.mark.parametrize("params, message", [
    ({"runtime": "tensorflow"}, r"parameter 'runtime' must be one of \['onnxruntime', 'openvino'\], got 'tensorflow'"),
    ({"inference_precision": "bf16"}, r"parameter 'inference_precision' 'bf16' is not one onnxruntime runs"),
    ({"runtime": "openvino", "inference_precision": "int4"}, r"parameter 'inference_precision' 'int4' is not one openvino runs"),
])
def test_runner_config_refuses_an_unknown_runtime_or_precision_naming_the_model(params, message):
    with pytest.raises(ConfigurationError, match=r"model 'minilm_encoder': " + message):
        RunnerConfig.from_model_config(_encoder_config(**params))


def test_openvino_instances_are_never_pinned_to_cores():
    # Two stub processes pinned by OpenVINO's default land on the same core: 186 vs 358 texts/s.
    props = openvino_properties(1, "bf16")
    assert props["ENABLE_CPU_PINNING"] is False
    assert props["INFERENCE_NUM_THREADS"] == 1 and props["NUM_STREAMS"] == 1
    assert props["INFERENCE_PRECISION_HINT"] == "bf16"
    assert openvino_properties(0, "fp32")["INFERENCE_PRECISION_HINT"] == "f32"
    assert openvino_properties(0, "fp32")["INFERENCE_NUM_THREADS"] == 1


# --- real OpenVINO on small graphs -----------------------------------------------------------


def test_openvino_fp32_session_matches_onnx_runtime_through_the_runner(tmp_path):
    _masked_mean_model(tmp_path / "model.onnx")
    config = RunnerConfig.from_model_config(_encoder_config(runtime="openvino"))
    ov_runner = OnnxRunner(config, make_session(tmp_path / "model.onnx", 1, runtime="openvino"))
    ort_runner = OnnxRunner(RunnerConfig.from_model_config(_encoder_config()),
                            make_session(tmp_path / "model.onnx", 1))
    rng = np.random.default_rng(3)
    requests = []
    for rows, length in ((1, 5), (3, 9), (2, 1)):
        ids = rng.integers(1, 50, (rows, length), dtype=np.int64)
        requests.append({"input_ids": ids, "attention_mask": np.ones_like(ids)})
    ov_out, ort_out = ov_runner.run(requests), ort_runner.run(requests)
    for a, b in zip(ov_out, ort_out):
        np.testing.assert_allclose(a["embedding"], b["embedding"], atol=1e-5)
        assert a["embedding"].dtype == np.float32


def test_openvino_outputs_are_copies_that_the_next_run_does_not_overwrite(tmp_path):
    weight = _linear_model(tmp_path / "linear.onnx")
    session = OpenVinoSession(tmp_path / "linear.onnx", 1)
    first_in = np.ones((2, 3), np.float32)
    (first,) = session.run(["logits"], {"pixel_values": first_in})
    kept = first.copy()
    session.run(["logits"], {"pixel_values": np.full((2, 3), 7, np.float32)})
    np.testing.assert_array_equal(first, kept)
    np.testing.assert_allclose(first, first_in @ weight, atol=1e-5)
    assert [t.name for t in session.get_inputs()] == ["pixel_values"]
    assert [t.name for t in session.get_outputs()] == ["logits"]


def test_an_openvino_failure_fails_only_the_request_that_causes_it(tmp_path):
    weight = _linear_model(tmp_path / "linear.onnx")
    config = RunnerConfig.from_model_config({
        "name": "linear", "input": [{"name": "pixel_values", "data_type": "TYPE_FP32", "dims": ["3"]}],
        "output": [{"name": "logits", "data_type": "TYPE_FP32", "dims": ["2"]}],
        "parameters": {"runtime": {"string_value": "openvino"}},
    })
    runner = OnnxRunner(config, make_session(tmp_path / "linear.onnx", 1, runtime="openvino"))
    good = {"pixel_values": np.ones((1, 3), np.float32)}
    bad = {"pixel_values": np.ones((1, 4), np.float32)}  # rank-correct, wrong width
    results = runner.run([good, bad, good])
    assert isinstance(results[1], Exception) and "input 'pixel_values' must have shape" in str(results[1])
    for result in (results[0], results[2]):
        np.testing.assert_allclose(result["logits"], good["pixel_values"] @ weight, atol=1e-5)


# --- the built MiniLM ------------------------------------------------------------------------


@pytest.mark.torch
def test_built_bf16_encoder_runs_bf16_where_the_cpu_has_it_and_stays_close_to_fp32(built_repository):
    repository = Path(built_repository)
    folder = repository / "minilm_encoder_bf16"
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    config = json_format.MessageToDict(
        text_format.Parse((folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()),
        preserving_proto_field_name=True)
    bf16 = load_runner(json.dumps(config), folder / "1")
    exact = OnnxRunner(bf16.config, make_session(folder / "1" / "model.onnx", 1))
    manifest = json.loads((repository / "build_manifest.json").read_text())
    record = manifest["models"]["minilm_encoder_bf16"]["optimization"]
    if _bf16_on_this_cpu():
        assert bf16.session.precision == "bf16" and record["runs_as"] == "bf16"
    else:
        assert bf16.session.precision == "f32" and record["runs_as"] == "f32"
    assert record["quality"]["min_cosine"] >= 0.99 and record["quality"]["neighbour_agreement"] >= 0.9
    rng = np.random.default_rng(5)
    requests = []
    for rows, length in ((1, 4), (4, 17), (2, 64)):
        ids = np.concatenate([np.full((rows, 1), 101), rng.integers(1000, 20000, (rows, length - 2)),
                              np.full((rows, 1), 102)], axis=1).astype(np.int64)
        requests.append({"input_ids": ids, "attention_mask": np.ones_like(ids)})
    for a, b in zip(bf16.run(requests), exact.run(requests)):
        x, y = a["embedding"], b["embedding"]
        cosine = (x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))
        assert cosine.min() >= 0.99, cosine


def test_the_calibration_texts_are_an_input_of_the_int8_build_and_of_no_other(tmp_path):
    # A changed calibration file must rebuild the int8 encoder (its fingerprint holds the file's hash).
    from tools.build_repo.fingerprints import quality_files

    spec = load_spec(ROOT / "repository.yaml")
    files = quality_files(spec, spec.find("minilm_encoder_int8"))
    assert set(files) == {"texts", "tokenizer", "calibration_texts"}
    assert set(quality_files(spec, spec.find("minilm_encoder_bf16"))) == {"texts", "tokenizer"}
    data = project_spec()
    other = tmp_path / "calibration.txt"
    other.write_text("one text\nanother text\n", encoding="utf-8")
    cpu = data["models"]["minilm_encoder_int8"]["cpu"]
    cpu["calibration_texts"] = str(other)
    cpu["quality"]["texts"] = str(ROOT / cpu["quality"]["texts"])
    changed = load_spec(write_spec(tmp_path, data))
    assert quality_files(changed, changed.find("minilm_encoder_int8"))["calibration_texts"] != files["calibration_texts"]


def test_openvino_int8_with_no_calibration_text_left_is_an_error_naming_the_field(tmp_path):
    # Every calibration text is a held-out quality text: nothing is left to calibrate on.
    from tools.build_repo import onnx2ov_int8, quality_sets
    from tools.errors import ExportError

    spec = load_spec(ROOT / "repository.yaml").find("minilm_encoder_int8")
    nothing = quality_sets.Calibration((), (), left_out=3)
    empty = quality_sets.QualitySet((), (), ())
    with pytest.raises(ExportError, match=r"model 'minilm_encoder_int8': field "
                                          r"'cpu.calibration_texts' holds no text outside the "
                                          r"held-out quality texts"):
        onnx2ov_int8.quantize_openvino(tmp_path / "absent.onnx", tmp_path / "q.xml", spec, nothing,
                                       empty)
    assert not (tmp_path / "q.xml").exists()


def test_calibration_batches_are_length_sorted_and_padded_to_their_longest():
    from tools.build_repo.onnx2ov_int8 import calibration_batches

    encodings = [([1] * n, [1] * n) for n in (5, 2, 9, 3)]
    batches = list(calibration_batches(encodings, batch=2))
    assert [b["input_ids"].shape for b in batches] == [(2, 3), (2, 9)]
    assert batches[0]["attention_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
    assert batches[1]["input_ids"].dtype == np.int64


def _matmul_weights(model) -> list[np.ndarray]:
    """The int8 weight constants of an OpenVINO IR's MatMuls (Constant i8 -> Convert ->
    [Subtract] -> Multiply -> MatMul)."""
    import openvino

    found = []
    for op in model.get_ordered_ops():
        if op.get_type_name() != "Constant" or op.get_element_type() != openvino.Type.i8:
            continue
        frontier, reaches = [op], False
        for _ in range(4):
            frontier = [i.get_node() for node in frontier for i in node.output(0).get_target_inputs()]
            if any(node.get_type_name() == "MatMul" for node in frontier):
                reaches = True
                break
        if reaches:
            found.append(op.get_data())
    return found


@pytest.mark.torch
def test_built_int8_encoder_has_the_weight_width_this_cpu_sums_exactly(built_repository):
    # Without VNNI, 8-bit weights saturate OpenVINO's int16 pair sums (MiniLM fell to cosine
    # 0.912 on an AVX2-only EPYC): the build quantizes them to 7 bits there, and says so.
    import openvino

    from tools import cpu_isa

    repository = Path(built_repository)
    manifest = json.loads((repository / "build_manifest.json").read_text())
    quantize = manifest["models"]["minilm_encoder_int8"]["optimization"]["quantize"]
    bits = cpu_isa.int8_weights_bits(cpu_isa.cpu_flags())
    assert quantize["weights_bits"] == bits
    model = openvino.Core().read_model(str(repository / "minilm_encoder_int8" / "1" / "model.int8.xml"))
    weights = _matmul_weights(model)
    assert len(weights) == quantize["quantized"] - 12  # 6 layers x 2 activation x activation MatMuls
    widest = max(int(np.abs(w.astype(np.int32)).max()) for w in weights)
    assert widest <= 64 if bits == 7 else widest > 64, widest
    assert cpu_isa.mismatches(repository) == []
