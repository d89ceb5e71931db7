"""``tools add image-classification FACTORY --labels FILE``: a small CNN served end to end.

Preprocessing is declared as data (resize, crop, mean/std, channel order) and fed to the
``image_preprocess`` backend; the served top-k must match PyTorch on the same pixels.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.add_helpers import (FACTORY_MODULE, IMAGE_SETTINGS, MEAN, PROTOCOLS, STD, infer,
                               labels_file)
from tools.add.command import add_model
from tools.errors import ModelSourceError, UserInputError

pytestmark = [pytest.mark.torch, pytest.mark.timeout(600)]


@pytest.fixture
def cnn_factory(tmp_path, monkeypatch) -> str:
    package = tmp_path / "my_vision"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "cnn.py").write_text(FACTORY_MODULE.format(classes=4))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_vision.cnn:build_model"
    for name in [m for m in sys.modules if m.startswith("my_vision")]:
        del sys.modules[name]


def _spec_and_labels(tmp_path: Path, count: int) -> tuple[Path, Path]:
    spec = tmp_path / "repository.yaml"
    spec.write_text("target: cpu\n")  # no backends: the installed ones
    return spec, labels_file(tmp_path / "labels.txt", count)


def test_labels_that_do_not_match_the_logits_are_refused_and_spec_unchanged(tmp_path, cnn_factory):
    spec, labels = _spec_and_labels(tmp_path, 7)
    before = spec.read_text()
    with pytest.raises(ModelSourceError, match=r"returns \(1, 4\), expected logits \(1, 7\)"):
        add_model("image-classification", cnn_factory, "shapes", spec, labels=labels)
    assert spec.read_text() == before


@pytest.mark.server
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cnn_is_added_built_served_and_answers(added_models, protocol):
    """``shapes`` in the session's repository of every recipe: the CNN of ``FACTORY_MODULE``
    added with its preprocessing as flags (64 px, shorter side 72, mean/std, BGR)."""
    import torch
    from PIL import Image

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backends" / "python"))
    from pipeline_ops import image as image_ops

    from tools.build_repo.spec import resolve_reference

    pixels = np.random.default_rng(1).integers(0, 255, size=(90, 120, 3), dtype=np.uint8)
    encoded = io.BytesIO()
    Image.fromarray(pixels).save(encoded, format="PNG")
    answer = infer(added_models.server, protocol, "shapes", "IMAGE",
                   np.array([[encoded.getvalue()]], dtype=object), ["CLASS_INDEX", "SCORE", "LABEL"])
    settings = image_ops.PreprocessSettings(mean=MEAN, std=STD, **IMAGE_SETTINGS)
    reference_pixels = image_ops.preprocess(encoded.getvalue(), settings)
    with torch.no_grad():
        logits = resolve_reference(added_models.sources["shapes"])()(
            torch.from_numpy(reference_pixels[None]))
    probabilities = torch.softmax(logits, dim=1).numpy()[0]
    order = np.argsort(-probabilities, kind="stable")
    assert answer["CLASS_INDEX"][0].tolist() == order.tolist()
    np.testing.assert_allclose(answer["SCORE"][0], probabilities[order], atol=1e-5)
    assert answer["LABEL"][0, 0].decode() == f"class {order[0]}"


def _write_module(tmp_path: Path, monkeypatch, package: str, text: str) -> str:
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "model.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{package}.model:build_model"


def _preprocess_parameters(spec: Path, name: str) -> dict[str, str]:
    from tools.build_repo.spec import load_spec

    return dict(load_spec(spec).find(f"{name}_preprocess").parameters)


def test_mean_and_std_are_required_when_the_model_carries_none(tmp_path, cnn_factory):
    spec, labels = _spec_and_labels(tmp_path, 4)
    before = spec.read_text()
    with pytest.raises(UserInputError, match=r"needs .* --mean and --std .* carries no timm "
                                             r"pretrained_cfg nor a transformers preprocessor"):
        add_model("image-classification", cnn_factory, "shapes", spec, labels=labels)
    assert spec.read_text() == before


TIMM_STYLE_MODULE = '''
import torch


def build_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten()).eval()
    # what timm.create_model sets on every model it builds
    model.pretrained_cfg = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225),
                            "input_size": (3, 224, 224)}
    return model
'''


def test_mean_and_std_are_read_from_the_models_timm_pretrained_cfg(tmp_path, monkeypatch):
    factory = _write_module(tmp_path, monkeypatch, "my_timm_style", TIMM_STYLE_MODULE)
    spec, labels = _spec_and_labels(tmp_path, 4)
    summary = add_model("image-classification", factory, "timmish", spec, labels=labels,
                        image_size=64, resize_shorter=72)
    parameters = _preprocess_parameters(spec, "timmish")
    assert (parameters["mean"], parameters["std"]) == ("0.485,0.456,0.406", "0.229,0.224,0.225")
    assert any("from timm pretrained_cfg" in line for line in summary)


def test_flags_win_over_the_models_config(tmp_path, monkeypatch):
    factory = _write_module(tmp_path, monkeypatch, "my_timm_flags", TIMM_STYLE_MODULE)
    spec, labels = _spec_and_labels(tmp_path, 4)
    add_model("image-classification", factory, "flagged", spec, labels=labels, image_size=64,
              resize_shorter=72, mean="0.5,0.5,0.5", std="0.5,0.5,0.5")
    assert _preprocess_parameters(spec, "flagged")["mean"] == "0.5,0.5,0.5"


VIT_MODULE = '''
from transformers import ViTForImageClassification

FOLDER = {folder!r}


def build_model():
    return ViTForImageClassification.from_pretrained(FOLDER, attn_implementation="eager").eval()
'''


@pytest.fixture
def vit_factory(tmp_path, monkeypatch):
    """A tiny ViT classifier saved with a ViTImageProcessor (preprocessor_config.json)."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    folder = tmp_path / "tiny-vit"
    torch.manual_seed(0)
    config = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1,
                       num_attention_heads=2, intermediate_size=64, num_labels=4)
    ViTForImageClassification(config).eval().save_pretrained(str(folder))
    ViTImageProcessor(image_mean=[0.3, 0.4, 0.5], image_std=[0.2, 0.25, 0.3]).save_pretrained(
        str(folder))
    yield _write_module(tmp_path, monkeypatch, "my_vit", VIT_MODULE.format(folder=str(folder))), folder
    for name in [m for m in sys.modules if m.startswith("my_vit")]:
        del sys.modules[name]


