"""Abstract tritonclient Locust users, one per protocol; the scenario comes from ``--scenario``.

Every call is reported through Locust's request event with its exact latency. Closed loop: each
user sends, waits for the answer, sends again. Open loop (``--arrival-rate``): each user is a
dispatcher that starts one request greenlet per arrival tick and times it from the tick, so a
slow server cannot slow the load down and hide its latency.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import gevent
import numpy as np
from locust import User, task

from loadtests import scenarios
from tools.load.request import Request, triton_dtype
from tools.load.scenario import Scenario

CLIENT_TIMEOUT_S = 60.0
DEFAULT_MAX_INFLIGHT = 256
_OPEN_GRPC_CLIENTS: set[Any] = set()
_user_seed = itertools.count()


class ResponseError(Exception):
    """A response arrived but does not satisfy the scenario's contract check."""


class RequestFailed(Exception):
    """What Locust and the recorder see for a failed request: one line naming the cause."""


class DroppedRequest(Exception):
    """An open-loop arrival found ``--max-inflight`` requests outstanding and was not sent."""


def strip_scheme(url: str) -> str:
    """tritonclient wants ``host:port``: drop ``http://``/``grpc://`` and a trailing slash."""
    for prefix in ("http://", "https://", "grpc://"):
        url = url.removeprefix(prefix)
    return url.rstrip("/")


def close_grpc_clients() -> int:
    """Close every gRPC client still open; returns how many were closed.

    Must run while the gevent hub still runs (a Locust ``quitting`` listener): a gevent-mode gRPC
    channel closed later, by ``__del__`` during interpreter shutdown, blocks forever on a lock.
    """
    closed = 0
    for client in list(_OPEN_GRPC_CLIENTS):
        _OPEN_GRPC_CLIENTS.discard(client)
        try:
            client.close()
        except Exception as exc:  # noqa: BLE001 - best effort at shutdown, never fatal
            logging.getLogger("loadtests").warning("closing a gRPC client failed: %s", exc)
        closed += 1
    return closed


def _response_bytes(outputs: Mapping[str, np.ndarray]) -> int:
    total = 0
    for array in outputs.values():
        if array.dtype == np.object_:
            total += sum(len(v) for v in array.reshape(-1))
        else:
            total += array.nbytes
    return total


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]


class TritonUser(User):
    """Sends a scenario's payloads to Triton and reports each call with its exact latency.

    Subclasses per protocol implement ``_connect``, ``_build_inputs``, ``_infer`` and ``_close``.
    The scenario is ``--scenario`` of ``--spec`` (``loadtests.scenarios``); a concrete user may
    name a ``default_scenario`` for runs without the option.
    """

    abstract = True
    protocol: ClassVar[str] = ""
    default_scenario: ClassVar[str] = ""
    host = "127.0.0.1:8000"

    def __init__(self, environment) -> None:
        super().__init__(environment)
        options = environment.parsed_options
        self.scenario: Scenario = scenarios.chosen(options, self.default_scenario)
        rate = float(getattr(options, "arrival_rate", 0) or 0)
        users = max(int(getattr(options, "num_users", 1) or 1), 1)
        self._rate_per_user = rate / users
        self._max_inflight = int(getattr(options, "max_inflight", 0) or DEFAULT_MAX_INFLIGHT)
        self._inflight: set[gevent.Greenlet] = set()
        self._next_tick = 0.0
        seed = next(_user_seed)
        order = list(range(len(self.scenario.requests)))
        random.Random(seed).shuffle(order)
        self._order = itertools.cycle(order)
        self._inputs: dict[int, Any] = {}

    # -- protocol hooks -------------------------------------------------------------------
    def _connect(self, url: str, pool: int) -> None:
        raise NotImplementedError

    def _build_inputs(self, request: Request) -> Any:
        raise NotImplementedError

    def _infer(self, inputs: Any) -> Mapping[str, np.ndarray]:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError

    # -- Locust life cycle ----------------------------------------------------------------
    def on_start(self) -> None:
        """Connect; an open-loop dispatcher starts its ticks at a random phase."""
        pool = self._max_inflight if self._rate_per_user else 1
        self._connect(strip_scheme(self.host), pool)
        if self._rate_per_user:
            self._next_tick = time.perf_counter() + random.random() / self._rate_per_user

    def on_stop(self) -> None:
        """Let open-loop requests in flight finish (bounded), then close the client."""
        if self._inflight:
            timeout = self.environment.stop_timeout or CLIENT_TIMEOUT_S
            gevent.joinall(list(self._inflight), timeout=timeout)
            gevent.killall(list(self._inflight), block=True, timeout=5)
        self._close()

    def wait_time(self) -> float:
        """Closed loop: no think time. Open loop: sleep until the next arrival tick."""
        if not self._rate_per_user:
            return 0.0
        return max(0.0, self._next_tick - time.perf_counter())

    @task
    def send(self) -> None:
        """Closed loop: one timed request. Open loop: dispatch the request of the next tick."""
        if not self._rate_per_user:
            self._timed_call(time.perf_counter())
            return
        scheduled = self._next_tick
        self._next_tick += 1.0 / self._rate_per_user
        delay = scheduled - time.perf_counter()
        if delay > 0:
            gevent.sleep(delay)
        if len(self._inflight) >= self._max_inflight:
            self._fire(scheduled, "", 0, DroppedRequest(f"{self._max_inflight} requests in flight"))
            return
        greenlet = gevent.spawn(self._timed_call, scheduled)
        self._inflight.add(greenlet)
        greenlet.link(self._inflight.discard)

    # -- one request ----------------------------------------------------------------------
    def _timed_call(self, start: float) -> None:
        index = next(self._order)
        request = self.scenario.requests[index]
        inputs = self._inputs.get(index)
        if inputs is None:
            inputs = self._inputs[index] = self._build_inputs(request)
        exception: BaseException | None = None
        size = 0
        try:
            size, problem = self._answer(request, inputs)
            if problem:
                exception = ResponseError(problem)
        except Exception as exc:  # noqa: BLE001 - every failure is a recorded error
            exception = exc
        self._fire(start, self.scenario.labels[index], size, exception)

    def _answer(self, request: Request, inputs: Any) -> tuple[int, str | None]:
        """Send one request; its answer's size and what breaks the scenario's contract."""
        outputs = self._infer(inputs)
        return _response_bytes(outputs), self.scenario.check(request, outputs)

    def _fire(self, start: float, label: str, size: int, exception: BaseException | None) -> None:
        latency_ms = (time.perf_counter() - start) * 1000.0
        self.environment.events.request.fire(
            request_type=self.protocol,
            name=self.scenario.model,
            response_time=latency_ms,
            response_length=size,
            response=None,
            exception=None if exception is None else RequestFailed(_one_line(exception)),
            context={"scenario": self.scenario.name, "start_perf": start, "payload": label},
        )


