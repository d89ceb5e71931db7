"""What a route and a kind are: a route's API, path, how the gateway serves it and how a load
test calls it; a kind's tensors and routes, and how a pipeline's tensors find its kind.

The kinds themselves are the table of ``tools/api/kinds.py``; each API module
(``openai_routes``, ``tei_routes``) defines its routes and its error shape.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class Api(str, enum.Enum):
    """The APIs the gateway speaks."""

    OPENAI = "openai"
    TEI = "tei"

    def __str__(self) -> str:
        return self.value


# (tools.api.state.Gateway, tools.api.pipelines.Pipeline, the request's JSON) -> the answer
Serve = Callable[[Any, Any, Mapping[str, Any]], Awaitable[Any]]
# Client side: the JSON body of one request for rows of text by ensemble input name (``TEXT``,
# ``TEXT_PAIR``), and the rows an answer holds.
Body = Callable[[str, Mapping[str, Sequence[str]]], dict[str, Any]]
Rows = Callable[[Any], int]


@dataclass(frozen=True)
class Route:
    """One POST route of an API.

    Attributes:
        api: The API it belongs to (its error shape, how it picks the pipeline).
        path: The HTTP path.
        serve: Answers a request body for one pipeline (a JSON-ready object).
        body: Client side: the request body for rows of text (load tests, ``tools bench``).
        rows: Client side: how many rows an answer holds (its check).
    """

    api: Api
    path: str
    serve: Serve
    body: Body
    rows: Rows


@dataclass(frozen=True)
class Kind:
    """A kind of pipeline and the routes that serve it.

    Attributes:
        name: Its name (in ``/info`` and in errors).
        inputs: The ensemble's inputs, exactly.
        outputs: Outputs the ensemble has (others may be there too).
        routes: The routes that serve it, in order.
        tei_type: Its ``model_type`` in TEI's ``/info`` (embedding, reranker, classifier).
    """

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    routes: tuple[Route, ...]
    tei_type: str

    def route(self, path: str) -> Route | None:
        """Its route of ``path`` (None: it has none)."""
        return next((r for r in self.routes if r.path == path), None)

    def route_of(self, api: Api) -> Route | None:
        """Its first route of ``api`` (what a load test through that API sends)."""
        return next((r for r in self.routes if r.api is api), None)

    def matches(self, inputs: Iterable[str], outputs: Iterable[str]) -> bool:
        """A pipeline of these tensor names is of this kind: its inputs exactly, its outputs
        at least."""
        return sorted(inputs) == sorted(self.inputs) and set(self.outputs) <= set(outputs)


def kind_of(kinds: Sequence[Kind], inputs: Iterable[str], outputs: Iterable[str]) -> Kind | None:
    """The first kind whose signature ``inputs``/``outputs`` match (spec tensors or a config's)."""
    inputs, outputs = list(inputs), list(outputs)
    return next((k for k in kinds if k.matches(inputs, outputs)), None)
