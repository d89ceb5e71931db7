"""docs/spec.md and schemas/ are what the typed models generate, and the docs' examples are real.

The field tables of docs/spec.md and the JSON Schemas are generated (``scripts/generate_docs.py``);
these tests fail when a committed copy differs, and name the command that regenerates it.
No torch: parsing and rendering configs only.
"""

from __future__ import annotations

import ast
import difflib
import re
import shutil
from pathlib import Path

import pytest
import yaml

from tools.build_repo.spec import load_spec, parse_spec
from tools.errors import SpecError
from tools.spec_schema import (
    REGENERATE,
    REPOSITORY_SCHEMA,
    SLO_SCHEMA,
    SPEC_DOC,
    generated,
    repository_schema,
    spec_doc,
    stale,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
DOC = REPO_ROOT / SPEC_DOC
DOC_ERROR_SPEC = "/tmp/specdoc/repository.yaml"  # where the docs' error messages were produced


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def _block(doc: str, name: str) -> str:
    """The generated table ``name`` of the docs."""
    pattern = rf"<!-- BEGIN GENERATED: {name} -->\n(.*?)<!-- END GENERATED -->"
    match = re.search(pattern, doc, re.DOTALL)
    assert match, f"{DOC}: no generated block {name!r}"
    return match[1]


def _code_blocks(doc: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", doc, re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize("relative", [REPOSITORY_SCHEMA, SLO_SCHEMA, SPEC_DOC])
def test_committed_file_is_what_the_models_generate(relative):
    path = REPO_ROOT / relative
    want = generated(REPO_ROOT)[path]
    have = path.read_text(encoding="utf-8") if path.is_file() else ""
    diff = "".join(difflib.unified_diff(
        have.splitlines(True), want.splitlines(True),
        f"{relative} (committed)", f"{relative} (generated)", n=1,
    ))
    assert have == want, f"{relative} is stale; run `{REGENERATE}`:\n{diff[:3000]}"


def test_stale_finds_a_hand_edited_table_and_a_missing_schema(tmp_path):
    (tmp_path / "docs").mkdir()
    shutil.copytree(REPO_ROOT / "schemas", tmp_path / "schemas")
    doc = _doc().replace("| `opset` | int 13..23 |", "| `opset` | int |", 1)
    assert doc != _doc()
    (tmp_path / SPEC_DOC).write_text(doc, encoding="utf-8")
    (tmp_path / SLO_SCHEMA).unlink()
    assert stale(tmp_path) == [tmp_path / SLO_SCHEMA, tmp_path / SPEC_DOC]


def test_generating_refuses_a_doc_without_a_block_for_a_section():
    doc = _doc().replace("BEGIN GENERATED: pipelines -->", "BEGIN GENERATED: pipeline -->")
    with pytest.raises(ValueError, match="unknown generated block 'pipeline'"):
        spec_doc(doc)


def test_docs_tables_list_nested_fields_per_section():
    doc = _doc()
    models, python_models = _block(doc, "models"), _block(doc, "python_models")
    assert "| `instances.cpu.intra_op_threads` | int > 0 |" in models
    timeout_action = "dynamic_batching.default_queue_policy.timeout_action"
    assert f"| `{timeout_action}` | `REJECT` \\| `DELAY` |" in models
    assert "| `axes.<axis>.parity` |" in models
    assert "| `warmup.axes` | mapping axis → int > 0 |" in models
    assert "| `warmup[].inputs` | mapping input → list of string | yes |" in python_models
    assert "| `steps[].model` | identifier | yes |" in _block(doc, "pipelines")
    assert "| `pad_value` | number | no | `0` |" in _block(doc, "tensor")
    assert "| `backends` | string | no | none | Folder that holds" in _block(doc, "top")
    # Python models do not take intra_op_threads; neither the docs nor the schema offer it.
    assert "intra_op_threads` |" not in python_models
    cpu = repository_schema()["$defs"]["PythonCpuInstancesSpec"]["properties"]
    assert set(cpu) == {"count"}


def test_docs_example_spec_parses_and_renders_on_both_targets(tmp_path):
    from tools.build_repo.ensemble import render_all

    spec = parse_spec(yaml.safe_load(_code_blocks(_doc(), "yaml")[0]), tmp_path / "repository.yaml")
    assert [m.name for m in spec.models] == ["tiny_cnn"]
    assert [p.name for p in spec.pipelines] == ["tiny_classification"]
    for target in ("cpu", "gpu"):
        configs = render_all(spec, target)  # checks the pipeline against its step models
        assert set(configs) == {"tiny_cnn", "image_preprocess", "tiny_classification"}


def test_docs_example_factory_defines_the_contract_functions():
    (source,) = _code_blocks(_doc(), "python")
    functions = {
        node.name: [a.arg for a in node.args.args]
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef)
    }
    assert functions == {
        "build_model": [], "sample_inputs": ["batch_size", "axes"], "weights_files": [],
    }


_POSITION = re.compile(r"(?<=\.yaml):\d+:\d+:")


def _broken(tmp_path: Path, *changes: tuple[str, str]) -> str:
    text = (REPO_ROOT / "repository.yaml").read_text()
    for old, new in changes:
        assert old in text, f"repository.yaml no longer contains {old!r}"
        text = text.replace(old, new, 1)
    path = tmp_path / "repository.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    return str(caught.value).replace(str(path.resolve()), DOC_ERROR_SPEC)


@pytest.mark.parametrize(
    "changes",
    [
        [("max_queue_delay_microseconds: 0", "max_queue_delay_microsecond: 0")],
        [("cpu: {count: 2, intra_op_threads: 1}", "cpu: {count: 2, intra_op_threads: 2}")],
        [("shape: [batch, 384]", "shape: [384]")],
        [("shape: [batch, sequence], pad_value", "shape: [batch, seq_len], pad_value")],
        [("opset: 17", "opset: 11"), ("max_batch_size: 16", "max_batch_size: sixteen"),
         ("tolerance: {atol: 1.0e-3", "tolerance: {atol: 1e-3")],
    ],
    ids=["typo", "threads", "no-batch-axis", "undeclared-axis", "three-at-once"],
)
def test_docs_error_messages_are_what_the_parser_says(tmp_path, changes):
    message = _broken(tmp_path, *changes)
    # Every line names the line and column; the docs' numbers may lag edits of repository.yaml.
    assert all(_POSITION.search(line) for line in message.splitlines()), message
    assert f"Error: {_POSITION.sub(':L:C:', message)}\n" in _POSITION.sub(":L:C:", _doc()), (
        f"{DOC}: error example is stale: {message}")
