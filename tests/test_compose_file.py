"""docker-compose.yml is valid Compose and keeps the project's serving invariants.

No Docker engine runs here: the files are checked against the Compose Specification schema
(tests/data/compose-spec.json), by `docker compose config` where the plugin exists, and by rule.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
GPU_OVERRIDE = ROOT / "docker-compose.gpu.yml"
DOCKERFILE = ROOT / "docker" / "triton.Dockerfile"
SCHEMA = ROOT / "tests" / "data" / "compose-spec.json"
ADMIN_GROUPS = {"model-repository", "logging", "trace", "shared-memory"}
MIN_RELEASE = (25, 7)  # first NGC release with the 2025 Python-backend and HTTP CVE fixes


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def compose() -> dict:
    return _load(COMPOSE)


@pytest.fixture(scope="module")
def triton(compose) -> dict:
    return compose["services"]["triton"]


@pytest.fixture(scope="module")
def front(compose) -> dict:
    return compose["services"]["front"]


def _flag(command: list[str], name: str) -> list[str]:
    """Values of every ``--name=value`` in a command."""
    return [arg.split("=", 1)[1] for arg in command if arg.startswith(f"{name}=")]


def _default(value: str) -> str:
    """The default of a ``${VAR:-default}`` Compose interpolation (the text itself otherwise)."""
    match = re.fullmatch(r"\$\{\w+:-(.+)\}", value)
    return match.group(1) if match else value


def _bytes(size: str | int) -> int:
    if isinstance(size, int):
        return size
    number, unit = re.fullmatch(r"(\d+)\s*([kmg]?)b?", size.lower()).groups()
    return int(number) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[unit]


def _interpolate(value, env: dict[str, str]):
    """Compose's ``${VAR:-default}`` / ``${VAR:?message}`` / ``${VAR}`` substitution, recursively."""
    if isinstance(value, dict):
        return {k: _interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3)
        if op == ":-":
            return env.get(name) or arg
        if op == ":?" and not env.get(name):
            raise KeyError(f"{name}: {arg}")
        return env.get(name, "")

    return re.sub(r"\$\{(\w+)(?:(:-|:\?)([^}]*))?\}", one, value)


def _merge_service(base: dict, override: dict) -> dict:
    """Compose's merge rules for one service: mappings merge, ``command`` is replaced, and
    ``volumes`` are unique by ``target`` (docs.docker.com/reference/compose-file/merge)."""
    merged = dict(base)
    for key, value in override.items():
        if key == "volumes":
            by_target = {v["target"]: v for v in base.get("volumes", [])}
            merged[key] = list((by_target | {v["target"]: v for v in value}).values())
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            merged[key] = _merge_service(base[key], value)
        else:
            merged[key] = value
    return merged


def _services(files: list[Path], env: dict[str, str] | None = None) -> dict[str, dict]:
    """The services of ``docker compose -f ... -f ...`` with ``env`` set, as Compose merges them."""
    env = {"TRITON_ADMIN_KEY": "test-key"} | (env or {})
    services: dict[str, dict] = {}
    for path in files:
        for name, service in _load(path)["services"].items():
            services[name] = _merge_service(services.get(name, {}), service)
    return _interpolate(services, env)


# The host folders triton may serve, for each way the docs run the stack.
CONFIGURATIONS = {
    "cpu host": ([COMPOSE], {}, "cpu"),
    "cpu host, BUILD_TARGET=gpu": ([COMPOSE], {"BUILD_TARGET": "gpu"}, "gpu"),
    "gpu host": ([COMPOSE, GPU_OVERRIDE], {}, "gpu"),
    "gpu host, BUILD_TARGET=cpu left set": ([COMPOSE, GPU_OVERRIDE], {"BUILD_TARGET": "cpu"}, "gpu"),
}


def _models_mount(service: dict, target: str = "/models") -> dict:
    (mount,) = [v for v in service["volumes"] if v["target"] == target]
    return mount


