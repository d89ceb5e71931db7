"""Specification of pipeline_ops.batching: per-request validation, one computation, split by rows.
No Triton needed; the functions are plain NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from pipeline_ops.batching import InvalidInput, pad_to_longest, rows_of, run_batched


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


def test_pad_to_longest_right_pads_every_request_to_the_longest_row():
    out = pad_to_longest([np.array([[1, 2]]), np.array([[3, 4, 5, 6], [7, 8, 9, 1]])], pad_value=-1)
    np.testing.assert_array_equal(out, [[1, 2, -1, -1], [3, 4, 5, 6], [7, 8, 9, 1]])
    assert out.dtype == np.array([1]).dtype
