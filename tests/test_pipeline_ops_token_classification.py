"""Specification of pipeline_ops.token_classification: per-token logits to entities with
character offsets, each aggregation strategy as transformers' token-classification pipeline
defines it (tools/build_repo/entity_parity.py and tests/test_add_token_classification.py compare
with the pipeline itself), and a bad request failing alone. Small real tokenizers, hand-made
logits; no Triton, no torch."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pipeline_ops.errors import ConfigurationError, InvalidInput
from pipeline_ops.text import load_tokenizer, tokenize_requests
from pipeline_ops.token_classification import (
    AggregationSettings,
    TokenizerView,
    check_config,
    entities_requests,
    text_entities,
)
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

LABELS = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")
VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "john", "##son", "lives", "in", "new", "york",
              ".", "!"]


def _save(tokenizer: Tokenizer, folder) -> Tokenizer:
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tokenizer.save(str(folder / "tokenizer.json"))
    return load_tokenizer(folder / "tokenizer.json", 32)


@pytest.fixture()
def wordpiece(tmp_path) -> Tokenizer:
    """A BERT-style WordPiece tokenizer: sub-words marked ``##``, decoded without them."""
    tokenizer = Tokenizer(models.WordPiece({t: i for i, t in enumerate(VOCABULARY)},
                                           unk_token="[UNK]"))
    tokenizer.decoder = decoders.WordPiece()
    return _save(tokenizer, tmp_path)


@pytest.fixture()
def word_level(tmp_path) -> Tokenizer:
    """A tokenizer without sub-word marks (no ``continuing_subword_prefix``)."""
    vocabulary = {t: i for i, t in enumerate(v for v in VOCABULARY if not v.startswith("##"))}
    return _save(Tokenizer(models.WordLevel(vocabulary, unk_token="[UNK]")), tmp_path)


def _logits(labels: list[tuple[str, float]]) -> np.ndarray:
    """``[CLS]``, one row per (label, strength) and ``[SEP]``: that label's logit is the strength."""
    rows = np.zeros((len(labels) + 2, len(LABELS)), np.float32)
    for row, (label, strength) in enumerate(labels, start=1):
        rows[row, LABELS.index(label)] = strength
    return rows


def _score(strength: float) -> float:
    """The softmax probability of a label whose logit is ``strength`` and the others' 0."""
    return float(np.exp(strength) / (np.exp(strength) + len(LABELS) - 1))


def _entities(tokenizer: Tokenizer, text: str, labels: list[tuple[str, float]],
              aggregation: str, ignore: tuple[str, ...] = ("O",)) -> list[dict]:
    encoding = tokenizer.encode(text)
    assert len(encoding.ids) == len(labels) + 2, encoding.tokens
    return text_entities(text, np.array(encoding.ids), _logits(labels), np.array(encoding.offsets),
                         np.array(encoding.special_tokens_mask), TokenizerView.of(tokenizer),
                         AggregationSettings(LABELS, aggregation, frozenset(ignore)))


JOHNSON = "Johnson lives in New York."
JOHNSON_TAGS = [("B-PER", 3.0), ("I-PER", 5.0), ("O", 4.0), ("O", 4.0), ("B-LOC", 6.0),
                ("I-LOC", 2.0), ("O", 4.0)]


def test_simple_merges_a_begin_and_its_inside_tokens_into_one_entity_with_its_span(wordpiece):
    found = _entities(wordpiece, JOHNSON, JOHNSON_TAGS, "simple")

    assert [(e["entity_group"], e["word"], e["start"], e["end"]) for e in found] == [
        ("PER", "johnson", 0, 7), ("LOC", "new york", 17, 25)]
    assert found[0]["score"] == pytest.approx((_score(3) + _score(5)) / 2, abs=1e-6)
    assert JOHNSON[found[1]["start"]:found[1]["end"]] == "New York"
    assert set(found[0]) == {"entity_group", "score", "word", "start", "end"}


def test_none_answers_each_token_with_its_label_index_and_token_string(wordpiece):
    found = _entities(wordpiece, JOHNSON, JOHNSON_TAGS, "none")

    assert [(e["entity"], e["index"], e["word"], e["start"], e["end"]) for e in found] == [
        ("B-PER", 1, "john", 0, 4), ("I-PER", 2, "##son", 4, 7), ("B-LOC", 5, "new", 17, 20),
        ("I-LOC", 6, "york", 21, 25)]
    assert found[1]["score"] == pytest.approx(_score(5), abs=1e-6)


@pytest.mark.parametrize("aggregation, label, strength", [
    ("first", "PER", 3.0),  # the word's first token decides
    ("max", "LOC", 5.0),  # its most confident token decides
    ("average", "LOC", None),  # the label of the mean scores: LOC's mean is the higher
])
def test_word_strategies_give_a_word_the_label_its_tokens_agree_on(wordpiece, aggregation, label,
                                                                   strength):
    tags = [("B-PER", 3.0), ("B-LOC", 5.0), ("O", 4.0), ("O", 4.0), ("O", 4.0), ("O", 4.0),
            ("O", 4.0)]
    found = _entities(wordpiece, JOHNSON, tags, aggregation)

    assert [(e["entity_group"], e["word"], e["start"], e["end"]) for e in found] == [
        (label, "johnson", 0, 7)]
    if strength is not None:
        assert found[0]["score"] == pytest.approx(_score(strength), abs=1e-6)
    else:  # each token's other labels share the rest of its probability equally
        per_token = [np.full(5, (1 - _score(s)) / 4) for s in (3.0, 5.0)]
        per_token[0][1], per_token[1][3] = _score(3), _score(5)
        mean = (per_token[0] + per_token[1]) / 2
        assert found[0]["score"] == pytest.approx(mean[3], abs=1e-6)