def _host_path(service: dict, container_path: str) -> PurePosixPath:
    """The host path (relative to the compose file) behind a container path of a service."""
    path = PurePosixPath(container_path)
    for mount in sorted(service.get("volumes", []), key=lambda v: -len(v["target"])):
        target = PurePosixPath(mount["target"])
        if mount["type"] == "bind" and (path == target or target in path.parents):
            return PurePosixPath(mount["source"]) / path.relative_to(target)
    raise AssertionError(f"{container_path} is on no bind mount of the service")


def _output(builder: dict) -> str:
    return builder["command"][builder["command"].index("--repository") + 1]


# --- validity ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [COMPOSE, GPU_OVERRIDE], ids=lambda p: p.name)
def test_compose_file_validates_against_the_compose_specification(path):
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))

    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(_load(path)), key=str)

    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_schema_rejects_a_misspelt_service_field(compose):
    """The schema check can fail: a field Compose does not know is an error."""
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    broken = json.loads(json.dumps(compose))
    broken["services"]["triton"]["shm-size"] = "1gb"

    assert not jsonschema.Draft7Validator(schema).is_valid(broken)


def _docker_compose() -> list[str] | None:
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) is None:
            continue
        probe = subprocess.run([*cmd, "version"], capture_output=True, text=True, timeout=60,
                               check=False)
        if probe.returncode == 0:
            return cmd
    return None


@pytest.mark.parametrize("files", [[COMPOSE], [COMPOSE, GPU_OVERRIDE]],
                         ids=["base", "with-gpu-override"])
def test_docker_compose_config_accepts_the_files(files):
    cmd = _docker_compose()
    if cmd is None:
        pytest.skip("no `docker compose` plugin (or docker-compose) on this machine; "
                    "the schema test covers validity")
    env = os.environ | {"TRITON_ADMIN_KEY": "test-key"}
    args = [arg for f in files for arg in ("-f", str(f))]

    result = subprocess.run([*cmd, *args, "--profile", "load", "config", "--quiet"], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=120, check=False)

    assert result.returncode == 0, result.stderr


# --- the image --------------------------------------------------------------------------------


def pinned_base(image: str) -> re.Match | None:
    """``nvcr.io/nvidia/tritonserver:YY.MM-py3@sha256:<64 hex>``: a tag and its digest."""
    return re.fullmatch(r"nvcr\.io/nvidia/tritonserver:(\d\d)\.(\d\d)-py3@sha256:[0-9a-f]{64}", image)


def test_an_unpinned_base_is_refused_by_the_check():
    assert pinned_base("nvcr.io/nvidia/tritonserver:25.08-py3") is None  # a tag moves
    assert pinned_base("nvcr.io/nvidia/tritonserver:latest@sha256:" + "a" * 64) is None
    assert pinned_base("nvcr.io/nvidia/tritonserver:25.08-py3@sha256:" + "a" * 64)


def test_triton_image_is_pinned_once_by_digest_to_25_07_or_later(compose):
    image = _default(compose["x-triton-image"])
    match = pinned_base(image)

    assert match, f"{image} is not nvcr.io/nvidia/tritonserver:YY.MM-py3@sha256:<digest>"
    assert (int(match.group(1)), int(match.group(2))) >= MIN_RELEASE
    # The Dockerfile's default names the same digest (tests/test_deploy_locks.py); no other tag.
    assert len(re.findall(r"tritonserver:\d", COMPOSE.read_text())) == 1
    tag = image.split("@")[0].split("/")[-1]
    assert re.findall(r"tritonserver:[\w.-]+", DOCKERFILE.read_text()) == [tag]


