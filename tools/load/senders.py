"""How a request goes: one class per client backend (tritonclient gRPC / HTTP aio, raw HTTP).

A sender prepares each ``Request`` once (client tensors, or the bytes of an HTTP request),
opens its connections for at most ``slots`` requests in flight, and sends one prepared request
per ``send`` call: it returns the response, or raises with a one-line message. ``check`` (given
to the sender) looks at each successful response and raises to count it as failed.
"""

from __future__ import annotations

import asyncio
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from tools.load.request import Request, triton_dtype

CLIENT_TIMEOUT = "client timeout"


class SendError(Exception):
    """A failed request; the message is what the records keep."""


class Sender(ABC):
    """One client backend. Subclasses set ``kind`` and ``protocol`` and implement the steps.

    Args:
        url: ``host:port`` of the endpoint.
        timeout_s: Per-request client timeout (None: none); past it the request fails with
            "client timeout".
        check: Called with each successful response; raising counts the request as failed.
    """

    kind: ClassVar[str] = ""  # the name ``sender_for`` knows it by
    protocol: ClassVar[str] = ""  # the wire protocol a ``Point`` reports
    uvloop: ClassVar[bool] = False  # runs on uvloop's event loop (``engine.run_loop``)

    def __init__(self, url: str, *, timeout_s: float | None = None,
                 check: Callable[[Any], None] | None = None) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.check = check

    @abstractmethod
    def prepare(self, request: Request) -> Any:
        """What ``send`` needs for ``request``, built once before the load."""

    @abstractmethod
    async def open(self, slots: int) -> None:
        """Connect for at most ``slots`` requests in flight (on the running event loop)."""

    @abstractmethod
    async def _send(self, prepared: Any) -> Any:
        """Send one prepared request; return the response or raise."""

    @abstractmethod
    async def close(self) -> None:
        """Release the connections."""

    async def send(self, prepared: Any) -> Any:
        """Send one prepared request, apply ``check``; raises on a failure."""
        response = await self._send(prepared)
        if self.check is not None:
            self.check(response)
        return response


class _TritonClient(Sender):
    """A sender over one of tritonclient's aio modules; tensors go as binary data."""

    binary: ClassVar[dict[str, bool]] = {}  # the tensor options of the module (binary data over HTTP)

    def __init__(self, url: str, module: Any, **options: Any) -> None:
        super().__init__(url, **options)
        self._module = module
        self._client: Any = None

    def prepare(self, request: Request) -> Any:
        mod = self._module
        inputs = []
        for name, array in request.inputs.items():
            item = mod.InferInput(name, list(array.shape), triton_dtype(array))
            item.set_data_from_numpy(array, **self.binary)
            inputs.append(item)
        outputs = [mod.InferRequestedOutput(n, **self.binary) for n in request.outputs] or None
        return request.model, inputs, outputs

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


class TritonGrpc(_TritonClient):
    """``tritonclient.grpc.aio``: one channel, binary tensors."""

    kind = protocol = "grpc"

    def __init__(self, url: str, **options: Any) -> None:
        import tritonclient.grpc.aio as module

        super().__init__(url, module, **options)

    async def open(self, slots: int) -> None:
        self._client = self._module.InferenceServerClient(self.url)

    async def _send(self, prepared: Any) -> Any:
        model, inputs, outputs = prepared
        try:
            return await self._client.infer(model, inputs, outputs=outputs,
                                            client_timeout=self.timeout_s)
        except self._module.InferenceServerException as exc:
            if "Deadline Exceeded" in str(exc):
                raise SendError(CLIENT_TIMEOUT) from exc
            raise


class TritonHttp(_TritonClient):
    """``tritonclient.http.aio``: a keep-alive pool of ``slots`` connections, binary tensors."""

    kind = protocol = "http"
    binary: ClassVar[dict[str, bool]] = {"binary_data": True}

    def __init__(self, url: str, **options: Any) -> None:
        import tritonclient.http.aio as module

        super().__init__(url, module, **options)

    async def open(self, slots: int) -> None:
        self._client = self._module.InferenceServerClient(self.url, conn_limit=max(slots, 1))

    async def _send(self, prepared: Any) -> Any:
        model, inputs, outputs = prepared
        call = self._client.infer(model, inputs, outputs=outputs)
        if self.timeout_s is None:
            return await call
        try:
            return await asyncio.wait_for(call, self.timeout_s)
        except asyncio.TimeoutError:
            raise SendError(CLIENT_TIMEOUT) from None


