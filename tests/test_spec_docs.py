"""docs/spec.md documents every field the spec parser accepts, and its examples are real.

The parser has no list of accepted keys: each ``_Fields.get`` call both reads and allows a key.
So these tests record those calls while parsing the shipped spec, the docs' example and a spec
that reaches every optional branch, and require each recorded field path in its docs section.
No torch: parsing and rendering configs only.
"""

from __future__ import annotations

import ast
import copy
import re
from pathlib import Path

import pytest
import yaml

from tools.build_repo import spec as spec_module
from tools.build_repo.spec import load_spec, parse_spec
from tools.errors import SpecError

REPO_ROOT = Path(__file__).resolve().parents[1]
DOC = REPO_ROOT / "docs" / "spec.md"
DOC_ERROR_SPEC = "/tmp/specdoc/repository.yaml"  # where the docs' error messages were produced

SECTIONS = {  # group -> the docs heading its fields are listed under
    "top": "## Top level",
    "tensor": "## Tensor entries",
    "model": "## `models`",
    "python model": "## `python_models`",
    "pipeline": "## `pipelines`",
}

# A spec that sets every optional field the parser reads, so every branch records its keys.
FULL_SPEC = {
    "target": "gpu",
    "cpu_cores": 4,
    "backends": "backends/python",
    "models": {
        "encoder": {
            "source": "pkg.enc:build_model",
            "sample_inputs": "pkg.enc:sample_inputs",
            "weights": "pkg.enc:weights_files",
            "max_batch_size": 8,
            "inputs": [{"name": "ids", "dtype": "int64", "shape": ["batch", "sequence"], "pad_value": 0}],
            "outputs": [{"name": "vec", "dtype": "float32", "shape": ["batch", 4]}],
            "axes": {"sequence": {"min": 1, "opt": 8, "max": 16, "parity": [4, 16]}},
            "opset": 17,
            "tolerance": {"atol": 1e-4, "rtol": 1e-3},
            "dynamic_batching": {
                "max_queue_delay_microseconds": 100,
                "preferred_batch_size": [4],
                "default_queue_policy": {
                    "max_queue_size": 8, "default_timeout_microseconds": 1000, "timeout_action": "DELAY",
                },
            },
            "instances": {
                "cpu": {"count": 2, "intra_op_threads": 2},
                "gpu": {"count": 1, "gpus": [0], "kind": "gpu"},
            },
            "warmup": {"batch_sizes": [1, 2], "axes": {"sequence": 8}, "count": 2},
            "version_policy": {"latest": 1},
            "gpu": {
                "backend": "onnxruntime", "precision": "fp32", "workspace_mb": 256,
                "onnxruntime_tensorrt_accelerator": True, "fp16_atol": 1e-2, "fp16_rtol": 1e-2,
            },
        },
    },
    "python_models": {
        "tokenizer": {
            "backend": "text_tokenizer",
            "max_batch_size": 8,
            "inputs": [{"name": "TEXT", "dtype": "string", "shape": ["batch", 1]}],
            "outputs": [{"name": "ids", "dtype": "int64", "shape": ["batch", "sequence"]}],
            "parameters": {"max_length": 16},
            "files": {"labels.txt": "backends/python/image_postprocess/labels.txt"},
            "dynamic_batching": {
                "max_queue_delay_microseconds": 100,
                "preferred_batch_size": [4],
                "default_queue_policy": {
                    "max_queue_size": 8, "default_timeout_microseconds": 1000, "timeout_action": "REJECT",
                },
            },
            "instances": {"cpu": {"count": 1}, "gpu": {"count": 1, "gpus": [0], "kind": "gpu"}},
            "warmup": [{"batch_size": 2, "inputs": {"TEXT": ["hello"]}, "count": 1}],
            "version_policy": {"latest": 2},
        },
    },
    "pipelines": {
        "embed": {
            "max_batch_size": 8,
            "inputs": [{"name": "TEXT", "dtype": "string", "shape": ["batch", 1]}],
            "outputs": [{"name": "VEC", "dtype": "float32", "shape": ["batch", 4]}],
            "steps": [
                {"model": "tokenizer", "inputs": {"TEXT": "TEXT"}, "outputs": {"ids": "ids"}},
                {"model": "encoder", "inputs": {"ids": "ids"}, "outputs": {"vec": "VEC"}},
            ],
        },
    },
}


def _doc() -> str:
    return DOC.read_text()


