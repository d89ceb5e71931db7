"""The image-classification recipe's sample inputs: deterministic pixels of the model's input shape.

The model itself comes from the user's factory (``recipe.factory``); only its input is known here.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from tools.build_repo.spec import ModelSpec


def sample_inputs(model: ModelSpec, batch_size: int, axes: Mapping[str, int]) -> dict[str, torch.Tensor]:
    """Seeded normal pixels (the range of mean/std-normalised images) for every input.

    Args:
        model: the spec entry (its inputs' shapes and dtypes; named axes take ``axes``).
        batch_size: rows.
        axes: sizes of the named axes other than ``batch``.
    """
    generator = torch.Generator().manual_seed(batch_size)
    sample = {}
    for tensor in model.inputs:
        shape = [batch_size, *(axes[d] if isinstance(d, str) else d for d in tensor.shape[1:])]
        values = torch.randn(shape, generator=generator).clamp(-3, 3)
        sample[tensor.name] = values.to(getattr(torch, tensor.dtype))
    return sample
