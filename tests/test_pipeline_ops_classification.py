"""Specification of pipeline_ops.classification: softmax for single-label classifiers, sigmoid
per label for multi-label ones, the best label and its score; no Triton needed."""

from __future__ import annotations

import numpy as np
import pytest
from pipeline_ops.classification import activation_of, classify_requests, sigmoid
from pipeline_ops.errors import ConfigurationError, InvalidInput

LABELS = np.array([b"toxic", b"obscene", b"insult"], dtype=object)
LOGITS = np.array([[2.0, -1.0, 0.5], [-3.0, 4.0, 4.0], [-120.0, 0.0, 90.0]], dtype=np.float32)


@pytest.mark.torch  # torch is the reference
def test_sigmoid_matches_torch_and_stays_finite_for_large_logits():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    expected = torch.sigmoid(torch.from_numpy(LOGITS)).numpy()
    got = sigmoid(LOGITS)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, atol=1e-7)


def test_classify_requests_applies_sigmoid_per_label_when_asked():
    (result,) = classify_requests([{"logits": LOGITS}], LABELS, "sigmoid")
    np.testing.assert_allclose(result["probabilities"], sigmoid(LOGITS), atol=1e-7)
    assert not np.allclose(result["probabilities"].sum(axis=1), 1.0)  # independent per label
    assert result["label"][:, 0].tolist() == [b"toxic", b"obscene", b"insult"]  # first of ties
    np.testing.assert_allclose(result["score"][:, 0], sigmoid(LOGITS).max(axis=1), atol=1e-7)


def test_classify_requests_applies_softmax_by_default():
    (result,) = classify_requests([{"logits": LOGITS}], LABELS)
    np.testing.assert_allclose(result["probabilities"].sum(axis=1), 1.0, atol=1e-6)


def test_classify_requests_fails_only_the_bad_request_with_either_activation():
    results = classify_requests([{"logits": LOGITS[:1]}, {"logits": LOGITS[:, :2]}], LABELS,
                                "sigmoid")
    assert results[0]["probabilities"].shape == (1, 3)
    assert isinstance(results[1], InvalidInput) and "expected shape [batch, 3]" in str(results[1])


def test_activation_parameter_is_softmax_unless_given_and_refuses_others():
    assert activation_of({}, "post") == "softmax"
    assert activation_of({"activation": "sigmoid"}, "post") == "sigmoid"
    with pytest.raises(ConfigurationError, match=r"model 'post': parameter 'activation' must be"):
        activation_of({"activation": "tanh"}, "post")
