"""scripts/compose-smoke.sh refuses bad input with one clear line and leaves nothing running.

The checks before an engine is needed run everywhere; the others need Podman or a Docker engine
and skip, saying so, where neither is installed. The full smoke (images, stack, load gate) is
run by .ci/run, not here: it takes minutes.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "compose-smoke.sh"
HAS_DOCKER = shutil.which("docker") is not None and (
    subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
)
# The script needs an engine and its compose client (CI installs podman-compose into
# .cache/compose-venv only for the compose smoke, after the test suite).
HAS_ENGINE = HAS_DOCKER or (shutil.which("podman") is not None and (
    shutil.which("podman-compose") is not None
    or (ROOT / ".cache" / "compose-venv" / "bin" / "podman-compose").is_file()
))
needs_engine = pytest.mark.skipif(
    not HAS_ENGINE, reason="no container engine with a compose client here (podman + "
    "podman-compose, or Docker with Compose v2); scripts/ci-compose-smoke.sh installs them")


def _run(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "TRITON_ADMIN_KEY"}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          env=base | (env or {}), timeout=timeout, cwd=ROOT)


def _project_containers() -> str:
    engine = "podman" if shutil.which("podman") else "docker"
    return subprocess.run([engine, "ps", "-aq", "--filter", "label=com.docker.compose.project=triton-forge"],
                          capture_output=True, text=True, timeout=60).stdout.strip()


def _errors(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if "error:" in line]


def test_up_without_admin_key_fails_with_one_line():
    result = _run("up")

    assert result.returncode == 1
    (error,) = _errors(result)
    assert "TRITON_ADMIN_KEY is not set" in error


def test_an_unknown_verb_prints_usage():
    result = _run("sideways")

    assert result.returncode == 2
    assert "usage:" in result.stderr


def test_no_engine_fails_with_one_line(tmp_path):
    """PATH holds the shell tools but neither docker nor podman."""
    for tool in ("bash", "dirname", "cat", "mkdir", "timeout", "grep", "cut", "head", "env"):
        (tmp_path / tool).symlink_to(shutil.which(tool))
    result = _run("up", env={"TRITON_ADMIN_KEY": "k", "PATH": str(tmp_path)})

    assert result.returncode == 1
    (error,) = _errors(result)
    assert "no container engine" in error


@needs_engine
def test_a_port_already_taken_fails_before_anything_starts():
    if _project_containers():
        pytest.skip("a triton-forge stack is running on this engine")
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", 8001))
        except OSError:
            pytest.skip("127.0.0.1:8001 is taken by another process already")
        sock.listen()
        result = _run("up", env={"TRITON_ADMIN_KEY": "k"})

    assert result.returncode == 1
    (error,) = _errors(result)
    assert "port 127.0.0.1:8001 is already in use" in error
    assert not _project_containers()


@needs_engine
def test_a_missing_model_repository_fails_before_anything_starts():
    if _project_containers():
        pytest.skip("a triton-forge stack is running on this engine")
    env = {"TRITON_ADMIN_KEY": "k", "SKIP_BUILD_REPO": "1", "BUILD_TARGET": "no-such-target"}
    result = _run("up", env=env)

    assert result.returncode == 1
    (error,) = _errors(result)
    assert "model repository build/model_repositories/no-such-target is missing" in error
    assert not _project_containers()
