"""What the front needs to know, read from a model repository: its models, each one's P99
objective (``admission_p99_ms``, rendered by ``tools build-repo`` from the SLO file), and limits.

The plan is read from the ``config.pbtxt`` files, so the front rendered for a repository always
matches the models it serves, on every path (the spec and the SLO file reach it through them).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.errors import UserInputError

P99_PARAMETER = "admission_p99_ms"  # tools/build_repo/admission.py renders it
# What the front routes to the OpenAI/TEI gateway (tools.api.kinds.front_paths, which this must
# equal: the build renders the front without importing the gateway): a prefix ends in "/".
GATEWAY_PATHS = ("/v1/", "/embed", "/rerank", "/predict", "/info", "/health")
MIB = 1 << 20
# Triton model names are file names; HAProxy names allow these characters (and the front's
# routing rules compare them as plain strings).
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class Limits:
    """What the front refuses before tritonserver sees a byte of it.

    Attributes:
        max_body_bytes: Largest HTTP request body (Content-Length); larger: 413 unread.
        max_grpc_message_bytes: Largest gRPC message (its length prefix); larger:
            RESOURCE_EXHAUSTED, the message never forwarded.
        request_timeout_s: A client that has not sent its request head (and, for inference, the
            part of the body the front reads) within this long gets 408.
        idle_timeout_s: How long an idle client connection is kept.
        server_timeout_s: How long an inference may take before the front answers 504.
        refusal_hold_s: How long an admission refusal is held before it is sent (a closed-loop
            client retrying at once would otherwise spin on refusals).
    """

    max_body_bytes: int = 16 * MIB
    max_grpc_message_bytes: int = 16 * MIB
    request_timeout_s: int = 30
    idle_timeout_s: int = 60
    server_timeout_s: int = 300
    refusal_hold_s: float = 0.2


@dataclass(frozen=True)
class FrontPlan:
    """The models the front routes, with their objectives, and its limits.

    Attributes:
        objectives: Model name -> P99 objective in ms, for every model that has one: each gets
            its own per-model backends (HTTP and gRPC) whose in-flight cap admission sets.
        models: Every model of the repository (those without an objective share one backend).
        limits: The request limits.
        gateway_paths: HTTP paths (prefixes ending in ``/``, else exact) routed to the
            OpenAI/TEI gateway (``GATEWAY_PATHS``); empty: none.
    """

    objectives: dict[str, float]
    models: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)
    gateway_paths: tuple[str, ...] = GATEWAY_PATHS

    @classmethod
    def from_repository(cls, repository: Path, limits: Limits | None = None,
                        gateway_paths: tuple[str, ...] = GATEWAY_PATHS) -> FrontPlan:
        """The plan of the models in ``repository`` (each ``<model>/config.pbtxt``).

        Raises:
            UserInputError: a config cannot be parsed, or a model name cannot be routed.
        """
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2

        configs = {}
        for path in sorted(Path(repository).glob("*/config.pbtxt")):
            if path.parent.name.startswith("."):
                continue
            try:
                configs[path.parent.name] = text_format.Parse(
                    path.read_text(), model_config_pb2.ModelConfig())
            except text_format.ParseError as exc:
                raise UserInputError(f"{path}: {exc}") from exc
        return cls.from_configs(configs, limits, gateway_paths)

    @classmethod
    def from_configs(cls, configs: Mapping[str, Any], limits: Limits | None = None,
                     gateway_paths: tuple[str, ...] = GATEWAY_PATHS) -> FrontPlan:
        """The plan of ``configs`` (model name -> ``ModelConfig`` message).

        Raises:
            UserInputError: a model name cannot be routed.
        """
        objectives: dict[str, float] = {}
        for name, config in configs.items():
            if not _NAME.match(name):
                raise UserInputError(f"model name {name!r} has characters the front cannot "
                                     "route (letters, digits, '_', '.', '-' only)")
            parameter = config.parameters.get(P99_PARAMETER)
            p99 = objective_of(parameter.string_value if parameter is not None else None)
            if p99 is not None:
                objectives[name] = p99
        return cls(objectives, tuple(sorted(configs)), limits or Limits(), tuple(gateway_paths))

def objective_of(value: str | None) -> float | None:
    """An ``admission_p99_ms`` parameter's value as a positive number of ms, else None."""
    try:
        p99 = float(value) if value is not None else None
    except ValueError:
        return None
    return p99 if p99 and p99 > 0 else None
