"""The image-classification recipe's PyTorch side: the user's factory's model returning its
logits, and deterministic sample pixels of the model's input shape.

The model itself comes from the user's factory (``recipe.factory``); only its input is known here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

import torch
from torch import nn


class Logits(nn.Module):
    """The factory's model, returning ``logits``: a tensor as it is, or an output's ``.logits``
    (transformers' ``*ForImageClassification`` return an ``ImageClassifierOutput``)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, classes]`` of ``pixel_values`` ``[batch, 3, H, W]``."""
        output = self.model(pixel_values)
        return output if isinstance(output, torch.Tensor) else output.logits


def build_model(factory: Callable[[], nn.Module]) -> nn.Module:
    """The factory's model wrapped as :class:`Logits`, in eval mode."""
    return Logits(factory()).eval()


class Tensor(Protocol):
    """What this module reads of a spec tensor: its name, dtype and shape (batch axis first)."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]


def sample_inputs(inputs: Iterable[Tensor], batch_size: int,
                  axes: Mapping[str, int]) -> dict[str, torch.Tensor]:
    """Seeded normal pixels (the range of mean/std-normalised images) for every input.

    Args:
        inputs: the model's input tensors (shapes and dtypes; named axes take ``axes``).
        batch_size: rows.
        axes: sizes of the named axes other than ``batch``.
    """
    generator = torch.Generator().manual_seed(batch_size)
    sample = {}
    for tensor in inputs:
        shape = [batch_size, *(axes[d] if isinstance(d, str) else d for d in tensor.shape[1:])]
        values = torch.randn(shape, generator=generator).clamp(-3, 3)
        sample[tensor.name] = values.to(getattr(torch, tensor.dtype))
    return sample
