"""The tritonserver flag list (tools/serve/server_config.py) and the compose service held to it.

docker-compose.yml's triton command must use only flags of the list, and the security-relevant
ones must agree with what the embedded server runs with; the command the embedded server builds
follows the options its binary has. No server is started here (stand-in binaries answer --help).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from server_helpers import fake_tritonserver
from tools.errors import ServerError
from tools.serve.server import OPEN_ADMIN_ENV, EmbeddedServer
from tools.serve.server_config import (
    ADMIN_HEADER,
    FLAGS,
    HTTP_MAX_INPUT_SIZE,
    LOOPBACK,
    RESTRICTED_APIS,
    Restriction,
    TritonServerConfig,
)

ROOT = Path(__file__).resolve().parents[1]
TOY_REPOSITORY = Path(__file__).parent / "fixtures" / "toy_repository"


def _compose_command() -> list[str]:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    command = compose["services"]["triton"]["command"]
    assert command[0] == "tritonserver"
    return command[1:]


@pytest.fixture(scope="module")
def compose_config() -> TritonServerConfig:
    """The compose service's flags, parsed by the flag list (the admin key left unexpanded)."""
    return TritonServerConfig.from_args(_compose_command())


@pytest.fixture(scope="module")
def embedded_config() -> TritonServerConfig:
    """The flags the embedded server starts the wheel's tritonserver with."""
    return EmbeddedServer(TOY_REPOSITORY).config()


def test_every_flag_of_the_compose_command_is_a_flag_of_the_list():
    flags = [arg.split("=", 1)[0] for arg in _compose_command()]

    assert [f for f in flags if f not in FLAGS] == []


def test_compose_command_round_trips_through_the_flag_list(compose_config):
    assert sorted(compose_config.to_args()) == sorted(_compose_command())


def test_compose_and_embedded_server_agree_on_model_control_and_strict_configs(
    compose_config, embedded_config
):
    # Explicit control with every model loaded at start lets the supervisor reload one model
    # whose stub died; the load API it uses stays behind the admin key (model-repository is
    # restricted, see below). Polling the repository is never allowed.
    assert (embedded_config.model_control_mode, embedded_config.load_model) == ("explicit", ("*",))
    assert (compose_config.model_control_mode, compose_config.load_model) in (
        ("none", ()), ("explicit", ("*",))
    )
    for config in (compose_config, embedded_config):
        assert "model-repository" in config.http_restricted_api.apis
        assert "model-repository" in config.grpc_restricted_protocol.apis
        assert config.strict_readiness is True
        assert config.exit_on_error is True
        assert config.disable_auto_complete_config or config.strict_model_config is True


def test_compose_and_embedded_server_restrict_the_same_admin_api_groups(
    compose_config, embedded_config
):
    for config in (compose_config, embedded_config):
        for restriction in (config.http_restricted_api, config.grpc_restricted_protocol):
            assert restriction is not None
            assert sorted(restriction.apis) == sorted(RESTRICTED_APIS)
    assert compose_config.http_restricted_api == compose_config.grpc_restricted_protocol
    assert embedded_config.http_restricted_api.header == ADMIN_HEADER
    assert re.fullmatch(r"\$\{TRITON_ADMIN_KEY:\?.+\}", compose_config.http_restricted_api.key)


def test_compose_bounds_http_input_size_as_the_embedded_server_does_where_supported(
    compose_config,
):
    assert compose_config.http_max_input_size == HTTP_MAX_INPUT_SIZE


def test_embedded_server_binds_loopback_while_compose_publishes_on_loopback_by_default(
    compose_config, embedded_config
):
    # In the container Triton's HTTP and gRPC listen on loopback behind the front, which shares
    # its network namespace; its metrics on the network's interfaces (Prometheus scrapes them);
    # compose publishes the ports on ${TRITON_BIND_IP:-127.0.0.1} (tests/test_compose_file.py).
    assert (embedded_config.http_address, embedded_config.grpc_address,
            embedded_config.metrics_address) == (LOOPBACK, LOOPBACK, LOOPBACK)
    assert (compose_config.http_address, compose_config.grpc_address,
            compose_config.metrics_address) == (LOOPBACK, LOOPBACK, "0.0.0.0")
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    ports = compose["services"]["triton"]["ports"]
    assert all(p.startswith("${TRITON_BIND_IP:-127.0.0.1}:") for p in ports)


