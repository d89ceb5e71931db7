"""Where trials are served: an embedded tritonserver restarted per trial, or a running server
whose models are reloaded through the admin-keyed model-repository API (``--url``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from google.protobuf import json_format
from tritonclient.utils import InferenceServerException

from tools.build_repo.config import parse_config
from tools.errors import ServerError, UserInputError
from tools.serve import health
from tools.serve.server_log import one_line

ADMIN_KEY_ENV = "TRITON_ADMIN_KEY"
COMPOSE_ADMIN_HEADER = "admin-key"  # docker-compose.yml and the Kubernetes manifests
_GRPC_PREFIX = "triton-grpc-protocol-"
# Triton's answer to a load when the server does not run with --model-control-mode=explicit.
_NO_CONTROL = "explicit model load / unload is not allowed"


class EmbeddedTarget:
    """A fresh embedded tritonserver on each trial's repository (clean state every trial).

    Args:
        logs: Folder for each trial's server log.
        start_timeout_s: How long loading the pipeline may take.
    """

    kind = "embedded"

    def __init__(self, logs: Path, start_timeout_s: float = 300.0) -> None:
        self.logs = logs
        self.start_timeout_s = start_timeout_s
        self._server = None

    def serve(self, repository: Path, changed: Sequence[str],
              trial: int | str) -> tuple[str, str]:
        """Stop the last trial's server, start one on ``repository``; (HTTP, gRPC) endpoints."""
        from tools.serve.server import EmbeddedServer

        self.close()
        self.logs.mkdir(parents=True, exist_ok=True)
        self._server = EmbeddedServer(repository, log_path=self.logs / f"trial-{trial}.log",
                                      exit_timeout_s=5)
        self._server.start(timeout_s=self.start_timeout_s)
        return self._server.http_url, self._server.grpc_url

    def stopped(self) -> str | None:
        """Why the server is no longer serving, or None while it is."""
        code = self._server.poll() if self._server is not None else None
        if code is None:
            return None
        return (f"the embedded tritonserver exited (code {code}) during the trial "
                f"(server log: {self._server.log_path})")

    def close(self) -> None:
        """Stop the server, if one runs."""
        if self._server is not None:
            self._server.stop()
            self._server = None


class RemoteTarget:
    """A running server (the compose stack): each trial reloads the models whose knobs changed.

    The config of a changed model is sent with the load (Triton's config override), so the
    server's own repository folder is not written; at the end every model gets back the config
    it had. Needs the admin key (``$TRITON_ADMIN_KEY``) and ``--model-control-mode=explicit``.

    Args:
        http_url: ``host:port`` of its HTTP endpoint.
        grpc_url: ``host:port`` of its gRPC endpoint.
        models: The pipeline's models (the ones that may be reloaded), then the pipeline.
        admin_header: The header name the server expects the key in.
        key: The admin key; defaults to ``$TRITON_ADMIN_KEY``.
    """

    kind = "remote"

    def __init__(self, http_url: str, grpc_url: str, models: Sequence[str], pipeline: str,
                 admin_header: str = COMPOSE_ADMIN_HEADER, key: str | None = None) -> None:
        self.http_url, self.grpc_url = http_url, grpc_url
        self.models, self.pipeline = list(models), pipeline
        key = key if key is not None else os.environ.get(ADMIN_KEY_ENV, "")
        if not key:
            raise UserInputError(
                f"--url {http_url}: set {ADMIN_KEY_ENV} to the server's admin key; tools tune "
                f"changes the server's models through its model-repository API, which answers "
                f"only callers with the key")
        self.headers = {admin_header: key, f"{_GRPC_PREFIX}{admin_header}": key}
        self._original: dict[str, str] = {}

    def check(self) -> None:
        """The server answers, holds the pipeline, and lets this key load models.

        Raises:
            ServerError: it does not answer, refuses the key, lacks a model, or does not allow
                loading models (``--model-control-mode`` none or poll, compose's default).
        """
        with health.client(self.http_url, timeout_s=10.0) as triton:
            try:
                index = triton.get_model_repository_index(headers=self.headers)
            except (InferenceServerException, OSError) as exc:
                raise ServerError(f"--url {self.http_url}: the model-repository API refused or "
                                  f"did not answer ({one_line(str(exc))}); is {ADMIN_KEY_ENV} "
                                  f"the server's admin key?") from exc
            ready = {e["name"] for e in index if e.get("state") == "READY"}
            missing = [m for m in [*self.models, self.pipeline] if m not in ready]
            if missing:
                raise ServerError(f"--url {self.http_url}: not ready there: {', '.join(missing)}")
            for model in self.models:
                self._original[model] = json.dumps(triton.get_model_config(model))
        # A load of the config the model already has: changes nothing, proves loads are allowed.
        self._load(self.models[0], self._original[self.models[0]])

    def _load(self, model: str, config: str) -> None:
        with health.client(self.http_url, timeout_s=300.0) as triton:
            try:
                triton.load_model(model, headers=self.headers, config=config)
            except (InferenceServerException, OSError) as exc:
                text = exc.message() if isinstance(exc, InferenceServerException) else str(exc)
                if _NO_CONTROL in str(text):
                    raise ServerError(
                        f"--url {self.http_url}: the server does not let tools tune change its "
                        f"models: it runs without --model-control-mode=explicit; restart it with "
                        f"explicit model control (as docker-compose.yml does), or tune the "
                        f"embedded server (no --url)") from exc
                raise ServerError(f"--url {self.http_url}: load of {model!r} failed: "
                                  f"{one_line(str(text))}") from exc
        self._wait_ready([model, self.pipeline])

    def _wait_ready(self, models: Sequence[str], timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        with health.client(self.http_url, timeout_s=10.0) as triton:
            while True:
                try:
                    if all(triton.is_model_ready(m) for m in models):
                        return
                except (InferenceServerException, OSError):
                    pass
                if time.monotonic() > deadline:
                    raise ServerError(f"--url {self.http_url}: {', '.join(models)} not ready "
                                      f"{timeout_s:g} s after the reload")
                time.sleep(0.5)

    def serve(self, repository: Path, changed: Sequence[str],
              trial: int | str) -> tuple[str, str]:
        """Reload each changed model with the config the trial build wrote for it."""
        for model in changed:
            message = parse_config((repository / model / "config.pbtxt").read_text(),
                                   repository / model / "config.pbtxt")
            self._load(model, json_format.MessageToJson(message, preserving_proto_field_name=True))
        return self.http_url, self.grpc_url

    def stopped(self) -> str | None:
        """Why the server is no longer serving, or None while it is live."""
        try:
            with health.client(self.http_url, timeout_s=5.0) as triton:
                if triton.is_server_live():
                    return None
        except (InferenceServerException, OSError) as exc:
            return f"the server at {self.http_url} stopped answering during the trial ({exc})"
        return f"the server at {self.http_url} reports it is not live"

    def close(self) -> None:
        """Give every model back the config it had before tuning (best effort)."""
        for model, config in self._original.items():
            try:
                self._load(model, config)
            except ServerError:
                pass


def changed_models(before: Mapping[str, object] | None, after: Mapping[str, object]) -> list[str]:
    """Models whose knobs differ between two settings (all of them when there is no before)."""
    return [m for m, k in after.items() if before is None or before.get(m) != k]