def _section(doc: str, heading: str) -> str:
    """The text from ``heading`` to the next heading of the same level."""
    start = doc.index(heading + "\n")
    level = heading.split(" ", 1)[0]
    following = re.search(rf"^{level} ", doc[start + len(heading):], re.MULTILINE)
    return doc[start: start + len(heading) + following.start()] if following else doc[start:]


def _code_blocks(doc: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", doc, re.MULTILINE | re.DOTALL)


def _doc_path(owner: str, path: str) -> tuple[str, str]:
    """(group, path as the docs write it) for one accepted field.

    Tensor-entry keys go to the shared tensor table; list indices become ``[]``; the names a
    user chooses (axis names, warmup input names) become ``<axis>`` / ``<input>``.
    """
    group = "top" if not owner else owner.rsplit(" ", 1)[0]
    if re.match(r"^(inputs|outputs)\[\d+\]\.", path):
        return "tensor", path.split(".", 1)[1]
    if group == "model":
        path = re.sub(r"^(warmup\.)?axes\.[^.]+", r"\1axes.<axis>", path)
    if group == "python model":
        path = re.sub(r"^(warmup\[\d+\]\.inputs)\.[^.]+$", r"\1.<input>", path)
    return group, re.sub(r"\[\d+\]", "[]", path)


def _accepted_fields(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> set[tuple[str, str]]:
    """Every (group, docs path) the parser reads while parsing the specs that cover it."""
    seen: set[tuple[str, str]] = set()
    original = spec_module._Fields.get

    def recording_get(self, key, *args, **kwargs):
        seen.add(_doc_path(self.owner, f"{self.prefix}{key}"))
        return original(self, key, *args, **kwargs)

    monkeypatch.setattr(spec_module._Fields, "get", recording_get)
    load_spec(REPO_ROOT / "repository.yaml")
    parse_spec(copy.deepcopy(FULL_SPEC), REPO_ROOT / "repository.yaml")
    parse_spec(yaml.safe_load(_code_blocks(_doc(), "yaml")[0]), tmp_path / "repository.yaml")
    return seen


def test_every_field_the_parser_accepts_is_listed_in_its_docs_section(monkeypatch, tmp_path):
    fields = _accepted_fields(monkeypatch, tmp_path)
    doc = _doc()
    missing = []
    for group, path in sorted(fields):
        section = _section(doc, SECTIONS[group])
        # A mapping key is also documented by rows of its children (`instances.cpu.count`).
        if f"`{path}`" not in section and f"`{path}." not in section:
            missing.append(f"{group}: {path}")
    assert not missing, f"{DOC}: fields the parser accepts but the docs do not list: {missing}"


def test_recording_sees_nested_and_per_section_fields(monkeypatch, tmp_path):
    fields = _accepted_fields(monkeypatch, tmp_path)
    assert ("model", "instances.cpu.intra_op_threads") in fields
    assert ("model", "dynamic_batching.default_queue_policy.timeout_action") in fields
    assert ("model", "axes.<axis>.parity") in fields
    assert ("model", "warmup.axes.<axis>") in fields
    assert ("python model", "warmup[].inputs.<input>") in fields
    assert ("pipeline", "steps[].model") in fields
    assert ("tensor", "pad_value") in fields
    assert ("top", "backends") in fields
    # Python models do not take intra_op_threads; the recording must not invent it.
    assert ("python model", "instances.cpu.intra_op_threads") not in fields


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


def _broken(tmp_path: Path, old: str, new: str) -> str:
    text = (REPO_ROOT / "repository.yaml").read_text()
    assert old in text, f"repository.yaml no longer contains {old!r}"
    path = tmp_path / "repository.yaml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    return str(caught.value).replace(str(path.resolve()), DOC_ERROR_SPEC)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("max_queue_delay_microseconds: 2000", "max_queue_delay_microsecond: 2000"),
        ("cpu: {count: 1, intra_op_threads: 2}", "cpu: {count: 2, intra_op_threads: 2}"),
        ("shape: [batch, 384]", "shape: [384]"),
        ("shape: [batch, sequence], pad_value", "shape: [batch, seq_len], pad_value"),
    ],
)
def test_docs_error_messages_are_what_the_parser_says(tmp_path, old, new):
    message = _broken(tmp_path, old, new)
    assert f"Error: {message}\n" in _doc(), f"{DOC}: error example is stale: {message}"
