"""config.pbtxt rendering through Triton's ModelConfig protobuf, goldens and `--check` drift.

The cpu target is checked against the committed ``model_repository/*/config.pbtxt`` (the files
`tools build-repo --check` guards); the gpu target, which nothing commits, against the goldens in
``tests/golden/gpu``. Both render from the project's ``repository.yaml``. No torch needed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from tritonclient.grpc import model_config_pb2

from tools.build_repo.command import build_repo
from tools.build_repo.drift import check_repository
from tools.build_repo import config as cfg
from tools.build_repo.config import (
    TensorConfig,
    TritonModelConfig,
    config_message,
    parse_config,
    render,
)
from tools.build_repo.ensemble import render_all
from tools.build_repo.spec import load_spec
from tools.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "repository.yaml"
COMMITTED = ROOT / "model_repository"
GOLDEN_GPU = Path(__file__).parent / "golden" / "gpu"


def _rendered(target: str) -> dict[str, model_config_pb2.ModelConfig]:
    spec = load_spec(SPEC)
    return {name: c.to_message() for name, c in render_all(spec, target).items()}


def test_misspelt_config_field_fails_at_build_time_naming_the_field():
    with pytest.raises(ConfigError, match=r"model 'toy'.*max_batch_sizes"):
        config_message({"name": "toy", "max_batch_sizes": 8}, "toy")


def test_misspelt_extra_field_of_a_typed_config_fails_when_rendered():
    typed = TritonModelConfig(
        name="toy", max_batch_size=4,
        inputs=(TensorConfig("x", "TYPE_FP32", (3,)),),
        outputs=(TensorConfig("y", "TYPE_FP32", (3,)),),
        extra={"dynamic_batchng": {}},
    )
    with pytest.raises(ConfigError, match="dynamic_batchng"):
        typed.to_message()


def test_config_with_an_unknown_enum_value_fails_naming_the_value():
    with pytest.raises(ConfigError, match="TYPE_FP33"):
        TritonModelConfig(
            name="toy", max_batch_size=4,
            inputs=(TensorConfig("x", "TYPE_FP33", (3,)),), outputs=(),
        ).to_message()


def test_rendered_gpu_configs_equal_the_golden_messages():
    rendered = _rendered("gpu")
    goldens = sorted(GOLDEN_GPU.glob("*.pbtxt"))
    assert {p.stem for p in goldens} == set(rendered)
    for path in goldens:
        assert rendered[path.stem] == parse_config(path.read_text(), path), path.name


def test_cpu_encoder_is_served_by_the_python_onnx_runner_with_ragged_inputs():
    encoder = _rendered("cpu")["minilm_encoder"]
    assert encoder.backend == "python"
    assert all(i.allow_ragged_batch for i in encoder.input)
    params = {k: v.string_value for k, v in encoder.parameters.items()}
    assert params["onnx_file"] == "model.onnx"
    int8 = {k: v.string_value for k, v in _rendered("cpu")["minilm_encoder_int8"].parameters.items()}
    assert int8["onnx_file"] == "model.int8.xml"  # OpenVINO IR of the static int8 graph
    count = encoder.instance_group[0].count
    assert count * int(params["intra_op_threads"]) <= 2
    assert encoder.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU


def test_cpu_onnx_runner_configs_carry_the_spec_max_of_every_dynamic_axis():
    spec = load_spec(SPEC)
    rendered = _rendered("cpu")
    encoder = {k: v.string_value for k, v in rendered["minilm_encoder"].parameters.items()}
    assert json.loads(encoder["max_dims"]) == {"input_ids": [256], "attention_mask": [256]}
    assert spec.find("minilm_encoder").axis("sequence").max == 256
    classifier = {k: v.string_value for k, v in rendered["efficientnet_lite0"].parameters.items()}
    assert json.loads(classifier["max_dims"]) == {}  # fixed dims only: nothing to limit


def test_gpu_encoder_is_a_tensorrt_plan_on_gpu_instances_without_ragged_inputs():
    encoder = _rendered("gpu")["minilm_encoder"]
    assert encoder.platform == "tensorrt_plan"
    assert not any(i.allow_ragged_batch for i in encoder.input)
    assert encoder.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU


def _gated(configs) -> set[str]:
    """The models a queue gate (``admission_models``) of some step bounds."""
    return {m for c in configs.values() if "admission_models" in c.parameters
            for m in c.parameters["admission_models"].string_value.split(",")}


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_every_batching_model_rejects_overload_with_a_bounded_queue_or_sits_behind_a_gate(target):
    configs = _rendered(target)
    unbounded = set()
    for name, config in configs.items():
        if config.platform == "ensemble":
            continue
        assert config.max_batch_size > 0, name
        if not config.dynamic_batching.HasField("default_queue_policy"):
            unbounded.add(name)
            continue
        policy = config.dynamic_batching.default_queue_policy
        assert policy.default_timeout_microseconds > 0, name  # a delay bound, and on cpu a size
        assert policy.max_queue_size > 0 or target == "gpu", name
        assert policy.timeout_action == model_config_pb2.ModelQueuePolicy.REJECT, name
        if target == "gpu":  # no guard: the queue itself refuses what waited out the objective
            assert policy.default_timeout_microseconds <= 1000 * float(
                config.parameters["admission_p99_ms"].string_value), "waited out its objective"
    if target == "gpu":  # no guard runs in the NGC image: every queue has a delay bound there
        assert unbounded == set()
        return
    # the cpu encoders go without a policy (so Triton prefetches their next batch): the guards
    # bound direct calls by their P99 objective, text_tokenizer's gate the ensemble path
    assert "minilm_encoder" in unbounded
    assert unbounded <= _gated(configs), unbounded - _gated(configs)
    assert all("admission_p99_ms" in configs[name].parameters for name in unbounded)


def test_max_batch_size_is_written_even_when_zero():
    message = config_message({"name": "unbatched", "max_batch_size": 0}, "unbatched")
    assert "max_batch_size: 0" in render(message)


def test_warmup_uses_concrete_dims_for_ragged_inputs():
    encoder = _rendered("cpu")["minilm_encoder"]
    assert [w.batch_size for w in encoder.model_warmup] == [1, 8]
    for warmup in encoder.model_warmup:
        for name, data in warmup.inputs.items():
            assert list(data.dims) == [32], name
            assert data.input_data_file.endswith(".bin")


def _committed(tmp_path: Path) -> Path:
    """A copy of the committed cpu configs (only the config.pbtxt files)."""
    output = tmp_path / "model_repository"
    for path in COMMITTED.glob("*/config.pbtxt"):
        (output / path.parent.name).mkdir(parents=True)
        shutil.copy(path, output / path.parent.name / "config.pbtxt")
    return output


def test_check_passes_when_committed_configs_match_the_spec(tmp_path):
    output = _committed(tmp_path)
    result = CliRunner().invoke(build_repo, ["--spec", str(SPEC), "--repository", str(output), "--check"])
    assert result.exit_code == 0, result.output
    assert check_repository(SPEC, output) == []


def test_check_fails_with_a_diff_when_a_committed_config_drifted(tmp_path):
    output = _committed(tmp_path)
    path = output / "text_tokenizer" / "config.pbtxt"
    path.write_text(path.read_text().replace("max_queue_size: 64", "max_queue_size: 9"))
    result = CliRunner().invoke(build_repo, ["--spec", str(SPEC), "--repository", str(output), "--check"])
    assert result.exit_code != 0
    assert "-    max_queue_size: 9" in result.output
    assert "+    max_queue_size: 64" in result.output


def test_check_reports_a_missing_config(tmp_path):
    output = _committed(tmp_path)
    shutil.rmtree(output / "text_embedding")
    drift = check_repository(SPEC, output)
    assert len(drift) == 1 and "text_embedding" in drift[0] and "missing" in drift[0]


def test_committed_project_configs_match_the_project_spec():
    committed = sorted(p.parent.name for p in COMMITTED.glob("*/config.pbtxt"))
    assert committed == sorted(load_spec(SPEC).names()), f"{COMMITTED}: run tools build-repo"
    assert check_repository(SPEC, COMMITTED) == []


def test_cli_rejects_an_unknown_only_name_as_a_usage_error(tmp_path):
    from tools.cli import cli

    result = CliRunner().invoke(
        cli, ["build-repo", "--spec", str(SPEC), "--repository", str(tmp_path / "out"), "--only", "nope"]
    )
    assert result.exit_code == 2
    assert "--only nope: not in" in result.output
    assert not (tmp_path / "out").exists()


def _spec_with_encoder(tmp_path: Path, instances_gpu: dict, gpu: dict) -> Path:
    import yaml

    data = yaml.safe_load(SPEC.read_text())
    data["models"]["minilm_encoder"]["instances"]["gpu"] = instances_gpu
    data["models"]["minilm_encoder"]["gpu"] = gpu
    path = tmp_path / "repository.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_gpu_target_onnxruntime_encoder_runs_on_cpu_instances_when_the_spec_says_kind_cpu(
    tmp_path,
):
    spec = load_spec(_spec_with_encoder(tmp_path, {"count": 2, "kind": "cpu"},
                                        {"backend": "onnxruntime"}))
    encoder = render_all(spec, "gpu")["minilm_encoder"].to_message()
    assert encoder.backend == "onnxruntime"
    (group,) = encoder.instance_group
    assert group.kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert group.count == 2 and not group.gpus


def test_spec_refuses_cpu_instances_for_a_tensorrt_plan_naming_the_field(tmp_path):
    from tools.errors import SpecError

    path = _spec_with_encoder(tmp_path, {"count": 1, "kind": "cpu"}, {"backend": "tensorrt"})
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert "model 'minilm_encoder'" in message and "instances.gpu.kind" in message
    assert "onnxruntime" in message


def test_a_lone_instance_behind_a_bounded_queue_gets_a_note_and_the_shipped_spec_none(tmp_path):
    shipped = load_spec(SPEC)
    assert cfg.queue_stall_advisories(render_all(shipped, "cpu"), [m.name for m in shipped.models]) == []
    gpu = shipped.for_target("gpu")
    assert cfg.queue_stall_advisories(render_all(shipped, "gpu"), [m.name for m in gpu.models]) == []

    text = SPEC.read_text()
    start = text.index("  efficientnet_lite0:")
    lone = text[:start] + text[start:].replace("cpu: {count: 2, intra_op_threads: 1}",
                                              "cpu: {count: 1, intra_op_threads: 2}", 1)
    shutil.copytree(SPEC.parent / "backends", tmp_path / "backends")
    (tmp_path / "repository.yaml").write_text(lone)
    spec = load_spec(tmp_path / "repository.yaml")
    notes = cfg.queue_stall_advisories(render_all(spec, "cpu"), [m.name for m in spec.models])
    assert len(notes) == 1 and notes[0].startswith("efficientnet_lite0: one instance with max_queue_size 64")
    assert "idle for up to 500 ms" in notes[0]
