"""The test tiers' own helpers: which tier a test is in, what the guard catches, and the waits."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest

from tier_helpers import (FAST, INTEGRATION, SYSTEM, heavy_command, is_fast, names_torch,
                          system_command, tier_of)
from waits import WaitTimeout, read_by_peer, wait_until

ROOT = Path(__file__).resolve().parents[1]


def test_a_test_is_fast_unless_a_heavy_marker_or_fixture_says_otherwise():
    assert is_fast(set(), ["tmp_path", "monkeypatch"])
    assert is_fast({"parametrize", "timeout"}, ["toy_repository"])
    assert not is_fast({"server"}, [])
    assert not is_fast({"reliability"}, ["tmp_path"])
    assert not is_fast(set(), ["server_factory"])
    assert not is_fast(set(), ["built_repository"])


def test_a_test_is_system_when_marked_so_whatever_else_it_needs_and_integration_otherwise():
    assert tier_of({"system", "server", "torch"}, ["triton_server"]) == SYSTEM
    assert tier_of({"install"}, []) == SYSTEM  # the wheel in a fresh venv
    assert tier_of({"server"}, []) == INTEGRATION
    assert tier_of(set(), ["built_repository"]) == INTEGRATION
    assert tier_of({"timeout"}, ["tmp_path"]) == FAST


def test_this_module_is_in_the_fast_tier_and_in_no_other(request):
    assert request.node.get_closest_marker(FAST) is not None
    assert request.node.get_closest_marker(INTEGRATION) is None
    assert request.node.get_closest_marker(SYSTEM) is None


def test_the_integration_guard_names_installs_venvs_pods_soaks_and_long_tune_budgets():
    python = sys.executable
    assert "marker: system" in system_command([python, "-m", "pip", "install", "x.whl"])
    assert "marker: system" in system_command(["/v/bin/pip", "install", "-r", "req.txt"])
    assert "marker: system" in system_command([python, "-m", "venv", "/tmp/v"])
    assert "marker: system" in system_command(["podman", "kube", "play", "d.yaml"])
    assert "marker: system" in system_command([python, "benchmarks/chaos_soak.py", "--minutes", "1"])
    assert "3-minute budget" in system_command(
        [python, "-m", "tools.cli", "tune", "--scenario", "s", "--budget-minutes", "3"])

    assert system_command([python, "-m", "tools.cli", "tune", "--budget-minutes", "0.5"]) is None
    assert system_command([python, "-m", "pip", "download", "idna"]) is None
    assert system_command([python, "-m", "pip", "install", "--help"]) is None
    assert system_command(["podman", "image", "exists", "x"]) is None
    assert system_command(["tools", "serve", "--repository", "r"]) is None


def test_the_guard_names_real_servers_locust_and_heavy_tools_commands(tmp_path):
    real = tmp_path / "bin" / "tritonserver"
    real.parent.mkdir()
    real.write_text("")
    stand_in = tmp_path / "tritonserver"
    stand_in.write_text("")

    assert "marker: server" in heavy_command([str(real), "--model-repository=/m"], real)
    assert heavy_command([str(stand_in), "--model-repository=/m"], real) is None
    assert "marker: load" in heavy_command([sys.executable, "-m", "locust", "-f", "x.py"], real)
    assert "tools serve" in heavy_command([sys.executable, "-m", "tools.cli", "serve"], real)
    assert heavy_command([sys.executable, "-m", "tools.cli", "serve", "--help"], real) is None
    assert heavy_command(["tools", "build-repo", "--check"], real) is None
    assert "tools build-repo" in heavy_command(["tools", "build-repo"], real)
    assert heavy_command(["tools", "build-repo"], real, light_subprocess=True) is None
    assert heavy_command(["git", "apply", "--check", "x.patch"], real) is None


def test_code_that_names_torch_is_found_in_nested_functions_too():
    # written as source text: a test whose own code named it would be caught by the guard
    library = "tor" + "ch"
    namespace: dict = {}
    exec(f"def imports():\n    import {library}\n"
         f"def nests():\n    def inner():\n        return {library}.zeros(1)\n    return inner\n"
         "def plain():\n    return 1\n", namespace)

    assert names_torch(namespace["imports"]) and names_torch(namespace["nests"])
    assert not names_torch(namespace["plain"])


def test_wait_until_returns_the_state_once_it_holds():
    ready_at = time.monotonic() + 0.2
    assert wait_until(lambda: time.monotonic() >= ready_at and "ready", 5, "the clock") == "ready"


def test_wait_until_fails_naming_what_it_waited_for_and_the_state_at_the_end():
    seen = []
    with pytest.raises(WaitTimeout, match=r"waited 0.2 s for the marker file; polls: \d+"):
        wait_until(lambda: seen.append(1), 0.2, lambda: f"the marker file; polls: {len(seen)}")
    assert len(seen) >= 2, "polled until the timeout"


def test_read_by_peer_tells_bytes_waiting_from_bytes_read():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        with client:
            client.sendall(b"x" * 100)
            wait_until(lambda: not read_by_peer(client), 5, "nothing accepted or read yet")
            server, _ = listener.accept()
            with server:
                assert not read_by_peer(client), "accepted but not read"
                got = b""
                while len(got) < 100:
                    got += server.recv(100)
                wait_until(lambda: read_by_peer(client), 5, "the peer to have read all 100 bytes")