def http_request_bytes(host: str, path: str, body: bytes,
                       headers: Mapping[str, str] | None = None) -> bytes:
    """The bytes of one keep-alive HTTP/1.1 POST of ``body`` (JSON) to ``path``."""
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"{extra}Content-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("connection closed by the server")
    status = int(status_line.split()[1])
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        name = name.strip().lower()
        if name == "content-length":
            length = int(value.strip())
        elif name == "transfer-encoding" and "chunked" in value.lower():
            raise ValueError("chunked HTTP responses are not supported by the raw sender")
    return status, await reader.readexactly(length)


def _error_of(body: bytes) -> str:
    try:
        return str(json.loads(body).get("error", ""))[:200]
    except (ValueError, AttributeError):
        return body[:200].decode(errors="replace")


class RawHttp(Sender):
    """Raw HTTP/1.1 bytes over keep-alive sockets: the body is sent exactly as prepared.

    For fault tests (hostile bodies, shapes, slow servers) and servers that are not Triton: one
    request in flight per connection, at most ``slots`` connections; a request that finds every
    connection busy waits for one. A non-200 answer fails as ``HTTP <status> <error>``; a
    timeout or a broken connection drops the connection (the next request reconnects).

    Args:
        url: ``host:port``.
        headers: Extra request headers.
        timeout_s: Per-request client timeout (default 10 s).
        check: Called with each 200 answer's body.
    """

    kind, protocol = "raw-http", "http"
    uvloop = True  # plain asyncio streams: about half the CPU per request on uvloop

    def __init__(self, url: str, *, headers: Mapping[str, str] | None = None,
                 timeout_s: float | None = 10.0,
                 check: Callable[[bytes], None] | None = None) -> None:
        super().__init__(url, timeout_s=timeout_s, check=check)
        self.headers = dict(headers or {})
        self._idle: asyncio.Queue | None = None
        self._connections: list[list[Any]] = []

    def prepare(self, request: Request) -> bytes:
        return http_request_bytes(self.url, request.http_path, request.http_body(), self.headers)

    async def open(self, slots: int) -> None:
        self._idle = asyncio.Queue()
        self._connections = [[None, None] for _ in range(max(slots, 1))]
        for conn in self._connections:
            self._idle.put_nowait(conn)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host, _, port = self.url.rpartition(":")
        return await asyncio.open_connection(host, int(port))

    def _wait(self, step: Any) -> Any:
        return step if self.timeout_s is None else asyncio.wait_for(step, self.timeout_s)

    async def _send(self, prepared: bytes) -> bytes:
        assert self._idle is not None, "open() first"
        conn = await self._idle.get()
        try:
            if conn[0] is None:
                conn[:] = await self._wait(self._connect())
            conn[1].write(prepared)
            status, body = await self._wait(_read_response(conn[0]))
        except asyncio.TimeoutError:
            self._drop(conn)
            raise SendError(CLIENT_TIMEOUT) from None
        except (OSError, ConnectionError, ValueError, asyncio.IncompleteReadError) as exc:
            self._drop(conn)
            raise SendError(f"{type(exc).__name__}: {exc}"[:200]) from exc
        except BaseException:
            self._drop(conn)  # cancelled mid-request: the connection's state is unknown
            raise
        finally:
            self._idle.put_nowait(conn)
        if status != 200:
            raise SendError(f"HTTP {status} {_error_of(body)}")
        return body

    @staticmethod
    def _drop(conn: list[Any]) -> None:
        if conn[1] is not None:
            conn[1].close()
        conn[:] = [None, None]

    async def close(self) -> None:
        for conn in self._connections:
            self._drop(conn)
        self._connections = []


SENDERS: dict[str, type[Sender]] = {s.kind: s for s in (TritonGrpc, TritonHttp, RawHttp)}


def sender_for(kind: str, url: str, **options: Any) -> Sender:
    """A sender of ``kind`` (``grpc``, ``http``, ``raw-http``) to ``url``.

    Raises:
        ValueError: an unknown kind (naming the known ones).
    """
    try:
        sender = SENDERS[kind]
    except KeyError:
        raise ValueError(f"unknown sender {kind!r} (known: {', '.join(SENDERS)})") from None
    return sender(url, **options)
