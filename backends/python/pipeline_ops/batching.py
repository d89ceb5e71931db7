"""Cross-request batching for Python-backend models, and the one padding function they share.

Triton hands ``execute`` a list of requests. ``run_batched`` validates each request on its own,
runs one computation over all valid requests together, checks that the output rows add up, and
splits the rows back per request. A request that fails validation gets its own ``InvalidInput``;
the others in the same call still succeed. When the shared computation itself fails, each request
is computed alone, so only the request(s) that cause the failure get an error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .errors import InvalidInput

__all__ = ["InvalidInput", "Prepared", "pad_stack", "rows_of", "run_batched"]


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


def pad_stack(
    arrays: Sequence[np.ndarray], pad_value: Any, dims: Sequence[int] | None = None
) -> np.ndarray:
    """Concatenate arrays along axis 0, right-padding every other axis with ``pad_value``.

    Args:
        arrays: at least one array, all of the same rank and dtype (the first one's dtype is kept).
        pad_value: the fill value.
        dims: sizes of the non-batch axes of the result; each must be at least the largest size
            among ``arrays`` on that axis. Default: that largest size (pad to the longest).

    Returns:
        ``[sum of rows, *dims]``.

    Raises:
        ValueError: ``dims`` has the wrong length or is smaller than an array.
    """
    longest = [max(a.shape[axis] for a in arrays) for axis in range(1, arrays[0].ndim)]
    if dims is None:
        dims = longest
    elif len(dims) != len(longest) or any(d < n for d, n in zip(dims, longest)):
        raise ValueError(f"pad_stack: dims {list(dims)} cannot hold arrays of up to {longest}")
    out = np.full([sum(a.shape[0] for a in arrays), *dims], pad_value, dtype=arrays[0].dtype)
    row = 0
    for a in arrays:
        out[(slice(row, row + a.shape[0]),) + tuple(slice(0, n) for n in a.shape[1:])] = a
        row += a.shape[0]
    return out


def _split(outputs: Mapping[str, Any], sizes: Sequence[int]) -> list[dict[str, Any]]:
    """Check that every output holds ``sum(sizes)`` rows and cut them per request."""
    expected = sum(sizes)
    for name, value in outputs.items():
        if len(value) != expected:
            raise RuntimeError(
                f"output {name!r} has {len(value)} rows for {expected} input rows "
                f"across {len(sizes)} requests"
            )
    parts, start = [], 0
    for n in sizes:
        parts.append({name: value[start : start + n] for name, value in outputs.items()})
        start += n
    return parts


def run_batched(
    requests: Sequence[Mapping[str, Any]],
    prepare: Callable[[Mapping[str, Any]], Prepared],
    compute: Callable[[list[Prepared]], Mapping[str, Any]],
) -> list[dict[str, Any] | Exception]:
    """Validate each request, compute once over all valid ones, split the outputs per request.

    If ``compute`` raises for a call holding several requests, it is called again for each
    request alone: only the request(s) it still fails for get an error, the others their outputs.
    An ``InvalidInput`` raised by ``compute`` is retried the same way (it cannot name its request).

    Args:
        requests: per request, its input tensors by name (NumPy arrays, batch axis first).
        prepare: validates and converts one request's inputs; raises ``InvalidInput`` to reject
            that request alone. Returns values with the request's rows along axis 0.
        compute: runs over the prepared valid requests (in order) and returns outputs whose
            first axis holds the rows of all of them, in the same order (arrays, or lists of
            per-row values when rows differ in length).

    Returns:
        Per request, in order: its outputs by name, or the exception that failed it: the
        ``InvalidInput`` of ``prepare``, or what ``compute`` raised for that request alone.

    Raises:
        RuntimeError: ``compute`` returned a number of rows that does not match the requests.
    """
    results: list[dict[str, Any] | Exception | None] = [None] * len(requests)
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

    if not prepared:
        return results  # type: ignore[return-value]
    try:
        outputs = compute(prepared)
    except Exception as exc:  # noqa: BLE001 - becomes the error of the request(s) causing it
        if len(prepared) == 1:
            results[positions[0]] = exc
            return results  # type: ignore[return-value]
        outputs = None
    if outputs is not None:
        for index, part in zip(positions, _split(outputs, sizes)):
            results[index] = part
        return results  # type: ignore[return-value]

    for index, item, n in zip(positions, prepared, sizes):
        try:
            alone = compute([item])
        except Exception as exc:  # noqa: BLE001 - this request's own failure
            results[index] = exc
            continue
        (results[index],) = _split(alone, [n])
    return results  # type: ignore[return-value]