def test_builder_and_triton_are_built_from_the_same_pinned_image(compose):
    services = compose["services"]
    builder, triton = services["builder"]["build"], services["triton"]["build"]

    assert builder["args"]["TRITON_IMAGE"] == triton["args"]["TRITON_IMAGE"] == compose[
        "x-triton-image"]
    assert builder["dockerfile"] == triton["dockerfile"] == "docker/triton.Dockerfile"
    assert (builder["target"], triton["target"]) == ("builder", "serve")
    dockerfile = DOCKERFILE.read_text()
    # The Dockerfile's default is the compose file's pin by digest (tests/test_deploy_locks.py).
    assert re.search(r"^ARG TRITON_IMAGE=nvcr\.io/nvidia/tritonserver@sha256:", dockerfile, re.MULTILINE)
    assert re.search(r"^FROM \$\{TRITON_IMAGE\} AS serve$", dockerfile, re.MULTILINE)
    assert re.search(r"^FROM serve AS builder$", dockerfile, re.MULTILINE)


def _sent(source: str, allowed: list[str]) -> bool:
    """Whether a COPY source is let through by the ``!path`` lines of a .dockerignore."""
    return any(source.rstrip("*") == a.rstrip("/") or source.startswith(a.rstrip("/") + "/")
               for a in allowed)


def test_dockerfile_copies_only_files_that_exist():
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    sources = []
    for line in re.findall(r"^COPY (.+)$", text, re.MULTILINE):
        parts = line.split()
        sources += [p for p in parts[:-1] if not p.startswith("--")]
    optional = [s for s in sources if "*" in s]
    missing = [s for s in sources if s not in optional and not (ROOT / s).exists()]
    ignore = (DOCKERFILE.parent / f"{DOCKERFILE.name}.dockerignore").read_text().splitlines()
    sent = [line[1:] for line in ignore if line.startswith("!")]
    unsent = [s for s in sources if not _sent(s, sent)]

    assert sources and not missing
    assert not unsent, f"excluded from the build context by the .dockerignore: {unsent}"



def _imports(path: Path) -> set[str]:
    """Every module an ``import`` or absolute ``from ... import`` of a file names (functions'
    own imports included), with each ``from`` name also read as a submodule."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def _gateway_modules() -> tuple[set[Path], set[str]]:
    """The project's files ``python3 -m tools.api`` imports, and the third-party packages."""
    files, packages, todo, seen = set(), set(), ["tools.api.__main__"], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        base = ROOT / Path(*name.split("."))
        path = base / "__init__.py" if (base / "__init__.py").is_file() else base.with_suffix(".py")
        if not path.is_file():
            continue  # a name imported from a module, not a module
        files.add(path.relative_to(ROOT))
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        for imported in _imports(path):
            top = imported.split(".")[0]
            if top == "tools":
                todo.append(imported)
            elif top not in sys.stdlib_module_names:
                packages.add(top)
    return files, packages


