"""tritonserver's command-line flags as data: one dataclass field per flag this project uses.

``TritonServerConfig`` renders the embedded server's command line and parses the compose service's
(an unknown flag is an error), so tests can compare the two field by field; ``for_binary`` adapts
it to the flags a binary lists and applies the admin-API policy.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import subprocess
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tools.errors import ServerError

LOOPBACK = "127.0.0.1"
# Admin API groups closed to callers without the per-server header (loading models, shared
# memory regions, tracing and log settings); health, metadata, config, inference and
# statistics stay open.
RESTRICTED_APIS = ("model-repository", "shared-memory", "trace", "logging")
ADMIN_HEADER = "triton-forge-admin"
# Set to 1 to run a binary that cannot restrict the admin APIs, leaving them open to any caller.
OPEN_ADMIN_ENV = "TRITON_FORGE_ALLOW_OPEN_ADMIN_APIS"
# Same bound as docker-compose.yml's --http-max-input-size; passed only to binaries that have it.
HTTP_MAX_INPUT_SIZE = 16 * 1024 * 1024

_SWITCH = {"switch": True}  # a flag without a value, e.g. --disable-auto-complete-config
_REPEATED = {"repeated": True}  # a flag given once per value, e.g. --backend-config


@dataclass(frozen=True)
class Restriction:
    """The value of ``--http-restricted-api`` / ``--grpc-restricted-protocol``.

    Attributes:
        apis: The API groups closed to callers without the header.
        header: The header name that opens them.
        key: The header value that opens them.
    """

    apis: tuple[str, ...]
    header: str
    key: str

    def render(self) -> str:
        """``apis:header=key``, as tritonserver reads it."""
        return f"{','.join(self.apis)}:{self.header}={self.key}"

    @classmethod
    def parse(cls, value: str) -> Restriction:
        """The reverse of ``render``.

        Raises:
            ValueError: ``value`` is not ``api[,api...]:header=key``.
        """
        match = re.fullmatch(r"([\w,-]+):([\w-]+)=(.+)", value)
        if not match:
            raise ValueError(f"expected API,API:HEADER=KEY, got {value!r}")
        apis, header, key = match.groups()
        return cls(tuple(apis.split(",")), header, key)


@dataclass(frozen=True)
class TritonServerConfig:
    """The tritonserver flags this project sets; field ``a_b`` is flag ``--a-b``.

    None (or False for a switch, () for a repeated flag) leaves a flag out, so the server's own
    default applies. ``to_args`` renders the fields in declaration order.
    """

    model_repository: str | None = None
    backend_directory: str | None = None
    http_address: str | None = None
    http_port: int | None = None
    grpc_address: str | None = None
    grpc_port: int | None = None
    metrics_address: str | None = None
    metrics_port: int | None = None
    model_control_mode: str | None = None
    load_model: tuple[str, ...] = field(default=(), metadata=_REPEATED)
    strict_readiness: bool | None = None
    exit_on_error: bool | None = None
    exit_timeout_secs: int | None = None
    disable_auto_complete_config: bool = field(default=False, metadata=_SWITCH)
    strict_model_config: bool | None = None  # the deprecated spelling of the switch above
    http_max_input_size: int | None = None
    http_restricted_api: Restriction | None = None
    grpc_restricted_protocol: Restriction | None = None
    grpc_restricted_api: Restriction | None = None  # a spelling some builds list instead
    allow_metrics: bool | None = None
    allow_gpu_metrics: bool | None = None
    allow_cpu_metrics: bool | None = None
    backend_config: tuple[str, ...] = field(default=(), metadata=_REPEATED)

    def to_args(self) -> list[str]:
        """The command-line options, ``--flag=value`` each (a switch bare)."""
        args = []
        for spec in dataclasses.fields(self):
            value, flag = getattr(self, spec.name), flag_name(spec.name)
            if spec.metadata.get("switch"):
                args += [flag] if value else []
            elif spec.metadata.get("repeated"):
                args += [f"{flag}={item}" for item in value]
            elif value is not None:
                args.append(f"{flag}={_render(value)}")
        return args

    @classmethod
    def from_args(cls, args: Iterable[str]) -> TritonServerConfig:
        """Parse ``--flag=value`` options (the reverse of ``to_args``).

        Raises:
            ValueError: a flag is not a field of this class, or its value does not parse;
                the message names the flag.
        """
        by_flag = {flag_name(spec.name): spec for spec in dataclasses.fields(cls)}
        hints = typing.get_type_hints(cls)
        values: dict[str, object] = {}
        for arg in args:
            flag, has_value, raw = arg.partition("=")
            spec = by_flag.get(flag)
            if spec is None:
                known = ", ".join(sorted(by_flag))
                raise ValueError(f"{flag}: not a flag of TritonServerConfig (known: {known})")
            try:
                if spec.metadata.get("switch"):
                    if has_value:
                        raise ValueError("takes no value")
                    values[spec.name] = True
                elif spec.metadata.get("repeated"):
                    values[spec.name] = (*values.get(spec.name, ()), raw)
                else:
                    values[spec.name] = _parse(hints[spec.name], raw)
            except ValueError as exc:
                raise ValueError(f"{flag}: {exc}") from exc
        return cls(**values)


def flag_name(field_name: str) -> str:
    """The tritonserver flag of a ``TritonServerConfig`` field: ``http_port`` -> ``--http-port``."""
    return "--" + field_name.replace("_", "-")


FLAGS = frozenset(flag_name(spec.name) for spec in dataclasses.fields(TritonServerConfig))


def _render(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Restriction):
        return value.render()
    return str(value)


def _parse(hint: object, raw: str) -> object:
    kinds = set(typing.get_args(hint)) - {type(None)} or {hint}
    if bool in kinds:
        if raw not in ("true", "false"):
            raise ValueError(f"expected true or false, got {raw!r}")
        return raw == "true"
    if int in kinds:
        return int(raw)
    if Restriction in kinds:
        return Restriction.parse(raw)
    return raw


@functools.lru_cache(maxsize=8)
def binary_options(binary: Path) -> frozenset[str]:
    """The ``--options`` a tritonserver binary lists in its ``--help`` (run once per binary).

    Raises:
        ServerError: the binary cannot be run.
    """
    try:
        out = subprocess.run(
            [str(binary), "--help"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServerError(f"cannot run {binary} --help: {exc}") from exc
    return frozenset(re.findall(r"^\s*(--[a-z0-9-]+)", out.stdout + out.stderr, re.MULTILINE))


def for_binary(
    binary: Path,
    restriction: Restriction,
    *,
    allow_open_admin_apis: bool,
    http_max_input_size: int,
    **fields: object,
) -> TritonServerConfig:
    """``TritonServerConfig(**fields)`` plus the flags that depend on what ``binary`` lists.

    The admin APIs are closed with ``restriction`` (``--http-restricted-api`` and
    ``--grpc-restricted-protocol``, or the ``--grpc-restricted-api`` spelling some builds list);
    configs are never auto-completed (``--disable-auto-complete-config``, else the deprecated
    ``--strict-model-config=true``); ``--http-max-input-size`` is passed where it exists
    (Triton 25.x+, not 2.51).

    Raises:
        ServerError: the binary cannot restrict the admin APIs and ``allow_open_admin_apis`` is
            False.
    """
    options = binary_options(binary)
    grpc_flag = next(
        (f for f in ("--grpc-restricted-protocol", "--grpc-restricted-api") if f in options), None
    )
    http_restricted = "--http-restricted-api" in options
    missing = [flag for flag, present in (("--http-restricted-api", http_restricted),
                                          ("--grpc-restricted-protocol", grpc_flag is not None))
               if not present]
    if missing and not allow_open_admin_apis:
        raise ServerError(
            f"tritonserver {binary} has no {' / '.join(missing)}, so its admin APIs "
            f"({', '.join(RESTRICTED_APIS)}) would be open to any caller; use a Triton that "
            f"has it, or accept open admin APIs with `tools serve --allow-open-admin-apis` "
            f"or {OPEN_ADMIN_ENV}=1"
        )
    switch = "--disable-auto-complete-config" in options
    return TritonServerConfig(
        **fields,
        disable_auto_complete_config=switch,
        strict_model_config=None if switch else True,
        http_max_input_size=http_max_input_size if "--http-max-input-size" in options else None,
        http_restricted_api=restriction if http_restricted else None,
        grpc_restricted_protocol=restriction if grpc_flag == "--grpc-restricted-protocol" else None,
        grpc_restricted_api=restriction if grpc_flag == "--grpc-restricted-api" else None,
    )
