"""Parity at a bounded shape: a model whose sequence axis reaches 8192 tokens is built without
running max batch x max length, and the build table and manifest say which shapes were checked.

The model is a tiny BERT with ``max_position_embeddings: 8192`` added with ``tools add``; the
shipped models keep every parity case they had.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.add_helpers import tiny_bert_folder
from tools.add.command import add_model

pytestmark = [pytest.mark.torch, pytest.mark.timeout(900)]
REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def long_spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("add_long")
    spec = root / "repository.yaml"
    add_model("hf-text-embedding", str(tiny_bert_folder(root / "long-bert", positions=8192)),
              "long", spec)
    return spec


def _tokens(case) -> int:
    batch, axes = case
    return batch * axes["sequence"]


def test_a_long_model_is_checked_up_to_512_tokens_and_not_at_8192(long_spec):
    from tools.build_repo.parity import (
        MAX_BATCH_POSITIONS,
        MAX_BATCH_POSITIONS_SQUARED,
        parity_cases,
        unchecked_cases,
    )
    from tools.build_repo.spec import load_spec

    model = load_spec(long_spec).find("long_encoder")
    assert model.axis("sequence").max == 8192
    assert model.axis("sequence").lengths == (32, 512, 8192)
    cases = parity_cases(model)
    assert (model.max_batch_size, {"sequence": 512}) in cases
    assert all(b * n["sequence"] <= MAX_BATCH_POSITIONS for b, n in cases)
    assert all(b * n["sequence"] ** 2 <= MAX_BATCH_POSITIONS_SQUARED for b, n in cases)
    assert sorted(unchecked_cases(model), key=_tokens) == [
        (b, {"sequence": 8192}) for b in model.parity_batches]


def test_the_shipped_models_keep_every_parity_case(long_spec):
    from tools.build_repo.parity import parity_cases, unchecked_cases
    from tools.build_repo.spec import load_spec

    shipped = load_spec(REPO_ROOT / "repository.yaml")
    for model in shipped.models:
        lengths = [len(a.lengths) for a in model.axes.values()] or [1]
        assert len(parity_cases(model)) == len(model.parity_batches) * lengths[0], model.name
        assert unchecked_cases(model) == [], model.name


def test_the_build_says_which_shapes_parity_checked(long_spec):
    from tools.build_repo.pipeline import build_repository

    output = long_spec.parent / "repo"
    result = build_repository(long_spec, output, progress=False)
    note = result["long_encoder"].note
    assert "parity checked up to batch=32, sequence=512" in note
    assert "not checked" in note and "batch=1, sequence=8192" in note
    manifest = json.loads((output / "build_manifest.json").read_text())
    parity = manifest["models"]["long_encoder"]["parity"]["onnxruntime"]
    ran = {(c["batch"], c["axes"]["sequence"]) for c in parity["cases"]}
    assert ran == {(b, n) for b in (1, 8, 32) for n in (32, 512)}
    assert parity["not_checked"] == [{"batch": b, "axes": {"sequence": 8192}} for b in (1, 8, 32)]
    config = (output / "long_encoder" / "config.pbtxt").read_text()
    assert '\\"input_ids\\": [8192]' in config  # served up to the full length all the same
    buckets = (output / "long_tokenizer" / "config.pbtxt").read_text()
    assert "8192" in buckets  # max_length
