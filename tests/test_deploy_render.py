"""`tools deploy k8s`: the rendered manifests against golden files, sizing rules, safe defaults
and bad input.

No cluster is needed: objects are compared as parsed YAML, errors by their message. The cpu
golden is the artifact render (copy + verify init containers, HPA), the gpu golden the plans-Job
render (KEDA): ``render_golden`` below has their exact arguments.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tools.build_repo.spec import load_spec
from tools.cli import cli
from tools.deploy import manifests, promql, sizing
from tools.deploy.render import MARKER, OutputFolderError, render_k8s
from tools.deploy.sizing import ResourceError, size_pod
from tools.errors import UserInputError

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "repository.yaml"
GOLDEN = Path(__file__).parent / "golden" / "k8s"
RECORDS = Path(__file__).parent / "data" / "artifact"
IMAGES = {"cpu": ("registry.example/triton-forge/triton-cpu:2.51", "registry.example/triton-forge/builder-cpu:2.51"),
          "gpu": ("registry.example/triton-forge/triton:25.08", "registry.example/triton-forge/builder:25.08")}
GOLDEN_ARGS = {
    "cpu": ["--artifact", str(RECORDS / "cpu.artifact.json"), "--image", IMAGES["cpu"][0],
            "--monitor-label", "release=kube-prometheus-stack"],
    "gpu": ["--plans-job", "--gpu-product", "NVIDIA-A10", "--image", IMAGES["gpu"][0],
            "--builder-image", IMAGES["gpu"][1], "--autoscaler", "keda",
            "--monitor-label", "release=kube-prometheus-stack"],
}


def render_golden(target: str, output: Path):
    """The golden render of a target, through the CLI (as the golden folder's README says)."""
    result = CliRunner().invoke(cli, ["deploy", "k8s", "--target", target, "--spec", str(SPEC),
                                      "--output", str(output), *GOLDEN_ARGS[target]])
    assert result.exit_code == 0, result.output


def artifact_render(target: str, output: Path, **kwargs):
    """An artifact render with the test record and registry images."""
    return render_k8s(SPEC, target, output, artifact=RECORDS / f"{target}.artifact.json",
                      image=IMAGES[target][0], **kwargs)


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
    render_golden(request.param, output)
    return request.param, output


def test_rendered_manifests_equal_the_golden_files_as_parsed_yaml(rendered):
    target, output = rendered
    golden = GOLDEN / target
    assert _without_spec_text(_documents(output)) == _without_spec_text(_documents(golden)), (
        f"re-render the golden files after checking the diff: tools deploy k8s --target {target} "
        f"--output {golden.relative_to(ROOT)} {' '.join(GOLDEN_ARGS[target])}"
    )


def test_every_container_has_requests_equal_to_limits_so_the_pod_is_guaranteed(rendered):
    target, output = rendered
    pod = _objects(output)["Deployment/triton-forge"]["spec"]["template"]["spec"]
    for container in pod["initContainers"] + pod["containers"]:
        resources = container["resources"]
        assert resources["requests"] == resources["limits"], container["name"]
        assert {"cpu", "memory"} <= set(resources["limits"])
    # the GPU goes to tritonserver; copying and verifying the artifact needs none
    assert ("nvidia.com/gpu" in pod["containers"][0]["resources"]["limits"]) == (target == "gpu")
    assert not any("nvidia.com/gpu" in c["resources"]["limits"] for c in pod["initContainers"])


def test_memory_limit_covers_the_shm_emptydir_and_the_sized_instances(rendered):
    target, output = rendered
    pod = _objects(output)["Deployment/triton-forge"]["spec"]["template"]["spec"]
    built = None
    if target == "cpu":  # the artifact render sizes from the record's weights
        built = json.loads((RECORDS / "cpu.artifact.json").read_text())["weights_bytes"]
    sizing = size_pod(load_spec(SPEC), target, built_weights=built)
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")["emptyDir"]
    assert shm == {"medium": "Memory", "sizeLimit": f"{sizing.shm_mib}Mi"}
    limit = pod["containers"][0]["resources"]["limits"]["memory"]
    assert limit == f"{sizing.memory_mib}Mi"
    assert sizing.memory_mib >= sum(mib for _, mib in sizing.breakdown)


def test_probes_tell_busy_from_dead_liveness_without_inference_startup_on_readiness(rendered):
    target, output = rendered
    triton = _objects(output)["Deployment/triton-forge"]["spec"]["template"]["spec"]["containers"][0]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    compose_test = compose["services"]["triton"]["healthcheck"]["test"][1:]
    startup, readiness, liveness = (triton[p] for p in ("startupProbe", "readinessProbe", "livenessProbe"))
    assert startup["exec"] == readiness["exec"]
    command = readiness["exec"]["command"]
    assert command[:2] == compose_test[:2] == ["python3", manifests.HEALTHCHECK]
    assert command[command.index("--mode") + 1] == "readiness"
    assert command[command.index("--probes") + 1] == manifests.PROBES
    assert command[command.index("--repository") + 1] == f"/repositories/{target}"
    assert command[command.index("--status-url") + 1] == manifests.STATUS_URL
    live = liveness["exec"]["command"]
    assert live[live.index("--mode") + 1] == "liveness" and "--probes" not in live
    assert live[live.index("--status-url") + 1] == manifests.STATUS_URL
    for probe in (startup, readiness, liveness):  # the command's own timeouts end first
        cmd = probe["exec"]["command"]
        assert 2 * float(cmd[cmd.index("--timeout") + 1]) < probe["timeoutSeconds"]
    ports = {p["name"]: p["containerPort"] for p in triton["ports"]}
    assert ports[manifests.STATUS_PORT_NAME] == 8003


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
    # --http-max-input-size included: the front bounds bodies first, and the cpu image's 2.51
    # wrapper drops the flag it lacks
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


def test_hpa_and_keda_scale_on_the_same_recorded_queue_signal_and_target(tmp_path):
    artifact_render("cpu", tmp_path / "hpa")
    artifact_render("cpu", tmp_path / "keda", autoscaler="keda")
    hpa = _objects(tmp_path / "hpa")["HorizontalPodAutoscaler/triton-forge"]
    keda = _objects(tmp_path / "keda")["ScaledObject/triton-forge"]
    adapter = yaml.safe_load((tmp_path / "hpa" / "prometheus-adapter" / "rules.yaml").read_text())
    metric = hpa["spec"]["metrics"][0]["pods"]
    assert metric["metric"]["name"] == promql.QUEUE_METRIC == adapter["rules"][0]["name"]["as"]
    trigger = keda["spec"]["triggers"][0]["metadata"]
    assert trigger["threshold"] == metric["target"]["averageValue"]
    assert promql.QUEUE_RECORD in trigger["query"] and promql.QUEUE_RECORD in adapter["rules"][0]["seriesQuery"]
    assert 'namespace="' not in adapter["rules"][0]["seriesQuery"]  # server#6247


def test_rule_files_hold_the_queue_expression_written_in_the_docs(rendered):
    target, output = rendered
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
    render_k8s(spec, "cpu", tmp_path / "a", dev_build=True)
    spec.write_text(SPEC.read_text().replace("max_queue_size: 64", "max_queue_size: 100", 1))
    render_k8s(spec, "cpu", tmp_path / "b", dev_build=True)
    names = [next(v["configMap"]["name"] for v in _objects(tmp_path / x)["Deployment/triton-forge"]["spec"]["template"]["spec"]["volumes"] if "configMap" in v) for x in "ab"]
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
        artifact_render("cpu", tmp_path / "out", cpu=1)
    assert not (tmp_path / "out").exists()


def test_gpu_instances_on_an_index_beyond_the_replica_gpus_name_the_models(tmp_path):
    spec = _spec_with(tmp_path, "gpu: {count: 2, gpus: [0]}", "gpu: {count: 2, gpus: [1]}")
    with pytest.raises(ResourceError, match=r"models \['minilm_encoder'\]: instances.gpu.gpus use GPU \[1\].*1 GPU"):
        render_k8s(spec, "gpu", tmp_path / "out", gpus=1, dev_build=True)
    assert not (tmp_path / "out").exists()


def test_memory_below_the_computed_need_is_refused_with_the_breakdown(tmp_path):
    with pytest.raises(ResourceError, match=r"--memory 512 MiB is below .* \d+ MiB \(tritonserver 256, minilm_encoder x2"):
        artifact_render("cpu", tmp_path / "out", memory_mib=512)


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
        artifact_render("cpu", output)
    assert [p.name for p in output.iterdir()] == ["notes.txt"]


def test_a_previous_render_is_replaced_but_not_when_someone_added_a_file(tmp_path):
    output = tmp_path / "out"
    artifact_render("cpu", output)
    artifact_render("gpu", output)
    assert "nvidia.com/gpu" in (output / "manifests" / "deployment.yaml").read_text()
    (output / "manifests" / "extra.yaml").write_text("kind: ConfigMap\n")
    with pytest.raises(OutputFolderError, match="manifests/extra.yaml"):
        artifact_render("cpu", output)
    assert "nvidia.com/gpu" in (output / "manifests" / "deployment.yaml").read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_a_bad_spec_writes_nothing(tmp_path):
    spec = _spec_with(tmp_path, "cpu_cores: 2", "cpu_cores: 0")
    with pytest.raises(UserInputError, match="cpu_cores"):
        render_k8s(spec, "cpu", tmp_path / "out", dev_build=True)
    assert not (tmp_path / "out").exists()


def test_cli_prints_the_replica_size_and_every_file(tmp_path):
    result = CliRunner().invoke(cli, ["deploy", "k8s", "--target", "cpu", "--spec", str(SPEC), "--output", str(tmp_path / "o"), *GOLDEN_ARGS["cpu"]])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("replica: 2 cores, ")
    assert "manifests/deployment.yaml" in result.output and MARKER not in result.output


def test_hpa_formula_asks_ceil_of_current_times_value_over_target_outside_tolerance():
    assert promql.hpa_desired_replicas(2, 100_000, 25_000) == 8
    assert promql.hpa_desired_replicas(2, 26_000, 25_000) == 2  # within 10%
    assert promql.hpa_desired_replicas(4, 0, 25_000) == 1


# ------------------------------------------------------------------ where the repository comes from


def _pod(folder: Path) -> dict:
    return _objects(folder)["Deployment/triton-forge"]["spec"]["template"]["spec"]


def test_the_artifact_render_copies_and_verifies_the_artifact_by_digest_and_builds_nothing(tmp_path):
    record = json.loads((RECORDS / "cpu.artifact.json").read_text())
    artifact_render("cpu", tmp_path / "out")
    pod = _pod(tmp_path / "out")
    fetch, verify = pod["initContainers"]
    assert fetch["image"] == record["reference"] and "@sha256:" in fetch["image"]
    assert fetch["command"] == ["/bin/busybox", "cp", "-R", "/repository", "/repositories/cpu"]
    assert verify["image"] == IMAGES["cpu"][0]
    assert verify["command"][:2] == ["python3", manifests.VERIFY]
    assert verify["command"][verify["command"].index("--manifest-sha256") + 1] == record["manifest_sha256"]
    assert not any("build-repo" in " ".join(c.get("command", [])) for c in pod["initContainers"])
    assert "manifests/configmap-spec.yaml" not in _documents(tmp_path / "out")
    assert {v["name"] for v in pod["volumes"]} == {"repositories", "dshm", "tmp"}


def test_an_image_volume_is_rendered_for_kubernetes_1_33_and_refused_before(tmp_path):
    artifact_render("cpu", tmp_path / "out", image_volume=True, k8s_version="1.33")
    pod = _pod(tmp_path / "out")
    volume = next(v for v in pod["volumes"] if v["name"] == "repositories")
    assert volume["image"]["reference"].endswith(json.loads((RECORDS / "cpu.artifact.json").read_text())["digest"])
    assert [c["name"] for c in pod["initContainers"]] == ["verify-repository"]
    assert pod["containers"][0]["env"][1] == {"name": "MODEL_REPOSITORY", "value": "/artifact/repository"}
    with pytest.raises(UserInputError, match=r"--image-volume: Kubernetes 1.31 has no image volumes"):
        artifact_render("cpu", tmp_path / "old", image_volume=True, k8s_version="1.31")


def test_an_image_is_required_outside_the_dev_build(tmp_path):
    with pytest.raises(UserInputError, match=r"--image is required.*only --dev-build falls back to the local triton-forge/triton-cpu:local"):
        render_k8s(SPEC, "cpu", tmp_path / "out", artifact=RECORDS / "cpu.artifact.json")
    result = CliRunner().invoke(cli, ["deploy", "k8s", "--target", "cpu", "--output", str(tmp_path / "o"),
                                      "--artifact", str(RECORDS / "cpu.artifact.json")])
    assert result.exit_code == 2 and "--image is required" in result.output
    assert not (tmp_path / "out").exists() and not (tmp_path / "o").exists()


def test_exactly_one_repository_source_is_given(tmp_path):
    with pytest.raises(UserInputError, match=r"give exactly one of --artifact .*not none"):
        render_k8s(SPEC, "cpu", tmp_path / "out", image="x/y:1")
    with pytest.raises(UserInputError, match=r"not --artifact and --dev-build"):
        render_k8s(SPEC, "cpu", tmp_path / "out", image="x/y:1", dev_build=True,
                   artifact=RECORDS / "cpu.artifact.json")


def test_an_artifact_record_without_a_digest_or_for_another_target_is_refused(tmp_path):
    record = json.loads((RECORDS / "cpu.artifact.json").read_text())
    (tmp_path / "tag-only.json").write_text(json.dumps({**record, "digest": ""}))
    with pytest.raises(UserInputError, match=r"field 'digest' '' is not sha256:<64 hex>"):
        render_k8s(SPEC, "cpu", tmp_path / "a", image="x/y:1", artifact=tmp_path / "tag-only.json")
    with pytest.raises(UserInputError, match=r"built for target 'cpu', not --target 'gpu'"):
        render_k8s(SPEC, "gpu", tmp_path / "b", image="x/y:1", artifact=RECORDS / "cpu.artifact.json")


def test_memory_is_sized_from_the_artifacts_real_weights(tmp_path):
    record = json.loads((RECORDS / "cpu.artifact.json").read_text())
    record["weights_bytes"]["minilm_encoder"] = 2 * 1024**3  # a 2 GiB encoder
    (tmp_path / "big.json").write_text(json.dumps(record))
    small = artifact_render("cpu", tmp_path / "small").resources
    big = render_k8s(SPEC, "cpu", tmp_path / "big", image="x/y:1", artifact=tmp_path / "big.json").resources
    encoder = lambda r: dict(r.breakdown)["minilm_encoder x2"]  # noqa: E731
    # two instances of a Python-backend runner: stub + weights held twice + activations
    assert encoder(small) == 2 * (sizing.STUB_MIB + 2 * 87 + sizing.ACTIVATION_MIB)  # 86.2 MiB -> 87
    assert encoder(big) == 2 * (sizing.STUB_MIB + 2 * 2048 + sizing.ACTIVATION_MIB)
    assert big.memory_mib - small.memory_mib >= 2 * 2 * (2048 - 87)


def test_the_plans_job_builds_once_per_gpu_product_and_pods_only_read_its_claim(tmp_path):
    render_golden("gpu", tmp_path / "out")
    objects = {f"{d['kind']}/{d['metadata']['name']}": d
               for d in yaml.safe_load_all((tmp_path / "out" / "jobs" / "plans.yaml").read_text())}
    (claim_key,) = [k for k in objects if k.startswith("PersistentVolumeClaim/")]
    job = next(v for k, v in objects.items() if k.startswith("Job/"))
    claim = claim_key.split("/")[1]
    assert "nvidia-a10" in claim
    job_pod = job["spec"]["template"]["spec"]
    assert job_pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A10"}
    assert job_pod["containers"][0]["command"][:2] == ["tools", "build-repo"]
    pod = _pod(tmp_path / "out")
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A10"}
    assert [c["name"] for c in pod["initContainers"]] == ["verify-repository"]
    volume = next(v for v in pod["volumes"] if v["name"] == "repositories")
    assert volume["persistentVolumeClaim"] == {"claimName": claim, "readOnly": True}
    render_k8s(SPEC, "gpu", tmp_path / "other", plans_job=True, gpu_product="NVIDIA-L4",
               image="x/t:1", builder_image="x/b:1")
    other = next(d for d in yaml.safe_load_all((tmp_path / "other" / "jobs" / "plans.yaml").read_text())
                 if d["kind"] == "Job")
    assert other["metadata"]["name"] != claim  # another GPU product, another build


def test_the_dev_build_refuses_a_spec_whose_files_the_builder_image_lacks(tmp_path):
    spec = tmp_path / "repository.yaml"
    shutil.copytree(ROOT / "backends", tmp_path / "backends")
    onnx = tmp_path / "models" / "mine.onnx"
    data = yaml.safe_load(SPEC.read_text())
    model, entry = next((n, m) for n, m in data["python_models"].items() if m.get("files"))
    name = next(iter(entry["files"]))
    onnx.parent.mkdir()
    onnx.write_text("a file only this machine has")
    entry["files"][name] = "models/mine.onnx"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(UserInputError, match=rf"--dev-build: the pod's builder would not find .*model '{model}' field files.{re.escape(name)}: {onnx}"):
        render_k8s(spec, "cpu", tmp_path / "out", dev_build=True)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ safe defaults


def test_a_network_policy_admits_labelled_clients_the_gateway_and_the_monitoring_namespace_only(tmp_path):
    artifact_render("cpu", tmp_path / "out", monitoring_namespace="observability")
    objects = _objects(tmp_path / "out")
    policy = objects["NetworkPolicy/triton-forge"]["spec"]
    clients, gateway, monitoring = policy["ingress"]
    assert policy["policyTypes"] == ["Ingress"]
    assert clients["from"] == [{"namespaceSelector": {}, "podSelector": {"matchLabels": manifests.CLIENT_LABEL}}]
    assert {p["port"] for p in clients["ports"]} == {8000, 8001}
    # the gateway's pods, in this namespace, over HTTP alone (the API calls through the front)
    api_pods = objects[f"Deployment/{manifests.API_NAME}"]["spec"]["template"]["metadata"]["labels"]
    (api_selector,) = gateway["from"]
    assert set(api_selector) == {"podSelector"}
    assert api_selector["podSelector"]["matchLabels"].items() <= api_pods.items()
    assert [p["port"] for p in gateway["ports"]] == [8000]
    assert monitoring["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}}]
    assert {p["port"] for p in monitoring["ports"]} == {8002, 8003}


def test_monitor_labels_reach_the_podmonitor_and_rules_which_the_operator_selects_by(rendered):
    _, output = rendered
    objects = _objects(output)
    for kind in ("PodMonitor", "PrometheusRule"):
        assert objects[f"{kind}/triton-forge"]["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    monitor = objects["PodMonitor/triton-forge"]["spec"]
    assert monitor["jobLabel"] == "app.kubernetes.io/name"  # job="triton-forge", as the alerts select
    assert [e["port"] for e in monitor["podMetricsEndpoints"]] == ["metrics", "forge-metrics"]
    with pytest.raises(UserInputError, match=r"--monitor-label 'release': give KEY=VALUE"):
        render_k8s(SPEC, "cpu", output.parent / "bad", image="x/y:1", dev_build=True, monitor_labels=["release"])


def test_one_autoscaler_per_render(tmp_path):
    artifact_render("cpu", tmp_path / "hpa")
    artifact_render("cpu", tmp_path / "keda", autoscaler="keda")
    hpa, keda = _documents(tmp_path / "hpa"), _documents(tmp_path / "keda")
    assert "manifests/hpa.yaml" in hpa and "manifests/scaledobject.yaml" not in hpa
    assert "manifests/scaledobject.yaml" in keda and "manifests/hpa.yaml" not in keda
    assert "prometheus-adapter/rules.yaml" not in keda


def test_keda_fails_closed_a_missing_series_is_an_error_and_falls_back(tmp_path):
    artifact_render("cpu", tmp_path / "keda", autoscaler="keda", max_replicas=6)
    keda = _objects(tmp_path / "keda")["ScaledObject/triton-forge"]["spec"]
    trigger = keda["triggers"][0]["metadata"]
    assert "vector(0)" not in trigger["query"] and trigger["ignoreNullValues"] == "false"
    assert keda["fallback"] == {"failureThreshold": 3, "replicas": 6, "behavior": "currentReplicasIfHigher"}


def test_gpu_rollouts_replace_in_place_with_a_longer_deadline_and_cpu_ones_surge(tmp_path):
    artifact_render("cpu", tmp_path / "cpu")
    artifact_render("gpu", tmp_path / "gpu")
    cpu = _objects(tmp_path / "cpu")["Deployment/triton-forge"]["spec"]
    gpu = _objects(tmp_path / "gpu")["Deployment/triton-forge"]["spec"]
    assert gpu["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert cpu["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert gpu["progressDeadlineSeconds"] > cpu["progressDeadlineSeconds"] > 600  # 600: the default


def test_tini_is_pid_1_of_the_serving_container(rendered):
    _, output = rendered
    command = _pod(output)["containers"][0]["command"]
    assert command[:3] == ["/usr/bin/tini", "-g", "--"] and command[-1].endswith("triton-entrypoint.sh")


def test_the_docs_state_what_the_render_writes(tmp_path):
    """docs/kubernetes.md's model control mode, /dev/shm sizes and ports are the rendered ones."""
    docs = (ROOT / "docs" / "kubernetes.md").read_text()
    shm = {}
    for target in ("cpu", "gpu"):
        artifact_render(target, tmp_path / target)
        pod = _pod(tmp_path / target)
        args = pod["containers"][0]["args"]
        (mode,) = [a.split("=", 1)[1] for a in args if a.startswith("--model-control-mode=")]
        assert f"--model-control-mode={mode}" in docs
        shm[target] = next(v for v in pod["volumes"] if v["name"] == "dshm")["emptyDir"]["sizeLimit"].removesuffix("Mi")
        for port in (p for container in pod["containers"] for p in container["ports"]):
            assert f"`{port['name']}` {port['containerPort']}" in docs, port
    assert f"cpu {shm['cpu']} MiB, gpu {shm['gpu']} MiB" in docs
    assert "Model control stays `none`" not in docs


# ------------------------------------------------------------------ capacity from measurement


def _tune_results(folder: Path, **extra) -> Path:
    folder.mkdir(parents=True)
    data = {"scenario": "text_embedding", "target": {"p99_ms": 600, "max_error_ratio": 0},
            "trials": [], "best": {"throughput": 40.0, "p99_ms": 410.0, "concurrency": 8}, **extra}
    (folder / "results.json").write_text(json.dumps(data))
    return folder


def test_from_tune_sets_the_per_pod_target_and_bounds_and_writes_the_arithmetic(tmp_path):
    tune = _tune_results(tmp_path / "reports" / "tune" / "text_embedding")
    artifact_render("cpu", tmp_path / "out", from_tune=tune, peak_rps=200)
    hpa = _objects(tmp_path / "out")["HorizontalPodAutoscaler/triton-forge"]["spec"]
    rate = next(m for m in hpa["metrics"] if m["pods"]["metric"]["name"] == promql.RATE_METRIC)
    assert rate["pods"]["target"]["averageValue"] == "28000m"  # 40 req/s x 0.7
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 9)  # ceil(200 / 28) = 8, + 1
    rules = yaml.safe_load((tmp_path / "out" / "prometheus" / "rules.yaml").read_text())
    records = {r.get("record"): r["expr"] for g in rules["groups"] for r in g["rules"]}
    assert records[promql.RATE_RECORD] == promql.rate_expr("text_embedding")
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "40 x headroom 0.7 = 28.00 req/s" in readme and "Peak 200 req/s / 28.00 = 7.14 -> 8 pods" in readme


def test_from_tune_prefers_the_smallest_confirmed_throughput(tmp_path):
    tune = _tune_results(tmp_path / "t", confirmation={"winner": {"throughputs": [38.0, 35.0, 41.0]}})
    artifact_render("cpu", tmp_path / "out", from_tune=tune, peak_rps=100, autoscaler="keda")
    keda = _objects(tmp_path / "out")["ScaledObject/triton-forge"]["spec"]
    assert keda["triggers"][1]["metadata"]["threshold"] == "24.5"  # 35 x 0.7
    assert "min of 3 confirmation runs" in (tmp_path / "out" / "README.md").read_text()


def test_from_tune_without_a_winner_names_the_field(tmp_path):
    tune = _tune_results(tmp_path / "t", best=None)
    with pytest.raises(UserInputError, match=r"field 'best' is null: no trial met the P99 target"):
        artifact_render("cpu", tmp_path / "out", from_tune=tune)
    with pytest.raises(UserInputError, match=r"no results.json"):
        artifact_render("cpu", tmp_path / "out", from_tune=tmp_path / "nowhere")
