"""Ensembles are checked statically, before any export or server: errors name pipeline, step, tensor.

No torch needed: a bad pipeline stops `build_repository` before any model is loaded.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tools.build_repo.pipeline import build_repository
from tools.build_repo.ensemble import render_all
from tools.build_repo.spec import load_spec
from tools.errors import EnsembleError

REPO_ROOT = Path(__file__).resolve().parents[1]


def _spec(tmp_path: Path, edit) -> Path:
    data = yaml.safe_load((REPO_ROOT / "repository.yaml").read_text())
    data["backends"] = str(REPO_ROOT / "backends" / "python")
    edit(data)
    path = tmp_path / "repository.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _render(path: Path) -> None:
    render_all(load_spec(path), "cpu")


def test_project_pipelines_pass_the_static_checks():
    expected = {
        "cpu": {"text_embedding", "text_embedding_int8", "text_embedding_bf16", "image_classification"},
        # the int8 and OpenVINO variants say `targets: [cpu]`
        "gpu": {"text_embedding", "image_classification"},
    }
    for target, names in expected.items():
        configs = render_all(load_spec(REPO_ROOT / "repository.yaml"), target)
        ensembles = {name for name, c in configs.items() if c.platform == "ensemble"}
        assert ensembles == names, target
        assert ("minilm_encoder_bf16" in configs) == (target == "cpu")
        assert ("minilm_encoder_int8" in configs) == (target == "cpu")


def test_ensemble_with_a_dtype_mismatch_is_rejected_before_anything_is_built(tmp_path):
    def edit(data):
        data["python_models"]["text_tokenizer"]["outputs"][0]["dtype"] = "int32"

    path = _spec(tmp_path, edit)
    output = tmp_path / "model_repository"
    with pytest.raises(EnsembleError) as info:
        build_repository(path, output, target="cpu", progress=False)
    message = str(info.value)
    assert "pipeline 'text_embedding'" in message
    assert "step 1 ('minilm_encoder')" in message
    assert "'token_ids'" in message and "TYPE_INT32" in message and "TYPE_INT64" in message
    assert not output.exists() or not any(output.iterdir())


def test_ensemble_with_a_dims_mismatch_names_the_tensor(tmp_path):
    def edit(data):
        data["pipelines"]["text_embedding"]["outputs"][0]["shape"] = ["batch", 768]

    with pytest.raises(EnsembleError, match=r"'EMBEDDING' has dims \[384\].*expects \[768\]"):
        _render(_spec(tmp_path, edit))


def test_ensemble_step_naming_a_missing_model_tensor_is_rejected(tmp_path):
    def edit(data):
        step = data["pipelines"]["image_classification"]["steps"][1]
        step["inputs"] = {"pixels": "pixels"}

    with pytest.raises(EnsembleError, match=r"step 1 \('efficientnet_lite0'\): input_map names 'pixels'"):
        _render(_spec(tmp_path, edit))


def test_ensemble_tensor_produced_twice_is_rejected(tmp_path):
    def edit(data):
        steps = data["pipelines"]["text_embedding"]["steps"]
        steps[1]["outputs"] = {"embedding": "token_ids"}

    with pytest.raises(EnsembleError, match=r"'token_ids' is produced twice"):
        _render(_spec(tmp_path, edit))


def test_ensemble_with_a_dangling_tensor_is_rejected(tmp_path):
    def edit(data):
        data["pipelines"]["image_classification"]["outputs"].pop()  # LABEL no longer consumed

    with pytest.raises(EnsembleError, match=r"pipeline 'image_classification': tensors \['LABEL'\]"):
        _render(_spec(tmp_path, edit))


def test_ensemble_output_that_no_step_produces_is_rejected(tmp_path):
    def edit(data):
        data["pipelines"]["text_embedding"]["outputs"].append(
            {"name": "TOKENS", "dtype": "int64", "shape": ["batch", 1]}
        )

    with pytest.raises(EnsembleError, match=r"ensemble output 'TOKENS' is produced by no step"):
        _render(_spec(tmp_path, edit))


def test_ensemble_larger_batch_than_a_step_model_is_rejected(tmp_path):
    def edit(data):
        data["pipelines"]["image_classification"]["max_batch_size"] = 64

    with pytest.raises(EnsembleError, match=r"step 0 \('image_preprocess'\): ensemble max_batch_size 64"):
        _render(_spec(tmp_path, edit))


def test_ensemble_step_on_an_unknown_model_is_rejected(tmp_path):
    def edit(data):
        data["pipelines"]["text_embedding"]["steps"][0]["model"] = "text_tokeniser"

    with pytest.raises(EnsembleError, match=r"no model 'text_tokeniser' in the repository"):
        _render(_spec(tmp_path, edit))
