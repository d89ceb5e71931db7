"""Admission settings rendered from the SLO file (``tools.build_repo.admission``).

The SLO file is the one source of each pipeline's P99 objective: the configs carry it
(``admission_p99_ms``, queue timeouts capped by it, a delay-bounded queue on the gpu target), so
``tools build-repo --check`` fails when the SLO file and a committed repository disagree. A
pipeline added with ``tools add`` gets it from the entry ``tools add`` writes. No torch needed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tools.add.command import add_model
from tools.build_repo.admission import P99_PARAMETER, objectives
from tools.build_repo.drift import check_repository
from tools.build_repo.ensemble import render_all
from tools.build_repo.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
SPEC_TEXT = """\
target: cpu
cpu_cores: 2
python_models:
  prep:
    backend: text_tokenizer
    max_batch_size: 8
    inputs: [{name: TEXT, dtype: string, shape: [batch, 1]}]
    outputs: [{name: ids, dtype: int64, shape: [batch, 4]}]
    dynamic_batching:
      default_queue_policy: {max_queue_size: 16, default_timeout_microseconds: 2000000}
  rank:
    backend: text_tokenizer
    max_batch_size: 8
    inputs: [{name: ids, dtype: int64, shape: [batch, 4]}]
    outputs: [{name: SCORE, dtype: float32, shape: [batch, 1]}]
    parameters: {}
    dynamic_batching:
      default_queue_policy: {max_queue_size: 16, default_timeout_microseconds: 100000}
  other:
    backend: text_tokenizer
    max_batch_size: 8
    inputs: [{name: ids, dtype: int64, shape: [batch, 4]}]
    outputs: [{name: SCORE, dtype: float32, shape: [batch, 1]}]
pipelines:
  search:
    max_batch_size: 8
    inputs: [{name: TEXT, dtype: string, shape: [batch, 1]}]
    outputs: [{name: SCORE, dtype: float32, shape: [batch, 1]}]
    steps:
      - {model: prep, inputs: {TEXT: TEXT}, outputs: {ids: ids}}
      - {model: rank, inputs: {ids: ids}, outputs: {SCORE: SCORE}}
  search_other:
    max_batch_size: 8
    inputs: [{name: TEXT, dtype: string, shape: [batch, 1]}]
    outputs: [{name: SCORE, dtype: float32, shape: [batch, 1]}]
    steps:
      - {model: prep, inputs: {TEXT: TEXT}, outputs: {ids: ids}}
      - {model: other, inputs: {ids: ids}, outputs: {SCORE: SCORE}}
