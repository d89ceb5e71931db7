"""`tools deploy k8s`: the rendered manifests against golden files, sizing rules and bad input.

No cluster is needed: objects are compared as parsed YAML, errors by their message.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tools.build_repo.spec import load_spec
from tools.cli import cli
from tools.deploy import manifests, promql
from tools.deploy.render import MARKER, OutputFolderError, render_k8s
from tools.deploy.sizing import ResourceError, size_pod
from tools.errors import UserInputError

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "repository.yaml"
GOLDEN = Path(__file__).parent / "golden" / "k8s"


def _documents(folder: Path) -> dict[str, list]:
    return {
        str(p.relative_to(folder)): list(yaml.safe_load_all(p.read_text()))
        for p in sorted(folder.rglob("*.yaml"))
    }


def _without_spec_text(documents: dict[str, list]) -> dict[str, list]:
    """The golden files without repository.yaml's own text and hash (edited by others often);
    test_a_new_spec_gets_a_new_configmap_name_so_it_rolls_out covers those."""
    text = yaml.safe_dump(documents, sort_keys=True)
    text = re.sub(r"triton-forge-spec-[0-9a-f]{10}", "triton-forge-spec-HASH", text)
    documents = yaml.safe_load(text)
    for doc in documents.get("manifests/configmap-spec.yaml", []):
        doc["data"]["repository.yaml"] = "<repository.yaml>"
    return documents


def _objects(folder: Path) -> dict[str, dict]:
    return {
        f"{doc['kind']}/{doc['metadata']['name']}": doc
        for docs in _documents(folder / "manifests").values()
        for doc in docs
    }


@pytest.fixture(scope="module", params=["cpu", "gpu"])
def rendered(request, tmp_path_factory) -> tuple[str, Path]:
    output = tmp_path_factory.mktemp(f"k8s-{request.param}") / "out"
    render_k8s(SPEC, request.param, output)
    return request.param, output


def test_rendered_manifests_equal_the_golden_files_as_parsed_yaml(rendered):
    target, output = rendered
    golden = GOLDEN / target
    assert _without_spec_text(_documents(output)) == _without_spec_text(_documents(golden)), (
        f"re-render the golden files after checking the diff: "
        f"tools deploy k8s --target {target} --output {golden.relative_to(ROOT)}"
    )


def test_every_container_has_requests_equal_to_limits_so_the_pod_is_guaranteed(rendered):
    target, output = rendered
    pod = _objects(output)["Deployment/triton-forge"]["spec"]["template"]["spec"]
    for container in pod["initContainers"] + pod["containers"]:
        resources = container["resources"]
        assert resources["requests"] == resources["limits"], container["name"]
        assert {"cpu", "memory"} <= set(resources["limits"])
        assert ("nvidia.com/gpu" in resources["limits"]) == (target == "gpu")


def test_memory_limit_covers_the_shm_emptydir_and_the_sized_instances(rendered):
    target, output = rendered
    pod = _objects(output)["Deployment/triton-forge"]["spec"]["template"]["spec"]
    sizing = size_pod(load_spec(SPEC), target)
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")["emptyDir"]
    assert shm == {"medium": "Memory", "sizeLimit": f"{sizing.shm_mib}Mi"}
    limit = pod["containers"][0]["resources"]["limits"]["memory"]
    assert limit == f"{sizing.memory_mib}Mi"
    assert sizing.memory_mib >= sum(mib for _, mib in sizing.breakdown)


def test_all_three_probes_run_the_compose_healthcheck_with_its_probe_file(rendered):
    target, output = rendered
    triton = _objects(output)["Deployment/triton-forge"]["spec"]["template"]["spec"]["containers"][0]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    compose_test = compose["services"]["triton"]["healthcheck"]["test"][1:]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = triton[probe]["exec"]["command"]
        assert command[:2] == compose_test[:2] == ["python3", manifests.HEALTHCHECK]
        assert command[command.index("--probes") + 1] == manifests.PROBES
        assert command[command.index("--repository") + 1] == f"/repositories/{target}"


def test_grace_period_outlasts_prestop_drain_plus_triton_exit_timeout(rendered):
    _, output = rendered
    pod = _objects(output)["Deployment/triton-forge"]["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    exit_timeout = int(next(a for a in args if a.startswith("--exit-timeout-secs=")).split("=")[1])
    sleep = int(pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod["terminationGracePeriodSeconds"] >= sleep + exit_timeout


def test_server_flags_match_the_compose_service_except_ports_paths_and_k8s_additions(rendered):
    target, output = rendered
    args = _objects(output)["Deployment/triton-forge"]["spec"]["template"]["spec"]["containers"][0]["args"]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["triton"]
    flags = {a.split("=")[0] for a in args[1:]}
    compose_flags = {a.split("=")[0] for a in compose["command"][1:]}
    # --http-max-input-size included: the cpu image's 2.51 turns it into its HTTP guard
    assert compose_flags - flags == set()
    assert "--http-max-input-size=16777216" in args
    assert flags - compose_flags == {
        "--metrics-config", *(f.split("=")[0] for f in manifests.GRPC_KEEPALIVE_FLAGS)
    }


def test_admin_key_comes_from_the_secret_and_closes_the_admin_apis(rendered):
    _, output = rendered
    triton = _objects(output)["Deployment/triton-forge"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in triton["env"]}
    assert env["TRITON_ADMIN_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": manifests.ADMIN_SECRET, "key": manifests.ADMIN_SECRET_KEY}
    restricted = [a for a in triton["args"] if "restricted" in a]
    assert len(restricted) == 2 and all(a.endswith("=$(TRITON_ADMIN_KEY)") for a in restricted)


def test_hpa_and_keda_scale_on_the_same_recorded_queue_signal_and_target(rendered):
    _, output = rendered
    hpa = _objects(output)["HorizontalPodAutoscaler/triton-forge"]
    keda = yaml.safe_load((output / "keda" / "scaledobject.yaml").read_text())
    adapter = yaml.safe_load((output / "prometheus-adapter" / "rules.yaml").read_text())
    metric = hpa["spec"]["metrics"][0]["pods"]
    assert metric["metric"]["name"] == promql.QUEUE_METRIC == adapter["rules"][0]["name"]["as"]
    trigger = keda["spec"]["triggers"][0]["metadata"]
    assert trigger["threshold"] == metric["target"]["averageValue"]
    assert promql.QUEUE_RECORD in trigger["query"] and promql.QUEUE_RECORD in adapter["rules"][0]["seriesQuery"]
    assert 'namespace="' not in adapter["rules"][0]["seriesQuery"]  # server#6247


def test_rule_files_hold_the_queue_expression_written_in_the_docs(rendered):
    _, output = rendered
    rules = yaml.safe_load((output / "prometheus" / "rules.yaml").read_text())
    records = {r.get("record"): r["expr"] for g in rules["groups"] for r in g["rules"]}
    assert records[promql.QUEUE_RECORD] == promql.QUEUE_EXPR
    assert promql.QUEUE_EXPR in (ROOT / "docs" / "kubernetes.md").read_text()
    operator = _objects(output)["PrometheusRule/triton-forge"]["spec"]
    assert operator == rules


def test_a_new_spec_gets_a_new_configmap_name_so_it_rolls_out(tmp_path):
    spec = tmp_path / "repository.yaml"
    shutil.copytree(ROOT / "backends", tmp_path / "backends")
    spec.write_text(SPEC.read_text())
    render_k8s(spec, "cpu", tmp_path / "a")
    spec.write_text(SPEC.read_text().replace("max_queue_size: 64", "max_queue_size: 100", 1))
    render_k8s(spec, "cpu", tmp_path / "b")
    names = [_objects(tmp_path / x)["Deployment/triton-forge"]["spec"]["template"]["spec"]["volumes"][1]["configMap"]["name"] for x in "ab"]
    assert names[0] != names[1]


def _spec_with(tmp_path: Path, old: str, new: str) -> Path:
    text = SPEC.read_text()
    assert old in text
    spec = tmp_path / "repository.yaml"
    spec.write_text(text.replace(old, new, 1))
    shutil.copytree(ROOT / "backends", tmp_path / "backends")
    return spec


def test_instances_needing_more_cores_than_a_replica_has_name_the_model(tmp_path):
    with pytest.raises(ResourceError, match=r"model 'minilm_encoder': instances.cpu count 2 x intra_op_threads 1 = 2 cores.*1 cores"):
        render_k8s(SPEC, "cpu", tmp_path / "out", cpu=1)
    assert not (tmp_path / "out").exists()


def test_gpu_instances_on_an_index_beyond_the_replica_gpus_name_the_models(tmp_path):
    spec = _spec_with(tmp_path, "gpu: {count: 2, gpus: [0]}", "gpu: {count: 2, gpus: [1]}")
    with pytest.raises(ResourceError, match=r"models \['minilm_encoder'\]: instances.gpu.gpus use GPU \[1\].*1 GPU"):
        render_k8s(spec, "gpu", tmp_path / "out", gpus=1)
    assert not (tmp_path / "out").exists()


def test_memory_below_the_computed_need_is_refused_with_the_breakdown(tmp_path):
    with pytest.raises(ResourceError, match=r"--memory 512 MiB is below .* \d+ MiB \(tritonserver 256, minilm_encoder x2"):
        render_k8s(SPEC, "cpu", tmp_path / "out", memory_mib=512)


def test_unknown_target_is_a_usage_error_naming_the_known_targets(tmp_path):
    with pytest.raises(UserInputError, match=r"--target 'tpu': unknown target \(known: cpu, gpu\)"):
        render_k8s(SPEC, "tpu", tmp_path / "out")
    result = CliRunner().invoke(cli, ["deploy", "k8s", "--target", "tpu", "--output", str(tmp_path / "o")])
    assert result.exit_code == 2 and "tpu" in result.output


def test_output_folder_holding_other_files_is_refused_and_left_untouched(tmp_path):
    output = tmp_path / "out"
    output.mkdir()
    (output / "notes.txt").write_text("mine")
    with pytest.raises(OutputFolderError, match=r"--output .*out: holds files this command did not write \(notes.txt\)"):
        render_k8s(SPEC, "cpu", output)
    assert [p.name for p in output.iterdir()] == ["notes.txt"]


def test_a_previous_render_is_replaced_but_not_when_someone_added_a_file(tmp_path):
    output = tmp_path / "out"
    render_k8s(SPEC, "cpu", output)
    render_k8s(SPEC, "gpu", output)
    assert "nvidia.com/gpu" in (output / "manifests" / "deployment.yaml").read_text()
    (output / "manifests" / "extra.yaml").write_text("kind: ConfigMap\n")
    with pytest.raises(OutputFolderError, match="manifests/extra.yaml"):
        render_k8s(SPEC, "cpu", output)
    assert "nvidia.com/gpu" in (output / "manifests" / "deployment.yaml").read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_a_bad_spec_writes_nothing(tmp_path):
    spec = _spec_with(tmp_path, "cpu_cores: 2", "cpu_cores: 0")
    with pytest.raises(UserInputError, match="cpu_cores"):
        render_k8s(spec, "cpu", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_cli_prints_the_replica_size_and_every_file(tmp_path):
    result = CliRunner().invoke(cli, ["deploy", "k8s", "--target", "cpu", "--spec", str(SPEC), "--output", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("replica: 2 cores, ")
    assert "manifests/deployment.yaml" in result.output and MARKER not in result.output


def test_hpa_formula_asks_ceil_of_current_times_value_over_target_outside_tolerance():
    assert promql.hpa_desired_replicas(2, 100_000, 25_000) == 8
    assert promql.hpa_desired_replicas(2, 26_000, 25_000) == 2  # within 10%
    assert promql.hpa_desired_replicas(4, 0, 25_000) == 1
