"""The gateway's ASGI app (Starlette): the OpenAI and TEI routes over the served pipelines.

At start the app reads the pipelines from Triton (retrying until Triton is ready); until then
every route answers 503 in its API's shape. Each POST reads the body (bounded), picks the
pipeline (OpenAI: the body's ``model``; TEI: the gateway's rule), and lets the route of that
pipeline's kind answer. Every failure is an ``ApiError`` answered in the route's own API's
error shape; anything unexpected is logged and answered as a backend error, never a bare 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route as StarletteRoute

from tools.api import openai_routes, tei_routes
from tools.api.kinds import KINDS, paths
from tools.api.pipelines import discover
from tools.api.route import Api, Kind
from tools.api.state import Gateway, Limits
from tools.api.triton import TritonBackend
from tools.errors import (
    ApiBackendError,
    ApiBodyTooLarge,
    ApiError,
    ApiInvalidRequest,
    ApiUnavailable,
)

logger = logging.getLogger("tools.api")
DISCOVERY_RETRY_S = 1.0
ERROR_SHAPES = {Api.OPENAI: openai_routes.error, Api.TEI: tei_routes.error}


def json_response(content: Any, status: int = 200) -> Response:
    """``content`` as JSON (NumPy arrays included, float32 in their shortest form)."""
    return Response(orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY), status,
                    media_type="application/json")


def error_response(api: Api, exc: ApiError) -> Response:
    """``exc`` in ``api``'s own error shape and status."""
    status, body = ERROR_SHAPES[api](exc)
    return json_response(body, status)


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The request's JSON object, read up to ``limit`` bytes.

    Raises:
        ApiBodyTooLarge: the body (as declared or as read) is longer than ``limit``.
        ApiInvalidRequest: it is not JSON, or not a JSON object.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ApiBodyTooLarge(f"the request body is {declared} bytes, above the limit of "
                              f"{limit} bytes")
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise ApiBodyTooLarge(f"the request body is over the limit of {limit} bytes")
        parts.append(part)
    try:
        body = orjson.loads(b"".join(parts))
    except orjson.JSONDecodeError as exc:
        raise ApiInvalidRequest(f"the request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiInvalidRequest("the request body must be a JSON object")
    return body


def _api_of(path: str, kinds: Sequence[Kind]) -> Api:
    return next(r.api for k in kinds for r in k.routes if r.path == path)


def _gateway(request: Request) -> Gateway:
    return request.app.state.gateway


def _post(path: str, api: Api):
    async def endpoint(request: Request) -> Response:
        try:
            gateway = _gateway(request)
            body = await read_json(request, gateway.limits.max_body_bytes)
            if api is Api.OPENAI:
                if "model" not in body:
                    raise ApiInvalidRequest("model is required: the name of a served pipeline "
                                            "(GET /v1/models lists them)", "model")
                pipeline = gateway.named(path, body["model"])
            else:
                pipeline = gateway.default(path)
            route = pipeline.kind.route(path)
            return json_response(await route.serve(gateway, pipeline, body))
        except ApiError as exc:
            return error_response(api, exc)
        except Exception as exc:  # noqa: BLE001 - answered in the API's shape, and logged
            logger.exception("%s failed", path)
            return error_response(api, ApiBackendError(
                f"the gateway failed: {type(exc).__name__}: {exc}"))

    return endpoint


async def _models(request: Request) -> Response:
    try:
        return json_response(openai_routes.models(_gateway(request)))
    except ApiError as exc:
        return error_response(Api.OPENAI, exc)


async def _model(request: Request) -> Response:
    try:
        return json_response(openai_routes.model(_gateway(request),
                                                 request.path_params["model"]))
    except ApiError as exc:
        return error_response(Api.OPENAI, exc)


async def _info(request: Request) -> Response:
    try:
        return json_response(tei_routes.info(_gateway(request)))
    except ApiError as exc:
        return error_response(Api.TEI, exc)


async def health_problem(gateway: Gateway) -> ApiError | None:
    """Why the gateway cannot serve now (None: Triton and every pipeline found are ready)."""
    try:
        served = gateway.serving()
    except ApiUnavailable as exc:
        return exc
    backend = gateway.backend
    if not await backend.ready():
        return ApiUnavailable(f"Triton at {backend.url} is not ready")
    names = sorted(served)
    ready = await asyncio.gather(*(backend.model_ready(n) for n in names))
    down = [n for n, ok in zip(names, ready) if not ok]
    return ApiUnavailable(f"pipelines not ready: {', '.join(down)}") if down else None


async def _health(request: Request) -> Response:
    problem = await health_problem(_gateway(request))
    return error_response(Api.TEI, problem) if problem else Response(status_code=200)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    api = Api.OPENAI if request.url.path.startswith("/v1/") else Api.TEI
    error = ApiInvalidRequest(f"{request.method} {request.url.path}: {exc.detail}")
    status, body = ERROR_SHAPES[api](error)
    return json_response(body, exc.status_code)


async def discover_when_ready(gateway: Gateway, kinds: Sequence[Kind] = KINDS) -> None:
    """Read the pipelines from Triton as soon as it is ready (retrying), then log them."""
    while True:
        if await gateway.backend.ready():
            try:
                pipelines, notes = await discover(gateway.backend, gateway.repository, kinds)
            except ApiError as exc:
                logger.warning("reading the pipelines failed, retrying: %s", exc)
            else:
                gateway.notes = notes
                gateway.pipelines = pipelines
                for note in notes:
                    logger.warning("left out: %s", note)
                for name, pipeline in sorted(pipelines.items()):
                    logger.warning("serving %s (%s): %s", name, pipeline.kind.name,
                                   ", ".join(r.path for r in pipeline.kind.routes))
                if not pipelines:
                    logger.warning("no pipeline of %s is of a kind the APIs serve",
                                   gateway.repository)
                return
        await asyncio.sleep(DISCOVERY_RETRY_S)


def create_app(triton_url: str, repository: Path, limits: Limits = Limits(),
               tei_models: Sequence[str] = (), kinds: Sequence[Kind] = KINDS) -> Starlette:
    """The gateway in front of Triton's HTTP endpoint ``triton_url`` (``host:port``), serving
    the pipelines of ``repository`` (the model repository that Triton serves)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        backend = TritonBackend(triton_url)
        gateway = Gateway(backend, Path(repository), limits, tuple(tei_models))
        app.state.gateway = gateway
        task = asyncio.ensure_future(discover_when_ready(gateway, kinds))
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await backend.close()

    routes = [StarletteRoute(path, _post(path, _api_of(path, kinds)), methods=["POST"])
              for path in paths(kinds)]
    routes += [
        StarletteRoute(openai_routes.MODELS_PATH, _models, methods=["GET"]),
        StarletteRoute(openai_routes.MODELS_PATH + "/{model:path}", _model, methods=["GET"]),
        StarletteRoute(tei_routes.INFO_PATH, _info, methods=["GET"]),
        StarletteRoute(tei_routes.HEALTH_PATH, _health, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={HTTPException: _http_error})
