"""The Hugging Face recipes' PyTorch side: a folder's model wrapped for export, and sample inputs.

``hf-text-embedding``: encoder, masked mean or ``[CLS]`` pooling, optional L2 normalisation.
``hf-sequence-classification``: the classifier's logits (the activation and labels are served
after it). ``hf-cross-encoder``: a classifier scoring text pairs, its activation in the graph.
``hf-token-classification``: per-token logits (the entities are aggregated after it).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from typing import Protocol

import torch
from torch import nn

from tools.models.hf_folder import CLASSIFIER_KINDS, TOKEN_CLASSIFIER, HfFolder
from tools.models.minilm import tokenized_samples


def _token_type_ids(encoder: nn.Module) -> bool:
    return "token_type_ids" in inspect.signature(encoder.forward).parameters


class TextEmbedder(nn.Module):
    """Encoder, then attention-masked mean (or ``[CLS]``) pooling and optional L2 normalisation."""

    def __init__(self, encoder: nn.Module, pooling: str, normalize: bool) -> None:
        super().__init__()
        self.encoder, self.pooling, self.normalize = encoder, pooling, normalize
        self.token_types = _token_type_ids(encoder)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Embed token ids ``[batch, sequence]`` into ``[batch, hidden]``."""
        extra = {"token_type_ids": torch.zeros_like(input_ids)} if self.token_types else {}
        hidden = self.encoder(
            input_ids=input_ids, attention_mask=attention_mask, **extra
        ).last_hidden_state
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        if not self.normalize:
            return pooled
        # Same epsilon as torch.nn.functional.normalize (sentence-transformers' Normalize).
        return pooled / pooled.norm(p=2, dim=1, keepdim=True).clamp(min=1e-12)


class Classifier(nn.Module):
    """A ``*ForSequenceClassification`` model returning only its logits ``[batch, labels]``, or a
    ``*ForTokenClassification`` one returning ``[batch, sequence, labels]``.

    ``classifier`` is the transformers model itself (a token classifier's entity parity hands it
    to transformers' own token-classification pipeline).
    """

    def __init__(self, classifier: nn.Module) -> None:
        super().__init__()
        self.classifier = classifier
        self.token_types = _token_type_ids(classifier)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The logits of token ids ``[batch, sequence]``."""
        extra = {"token_type_ids": torch.zeros_like(input_ids)} if self.token_types else {}
        return self.classifier(input_ids=input_ids, attention_mask=attention_mask, **extra).logits


class PairScorer(nn.Module):
    """A ``*ForSequenceClassification`` model scoring text pairs: ``activation(logits)``.

    ``token_type_ids`` (which text of the pair a token belongs to) is an input when the model
    takes it, as BERT cross-encoders do.
    """

    def __init__(self, classifier: nn.Module, activation: str) -> None:
        super().__init__()
        self.classifier, self.activation = classifier, activation
        self.token_types = _token_type_ids(classifier)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Scores ``[batch, labels]`` of pair tokens ``[batch, sequence]``."""
        extra = {"token_type_ids": token_type_ids} if self.token_types else {}
        logits = self.classifier(input_ids=input_ids, attention_mask=attention_mask, **extra).logits
        return torch.sigmoid(logits) if self.activation == "sigmoid" else logits


class Recipe(Protocol):
    """What this module reads of a spec entry's ``recipe``."""

    kind: str  # hf-text-embedding | hf-sequence-classification | hf-cross-encoder |
    # hf-token-classification
    pooling: str  # mean | cls
    normalize: bool
    activation: str | None  # hf-cross-encoder: sigmoid | identity


def build_model(folder: HfFolder, recipe: Recipe) -> nn.Module:
    """Load the folder's model offline, wrapped for the recipe, in eval mode.

    Eager attention exports to plain MatMul/Softmax ops that every ONNX runtime handles.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import (
        AutoModel,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
    )
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # unused pooler weights and the like: not our concern here
    hf_logging.disable_progress_bar()
    if recipe.kind == TOKEN_CLASSIFIER:
        return Classifier(AutoModelForTokenClassification.from_pretrained(
            str(folder.path), attn_implementation="eager")).eval()
    if recipe.kind in CLASSIFIER_KINDS:
        model = AutoModelForSequenceClassification.from_pretrained(
            str(folder.path), attn_implementation="eager"
        )
        if recipe.kind == "hf-cross-encoder":
            return PairScorer(model, recipe.activation).eval()
        return Classifier(model).eval()
    encoder = AutoModel.from_pretrained(str(folder.path), attn_implementation="eager")
    return TextEmbedder(encoder, recipe.pooling, recipe.normalize).eval()


def sample_inputs(folder: HfFolder, recipe: Recipe, batch_size: int,
                  axes: Mapping[str, int]) -> dict[str, torch.Tensor]:
    """Real sentences tokenised by the folder's tokenizer into rows of exactly ``axes["sequence"]``.

    Row 0 fills the whole length; the other rows are single sentences (``hf-cross-encoder``:
    pairs of sentences, with ``token_type_ids``), right-padded with the tokenizer's padding id
    (0 when it has none), so the mask matters.
    """
    length = int(axes["sequence"])
    tokenizer = folder.fast_tokenizer()
    pad_id = (tokenizer.padding or {}).get("pad_id", 0)
    return tokenized_samples(tokenizer, batch_size, length, pad_id,
                             pairs=recipe.kind == "hf-cross-encoder")
