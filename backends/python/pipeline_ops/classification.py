"""Sequence-classification postprocessing: the activation over logits, the best label, its score.

``softmax`` for single-label classifiers (probabilities over the labels, summing to 1),
``sigmoid`` for multi-label ones (an independent probability per label). Labels come from a
Hugging Face ``config.json`` (``id2label``) or a labels text file; vectorised over all requests
of one ``execute`` call, a bad request fails alone.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping, Sequence

import numpy as np

from .batching import Prepared, run_batched
from .errors import ConfigurationError
from .topk import INPUT_NAME, load_labels, prepare_request, softmax

OUTPUTS = ("label", "score", "probabilities")
ACTIVATIONS = ("softmax", "sigmoid")


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Element-wise logistic function in float32, stable for large negative logits."""
    logits = logits.astype(np.float32)
    exp = np.exp(-np.abs(logits))
    return np.where(logits >= 0, 1 / (1 + exp), exp / (1 + exp))


def activation_of(params: Mapping[str, str], model: str) -> str:
    """The ``activation`` parameter (``softmax`` unless given).

    Raises:
        ConfigurationError: another value, naming the model.
    """
    activation = params.get("activation", "softmax")
    if activation not in ACTIVATIONS:
        raise ConfigurationError(f"model {model!r}: parameter 'activation' must be one of "
                                 f"{list(ACTIVATIONS)}, got {activation!r}")
    return activation


def labels_from_file(path: str | pathlib.Path) -> np.ndarray:
    """Class names by index: ``id2label`` of a ``*.json`` config, else one label per line.

    Returns:
        A 1-D object array of UTF-8 ``bytes``.

    Raises:
        ConfigurationError: the file is missing, or holds no labels, naming the file.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise ConfigurationError(f"labels_file {path} does not exist")
    if path.suffix != ".json":
        try:
            return load_labels(path)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
    config = json.loads(path.read_text(encoding="utf-8"))
    id2label = config.get("id2label") or {}
    count = int(config.get("num_labels") or len(id2label))
    if count < 1:
        raise ConfigurationError(f"labels_file {path}: no 'id2label' or 'num_labels'")
    names = [str(id2label.get(str(i), f"LABEL_{i}")) for i in range(count)]
    return np.array([n.encode("utf-8") for n in names], dtype=np.object_)


def classify_requests(
    requests: Sequence[Mapping[str, np.ndarray | None]], labels: np.ndarray,
    activation: str = "softmax",
) -> list[dict[str, np.ndarray] | Exception]:
    """The activation and the most probable label of every row of every request, in one pass.

    Args:
        requests: per request, ``{"logits": float32 [rows, len(labels)]}``.
        labels: class names by index.
        activation: ``softmax`` (single-label) or ``sigmoid`` (multi-label: ``score`` is the
            best label's own probability, the others are independent of it).

    Returns:
        Per request ``{"label" [rows, 1], "score" [rows, 1], "probabilities" [rows, classes]}``,
        or the exception that failed it (``InvalidInput`` for a bad request).
    """
    function = sigmoid if activation == "sigmoid" else softmax

    def compute(prepared: list[Prepared]) -> dict[str, np.ndarray]:
        probabilities = function(np.concatenate([p[INPUT_NAME] for p in prepared]))
        best = np.argmax(probabilities, axis=1)[:, None]  # first of equal maxima
        return {"label": labels[best], "score": np.take_along_axis(probabilities, best, axis=1),
                "probabilities": probabilities.astype(np.float32)}

    return run_batched(requests, lambda inputs: prepare_request(inputs, len(labels)), compute)


def check_config(config: Mapping, labels: np.ndarray) -> None:
    """The config's ``logits`` and ``probabilities`` dims are one per label.

    Raises:
        ConfigurationError: naming the model and the tensor.
    """
    name = config.get("name", "text_classification_postprocess")
    tensors = {t["name"]: t for t in config.get("input", []) + config.get("output", [])}
    for tensor, want in ((INPUT_NAME, [len(labels)]), ("probabilities", [len(labels)]),
                         ("label", [1]), ("score", [1])):
        dims = [int(d) for d in tensors.get(tensor, {}).get("dims", [])]
        if dims != want:
            raise ConfigurationError(
                f"model {name!r}: {tensor!r} must have dims {want} ({len(labels)} labels), "
                f"got {dims or 'no such tensor'}"
            )
