"""Specification of pipeline_ops.onnx_session: config parsing, the session options, ragged padding,
length chunking, per-request validation (``max_dims`` included) and per-request run failures, on
small real ONNX graphs run by ONNX Runtime."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from pipeline_ops.batching import InvalidInput
from pipeline_ops.onnx_session import (
    TRITON_DTYPES,
    ConfigurationError,
    OnnxRunner,
    RunnerConfig,
    make_session,
    plan_chunks,
)

from tools.build_repo.spec import DTYPES

VOCAB, WIDTH, MAX_LENGTH = 50, 4, 64


def _token_model(path, name, seed, nodes, output):
    """A graph over ``input_ids`` and ``attention_mask``: ``masked`` = table[input_ids] * mask
    (``[batch, seq, WIDTH]``), then ``nodes`` ending in ``output``; returns the table."""
    table = np.random.default_rng(seed).normal(size=(VOCAB, WIDTH)).astype(np.float32)
    masked = [
        helper.make_node("Gather", ["table", "input_ids"], ["tokens"]),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "last"], ["mask3"]),
        helper.make_node("Mul", ["tokens", "mask3"], ["masked"]),
    ]
    graph = helper.make_graph(
        masked + nodes,
        name,
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [output],
        initializer=[
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(np.array([-1], np.int64), "last"),
            numpy_helper.from_array(np.array([1], np.int64), "one"),
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return table


def _masked_mean_model(path):
    """Mean of table[input_ids] over unmasked positions: padding-invariant, like MiniLM."""
    return _token_model(path, "masked_mean", 0, [
        helper.make_node("ReduceSum", ["masked", "one"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["mask3", "one"], ["count"], keepdims=0),
        helper.make_node("Div", ["summed", "count"], ["embedding"]),
    ], helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", WIDTH]))


def _per_token_model(path):
    """logits = table[input_ids] * mask: one row of ``WIDTH`` per token, as a token classifier."""
    return _token_model(path, "per_token", 4, [helper.make_node("Identity", ["masked"], ["logits"])],
                        helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                                      ["batch", "seq", WIDTH]))


def _linear_model(path):
    """logits = pixel_values @ W, fixed shape [batch, 3] -> [batch, 2]."""
    weight = np.arange(6, dtype=np.float32).reshape(3, 2)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["pixel_values", "w"], ["logits"])],
        "linear",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
        initializer=[numpy_helper.from_array(weight, "w")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return weight


def _encoder_config(**params):
    parameters = {
        "onnx_file": "model.onnx",
        "intra_op_threads": "1",
        "pad_values": json.dumps({"input_ids": 0, "attention_mask": 0}),
        "max_dims": json.dumps({"input_ids": [MAX_LENGTH], "attention_mask": [MAX_LENGTH]}),
        **params,
    }
    return {
        "name": "minilm_encoder",
        "max_batch_size": 64,
        "input": [
            {
                "name": "input_ids",
                "data_type": "TYPE_INT64",
                "dims": ["-1"],
                "allow_ragged_batch": True,
            },
            {
                "name": "attention_mask",
                "data_type": "TYPE_INT64",
                "dims": ["-1"],
                "allow_ragged_batch": True,
            },
        ],
        "output": [{"name": "embedding", "data_type": "TYPE_FP32", "dims": [str(WIDTH)]}],
        "parameters": {k: {"string_value": v} for k, v in parameters.items()},
    }


@pytest.fixture()
def encoder(tmp_path):
    def build(**params):
        table = _masked_mean_model(tmp_path / "model.onnx")
        config = RunnerConfig.from_model_config(json.dumps(_encoder_config(**params)))
        session = make_session(
            tmp_path / "model.onnx", config.intra_op_threads, config.inter_op_threads
        )
        return OnnxRunner(config, session), table

    return build


def _request(rows, rng):
    """One request: token rows of the given lengths, padded to the request's longest."""
    longest = max(rows)
    ids = np.zeros((len(rows), longest), np.int64)
    mask = np.zeros_like(ids)
    for i, n in enumerate(rows):
        ids[i, :n] = rng.integers(1, VOCAB, n)
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask}


def _expected(table, request):
    tokens = table[request["input_ids"]] * request["attention_mask"][..., None]
    return tokens.sum(axis=1) / request["attention_mask"].sum(axis=1, keepdims=True)


