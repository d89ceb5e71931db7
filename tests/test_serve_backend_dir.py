"""Fast tests of the embedded server's set-up: backend folder, command line, refusals.

No server is started here; the server tests live in test_serve_server.py.
"""

from __future__ import annotations

import os
import socket
import sys
import sysconfig
from pathlib import Path

import pytest

from tools.errors import ServerError, UserInputError
from tools.serve import backend_dir
from tools.serve.backend_dir import (
    STUB_NAME,
    default_cache_root,
    libpython_dir,
    python_backend_dir,
    pytriton_server_dir,
)
from tools.serve.server import LOOPBACK, RESTRICTED_APIS, EmbeddedServer
from tools.serve.server_log import failure_causes

TOY_REPOSITORY = Path(__file__).parent / "fixtures" / "toy_repository"
SITE_PACKAGES = Path(sysconfig.get_paths()["purelib"]).resolve()


def test_backend_dir_links_wheel_backend_and_stub_of_running_python_when_assembled(tmp_path):
    folder = python_backend_dir(tmp_path)
    wheel = pytriton_server_dir()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"

    assert folder == tmp_path / "triton-backends" / f"py{version}"
    python = folder / "python"
    assert (python / "libtriton_python.so").resolve() == (
        wheel / "backends" / "python" / "libtriton_python.so"
    ).resolve()
    assert (python / "triton_python_backend_utils.py").resolve() == (
        wheel / "backends" / "python" / "triton_python_backend_utils.py"
    ).resolve()
    assert (python / STUB_NAME).resolve() == (
        wheel / "python_backend_stubs" / version / STUB_NAME
    ).resolve()
    assert os.access(python / STUB_NAME, os.X_OK)


def test_backend_dir_replaces_stale_links_when_assembled_again(tmp_path):
    python = python_backend_dir(tmp_path) / "python"
    (python / STUB_NAME).unlink()
    (python / STUB_NAME).symlink_to(tmp_path / "moved-venv" / STUB_NAME)

    python_backend_dir(tmp_path)

    assert (python / STUB_NAME).exists()
    assert not list(python.glob(".*.tmp"))


def test_backend_dir_raises_naming_supported_versions_when_python_has_no_stub(tmp_path):
    with pytest.raises(ServerError) as info:
        python_backend_dir(tmp_path, python_version=(3, 99))

    message = str(info.value)
    assert "Python 3.99" in message
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in message.split("supported:")[1]
    assert not (tmp_path / "triton-backends").exists()


def test_backend_dir_refuses_cache_folder_inside_site_packages():
    target = SITE_PACKAGES / "triton-forge-cache-must-not-exist"

    with pytest.raises(UserInputError, match="inside site-packages"):
        python_backend_dir(target)

    assert not target.exists()


def test_default_cache_root_is_outside_site_packages_when_no_override(monkeypatch):
    monkeypatch.delenv(backend_dir.CACHE_ENV, raising=False)

    root = default_cache_root().resolve()

    assert SITE_PACKAGES not in root.parents and root != SITE_PACKAGES
    assert root.name == ".cache"


def test_default_cache_root_follows_environment_override(monkeypatch, tmp_path):
    monkeypatch.setenv(backend_dir.CACHE_ENV, str(tmp_path / "elsewhere"))

    assert default_cache_root() == tmp_path / "elsewhere"


def test_libpython_dir_is_the_running_interpreters_libdir_holding_the_library():
    libdir = libpython_dir()

    assert libdir == Path(sysconfig.get_config_var("LIBDIR"))
    assert (libdir / f"libpython{sys.version_info.major}.{sys.version_info.minor}.so.1.0").exists()


def test_libpython_dir_raises_naming_library_and_libdir_when_library_missing(monkeypatch, tmp_path):
    real = sysconfig.get_config_var
    monkeypatch.setattr(
        backend_dir.sysconfig,
        "get_config_var",
        lambda name: str(tmp_path) if name == "LIBDIR" else real(name),
    )

    with pytest.raises(ServerError) as info:
        libpython_dir()

    message = str(info.value)
    assert f"libpython{sys.version_info.major}.{sys.version_info.minor}.so.1.0" in message
    assert f"LIBDIR ({tmp_path})" in message
    assert "\n" not in message


def test_command_binds_every_endpoint_to_loopback_with_strict_configs_and_closed_admin_apis():
    server = EmbeddedServer(TOY_REPOSITORY)

    cmd = server.command()
    options = dict(arg.split("=", 1) for arg in cmd[1:] if "=" in arg)

    for kind in ("http", "grpc", "metrics"):
        assert options[f"--{kind}-address"] == LOOPBACK
        assert int(options[f"--{kind}-port"]) > 0
    # Explicit model control only so tools serve can reload a model whose stub died: every model
    # is loaded at start, and the model-repository API stays behind the per-start admin key.
    assert options["--model-control-mode"] == "explicit" and "--load-model=*" in cmd
    assert "model-repository" in RESTRICTED_APIS
    assert "--disable-auto-complete-config" in cmd or options["--strict-model-config"] == "true"
    for flag in ("--http-restricted-api", "--grpc-restricted-protocol"):
        apis = options[flag].split(":", 1)[0].split(",")
        assert set(apis) == set(RESTRICTED_APIS)
    backend = Path(options["--backend-directory"]).resolve()
    assert SITE_PACKAGES not in backend.parents


def test_environment_puts_libdir_and_venv_bin_first():
    env = EmbeddedServer(TOY_REPOSITORY).environment()

    assert env["LD_LIBRARY_PATH"].split(os.pathsep)[0] == sysconfig.get_config_var("LIBDIR")
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)


def test_start_raises_user_input_error_when_repository_missing(tmp_path):
    missing = tmp_path / "no_such_repository"

    with pytest.raises(UserInputError, match=f"{missing} does not exist"):
        EmbeddedServer(missing).start()


def test_start_raises_user_input_error_when_repository_holds_no_model(tmp_path):
    with pytest.raises(UserInputError, match="holds no model folder"):
        EmbeddedServer(tmp_path).start()


def test_start_raises_naming_port_when_requested_port_is_in_use(tmp_path):
    with socket.socket() as busy:
        busy.bind((LOOPBACK, 0))
        busy.listen()
        port = busy.getsockname()[1]
        server = EmbeddedServer(TOY_REPOSITORY, grpc_port=port, log_path=tmp_path / "log")

        with pytest.raises(ServerError) as info:
            server.start()

    assert f"port {port} (GRPC) is already in use on {LOOPBACK}" in str(info.value)
    assert server.pid is None  # refused before starting anything


def test_failure_causes_reads_unquoted_reason_and_first_frame_from_log_lines():
    # Two lines as tritonserver 2.51 writes them (seen in this project's server logs).
    log = (
        "E1130 11:00:57.799076 6022 model_lifecycle.cc:642] \"failed to load 'bad' version 1: "
        'Internal: RuntimeError: boom\\n\\nAt:\\n  /r/bad/1/model.py(3): initialize\\n"\n'
        'E1130 11:01:11.021912 6330 main.cc:257] "failed to start HTTP service: Unavailable - '
        "Socket '127.0.0.1:18010' already in use \"\n"
    )

    causes = failure_causes(log)

    assert causes == [
        (
            "model 'bad' version 1 failed to load: Internal: RuntimeError: boom "
            "(at /r/bad/1/model.py(3): initialize)"
        ),
        "port 18010 (HTTP) is already in use on 127.0.0.1",
    ]
