"""Specification of pipeline_ops.batching: per-request validation, one computation, split by rows,
a failing computation narrowed down to its request, and the one padding function.
No Triton needed; the functions are plain NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from pipeline_ops.batching import InvalidInput, pad_stack, rows_of, run_batched


def _prepare(inputs):
    x = inputs["x"]
    if x.dtype != np.float32:
        raise InvalidInput(f"input 'x' must be float32, got {x.dtype}")
    return {"x": x}


def _double(prepared):
    return {"y": np.concatenate([p["x"] for p in prepared]) * 2}


def test_run_batched_fails_only_the_bad_request_when_one_request_is_invalid():
    good_a = {"x": np.ones((2, 3), np.float32)}
    bad = {"x": np.ones((1, 3), np.int32)}
    good_b = {"x": np.full((3, 3), 5, np.float32)}

    results = run_batched([good_a, bad, good_b], _prepare, _double)

    assert isinstance(results[1], InvalidInput)
    assert "'x'" in str(results[1]) and "int32" in str(results[1])
    np.testing.assert_array_equal(results[0]["y"], np.full((2, 3), 2, np.float32))
    np.testing.assert_array_equal(results[2]["y"], np.full((3, 3), 10, np.float32))


def test_run_batched_computes_once_over_all_valid_requests():
    calls = []

    def compute(prepared):
        calls.append(len(prepared))
        return _double(prepared)

    run_batched([{"x": np.ones((n, 1), np.float32)} for n in (1, 4, 2)], _prepare, compute)

    assert calls == [3]


def test_run_batched_skips_compute_when_every_request_is_invalid():
    calls = []
    results = run_batched(
        [{"x": np.ones((1, 1), np.int64)}], _prepare, lambda p: calls.append(p) or {}
    )
    assert calls == [] and isinstance(results[0], InvalidInput)


def test_run_batched_raises_when_output_rows_do_not_add_up():
    def drops_a_row(prepared):
        return {"y": np.concatenate([p["x"] for p in prepared])[:-1]}

    with pytest.raises(RuntimeError, match="'y' has 2 rows for 3 input rows across 2 requests"):
        run_batched(
            [{"x": np.ones((1, 1), np.float32)}, {"x": np.ones((2, 1), np.float32)}],
            _prepare,
            drops_a_row,
        )


def test_run_batched_rejects_a_request_when_it_holds_zero_rows():
    results = run_batched(
        [{"x": np.ones((0, 3), np.float32)}, {"x": np.ones((1, 3), np.float32)}], _prepare, _double
    )
    assert isinstance(results[0], InvalidInput)
    assert "input 'x' holds an empty batch (0 rows)" in str(results[0])
    assert results[1]["y"].shape == (1, 3)


def test_run_batched_splits_list_outputs_when_rows_differ_in_length():
    def lists(prepared):
        return {"tokens": [list(range(int(v))) for p in prepared for v in p["x"][:, 0]]}

    results = run_batched(
        [{"x": np.array([[1], [3]], np.float32)}, {"x": np.array([[2]], np.float32)}],
        _prepare,
        lists,
    )
    assert results[0]["tokens"] == [[0], [0, 1, 2]]
    assert results[1]["tokens"] == [[0, 1]]


def test_rows_of_raises_when_inputs_disagree_on_the_batch_size():
    with pytest.raises(InvalidInput, match="a=2, b=3"):
        rows_of({"a": np.zeros((2, 1)), "b": np.zeros((3, 1))})


def _fails_on_negative(prepared):
    """Like ONNX Runtime on an out-of-range id: the whole run fails when any row is bad."""
    x = np.concatenate([p["x"] for p in prepared])
    if (x < 0).any():
        raise RuntimeError("index out of range")
    return {"y": x * 2}


def test_run_batched_fails_only_the_culprit_when_compute_fails_for_several_requests():
    calls = []

    def compute(prepared):
        calls.append(len(prepared))
        return _fails_on_negative(prepared)

    requests = [{"x": np.full((n, 1), v, np.float32)} for n, v in ((2, 1), (1, -1), (3, 4))]
    results = run_batched(requests, _prepare, compute)

    assert calls == [3, 1, 1, 1]
    assert isinstance(results[1], RuntimeError) and not isinstance(results[1], InvalidInput)
    assert "index out of range" in str(results[1])
    np.testing.assert_array_equal(results[0]["y"], np.full((2, 1), 2, np.float32))
    np.testing.assert_array_equal(results[2]["y"], np.full((3, 1), 8, np.float32))


def test_run_batched_fails_every_culprit_when_several_requests_break_compute():
    values = (-1, 1, -2, 3)
    requests = [{"x": np.full((1, 1), v, np.float32)} for v in values]
    results = run_batched(requests, _prepare, _fails_on_negative)
    assert [isinstance(r, RuntimeError) for r in results] == [True, False, True, False]
    assert results[3]["y"][0, 0] == 6


def test_run_batched_returns_the_error_when_compute_fails_for_a_single_request():
    calls = []

    def compute(prepared):
        calls.append(len(prepared))
        return _fails_on_negative(prepared)

    (result,) = run_batched([{"x": np.full((2, 1), -1, np.float32)}], _prepare, compute)
    assert calls == [1] and isinstance(result, RuntimeError)


def test_run_batched_narrows_down_an_invalid_input_raised_by_compute():
    def compute(prepared):
        x = np.concatenate([p["x"] for p in prepared])
        if (x > 100).any():
            raise InvalidInput("input 'x' holds a value above 100")
        return {"y": x}

    requests = [{"x": np.full((1, 1), v, np.float32)} for v in (1, 500, 2)]
    results = run_batched(requests, _prepare, compute)
    assert isinstance(results[1], InvalidInput) and "above 100" in str(results[1])
    assert results[0]["y"][0, 0] == 1 and results[2]["y"][0, 0] == 2


def test_pad_stack_right_pads_every_request_to_the_longest_row():
    out = pad_stack([np.array([[1, 2]]), np.array([[3, 4, 5, 6], [7, 8, 9, 1]])], pad_value=-1)
    np.testing.assert_array_equal(out, [[1, 2, -1, -1], [3, 4, 5, 6], [7, 8, 9, 1]])
    assert out.dtype == np.array([1]).dtype


def test_pad_stack_pads_every_non_batch_axis_to_its_largest_size():
    out = pad_stack([np.ones((1, 2, 3)), np.ones((2, 4, 1))], pad_value=-1)
    assert out.shape == (3, 4, 3)
    assert out[0, :2, :3].min() == 1 and out[0, 2:].max() == -1 and out[1, :, 1:].max() == -1


def test_pad_stack_pads_to_the_given_dims_when_they_are_larger():
    out = pad_stack([np.array([[1, 2]]), np.array([[3]])], pad_value=0, dims=(5,))
    np.testing.assert_array_equal(out, [[1, 2, 0, 0, 0], [3, 0, 0, 0, 0]])


def test_pad_stack_raises_when_the_given_dims_cannot_hold_a_row():
    with pytest.raises(ValueError, match=r"dims \[2\] cannot hold arrays of up to \[3\]"):
        pad_stack([np.ones((1, 3))], pad_value=0, dims=(2,))
