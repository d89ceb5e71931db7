"""The repository spec is parsed strictly: every problem at once, each naming file, entry and field.

No torch needed: these tests only parse YAML.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from pathlib import Path

import pytest
import yaml

from spec_helpers import project_spec, write_spec
from tools.build_repo.spec import load_spec, parse_spec, spec_hash
from tools.errors import SpecError, UserInputError

REPO_ROOT = Path(__file__).resolve().parents[1]


_project_spec = project_spec
_write = write_spec


def test_project_spec_parses_with_the_contract_models():
    spec = load_spec(REPO_ROOT / "repository.yaml")
    assert {m.name for m in spec.models} == {"minilm_encoder", "minilm_encoder_int8", "minilm_encoder_bf16",
                                            "efficientnet_lite0"}
    assert {m.name for m in spec.python_models} == {
        "text_tokenizer", "image_preprocess", "image_postprocess"
    }
    assert {p.name for p in spec.pipelines} == {"text_embedding", "text_embedding_int8", "text_embedding_bf16",
                                                "image_classification"}
    encoder = spec.find("minilm_encoder")
    assert [t.dims for t in encoder.inputs] == [(-1,), (-1,)]
    assert encoder.outputs[0].dims == (384,)


def test_spec_error_names_file_model_and_field_when_a_field_is_misspelt(tmp_path):
    data = _project_spec()
    batching = data["models"]["minilm_encoder"]["dynamic_batching"]
    batching["max_queue_delay_micros"] = batching.pop("max_queue_delay_microseconds")
    path = _write(tmp_path, data)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert str(path) in message
    assert "model 'minilm_encoder'" in message
    assert "dynamic_batching.max_queue_delay_micros" in message
    assert "max_queue_delay_microseconds" in message  # the suggestion


def test_spec_error_names_the_field_when_a_value_has_the_wrong_type(tmp_path):
    data = _project_spec()
    data["models"]["efficientnet_lite0"]["max_batch_size"] = "sixteen"
    with pytest.raises(SpecError, match=r"model 'efficientnet_lite0': field 'max_batch_size' must be an integer"):
        load_spec(_write(tmp_path, data))


def test_spec_error_names_the_python_model_when_a_tensor_dtype_is_unknown(tmp_path):
    data = _project_spec()
    data["python_models"]["text_tokenizer"]["outputs"][0]["dtype"] = "int65"
    with pytest.raises(SpecError, match=r"python model 'text_tokenizer': field 'outputs\[0\]\.dtype'"):
        load_spec(_write(tmp_path, data))


def test_spec_refuses_an_unbounded_queue_that_no_gate_bounds_naming_the_field(tmp_path):
    data = _project_spec()
    tokenizer = data["python_models"]["text_tokenizer"]
    tokenizer["parameters"]["admission_models"] = "minilm_encoder,minilm_encoder_bf16"
    with pytest.raises(SpecError) as info:
        load_spec(_write(tmp_path, data))
    message = str(info.value)
    assert "model 'minilm_encoder_int8': field 'dynamic_batching.default_queue_policy'" in message
    assert "is null (an unbounded queue), but no python model's 'admission_models'" in message
    assert "'minilm_encoder'" not in message and "minilm_encoder_bf16'" not in message
    data["models"]["minilm_encoder_int8"]["dynamic_batching"]["default_queue_policy"] = {
        "max_queue_size": 128}
    assert load_spec(_write(tmp_path, data)).find("minilm_encoder_int8").dynamic_batching \
        .queue_policy.max_queue_size == 128


def test_spec_rejects_instances_when_threads_exceed_the_cores(tmp_path):
    data = _project_spec()
    data["models"]["minilm_encoder"]["instances"]["cpu"] = {"count": 2, "intra_op_threads": 2}
    with pytest.raises(SpecError, match=r"minilm_encoder.*instances\.cpu.*exceeds cpu_cores 2"):
        load_spec(_write(tmp_path, data))


def test_spec_rejects_a_dynamic_axis_without_a_range(tmp_path):
    data = _project_spec()
    data["models"]["minilm_encoder"]["axes"] = {}
    with pytest.raises(SpecError, match=r"minilm_encoder.*uses axis 'sequence', not declared"):
        load_spec(_write(tmp_path, data))


def test_spec_rejects_parity_with_a_single_length(tmp_path):
    data = _project_spec()
    data["models"]["minilm_encoder"]["axes"]["sequence"]["parity"] = [16, 16]
    with pytest.raises(SpecError, match=r"field 'axes\.sequence\.parity' must list at least two"):
        load_spec(_write(tmp_path, data))


def test_spec_rejects_an_unknown_top_level_key(tmp_path):
    data = _project_spec() | {"modles": {}}
    with pytest.raises(SpecError, match=r"field 'modles' is not a known field; did you mean 'models'"):
        load_spec(_write(tmp_path, data))


def test_spec_error_is_user_input_when_the_file_is_missing(tmp_path):
    with pytest.raises(UserInputError, match="cannot read the spec"):
        load_spec(tmp_path / "nope.yaml")


def test_parity_batches_are_one_middle_and_max_when_max_batch_size_is_large():
    spec = parse_spec(_project_spec(), REPO_ROOT / "repository.yaml")
    assert spec.find("minilm_encoder").parity_batches == (1, 8, 32)


def test_python_model_preferred_batch_size_above_max_batch_size_is_refused_naming_the_field(
    tmp_path,
):
    root = Path(__file__).resolve().parents[1]
    data = yaml.safe_load((root / "repository.yaml").read_text())
    data["python_models"]["text_tokenizer"]["dynamic_batching"]["preferred_batch_size"] = [64]
    path = tmp_path / "repository.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match=r"python model 'text_tokenizer'.*preferred_batch_size.*64"):
        load_spec(path)


def _messages(tmp_path: Path, data: dict) -> list[str]:
    """The lines of the SpecError the spec raises, each checked to start with the file's path,
    line and column, which are removed."""
    path = _write(tmp_path, data)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    where = re.compile(rf"^{re.escape(str(path.resolve()))}:\d+:\d+: ")
    lines = str(info.value).splitlines()
    assert all(where.match(line) for line in lines), lines
    return [where.sub("", line) for line in lines]


def test_spec_reports_every_problem_of_the_file_at_once_one_line_each(tmp_path):
    data = _project_spec()
    data["models"]["minilm_encoder"]["opset"] = 9
    data["models"]["efficientnet_lite0"]["instances"]["cpu"]["count"] = 4  # 4 x 1 thread > 2 cores
    data["python_models"]["text_tokenizer"]["max_batch_size"] = 0
    data["pipelines"]["text_embedding"]["stepz"] = data["pipelines"]["text_embedding"].pop("steps")
    assert _messages(tmp_path, data) == [
        "model 'minilm_encoder': field 'opset' must be >= 13, got 9",
        "model 'efficientnet_lite0': field 'instances.cpu' count 4 x intra_op_threads 1 exceeds "
        "cpu_cores 2: threads would contend for the cores",
        "python model 'text_tokenizer': field 'max_batch_size' must be positive, got 0",
        "pipeline 'text_embedding': field 'steps' is required",
        "pipeline 'text_embedding': field 'stepz' is not a known field; did you mean 'steps'?",
    ]


def test_spec_reports_several_rules_of_one_model_together(tmp_path):
    encoder = (data := _project_spec())["models"]["minilm_encoder"]
    encoder["axes"]["unused"] = {"min": 1, "opt": 2, "max": 3}
    encoder["dynamic_batching"]["preferred_batch_size"] = [64]
    encoder["instances"]["gpu"]["kind"] = "cpu"  # with gpu.backend tensorrt
    messages = _messages(tmp_path, data)
    assert len(messages) == 3, messages
    assert messages[0] == (
        "model 'minilm_encoder': field 'axes' declares axes no tensor uses: ['unused']"
    )
    assert messages[1] == (
        "model 'minilm_encoder': field 'dynamic_batching.preferred_batch_size' holds [64], "
        "more than max_batch_size 32"
    )
    assert messages[2].startswith(
        "model 'minilm_encoder': field 'instances.gpu.kind' is 'cpu', but a TensorRT plan runs "
        "only on a GPU"
    )


def test_unknown_key_error_suggests_the_closest_known_key_of_its_own_mapping(tmp_path):
    data = _project_spec()
    data["python_models"]["image_postprocess"]["outputs"][1]["dtpye"] = "float32"
    data["models"]["efficientnet_lite0"]["gpu"]["precison"] = "fp32"
    assert _messages(tmp_path, data) == [
        "model 'efficientnet_lite0': field 'gpu.precison' is not a known field; "
        "did you mean 'precision'?",
        "python model 'image_postprocess': field 'outputs[1].dtpye' is not a known field; "
        "did you mean 'dtype'?",
    ]


def test_unknown_key_error_lists_the_allowed_keys_when_none_is_close(tmp_path):
    data = _project_spec()
    data["models"]["minilm_encoder"]["tolerance"]["zzz"] = 1
    (message,) = _messages(tmp_path, data)
    assert message == (
        "model 'minilm_encoder': field 'tolerance.zzz' is not a known field "
        "(allowed: ['atol', 'rtol'])"
    )


def test_warmup_axis_that_the_model_does_not_declare_suggests_the_declared_one(tmp_path):
    data = _project_spec()
    data["models"]["minilm_encoder"]["warmup"]["axes"] = {"sequense": 32}
    (message,) = _messages(tmp_path, data)
    assert message == (
        "model 'minilm_encoder': field 'warmup.axes.sequense' is not a declared axis; "
        "did you mean 'sequence'?"
    )


_AXES = {"sequence": {"min": 2, "opt": 32, "max": 256}}
_PIXELS = {"name": "pixel_values", "dtype": "float32", "shape": ["batch", 3, 224, 224]}


def _rule(section, name, change, expected, id):
    return pytest.param(section, name, change, expected, id=id)


@pytest.mark.parametrize(
    ("section", "name", "change", "expected"),
    [
        _rule("models", "minilm_encoder",
              {"axes": {"sequence": {"min": 2, "opt": 300, "max": 256}}},
              "field 'axes.sequence.opt' must satisfy min <= opt <= max, got 2 <= 300 <= 256",
              "opt-outside-min-max"),
        _rule("models", "minilm_encoder",
              {"axes": {"sequence": {**_AXES["sequence"], "parity": [1, 16]}}},
              "field 'axes.sequence.parity' lengths must lie in [2, 256], got [1]",
              "parity-length-outside-the-range"),
        _rule("models", "minilm_encoder",
              {"axes": {"sequence": {"min": 2, "opt": 256, "max": 256}}},
              "field 'axes.sequence.parity' must list at least two lengths, got [256]",
              "parity-needs-two-lengths"),
        _rule("models", "minilm_encoder",
              {"axes": {**_AXES, "batch": {"min": 1, "opt": 1, "max": 1}}},
              "field 'axes.batch' is set by max_batch_size, not here",
              "batch-is-not-a-declared-axis"),
        _rule("models", "efficientnet_lite0",
              {"outputs": [{"name": "logits", "dtype": "string", "shape": ["batch", 1000]}]},
              "field 'outputs[0]' has dtype 'string'; a PyTorch model takes numeric tensors",
              "pytorch-tensors-are-numeric"),
        _rule("models", "efficientnet_lite0", {"inputs": []},
              "field 'inputs' must not be empty",
              "pytorch-model-needs-an-input"),
        _rule("models", "efficientnet_lite0", {"warmup": {"batch_sizes": [1, 32]}},
              "field 'warmup.batch_sizes' must lie in [1, max_batch_size 16], got [32]",
              "warmup-batch-within-max-batch-size"),
        _rule("models", "minilm_encoder", {"warmup": {"axes": {"sequence": 512}}},
              "field 'warmup.axes.sequence' must lie in [2, 256], got 512",
              "warmup-length-within-the-axis-range"),
        _rule("models", "efficientnet_lite0",
              {"outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 0]}]},
              "field 'outputs[0].shape[1]' must be a positive integer or an axis name "
              "(identifier), got 0",
              "dims-are-positive"),
        _rule("models", "efficientnet_lite0", {"inputs": [_PIXELS, _PIXELS]},
              "field 'inputs' names a tensor more than once: ['pixel_values']",
              "tensor-names-are-unique"),
        _rule("models", "efficientnet_lite0", {"source": "tools.models.efficientnet_lite0"},
              "field 'source' must be a reference 'package.module:function', "
              "got 'tools.models.efficientnet_lite0'",
              "source-is-a-reference"),
        _rule("models", "efficientnet_lite0", {"weights": None},
              "field 'weights' must not be null: leave the key out instead",
              "null-is-not-a-default"),
        _rule("python_models", "text_tokenizer", {"instances": {"cpu": {"count": 3}}},
              "field 'instances.cpu' count 3 exceeds cpu_cores 2",
              "python-instances-fit-the-cores"),
        _rule("python_models", "text_tokenizer",
              {"instances": {"cpu": {"count": 1, "intra_op_threads": 1}}},
              "field 'instances.cpu.intra_op_threads' is not a known field (allowed: ['count'])",
              "python-models-take-no-intra-op-threads"),
        _rule("python_models", "text_tokenizer", {"parameters": {"lowercase": True}},
              "field 'parameters.lowercase' must be a string or number, got True",
              "parameters-are-strings-or-numbers"),
        _rule("python_models", "text_tokenizer", {"files": {"sub/tokenizer.json": "x"}},
              "field 'files.sub/tokenizer.json' must be a plain file name (no '/'), "
              "got 'sub/tokenizer.json'",
              "file-names-have-no-slash"),
        _rule("python_models", "text_tokenizer", {"warmup": [{"inputs": {}}]},
              "field 'warmup[0].inputs.TEXT' is required (every input needs warmup data)",
              "python-warmup-covers-every-input"),
        _rule("python_models", "image_postprocess", {"warmup": [{"inputs": {"logits": ["a"]}}]},
              "field 'warmup[0].inputs.logits' is a float32 input; warmup supports string inputs "
              "given as a list",
              "python-warmup-takes-strings-only"),
        _rule("python_models", "text_tokenizer",
              {"inputs": [{"name": "TEXT", "dtype": "string", "shape": ["batch", 1],
                           "pad_value": 0}]},
              "field 'inputs[0].pad_value' is not a known field",
              "only-pytorch-inputs-take-pad-value"),
        _rule("pipelines", "text_embedding", {"steps": []},
              "field 'steps' must not be empty",
              "pipeline-needs-a-step"),
        _rule("pipelines", "text_embedding",
              {"steps": [{"model": "text_tokenizer", "inputs": {"TEXT": 1}, "outputs": {}}]},
              "field 'steps[0].inputs.TEXT' must be a string, got 1",
              "step-maps-to-tensor-names"),
    ],
)
def test_spec_keeps_each_rule_and_names_the_field(tmp_path, section, name, change, expected):
    data = _project_spec()
    data[section][name].update(change)
    owner = {"models": "model", "python_models": "python model", "pipelines": "pipeline"}[section]
    messages = _messages(tmp_path, data)
    assert any(m.startswith(f"{owner} {name!r}: {expected}") for m in messages), messages


def test_spec_rejects_names_used_by_two_sections(tmp_path):
    data = _project_spec()
    data["pipelines"]["minilm_encoder"] = data["pipelines"].pop("text_embedding")
    assert _messages(tmp_path, data) == [
        "names used by more than one model or pipeline: ['minilm_encoder']"
    ]


def test_spec_rejects_an_entry_name_that_is_not_an_identifier(tmp_path):
    data = _project_spec()
    data["models"]["minilm-encoder"] = data["models"].pop("minilm_encoder")
    assert _messages(tmp_path, data) == [
        "field 'models.minilm-encoder' must be an identifier, got 'minilm-encoder'"
    ]


def test_spec_explains_a_yaml_exponent_that_reads_as_a_string(tmp_path):
    path = tmp_path / "repository.yaml"
    path.write_text((REPO_ROOT / "repository.yaml").read_text().replace(
        "tolerance: {atol: 1.0e-3", "tolerance: {atol: 1e-3", 1))
    expected = (r"field 'tolerance\.atol' must be a number, got the string '1e-3' "
                r"\(YAML needs a dot and a signed exponent: write 1\.0e-3\)")
    with pytest.raises(SpecError, match=expected):
        load_spec(path)


def test_spec_rejects_a_yaml_date_where_a_string_belongs(tmp_path):
    (message,) = _messages(tmp_path, _project_spec() | {"backends": datetime.date(2024, 1, 2)})
    assert message == "field 'backends' is a YAML date (2024-01-02); quote it to make it a string"


def test_spec_rejects_a_document_that_is_not_a_mapping(tmp_path):
    path = tmp_path / "repository.yaml"
    path.write_text("- models\n")
    with pytest.raises(SpecError, match=r"repository\.yaml:1:1: must be a mapping, got \['models'\]"):
        load_spec(path)


def test_spec_fills_in_the_defaults_the_builder_reads():
    spec = parse_spec(_project_spec(), REPO_ROOT / "repository.yaml")
    assert spec.backends == REPO_ROOT / "backends" / "python"
    tokenizer = spec.find("text_tokenizer")
    assert tokenizer.instances.gpu.kind == "cpu" and tokenizer.instances.cpu.intra_op_threads == 1
    assert tuple(tokenizer.parameters.items()) == (
        ("tokenizer_file", "tokenizer.json"), ("max_length", "256"),
        ("admission_models", "minilm_encoder,minilm_encoder_int8,minilm_encoder_bf16"),
        ("admission_max_pending", "64"), ("admission_max_wait_ms", "500"),
    )
    image = spec.find("efficientnet_lite0")
    assert image.instances.gpu.kind == "gpu"
    assert image.warmup_lengths == {} and image.warmup.count == 1
    assert image.inputs[0].pad_value == 0 and image.version_policy_latest == 1
    assert (image.atol, image.rtol) == (1e-3, 1e-3)
    assert (image.gpu.fp16_atol, image.gpu.fp16_rtol) == (5e-2, 5e-2)
    encoder = spec.find("minilm_encoder")
    assert encoder.axis("sequence").parity == (16, 128)
    assert encoder.warmup_lengths == {"sequence": 32}
    assert encoder.dynamic_batching.queue_policy is None, "bounded by text_tokenizer's gate"
    assert spec.find("text_tokenizer").dynamic_batching.queue_policy.max_queue_size == 64
    assert spec.find("text_embedding").steps[0].inputs == {"TEXT": "TEXT"}


def test_spec_hash_is_stable_and_changes_with_the_entry_and_the_target():
    spec = load_spec(REPO_ROOT / "repository.yaml")
    again = load_spec(REPO_ROOT / "repository.yaml")
    encoder = spec.find("minilm_encoder")
    assert spec_hash(encoder, "cpu") == spec_hash(again.find("minilm_encoder"), "cpu")
    assert spec_hash(encoder, "cpu") != spec_hash(encoder, "gpu")
    assert spec_hash(encoder, "cpu") != spec_hash(spec.find("efficientnet_lite0"), "cpu")
    changed = dataclasses.replace(encoder, opset=18)
    assert spec_hash(changed, "cpu") != spec_hash(encoder, "cpu")


# --- targets ----------------------------------------------------------------------------------


def test_a_pipeline_on_a_target_its_step_model_is_not_built_for_is_refused_naming_both(tmp_path):
    data = project_spec()
    data["pipelines"]["text_embedding_bf16"].pop("targets")  # both targets, model only cpu
    with pytest.raises(SpecError) as info:
        load_spec(write_spec(tmp_path, data))
    message = str(info.value)
    assert "pipeline 'text_embedding_bf16': field 'targets' includes ['gpu']" in message
    assert "step model 'minilm_encoder_bf16' is built only for ['cpu']" in message


@pytest.mark.parametrize("targets, problem", [([], "at least 1"), (["tpu"], "'cpu' or 'gpu'")])
def test_targets_must_be_a_non_empty_list_of_known_targets(tmp_path, targets, problem):
    data = project_spec()
    data["models"]["minilm_encoder_int8"]["targets"] = targets
    with pytest.raises(SpecError, match=r"model 'minilm_encoder_int8': field 'targets"):
        load_spec(write_spec(tmp_path, data))


def test_for_target_drops_the_entries_built_for_other_targets_only():
    spec = load_spec(REPO_ROOT / "repository.yaml")
    gpu = spec.for_target("gpu")
    assert {m.name for m in gpu.models} == {"minilm_encoder", "efficientnet_lite0"}
    assert {p.name for p in gpu.pipelines} == {"text_embedding", "image_classification"}
    assert gpu.python_models == spec.python_models
    assert spec.for_target("cpu") == spec
    assert spec.find("minilm_encoder").targets == ("cpu", "gpu")
    tokenizer = dict(spec.find("text_tokenizer").parameters_for("gpu"))
    assert tokenizer["admission_models"] == "minilm_encoder"  # the gate names what gpu serves


def test_only_names_a_model_left_out_of_the_target_with_its_targets(tmp_path):
    from tools.build_repo.pipeline import build_repository

    with pytest.raises(UserInputError, match=r"--only minilm_encoder_bf16: not built for target "
                                             r"gpu \(its targets: \['cpu'\]\)"):
        build_repository(spec_path=REPO_ROOT / "repository.yaml", output=tmp_path / "out",
                         target="gpu", only=["minilm_encoder_bf16"], progress=False)
    assert not (tmp_path / "out").exists()