def test_the_serving_image_holds_the_gateway_it_runs_with_every_module_and_package():
    """The compose `api` service and the Kubernetes gateway run `python3 -m tools.api` from the
    serving image: its serve stage copies every project file that imports, and its lock holds
    every package (the pipelines' own tokenizer code comes with the repository)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import lock_requirements

    files, packages = _gateway_modules()
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    serve = text[text.index(" AS serve"):text.index(" AS builder")]
    sources = [PurePosixPath(s) for line in re.findall(r"^COPY (.+)$", serve, re.MULTILINE)
               for s in line.split()[:-1] if not s.startswith("--") and s.startswith("tools")]
    missing = [f for f in files if not any(PurePosixPath(f) == s or s in PurePosixPath(f).parents
                                            for s in sources)]
    locked = set(lock_requirements.entries((ROOT / "docker" / "requirements-serve.lock").read_text()))

    assert PurePosixPath("tools/api/app.py") in {PurePosixPath(f) for f in files}
    assert missing == [], f"the serve stage of {DOCKERFILE.name} does not copy {missing}"
    assert {"starlette", "uvicorn", "orjson", "tritonclient"} <= packages
    assert packages - locked == set(), "packages the gateway imports that the serving lock lacks"

# --- triton -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CONFIGURATIONS))
def test_triton_mounts_the_built_repository_of_its_target_read_only(name):
    files, env, target = CONFIGURATIONS[name]
    triton = _services(files, env)["triton"]

    assert _models_mount(triton) == {"type": "bind",
                                     "source": f"./build/model_repositories/{target}",
                                     "target": "/models", "read_only": True}
    assert "--model-repository=/models" in triton["command"]


@pytest.mark.parametrize("name", sorted(CONFIGURATIONS))
def test_builder_writes_the_repository_that_triton_reads(name):
    files, env, target = CONFIGURATIONS[name]
    services = _services(files, env)
    builder, triton = services["builder"], services["triton"]
    command = builder["command"]

    assert command[:2] == ["tools", "build-repo"]
    assert command[command.index("--target") + 1] == target
    written = _host_path(builder, _output(builder))
    assert written == PurePosixPath(_models_mount(triton)["source"])
    assert written.name == target, f"{written}: one folder per target, so targets never mix"
    writable = [v for v in builder["volumes"] if v["type"] == "bind"
                and PurePosixPath(_output(builder)).is_relative_to(v["target"])]
    assert writable and not any(v.get("read_only") for v in writable)


@pytest.mark.parametrize("name", sorted(CONFIGURATIONS))
def test_builder_stages_on_the_mount_it_writes_the_repository_to(name):
    """A build stages beside the repository and rename()s each model in: across two mounts that
    fails with EXDEV, so the output's parent must be on the same bind mount as the output."""
    from tools.build_repo.repository import _sibling

    files, env, _ = CONFIGURATIONS[name]
    builder = _services(files, env)["builder"]
    output = PurePosixPath(_output(builder))
    staging = PurePosixPath(_sibling(Path(output), "build", "x").as_posix())
    (mount,) = [v for v in builder["volumes"] if output.is_relative_to(v["target"])]

    assert output != PurePosixPath(mount["target"]), f"{output} is itself the mount point"
    assert staging.is_relative_to(mount["target"]), f"{staging} is not on {mount['source']}"


@pytest.mark.parametrize("files", [[COMPOSE], [COMPOSE, GPU_OVERRIDE]],
                         ids=["base", "with-gpu-override"])
def test_no_service_mounts_the_committed_model_repository(files):
    """./model_repository holds the committed cpu configs that `build-repo --check` compares."""
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    for name, service in _services(files).items():
        for mount in service.get("volumes", []):
            source = PurePosixPath(mount["source"])
            assert "model_repository" not in source.parts, f"{name} mounts {source}"
            if "model_repositories" in source.parts:
                assert source.parts[0] == "build" and "/build/" in ignored, (
                    f"{name}: {source} is not under the git-ignored ./build")


def test_triton_shared_memory_is_sized_for_the_python_backend(triton):
    shm = _bytes(triton["shm_size"])
    growth = [int(v.split("=")[1]) for v in _flag(triton["command"], "--backend-config")
              if v.startswith("python,shm-")]

    assert shm >= 256 << 20, "Docker's 64 MiB /dev/shm starves Python-backend models"
    assert growth and max(growth) * 8 <= shm, "room for eight Python instances' regions"


def test_model_control_loads_every_model_at_start_never_polls_and_configs_are_strict(triton):
    # Explicit control lets the watchdog reload a model whose stub died (with the admin key).
    command = triton["command"]

    assert _flag(command, "--model-control-mode") == ["explicit"]
    assert _flag(command, "--load-model") == ["*"]
    assert not any(a.startswith("--repository-poll-secs") for a in command)
    assert ("--disable-auto-complete-config" in command
            or _flag(command, "--strict-model-config") == ["true"])


@pytest.mark.parametrize("flag", ["--http-restricted-api", "--grpc-restricted-protocol"])
def test_admin_api_groups_are_restricted_with_an_operator_key(triton, flag):
    (value,) = _flag(triton["command"], flag)
    groups, _, key = value.partition(":")

    assert set(groups.split(",")) >= ADMIN_GROUPS
    assert "inference" not in groups.split(",")
    header, _, secret = key.partition("=")
    assert header == "admin-key"
    assert re.fullmatch(r"\$\{TRITON_ADMIN_KEY:\?.+\}", secret), "the operator must set the key"


