"""The API gateway's cost (``tools bench --api-cost``): each pipeline the OpenAI/TEI routes
serve, through the gateway and straight to Triton, in one run.

Both arms send the same requests (the pipeline's scenario: the same texts, as many per request)
with the same raw HTTP sender at the same concurrency: KServe v2 JSON to Triton's
``/v2/models/<pipeline>/infer`` (outputs asked as binary data, so Triton writes no float as
text), and the API's JSON to the gateway, which calls that same Triton.
Rounds alternate the arms (direct first in even rounds) so a machine that slows down weighs on
both; each round's ratio is through / direct. The gateway's own CPU over each through-window,
per request, is the part of its cost that the noise of shared cores moves least.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tools import load
from tools.api.client import api_request, rows, scenario_route
from tools.api.route import Api
from tools.errors import UserInputError
from tools.load import Point, Request

Say = Callable[[str], None]
GATEWAY = "gateway"  # the role of the gateway's process in the through-arm's Cores meter


@dataclass
class ApiCost:
    """One pipeline at one concurrency, through its route and direct, round by round.

    Attributes:
        pipeline: The pipeline.
        path: The route the gateway arm went through (``/v1/embeddings``, ``/rerank`` ...).
        concurrency: Requests in flight.
        rows_per_request: Mean texts (or pairs) per request, over the requests sent.
        direct: Per round, the point straight to Triton.
        through: Per round, the point through the gateway.
    """

    pipeline: str
    path: str
    concurrency: int
    rows_per_request: float
    direct: list[Point] = field(default_factory=list)
    through: list[Point] = field(default_factory=list)

    @property
    def ratios(self) -> list[float]:
        """Per round, throughput through the gateway over direct."""
        return [t.throughput / d.throughput if d.throughput else 0.0
                for d, t in zip(self.direct, self.through)]

    @property
    def gateway_us(self) -> list[float | None]:
        """Per round, the gateway's CPU per request through it (µs; None: not metered)."""
        out = []
        for point in self.through:
            cores = (point.meters.get("cores") or {}).get(GATEWAY)
            answered = point.requests + point.errors
            out.append(cores * point.seconds / answered * 1e6 if cores is not None and answered
                       else None)
        return out

    @property
    def median_ratio(self) -> float:
        """The median of the rounds' ratios."""
        return statistics.median(self.ratios) if self.ratios else 0.0

    def to_dict(self) -> dict[str, Any]:
        """For bench.json."""
        return {"pipeline": self.pipeline, "path": self.path, "concurrency": self.concurrency,
                "rows_per_request": self.rows_per_request,
                "direct": [p.to_dict() for p in self.direct],
                "through": [p.to_dict() for p in self.through],
                "ratios": self.ratios, "median_ratio": self.median_ratio,
                "gateway_cpu_us_per_request": self.gateway_us}


def _texts_per_s(point: Point, rows_per_request: float) -> str:
    return f"{point.throughput * rows_per_request:.1f}"


def round_line(cost: ApiCost, index: int) -> str:
    """One round: texts/s and P99 of both arms, and their ratio."""
    d, t = cost.direct[index], cost.through[index]
    p99 = lambda p: "-" if p.p99_ms is None else f"{p.p99_ms:.0f}"  # noqa: E731
    cpu = cost.gateway_us[index]
    return (f"  round {index + 1}: direct {_texts_per_s(d, cost.rows_per_request)} texts/s "
            f"(P99 {p99(d)} ms, errors {d.errors}), through {cost.path} "
            f"{_texts_per_s(t, cost.rows_per_request)} texts/s (P99 {p99(t)} ms, errors "
            f"{t.errors}{'' if cpu is None else f', gateway CPU {cpu:.0f} us a request'}): "
            f"{cost.ratios[index]:.3f}")


def cost_line(cost: ApiCost) -> str:
    """The summary: the gateway's throughput over direct Triton HTTP, each round's ratio."""
    ratios = " / ".join(f"{r:.3f}" for r in cost.ratios)
    return (f"API gateway cost {cost.pipeline} c={cost.concurrency} "
            f"({cost.rows_per_request:.1f} texts a request): through {cost.path} / direct "
            f"KServe v2 = {cost.median_ratio:.3f} (median of {len(cost.ratios)} rounds: "
            f"{ratios})")


def binary_outputs(request: Request) -> Request:
    """``request`` as KServe v2 JSON whose outputs come back as binary data."""
    body = json.loads(request.http_body())
    body["outputs"] = [{"name": name, "parameters": {"binary_data": True}}
                       for name in request.outputs]
    return Request.json(request.model, body)


def route_of(scenario: Any) -> Any | None:
    """The route a pipeline is measured through: OpenAI's where its kind has one, else TEI's;
    None when the APIs do not serve it."""
    for api in (Api.OPENAI, Api.TEI):
        try:
            return scenario_route(scenario, api)
        except UserInputError:
            continue
    return None


def measure(targets: Sequence[Any], triton_url: str, gateway_url: str, *,
            levels: Sequence[int], rounds: int, warmup_s: float, duration_s: float,
            say: Say, gateway_pid: int | None = None) -> list[ApiCost]:
    """Every target the APIs serve, at each concurrency, ``rounds`` rounds each.

    Args:
        targets: ``tools.bench.targets.Target``s (their scenario's requests are sent).
        triton_url: ``host:port`` of Triton's HTTP endpoint (the one the gateway calls).
        gateway_url: ``host:port`` of the gateway.
        levels: Concurrency levels.
        rounds: Rounds per level; arms alternate (direct first in even rounds).
        warmup_s, duration_s: Of each point.
        say: Progress lines.
        gateway_pid: The gateway's process, metered over each through-window (None: not).
    """
    costs = []
    for target in targets:
        route = route_of(target.scenario)
        if route is None:
            say(f"API gateway cost: {target.name} is of no kind the APIs serve; left out")
            continue
        direct = [binary_outputs(r) for r in target.requests]
        through = [api_request(route, r) for r in target.requests]
        per_request = sum(rows(r) for r in target.requests) / len(direct)
        for level in levels:
            cost = ApiCost(target.name, route.path, level, per_request)
            for index in range(rounds):
                metered = [load.Cores({GATEWAY: [gateway_pid]})] if gateway_pid else []
                arms = [(direct, triton_url, cost.direct, []),
                        (through, gateway_url, cost.through, metered)]
                for requests, url, points, meters in (arms if index % 2 == 0 else arms[::-1]):
                    point = load.run(requests, load.sender_for("raw-http", url),
                                     load.ClosedLoop(level), warmup_s=warmup_s,
                                     duration_s=duration_s, meters=meters)
                    points.append(point)
                say(round_line(cost, index))
            say(cost_line(cost))
            costs.append(cost)
    return costs
