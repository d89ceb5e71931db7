"""The kinds of pipeline the APIs serve, each with its routes: a new kind is one entry of
``KINDS``.

A pipeline's kind follows from its tensors, the same in the spec (``pipelines:`` entries) and in
the configuration Triton loaded: exactly the kind's inputs, and at least its outputs. So a
container that has only the model repository knows its pipelines' kinds as well as the spec
does, and ``tools add``'s pipelines are served the moment they are built.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tools.api import openai_routes, tei_routes
from tools.api.route import Kind, kind_of


KINDS: tuple[Kind, ...] = (
    # hf-text-embedding, and the shipped text_embedding pipelines
    Kind("embedding", ("TEXT",), ("EMBEDDING",),
         (openai_routes.EMBEDDINGS, tei_routes.EMBED), "embedding"),
    # hf-cross-encoder: SCORE [1] per (TEXT, TEXT_PAIR)
    Kind("reranker", ("TEXT", "TEXT_PAIR"), ("SCORE",), (tei_routes.RERANK,), "reranker"),
    # hf-sequence-classification with labels (softmax or sigmoid)
    Kind("classifier", ("TEXT",), ("LABEL", "SCORE", "PROBABILITIES"),
         (tei_routes.PREDICT,), "classifier"),
    # hf-token-classification: ENTITIES, one JSON array of entities per text
    Kind("token-classification", ("TEXT",), ("ENTITIES",), (tei_routes.PREDICT_ENTITIES,),
         "classifier"),
)


def paths(kinds: Sequence[Kind] = KINDS) -> list[str]:
    """Every POST path some kind serves, in order."""
    return list(dict.fromkeys(r.path for k in kinds for r in k.routes))


def kind_of_tensors(inputs: Iterable[str], outputs: Iterable[str]) -> Kind | None:
    """The kind of a pipeline with these input and output names (None: the APIs do not serve
    it)."""
    return kind_of(KINDS, inputs, outputs)


def front_paths(kinds: Sequence[Kind] = KINDS) -> tuple[str, ...]:
    """What a front routes to the gateway on the public HTTP port: OpenAI's ``/v1/`` (a prefix:
    ``/v1/embeddings``, ``/v1/models``, ``/v1/models/{id}``) and TEI's paths (exact); Triton's
    ``/v2/`` stays Triton's."""
    tei = [p for p in paths(kinds) if not p.startswith("/v1/")]
    return ("/v1/", *tei, "/info", "/health")