def test_http_input_size_is_bounded_below_tritons_default(triton):
    (size,) = _flag(triton["command"], "--http-max-input-size")

    assert 0 < int(size) < 64 << 20


def test_triton_publishes_the_fronts_ports_metrics_and_the_supervisors_status_port(triton):
    published = {p.rsplit(":", 1)[-1]: p for p in triton["ports"]}

    assert set(published) == {"8000", "8001", "8002", "8003"}
    assert triton["environment"]["FORGE_METRICS_PORT"] == "8003"
    assert all(p.startswith("${TRITON_BIND_IP:-127.0.0.1}:") for p in published.values())
    # 8000/8001 are the front's (it shares this namespace); tritonserver is on loopback alone
    # behind it, its metrics on every interface for Prometheus
    assert [_flag(triton["command"], f"--{k}") for k in (
        "http-address", "http-port", "grpc-address", "grpc-port", "metrics-address",
        "metrics-port")] == [["127.0.0.1"], ["18000"], ["127.0.0.1"], ["18001"], ["0.0.0.0"],
                             ["8002"]]


def test_the_front_shares_tritons_network_namespace_and_follows_its_restarts(front):
    assert front["network_mode"] == "service:triton"
    assert "ports" not in front and "networks" not in front  # the triton service publishes
    # Compose restarts the front after its own restarts of triton; the engine's restarts of
    # triton are caught by the entry point, which exits so the restart policy rejoins
    assert front["depends_on"] == {"triton": {"condition": "service_started", "restart": True}}
    assert front["restart"] == "unless-stopped"
    assert front["entrypoint"] == ["/bin/sh", "/opt/triton-forge/docker/front.sh"]
    script = _models_mount(front, front["entrypoint"][-1])
    assert script["read_only"] and (ROOT / script["source"]).resolve() == (
        ROOT / "docker" / "front.sh").resolve()
    assert front["stop_signal"] == "SIGUSR1"  # graceful: stop listening, finish what runs


@pytest.mark.parametrize("name", sorted(CONFIGURATIONS))
def test_the_front_runs_the_haproxy_cfg_of_the_repository_triton_serves(name):
    files, env, _ = CONFIGURATIONS[name]
    services = _services(files, env)
    front, triton = services["front"], services["triton"]
    config = PurePosixPath(front["command"][front["command"].index("-f") + 1])

    assert front["command"][:3] == ["haproxy", "-W", "-db"]
    assert config.name == "haproxy.cfg"
    assert _host_path(front, str(config.parent)) == PurePosixPath(_models_mount(triton)["source"])
    assert _models_mount(front, str(config.parent))["read_only"] is True


def test_the_front_forwards_the_api_paths_to_the_api_service_by_its_name(compose, front):
    """The gateway is a service of its own on the compose network, reached only through the
    front (which shares triton's namespace, on that network): its name and port are the
    front's FORGE_GATEWAY, and it calls the pipelines back through the front's HTTP port."""
    api = compose["services"]["api"]
    command = api["command"]

    assert front["environment"]["FORGE_GATEWAY"] == f"api:{command[command.index('--port') + 1]}"
    assert command[:3] == ["python3", "-m", "tools.api"]
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert command[command.index("--url") + 1] == "triton:8000"  # the front, in triton's namespace
    assert "ports" not in api and "network_mode" not in api  # published only through the front
    assert api["depends_on"] == {"front": {"condition": "service_healthy"}}
    assert api["restart"] == "unless-stopped"


def test_the_api_service_runs_from_the_serving_image_which_carries_the_gateway(compose):
    api, triton = compose["services"]["api"], compose["services"]["triton"]

    assert api["image"] == triton["image"] and api["build"] == triton["build"]
    assert api["working_dir"] == "/opt/triton-forge"  # where the image keeps tools/


