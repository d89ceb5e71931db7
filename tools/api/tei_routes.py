"""Hugging Face text-embeddings-inference's API: ``POST /embed``, ``/rerank``, ``/predict``,
``GET /info``, ``/health``, and its error shape ``{"error", "error_type"}``.

Fields and statuses as TEI's router has them (``router/src/http/types.rs`` and ``server.rs``):
``truncate`` defaults to the gateway's ``auto_truncate``; ``/embed`` normalises unless
``normalize: false``; ``/rerank`` answers ``[{index, score[, text]}]`` sorted by score;
``/predict`` takes a string, or a batch ``[[text], ...]`` (a list of two strings is one pair
there, which a single-text classifier refuses). Error types map to statuses as TEI's do:
Empty 400, Validation 422 (413 for a body over the limit), Overloaded 429, Backend 424,
Unhealthy 503. The TEI routes name no model: the gateway's rule picks it
(``tools.api.state.Gateway.default``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np

from tools.api import compute
from tools.api.pipelines import PAIR, TEXT, Pipeline
from tools.api.route import Api, Route
from tools.api.state import Gateway
from tools.errors import (
    ApiBackendError,
    ApiBodyTooLarge,
    ApiEmptyInput,
    ApiError,
    ApiInvalidRequest,
    ApiModelNotFound,
    ApiOverloaded,
    ApiUnavailable,
)

EMBED_PATH, RERANK_PATH, PREDICT_PATH = "/embed", "/rerank", "/predict"
INFO_PATH, HEALTH_PATH = "/info", "/health"
# Error class -> (HTTP status, TEI's error_type); the first that fits answers.
ERRORS: tuple[tuple[type[ApiError], int, str], ...] = (
    (ApiEmptyInput, 400, "Empty"),
    (ApiBodyTooLarge, 413, "Validation"),
    (ApiModelNotFound, 424, "Backend"),
    (ApiInvalidRequest, 422, "Validation"),
    (ApiOverloaded, 429, "Overloaded"),
    (ApiUnavailable, 503, "Unhealthy"),
    (ApiBackendError, 424, "Backend"),
    (ApiError, 424, "Backend"),
)


def error(exc: ApiError) -> tuple[int, dict[str, Any]]:
    """The status and body TEI answers ``exc`` with."""
    status, kind = next((s, k) for cls, s, k in ERRORS if isinstance(exc, cls))
    return status, {"error": str(exc), "error_type": kind}


def _flag(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiInvalidRequest(f"{name} must be true or false, got {value!r}", name)
    return value


def _truncate(gateway: Gateway, body: Mapping[str, Any]) -> bool:
    direction = body.get("truncation_direction")
    if direction is not None and str(direction).lower() != "right":
        raise ApiInvalidRequest(f"truncation_direction {direction!r}: the pipelines cut texts "
                                "on the right only", "truncation_direction")
    if body.get("prompt_name") is not None:
        raise ApiInvalidRequest("prompt_name: a pipeline applies the one prompt it was built "
                                "with (tools add --prompt), none is chosen per request",
                                "prompt_name")
    return _flag(body, "truncate", gateway.limits.auto_truncate)


async def embed(gateway: Gateway, pipeline: Pipeline, body: Mapping[str, Any]) -> Any:
    """``POST /embed``: one embedding per input, L2-normalised unless ``normalize: false``
    (then the pipeline's own output: a pipeline that normalises in its graph, as
    all-MiniLM-L6-v2's does, gives unit vectors either way)."""
    truncate = _truncate(gateway, body)
    normalize = _flag(body, "normalize", True)
    compute.check_dimensions(pipeline, body.get("dimensions"))
    inputs = compute.read_inputs(body.get("inputs", compute.MISSING), "inputs",
                                 gateway.limits.tei_max_inputs)
    vectors, _ = await compute.embed(gateway, pipeline, inputs, "inputs", truncate, count=False)
    return compute.normalized(vectors) if normalize else vectors


def _texts(value: Any, param: str, limit: int) -> list[str]:
    if not isinstance(value, list):
        raise ApiInvalidRequest(f"{param} must be a list of strings", param)
    if not value:
        raise ApiEmptyInput(f"`{param}` cannot be empty", param)
    if len(value) > limit:
        raise ApiInvalidRequest(f"batch size {len(value)} > maximum allowed batch size {limit}",
                                param)
    return value


async def rerank(gateway: Gateway, pipeline: Pipeline, body: Mapping[str, Any]) -> Any:
    """``POST /rerank``: the texts ranked against the query, best first."""
    truncate = _truncate(gateway, body)
    raw = _flag(body, "raw_scores", False)
    with_text = _flag(body, "return_text", False)
    query = body.get("query")
    pipeline.texts.check([query], "query", single=True)
    texts = _texts(body.get("texts"), "texts", gateway.limits.tei_max_inputs)
    pipeline.texts.check(texts, "texts")
    scores = await compute.pair_scores(gateway, pipeline, query, texts, raw=raw,
                                       truncate=truncate)
    order = sorted(range(len(texts)), key=lambda i: -scores[i])
    return [{"index": i, "score": float(scores[i]), **({"text": texts[i]} if with_text else {})}
            for i in order]


def _predict_texts(value: Any, limit: int) -> tuple[list[str], bool]:
    """TEI's ``PredictInput``: a string; ``[a]`` (one text) or ``[a, b]`` (one pair); or a
    batch ``[[a], [b, c], ...]``. Returns the texts and whether it was one input."""
    if isinstance(value, str):
        return [value], True
    if not isinstance(value, list):
        raise ApiInvalidRequest("inputs must be a string, [text] or a batch [[text], ...]",
                                "inputs")
    if not value:
        raise ApiEmptyInput("`inputs` cannot be empty", "inputs")
    single = not isinstance(value[0], list)
    rows = [value] if single else value
    if len(rows) > limit:
        raise ApiInvalidRequest(f"batch size {len(rows)} > maximum allowed batch size {limit}",
                                "inputs")
    texts = []
    for index, row in enumerate(rows):
        if not isinstance(row, list) or len(row) not in (1, 2):
            raise ApiInvalidRequest(f"inputs[{index}] must be [text] (or a pair [text, text])",
                                    "inputs")
        if len(row) == 2:
            raise ApiInvalidRequest(
                f"inputs{'' if single else f'[{index}]'} is a pair of texts; this classifier "
                "takes single texts: send a string, or a batch [[text], [text], ...]", "inputs")
        texts.append(row[0])
    return texts, single


async def predict(gateway: Gateway, pipeline: Pipeline, body: Mapping[str, Any]) -> Any:
    """``POST /predict``: per text, every label with its score, best first."""
    truncate = _truncate(gateway, body)
    raw = _flag(body, "raw_scores", False)
    texts, single = _predict_texts(body.get("inputs"), gateway.limits.tei_max_inputs)
    pipeline.texts.check(texts, "inputs", single=single)
    scores = await compute.class_scores(gateway, pipeline, texts, raw=raw, truncate=truncate,
                                        single=single)
    labels = pipeline.labels or tuple(f"LABEL_{i}" for i in range(scores.shape[1]))
    if len(labels) != scores.shape[1]:
        raise ApiBackendError(f"{pipeline.name}: {len(labels)} labels for {scores.shape[1]} "
                              "scores")
    answers = []
    for row in np.asarray(scores, dtype=np.float64):
        order = np.argsort(-row, kind="stable")
        answers.append([{"score": float(row[i]), "label": labels[i]} for i in order])
    return answers[0] if single else answers


async def predict_entities(gateway: Gateway, pipeline: Pipeline, body: Mapping[str, Any]) -> Any:
    """``POST /predict`` for a token-classification pipeline: per text, its entities with
    character offsets (``{entity_group, score, word, start, end}``, or per token with
    ``none``), as transformers' pipeline gives them. TEI has no token classification; the
    inputs and errors are its ``/predict``'s."""
    truncate = _truncate(gateway, body)
    if _flag(body, "raw_scores", False):
        raise ApiInvalidRequest("raw_scores: a token-classification pipeline answers entities, "
                                "not per-label scores", "raw_scores")
    texts, single = _predict_texts(body.get("inputs"), gateway.limits.tei_max_inputs)
    pipeline.texts.check(texts, "inputs", single=single)
    found = await compute.entities(gateway, pipeline, texts, truncate=truncate, single=single)
    return found[0] if single else found


def _version() -> str:
    try:
        return version("triton-forge")
    except PackageNotFoundError:
        return "unknown"


def _model_type(pipeline: Pipeline) -> dict[str, Any]:
    kind = pipeline.kind.tei_type
    if kind == "embedding":
        return {kind: {"pooling": "in the served graph"}}
    labels = pipeline.labels or ("LABEL_0",)
    return {kind: {"id2label": {str(i): n for i, n in enumerate(labels)},
                   "label2id": {n: i for i, n in enumerate(labels)}}}


def info(gateway: Gateway) -> dict[str, Any]:
    """``GET /info``: TEI's fields for the pipeline ``/embed`` uses (else ``/rerank``'s, else
    ``/predict``'s), and every pipeline served with its kind and routes."""
    served = gateway.serving()
    pipeline = next((gateway.default(path) for path in (EMBED_PATH, RERANK_PATH, PREDICT_PATH)
                     if gateway.of_path(path)), None)
    out: dict[str, Any] = {"model_id": None, "model_type": None}
    if pipeline is not None:
        out = {
            "model_id": pipeline.name, "model_sha": None, "model_dtype": "float32",
            "served_model_name": pipeline.name, "model_type": _model_type(pipeline),
            "max_input_length": pipeline.texts.max_length,
            "max_batch_requests": pipeline.max_batch_size,
        }
    limits = gateway.limits
    out.update({
        "max_client_batch_size": limits.tei_max_inputs, "auto_truncate": limits.auto_truncate,
        "version": _version(), "sha": None, "docker_label": None,
        "pipelines": [{"name": p.name, "kind": p.kind.name,
                       "routes": [r.path for r in p.kind.routes]}
                      for _, p in sorted(served.items())],
    })
    return out


def _embed_body(model: str, columns: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    return {"inputs": list(columns[TEXT])}


def _rerank_body(model: str, columns: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    queries = set(columns[TEXT])
    if len(queries) != 1:
        raise ValueError(f"/rerank scores texts against one query; these rows have {len(queries)}")
    return {"query": columns[TEXT][0], "texts": list(columns[PAIR])}


def _predict_body(model: str, columns: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    return {"inputs": [[t] for t in columns[TEXT]]}


EMBED = Route(Api.TEI, EMBED_PATH, embed, _embed_body, len)
RERANK = Route(Api.TEI, RERANK_PATH, rerank, _rerank_body, len)
PREDICT = Route(Api.TEI, PREDICT_PATH, predict, _predict_body, len)
PREDICT_ENTITIES = Route(Api.TEI, PREDICT_PATH, predict_entities, _predict_body, len)