class TritonHttpUser(TritonUser):
    """HTTP/REST through ``tritonclient.http`` (geventhttpclient: cooperative under Locust)."""

    abstract = True
    protocol = "http"

    def _connect(self, url: str, pool: int) -> None:
        import tritonclient.http as httpclient

        self._mod = httpclient
        self.client = httpclient.InferenceServerClient(
            url,
            concurrency=pool,
            connection_timeout=CLIENT_TIMEOUT_S,
            network_timeout=CLIENT_TIMEOUT_S,
        )
        self._outputs = [
            httpclient.InferRequestedOutput(name, binary_data=True)
            for name in self.scenario.output_names
        ]

    def _build_inputs(self, request: Request) -> list[Any]:
        inputs = []
        for name, array in request.inputs.items():
            item = self._mod.InferInput(name, list(array.shape), triton_dtype(array))
            item.set_data_from_numpy(array, binary_data=True)
            inputs.append(item)
        return inputs

    def _infer(self, inputs: Any) -> Mapping[str, np.ndarray]:
        result = self.client.infer(self.scenario.model, inputs, outputs=self._outputs)
        return {name: result.as_numpy(name) for name in self.scenario.output_names}

    def _close(self) -> None:
        client = getattr(self, "client", None)
        if client is not None:
            client.close()
            self.client = None


class TritonGrpcUser(TritonUser):
    """gRPC through ``tritonclient.grpc``; the locustfile calls ``init_gevent()`` before any channel."""

    abstract = True
    protocol = "grpc"

    def _connect(self, url: str, pool: int) -> None:
        import tritonclient.grpc as grpcclient

        self._mod = grpcclient
        self.client = grpcclient.InferenceServerClient(url)
        _OPEN_GRPC_CLIENTS.add(self.client)
        self._outputs = [
            grpcclient.InferRequestedOutput(name) for name in self.scenario.output_names
        ]

    def _build_inputs(self, request: Request) -> list[Any]:
        inputs = []
        for name, array in request.inputs.items():
            item = self._mod.InferInput(name, list(array.shape), triton_dtype(array))
            item.set_data_from_numpy(array)
            inputs.append(item)
        return inputs

    def _infer(self, inputs: Any) -> Mapping[str, np.ndarray]:
        result = self.client.infer(
            self.scenario.model, inputs, outputs=self._outputs, client_timeout=CLIENT_TIMEOUT_S
        )
        return {name: result.as_numpy(name) for name in self.scenario.output_names}

    def _close(self) -> None:
        client = getattr(self, "client", None)
        if client is not None:
            _OPEN_GRPC_CLIENTS.discard(client)
            client.close()
            self.client = None



class ApiUser(TritonUser):
    """The scenario through the gateway's OpenAI or TEI route (``tools/api``): the same texts as
    JSON of that API, over geventhttpclient (cooperative under Locust). The answer must hold one
    row per row sent. ``protocol`` stays ``http``: the SLO file's HTTP targets gate it."""

    abstract = True
    protocol = "http"
    api: ClassVar[str] = ""

    def _connect(self, url: str, pool: int) -> None:
        from geventhttpclient import HTTPClient

        from tools.api.client import scenario_route

        host, _, port = url.rpartition(":")
        self.client = HTTPClient(host, int(port), concurrency=pool,
                                 connection_timeout=CLIENT_TIMEOUT_S,
                                 network_timeout=CLIENT_TIMEOUT_S)
        self._route = scenario_route(self.scenario, self.api)

    def _build_inputs(self, request: Request) -> Any:
        from tools.api.client import api_request

        prepared = api_request(self._route, request)
        return prepared.http_path, prepared.http_body()

    def _answer(self, request: Request, inputs: Any) -> tuple[int, str | None]:
        from tools.api.client import problem

        path, body = inputs
        response = self.client.post(path, body=body, headers={"Content-Type": "application/json"})
        data = response.read()
        if response.status_code != 200:
            raise RequestFailed(f"HTTP {response.status_code} {data[:200].decode(errors='replace')}")
        return len(data), problem(self._route, request, data)

    def _close(self) -> None:
        client = getattr(self, "client", None)
        if client is not None:
            client.close()
            self.client = None
