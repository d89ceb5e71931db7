"""Real all-MiniLM-L6-v2: the factory matches sentence-transformers, and its ONNX export matches
PyTorch within 1e-4 at batch 1, 8 and max_batch_size, at two sequence lengths.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tools.build_repo.spec import load_spec

REPO_ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def encoder_spec():
    return load_spec(REPO_ROOT / "repository.yaml").find("minilm_encoder")


@pytest.fixture(scope="module")
def minilm():
    from tools.models import minilm

    return minilm.build_model()


def test_sample_inputs_are_real_tokens_of_varied_length():
    from tools.models.minilm import sample_inputs

    sample = sample_inputs(8, {"sequence": 32})
    ids, mask = sample["input_ids"].numpy(), sample["attention_mask"].numpy()
    assert ids.shape == mask.shape == (8, 32)
    assert mask[0].all()  # row 0 fills the length
    lengths = mask.sum(axis=1)
    assert len(set(lengths.tolist())) > 2
    assert (ids[:, 0] == 101).all()  # [CLS]
    assert ((ids != 0) == (mask == 1)).all()
    assert np.array_equal(sample_inputs(8, {"sequence": 32})["input_ids"].numpy(), ids)


def test_factory_embeds_like_sentence_transformers(minilm):
    import torch
    from sentence_transformers import SentenceTransformer

    from tools.models.minilm import model_path

    texts = ["A man is eating food.", "Triton batches requests from many clients."]
    reference = SentenceTransformer(str(model_path()), device="cpu").encode(texts)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_path() / "tokenizer.json"))
    tokenizer.enable_padding()
    encodings = tokenizer.encode_batch(texts)
    ids = torch.tensor([e.ids for e in encodings])
    mask = torch.tensor([e.attention_mask for e in encodings])
    with torch.no_grad():
        ours = minilm(ids, mask).numpy()
    assert np.abs(ours - reference).max() < 1e-5
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)


@pytest.mark.timeout(600)
def test_minilm_onnx_matches_pytorch_within_1e4_at_batch_1_8_and_max(minilm, encoder_spec, tmp_path):
    from tools.build_repo.parity import check_parity, onnxruntime_runner
    from tools.build_repo.torch2onnx import export_onnx
    from tools.models.minilm import sample_inputs

    path = export_onnx(minilm, sample_inputs(2, {"sequence": 32}), encoder_spec, tmp_path / "model.onnx")
    figures = check_parity(encoder_spec, minilm, sample_inputs, onnxruntime_runner(str(path)),
                           runtime="onnxruntime", atol=1e-4, rtol=0.0)
    batches = {f.batch for f in figures}
    assert batches == {1, 8, encoder_spec.max_batch_size}
    assert len({f.axes["sequence"] for f in figures}) >= 2
    assert max(f.max_abs for f in figures) <= 1e-4
