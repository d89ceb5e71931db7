"""The build's entity parity (tools/build_repo/entity_parity.py): the served tokenizer and
aggregation against transformers' token-classification pipeline, every strategy.

A tiny BERT token classifier (random weights, 64 positions) saved by the test; its "exported
graph" is the PyTorch model itself, or a deliberately wrong one, so only the served steps around
it are judged.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.add_helpers import NER_LABELS, WORDS, save_tokenizer
from tools import paths
from tools.build_repo.entity_parity import AGGREGATIONS, check_entities
from tools.errors import ParityError

pytestmark = [pytest.mark.torch]
TEXTS = ["The man is eating food.", "A cat sits outside on the warm stones!", "dog",
         "Zorro plays the violin in Zürich 🎻", "The quick brown fox jumps over the lazy dog. " * 12]


def _folder(folder: Path, model_max_length: int | None):
    import torch
    from transformers import BertConfig, BertForTokenClassification

    save_tokenizer(folder)
    config = BertConfig(vocab_size=len(WORDS) + 7, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                        id2label=dict(enumerate(NER_LABELS)),
                        label2id={n: i for i, n in enumerate(NER_LABELS)})
    torch.manual_seed(0)
    model = BertForTokenClassification(config).eval()
    model.save_pretrained(str(folder))
    if model_max_length is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(
            {"model_max_length": model_max_length}))
    return model


def _runner(model, shuffle: bool = False):
    import torch

    def run(feeds):
        with torch.no_grad():
            logits = model(input_ids=torch.from_numpy(feeds["input_ids"]),
                           attention_mask=torch.from_numpy(feeds["attention_mask"])).logits
        return {"logits": (logits.roll(1, dims=-1) if shuffle else logits).numpy()}

    return run


def _check(folder: Path, model, max_length: int, shuffle: bool = False):
    from tokenizers import Tokenizer

    return check_entities("ner_classifier", folder, model,
                          Tokenizer.from_file(str(folder / "tokenizer.json")),
                          _runner(model, shuffle), NER_LABELS, max_length, paths.BACKENDS, 1e-4,
                          TEXTS)


def test_every_strategy_of_the_served_steps_matches_transformers(tmp_path):
    model = _folder(tmp_path, model_max_length=32)
    figures, left_out = _check(tmp_path, model, 32)
    assert [f.strategy for f in figures] == list(AGGREGATIONS)
    assert all(f.ok and f.texts == len(TEXTS) and f.entities > 0 for f in figures)
    assert max(f.max_abs for f in figures) <= 1e-4
    assert left_out == []


def test_texts_transformers_would_not_cut_are_left_out_and_named(tmp_path):
    # no model_max_length: transformers sends the long text whole; the recipe cuts at 64
    model = _folder(tmp_path, model_max_length=None)
    figures, left_out = _check(tmp_path, model, 64)
    assert left_out == [TEXTS[-1]]
    assert all(f.ok and f.texts == len(TEXTS) - 1 for f in figures)


def test_served_entities_that_differ_fail_the_build_naming_strategy_text_and_entity(tmp_path):
    model = _folder(tmp_path, model_max_length=32)
    with pytest.raises(ParityError) as caught:
        _check(tmp_path, model, 32, shuffle=True)
    message = str(caught.value)
    assert message.startswith("model 'ner_classifier': the served entities differ from "
                              "transformers' token-classification pipeline:")
    for strategy in AGGREGATIONS:
        assert f"\n  {strategy}: text " in message
    assert "entity 1 is" in message and "served," in message and "in transformers" in message


def test_a_served_length_other_than_the_references_fails(tmp_path):
    model = _folder(tmp_path, model_max_length=32)
    with pytest.raises(ParityError, match=r"text 5 \('The quick brown fox"):
        _check(tmp_path, model, 16)  # the served tokenizer would cut at 16, transformers at 32
