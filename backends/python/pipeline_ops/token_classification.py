"""Token-classification postprocessing: per-token logits to entities with character offsets,
aggregated as transformers' ``pipeline("token-classification", aggregation_strategy=...)`` does.

Per text: softmax over each token's logits, special tokens dropped, sub-words found from the
tokenizer's offsets, then ``none`` (one entity per token), ``simple`` (adjacent tokens of one
B-/I- tag merged), or ``first``/``average``/``max`` (a word's tokens agree on one label first).
Labels in ``ignore_labels`` (``O``) are dropped. Offsets are indices of Unicode code points into
the text as sent (Python ``str`` indices), ``end`` exclusive. Vectorised where it can be; a bad
request fails alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .batching import Prepared, run_batched
from .errors import ConfigurationError, InvalidInput
from .text import TEXT_INPUT, decode_texts

# transformers' aggregation strategies (tools.models.hf_folder.AGGREGATIONS: tools add offers them)
AGGREGATIONS = ("none", "simple", "first", "average", "max")
IDS, LOGITS, OFFSETS, SPECIAL = "input_ids", "logits", "offsets", "special_tokens_mask"
INPUTS = (TEXT_INPUT, IDS, LOGITS, OFFSETS, SPECIAL)
OUTPUT = "entities"
DEFAULT_IGNORE_LABELS = ("O",)
UNBOUNDED = 1 << 62  # decode_texts' byte limit, when the tokenizer step already applied one

Entity = dict[str, Any]


@dataclass(frozen=True)
class TokenizerView:
    """What the aggregation reads of the tokenizer: token strings, their decoding, the unknown
    token and whether sub-words are marked (WordPiece's ``##``)."""

    id_to_token: Callable[[int], str | None]
    decode: Callable[[list[str]], str]
    unk_id: int | None
    word_aware: bool

    @classmethod
    def of(cls, tokenizer: Any) -> TokenizerView:
        """The view of a ``tokenizers.Tokenizer``, as transformers' fast tokenizer reads it:
        ``convert_tokens_to_string`` is the decoder (spaces without one), ``is_subword`` comes
        from the model's ``continuing_subword_prefix`` when it has one."""
        decoder = tokenizer.decoder
        model = json.loads(tokenizer.to_str()).get("model", {})
        unk = model.get("unk_token")
        if isinstance(unk, str):
            unk_id = tokenizer.token_to_id(unk)
        else:
            unk_id = model.get("unk_id") if isinstance(model.get("unk_id"), int) else None
        return cls(
            id_to_token=tokenizer.id_to_token,
            decode=decoder.decode if decoder is not None else " ".join,
            unk_id=unk_id,
            word_aware=bool(getattr(tokenizer.model, "continuing_subword_prefix", None)),
        )


@dataclass(frozen=True)
class AggregationSettings:
    """What the ``token_classification_postprocess`` model reads from its config."""

    labels: tuple[str, ...]
    aggregation: str = "simple"
    ignore_labels: frozenset[str] = frozenset(DEFAULT_IGNORE_LABELS)

    @classmethod
    def from_parameters(cls, params: Mapping[str, str], labels: Sequence[str],
                        model: str) -> AggregationSettings:
        """Parse ``aggregation_strategy`` (default ``simple``) and ``ignore_labels`` (a JSON
        list, default ``["O"]``).

        Raises:
            ConfigurationError: an unknown strategy or a malformed list, naming the model.
        """
        aggregation = params.get("aggregation_strategy") or "simple"
        if aggregation not in AGGREGATIONS:
            raise ConfigurationError(
                f"model {model!r}: parameter 'aggregation_strategy' must be one of "
                f"{list(AGGREGATIONS)}, got {aggregation!r}")
        raw = params.get("ignore_labels")
        ignore = DEFAULT_IGNORE_LABELS
        if raw:
            try:
                ignore = json.loads(raw)
            except ValueError:
                ignore = None
            if not isinstance(ignore, list) or not all(isinstance(x, str) for x in ignore):
                raise ConfigurationError(
                    f"model {model!r}: parameter 'ignore_labels' must be a JSON list of label "
                    f"names, e.g. [\"O\"], got {raw!r}")
        return cls(tuple(labels), aggregation, frozenset(ignore))


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis in float32, as the reference pipeline computes its scores."""
    logits = logits.astype(np.float32)
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def _pre_entities(text: str, ids: np.ndarray, scores: np.ndarray, offsets: np.ndarray,
                  special: np.ndarray, view: TokenizerView) -> list[Entity]:
    """One record per real token: its string, scores, offsets, index and whether it continues a
    word (transformers' ``gather_pre_entities``)."""
    records = []
    for index in np.flatnonzero(special == 0):
        token_id = int(ids[index])
        word = view.id_to_token(token_id)
        start, end = int(offsets[index, 0]), int(offsets[index, 1])
        word_ref = text[start:end]
        if view.word_aware:
            is_subword = len(word) != len(word_ref)
        else:  # the reference's fallback: a token not after a space continues a word
            is_subword = start > 0 and " " not in text[start - 1:start + 1]
        if token_id == view.unk_id:
            word, is_subword = word_ref, False
        records.append({"word": word, "scores": scores[index], "start": start, "end": end,
                        "index": int(index), "is_subword": is_subword})
    return records


def _aggregate_word(tokens: list[Entity], aggregation: str, labels: Sequence[str],
                    view: TokenizerView) -> Entity:
    if aggregation == "first":
        scores = tokens[0]["scores"]
    elif aggregation == "max":
        scores = max(tokens, key=lambda t: t["scores"].max())["scores"]
    else:  # average: as the reference's np.nanmean (the same float32 sum and division)
        scores = np.stack([t["scores"] for t in tokens]).mean(axis=0)
    best = int(scores.argmax())
    return {"entity": labels[best], "score": scores[best],
            "word": view.decode([t["word"] for t in tokens]),
            "start": tokens[0]["start"], "end": tokens[-1]["end"]}


def _tag(label: str) -> tuple[str, str]:
    """``("B"|"I", tag)``: a label without a B-/I- prefix continues (``I``)."""
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label


def _group(entities: list[Entity], view: TokenizerView) -> Entity:
    # the mean of the scores (the reference's np.nanmean, ten times slower per call; scores of
    # finite logits are never NaN)
    scores = [float(e["score"]) for e in entities]
    return {"entity_group": entities[0]["entity"].split("-", 1)[-1],
            "score": sum(scores) / len(scores),
            "word": view.decode([e["word"] for e in entities]),
            "start": entities[0]["start"], "end": entities[-1]["end"]}


def _group_entities(entities: list[Entity], view: TokenizerView) -> list[Entity]:
    """Adjacent entities of one tag merge unless the next one begins (``B-``)."""
    groups, current = [], []
    for entity in entities:
        if current:
            bi, tag = _tag(entity["entity"])
            if tag != _tag(current[-1]["entity"])[1] or bi == "B":
                groups.append(_group(current, view))
                current = []
        current.append(entity)
    if current:
        groups.append(_group(current, view))
    return groups


def text_entities(text: str, ids: np.ndarray, logits: np.ndarray, offsets: np.ndarray,
                  special: np.ndarray, view: TokenizerView,
                  settings: AggregationSettings) -> list[Entity]:
    """The entities of one text, as the reference pipeline returns them (plain Python values).

    Args:
        text: the text as sent (offsets index into it).
        ids: int ``[length]`` token ids.
        logits: float ``[length, labels]``.
        offsets: int ``[length, 2]`` character span of each token.
        special: int ``[length]``, 1 for special and padding tokens (skipped).
        view: the tokenizer's strings and decoding.
        settings: labels, strategy and labels to drop.

    Returns:
        ``none``: ``{entity, score, index, word, start, end}`` per token; otherwise
        ``{entity_group, score, word, start, end}`` per entity; in text order.
    """
    labels, aggregation = settings.labels, settings.aggregation
    records = _pre_entities(text, ids, softmax(logits), offsets, special, view)
    if aggregation in ("none", "simple"):
        entities = []
        for record in records:
            best = int(record["scores"].argmax())
            entities.append({"entity": labels[best], "score": record["scores"][best],
                             "index": record["index"], "word": record["word"],
                             "start": record["start"], "end": record["end"]})
    else:
        entities, word = [], []
        for record in records:
            if word and not record["is_subword"]:
                entities.append(_aggregate_word(word, aggregation, labels, view))
                word = []
            word.append(record)
        if word:
            entities.append(_aggregate_word(word, aggregation, labels, view))
    key = "entity"
    if aggregation != "none":
        entities, key = _group_entities(entities, view), "entity_group"
    return [{**e, "score": float(e["score"])} for e in entities
            if e[key] not in settings.ignore_labels]


def _check_request(inputs: Mapping[str, Any], labels: int) -> Prepared:
    """Validate one request's five inputs: rows agree, one length per request, ``labels`` columns.

    Raises:
        InvalidInput: a missing input or a shape that disagrees, naming the input.
    """
    for name in INPUTS:
        if inputs.get(name) is None:
            raise InvalidInput(f"input '{name}' is missing")
    # the tokenizer step bounded the texts' size; here they are only decoded
    texts = decode_texts(inputs[TEXT_INPUT], max_bytes=UNBOUNDED)
    arrays = {}
    for name, rank, kind in ((IDS, 2, "iu"), (LOGITS, 3, "f"), (OFFSETS, 3, "iu"),
                             (SPECIAL, 2, "iu")):
        value = np.asarray(inputs[name])
        if value.ndim != rank or value.dtype.kind not in kind:
            raise InvalidInput(f"input '{name}' must be a rank-{rank} "
                               f"{'float' if kind == 'f' else 'integer'} tensor, got "
                               f"{value.dtype} {list(value.shape)}")
        arrays[name] = value
    rows, length = arrays[IDS].shape
    expected = {IDS: (rows, length), LOGITS: (rows, length, labels), OFFSETS: (rows, length, 2),
                SPECIAL: (rows, length)}
    for name, shape in expected.items():
        if arrays[name].shape != shape:
            raise InvalidInput(f"input '{name}' has shape {list(arrays[name].shape)}, expected "
                               f"{list(shape)} ({len(texts)} texts, {labels} labels)")
    if rows != len(texts):
        raise InvalidInput(f"input '{IDS}' has {rows} rows for {len(texts)} texts")
    return {"texts": texts, **{name: list(arrays[name]) for name in expected}}


def entities_requests(requests: Sequence[Mapping[str, Any]], view: TokenizerView,
                      settings: AggregationSettings) -> list[dict[str, np.ndarray] | Exception]:
    """The entities of every text of every request of one ``execute`` call.

    Returns:
        Per request ``{"entities": object [rows, 1]}``, each element the UTF-8 JSON array of that
        text's entities; or the exception that failed the request (``InvalidInput``).
    """
    def compute(prepared: list[Prepared]) -> dict[str, np.ndarray]:
        out = []
        for item in prepared:
            for row, text in enumerate(item["texts"]):
                found = text_entities(text, item[IDS][row], item[LOGITS][row], item[OFFSETS][row],
                                      item[SPECIAL][row], view, settings)
                out.append(json.dumps(found, ensure_ascii=False).encode("utf-8"))
        return {OUTPUT: np.array(out, dtype=np.object_).reshape(-1, 1)}

    return run_batched(requests, lambda inputs: _check_request(inputs, len(settings.labels)),
                       compute)


def check_config(config: Mapping[str, Any], labels: Sequence[str]) -> None:
    """The config has the five inputs, ``logits`` with one column per label, and ``entities``.

    Raises:
        ConfigurationError: naming the model and the tensor.
    """
    name = config.get("name", "token_classification_postprocess")
    inputs = {t["name"]: [int(d) for d in t.get("dims", [])] for t in config.get("input", [])}
    outputs = {t["name"]: [int(d) for d in t.get("dims", [])] for t in config.get("output", [])}
    missing = [n for n in INPUTS if n not in inputs]
    if missing:
        raise ConfigurationError(f"model {name!r}: inputs {missing} are missing (it takes "
                                 f"{list(INPUTS)})")
    if inputs[LOGITS] != [-1, len(labels)]:
        raise ConfigurationError(f"model {name!r}: 'logits' must have dims [-1, {len(labels)}] "
                                 f"({len(labels)} labels), got {inputs[LOGITS]}")
    if outputs.get(OUTPUT) != [1]:
        raise ConfigurationError(f"model {name!r}: output {OUTPUT!r} must have dims [1], got "
                                 f"{outputs.get(OUTPUT, 'no such output')}")


def load_view(path: str | Path) -> TokenizerView:
    """The view of the ``tokenizer.json`` at ``path``.

    Raises:
        ConfigurationError: the file is missing.
    """
    from tokenizers import Tokenizer

    path = Path(path)
    if not path.is_file():
        raise ConfigurationError(f"tokenizer_file {path} does not exist")
    return TokenizerView.of(Tokenizer.from_file(str(path)))
