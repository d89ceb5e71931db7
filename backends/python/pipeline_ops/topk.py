"""Classifier postprocessing: softmax and top-k class indices, scores and labels.

Vectorised over all rows of all requests of one ``execute`` call; a bad request fails alone.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .batching import Prepared, run_batched
from .errors import ConfigurationError, InvalidInput

INPUT_NAME = "logits"
OUTPUTS = ("class_index", "score", "label")


def load_labels(path: str | pathlib.Path) -> np.ndarray:
    """Read a labels file: one class name per line, line i = class i; leading ``#`` lines skipped.

    Returns:
        The names as a 1-D object array of UTF-8 ``bytes`` (ready for a ``TYPE_STRING`` output).

    Raises:
        ValueError: the file holds no labels or an empty label, naming the file and line.
    """
    lines = pathlib.Path(path).read_text(encoding="utf-8").splitlines()
    start = 0
    while start < len(lines) and lines[start].startswith("#"):
        start += 1
    names = lines[start:]
    for number, name in enumerate(names, start=start + 1):
        if not name.strip():
            raise ValueError(f"labels file {path}: line {number} is empty")
    if not names:
        raise ValueError(f"labels file {path} holds no labels")
    return np.array([name.strip().encode("utf-8") for name in names], dtype=np.object_)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of ``[rows, classes]`` logits, computed stably in float32."""
    shifted = logits.astype(np.float32) - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)


def top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` most probable classes per row, best first; ties keep the lower class index.

    Args:
        logits: float ``[rows, classes]``.
        k: how many classes to keep, ``1 <= k <= classes``.

    Returns:
        ``(class_index int64 [rows, k], score float32 [rows, k])`` with softmax probabilities.
    """
    probabilities = softmax(logits)
    order = np.argsort(-logits, axis=1, kind="stable")[:, :k]  # softmax keeps the order
    scores = np.take_along_axis(probabilities, order, axis=1)
    return order.astype(np.int64), scores.astype(np.float32)


def prepare_request(inputs: Mapping[str, np.ndarray | None], num_classes: int) -> Prepared:
    """Validate one request's ``logits`` tensor: float ``[rows, num_classes]``, all finite.

    Raises:
        InvalidInput: missing, wrong dtype or shape, or NaN/inf values; names input and problem.
    """
    logits = inputs.get(INPUT_NAME)
    if logits is None:
        raise InvalidInput(f"input '{INPUT_NAME}': missing from the request")
    logits = np.asarray(logits)
    if logits.dtype.kind != "f":
        raise InvalidInput(f"input '{INPUT_NAME}': expected FP32 values, got dtype {logits.dtype}")
    if logits.ndim != 2 or logits.shape[1] != num_classes:
        raise InvalidInput(
            f"input '{INPUT_NAME}': expected shape [batch, {num_classes}], got {list(logits.shape)}"
        )
    if not np.isfinite(logits).all():
        raise InvalidInput(f"input '{INPUT_NAME}': holds NaN or infinite values")
    return {INPUT_NAME: logits.astype(np.float32, copy=False)}


def postprocess_requests(
    requests: Sequence[Mapping[str, np.ndarray | None]], labels: np.ndarray, k: int
) -> list[dict[str, np.ndarray] | Exception]:
    """Top-k over all requests of one ``execute`` call in one vectorised pass.

    Args:
        requests: per request, ``{"logits": float32 [rows, len(labels)]}``.
        labels: class names from ``load_labels``; their count is the number of classes.
        k: classes per row, ``1 <= k <= len(labels)``.

    Returns:
        Per request ``{"class_index", "score", "label"}`` each ``[rows, k]``, or the exception
        that failed it (``InvalidInput`` for a bad request).
    """
    if not 1 <= k <= len(labels):
        raise ValueError(f"top_k must be between 1 and {len(labels)} (the labels), got {k}")

    def compute(prepared: list[Prepared]) -> dict[str, np.ndarray]:
        logits = np.concatenate([p[INPUT_NAME] for p in prepared])
        indices, scores = top_k(logits, k)
        return {"class_index": indices, "score": scores, "label": labels[indices]}

    return run_batched(requests, lambda inputs: prepare_request(inputs, len(labels)), compute)


@dataclass(frozen=True)
class PostprocessSettings:
    """The labels and ``k`` of the ``image_postprocess`` model, checked against its config."""

    labels: np.ndarray
    k: int

    @classmethod
    def from_model_config(
        cls, config: Mapping[str, Any], params: Mapping[str, str], version_dir: pathlib.Path
    ) -> PostprocessSettings:
        """Load ``labels_file`` (relative to ``version_dir``) and check ``top_k`` and the dims.

        The input must have one value per label and every output ``top_k`` values.

        Raises:
            ConfigurationError: naming the model, the parameter or tensor, and the file.
        """
        name = config.get("name", "image_postprocess")
        labels_path = pathlib.Path(version_dir) / params.get("labels_file", "labels.txt")
        if not labels_path.is_file():
            raise ConfigurationError(f"model {name!r}: labels_file {labels_path} does not exist")
        try:
            labels = load_labels(labels_path)
        except ValueError as exc:
            raise ConfigurationError(f"model {name!r}: {exc}") from None
        try:
            k = int(params.get("top_k", "5"))
        except ValueError:
            raise ConfigurationError(
                f"model {name!r}: parameter 'top_k' must be an integer"
            ) from None
        if not 1 <= k <= len(labels):
            raise ConfigurationError(
                f"model {name!r}: top_k={k} must be between 1 and {len(labels)} "
                f"(the labels in {labels_path})"
            )
        tensors = {t["name"]: t for t in config.get("input", []) + config.get("output", [])}
        logits = tensors.get(INPUT_NAME)
        if logits is None or [int(d) for d in logits["dims"]] != [len(labels)]:
            raise ConfigurationError(
                f"model {name!r}: input {INPUT_NAME!r} must have dims [{len(labels)}], "
                f"one per label in {labels_path}"
            )
        for output in OUTPUTS:
            if output not in tensors:
                raise ConfigurationError(f"model {name!r}: the config has no output {output!r}")
            dims = [int(d) for d in tensors[output]["dims"]]
            if dims != [k]:
                raise ConfigurationError(
                    f"model {name!r}: output {output!r} has dims {dims}, expected "
                    f"[{k}] for top_k={k}"
                )
        return cls(labels=labels, k=k)