def test_from_model_config_reads_names_dtypes_dims_and_parameters():
    config = RunnerConfig.from_model_config(
        _encoder_config(intra_op_threads="2", inter_op_threads="1")
    )
    assert [s.name for s in config.inputs] == ["input_ids", "attention_mask"]
    assert config.inputs[0].dtype == np.int64 and config.inputs[0].dims == (-1,)
    assert config.outputs[0].dtype == np.float32 and config.outputs[0].dims == (WIDTH,)
    assert (config.intra_op_threads, config.inter_op_threads) == (2, 1)
    assert config.pad_values == {"input_ids": 0, "attention_mask": 0}
    assert config.max_dims == {"input_ids": (MAX_LENGTH,), "attention_mask": (MAX_LENGTH,)}
    assert config.onnx_file == "model.onnx"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"pad_values": "{}"}, "have variable dims but no entry in parameter 'pad_values'"),
        ({"pad_values": "{not json"}, "'pad_values' is not valid JSON"),
        ({"pad_values": "[0]"}, "'pad_values' must be a JSON object"),
        (
            {"pad_values": '{"input_ids": 0, "attention_mask": 0, "typo": 0}'},
            "unknown inputs ['typo']",
        ),
        ({"max_dims": "{}"}, "have variable dims but no entry in parameter 'max_dims'"),
        ({"max_dims": "[256]"}, "'max_dims' must be a JSON object"),
        (
            {"max_dims": '{"input_ids": [256], "attention_mask": [256], "typo": [1]}'},
            "'max_dims' names unknown inputs ['typo']",
        ),
        (
            {"max_dims": '{"input_ids": [256, 2], "attention_mask": [256]}'},
            "'max_dims' entry 'input_ids' must list a positive size for each of its dims [-1]",
        ),
        (
            {"max_dims": '{"input_ids": [0], "attention_mask": [256]}'},
            "'max_dims' entry 'input_ids' must list a positive size",
        ),
        ({"intra_op_threads": "two"}, "'intra_op_threads' must be an integer"),
        ({"inter_op_threads": "-1"}, "'inter_op_threads' must be >= 0"),
    ],
)
def test_from_model_config_raises_naming_model_and_parameter_when_malformed(params, message):
    with pytest.raises(ConfigurationError) as info:
        RunnerConfig.from_model_config(_encoder_config(**params))
    assert "model 'minilm_encoder'" in str(info.value) and message in str(info.value)


def test_from_model_config_raises_when_an_input_has_a_string_dtype():
    config = _encoder_config()
    config["input"][0]["data_type"] = "TYPE_STRING"
    with pytest.raises(ConfigurationError, match="input 'input_ids' has data_type 'TYPE_STRING'"):
        RunnerConfig.from_model_config(config)


def test_make_session_sets_threads_sequential_mode_no_spinning_and_no_memory_patterns(tmp_path):
    import onnxruntime as ort

    _linear_model(tmp_path / "m.onnx")
    options = make_session(tmp_path / "m.onnx", intra_op_threads=2).get_session_options()
    assert options.intra_op_num_threads == 2 and options.inter_op_num_threads == 1
    assert options.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options.get_session_config_entry("session.inter_op.allow_spinning") == "0"
    assert options.enable_mem_pattern is False  # planned per shape and kept: only memory here


def test_runner_raises_when_config_names_an_input_missing_from_the_graph(tmp_path):
    _masked_mean_model(tmp_path / "model.onnx")
    config = _encoder_config()
    config["input"][1]["name"] = "token_type_ids"
    config["parameters"]["pad_values"]["string_value"] = json.dumps(
        {"input_ids": 0, "token_type_ids": 0}
    )
    config["parameters"]["max_dims"]["string_value"] = json.dumps(
        {"input_ids": [8], "token_type_ids": [8]}
    )
    parsed = RunnerConfig.from_model_config(config)
    with pytest.raises(
        ConfigurationError, match=r"config inputs \['token_type_ids'\] are not in model.onnx"
    ):
        OnnxRunner(parsed, make_session(tmp_path / "model.onnx", 1))


