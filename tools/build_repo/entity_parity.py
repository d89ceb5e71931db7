"""Entity parity of a token classifier: the served steps against transformers' pipeline.

The tokenizer with offsets, the exported graph and the aggregation of the served
``pipeline_ops`` run in this process on varied texts (names and places, CJK, Arabic, Cyrillic,
Devanagari, emoji, punctuation runs, one character, a text over the length limit), for every
aggregation strategy, against ``pipeline("token-classification", aggregation_strategy=...)``
on the PyTorch model: the same entities, labels, words and character offsets, scores within the
model's ``atol``. Every strategy runs; the failures are raised once.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tools.errors import ParityError
from tools.models.hf_folder import AGGREGATIONS

# The served modules of pipeline_ops this check runs (hashed into the classifier's export key).
SERVED_MODULES = ("batching.py", "errors.py", "text.py", "token_classification.py")
# One text per family the served offsets must get right; the last one is over every length
# limit, so truncation is compared too.
PARITY_TEXTS = (
    "John Smith lives in New York and works for Google.",
    "Angela Merkel met Emmanuel Macron in Paris on Tuesday.",
    "Dr. María García-López flew from São Paulo to Zürich via Reykjavík.",
    "IBM, Microsoft & Apple Inc. (NASDAQ: AAPL) reported earnings.",
    "東京タワーは日本の東京にあります。",
    "北京是中华人民共和国的首都。",
    "محمد بن سلمان زار القاهرة يوم الأحد.",
    "Владимир Набоков родился в Санкт-Петербурге.",
    "नरेंद्र मोदी ने नई दिल्ली में भाषण दिया।",
    "I ❤️ Berlin 🇩🇪 and 🍕 in Napoli!!! 👩‍👩‍👧",
    "Wait... what?!?! -- (really) ;;; *** ///",
    "A",
    "7",
    "   spaces   around   Oslo   ",
    "line one\ttabbed\nline two in Lisbon",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ☃ ⅷ ﬁnance Ångström naïve café",
    "Barack Obama visited Berlin, Tokyo and Nairobi with Michelle. " * 60,
)


@dataclass(frozen=True)
class EntityFigure:
    """One strategy over the texts: how many entities, the worst score difference, agreement."""

    strategy: str
    texts: int
    entities: int
    max_abs: float
    ok: bool
    first_difference: str = ""


def _served_ops(backends: Path):
    """The served ``pipeline_ops`` modules of the spec's ``backends`` folder."""
    sys.path.insert(0, str(backends))
    try:
        from pipeline_ops import text, token_classification
    finally:
        sys.path.pop(0)
    return text, token_classification


def served_entities(tokenizer: Any, runner: Callable[[dict], dict], labels: Sequence[str],
                    max_length: int, backends: Path, texts: Sequence[str]
                    ) -> dict[str, list[list[dict]]]:
    """Per strategy, the entities of ``texts`` as the served steps make them (one request).

    Args:
        tokenizer: the folder's ``tokenizers.Tokenizer`` (its own truncation is replaced).
        runner: the exported graph: ``input_ids``, ``attention_mask`` -> ``logits``.
        labels: the labels by index.
        max_length: tokens per text, special tokens included (the served truncation).
        backends: the folder holding ``pipeline_ops``.
        texts: the texts.
    """
    text, token_classification = _served_ops(backends)
    text.configure_tokenizer(tokenizer, max_length)
    request = {text.TEXT_INPUT: np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)}
    (tokens,) = text.tokenize_requests(tokenizer, [request], text.pad_token_id(tokenizer),
                                       offsets=True)
    if isinstance(tokens, Exception):
        raise tokens
    logits = runner({"input_ids": tokens["input_ids"],
                     "attention_mask": tokens["attention_mask"]})["logits"]
    view = token_classification.TokenizerView.of(tokenizer)
    out = {}
    for strategy in AGGREGATIONS:
        settings = token_classification.AggregationSettings(tuple(labels), strategy)
        (answer,) = token_classification.entities_requests(
            [{**request, **tokens, "logits": logits}], view, settings)
        if isinstance(answer, Exception):
            raise answer
        out[strategy] = [json.loads(value) for value in answer["entities"][:, 0]]
    return out


