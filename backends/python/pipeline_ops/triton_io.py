"""Translation between Triton's Python-backend objects and plain NumPy, shared by every model.py.

``pb_utils`` is passed in rather than imported, so this module imports (and is unit-tested)
without a server; the ``model.py`` files stay a few lines each.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InvalidInput, Overloaded


def parameters(model_config: Mapping[str, Any] | str) -> dict[str, str]:
    """The config's ``parameters`` as plain strings (Triton stores them as ``string_value``)."""
    config = json.loads(model_config) if isinstance(model_config, str) else model_config
    return {
        key: value.get("string_value", "") for key, value in config.get("parameters", {}).items()
    }


def version_dir(args: Mapping[str, Any]) -> Path:
    """The model's version folder, where ``tools build-repo`` puts its data files."""
    return Path(args["model_repository"]) / str(args["model_version"])


def request_inputs(
    pb_utils: Any, requests: Sequence[Any], names: Iterable[str]
) -> list[dict[str, np.ndarray | None]]:
    """Per request, its named inputs as NumPy arrays (``None`` where the request lacks one)."""
    names = list(names)
    batch = []
    for request in requests:
        tensors = {}
        for name in names:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            tensors[name] = None if tensor is None else tensor.as_numpy()
        batch.append(tensors)
    return batch


def responses(pb_utils: Any, results: Iterable[Mapping[str, np.ndarray] | Exception]) -> list:
    """One ``InferenceResponse`` per result: its outputs, or its own error.

    ``InvalidInput`` (a bad request) becomes ``TritonError.INVALID_ARG``, ``Overloaded`` (refused
    at admission) ``TritonError.UNAVAILABLE``; any other exception (the model failed on that
    request) becomes ``TritonError.INTERNAL``.
    """
    answers = []
    for result in results:
        if isinstance(result, Exception):
            if isinstance(result, InvalidInput):
                code = pb_utils.TritonError.INVALID_ARG
            elif isinstance(result, Overloaded):
                code = pb_utils.TritonError.UNAVAILABLE
            else:
                code = pb_utils.TritonError.INTERNAL
            error = pb_utils.TritonError(str(result) or type(result).__name__, code)
            answers.append(pb_utils.InferenceResponse(error=error))
        else:
            tensors = [pb_utils.Tensor(name, value) for name, value in result.items()]
            answers.append(pb_utils.InferenceResponse(output_tensors=tensors))
    return answers