@pytest.mark.parametrize("run_overhead", ["0", "40", "1"])
def test_runner_pads_ragged_requests_and_matches_per_request_results(encoder, run_overhead):
    runner, table = encoder(run_overhead=run_overhead)
    rng = np.random.default_rng(1)
    requests = [_request(rows, rng) for rows in ([3], [17, 2], [9], [1, 1, 30], [12])]

    results = runner.run(requests)

    assert [len(r["embedding"]) for r in results] == [1, 2, 1, 3, 1]
    for request, result in zip(requests, results):
        np.testing.assert_allclose(
            result["embedding"], _expected(table, request), rtol=1e-5, atol=1e-6
        )
        assert result["embedding"].dtype == np.float32


class RecordingSession:
    """Wraps a session and records the shape of every ``input_ids`` it is fed."""

    def __init__(self, inner):
        self.inner, self.shapes = inner, []

    def run(self, names, feed):
        self.shapes.append(feed["input_ids"].shape)
        return self.inner.run(names, feed)


def test_runner_runs_length_homogeneous_chunks_when_lengths_vary(encoder):
    runner, table = encoder(run_overhead="4")
    runner.session = RecordingSession(runner.session)
    rng = np.random.default_rng(2)
    requests = [_request([2], rng), _request([40], rng), _request([3], rng), _request([41], rng)]

    results = runner.run(requests)

    assert sorted(runner.session.shapes) == [(2, 3), (2, 41)]
    for request, result in zip(requests, results):
        np.testing.assert_allclose(result["embedding"], _expected(table, request), rtol=1e-5)


@pytest.mark.parametrize("run_overhead", ["0", "40"])
def test_runner_feeds_the_session_only_real_tokens_when_the_client_sends_padding(
    encoder, run_overhead
):
    runner, table = encoder(run_overhead=run_overhead)
    runner.session = RecordingSession(runner.session)
    rng = np.random.default_rng(3)
    request = _request([5], rng)
    padded = {k: np.pad(v, ((0, 0), (0, 20))) for k, v in request.items()}
    (result,) = runner.run([padded])
    assert runner.session.shapes == [(1, 5)]  # not (1, 25): the 20 padded positions were cut
    np.testing.assert_allclose(result["embedding"], _expected(table, request), rtol=1e-5)


def test_runner_rejects_a_request_longer_than_max_dims_naming_the_input_and_the_limit(encoder):
    runner, table = encoder()
    runner.session = RecordingSession(runner.session)
    rng = np.random.default_rng(5)
    good = [_request([4], rng), _request([MAX_LENGTH, 3], rng)]  # exactly at the limit
    too_long = _request([MAX_LENGTH + 1], rng)

    results = runner.run([good[0], too_long, good[1]])

    assert isinstance(results[1], InvalidInput)
    message = str(results[1])
    assert "input 'input_ids'" in message and f"limit of {MAX_LENGTH}" in message
    assert str(MAX_LENGTH + 1) in message
    for request, result in zip(good, (results[0], results[2])):
        np.testing.assert_allclose(result["embedding"], _expected(table, request), rtol=1e-5)
    assert all(width <= MAX_LENGTH for _, width in runner.session.shapes)


def test_runner_fails_only_the_request_onnx_runtime_fails_on_when_an_id_is_out_of_vocabulary(
    encoder,
):
    runner, table = encoder()
    rng = np.random.default_rng(6)
    good = [_request([4], rng), _request([7, 2], rng)]
    bad = _request([5], rng)
    bad["input_ids"][0, 2] = 10**6  # Gather of the embedding table fails for the whole run

    results = runner.run([good[0], bad, good[1]])

    assert isinstance(results[1], RuntimeError) and not isinstance(results[1], InvalidInput)
    assert "model 'minilm_encoder': ONNX Runtime failed" in str(results[1])
    for request, result in zip(good, (results[0], results[2])):
        np.testing.assert_allclose(result["embedding"], _expected(table, request), rtol=1e-5)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda r: {**r, "input_ids": r["input_ids"].astype(np.int32)},
            "input 'input_ids' must have dtype int64, got int32",
        ),
        (
            lambda r: {**r, "attention_mask": r["attention_mask"][0]},
            "input 'attention_mask' must have rank 2",
        ),
        (lambda r: {"input_ids": r["input_ids"]}, "input 'attention_mask' is missing"),
        (lambda r: {k: v[:0] for k, v in r.items()}, "input 'input_ids' holds an empty batch"),
        (
            lambda r: {**r, "attention_mask": r["attention_mask"][:, :-1]},
            "inputs disagree on the sequence length",
        ),
        (
            lambda r: {**r, "attention_mask": np.concatenate([r["attention_mask"]] * 2)},
            "inputs disagree on the batch size",
        ),
    ],
)
def test_runner_fails_only_the_bad_request_when_batched_with_good_ones(encoder, change, message):
    runner, table = encoder()
    rng = np.random.default_rng(4)
    good = [_request([4], rng), _request([7, 2], rng)]
    results = runner.run([good[0], change(_request([6], rng)), good[1]])

    assert isinstance(results[1], InvalidInput) and message in str(results[1])
    for request, result in zip(good, (results[0], results[2])):
        np.testing.assert_allclose(result["embedding"], _expected(table, request), rtol=1e-5)