"""


def _slo(entries: dict[str, tuple[float, float]], profile: str = "cpu") -> str:
    lines = ["profiles:", f"  {profile}:", "    scenarios:"]
    for name, (http, grpc) in entries.items():
        lines += [f"      {name}:", "        load: {users: 4}",
                  f"        http: {{p99_ms: {http}, max_error_ratio: 0}}",
                  f"        grpc: {{p99_ms: {grpc}, max_error_ratio: 0}}"]
    return "\n".join(lines) + "\n"


@pytest.fixture
def spec(tmp_path: Path):
    path = tmp_path / "repository.yaml"
    path.write_text(SPEC_TEXT)
    return path


def test_objectives_come_from_the_slo_file_and_flow_down_to_steps_and_up_to_pipelines(spec):
    (spec.parent / "slo.yaml").write_text(_slo({"search": (800, 600), "rank": (300, 300)}))
    found = objectives(load_spec(spec), "cpu")
    assert found["search"] == 600, "the tighter of HTTP and gRPC"
    assert found["prep"] == 600, "a step takes its pipeline's"
    assert found["rank"] == 300, "a model's own entry wins"
    assert found["search_other"] == 600, "a pipeline without one takes its shared step's"
    assert found["other"] == 600, "... and passes it to its other steps"


def test_no_slo_file_or_no_profile_gives_no_objective(spec):
    assert objectives(load_spec(spec), "cpu") == {}
    (spec.parent / "slo.yaml").write_text(_slo({"search": (800, 600)}, profile="gpu"))
    assert objectives(load_spec(spec), "cpu") == {}


def test_configs_carry_the_objective_and_gpu_queues_never_wait_longer_than_it(spec):
    (spec.parent / "slo.yaml").write_text(_slo({"search": (600, 600), "rank": (300, 300)}, "gpu")
                                          + _slo({"search": (600, 600), "rank": (300, 300)})[
                                              len("profiles:\n"):])
    for target in ("cpu", "gpu"):
        configs = {n: c.to_message() for n, c in render_all(load_spec(spec), target).items()}
        assert configs["search"].parameters[P99_PARAMETER].string_value == "600"
        assert configs["rank"].parameters[P99_PARAMETER].string_value == "300"
        prep = configs["prep"].dynamic_batching.default_queue_policy
        rank = configs["rank"].dynamic_batching.default_queue_policy
        assert prep.max_queue_size == 16
        assert rank.default_timeout_microseconds == 100_000, "an explicit shorter timeout is kept"
        if target == "gpu":  # no guard in the NGC image: the queue bounds the delay
            assert prep.default_timeout_microseconds == 600_000, "2 s capped at the objective"
        else:  # the guards admit by latency; the spec's timeout is the backstop
            assert prep.default_timeout_microseconds == 2_000_000


def test_on_gpu_a_model_without_a_queue_policy_gets_a_delay_bound(spec):
    text = SPEC_TEXT.replace(
        "    parameters: {}\n    dynamic_batching:\n"
        "      default_queue_policy: {max_queue_size: 16, default_timeout_microseconds: 100000}",
        "    dynamic_batching: {default_queue_policy: null}")
    text = text.replace("    outputs: [{name: ids, dtype: int64, shape: [batch, 4]}]\n",
                        "    outputs: [{name: ids, dtype: int64, shape: [batch, 4]}]\n"
                        "    parameters: {admission_models: rank, admission_max_pending: 8}\n", 1)
    spec.write_text(text)
    (spec.parent / "slo.yaml").write_text(_slo({"search": (50, 50)}, "gpu")
                                          + _slo({"search": (600, 600)})[len("profiles:\n"):])
    loaded = load_spec(spec)
    cpu = render_all(loaded, "cpu")["rank"].to_message()
    assert not cpu.dynamic_batching.HasField("default_queue_policy"), "cpu: Triton prefetches"
    gpu = render_all(loaded, "gpu")["rank"].to_message()
    policy = gpu.dynamic_batching.default_queue_policy
    assert policy.default_timeout_microseconds == 50_000 and policy.max_queue_size == 0


def test_a_pipeline_added_with_tools_add_gets_the_objective_tools_add_wrote(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["features"], ["scores"])], "tiny",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 3])])
    model_file = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              str(model_file))
    spec = tmp_path / "repository.yaml"
    add_model("onnx", str(model_file), "tiny", spec)
    config = render_all(load_spec(spec), "cpu")["tiny"].to_message()
    assert config.parameters[P99_PARAMETER].string_value == "1000"  # tools add's SLO entry
    assert config.dynamic_batching.default_queue_policy.default_timeout_microseconds <= 1_000_000


def test_check_fails_when_the_slo_file_and_the_committed_configs_disagree(tmp_path):
    shutil.copy(ROOT / "repository.yaml", tmp_path / "repository.yaml")
    (tmp_path / "loadtests").mkdir()
    slo = (ROOT / "loadtests" / "slo.yaml").read_text()
    (tmp_path / "loadtests" / "slo.yaml").write_text(slo)
    assert check_repository(tmp_path / "repository.yaml", ROOT / "model_repository") == []
    (tmp_path / "loadtests" / "slo.yaml").write_text(
        slo.replace("http: {p99_ms: 600,", "http: {p99_ms: 400,", 1))
    drift = "\n".join(check_repository(tmp_path / "repository.yaml", ROOT / "model_repository"))
    assert '-    string_value: "600"' in drift and '+    string_value: "400"' in drift
    assert "text_embedding/config.pbtxt" in drift and "minilm_encoder/config.pbtxt" in drift


def test_the_front_reads_the_parameter_the_build_writes():
    from tools.front import controller, plan

    # the controller runs in the serving images' supervisor (standard library only), so the
    # name is written in each place that reads it
    assert controller.P99_PARAMETER == plan.P99_PARAMETER == P99_PARAMETER