@pytest.mark.parametrize("name", sorted(CONFIGURATIONS))
def test_the_api_service_reads_the_repository_triton_serves_read_only(name):
    files, env, _ = CONFIGURATIONS[name]
    services = _services(files, env)
    api, triton = services["api"], services["triton"]
    repository = api["command"][api["command"].index("--repository") + 1]

    assert _host_path(api, repository) == PurePosixPath(_models_mount(triton)["source"])
    assert _models_mount(api, repository)["read_only"] is True


def test_the_api_service_is_healthy_once_its_health_route_answers(compose):
    test = compose["services"]["api"]["healthcheck"]["test"]

    assert test[:3] == ["CMD", "python3", "-c"]
    assert "http://127.0.0.1:8080/health" in test[3]


def test_the_fronts_healthcheck_asks_tritonservers_readiness_through_it(front):
    test = front["healthcheck"]["test"]

    assert test[:3] == ["CMD", "bash", "-c"]
    assert "/dev/tcp/127.0.0.1/8000" in test[3] and "GET /v2/health/ready" in test[3]
    assert "$$status" in test[3], "compose interpolates a single $"


def test_triton_starts_only_after_the_builder_succeeded(triton):
    assert triton["depends_on"]["builder"] == {"condition": "service_completed_successfully"}


def test_triton_runs_the_tensorrt_guard_before_tritonserver(triton):
    entrypoint = triton["entrypoint"]
    script = ROOT / "docker" / Path(entrypoint[-1]).name
    lines = [line.strip() for line in script.read_text().splitlines()]
    guard = next(i for i, line in enumerate(lines) if "-m tools.serve.trt_guard" in line)
    # Every exec that starts the command; the re-exec of this very script through NGC's
    # nvidia_entrypoint.sh ("$0") runs the guard afterwards, in the re-executed script.
    starts = [i for i, line in enumerate(lines) if line.startswith("exec ") and '"$0"' not in line]

    assert entrypoint[-1] == "/opt/triton-forge/docker/triton-entrypoint.sh"
    assert "set -eu" in lines and starts and guard < min(starts)
    assert triton["command"][0] == "tritonserver"


def test_healthcheck_checks_every_model_of_the_mounted_repository(triton):
    test = triton["healthcheck"]["test"]

    assert test[:3] == ["CMD", "python3", "/opt/triton-forge/docker/healthcheck.py"]
    assert test[test.index("--repository") + 1] == _models_mount(triton)["target"]
    probes = json.loads((ROOT / "docker" / "healthcheck_probes.json").read_text())
    assert "text_embedding" in probes


@pytest.mark.parametrize("name", sorted(CONFIGURATIONS))
def test_guard_watchdog_and_healthcheck_read_the_repository_tritonserver_serves(name):
    files, env, _ = CONFIGURATIONS[name]
    triton = _services(files, env)["triton"]
    served = _models_mount(triton)["target"]
    script = (ROOT / "docker" / Path(triton["entrypoint"][-1]).name).read_text()
    health = triton["healthcheck"]["test"]

    assert _flag(triton["command"], "--model-repository") == [served]
    assert health[health.index("--repository") + 1] == served
    # The entry point hands one folder to the guard and the watchdog: $MODEL_REPOSITORY or served.
    assert "MODEL_REPOSITORY" not in (triton.get("environment") or {})
    assert f'repository="${{MODEL_REPOSITORY:-{served}}}"' in script
    assert re.search(r'-m tools\.serve\.trt_guard --repository "\$\{repository\}"', script)
    assert re.search(r'triton_supervisor\.py" --repository "\$\{repository\}"', script)


# --- the other services -----------------------------------------------------------------------


