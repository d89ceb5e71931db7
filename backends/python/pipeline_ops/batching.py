"""Cross-request batching for Python-backend models.

Triton hands ``execute`` a list of requests. ``run_batched`` validates each request on its own,
runs one computation over all valid requests together, checks that the output rows add up, and
splits the rows back per request. A request that fails validation gets its own ``InvalidInput``;
the others in the same call still succeed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .errors import InvalidInput

__all__ = ["InvalidInput", "Prepared", "concat_rows", "pad_to_longest", "rows_of", "run_batched"]


Prepared = Mapping[str, Any]  # name -> np.ndarray (rows first) or list of per-row items


def rows_of(prepared: Prepared) -> int:
    """Number of batch rows in one prepared request; every value must agree."""
    counts = {name: len(value) for name, value in prepared.items()}
    distinct = set(counts.values())
    if len(distinct) != 1:
        detail = ", ".join(f"{name}={n}" for name, n in counts.items())
        raise InvalidInput(f"inputs disagree on the batch size ({detail})")
    (n,) = distinct
    return n


def concat_rows(values: Sequence[Any]) -> Any:
    """Concatenate per-request values along the batch axis (arrays or lists)."""
    if isinstance(values[0], np.ndarray):
        return np.concatenate(values, axis=0)
    out: list[Any] = []
    for value in values:
        out.extend(value)
    return out


def pad_to_longest(arrays: Sequence[np.ndarray], pad_value: Any) -> np.ndarray:
    """Stack ``[rows_i, length_i]`` arrays into ``[sum rows_i, max length_i]``, right-padded."""
    longest = max(a.shape[1] for a in arrays)
    total = sum(a.shape[0] for a in arrays)
    out = np.full((total, longest), pad_value, dtype=arrays[0].dtype)
    row = 0
    for a in arrays:
        out[row : row + a.shape[0], : a.shape[1]] = a
        row += a.shape[0]
    return out


def run_batched(
    requests: Sequence[Mapping[str, Any]],
    prepare: Callable[[Mapping[str, Any]], Prepared],
    compute: Callable[[list[Prepared]], Mapping[str, Any]],
) -> list[dict[str, Any] | InvalidInput]:
    """Validate each request, compute once over all valid ones, split the outputs per request.

    Args:
        requests: per request, its input tensors by name (NumPy arrays, batch axis first).
        prepare: validates and converts one request's inputs; raises ``InvalidInput`` to reject
            that request alone. Returns values with the request's rows along axis 0.
        compute: runs once over the prepared valid requests (in order) and returns outputs whose
            first axis holds the rows of all of them, in the same order (arrays, or lists of
            per-row values when rows differ in length).

    Returns:
        Per request, in order: its outputs by name, or the ``InvalidInput`` that rejected it.

    Raises:
        RuntimeError: ``compute`` returned a number of rows that does not match the requests.
    """
    results: list[dict[str, Any] | InvalidInput | None] = [None] * len(requests)
    prepared: list[Prepared] = []
    positions: list[int] = []
    sizes: list[int] = []
    for index, inputs in enumerate(requests):
        try:
            item = prepare(inputs)
            n = rows_of(item)
            if n == 0:
                names = ", ".join(f"'{name}'" for name in item)
                raise InvalidInput(f"input {names} holds an empty batch (0 rows)")
        except InvalidInput as exc:
            results[index] = exc
            continue
        prepared.append(item)
        positions.append(index)
        sizes.append(n)

    if prepared:
        outputs = compute(prepared)
        expected = sum(sizes)
        for name, value in outputs.items():
            if len(value) != expected:
                raise RuntimeError(
                    f"output {name!r} has {len(value)} rows for {expected} input rows "
                    f"across {len(sizes)} requests"
                )
        start = 0
        for index, n in zip(positions, sizes):
            results[index] = {name: value[start : start + n] for name, value in outputs.items()}
            start += n
    return results  # type: ignore[return-value]
