"""One definition of a healthy Triton server: live, every model ready, every probe answered.

A probe inference answered with any error means the model is not alive. ``tools serve``, the
compose healthcheck and watchdog (docker/) and the tests all call ``check``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from tools.errors import ServerError, UserInputError

_REASON_CHARS = 300
_JSON_DTYPES = {"TYPE_STRING": "BYTES"}

Request = Mapping[str, Any]  # a KServe v2 JSON inference request body


@dataclass(frozen=True)
class ModelHealth:
    """One model's result.

    Attributes:
        model: The model name.
        probed: A real inference was sent to it.
        problem: Why it is not alive (one line); None when it is.
    """

    model: str
    probed: bool = False
    problem: str | None = None

    @property
    def alive(self) -> bool:
        """Ready and, if probed, answered the probe with outputs."""
        return self.problem is None


@dataclass(frozen=True)
class HealthReport:
    """What ``check`` found.

    Attributes:
        url: The HTTP endpoint checked (``host:port``).
        models: One result per model checked.
        server_problem: Why the server as a whole failed (not live, no models); None if it did not.
    """

    url: str
    models: tuple[ModelHealth, ...] = ()
    server_problem: str | None = None

    @property
    def healthy(self) -> bool:
        """The server is live and every model is alive."""
        return not self.problems

    @property
    def problems(self) -> list[str]:
        """Every problem, one line each: the server's, then each model's."""
        found = [self.server_problem] if self.server_problem else []
        return found + [m.problem for m in self.models if m.problem]


def _short(text: object) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= _REASON_CHARS else line[: _REASON_CHARS - 3] + "..."


def _host_port(url: str) -> str:
    return url.removeprefix("http://").rstrip("/")


@contextlib.contextmanager
def client(url: str, timeout_s: float) -> Iterator[httpclient.InferenceServerClient]:
    """A tritonclient HTTP client of ``url`` (``host:port``, ``http://`` optional), then closed."""
    triton = httpclient.InferenceServerClient(
        _host_port(url), connection_timeout=timeout_s, network_timeout=timeout_s
    )
    try:
        yield triton
    finally:
        triton.close()


def probe_request(config: Mapping[str, Any]) -> dict[str, Any]:
    """A minimal valid-shaped request from a model config: zeros, one row, strings "health"."""
    batching = int(config.get("max_batch_size", 0)) > 0
    inputs = []
    for spec in config.get("input", []):
        if spec.get("optional"):
            continue
        dims = [1 if int(d) < 0 else int(d) for d in spec.get("dims", [])]
        shape = ([1] if batching else []) + dims
        count = int(np.prod(shape, dtype=np.int64))
        dtype = spec["data_type"]
        datatype = _JSON_DTYPES.get(dtype, dtype.removeprefix("TYPE_"))
        if datatype == "BOOL":
            data: list[Any] = [False] * count
        elif datatype == "BYTES":
            data = ["health"] * count
        else:
            data = [0] * count
        inputs.append({"name": spec["name"], "shape": shape, "datatype": datatype, "data": data})
    return {"inputs": inputs}


def infer_inputs(request: Request) -> list[httpclient.InferInput]:
    """The tritonclient inputs of a KServe v2 JSON request body (sent as JSON, as written).

    Raises:
        UserInputError: an input lacks a field, or its data does not fit its shape or datatype.
    """
    inputs = []
    for spec in request.get("inputs", []):
        try:
            name, datatype = spec["name"], spec["datatype"]
            shape = [int(d) for d in spec["shape"]]
            flat = np.asarray(spec["data"], dtype=np.object_).reshape(-1)
            if datatype == "BYTES":
                values = [v.encode() if isinstance(v, str) else v for v in flat]
                array = np.array(values, dtype=np.object_).reshape(shape)
            else:
                array = flat.astype(triton_to_np_dtype(datatype)).reshape(shape)
        except (KeyError, TypeError, ValueError) as exc:
            raise UserInputError(f"probe input {spec.get('name', '?')!r}: {exc}") from exc
        infer_input = httpclient.InferInput(name, shape, datatype)
        infer_input.set_data_from_numpy(array, binary_data=False)
        inputs.append(infer_input)
    return inputs


def read_probes(path: Path | None) -> dict[str, dict[str, Any]]:
    """A probe file: JSON object, model name -> KServe v2 JSON request ({} without a file).

    Raises:
        UserInputError: the file is unreadable, not JSON, not an object of objects, or a
            request's data does not fit its shape or datatype.
    """
    if path is None:
        return {}
    try:
        probes = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserInputError(f"probe file {path}: {exc}") from exc
    if not isinstance(probes, dict) or not all(isinstance(v, dict) for v in probes.values()):
        raise UserInputError(f"probe file {path}: expected an object of model name -> request")
    for model, request in probes.items():
        try:
            infer_inputs(request)
        except UserInputError as exc:
            raise UserInputError(f"probe file {path}: model '{model}': {exc}") from exc
    return probes


def repository_models(repository: Path) -> list[str]:
    """Every model folder of a repository (a folder holding config.pbtxt)."""
    return sorted(p.parent.name for p in Path(repository).glob("*/config.pbtxt"))


def _not_ready(triton: httpclient.InferenceServerClient, model: str) -> str:
    """The problem of a model that is not ready, with Triton's reason (from its metadata)."""
    try:
        triton.get_model_metadata(model)
    except InferenceServerException as exc:
        return f"model '{model}' not ready: {_short(exc.message())}"
    except OSError as exc:
        return f"model '{model}' not ready: {_short(exc)}"
    return f"model '{model}' not ready"


def _probe(
    triton: httpclient.InferenceServerClient, model: str, request: Request | None
) -> str | None:
    """Send one probe inference; the problem, or None when it answered with outputs."""
    try:
        if request is None:
            request = probe_request(triton.get_model_config(model))
        result = triton.infer(model, infer_inputs(request))
    except InferenceServerException as exc:
        reason = f"HTTP {exc.status()} {_short(exc.message())}"
        return f"model '{model}' failed its probe inference: {reason}"
    except OSError as exc:
        return f"model '{model}' did not answer its probe inference: {_short(exc)}"
    if not (result.get_response() or {}).get("outputs"):
        return f"model '{model}' answered its probe inference without outputs"
    return None


def _check_model(
    triton: httpclient.InferenceServerClient,
    model: str,
    probes: Mapping[str, Request],
    synthetic: bool,
) -> ModelHealth:
    try:
        ready = triton.is_model_ready(model)
    except OSError as exc:
        return ModelHealth(model, problem=f"model '{model}' did not answer: {_short(exc)}")
    if not ready:
        return ModelHealth(model, problem=_not_ready(triton, model))
    if model not in probes and not synthetic:
        return ModelHealth(model)
    return ModelHealth(model, probed=True, problem=_probe(triton, model, probes.get(model)))


def check(
    url: str,
    models: Iterable[str] | None = None,
    *,
    probes: Mapping[str, Request] | None = None,
    synthetic: bool = False,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 10.0,
) -> HealthReport:
    """Probe a server model by model: readiness, then a real inference where asked.

    Triton 2.51 keeps reporting a model ready after its Python stub died; only a request reaches
    the stub. A model is alive when it is ready and every probe sent to it answered with
    outputs: a probe answered with an error (a dead stub, or a request the model rejects) means
    it is not.

    Args:
        url: The HTTP endpoint, ``host:port`` or ``http://host:port``.
        models: Models to check; defaults to the repository index (an admin API: give
            ``headers`` that open it).
        probes: Model -> KServe v2 JSON request to send it; models not named get none, unless
            ``synthetic``.
        synthetic: Probe every other model with a request made from its config (zeros, one row,
            the string "health").
        headers: Headers for the repository index.
        timeout_s: Per-request timeout.

    Returns:
        The report; ``report.healthy`` is the verdict and ``report.problems`` says why not.
    """
    url = _host_port(url)
    probes = probes or {}
    with client(url, timeout_s) as triton:
        try:
            live = triton.is_server_live()
        except OSError as exc:
            return HealthReport(url, server_problem=f"server at {url} does not answer: {exc}")
        if not live:
            return HealthReport(url, server_problem=f"server at {url} is not live")
        if models is None:
            try:
                index = triton.get_model_repository_index(headers=dict(headers or {}))
            except (InferenceServerException, OSError) as exc:
                problem = f"cannot list the models of {url} ({_short(exc)}); name them"
                return HealthReport(url, server_problem=problem)
            models = [entry["name"] for entry in index]
        results = [_check_model(triton, model, probes, synthetic) for model in models]
    if not results:
        return HealthReport(url, server_problem=f"server at {url} serves no models")
    return HealthReport(url, tuple(results))


def check_repository(
    url: str, repository: Path, probes: Mapping[str, Request], timeout_s: float
) -> HealthReport:
    """``check`` every model folder of ``repository`` (the container's view: no admin key),
    probing the models ``probes`` names."""
    models = repository_models(repository)
    if not models:
        return HealthReport(_host_port(url), server_problem=f"no models in {repository}")
    return check(url, models, probes=probes, timeout_s=timeout_s)


class _Served(Protocol):
    http_url: str
    admin_headers: dict[str, str]
    log_path: Path


def health_check(
    server: _Served | str,
    models: Iterable[str] | None = None,
    *,
    probes: Mapping[str, Request] | None = None,
    synthetic: bool = True,
    timeout_s: float = 10.0,
) -> HealthReport:
    """``check`` a running server and raise unless it is healthy.

    Args:
        server: An ``EmbeddedServer`` or the ``host:port`` of an HTTP endpoint.
        models: Models to check; defaults to every model in the repository index.
        probes: Model -> KServe v2 JSON request to send it.
        synthetic: Probe every model without an entry in ``probes`` with a request made from
            its config; False checks only their readiness.
        timeout_s: Per-request timeout.

    Returns:
        The healthy report.

    Raises:
        ServerError: the server is not live, or some model is not alive; the message names
            each such model (and the server log, for an ``EmbeddedServer``).
    """
    embedded = not isinstance(server, str)
    report = check(
        server.http_url if embedded else server,
        models,
        probes=probes,
        synthetic=synthetic,
        headers=server.admin_headers if embedded else None,
        timeout_s=timeout_s,
    )
    if not report.healthy:
        log_hint = f" (server log: {server.log_path})" if embedded else ""
        raise ServerError("; ".join(report.problems) + log_hint)
    return report