def test_gpu_reservation_lives_only_in_the_override(compose):
    override = _load(GPU_OVERRIDE)["services"]

    assert all("deploy" not in compose["services"][name] for name in ("triton", "builder"))
    for name in ("triton", "builder"):
        (device,) = override[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert override["builder"]["command"][:4] == ["tools", "build-repo", "--target", "gpu"]
    assert "${BUILD_TARGET:-cpu}" in compose["services"]["builder"]["command"]


def test_prometheus_scrapes_tritons_metrics_port(compose):
    config = _load(ROOT / "docker" / "prometheus.yml")
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "triton-forge"]

    assert [t for c in job["static_configs"] for t in c["targets"]][0] == "triton:8002"
    mount = compose["services"]["prometheus"]["volumes"][0]
    assert (ROOT / mount["source"]).resolve() == (ROOT / "docker" / "prometheus.yml").resolve()


def test_grafana_is_provisioned_with_the_prometheus_datasource_and_dashboard(compose):
    datasources = _load(ROOT / "docker/grafana/provisioning/datasources/prometheus.yml")
    providers = _load(ROOT / "docker/grafana/provisioning/dashboards/triton.yml")
    mounts = {v["target"]: v["source"] for v in compose["services"]["grafana"]["volumes"]}

    (source,) = datasources["datasources"]
    assert source["url"] == "http://prometheus:9090" and source["uid"] == "prometheus"
    dashboards_dir = providers["providers"][0]["options"]["path"]
    assert (ROOT / mounts[dashboards_dir] / "triton.json").is_file()
    assert (ROOT / mounts["/etc/grafana/provisioning"]).resolve() == (
        ROOT / "docker/grafana/provisioning").resolve()


def test_loadtest_gates_on_the_gpu_slo_profile_once_triton_and_the_front_are_healthy(compose):
    loadtest = compose["services"]["loadtest"]
    command = loadtest["command"]

    assert loadtest["profiles"] == ["load"]
    assert command[:2] == ["tools", "loadtest"]
    assert command[command.index("--slo-profile") + 1] == "gpu"
    assert command[command.index("--url") + 1] == "triton:8000"
    assert command[command.index("--grpc-url") + 1] == "triton:8001"  # the front, in triton's namespace
    assert loadtest["depends_on"]["triton"] == {"condition": "service_healthy"}
    assert loadtest["depends_on"]["front"] == {"condition": "service_healthy"}


def test_locust_master_and_workers_run_only_in_the_load_profile(compose):
    services = compose["services"]
    master, worker = services["locust-master"], services["locust-worker"]

    assert master["profiles"] == worker["profiles"] == ["load"]
    assert master["depends_on"]["triton"] == {"condition": "service_healthy"}
    assert master["depends_on"]["front"] == {"condition": "service_healthy"}
    # `run --rm locust-master` starts the workers too, and its exit status is the gate's.
    assert master["depends_on"]["locust-worker"] == {"condition": "service_started"}
    assert "--master" in master["command"] and "--worker" in worker["command"]
    assert master["command"][master["command"].index("--host") + 1] == "triton:8000"
    assert master["command"][master["command"].index("--slo-profile") + 1] == "gpu"
    assert worker["command"][worker["command"].index("--master-host") + 1] == "locust-master"
    assert all("profiles" not in services[s] for s in ("triton", "front", "api", "builder",
                                                        "prometheus", "grafana"))


def test_locust_files_and_slo_profile_the_services_use_exist(compose):
    master = compose["services"]["locust-master"]["command"]
    locustfile = ROOT / master[master.index("-f") + 1]
    slo = yaml.safe_load((ROOT / "loadtests" / "slo.yaml").read_text())

    assert locustfile.is_file()
    assert "gpu" in slo["profiles"]
    user_class = _default(master[-1])
    assert re.search(rf"^class {user_class}\(", locustfile.read_text(), re.MULTILINE)


# ------------------------------------------------------------------ hardening (issue 23 item 5)

LONG_RUNNING = ("triton", "front", "api", "prometheus", "grafana", "locust-worker")


def test_every_long_running_service_restarts(compose):
    for name in LONG_RUNNING:
        assert compose["services"][name].get("restart") in ("unless-stopped", "on-failure", "always"), name