def test_mean_and_std_are_read_from_a_transformers_preprocessor_config_and_the_model_builds(
    tmp_path, vit_factory
):
    from tools.build_repo.pipeline import build_repository

    factory, folder = vit_factory
    spec, labels = _spec_and_labels(tmp_path, 4)
    summary = add_model("image-classification", factory, "vit", spec, labels=labels,
                        image_size=32, resize_shorter=36)
    parameters = _preprocess_parameters(spec, "vit")
    assert (parameters["mean"], parameters["std"]) == ("0.3,0.4,0.5", "0.2,0.25,0.3")
    assert any(str(folder / "preprocessor_config.json") in line for line in summary)
    result = build_repository(spec, tmp_path / "repo", progress=False)  # ImageClassifierOutput.logits
    assert result["vit_classifier"].parity_max_abs["onnxruntime"] <= 1e-3


def test_a_preprocessor_config_without_rescaling_to_unit_pixels_is_refused(tmp_path, vit_factory):
    import json

    factory, folder = vit_factory
    config = json.loads((folder / "preprocessor_config.json").read_text())
    (folder / "preprocessor_config.json").write_text(json.dumps({**config, "do_rescale": False}))
    spec, labels = _spec_and_labels(tmp_path, 4)
    with pytest.raises(ModelSourceError, match=r"preprocessor_config.json: do_rescale False"):
        add_model("image-classification", factory, "vit", spec, labels=labels, image_size=32)