def test_embedded_command_is_the_rendered_config_of_its_flag_list(embedded_config):
    server = EmbeddedServer(TOY_REPOSITORY)

    cmd = server.command()

    assert [a.split("=", 1)[0] for a in cmd[1:]] == [a.split("=", 1)[0]
                                                     for a in server.config().to_args()]
    parsed = TritonServerConfig.from_args(cmd[1:])
    assert (parsed.model_control_mode, parsed.load_model) == ("explicit", ("*",))


def test_to_args_renders_values_switches_and_repeated_flags_in_field_order():
    config = TritonServerConfig(
        model_repository="/models",
        http_port=8000,
        strict_readiness=True,
        disable_auto_complete_config=True,
        http_restricted_api=Restriction(("trace", "logging"), "k", "v"),
        backend_config=("python,a=1", "python,b=2"),
    )

    assert config.to_args() == [
        "--model-repository=/models",
        "--http-port=8000",
        "--strict-readiness=true",
        "--disable-auto-complete-config",
        "--http-restricted-api=trace,logging:k=v",
        "--backend-config=python,a=1",
        "--backend-config=python,b=2",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model-control-mode=poll", "--no-such-flag=1"], "--no-such-flag: not a flag"),
        (["--http-port=eighty"], "--http-port: invalid literal"),
        (["--strict-readiness=yes"], "--strict-readiness: expected true or false"),
        (["--disable-auto-complete-config=true"], "--disable-auto-complete-config: takes no value"),
        (["--http-restricted-api=trace"], "--http-restricted-api: expected API,API:HEADER=KEY"),
    ],
)
def test_from_args_refuses_unknown_flags_and_bad_values_naming_the_flag(args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TritonServerConfig.from_args(args)


# --- the command EmbeddedServer builds for a binary (stand-ins that list their options) ---

_RESTRICTING = ["--http-restricted-api", "--grpc-restricted-protocol"]


@pytest.mark.parametrize(
    "options",
    [["--grpc-restricted-protocol"], ["--http-restricted-api"], []],
    ids=["no-http-restriction", "no-grpc-restriction", "neither"],
)
def test_command_refuses_a_binary_that_would_leave_admin_apis_open(
    toy_repository, tmp_path, monkeypatch, options
):
    monkeypatch.delenv(OPEN_ADMIN_ENV, raising=False)
    binary = fake_tritonserver(tmp_path, ["--model-repository", *options])
    server = EmbeddedServer(toy_repository, binary=binary)

    with pytest.raises(ServerError, match="admin APIs .* would be open to any caller") as caught:
        server.command()

    missing = [o for o in _RESTRICTING if o not in options]
    assert f"has no {' / '.join(missing)}," in str(caught.value)
    assert OPEN_ADMIN_ENV in str(caught.value)


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_command_runs_with_open_admin_apis_only_when_the_caller_opts_out(
    toy_repository, tmp_path, monkeypatch, how
):
    binary = fake_tritonserver(tmp_path, ["--model-repository"])
    if how == "environment":
        monkeypatch.setenv(OPEN_ADMIN_ENV, "1")
        server = EmbeddedServer(toy_repository, binary=binary)
    else:
        monkeypatch.delenv(OPEN_ADMIN_ENV, raising=False)
        server = EmbeddedServer(toy_repository, binary=binary, allow_open_admin_apis=True)

    cmd = server.command()

    assert not any("restricted" in arg for arg in cmd)


def test_command_bounds_http_input_size_like_compose_when_the_binary_supports_it(
    toy_repository, tmp_path
):
    binary = fake_tritonserver(tmp_path, [*_RESTRICTING, "--http-max-input-size"])

    cmd = EmbeddedServer(toy_repository, binary=binary).command()

    assert f"--http-max-input-size={HTTP_MAX_INPUT_SIZE}" in cmd
    compose = (ROOT / "docker-compose.yml").read_text()
    assert f"--http-max-input-size={HTTP_MAX_INPUT_SIZE}" in compose


def test_command_omits_the_input_size_bound_when_the_binary_lacks_the_option(
    toy_repository, tmp_path
):
    binary = fake_tritonserver(tmp_path, _RESTRICTING)

    cmd = EmbeddedServer(toy_repository, binary=binary).command()

    assert not any(arg.startswith("--http-max-input-size") for arg in cmd)
    assert any(arg.startswith("--http-restricted-api=") for arg in cmd)
    assert any(arg.startswith("--grpc-restricted-protocol=") for arg in cmd)