def test_two_begin_tags_of_one_type_stay_two_entities(wordpiece):
    found = _entities(wordpiece, "John John", [("B-PER", 3.0), ("B-PER", 3.0)], "simple")
    assert [(e["word"], e["start"], e["end"]) for e in found] == [("john", 0, 4), ("john", 5, 9)]


def test_an_unknown_token_is_named_by_its_text_and_starts_a_word(wordpiece):
    found = _entities(wordpiece, "Zorro lives", [("B-PER", 4.0), ("O", 4.0)], "first")
    assert [(e["entity_group"], e["word"], e["start"], e["end"]) for e in found] == [
        ("PER", "Zorro", 0, 5)]


def test_offsets_count_characters_not_bytes(wordpiece):
    text = "🍕 in Zürich! john"
    found = _entities(wordpiece, text, [("O", 4.0), ("O", 4.0), ("B-LOC", 4.0), ("O", 4.0),
                                        ("B-PER", 4.0)], "simple")
    assert [(e["word"], e["start"], e["end"]) for e in found] == [("Zürich", 5, 11),
                                                                  ("john", 13, 17)]
    assert [text[e["start"]:e["end"]] for e in found] == ["Zürich", "john"]


def test_a_tokenizer_without_subword_marks_joins_tokens_not_after_a_space(word_level):
    # the reference's fallback: "york." is one word, so "." takes york's label under "first"
    found = _entities(word_level, "new york.", [("B-LOC", 4.0), ("I-LOC", 4.0), ("O", 6.0)],
                      "first")
    assert [(e["entity_group"], e["word"], e["start"], e["end"]) for e in found] == [
        ("LOC", "new york .", 0, 9)]


def test_ignore_labels_decides_what_is_left_out(wordpiece):
    kept = _entities(wordpiece, "lives in", [("O", 4.0), ("O", 4.0)], "simple", ignore=())
    assert [(e["entity_group"], e["word"]) for e in kept] == [("O", "lives in")]
    assert _entities(wordpiece, "lives in", [("O", 4.0), ("O", 4.0)], "simple") == []


def _request(tokenizer: Tokenizer, texts: list[str], labels: int = len(LABELS)) -> dict:
    array = np.array([[t.encode()] for t in texts], dtype=object)
    (tokens,) = tokenize_requests(tokenizer, [{"TEXT": array}], offsets=True)
    logits = np.zeros((*tokens["input_ids"].shape, labels), np.float32)
    logits[..., min(1, labels - 1)] = 3.0  # every token B-PER
    return {"TEXT": array, **tokens, "logits": logits}


def test_entities_requests_answers_one_json_array_per_text_and_fails_a_bad_request_alone(
    wordpiece,
):
    good = _request(wordpiece, ["John lives in New York.", "john"])
    bad = _request(wordpiece, ["john"], labels=3)
    del good["attention_mask"]
    view, settings = TokenizerView.of(wordpiece), AggregationSettings(LABELS, "simple")

    answered, refused, again = entities_requests([good, bad, good], view, settings)

    assert answered["entities"].shape == (2, 1) and answered["entities"].dtype == object
    first = json.loads(answered["entities"][0, 0].decode("utf-8"))
    assert [e["word"] for e in first] == ["john", "lives", "in", "new", "york", "."]
    assert [e["start"] for e in first] == [0, 5, 11, 14, 18, 22]
    assert isinstance(refused, InvalidInput) and "'logits'" in str(refused)
    assert again["entities"].tolist() == answered["entities"].tolist()


def test_entities_requests_names_a_missing_input(wordpiece):
    request = _request(wordpiece, ["john"])
    del request["offsets"]
    (answer,) = entities_requests([request], TokenizerView.of(wordpiece),
                                  AggregationSettings(LABELS))
    assert isinstance(answer, InvalidInput) and str(answer) == "input 'offsets' is missing"


def test_settings_read_the_strategy_and_the_ignored_labels():
    settings = AggregationSettings.from_parameters(
        {"aggregation_strategy": "max", "ignore_labels": '["O", "I-PER"]'}, LABELS, "ner")
    assert (settings.aggregation, settings.ignore_labels) == ("max", frozenset({"O", "I-PER"}))
    assert AggregationSettings.from_parameters({}, LABELS, "ner").aggregation == "simple"


@pytest.mark.parametrize("params, message", [
    ({"aggregation_strategy": "longest"}, "'aggregation_strategy' must be one of"),
    ({"ignore_labels": "O"}, "'ignore_labels' must be a JSON list"),
])
def test_settings_refuse_a_bad_parameter_naming_model_and_parameter(params, message):
    with pytest.raises(ConfigurationError, match=f"model 'ner': parameter {message}"):
        AggregationSettings.from_parameters(params, LABELS, "ner")


def test_check_config_wants_one_logits_column_per_label():
    config = {"name": "ner_postprocess",
              "input": [{"name": n, "dims": d} for n, d in (
                  ("TEXT", [1]), ("input_ids", [-1]), ("logits", [-1, 3]), ("offsets", [-1, 2]),
                  ("special_tokens_mask", [-1]))],
              "output": [{"name": "entities", "dims": [1]}]}
    check_config(config, LABELS[:3])
    with pytest.raises(ConfigurationError, match=r"'logits' must have dims \[-1, 5\]"):
        check_config(config, LABELS)
