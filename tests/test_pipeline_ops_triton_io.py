"""The glue every model.py shares: config parameters, request inputs, per-request responses.

``pb_utils`` exists only inside a Python-backend stub, so these tests hand the functions a small
stand-in with the same four names; the real one is exercised by the tests/test_e2e_*.py files.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from pipeline_ops import text, topk, triton_io
from pipeline_ops.errors import ConfigurationError, InvalidInput, Overloaded


class _Tensor:
    def __init__(self, name, value):
        self.name, self.value = name, value

    def as_numpy(self):
        return self.value


class _Error:
    INVALID_ARG = "INVALID_ARG"
    INTERNAL = "INTERNAL"
    UNAVAILABLE = "UNAVAILABLE"

    def __init__(self, message, code):
        self.message, self.code = message, code


class _Response:
    def __init__(self, output_tensors=None, error=None):
        self.output_tensors, self.error = output_tensors, error


def _pb_utils(requests_inputs):
    by_request = {id(r): r for r in requests_inputs}

    def get_input_tensor_by_name(request, name):
        value = by_request[id(request)].get(name)
        return None if value is None else _Tensor(name, value)

    return SimpleNamespace(
        get_input_tensor_by_name=get_input_tensor_by_name,
        Tensor=_Tensor,
        TritonError=_Error,
        InferenceResponse=_Response,
    )


def test_parameters_reads_string_values_from_a_json_config():
    config = json.dumps({"parameters": {"top_k": {"string_value": "3"}, "x": {}}})
    assert triton_io.parameters(config) == {"top_k": "3", "x": ""}


def test_request_inputs_gives_none_for_an_input_the_request_lacks():
    requests = [{"A": np.ones((1, 2))}, {}]
    inputs = triton_io.request_inputs(_pb_utils(requests), requests, ["A"])
    assert inputs[0]["A"].shape == (1, 2)
    assert inputs[1] == {"A": None}


def test_responses_turn_an_exception_into_that_requests_invalid_arg_error_only():
    results = [{"Y": np.zeros((1, 3))}, InvalidInput("input 'A': empty"), {"Y": np.ones((2, 3))}]
    answers = triton_io.responses(_pb_utils([]), results)
    assert [a.error is None for a in answers] == [True, False, True]
    assert answers[1].error.code == "INVALID_ARG" and "input 'A': empty" in answers[1].error.message
    assert answers[2].output_tensors[0].name == "Y"
    assert answers[2].output_tensors[0].value.shape == (2, 3)


def test_responses_turn_a_failure_of_the_model_into_that_requests_internal_error_only():
    failure = RuntimeError("model 'minilm_encoder': ONNX Runtime failed: idx out of range")
    answers = triton_io.responses(_pb_utils([]), [{"Y": np.zeros((1, 3))}, failure])
    assert answers[0].error is None
    assert answers[1].error.code == "INTERNAL" and "ONNX Runtime failed" in answers[1].error.message


def test_responses_turn_a_refusal_at_admission_into_that_requests_unavailable_error_only():
    answers = triton_io.responses(_pb_utils([]), [{"Y": np.zeros((1, 3))}, Overloaded("overloaded")])
    assert answers[0].error is None
    assert answers[1].error.code == "UNAVAILABLE" and answers[1].error.message == "overloaded"


def test_responses_name_the_exception_type_when_its_message_is_empty():
    (answer,) = triton_io.responses(_pb_utils([]), [KeyError()])
    assert answer.error.code == "INTERNAL" and answer.error.message == "KeyError"


def test_tokenizer_settings_name_the_model_and_parameter_when_max_length_is_not_a_number(
    tmp_path,
):
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ConfigurationError, match="model 'tok': parameter 'max_length'"):
        text.TokenizerSettings.from_parameters({"max_length": "many"}, tmp_path, "tok")


def test_tokenizer_settings_refuse_a_missing_tokenizer_file(tmp_path):
    with pytest.raises(ConfigurationError, match="tokenizer_file.*does not exist"):
        text.TokenizerSettings.from_parameters({}, tmp_path, "tok")


def test_tokenizer_settings_parse_buckets_and_limits(tmp_path):
    (tmp_path / "vocab.json").write_text("{}")
    params = {"tokenizer_file": "vocab.json", "max_length": "128", "length_buckets": "16,32"}
    settings = text.TokenizerSettings.from_parameters(params, tmp_path, "tok")
    assert settings.tokenizer_file == tmp_path / "vocab.json"
    assert (settings.max_length, settings.buckets) == (128, (16, 32))
    assert settings.max_text_bytes == text.DEFAULT_MAX_TEXT_BYTES


def _postprocess_config(classes: int, k: int) -> dict:
    outputs = [{"name": n, "dims": [k]} for n in topk.OUTPUTS]
    return {"name": "post", "input": [{"name": "logits", "dims": [classes]}], "output": outputs}


def test_postprocess_settings_load_labels_and_k_when_the_config_fits(tmp_path):
    (tmp_path / "labels.txt").write_text("# source\ncat\ndog\nfox\n")
    settings = topk.PostprocessSettings.from_model_config(
        _postprocess_config(3, 2), {"top_k": "2"}, tmp_path
    )
    assert settings.k == 2 and list(settings.labels) == [b"cat", b"dog", b"fox"]


def test_postprocess_settings_refuse_logits_dims_that_differ_from_the_label_count(tmp_path):
    (tmp_path / "labels.txt").write_text("cat\ndog\n")
    with pytest.raises(ConfigurationError, match="input 'logits' must have dims \\[2\\]"):
        topk.PostprocessSettings.from_model_config(
            _postprocess_config(1000, 2), {"top_k": "2"}, tmp_path
        )
