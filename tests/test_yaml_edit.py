"""The one comment-keeping YAML editor (``tools/yaml_edit.py``): only the edited span changes.

``tools tune`` sets values through it (tests/test_tune_spec_patch.py), ``tools add`` appends
entries through it (tests/test_add_errors.py on the project's own spec).
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from tools.yaml_edit import YamlEditError, append_entries, set_value, unified_patch

ENTRY = ("models", "enc")


def test_a_scalar_is_replaced_in_place_keeping_the_comment_after_it():
    text = "models:\n  enc:\n    opset: 17   # pinned\n    other: 1\n"
    assert set_value(text, ENTRY, ["opset"], 18) == (
        "models:\n  enc:\n    opset: 18   # pinned\n    other: 1\n")


def test_a_key_missing_from_a_flow_mapping_is_added_inside_its_braces():
    text = "models:\n  enc:\n    instances: {cpu: {count: 1}}  # note\n"
    edited = set_value(text, ENTRY, ["instances", "cpu", "intra_op_threads"], 2)
    assert edited == "models:\n  enc:\n    instances: {cpu: {count: 1, intra_op_threads: 2}}  # note\n"


def test_a_key_missing_from_a_block_mapping_is_added_beside_its_siblings():
    text = ("models:\n  enc:\n    dynamic_batching:\n      max_queue_delay_microseconds: 100\n"
            "    other: 1\n")
    edited = set_value(text, ENTRY, ["dynamic_batching", "preferred_batch_size"], [4, 8])
    assert edited == ("models:\n  enc:\n    dynamic_batching:\n      max_queue_delay_microseconds: "
                      "100\n      preferred_batch_size: [4, 8]\n    other: 1\n")


def test_missing_nested_mappings_are_written_as_one_flow_mapping():
    text = "models:\n  enc:\n    dynamic_batching:\n      max_queue_delay_microseconds: 100\n"
    edited = set_value(text, ENTRY, ["dynamic_batching", "default_queue_policy", "max_queue_size"], 32)
    assert yaml.safe_load(edited)["models"]["enc"]["dynamic_batching"] == {
        "max_queue_delay_microseconds": 100, "default_queue_policy": {"max_queue_size": 32}}


def test_a_null_value_is_replaced_by_the_mapping_the_new_key_needs():
    text = "models:\n  enc:\n    dynamic_batching:\n      default_queue_policy: null  # gated\n"
    edited = set_value(text, ENTRY, ["dynamic_batching", "default_queue_policy", "max_queue_size"], 8)
    assert edited == ("models:\n  enc:\n    dynamic_batching:\n"
                      "      default_queue_policy: {max_queue_size: 8}  # gated\n")


def test_a_block_sequence_value_is_refused_with_where_it_is():
    text = ("models:\n  enc:\n    dynamic_batching:\n      preferred_batch_size:\n        - 4\n"
            "      max_queue_delay_microseconds: 100\n")
    with pytest.raises(YamlEditError, match=r"model 'enc'\.dynamic_batching\.preferred_batch_size"):
        set_value(text, ENTRY, ["dynamic_batching", "preferred_batch_size"], [8], "model 'enc'")


def test_a_missing_mapping_is_named():
    with pytest.raises(YamlEditError, match=r"models\.ghost: not a mapping"):
        set_value("models: {}\n", ("models", "ghost"), ["opset"], 17)


SPEC = """\
# the spec
target: cpu

models:
  enc:
    opset: 17  # pinned
    # a comment inside the entry stays with it

# Python models: pre- and post-processing
python_models: {}   # none yet

pipelines:
  pipe:
    max_batch_size: 8
"""


def test_entries_are_appended_at_the_end_of_their_sections_keeping_every_comment():
    edited = append_entries(SPEC, {
        "models": ["  new_enc:\n    opset: 18\n"],
        "python_models": ["  tok:\n    backend: text_tokenizer\n"],
        "pipelines": ["  new_pipe:\n    max_batch_size: 4\n"],
    })
    assert edited == """\
# the spec
target: cpu

models:
  enc:
    opset: 17  # pinned
    # a comment inside the entry stays with it

  new_enc:
    opset: 18

# Python models: pre- and post-processing
python_models:   # none yet
  tok:
    backend: text_tokenizer

pipelines:
  pipe:
    max_batch_size: 8

  new_pipe:
    max_batch_size: 4
"""


def test_a_missing_section_is_added_at_the_end():
    edited = append_entries("target: cpu\n\n\n", {"models": ["  enc:\n    opset: 17\n"]})
    assert edited == "target: cpu\n\nmodels:\n  enc:\n    opset: 17\n"


def test_a_section_written_as_a_flow_mapping_of_entries_is_refused():
    with pytest.raises(YamlEditError, match=r"models: not a block mapping"):
        append_entries("models: {enc: {opset: 17}}\n", {"models": ["  new:\n    opset: 18\n"]})


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_patch_of_an_edit_applies_with_git_apply(tmp_path):
    (tmp_path / "repository.yaml").write_text(SPEC, encoding="utf-8")
    edited = set_value(SPEC, ENTRY, ["opset"], 18)
    patch = unified_patch(SPEC, edited)
    changed = [line for line in patch.splitlines()
               if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert changed == ["-    opset: 17  # pinned", "+    opset: 18  # pinned"]
    (tmp_path / "p.patch").write_text(patch, encoding="utf-8")
    subprocess.run(["git", "apply", "p.patch"], cwd=tmp_path, check=True, capture_output=True)
    assert (tmp_path / "repository.yaml").read_text(encoding="utf-8") == edited
