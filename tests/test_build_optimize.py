"""The cpu target's optimisation stages: fuse (parity), int8 (task-quality gate), and their errors.

Graph-level checks use tiny ONNX graphs built here; the MiniLM stages run on the real export in
the torch tier.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from spec_helpers import project_spec, write_spec
from tools import cpu_isa
from tools.build_repo import onnx2fused, onnx2int8
from tools.build_repo.spec import load_spec
from tools.errors import ExportError, SpecError

ROOT = Path(__file__).resolve().parents[1]


_project = project_spec
_write = write_spec


def _matmul_graph(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="/dense/MatMul")], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], [weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


# --- spec ------------------------------------------------------------------------------------


def test_int8_without_a_quality_set_names_the_model_and_field(tmp_path):
    data = _project()
    data["models"]["minilm_encoder_int8"]["cpu"].pop("quality")
    with pytest.raises(SpecError, match=r"model 'minilm_encoder_int8': field 'cpu.quality' is required"):
        load_spec(_write(tmp_path, data))


def test_int8_on_a_model_without_one_embedding_like_output_names_the_field(tmp_path):
    data = _project()
    entry = data["models"]["minilm_encoder_int8"]
    entry["outputs"].append({"name": "tokens", "dtype": "int64", "shape": ["batch", 1]})
    with pytest.raises(SpecError) as info:
        load_spec(_write(tmp_path, data))
    assert "model 'minilm_encoder_int8': field 'cpu.optimize'" in str(info.value)
    assert "embedding-like" in str(info.value)


def test_the_served_text_pipelines_use_the_fused_and_the_int8_encoder():
    spec = load_spec(ROOT / "repository.yaml")
    assert spec.find("minilm_encoder").cpu.optimize == "none", "fusion did not win here"
    int8 = spec.find("minilm_encoder_int8").cpu
    assert (int8.optimize, int8.runtime) == ("int8", "openvino"), "static int8 won here"
    steps = {p.name: [s.model for s in p.steps] for p in spec.pipelines}
    assert steps["text_embedding"] == ["text_tokenizer", "minilm_encoder"]
    assert steps["text_embedding_int8"] == ["text_tokenizer", "minilm_encoder_int8"]


# --- stages on tiny graphs -------------------------------------------------------------------


def test_a_quantize_exclude_pattern_that_matches_no_node_is_an_error_naming_it(tmp_path):
    spec = load_spec(ROOT / "repository.yaml").find("minilm_encoder_int8")
    source = _matmul_graph(tmp_path / "tiny.onnx")
    import dataclasses

    typo = dataclasses.replace(spec, cpu=dataclasses.replace(spec.cpu, quantize_exclude=("/dense/MatMull",)))
    with pytest.raises(ExportError, match=r"'cpu.quantize_exclude': '/dense/MatMull' matches no"):
        onnx2int8.quantize_onnx(source, tmp_path / "q.onnx", typo)
    assert not (tmp_path / "q.onnx").exists()


def test_quantize_keeps_excluded_nodes_fp32_and_quantizes_the_rest(tmp_path):
    import dataclasses

    import onnx

    spec = load_spec(ROOT / "repository.yaml").find("minilm_encoder_int8")
    source = _matmul_graph(tmp_path / "tiny.onnx")
    plain = dataclasses.replace(spec, cpu=dataclasses.replace(spec.cpu, quantize_exclude=()))
    kept = dataclasses.replace(spec, cpu=dataclasses.replace(spec.cpu, quantize_exclude=("/dense/*",)))

    quantized = onnx2int8.quantize_onnx(source, tmp_path / "q.onnx", plain)
    untouched = onnx2int8.quantize_onnx(source, tmp_path / "k.onnx", kept)

    assert quantized.quantized == ("/dense/MatMul",) and quantized.kept_fp32 == ()
    assert "MatMulInteger" in {n.op_type for n in onnx.load(tmp_path / "q.onnx").graph.node}
    assert untouched.kept_fp32 == ("/dense/MatMul",)
    assert {n.op_type for n in onnx.load(tmp_path / "k.onnx").graph.node} == {"MatMul"}


def test_fusing_a_graph_that_is_no_transformer_is_an_error_naming_the_field(tmp_path):
    spec = load_spec(ROOT / "repository.yaml").find("minilm_encoder")
    with pytest.raises(ExportError, match=r"field 'cpu.optimize': the bert optimizer fused no operator"):
        onnx2fused.fuse_onnx(_matmul_graph(tmp_path / "tiny.onnx"), tmp_path / "f.onnx", spec)


# --- the real MiniLM export ------------------------------------------------------------------


@pytest.mark.torch
def test_built_int8_minilm_records_its_calibration_and_quality_and_serves_the_int8_ir(built_repository):
    import json

    manifest = json.loads((built_repository / "build_manifest.json").read_text())["models"]
    entry = manifest["minilm_encoder_int8"]
    record = entry["optimization"]
    assert (record["runtime"], record["level"], record["precision"]) == ("openvino", "int8", "fp32")
    quantize = record["quantize"]
    assert quantize["kept_fp32"] == [f"/encoder/encoder/layer.{i}/output/dense/MatMul" for i in range(6)]
    assert quantize["quantized"] == 42, "the other 6 MatMuls of each of the 6 layers, and the head's none"
    # 4 of the 418 load-test texts are held-out quality texts: calibration leaves them out, and
    # takes the 61 tune texts of the degenerate family (cpu.calibrate_on_tune) instead
    assert (quantize["calibration_texts"], quantize["left_out_as_held_out"],
            quantize["tune_texts_added"], quantize["smooth_quant_alpha"]) == (475, 4, 61, 0.5)
    quality = record["quality"]
    assert quality["neighbour_agreement"] >= 0.9 and quality["texts"] == 380
    families = {f["family"]: f for f in quality["families"]}
    assert len(families) == 17 and families["form:degenerate"]["texts"] == 98
    assert {f["status"] for f in families.values()} == {"pass"} and quality["waivers"] == []
    assert min(f["held_out_min_cosine"] for f in families.values()) >= 0.99
    # every length from the set's shortest text to its longest ran alone: 71 as texts, 183 swept
    sweep = quality["length_sweep"]
    assert (sweep["lengths"], sweep["swept"], sweep["below_bound"]) == ([3, 256], 183, [])
    assert sweep["min_cosine"] >= 0.99 and 3 <= sweep["worst_length"] <= 256
    assert "optimization" not in manifest["minilm_encoder"], "the exact encoder serves model.onnx"
    version = built_repository / "minilm_encoder_int8" / "1"
    config = (built_repository / "minilm_encoder_int8" / "config.pbtxt").read_text()
    assert 'string_value: "model.int8.xml"' in config
    for name in ("model.int8.xml", "model.int8.bin", "model.int8.xml.reproduce.sh"):
        assert (version / name).is_file(), name
    assert {"1/model.int8.xml", "1/model.int8.bin"} <= set(entry["artifacts"])


# The system tier: a second int8 quantization of MiniLM (35 s); the integration tier serves the
# spec's int8 variant (tests/test_e2e_text.py).
@pytest.mark.system
@pytest.mark.torch
@pytest.mark.timeout(600)
def test_onnx_runtime_dynamic_int8_of_the_real_minilm_is_fused_gated_and_served_as_onnx(tmp_path):
    """The other int8 path (``runtime: onnxruntime``): the fused graph, quantized dynamically."""
    import json

    from tools.build_repo.pipeline import build_repository

    data = _project()
    cpu = data["models"]["minilm_encoder_int8"]["cpu"]
    for key in ("runtime", "precision", "calibration_texts", "smooth_quant_alpha",
                "calibrate_on_tune"):
        cpu.pop(key)
    # Only the fused attention is quantized: with the dense MatMuls int8 too, 7-bit weights (a
    # CPU without VNNI) missed the gate on punctuation-only texts (min cosine 0.989)
    cpu.update(attention_heads=12, hidden_size=384, quantize_exclude=[
        "/encoder/encoder/layer.?/intermediate/dense/MatMul", "/encoder/encoder/layer.?/output/dense/MatMul",
        "/encoder/encoder/layer.?/attention/output/dense/MatMul"])
    cpu["quality"]["texts"] = str(ROOT / "tools/models/data/quality_set.jsonl")
    data["backends"] = str(ROOT / "backends" / "python")
    output = tmp_path / "model_repository"
    build_repository(_write(tmp_path, data), output, only=["minilm_encoder_int8"], progress=False)

    entry = json.loads((output / "build_manifest.json").read_text())["models"]["minilm_encoder_int8"]
    assert entry["optimization"]["fused"]["Attention"] == 6, "the int8 input is the fused graph"
    assert max(c["max_abs"] for c in entry["parity"]["onnxruntime_fused"]["cases"]) <= 1e-4
    quality = entry["optimization"]["quality"]
    assert quality["min_cosine"] >= 0.99 and quality["neighbour_agreement"] >= 0.9
    # 7-bit weights (reduce_range) where this CPU's u8 x s8 sums would saturate
    assert entry["optimization"]["quantize"]["weights_bits"] == cpu_isa.int8_weights_bits(cpu_isa.cpu_flags())
    assert 'string_value: "model.int8.onnx"' in (output / "minilm_encoder_int8" / "config.pbtxt").read_text()
    for name in ("model.int8.onnx", "model.int8.onnx.reproduce.sh"):
        assert (output / "minilm_encoder_int8" / "1" / name).is_file(), name


# The system tier: minutes of NNCF quantization. The gate's refusals on synthetic variants are
# the fast tier's (tests/test_quality_sets.py), a real int8 build that passes the integration's.
@pytest.mark.system
@pytest.mark.torch
@pytest.mark.timeout(600)
def test_the_issue_13_int8_recipe_is_refused_on_the_degenerate_family_and_not_written(
        tmp_path, built_repository):
    """NNCF's preset (SmoothQuant 0.95) calibrated on the load-test texts alone: a long run of one
    repeated word falls to cosine ~0.944 (issue 27). The gate names the family and the text."""
    from tools.build_repo.pipeline import build_repository
    from tools.build_repo.quality import QualityError

    output = tmp_path / "model_repository"
    shutil.copytree(built_repository, output)
    before = sorted(p.relative_to(output) for p in output.rglob("*"))
    data = _project()
    cpu = data["models"]["minilm_encoder_int8"]["cpu"]
    for key in ("smooth_quant_alpha", "calibrate_on_tune"):
        cpu.pop(key)
    cpu["quality"]["texts"] = str(ROOT / "tools/models/data/quality_set.jsonl")
    cpu["calibration_texts"] = str(ROOT / "loadtests/data/texts.txt")
    data["backends"] = str(ROOT / "backends" / "python")
    spec = _write(tmp_path, data)

    with pytest.raises(QualityError) as info:
        build_repository(spec, output, only=["minilm_encoder_int8"], progress=False)
    message = str(info.value)
    assert "model 'minilm_encoder_int8': the int8 quality gate failed: " in message
    # the worst degenerate text: a repeated word with 8-bit weights (VNNI), a run of dots with
    # the 7-bit ones a CPU without VNNI gets
    degenerate = re.search(r"form:degenerate min cosine (0\.\d+) < 0\.99 on \d+ of 98 texts \(worst: "
                           r"text (\d+) of 98 in form:degenerate \(\S+quality_set\.jsonl:(\d+), "
                           r"(repeat_word|punctuation)\): '", message)
    assert degenerate, message
    assert float(degenerate[1]) < 0.96
    rows = {f.family: f for f in info.value.report.families}
    assert rows["form:degenerate"].worst.index == int(degenerate[2])
    assert {f for f, r in rows.items() if r.status == "FAIL"} >= {"form:degenerate", "script:latin"}
    forms = [r for f, r in rows.items() if f.startswith("form:")]
    assert min(forms, key=lambda r: r.min_cosine).family == "form:degenerate"
    if cpu_isa.has_vnni(cpu_isa.cpu_flags()):  # measured there: only the degenerate text fails
        assert rows["form:prose"].status == "pass"
    assert sorted(p.relative_to(output) for p in output.rglob("*")) == before
