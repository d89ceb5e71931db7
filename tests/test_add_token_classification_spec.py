"""What ``tools add hf-token-classification`` writes into the spec, and what it refuses.

Folders hold a ``config.json``, an empty weights file and a small tokenizer: nothing is exported
here (tests/test_add_token_classification.py builds and serves a real one).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.add_helpers import NER_LABELS, save_tokenizer
from tools.add.command import add_model
from tools.build_repo.ensemble import render_all
from tools.build_repo.spec import load_spec
from tools.cli import cli
from tools.errors import ModelSourceError, UserInputError

TOKEN_CLASSIFIER = {"model_type": "bert", "hidden_size": 32, "max_position_embeddings": 64,
                    "architectures": ["BertForTokenClassification"],
                    "id2label": {str(i): label for i, label in enumerate(NER_LABELS)}}


def _folder(root: Path, config: dict, tokenizer_json: bool = True,
            tokenizer_config: dict | None = None) -> Path:
    folder = root / "ner-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"")
    save_tokenizer(folder)
    if not tokenizer_json:  # a vocabulary transformers converts instead
        vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
        (folder / "vocab.txt").write_text("\n".join(sorted(vocab, key=vocab.get)) + "\n")
        (folder / "tokenizer.json").unlink()
    if tokenizer_config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return folder


def test_the_pipeline_answers_entities_from_offsets_and_names_its_task(tmp_path):
    spec_path = tmp_path / "repository.yaml"
    add_model("hf-token-classification", str(_folder(tmp_path, TOKEN_CLASSIFIER)), "ner",
              spec_path)

    spec = load_spec(spec_path)
    assert [s.model for s in spec.find("ner").steps] == ["ner_tokenizer", "ner_classifier",
                                                         "ner_postprocess"]
    assert [(t.name, t.shape) for t in spec.find("ner_tokenizer").outputs] == [
        ("input_ids", ("batch", "sequence")), ("attention_mask", ("batch", "sequence")),
        ("offsets", ("batch", "sequence", 2)), ("special_tokens_mask", ("batch", "sequence"))]
    assert [(t.name, t.shape) for t in spec.find("ner_classifier").outputs] == [
        ("logits", ("batch", "sequence", len(NER_LABELS)))]
    postprocess = spec.find("ner_postprocess")
    assert postprocess.backend == "token_classification_postprocess"
    assert dict(postprocess.parameters)["aggregation_strategy"] == "simple"  # as transformers
    assert set(postprocess.files) == {"config.json", "tokenizer.json"}
    assert [(t.name, t.dtype, t.shape) for t in spec.find("ner").outputs] == [
        ("ENTITIES", "string", ("batch", 1))]
    configs = render_all(spec, "cpu")
    assert dict(configs["ner"].parameters)["task"] == "token-classification"
    ragged = {t.name: t.allow_ragged_batch for t in configs["ner_postprocess"].inputs}
    assert ragged == {"TEXT": False, "input_ids": True, "logits": True, "offsets": True,
                      "special_tokens_mask": True}  # texts of every length share executions


def test_texts_are_cut_where_transformers_pipeline_cuts_them(tmp_path):
    # a sentence-transformers max_seq_length is not what transformers' pipeline reads
    folder = _folder(tmp_path, TOKEN_CLASSIFIER, tokenizer_config={"model_max_length": 40})
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 16}))
    spec_path = tmp_path / "repository.yaml"
    add_model("hf-token-classification", str(folder), "ner", spec_path)
    spec = load_spec(spec_path)
    assert dict(spec.find("ner_tokenizer").parameters)["max_length"] == "40"
    assert spec.find("ner_classifier").axis("sequence").max == 40


def test_without_a_limit_texts_are_cut_at_the_models_positions(tmp_path):
    folder = _folder(tmp_path, TOKEN_CLASSIFIER,
                     tokenizer_config={"model_max_length": 1000000000000000019884624838656})
    spec_path = tmp_path / "repository.yaml"
    add_model("hf-token-classification", str(folder), "ner", spec_path)
    assert dict(load_spec(spec_path).find("ner_tokenizer").parameters)["max_length"] == "64"


@pytest.mark.parametrize("aggregation", ["none", "first", "average", "max"])
def test_the_aggregation_option_reaches_the_postprocess(tmp_path, aggregation):
    spec_path = tmp_path / "repository.yaml"
    result = CliRunner().invoke(cli, [
        "add", "hf-token-classification", str(_folder(tmp_path, TOKEN_CLASSIFIER)),
        "--name", "ner", "--aggregation", aggregation, "--spec", str(spec_path)])
    assert result.exit_code == 0, result.output
    assert f"added python_models.ner_postprocess: {aggregation} aggregation" in result.output
    parameters = dict(load_spec(spec_path).find("ner_postprocess").parameters)
    assert parameters["aggregation_strategy"] == aggregation
    per_token = "{entity, score, index, word, start, end}"
    assert (per_token in spec_path.read_text()) == (aggregation == "none")


def test_a_folder_without_tokenizer_json_gets_the_converted_tokenizer_in_both_steps(tmp_path):
    folder = _folder(tmp_path, TOKEN_CLASSIFIER, tokenizer_json=False,
                     tokenizer_config={"do_lower_case": True, "model_max_length": 32,
                                       "tokenizer_class": "BertTokenizer"})
    spec_path = tmp_path / "repository.yaml"
    add_model("hf-token-classification", str(folder), "ner", spec_path)
    spec = load_spec(spec_path)
    for step in ("ner_tokenizer", "ner_postprocess"):
        assert spec.find(step).recipe.kind == "hf-tokenizer"
        assert "tokenizer.json" not in spec.find(step).files


def test_a_sequence_classifier_is_not_a_token_classifier(tmp_path):
    config = {**TOKEN_CLASSIFIER, "architectures": ["BertForSequenceClassification"]}
    spec_path = tmp_path / "repository.yaml"
    with pytest.raises(ModelSourceError, match=r"config.json: architectures "
                       r"\['BertForSequenceClassification'\] hold no \*ForTokenClassification"):
        add_model("hf-token-classification", str(_folder(tmp_path, config)), "ner", spec_path)
    assert not spec_path.exists()


def test_a_folder_without_labels_is_refused_naming_config_json(tmp_path):
    config = {k: v for k, v in TOKEN_CLASSIFIER.items() if k != "id2label"}
    with pytest.raises(ModelSourceError, match=r"config.json: no 'id2label' or 'num_labels': "
                                               r"not a token classifier"):
        add_model("hf-token-classification", str(_folder(tmp_path, config)), "ner",
                  tmp_path / "repository.yaml")


def test_aggregation_is_refused_for_other_recipes(tmp_path):
    with pytest.raises(UserInputError, match="--aggregation: only hf-token-classification "
                                             "takes it, not hf-sequence-classification"):
        add_model("hf-sequence-classification", str(tmp_path), "clf",
                  tmp_path / "repository.yaml", aggregation="first")


def test_an_unknown_aggregation_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(cli, [
        "add", "hf-token-classification", str(_folder(tmp_path, TOKEN_CLASSIFIER)),
        "--name", "ner", "--aggregation", "longest", "--spec", str(tmp_path / "r.yaml")])
    assert result.exit_code == 2
    assert "'longest' is not one of 'none', 'simple', 'first', 'average', 'max'" in result.output


def test_the_gpu_target_renders_the_same_pipeline_with_bucketed_lengths(tmp_path):
    spec_path = tmp_path / "repository.yaml"
    add_model("hf-token-classification", str(_folder(tmp_path, TOKEN_CLASSIFIER)), "ner",
              spec_path)
    configs = render_all(load_spec(spec_path), "gpu")
    assert configs["ner_classifier"].backend == "onnxruntime"
    assert [(t.name, t.dims) for t in configs["ner_classifier"].outputs] == [
        ("logits", (-1, len(NER_LABELS)))]
    assert dict(configs["ner_tokenizer"].parameters)["length_buckets"] == "16,32,64"
    assert dict(configs["ner"].parameters)["task"] == "token-classification"


def test_int8_is_refused_for_per_token_logits_with_the_reason(tmp_path):
    from tools.errors import SpecError

    spec_path = tmp_path / "repository.yaml"
    add_model("hf-token-classification", str(_folder(tmp_path, TOKEN_CLASSIFIER)), "ner",
              spec_path)
    text = spec_path.read_text().replace(
        "    gpu: {backend: onnxruntime}\n",
        "    gpu: {backend: onnxruntime}\n    cpu: {optimize: int8, quality: {texts: t.txt, "
        "tokenizer: t.json}}\n", 1)
    spec_path.write_text(text)
    with pytest.raises(SpecError, match=r"int8 needs one embedding-like output \(float32 "
                                        r"\[batch, N\]\) for its quality gate; this model has "
                                        r"\[\"logits float32 \['batch', 'sequence', 9\]\"\]"):
        load_spec(spec_path)


def test_the_served_postprocess_takes_every_strategy_tools_add_offers():
    from pipeline_ops import token_classification

    from tools.models.hf_folder import AGGREGATIONS

    assert token_classification.AGGREGATIONS == AGGREGATIONS
