"""``tools.cpu_isa``: which CPUs sum int8 products exactly, the weight width an int8 build gets on
each, and the warning ``tools serve`` gives for an 8-bit int8 model on a CPU without VNNI."""

from __future__ import annotations

import pytest

from tools import cpu_isa
from tools.manifest import MANIFEST_NAME, Manifest, ModelEntry, ModelKind

ZEN3 = "fpu vme sse sse2 avx avx2 fma bmi2 vaes"  # AMD EPYC 7003: AVX2, no AVX-512, no VNNI
ZEN4 = ZEN3 + " avx512f avx512bw avx512_vnni avx512_bf16"
ALDER_LAKE = ZEN3 + " avx_vnni"
SAPPHIRE_RAPIDS = ZEN4 + " amx_bf16 amx_int8 amx_tile"


def _cpuinfo(tmp_path, flags: str):
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: {flags}\n\n"
                    f"processor\t: 1\nflags\t\t: {flags}\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("flags, vnni, bits", [
    (ZEN3, False, 7), (ZEN4, True, 8), (ALDER_LAKE, True, 8), (SAPPHIRE_RAPIDS, True, 8),
    ("avx512f avx512bw", False, 7),  # AVX-512 without VNNI (Skylake-SP) saturates too
])
def test_only_a_cpu_with_vnni_or_amx_gets_8_bit_int8_weights(tmp_path, flags, vnni, bits):
    read = cpu_isa.cpu_flags(_cpuinfo(tmp_path, flags))
    assert read == frozenset(flags.split())
    assert cpu_isa.has_vnni(read) is vnni
    assert cpu_isa.int8_weights_bits(read) == bits


def test_a_cpu_whose_flags_cannot_be_read_gets_the_width_that_is_exact_everywhere(tmp_path):
    assert cpu_isa.cpu_flags(tmp_path / "absent") is None
    (tmp_path / "no-flags").write_text("processor\t: 0\n", encoding="utf-8")
    assert cpu_isa.cpu_flags(tmp_path / "no-flags") is None
    assert cpu_isa.int8_weights_bits(None) == 7


def _repository(tmp_path, **bits_by_model):
    models = {}
    for name, bits in bits_by_model.items():
        models[name] = ModelEntry(kind=ModelKind.PYTORCH, target="cpu", optimization={
            "level": "int8", "runtime": "openvino", "quantize": {"weights_bits": bits}})
    models["plain"] = ModelEntry(kind=ModelKind.PYTORCH, target="cpu")
    (tmp_path / MANIFEST_NAME).write_text(Manifest(spec="s", target="cpu", models=models).to_text(),
                                          encoding="utf-8")
    return tmp_path


def test_serve_warns_of_an_8_bit_int8_model_on_a_cpu_without_vnni_naming_the_rebuild(tmp_path):
    repository = _repository(tmp_path, enc_int8=8, enc_safe=7)
    lines = cpu_isa.mismatches(repository, frozenset(ZEN3.split()))
    assert len(lines) == 1
    assert lines[0].startswith("model 'enc_int8': its int8 weights are 8-bit")
    assert "tools build-repo --only enc_int8 --force" in lines[0]
    assert cpu_isa.mismatches(repository, frozenset(ZEN4.split())) == []


def test_serve_warns_of_an_8_bit_onnx_runtime_int8_model_too(tmp_path):
    """``runtime: onnxruntime`` int8 (dynamic, ``reduce_range`` at 7 bits) records no runtime."""
    models = {"ort_int8": ModelEntry(kind=ModelKind.PYTORCH, target="cpu", optimization={
        "level": "int8", "fused": {}, "quantize": {"quantized": 36, "weights_bits": 8}})}
    (tmp_path / MANIFEST_NAME).write_text(Manifest(spec="s", target="cpu", models=models).to_text(),
                                          encoding="utf-8")
    lines = cpu_isa.mismatches(tmp_path, frozenset(ZEN3.split()))
    assert [line.split(":")[0] for line in lines] == ["model 'ort_int8'"]


def test_no_warning_without_a_readable_manifest(tmp_path):
    assert cpu_isa.mismatches(tmp_path, frozenset(ZEN3.split())) == []
    (tmp_path / MANIFEST_NAME).write_text("{not json", encoding="utf-8")
    assert cpu_isa.mismatches(tmp_path, frozenset(ZEN3.split())) == []
