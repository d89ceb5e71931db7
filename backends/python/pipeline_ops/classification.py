"""Sequence-classification postprocessing: softmax over logits, the best label and its score.

Labels come from a Hugging Face ``config.json`` (``id2label``) or a labels text file; vectorised
over all requests of one ``execute`` call, a bad request fails alone.
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
    requests: Sequence[Mapping[str, np.ndarray | None]], labels: np.ndarray
) -> list[dict[str, np.ndarray] | Exception]:
    """Softmax and the most probable label of every row of every request, in one pass.

    Returns:
        Per request ``{"label" [rows, 1], "score" [rows, 1], "probabilities" [rows, classes]}``,
        or the exception that failed it (``InvalidInput`` for a bad request).
    """
    def compute(prepared: list[Prepared]) -> dict[str, np.ndarray]:
        probabilities = softmax(np.concatenate([p[INPUT_NAME] for p in prepared]))
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
