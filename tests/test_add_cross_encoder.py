"""``tools add hf-cross-encoder``: TEXT, TEXT_PAIR -> SCORE, as sentence-transformers'
``CrossEncoder`` scores the pair.

The cross-encoder is ``BertForSequenceClassification(num_labels=1)`` on all-MiniLM-L6-v2's real
weights with a seeded head, saved as a folder by the test. Its pairs are tokenised together
(``token_type_ids`` marks the second text; long pairs are cut longest-first), and the score is
compared with ``CrossEncoder.predict`` over HTTP and gRPC: its default activation for one label
(sigmoid in the installed sentence-transformers) and, added with ``--activation identity``, the
raw logit.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.add_helpers import PROTOCOLS, infer_inputs, text_batch

pytestmark = [pytest.mark.torch, pytest.mark.server, pytest.mark.timeout(1500)]
PAIRS = [
    ("How do I bake bread without yeast?", "Mix flour, water and baking soda, then bake it."),
    ("How do I bake bread without yeast?", "Stock markets fell sharply on Monday."),
    ("A man is eating food.", "A man is eating a piece of bread."),
    ("Where is the cat? " * 30, "The cat sits outside on the warm stones near the wall. " * 20),
    ("Hello!", "Hi there " * 90),  # one long text: cut from the longer one only
]


@pytest.fixture(scope="module")
def reranker(added_models):
    """The cross-encoder added twice (default activation, identity) in the session's repository
    of every recipe (one spec, one server)."""
    return {"spec": added_models.spec, "folder": added_models.sources["rerank"],
            "result": added_models.result, "server": added_models.server}


def _pair_inputs(pairs) -> dict[str, np.ndarray]:
    return {"TEXT": text_batch([a for a, _ in pairs]), "TEXT_PAIR": text_batch([b for _, b in pairs])}


def _cross_encoder(folder, **kwargs):
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(folder), device="cpu", **kwargs)


def test_the_recipe_writes_a_pair_tokenizer_with_token_types_and_sentence_transformers_activation(
    reranker,
):
    import torch

    from tools.build_repo.spec import load_spec

    spec = load_spec(reranker["spec"])
    assert isinstance(_cross_encoder(reranker["folder"]).activation_fn, torch.nn.Sigmoid)
    assert spec.find("rerank_cross_encoder").recipe.activation == "sigmoid"
    assert spec.find("rerank_raw_cross_encoder").recipe.activation == "identity"
    assert [t.name for t in spec.find("rerank_tokenizer").inputs] == ["TEXT", "TEXT_PAIR"]
    expected = ["input_ids", "attention_mask", "token_type_ids"]
    assert [t.name for t in spec.find("rerank_tokenizer").outputs] == expected
    assert [t.name for t in spec.find("rerank_cross_encoder").inputs] == expected
    pipeline = spec.find("rerank")
    assert [(t.name, t.dtype, t.shape) for t in pipeline.inputs] == [
        ("TEXT", "string", ("batch", 1)), ("TEXT_PAIR", "string", ("batch", 1))]
    assert [(t.name, t.dtype, t.shape) for t in pipeline.outputs] == [
        ("SCORE", "float32", ("batch", 1))]
    parity = reranker["result"]["rerank_cross_encoder"].parity_max_abs["onnxruntime"]
    assert parity <= 1e-4


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cross_encoder_scores_pairs_like_sentence_transformers(reranker, protocol):
    served = infer_inputs(reranker["server"], protocol, "rerank", _pair_inputs(PAIRS),
                          ["SCORE"])["SCORE"]
    reference = _cross_encoder(reranker["folder"]).predict(PAIRS)
    difference = float(np.abs(served[:, 0] - reference).max())
    print(f"cross-encoder (sigmoid) vs CrossEncoder.predict over {protocol}: max abs {difference:.2e}")
    assert served.shape == (len(PAIRS), 1)
    assert difference <= 1e-4
    assert np.ptp(reference) > 1e-2  # the pairs get different scores


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_identity_activation_serves_the_raw_logit_like_sentence_transformers(reranker, protocol):
    import torch

    served = infer_inputs(reranker["server"], protocol, "rerank_raw", _pair_inputs(PAIRS),
                          ["SCORE"])["SCORE"]
    reference = _cross_encoder(reranker["folder"], activation_fn=torch.nn.Identity()).predict(PAIRS)
    difference = float(np.abs(served[:, 0] - reference).max())
    print(f"cross-encoder (identity) vs CrossEncoder.predict over {protocol}: max abs {difference:.2e}")
    assert difference <= 1e-4


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_concurrent_requests_of_pairs_are_each_scored_right(reranker, protocol):
    """Requests arriving together are tokenised in one batch; each gets its own pairs' scores."""
    requests = [PAIRS[i:i + 1 + i % 2] for i in range(len(PAIRS) - 1)] * 3
    reference = dict(zip(PAIRS, _cross_encoder(reranker["folder"]).predict(PAIRS)))

    def score(pairs):
        return infer_inputs(reranker["server"], protocol, "rerank", _pair_inputs(pairs),
                            ["SCORE"])["SCORE"][:, 0]

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(score, requests))
    for pairs, answer in zip(requests, answers):
        np.testing.assert_allclose(answer, [reference[p] for p in pairs], atol=1e-4)


def test_a_request_without_text_pair_fails_naming_the_input(reranker):
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="TEXT_PAIR"):
        infer_inputs(reranker["server"], "http", "rerank", {"TEXT": text_batch(["alone"])},
                     ["SCORE"])