@pytest.mark.parametrize("name", ["triton", "front", "api", "prometheus", "grafana", "builder"])
def test_services_drop_every_capability_and_run_read_only(compose, name):
    service = compose["services"][name]
    assert service["cap_drop"] == ["ALL"]
    assert service["read_only"] is True
    assert "no-new-privileges:true" in service["security_opt"]


def test_triton_runs_as_a_user_and_writes_only_tmp_and_dev_shm(triton):
    assert triton["user"] == "1000:1000"
    assert triton["tmpfs"] == ["/tmp"]
    assert _bytes(triton["shm_size"]) > 0
    writable = [v for v in triton["volumes"] if not v.get("read_only")]
    assert writable == []  # the repository is read-only; /tmp and /dev/shm are tmpfs


@pytest.mark.parametrize("name", ["front", "api"])
def test_the_front_and_the_gateway_run_as_a_user_and_write_nothing_but_tmp(compose, name):
    service = compose["services"][name]
    assert service["user"] == "1000:1000"
    assert service["tmpfs"] == ["/tmp"]
    assert [v for v in service["volumes"] if not v.get("read_only")] == []


def test_the_gateway_s_limits_are_its_kubernetes_limits(compose):
    from tools.deploy import manifests

    api = compose["services"]["api"]
    assert str(api["cpus"]) == manifests.API_LIMITS["cpu"]
    assert _bytes(api["mem_limit"]) == _bytes(manifests.API_LIMITS["memory"].replace("Mi", "m"))


def test_prometheus_writes_only_its_tsdb_volume(compose):
    prometheus = compose["services"]["prometheus"]
    writable = [v["target"] for v in prometheus["volumes"] if not v.get("read_only")]
    assert writable == ["/prometheus"]
    assert "--storage.tsdb.path=/prometheus" in prometheus["command"]


@pytest.mark.torch  # the weights references resolve through the model packages, which import torch
def test_limits_are_the_kubernetes_sizing_of_the_same_spec():
    from tools.build_repo.spec import load_spec
    from tools.deploy.sizing import size_pod

    spec = load_spec(ROOT / "repository.yaml")
    base = _load(COMPOSE)["services"]["triton"]
    gpu = _load(GPU_OVERRIDE)["services"]["triton"]
    cpu_size, gpu_size = size_pod(spec, "cpu"), size_pod(spec, "gpu")
    assert _default(base["cpus"]) == str(cpu_size.cpu)
    assert _bytes(_default(base["mem_limit"])) == cpu_size.memory_mib << 20
    assert _bytes(_default(gpu["mem_limit"])) == gpu_size.memory_mib << 20


def test_prometheus_loads_the_rendered_slo_rules_of_each_profile():
    from tools.deploy import compose as compose_rules

    config = _load(ROOT / "docker" / "prometheus.yml")
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    volumes = _load(COMPOSE)["services"]["prometheus"]["volumes"]
    for profile, env in (("gpu", {}), ("cpu", {"SLO_PROFILE": "cpu"})):
        (rules,) = [v for v in _interpolate(volumes, env) if v["target"] == "/etc/prometheus/rules/slo.yml"]
        path = ROOT / rules["source"]
        assert path.name == f"rules-{profile}.yml"
        assert path.read_text() == compose_rules.rules_text(profile), (
            "re-render: python -c 'from tools.deploy import compose; compose.write_rules()'")
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "triton-forge"  # the job the rendered alerts select
    assert job["static_configs"][0]["targets"] == ["triton:8002", "triton:8003"]


def test_the_entrypoint_passes_the_supervisors_retry_backoff_from_the_environment(triton):
    entrypoint = (ROOT / "docker" / "triton-entrypoint.sh").read_text()
    assert '--retry-backoff ${TRITON_RETRY_BACKOFF}' in entrypoint
    assert '--retry-backoff-max ${TRITON_RETRY_BACKOFF_MAX}' in entrypoint
    env = triton["environment"]
    assert float(env["TRITON_RETRY_BACKOFF"]) < float(env["TRITON_RETRY_BACKOFF_MAX"])


# Locked dependencies (item 6): tests/test_deploy_locks.py
