"""The committed JSON Schemas, checked with the ``jsonschema`` library (not the project's parser).

Editors validate repository.yaml and loadtests/slo.yaml with these files, so they must accept what
the project ships, refuse what the parser refuses field by field, and describe every field.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from tools.build_repo.spec import parse_spec
from tools.spec_schema import description

REPO_ROOT = Path(__file__).resolve().parents[1]
SPEC = REPO_ROOT / "repository.yaml"
SLO = REPO_ROOT / "loadtests" / "slo.yaml"

# A spec that sets every optional field, so the schema is shown to accept each one.
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
            "parameters": {"max_length": 16, "tokenizer_file": "tokenizer.json"},
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


def _schema(path: Path) -> dict:
    """The schema a YAML file names on its first line (as yaml-language-server finds it)."""
    first = path.read_text(encoding="utf-8").splitlines()[0]
    match = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", first)
    assert match, f"{path}: first line must be '# yaml-language-server: $schema=...', got {first!r}"
    schema_path = (path.parent / match[1]).resolve()
    assert schema_path.is_file(), f"{path}: names {match[1]}, which does not exist"
    return json.loads(schema_path.read_text(encoding="utf-8"))


def _validator(path: Path) -> jsonschema.Draft202012Validator:
    schema = _schema(path)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _errors(path: Path, data: object) -> list[str]:
    """Each schema violation as ``<json path>: <message>``."""
    return sorted(f"{e.json_path}: {e.message}" for e in _validator(path).iter_errors(data))


@pytest.mark.parametrize("path", [SPEC, SLO], ids=["repository.yaml", "slo.yaml"])
def test_shipped_yaml_names_its_schema_on_the_first_line_and_validates_against_it(path):
    assert _errors(path, yaml.safe_load(path.read_text(encoding="utf-8"))) == []


def test_repository_schema_accepts_every_optional_field_the_parser_accepts():
    parse_spec(copy.deepcopy(FULL_SPEC), SPEC)  # the parser accepts it too
    assert _errors(SPEC, FULL_SPEC) == []


def test_repository_schema_rejects_a_misspelt_key_where_it_is():
    data = yaml.safe_load(SPEC.read_text())
    batching = data["models"]["minilm_encoder"]["dynamic_batching"]
    batching["max_queue_delay_micros"] = batching.pop("max_queue_delay_microseconds")
    (error,) = _errors(SPEC, data)
    assert error.startswith("$.models.minilm_encoder.dynamic_batching: Additional properties")
    assert "'max_queue_delay_micros' was unexpected" in error


def test_repository_schema_rejects_a_string_where_a_number_belongs():
    data = yaml.safe_load(SPEC.read_text())
    data["models"]["efficientnet_lite0"]["max_batch_size"] = "16"
    data["models"]["efficientnet_lite0"]["tolerance"]["atol"] = "1e-3"
    assert _errors(SPEC, data) == [
        "$.models.efficientnet_lite0.max_batch_size: '16' is not of type 'integer'",
        "$.models.efficientnet_lite0.tolerance.atol: '1e-3' is not of type 'number'",
    ]


@pytest.mark.parametrize(
    ("where", "value", "error_at"),
    [
        pytest.param("python_models.text_tokenizer.inputs.0.pad_value", 0,
                     "$.python_models.text_tokenizer.inputs[0]: Additional properties",
                     id="pad-value-on-a-python-model"),
        pytest.param("python_models.text_tokenizer.instances.cpu.intra_op_threads", 2,
                     "$.python_models.text_tokenizer.instances.cpu: Additional properties",
                     id="threads-on-a-python-model"),
        pytest.param("models.minilm_encoder.outputs.0.shape", [384],
                     "$.models.minilm_encoder.outputs[0].shape[0]: 'batch' was expected",
                     id="shape-without-batch"),
        pytest.param("models.minilm_encoder.weights", None,
                     "$.models.minilm_encoder.weights: None is not of type 'string'",
                     id="null-for-an-omittable-key"),
        pytest.param("models.minilm_encoder.gpu.onnxruntime_tensorrt_accelerator", 1,
                     "$.models.minilm_encoder.gpu.onnxruntime_tensorrt_accelerator: 1 is not of "
                     "type 'boolean'",
                     id="number-for-a-bool"),
    ],
)
def test_repository_schema_rejects_what_the_parser_rejects_field_by_field(where, value, error_at):
    data = yaml.safe_load(SPEC.read_text())
    *parents, key = where.split(".")
    mapping = data
    for part in parents:
        mapping = mapping[int(part)] if part.isdigit() else mapping[part]
    mapping[key] = value
    (error,) = _errors(SPEC, data)
    assert error.startswith(error_at), error


def test_repository_schema_rejects_an_entry_name_that_is_not_an_identifier():
    data = yaml.safe_load(SPEC.read_text())
    data["models"]["minilm-encoder"] = data["models"].pop("minilm_encoder")
    (error,) = _errors(SPEC, data)
    assert error.startswith("$.models: 'minilm-encoder' does not match"), error


def test_slo_schema_rejects_a_misspelt_key_and_a_string_where_a_number_belongs():
    data = yaml.safe_load(SLO.read_text())
    scenario = data["profiles"]["cpu"]["scenarios"]["text_embedding"]
    scenario["load"]["duration"] = scenario["load"].pop("duration_s")
    scenario["http"]["p99_ms"] = "600"
    errors = _errors(SLO, data)
    assert len(errors) == 2, errors
    where = "$.profiles.cpu.scenarios.text_embedding"
    assert errors[0].startswith(f"{where}.http.p99_ms: '600' is not of type 'number'")
    assert errors[1].startswith(f"{where}.load: Additional properties")


def _fields(node: dict, root: dict, where: str, seen: set[str]):
    """(path, schema) of every property reachable from ``node``."""
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        if name in seen:
            return
        node = root["$defs"][name]
        seen = seen | {name}
    for key, prop in node.get("properties", {}).items():
        yield f"{where}.{key}", prop
        yield from _fields(prop, root, f"{where}.{key}", seen)
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            inside = f"{where}[]" if key == "items" else f"{where}.*"
            yield from _fields(node[key], root, inside, seen)


@pytest.mark.parametrize("path", [SPEC, SLO], ids=["repository.yaml", "slo.yaml"])
def test_every_field_of_the_schema_carries_a_description_for_the_editor(path):
    schema = _schema(path)
    fields = list(_fields(schema, schema, "$", set()))
    assert len(fields) > 10
    undescribed = [where for where, prop in fields if not description(prop, schema)]
    assert not undescribed, f"{path}: fields without Field(description=...): {undescribed}"
