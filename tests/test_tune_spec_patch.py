"""tools tune's patch: knobs written into repository.yaml's text, comments and layout kept.

The editing itself is ``tools/yaml_edit.py`` (tests/test_yaml_edit.py); these tests hold it to
the knobs tune writes.

Works on the project's own spec text and on small made-up ones; the result is read back and
validated as a spec.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tools.build_repo.spec import parse_spec
from tools.tune.knobs import ModelKnobs
from tools.tune.spec_patch import apply_settings, read_back, unified_patch
from tools.yaml_edit import YamlEditError

REPO_ROOT = Path(__file__).resolve().parents[1]
SPEC = REPO_ROOT / "repository.yaml"
SPEC_TEXT = SPEC.read_text(encoding="utf-8")
SHIPPED = {"minilm_encoder": ModelKnobs(1, 2, 2000, (), 128),
           "text_tokenizer": ModelKnobs(1, None, 500, (), 128)}


def _spec_knobs(model: str) -> ModelKnobs:
    values = read_back(SPEC_TEXT, model)
    return ModelKnobs(values["instances"], values["threads"], values["max_queue_delay_microseconds"],
                      tuple(values["preferred_batch_size"] or ()), values["max_queue_size"])


CURRENT = {m: _spec_knobs(m) for m in SHIPPED}
WINNER = {"minilm_encoder": ModelKnobs(2, 1, 4000, (8,), 256),
          "text_tokenizer": ModelKnobs(2, None, 1000, (), 64)}


def test_every_comment_line_of_the_spec_survives_the_edit():
    edited = apply_settings(SPEC_TEXT, WINNER, CURRENT)
    comments = [line for line in SPEC_TEXT.splitlines() if line.strip().startswith("#")]
    assert comments and all(line in edited.splitlines() for line in comments)


def test_the_edited_spec_holds_the_new_knobs_and_nothing_else_changes():
    edited = apply_settings(SPEC_TEXT, WINNER, CURRENT)
    before, after = yaml.safe_load(SPEC_TEXT), yaml.safe_load(edited)
    encoder = after["models"]["minilm_encoder"]
    assert encoder["instances"]["cpu"] == {"count": 2, "intra_op_threads": 1}
    assert encoder["dynamic_batching"]["preferred_batch_size"] == [8]
    assert encoder["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 256
    assert after["python_models"]["text_tokenizer"]["instances"]["cpu"] == {"count": 2}
    for name in ("minilm_encoder", "text_tokenizer"):
        section = "models" if name == "minilm_encoder" else "python_models"
        del before[section][name], after[section][name]
    assert before == after


def test_the_edited_spec_is_a_valid_spec():
    edited = apply_settings(SPEC_TEXT, WINNER, CURRENT)
    spec = parse_spec(yaml.safe_load(edited), SPEC)
    assert spec.find("minilm_encoder").instances.cpu.count == 2


def test_settings_equal_to_the_spec_give_an_empty_patch():
    assert unified_patch(SPEC_TEXT, apply_settings(SPEC_TEXT, CURRENT, CURRENT)) == ""


def test_a_key_missing_from_a_flow_mapping_is_added_inside_its_braces():
    text = "models:\n  enc:\n    instances: {cpu: {count: 1}}  # note\n"
    edited = apply_settings(text, {"enc": ModelKnobs(1, 2, None)})
    assert edited == "models:\n  enc:\n    instances: {cpu: {count: 1, intra_op_threads: 2}}  # note\n"


def test_a_key_missing_from_a_block_mapping_is_added_beside_its_siblings():
    text = ("models:\n  enc:\n    dynamic_batching:\n      max_queue_delay_microseconds: 100\n"
            "    other: 1\n")
    defaults = {"enc": ModelKnobs(1, None, 100, (), None)}
    edited = apply_settings(text, {"enc": ModelKnobs(1, None, 100, (4, 8), None)}, defaults)
    assert edited == ("models:\n  enc:\n    dynamic_batching:\n      max_queue_delay_microseconds: "
                      "100\n      preferred_batch_size: [4, 8]\n    other: 1\n")


def test_a_missing_nested_mapping_is_added_as_a_flow_mapping():
    text = "models:\n  enc:\n    dynamic_batching:\n      max_queue_delay_microseconds: 100\n"
    edited = apply_settings(text, {"enc": ModelKnobs(1, None, 100, (), 32)})
    assert yaml.safe_load(edited)["models"]["enc"]["dynamic_batching"] == {
        "max_queue_delay_microseconds": 100, "default_queue_policy": {"max_queue_size": 32}}


def test_a_block_sequence_value_is_refused_with_where_it_is():
    text = ("models:\n  enc:\n    dynamic_batching:\n      preferred_batch_size:\n        - 4\n"
            "      max_queue_delay_microseconds: 100\n")
    with pytest.raises(YamlEditError, match=r"model 'enc'\.dynamic_batching\.preferred_batch_size"):
        apply_settings(text, {"enc": ModelKnobs(1, None, 100, (8,), None)})


def test_a_model_missing_from_the_spec_is_named():
    with pytest.raises(YamlEditError, match="'ghost'"):
        apply_settings("models: {}\n", {"ghost": ModelKnobs(2, None, None)})


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_patch_applies_with_git_apply(tmp_path):
    (tmp_path / "repository.yaml").write_text(SPEC_TEXT, encoding="utf-8")
    edited = apply_settings(SPEC_TEXT, WINNER, CURRENT)
    (tmp_path / "p.patch").write_text(unified_patch(SPEC_TEXT, edited), encoding="utf-8")
    subprocess.run(["git", "apply", "p.patch"], cwd=tmp_path, check=True, capture_output=True)
    assert (tmp_path / "repository.yaml").read_text(encoding="utf-8") == edited
