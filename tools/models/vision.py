"""The image-classification recipe's sample inputs: deterministic pixels of the model's input shape.

The model itself comes from the user's factory (``recipe.factory``); only its input is known here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

import torch


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
