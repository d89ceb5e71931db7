"""Spec and SLO errors name the line and column of what is wrong (``file:line:column:``).

Each test breaks a copy of a real file and checks that the error points at the key or value at
fault, found in the text by the test itself; every problem of the file is still reported at once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.build_repo.spec import load_spec
from tools.errors import SpecError, UserInputError
from tools.slo import load_slo

REPO_ROOT = Path(__file__).resolve().parents[1]
SPEC_TEXT = (REPO_ROOT / "repository.yaml").read_text(encoding="utf-8")


def _at(text: str, line_holding: str, token: str) -> str:
    """``line:column`` (1-based) of ``token`` in the first line holding ``line_holding``."""
    lines = text.splitlines()
    index = next(i for i, line in enumerate(lines) if line_holding in line)
    return f"{index + 1}:{lines[index].index(token) + 1}"


def _spec_errors(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "repository.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    return str(caught.value).replace(f"{path.resolve()}:", "repository.yaml:").splitlines()


def test_a_misspelt_key_is_named_at_its_line_and_column_with_the_closest_known_key(tmp_path):
    text = SPEC_TEXT.replace("    opset: 17\n", "    opsett: 17\n", 1)
    assert _spec_errors(tmp_path, text) == [
        f"repository.yaml:{_at(text, 'opsett', 'opsett')}: model 'minilm_encoder': field "
        "'opsett' is not a known field; did you mean 'opset'?"
    ]


def test_a_bad_value_in_a_nested_list_item_is_named_at_the_value(tmp_path):
    line = "      - {name: attention_mask, dtype: int64, shape: [batch, sequence], pad_value: 0}"
    broken = line.replace("dtype: int64", "dtype: int46")
    text = SPEC_TEXT.replace(line, broken, 1)
    (error,) = _spec_errors(tmp_path, text)
    assert error.startswith(f"repository.yaml:{_at(text, broken, 'int46')}: model 'minilm_encoder': "
                            "field 'inputs[1].dtype' must be ")
    assert error.endswith("got 'int46'")


def test_a_missing_required_field_is_named_at_the_entry_that_lacks_it(tmp_path):
    text = SPEC_TEXT.replace("    backend: image_postprocess\n", "", 1)
    assert _spec_errors(tmp_path, text) == [
        f"repository.yaml:{_at(text, '  image_postprocess:', 'image_postprocess')}: python model "
        "'image_postprocess': field 'backend' is required"
    ]


def test_every_problem_is_still_reported_each_at_its_own_position(tmp_path):
    text = (SPEC_TEXT.replace("    opset: 17\n", "    opset: 11\n", 1)
            .replace("    opset: 17\n", "    opsett: 17\n", 1))
    assert _spec_errors(tmp_path, text) == [
        f"repository.yaml:{_at(text, 'opset: 11', '11')}: model 'minilm_encoder': field 'opset' "
        "must be >= 13, got 11",
        f"repository.yaml:{_at(text, 'opsett', 'opsett')}: model 'minilm_encoder_int8': field "
        "'opsett' is not a known field; did you mean 'opset'?",
    ]


def test_a_name_key_inside_an_entry_is_refused_like_any_unknown_key(tmp_path):
    # an entry's name is its key in the section; the loader fills it in, the file may not
    text = SPEC_TEXT.replace("    opset: 17\n", "    opset: 17\n    name: other\n", 1)
    assert _spec_errors(tmp_path, text) == [
        f"repository.yaml:{_at(text, 'name: other', 'name')}: model 'minilm_encoder': field "
        "'name' is not a known field (allowed: ['axes', 'cpu', 'dynamic_batching', 'gpu', "
        "'inputs', 'instances', 'max_batch_size', 'onnx', 'opset', 'outputs', 'recipe', "
        "'sample_inputs', 'source', 'targets', 'tolerance', 'version_policy', 'warmup', 'weights'])"
    ]


def test_text_that_is_not_yaml_is_named_at_the_line_and_column_the_parser_stopped(tmp_path):
    text = SPEC_TEXT.replace("    opset: 17\n", "    opset: [17\n", 1)
    (error,) = _spec_errors(tmp_path, text)
    # the flow sequence is still open at the next key: the parser stops there
    next_key = _at(text, "max_batch_size: 32", "max_batch_size").split(":")[0]
    assert error.startswith(f"repository.yaml:{next_key}:"), error
    assert "not valid YAML: expected ',' or ']'" in error


def test_a_key_given_twice_in_one_mapping_is_an_error_at_the_second(tmp_path):
    text = SPEC_TEXT.replace("    opset: 17\n", "    opset: 17\n    opset: 18\n", 1)
    (error,) = _spec_errors(tmp_path, text)
    assert error.startswith(f"repository.yaml:{_at(text, 'opset: 18', 'opset')}: not valid YAML: "
                            "found duplicate key \"opset\"")


# --- loadtests/slo.yaml: the same reading ------------------------------------------------------

SLO = """\
profiles:
  cpu:
    scenarios:
      text_embedding:
        load: {users: 2}
        http: {p99_ms: 10, max_error_ratio: 0, min_throughput_rps: 1}
        grpc:
          p99_msec: 10
          max_error_ratio: 2
          min_throughput_rps: 1
"""


def test_slo_errors_name_the_line_and_column_of_each_problem(tmp_path):
    path = tmp_path / "slo.yaml"
    path.write_text(SLO, encoding="utf-8")
    with pytest.raises(UserInputError) as caught:
        load_slo(path, "cpu", "text_embedding")
    lines = str(caught.value).replace(f"{path}:", "slo.yaml:").splitlines()
    assert sorted(lines) == sorted([
        f"slo.yaml:{_at(SLO, 'p99_msec', 'p99_msec')}: profiles.cpu.scenarios.text_embedding.grpc"
        ".p99_msec is not a known field; did you mean 'p99_ms'?",
        f"slo.yaml:{_at(SLO, 'max_error_ratio: 2', '2')}: profiles.cpu.scenarios.text_embedding"
        ".grpc.max_error_ratio must be <= 1.0, got 2",
        f"slo.yaml:{_at(SLO, 'grpc:', 'grpc')}: profiles.cpu.scenarios.text_embedding.grpc: "
        "missing p99_ms",
    ])
