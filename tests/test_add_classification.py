"""``tools add hf-sequence-classification``: the served output follows ``problem_type``.

Three classifiers on all-MiniLM-L6-v2's real weights with seeded heads: single-label (no
``problem_type``, 3 labels: softmax), multi-label (``multi_label_classification``, 4 labels:
sigmoid per label) and regression (1 label, no ``problem_type``: transformers'
``BertForSequenceClassification`` treats that as regression, so the raw output is served). Each
is built, served, and compared with transformers over HTTP and gRPC (the session's repository of
every recipe, tests/add_helpers.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.add_helpers import (CLASSIFIERS, PROTOCOLS, TEXTS, infer, minilm_classifier_folder,
                               text_batch)
from tools.add.command import add_model

pytestmark = [pytest.mark.torch, pytest.mark.server, pytest.mark.timeout(1500)]
SERVED_TEXTS = [*TEXTS, "Hello!", "Stock markets fell sharply on Monday. " * 40]  # last truncated


@pytest.fixture(scope="module")
def classifiers(added_models):
    """The three heads in the session's repository of every recipe (one spec, one server)."""
    return {"spec": added_models.spec, "server": added_models.server,
            "folders": {name: added_models.sources[name] for name in CLASSIFIERS}}


def _transformers_logits(folder, texts: list[str]) -> np.ndarray:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    features = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        return model(**features).logits.numpy()


def test_the_activation_follows_problem_type(classifiers):
    from tools.build_repo.spec import load_spec

    spec = load_spec(classifiers["spec"])
    assert dict(spec.find("single_postprocess").parameters)["activation"] == "softmax"
    assert dict(spec.find("multi_postprocess").parameters)["activation"] == "sigmoid"
    assert "regress_postprocess" not in spec.names()  # regression: the outputs as they are
    assert [t.name for t in spec.find("regress").outputs] == ["SCORE"]
    assert [t.name for t in spec.find("single").outputs] == ["LABEL", "SCORE", "PROBABILITIES"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_single_label_classifier_serves_softmax_like_transformers(classifiers, protocol):
    import torch

    answer = infer(classifiers["server"], protocol, "single", "TEXT", text_batch(SERVED_TEXTS),
                   ["LABEL", "SCORE", "PROBABILITIES"])
    logits = _transformers_logits(classifiers["folders"]["single"], SERVED_TEXTS)
    expected = torch.softmax(torch.from_numpy(logits), dim=1).numpy()
    difference = float(np.abs(answer["PROBABILITIES"] - expected).max())
    print(f"single-label softmax vs transformers over {protocol}: max abs {difference:.2e}")
    assert difference <= 1e-4
    assert expected.std(axis=0).max() > 1e-3  # the texts get different answers
    assert [v.decode() for v in answer["LABEL"][:, 0]] == [f"label_{i}" for i in expected.argmax(1)]
    np.testing.assert_allclose(answer["SCORE"][:, 0], expected.max(1), atol=1e-4)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_multi_label_classifier_serves_a_sigmoid_per_label_like_transformers(classifiers, protocol):
    import torch

    answer = infer(classifiers["server"], protocol, "multi", "TEXT", text_batch(SERVED_TEXTS),
                   ["LABEL", "SCORE", "PROBABILITIES"])
    logits = _transformers_logits(classifiers["folders"]["multi"], SERVED_TEXTS)
    expected = torch.sigmoid(torch.from_numpy(logits)).numpy()
    difference = float(np.abs(answer["PROBABILITIES"] - expected).max())
    print(f"multi-label sigmoid vs transformers over {protocol}: max abs {difference:.2e}")
    assert difference <= 1e-4
    assert not np.allclose(expected.sum(axis=1), 1.0, atol=1e-2)  # not a softmax
    assert [v.decode() for v in answer["LABEL"][:, 0]] == [f"label_{i}" for i in expected.argmax(1)]
    np.testing.assert_allclose(answer["SCORE"][:, 0], expected.max(1), atol=1e-4)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_regression_head_serves_its_raw_output_like_transformers(classifiers, protocol):
    answer = infer(classifiers["server"], protocol, "regress", "TEXT", text_batch(SERVED_TEXTS),
                   ["SCORE"])
    expected = _transformers_logits(classifiers["folders"]["regress"], SERVED_TEXTS)
    difference = float(np.abs(answer["SCORE"] - expected).max())
    print(f"regression identity vs transformers over {protocol}: max abs {difference:.2e}")
    assert answer["SCORE"].shape == (len(SERVED_TEXTS), 1)
    assert difference <= 1e-4
    assert (expected < 0).any() or (expected > 1).any()  # not squashed into [0, 1]


def test_activation_option_overrides_problem_type(tmp_path):
    from tools.build_repo.spec import load_spec

    folder = minilm_classifier_folder(tmp_path / "clf", 2)
    spec = tmp_path / "repository.yaml"
    add_model("hf-sequence-classification", str(folder), "flags", spec, activation="sigmoid")
    assert dict(load_spec(spec).find("flags_postprocess").parameters)["activation"] == "sigmoid"
