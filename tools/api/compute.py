"""What the routes compute, whatever the API's request and answer shapes: the inputs of a
request read and checked, embeddings, pair scores and class scores from a pipeline.

Every list of inputs is one Triton request (or one per ``max_batch_size`` rows): the dynamic
batcher and the tokenizer see the batch the client sent.
"""

from __future__ import annotations

import json

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tools.api.pipelines import PAIR, TEXT, Pipeline
from tools.api.state import Gateway
from tools.errors import ApiBackendError, ApiEmptyInput, ApiInvalidRequest

MISSING = object()
EMBEDDING, SCORE, PROBABILITIES = "EMBEDDING", "SCORE", "PROBABILITIES"
ENTITIES = "ENTITIES"  # hf-token-classification: one JSON array of entities per text


@dataclass(frozen=True)
class Inputs:
    """A request's inputs: texts or token-id rows (one of the two), and whether the request
    gave one input rather than a list."""

    texts: list[str] | None
    ids: list[Any] | None
    single: bool

    def __len__(self) -> int:
        return len(self.texts if self.texts is not None else self.ids)


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_inputs(value: Any, param: str, max_inputs: int) -> Inputs:
    """A string, a list of strings, a list of token ids or a list of such lists.

    Raises:
        ApiInvalidRequest: missing, of another type, mixed, or more than ``max_inputs``.
        ApiEmptyInput: an empty list.
    """
    if value is MISSING or value is None:
        raise ApiInvalidRequest(f"{param} is required: a string or a list of strings", param)
    if isinstance(value, str):
        return Inputs([value], None, True)
    if not isinstance(value, list):
        raise ApiInvalidRequest(f"{param} must be a string or a list of strings, got "
                                f"{type(value).__name__}", param)
    if not value:
        raise ApiEmptyInput(f"{param} cannot be empty: send at least one input", param)
    if len(value) > max_inputs:
        raise ApiInvalidRequest(f"{param} holds {len(value)} inputs, more than the {max_inputs} "
                                "one request may hold: send them in several requests", param)
    if all(isinstance(v, str) for v in value):
        return Inputs(list(value), None, False)
    if all(_is_id(v) for v in value):
        return Inputs(None, [value], True)
    if all(isinstance(v, list) for v in value):
        return Inputs(None, list(value), False)
    raise ApiInvalidRequest(f"{param} must be a string, a list of strings, a list of token ids "
                            "or a list of lists of token ids, not a mix", param)


def check_dimensions(pipeline: Pipeline, dimensions: Any) -> None:
    """Refuse a ``dimensions`` other than the pipeline's own width (it cannot shorten them).

    Raises:
        ApiInvalidRequest: naming ``dimensions``.
    """
    width = pipeline.width(EMBEDDING)
    if dimensions is not None and dimensions != width:
        raise ApiInvalidRequest(f"dimensions {dimensions!r}: {pipeline.name} makes "
                                f"{width}-dimensional embeddings and does not shorten them",
                                "dimensions")


async def embed(gateway: Gateway, pipeline: Pipeline, inputs: Inputs, param: str,
                truncate: bool, count: bool = True) -> tuple[np.ndarray, int | None]:
    """Embeddings ``[rows, width]`` of the inputs and the tokens the pipeline ran (None when
    not ``count``ed: texts are tokenized here only to count them or to refuse long ones)."""
    if inputs.texts is not None:
        pipeline.texts.check(inputs.texts, param, single=inputs.single)
        tokens = None
        if count or not truncate:
            tokens = sum(await pipeline.texts.count(inputs.texts, truncate=truncate, param=param,
                                                    single=inputs.single))
        answer = await pipeline.run_texts(gateway.backend, {TEXT: inputs.texts}, [EMBEDDING])
        return answer[EMBEDDING], tokens
    if not pipeline.takes_ids(EMBEDDING):
        raise ApiInvalidRequest(f"{pipeline.name} takes text only (no step of it takes token "
                                "ids): send strings", param)
    rows = pipeline.texts.check_ids(inputs.ids, param, single=inputs.single)
    vectors = await pipeline.run_ids(gateway.backend, rows, EMBEDDING)
    return vectors, sum(len(r) for r in rows)


def normalized(vectors: np.ndarray) -> np.ndarray:
    """Each row divided by its L2 norm (a zero row stays zero)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


async def pair_scores(gateway: Gateway, pipeline: Pipeline, query: str, texts: Sequence[str],
                      *, raw: bool, truncate: bool) -> np.ndarray:
    """One score per (query, text) pair: the pipeline's ``SCORE``, with the sigmoid TEI's
    rerank applies (``raw``: without it, the model's logit)."""
    if pipeline.width(SCORE) != 1:
        raise ApiBackendError(f"{pipeline.name} is not a re-ranker: its SCORE holds "
                              f"{pipeline.width(SCORE)} labels per pair, a re-ranker one")
    activation = pipeline.activation
    if activation not in ("sigmoid", "identity"):
        if raw or activation is not None:
            raise ApiInvalidRequest(
                f"{pipeline.name}'s scores come with an activation its config does not name "
                f"({activation!r}), so raw scores cannot be told from them: rebuild it with "
                "tools build-repo", "raw_scores")
        activation = "sigmoid"  # a pipeline that does not say: its scores as they come
    texts = list(texts)
    if not truncate:
        await pipeline.texts.count([query] * len(texts), texts, truncate=False, param="texts")
    answer = await pipeline.run_texts(gateway.backend, {TEXT: [query] * len(texts),
                                                        PAIR: texts}, [SCORE])
    scores = answer[SCORE][:, 0].astype(np.float64)
    if activation == "sigmoid":
        if not raw:
            return scores
        clipped = np.clip(scores, 1e-30, 1 - 1e-7)
        return np.log(clipped) - np.log1p(-clipped)
    return scores if raw else _sigmoid(scores)


async def class_scores(gateway: Gateway, pipeline: Pipeline, texts: Sequence[str], *,
                       raw: bool, truncate: bool, single: bool = False) -> np.ndarray:
    """Per text, a score per label: the pipeline's ``PROBABILITIES`` (its softmax or
    sigmoid), or with ``raw`` the classifier's logits (sent as token ids to the model the
    tokenizer feeds, so the scores are exact)."""
    texts = list(texts)
    if not truncate:
        await pipeline.texts.count(texts, truncate=False, param="inputs", single=single)
    if not raw:
        answer = await pipeline.run_texts(gateway.backend, {TEXT: texts}, [PROBABILITIES])
        return answer[PROBABILITIES]
    tensor = pipeline.id_output
    if tensor is None:
        raise ApiInvalidRequest(f"{pipeline.name} has no model that takes token ids and gives "
                                "its raw scores", "raw_scores")
    return await pipeline.run_ids(gateway.backend, pipeline.texts.encode(texts), tensor)


async def entities(gateway: Gateway, pipeline: Pipeline, texts: Sequence[str], *,
                   truncate: bool, single: bool = False) -> list[list[dict]]:
    """Per text, the entities a token-classification pipeline found (its ``ENTITIES``: one
    UTF-8 JSON array per text, the transformers pipeline's keys, character offsets)."""
    texts = list(texts)
    if not truncate:
        await pipeline.texts.count(texts, truncate=False, param="inputs", single=single)
    answer = await pipeline.run_texts(gateway.backend, {TEXT: texts}, [ENTITIES])
    return [json.loads(value.decode("utf-8")) for value in answer[ENTITIES].reshape(-1)]
