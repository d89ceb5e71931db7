"""OpenAI's embeddings API: ``POST /v1/embeddings``, ``GET /v1/models``, its error shape.

As OpenAI's API reference has them: ``input`` a string, a list of strings, a list of token ids
or a list of such lists (ids of the pipeline's own tokenizer); ``model`` the pipeline's name;
``encoding_format`` ``float`` or ``base64`` (little-endian float32, what the official client
asks for when its caller names none); ``usage.prompt_tokens`` counted by the pipeline's own
tokenizer. Errors: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tools.api import compute
from tools.api.pipelines import TEXT, Pipeline
from tools.api.route import Api, Route
from tools.api.state import Gateway
from tools.errors import (
    ApiBackendError,
    ApiBodyTooLarge,
    ApiError,
    ApiInvalidRequest,
    ApiModelNotFound,
    ApiOverloaded,
    ApiUnavailable,
)

EMBEDDINGS_PATH = "/v1/embeddings"
MODELS_PATH = "/v1/models"
OWNER = "triton-forge"
ENCODINGS = ("float", "base64")
# Error class -> (HTTP status, OpenAI's error type, code); the first that fits answers.
ERRORS: tuple[tuple[type[ApiError], int, str, str | None], ...] = (
    (ApiBodyTooLarge, 413, "invalid_request_error", "request_too_large"),
    (ApiModelNotFound, 404, "invalid_request_error", "model_not_found"),
    (ApiInvalidRequest, 400, "invalid_request_error", None),
    (ApiOverloaded, 503, "server_error", "overloaded"),
    (ApiUnavailable, 503, "server_error", "unavailable"),
    (ApiBackendError, 500, "server_error", None),
    (ApiError, 500, "server_error", None),
)


def error(exc: ApiError) -> tuple[int, dict[str, Any]]:
    """The status and body OpenAI answers ``exc`` with."""
    status, kind, code = next((s, k, c) for cls, s, k, c in ERRORS if isinstance(exc, cls))
    return status, {"error": {"message": str(exc), "type": kind, "param": exc.param,
                              "code": code}}


def _encoded(row: np.ndarray, encoding: str) -> Any:
    if encoding == "base64":
        return base64.b64encode(np.ascontiguousarray(row, dtype="<f4").tobytes()).decode("ascii")
    return row


async def embeddings(gateway: Gateway, pipeline: Pipeline, body: Mapping[str, Any]) -> Any:
    """``POST /v1/embeddings`` for an embedding pipeline."""
    encoding = body.get("encoding_format") or "float"
    if encoding not in ENCODINGS:
        raise ApiInvalidRequest(f"encoding_format must be 'float' or 'base64', got {encoding!r}",
                                "encoding_format")
    compute.check_dimensions(pipeline, body.get("dimensions"))
    inputs = compute.read_inputs(body.get("input", compute.MISSING), "input",
                                 gateway.limits.openai_max_inputs)
    vectors, tokens = await compute.embed(gateway, pipeline, inputs, "input",
                                          gateway.limits.auto_truncate)
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": _encoded(row, encoding)}
                 for i, row in enumerate(vectors)],
        "model": pipeline.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def model_entry(gateway: Gateway, pipeline: Pipeline) -> dict[str, Any]:
    """One model of ``GET /v1/models``: created when its configuration was built."""
    config = gateway.repository / pipeline.name / "config.pbtxt"
    created = int(config.stat().st_mtime) if config.exists() else 0
    return {"id": pipeline.name, "object": "model", "created": created, "owned_by": OWNER}


def models(gateway: Gateway) -> dict[str, Any]:
    """``GET /v1/models``: the pipelines the OpenAI routes serve."""
    served = [p for p in gateway.serving().values()
              if any(r.api is Api.OPENAI for r in p.kind.routes)]
    return {"object": "list", "data": [model_entry(gateway, p)
                                       for p in sorted(served, key=lambda p: p.name)]}


def model(gateway: Gateway, name: str) -> dict[str, Any]:
    """``GET /v1/models/{model}``.

    Raises:
        ApiModelNotFound: no such pipeline among those ``models`` lists.
    """
    return model_entry(gateway, gateway.named(EMBEDDINGS_PATH, name))


def _body(model_name: str, columns: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    # base64: what the official client sends when its caller names no encoding
    return {"model": model_name, "input": list(columns[TEXT]), "encoding_format": "base64"}


EMBEDDINGS = Route(Api.OPENAI, EMBEDDINGS_PATH, embeddings, _body,
                   lambda answer: len(answer["data"]))
