"""How a request goes: one class per client backend (tritonclient gRPC / HTTP aio, raw HTTP).

A sender prepares each ``Request`` once (client tensors, or the bytes of an HTTP request),
opens its connections for at most ``slots`` requests in flight, and sends one prepared request
per ``send`` call: it returns the response, or raises with a one-line message. ``check`` (given
to the sender) looks at each successful response and raises to count it as failed.
"""

from __future__ import annotations

import asyncio
import collections
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


def error_of(body: bytes) -> str:
    """The `error` of a JSON error body (KServe v2), else its first 200 bytes."""
    try:
        return str(json.loads(body).get("error", ""))[:200]
    except (ValueError, AttributeError):
        return body[:200].decode(errors="replace")


MAX_RESPONSE_HEAD_BYTES = 64 * 1024  # a response head longer than this breaks the connection


class _Connection(asyncio.Protocol):
    """One keep-alive connection of ``RawHttp``: parses each response as its bytes arrive.

    At most one request is in flight on it; ``answer`` is the future of that request's
    ``(status, body)``. Bytes that arrive with no request in flight are kept for the next one
    (a server that answers early is read in order).
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.answer: asyncio.Future | None = None
        self.status = 0
        self.length: int | None = None  # the body length once the head is read
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.answer is not None and not self.answer.done():
            self._parse()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(ConnectionError("connection closed by the server"))

    def request(self, prepared: bytes, loop: asyncio.AbstractEventLoop) -> asyncio.Future:
        """Send ``prepared``; the future gets ``(status, body)`` or the error."""
        self.answer = loop.create_future()
        self.transport.write(prepared)
        if self.buf:
            self._parse()
        return self.answer

    def _parse(self) -> None:
        try:
            if self.length is None:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(self.buf) > MAX_RESPONSE_HEAD_BYTES:
                        raise ValueError(f"response head over {MAX_RESPONSE_HEAD_BYTES} bytes")
                    return
                self.status, self.length = _response_head(bytes(self.buf[:end]))
                del self.buf[:end + 4]
            if len(self.buf) < self.length:
                return
            body = bytes(self.buf[:self.length])
            del self.buf[:self.length]
            self.length = None
            self.answer.set_result((self.status, body))
        except ValueError as exc:
            self.answer.set_exception(exc)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def _response_head(head: bytes) -> tuple[int, int]:
    """The status and the ``Content-Length`` (0 without one) of a response head.

    Raises:
        ValueError: a malformed status line, or a chunked response.
    """
    lines = head.split(b"\r\n")
    try:
        status = int(lines[0].split()[1])
    except IndexError:
        raise ValueError(f"malformed status line {lines[0][:100]!r}") from None
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value.strip())
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            raise ValueError("chunked HTTP responses are not supported by the raw sender")
    return status, length


class RawHttp(Sender):
    """Raw HTTP/1.1 bytes over keep-alive sockets: the body is sent exactly as prepared.

    For fault tests (hostile bodies, shapes, slow servers), servers that are not Triton, and
    overload runs at many times a server's capacity on the cores it shares: one request in
    flight per connection, at most ``slots`` connections; a request that finds every
    connection busy waits for one. A non-200 answer fails as ``HTTP <status> <error>``; a
    timeout or a broken connection drops the connection (the next request reconnects). Each
    connection is an ``asyncio.Protocol`` that parses responses as they arrive and each
    timeout a timer, not a task: 123-134 µs of CPU a request at 800 req/s against a server that
    answers at once, against 140-153 over asyncio streams (Zen 4, uvloop); the rest is the
    kernel's loopback TCP, which a shared core pays whoever sends.

    Args:
        url: ``host:port``.
        headers: Extra request headers.
        timeout_s: Per-request client timeout (default 10 s).
        check: Called with each 200 answer's body.
    """

    kind, protocol = "raw-http", "http"
    uvloop = True  # about half the CPU per request on uvloop

    def __init__(self, url: str, *, headers: Mapping[str, str] | None = None,
                 timeout_s: float | None = 10.0,
                 check: Callable[[bytes], None] | None = None) -> None:
        super().__init__(url, timeout_s=timeout_s, check=check)
        self.headers = dict(headers or {})
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: list[list[Any]] = []  # slots: [connection or None]
        self._waiting: collections.deque[asyncio.Future] = collections.deque()
        self._slots: list[list[Any]] = []

    def prepare(self, request: Request) -> bytes:
        return http_request_bytes(self.url, request.http_path, request.http_body(), self.headers)

    async def open(self, slots: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._slots = [[None] for _ in range(max(slots, 1))]
        self._idle = list(self._slots)
        self._waiting.clear()

    async def _acquire(self) -> list[Any]:
        if self._idle:
            return self._idle.pop()
        waiter = self._loop.create_future()
        self._waiting.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._free(waiter.result())  # handed a slot just as it was cancelled
            raise

    def _free(self, slot: list[Any]) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(slot)
                return
        self._idle.append(slot)

    async def _connect(self) -> _Connection:
        host, _, port = self.url.rpartition(":")
        connect = self._loop.create_connection(_Connection, host, int(port))
        if self.timeout_s is not None:
            connect = asyncio.wait_for(connect, self.timeout_s)
        return (await connect)[1]

    @staticmethod
    def _timed_out(answer: asyncio.Future) -> None:
        if not answer.done():
            answer.set_exception(asyncio.TimeoutError())

    async def _send(self, prepared: bytes) -> bytes:
        assert self._loop is not None, "open() first"
        slot = await self._acquire()
        timer = None
        try:
            if slot[0] is None or slot[0].lost:
                slot[0] = await self._connect()
            answer = slot[0].request(prepared, self._loop)
            if self.timeout_s is not None:
                timer = self._loop.call_later(self.timeout_s, self._timed_out, answer)
            status, body = await answer
        except asyncio.TimeoutError:
            self._drop(slot)
            raise SendError(CLIENT_TIMEOUT) from None
        except (OSError, ConnectionError, ValueError) as exc:
            self._drop(slot)
            raise SendError(f"{type(exc).__name__}: {exc}"[:200]) from exc
        except BaseException:
            self._drop(slot)  # cancelled mid-request: the connection's state is unknown
            raise
        finally:
            if timer is not None:
                timer.cancel()
            self._free(slot)
        if status != 200:
            raise SendError(f"HTTP {status} {error_of(body)}")
        return body

    @staticmethod
    def _drop(slot: list[Any]) -> None:
        if slot[0] is not None:
            slot[0].close()
        slot[0] = None

    async def close(self) -> None:
        for slot in self._slots:
            self._drop(slot)
        self._slots, self._idle = [], []


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