def reference_entities(model: Any, tokenizer: Any, texts: Sequence[str]
                       ) -> dict[str, list[list[dict]]]:
    """Per strategy, ``transformers.pipeline("token-classification")`` on ``texts``.

    Each text runs through the pipeline's own steps as its ``run_single`` does (``preprocess``,
    ``forward``, ``postprocess``), the model once per text and ``postprocess`` once per strategy:
    what ``pipe(text, aggregation_strategy=...)`` returns, without five forward passes.
    """
    from transformers import pipeline

    pipe = pipeline("token-classification", model=model, tokenizer=tokenizer, device="cpu")
    preprocess, forward, _ = pipe._sanitize_parameters()
    outputs = [[pipe.forward(chunk, **forward) for chunk in pipe.preprocess(text, **preprocess)]
               for text in texts]
    out = {}
    with warnings.catch_warnings():
        # a tokenizer without sub-word marks: the reference warns of its own fallback rule
        warnings.simplefilter("ignore", UserWarning)
        for strategy in AGGREGATIONS:
            _, _, postprocess = pipe._sanitize_parameters(aggregation_strategy=strategy)
            out[strategy] = [[{k: (float(v) if k == "score" else v) for k, v in e.items()}
                              for e in pipe.postprocess(chunks, **postprocess)]
                             for chunks in outputs]
    return out


def _key(entity: dict) -> tuple:
    label = entity.get("entity_group", entity.get("entity"))
    return label, entity.get("word"), entity.get("start"), entity.get("end"), entity.get("index")


def compare(strategy: str, texts: Sequence[str], served: list[list[dict]],
            reference: list[list[dict]], atol: float) -> EntityFigure:
    """One strategy's figure: every text's entities equal, scores within ``atol``."""
    worst, count, difference = 0.0, 0, ""
    for number, (text, got, want) in enumerate(zip(texts, served, reference), start=1):
        count += len(want)
        keys = [_key(e) for e in got], [_key(e) for e in want]
        if keys[0] != keys[1]:
            first = next((i for i, (a, b) in enumerate(zip(*keys)) if a != b),
                         min(len(keys[0]), len(keys[1])))
            shown = [k[first] if first < len(k) else "nothing" for k in keys]
            difference = difference or (
                f"text {number} ({text[:40]!r}): entity {first + 1} is {shown[0]} served, "
                f"{shown[1]} in transformers ({len(got)} vs {len(want)} entities)")
            continue
        for a, b in zip(got, want):
            worst = max(worst, abs(a["score"] - b["score"]))
    ok = not difference and worst <= atol
    if not difference and not ok:
        difference = f"a score differs by {worst:.3g} (atol {atol:g})"
    return EntityFigure(strategy, len(texts), count, worst, ok, difference)


def check_entities(name: str, folder: Path, model: Any, tokenizer: Any, runner: Callable,
                   labels: Sequence[str], max_length: int, backends: Path, atol: float,
                   texts: Sequence[str] = PARITY_TEXTS) -> tuple[list[EntityFigure], list[str]]:
    """Every strategy's entities, served steps against transformers.

    Args:
        name: the model (named in the error).
        folder: the Hugging Face folder (the reference's tokenizer).
        model: the transformers ``*ForTokenClassification`` model.
        tokenizer: the served ``tokenizers.Tokenizer`` of the folder.
        runner: the exported graph.
        labels: the labels by index.
        max_length: the served truncation (the ``sequence`` axis' max).
        backends: the folder holding ``pipeline_ops``.
        atol: the largest score difference.

    Returns:
        One figure per strategy, and the texts left out: those over ``max_length`` tokens when
        the reference's tokenizer has no limit within the model's positions
        (``model_max_length``), since transformers would then send them whole and the model fail
        on them (the served steps cut them at the positions).

    Raises:
        ParityError: listing every strategy whose entities differ.
    """
    from transformers import AutoTokenizer

    reference_tokenizer = AutoTokenizer.from_pretrained(str(folder))
    left_out = []
    positions = getattr(model.config, "max_position_embeddings", None)
    if isinstance(positions, int) and reference_tokenizer.model_max_length > positions:
        left_out = [t for t in texts if len(reference_tokenizer(t)["input_ids"]) > max_length]
        texts = [t for t in texts if t not in left_out]
    reference = reference_entities(model, reference_tokenizer, texts)
    served = served_entities(tokenizer, runner, labels, max_length, backends, texts)
    figures = [compare(s, texts, served[s], reference[s], atol) for s in AGGREGATIONS]
    failed = [f for f in figures if not f.ok]
    if failed:
        raise ParityError(
            f"model {name!r}: the served entities differ from transformers' token-classification "
            f"pipeline:\n" + "\n".join(f"  {f.strategy}: {f.first_difference}" for f in failed))
    return figures, left_out


def figures_to_manifest(figures: list[EntityFigure]) -> list[dict]:
    """Figures as JSON-ready dicts for the build manifest."""
    return [asdict(f) for f in figures]
