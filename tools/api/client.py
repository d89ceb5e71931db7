"""A scenario's requests as an API's requests: what ``tools loadtest --api`` and ``tools bench
--api-cost`` send through the gateway, the same texts as the KServe v2 requests they mirror.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from tools.api.kinds import kind_of_tensors
from tools.api.route import Api, Route
from tools.errors import UserInputError
from tools.load.request import Request


def route_for(name: str, inputs: Iterable[str], outputs: Iterable[str], api: Api | str) -> Route:
    """The route of ``api`` a pipeline of these tensors is loaded through (its kind's first).

    Raises:
        UserInputError: the pipeline is of no kind the APIs serve, or ``api`` has no route for
            its kind.
    """
    api = Api(api)
    inputs, outputs = list(inputs), list(outputs)
    kind = kind_of_tensors(inputs, outputs)
    if kind is None:
        raise UserInputError(f"{name} ({', '.join(inputs)} -> {', '.join(outputs)}) is of no "
                             "kind the OpenAI/TEI routes serve (docs/api.md)")
    route = kind.route_of(api)
    if route is None:
        apis = sorted({str(r.api) for r in kind.routes})
        raise UserInputError(f"{name} is a {kind.name} pipeline, which the {api} API does not "
                             f"serve; use --api {' or '.join(apis)}")
    return route


def _columns(request: Request) -> dict[str, list[str]]:
    columns = {}
    for name, array in request.inputs.items():
        if array.dtype.kind != "O" or array.ndim != 2 or array.shape[1] != 1:
            raise UserInputError(f"{request.model}: input {name} is not text rows [n, 1]: the "
                                 "API routes take texts")
        columns[name] = [bytes(v).decode("utf-8") for v in array[:, 0]]
    return columns


def api_request(route: Route, request: Request) -> Request:
    """``request`` (KServe v2 tensors of text) as one request of ``route``: the same texts."""
    body = route.body(request.model, _columns(request))
    return Request.json(request.model, orjson.dumps(body), path=route.path)


def rows(request: Request) -> int:
    """The rows (texts, pairs) of a request."""
    return int(next(iter(request.inputs.values())).shape[0])


def problem(route: Route, request: Request, answer: bytes) -> str | None:
    """Why an answer of ``route`` to ``request`` is wrong (None: it holds a row per row sent)."""
    try:
        got = route.rows(orjson.loads(answer))
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        return f"the answer is not {route.api}'s shape: {exc}"
    expected = rows(request)
    return None if got == expected else f"{got} rows answered for {expected} sent"


def scenario_tensors(scenario: Any) -> tuple[list[str], list[str]]:
    """The input and output names of a scenario (``tools.load.scenario.Scenario``)."""
    return [s.name for s in scenario.sources], list(scenario.output_names)


def scenario_route(scenario: Any, api: Api | str) -> Route:
    """``route_for`` the scenario's pipeline."""
    inputs, outputs = scenario_tensors(scenario)
    return route_for(scenario.name, inputs, outputs, api)

