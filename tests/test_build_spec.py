"""The repository spec is parsed strictly: every error names the file, the model and the field.

No torch needed: these tests only parse YAML.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tools.build_repo.spec import load_spec, parse_spec
from tools.errors import SpecError, UserInputError

REPO_ROOT = Path(__file__).resolve().parents[1]


def _project_spec() -> dict:
    return yaml.safe_load((REPO_ROOT / "repository.yaml").read_text())


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "repository.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_project_spec_parses_with_the_contract_models():
    spec = load_spec(REPO_ROOT / "repository.yaml")
    assert {m.name for m in spec.models} == {"minilm_encoder", "efficientnet_lite0"}
    assert {m.name for m in spec.python_models} == {
        "text_tokenizer", "image_preprocess", "image_postprocess"
    }
    assert {p.name for p in spec.pipelines} == {"text_embedding", "image_classification"}
    encoder = spec.find("minilm_encoder")
    assert [t.dims for t in encoder.inputs] == [(-1,), (-1,)]
    assert encoder.outputs[0].dims == (384,)


def test_spec_error_names_file_model_and_field_when_a_field_is_misspelt(tmp_path):
    data = _project_spec()
    batching = data["models"]["minilm_encoder"]["dynamic_batching"]
    batching["max_queue_delay_micros"] = batching.pop("max_queue_delay_microseconds")
    path = _write(tmp_path, data)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert str(path) in message
    assert "model 'minilm_encoder'" in message
    assert "dynamic_batching.max_queue_delay_micros" in message
    assert "max_queue_delay_microseconds" in message  # the suggestion


def test_spec_error_names_the_field_when_a_value_has_the_wrong_type(tmp_path):
    data = _project_spec()
    data["models"]["efficientnet_lite0"]["max_batch_size"] = "sixteen"
    with pytest.raises(SpecError, match=r"model 'efficientnet_lite0': field 'max_batch_size' must be an integer"):
        load_spec(_write(tmp_path, data))


def test_spec_error_names_the_python_model_when_a_tensor_dtype_is_unknown(tmp_path):
    data = _project_spec()
    data["python_models"]["text_tokenizer"]["outputs"][0]["dtype"] = "int65"
    with pytest.raises(SpecError, match=r"python model 'text_tokenizer': field 'outputs\[0\]\.dtype'"):
        load_spec(_write(tmp_path, data))


def test_spec_rejects_instances_when_threads_exceed_the_cores(tmp_path):
    data = _project_spec()
    data["models"]["minilm_encoder"]["instances"]["cpu"] = {"count": 2, "intra_op_threads": 2}
    with pytest.raises(SpecError, match=r"minilm_encoder.*instances\.cpu.*exceeds cpu_cores 2"):
        load_spec(_write(tmp_path, data))


def test_spec_rejects_a_dynamic_axis_without_a_range(tmp_path):
    data = _project_spec()
    data["models"]["minilm_encoder"]["axes"] = {}
    with pytest.raises(SpecError, match=r"minilm_encoder.*uses axis 'sequence', not declared"):
        load_spec(_write(tmp_path, data))


def test_spec_rejects_parity_with_a_single_length(tmp_path):
    data = _project_spec()
    data["models"]["minilm_encoder"]["axes"]["sequence"]["parity"] = [16, 16]
    with pytest.raises(SpecError, match=r"field 'axes\.sequence\.parity' must list at least two"):
        load_spec(_write(tmp_path, data))


def test_spec_rejects_an_unknown_top_level_key(tmp_path):
    data = _project_spec() | {"modles": {}}
    with pytest.raises(SpecError, match=r"field 'modles' is not a known field; did you mean 'models'"):
        load_spec(_write(tmp_path, data))


def test_spec_error_is_user_input_when_the_file_is_missing(tmp_path):
    with pytest.raises(UserInputError, match="cannot read the spec"):
        load_spec(tmp_path / "nope.yaml")


def test_parity_batches_are_one_middle_and_max_when_max_batch_size_is_large():
    spec = parse_spec(_project_spec(), REPO_ROOT / "repository.yaml")
    assert spec.find("minilm_encoder").parity_batches == (1, 8, 32)


def test_python_model_preferred_batch_size_above_max_batch_size_is_refused_naming_the_field(
    tmp_path,
):
    root = Path(__file__).resolve().parents[1]
    data = yaml.safe_load((root / "repository.yaml").read_text())
    data["python_models"]["text_tokenizer"]["dynamic_batching"]["preferred_batch_size"] = [64]
    path = tmp_path / "repository.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match=r"python model 'text_tokenizer'.*preferred_batch_size.*64"):
        load_spec(path)
