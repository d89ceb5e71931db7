"""Helpers of the ``tools add`` tests: tiny Hugging Face folders and one call per protocol.

Folders are made by the tests: a BERT-style model from a tiny config (random weights) saved with
``save_pretrained``, and a WordPiece ``tokenizer.json`` built from a small vocabulary.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tritonclient.grpc as tritonclient_grpc
import tritonclient.http as tritonclient_http

PROTOCOLS = ("http", "grpc")
WORDS = ("the a man woman is eating food playing violin cat dog sits outside on warm stones "
         "new movie awesome bread yeast bake how do i quick brown fox jumps over lazy").split()
TEXTS = ["A man is eating food.", "The cat sits outside on the warm stones.",
         "How do I bake bread without yeast?", "The quick brown fox jumps over the lazy dog!"]


def save_tokenizer(folder: Path) -> Path:
    """A lower-casing BERT WordPiece tokenizer over ``WORDS``, saved as ``tokenizer.json``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS, ".", "?", "!"])}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def tiny_bert_folder(folder: Path, labels: list[str] | None = None) -> Path:
    """A 2-layer BERT (hidden 32, 64 positions), random weights; a classifier when ``labels``."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    save_tokenizer(folder)
    vocab_size = len(WORDS) + 7
    kwargs = {}
    if labels:
        kwargs = {"id2label": dict(enumerate(labels)),
                  "label2id": {n: i for i, n in enumerate(labels)}}
    config = BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                        **kwargs)
    torch.manual_seed(0)
    model = BertForSequenceClassification(config) if labels else BertModel(config)
    model.eval().save_pretrained(str(folder))
    return folder


def infer(server, protocol: str, model: str, name: str, values: np.ndarray,
          outputs: list[str]) -> dict[str, np.ndarray]:
    """One request over ``protocol``; ``values`` is the batch of the one input ``name``."""
    module = tritonclient_http if protocol == "http" else tritonclient_grpc
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    try:
        dtype = "BYTES" if values.dtype == object else {"float32": "FP32", "int64": "INT64"}[
            values.dtype.name]
        tensor = module.InferInput(name, list(values.shape), dtype)
        tensor.set_data_from_numpy(values)
        result = client.infer(model, [tensor])
        return {o: result.as_numpy(o) for o in outputs}
    finally:
        client.close()


def text_batch(texts: list[str]) -> np.ndarray:
    """``TEXT`` rows ``[n, 1]`` of UTF-8 bytes."""
    return np.array([[t.encode()] for t in texts], dtype=object)