def test_runner_rejects_a_wrong_fixed_dim_when_inputs_have_fixed_shapes(tmp_path):
    weight = _linear_model(tmp_path / "model.onnx")
    config = RunnerConfig.from_model_config(
        {
            "name": "classifier",
            "input": [{"name": "pixel_values", "data_type": "TYPE_FP32", "dims": [3]}],
            "output": [{"name": "logits", "data_type": "TYPE_FP32", "dims": [2]}],
            "parameters": {"onnx_file": {"string_value": "model.onnx"}},
        }
    )
    runner = OnnxRunner(config, make_session(tmp_path / "model.onnx", 1))
    x = np.ones((2, 3), np.float32)
    results = runner.run([{"pixel_values": x}, {"pixel_values": np.ones((1, 4), np.float32)}])
    np.testing.assert_allclose(results[0]["logits"], x @ weight)
    assert "input 'pixel_values' must have shape ['batch', 3], got [1, 4]" in str(results[1])


@pytest.mark.parametrize(
    ("lengths", "overhead"),
    [([5, 5, 5], 40), ([3, 60, 4, 61, 5], 40), ([3, 60, 4, 61, 5], 0), (list(range(1, 33)), 10)],
)
def test_plan_chunks_covers_every_row_exactly_once(lengths, overhead):
    chunks = plan_chunks(lengths, overhead)
    assert sorted(i for chunk in chunks for i in chunk) == list(range(len(lengths)))


def test_plan_chunks_keeps_one_chunk_when_overhead_is_zero_or_lengths_are_equal():
    assert len(plan_chunks([3, 60, 4], 0)) == 1
    assert len(plan_chunks([7, 7, 7, 7], 40)) == 1


def test_plan_chunks_separates_short_from_long_rows_when_padding_costs_more_than_a_run():
    chunks = plan_chunks([3, 60, 4, 61, 5], run_overhead=40)
    assert [sorted(chunk) for chunk in chunks] == [[0, 2, 4], [1, 3]]


def test_triton_dtypes_agree_with_the_spec_dtypes_on_every_type_both_know():
    spec_numpy = {triton: np.dtype(numpy) for triton, numpy in DTYPES.values()}
    shared = sorted(set(spec_numpy) & set(TRITON_DTYPES))
    assert len(shared) >= 8, shared
    for triton in shared:
        assert np.dtype(TRITON_DTYPES[triton]) == spec_numpy[triton], triton


@pytest.mark.parametrize("run_overhead", ["0", "4"])
def test_runner_returns_per_token_outputs_at_each_requests_own_length(tmp_path, run_overhead):
    table = _per_token_model(tmp_path / "model.onnx")
    config = _encoder_config(run_overhead=run_overhead)
    config["output"] = [{"name": "logits", "data_type": "TYPE_FP32", "dims": ["-1", str(WIDTH)]}]
    parsed = RunnerConfig.from_model_config(config)
    runner = OnnxRunner(parsed, make_session(tmp_path / "model.onnx", 1))
    runner.session = RecordingSession(runner.session)
    rng = np.random.default_rng(5)
    requests = [_request(rows, rng) for rows in ([2], [40, 3], [3], [41])]

    results = runner.run(requests)

    assert runner.chunks_by_length == (run_overhead != "0")
    if run_overhead != "0":
        assert len(runner.session.shapes) > 1  # short and long rows ran apart
    for request, result in zip(requests, results):
        ids, mask = request["input_ids"], request["attention_mask"]
        assert result["logits"].shape == (*ids.shape, WIDTH)  # the request's own length
        np.testing.assert_allclose(result["logits"], table[ids] * mask[..., None], rtol=1e-6)
