"""docker-compose.cpu.yml and the CPU images: the same stack as the NGC variant but for image and target.

Static checks always run; tests/test_compose_smoke.py runs the script against a real engine.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
CPU_OVERRIDE = ROOT / "docker-compose.cpu.yml"
NGC_DOCKERFILE = ROOT / "docker" / "triton.Dockerfile"
CPU_DOCKERFILE = ROOT / "docker" / "triton-cpu.Dockerfile"
SCHEMA = ROOT / "tests" / "data" / "compose-spec.json"
# What the override may change: the image and how it is built, limits and a healthcheck field
# the CPU engine cannot honour, Grafana's profile (no image without a registry).
ALLOWED = {"image", "build", "ulimits", "healthcheck", "profiles"}


class _ComposeLoader(yaml.SafeLoader):
    """YAML with Compose's merge tags (!reset, !override) read as plain values."""


def _tagged(loader: yaml.SafeLoader, node: yaml.Node):
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)


_ComposeLoader.add_constructor("!reset", lambda loader, node: None)
_ComposeLoader.add_constructor("!override", _tagged)


@pytest.fixture(scope="module")
def override() -> dict:
    return yaml.load(CPU_OVERRIDE.read_text(encoding="utf-8"), Loader=_ComposeLoader)


def _stage(dockerfile: Path, name: str) -> list[str]:
    """The instructions of one stage, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", dockerfile.read_text(encoding="utf-8"))
    stage, out = None, []
    for line in text.splitlines():
        match = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.IGNORECASE)
        if match:
            stage = match.group(1)
        elif stage == name and line.strip() and not line.lstrip().startswith("#"):
            out.append(" ".join(line.split()))
    return out


def test_cpu_override_validates_against_the_compose_specification(override):
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    cleaned = json.loads(json.dumps(override, default=str))
    for service in cleaned["services"].values():  # !reset values read as None
        for key in [k for k, v in service.items() if v is None]:
            del service[key]
        if isinstance(service.get("healthcheck"), dict):
            service["healthcheck"] = {k: v for k, v in service["healthcheck"].items() if v is not None}
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(cleaned), key=str)
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_cpu_override_changes_only_images_and_targets(override):
    base = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["services"]
    for name, service in override["services"].items():
        assert name in base, f"the override adds service {name}"
        assert set(service) <= ALLOWED, f"{name}: {sorted(set(service) - ALLOWED)}"
    smoke = (ROOT / "scripts" / "compose-smoke.sh").read_text()
    assert 'export SLO_PROFILE="${SLO_PROFILE:-cpu}"' in smoke  # the cpu profile's SLO rules
    triton = override["services"]["triton"]
    assert set(triton["healthcheck"]) == {"start_interval"}, "the healthcheck test stays the base's"


def test_cpu_images_are_the_locally_built_ones(override):
    services = override["services"]
    for name in ("builder", "loadtest", "locust-master", "locust-worker"):
        assert "builder-cpu" in services[name]["image"]
        assert services[name]["build"]["target"] == "builder"
    for name in ("triton", "api"):  # the gateway runs from the serving image
        assert services[name]["image"] == "${TRITON_CPU_IMAGE:-triton-forge/triton-cpu:local}"
        assert services[name]["build"]["target"] == "serve"
    assert "prometheus-cpu" in services["prometheus"]["image"]
    # Debian's haproxy in place of the official image; its command and entry point are the base's
    assert services["front"] == {"image": "${FRONT_CPU_IMAGE:-triton-forge/front-cpu:local}"}
    assert services["grafana"]["profiles"] == ["grafana"]


def test_cpu_serve_stage_copies_what_the_ngc_serve_stage_copies():
    """Same files at the same paths: the CPU smoke then proves the NGC image's layout too (the
    requirement locks differ: the CPU image installs its own in the tritonserver stage)."""
    copies = lambda path: [i for i in _stage(path, "serve") if i.upper().startswith("COPY ")  # noqa: E731
                           and "requirements-" not in i]
    assert copies(CPU_DOCKERFILE) == copies(NGC_DOCKERFILE)


def test_the_cpu_images_tags_name_the_front_image_too():
    """scripts/compose-images.sh writes every *_IMAGE variable the override reads."""
    script = (ROOT / "scripts" / "compose-images.sh").read_text(encoding="utf-8")
    wanted = set(re.findall(r"\$\{(\w+_IMAGE):-", CPU_OVERRIDE.read_text(encoding="utf-8")))
    written = set(re.findall(r"^(\w+_IMAGE)=\$\1$", script, re.MULTILINE))
    assert "FRONT_CPU_IMAGE" in wanted and wanted - {"BASE_IMAGE"} <= written


def test_cpu_serving_image_installs_no_torch():
    serve = " ".join(_stage(CPU_DOCKERFILE, "tritonserver") + _stage(CPU_DOCKERFILE, "serve"))
    assert "torch" not in serve.replace("constraints-cpu.txt", "")


def test_no_registry_host_or_local_path_in_the_committed_files():
    """Mirrors, pip find-links and apt sources are read on the host at run time."""
    files = [CPU_OVERRIDE, CPU_DOCKERFILE, ROOT / "docker" / "debian-rootfs.sh",
             ROOT / "scripts" / "compose-images.sh", ROOT / "scripts" / "compose-smoke.sh",
             ROOT / "scripts" / "compose-lib.sh"]
    pattern = re.compile(r"deb\.debian\.org|/opt/wheels|/opt/pypi|file:///|https?://(?!127\.0\.0\.1)")
    for path in files:
        hits = [line for line in path.read_text(encoding="utf-8").splitlines() if pattern.search(line)]
        assert not hits, f"{path.name}: {hits}"
