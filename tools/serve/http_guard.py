"""A bound on HTTP request size, and strict HTTP/1.1 framing, in front of tritonserver 2.51.

Triton 2.51 (the nvidia-pytriton wheel) has no ``--http-max-input-size``: it reads a whole body
into memory before any check, and a JSON request whose ``shape`` is huge (``[1, 2**40]``) makes
it allocate that many bytes and abort (``std::bad_alloc``), taking every model down. This guard
listens on the public HTTP port and forwards to tritonserver on a loopback port of its own,
one upstream connection per client connection (keep-alive kept, pipelined requests answered in
order). Before a body is read it refuses, with a JSON ``{"error": ...}`` naming the limit:

- a body over ``max_body_bytes`` (HTTP 413, the connection closed without reading it; an
  ``Expect: 100-continue`` client is refused before it sends anything);
- a body over 64 KiB when the bodies being read already hold ``max_buffered_bytes`` (HTTP 503;
  smaller bodies, such as every text request, are not counted);
- ``Transfer-Encoding`` without ``Content-Length`` (HTTP 411: Triton's clients always send one);
- a request line over ``MAX_REQUEST_LINE_BYTES`` (414), a header section over ``MAX_HEAD_BYTES``
  or ``MAX_HEADERS`` lines (431), a client that sends too slowly (408);
- any head that RFC 9112 does not frame one way only (HTTP 400): bare LF or CR line endings,
  obs-fold (a line starting with SP/HTAB), whitespace or any other non-token byte before the
  colon, control bytes in a value, a malformed request line or version, a ``Content-Length``
  that is duplicated, a list, signed, not digits or over 18 digits, ``Content-Length`` together
  with ``Transfer-Encoding``, no or several ``Host`` in HTTP/1.1, a duplicated or non-digit
  ``Inference-Header-Content-Length`` or one longer than the body.

Every such refusal closes the connection (after the answer, lingering briefly so the client
reads it). What goes upstream is what the guard parsed, serialised anew (request line, then
each header as ``Name: value``; ``Expect`` answered here and ``Upgrade`` dropped), never the
client's own head bytes, so tritonserver cannot read a request the guard did not see.

Once the body is read, an ``Admission`` may refuse an inference request per model (HTTP 503
with ``Retry-After``; the default admits all). It decides first, so a refused request costs no
JSON or gzip decoding (an overloaded server spends least on what it turns away). An admitted
request with an input whose ``shape`` is negative or holds more elements than the body has bytes
is then refused (HTTP 400, its admission released): every element takes at least one byte in
JSON and in binary tensor data alike, so only a shape that cannot match its data is refused
(inputs in shared memory are left to Triton).

Run by ``EmbeddedServer(http_guard=...)`` (``python -m tools.serve.http_guard --listen-port P
--upstream-port U --watch-pid PID``) and by the CPU image's ``tritonserver`` wrapper
(docker/tritonserver-cpu.sh). Standard library only (uvloop's event loop when importable). It
exits when ``PID`` (tritonserver) is gone.
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import json
import math
import os
import re
import signal
import socket
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass

LOOPBACK = "127.0.0.1"
MAX_HEAD_BYTES = 64 * 1024  # request line and headers
MAX_REQUEST_LINE_BYTES = 8 * 1024
MAX_HEADERS = 100
SMALL_BODY_BYTES = 64 * 1024  # bodies up to this size are not counted against the budget
LINGER_S = 1.0  # after a refusal that closes: time the client gets to read it
_INFER_SUFFIX = b"/infer"

_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_REQUEST_LINE_PATTERN = rb"(" + _TOKEN + rb") ([!-~]+) HTTP/1\.([01])"
# field-name ":" OWS field-value OWS; a value holds visible bytes, SP and HTAB, never a CTL
# (no nested repetition: linear time on a 64 KiB head)
_FIELD_PATTERN = _TOKEN + rb":[\t !-~\x80-\xff]*"
_HEAD = re.compile(_REQUEST_LINE_PATTERN + rb"((?:\r\n" + _FIELD_PATTERN + rb")*)")
_REQUEST_LINE = re.compile(_REQUEST_LINE_PATTERN)
_FIELD = re.compile(_FIELD_PATTERN)
_DIGITS = re.compile(rb"[0-9]{1,18}")
# A "shape" of non-negative integers; with no backslash in the JSON every "shape" is a string
# delimited by its quotes, so a key "shape" cannot hide from this.
_SHAPES = re.compile(rb'"shape"[ \t\r\n]*:[ \t\r\n]*\[([0-9, \t\r\n]*)\]')
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([0-9]{3})(?: [^\r\n]*)?")
_NOT_FORWARDED = frozenset({b"expect", b"upgrade"})
_SINGLE = (b"content-length", b"host", b"inference-header-content-length", b"expect",
           b"content-encoding")
# Request body codings tritonserver decodes (src/data_compressor.h); bounded here first.
_CODINGS = {b"gzip": 16 + 15, b"deflate": 15, b"identity": None}


@dataclass(frozen=True)
class GuardLimits:
    """What the guard lets through.

    Attributes:
        max_body_bytes: The largest request body (docker-compose.yml's ``--http-max-input-size``).
        max_buffered_bytes: The most body bytes held by requests being read at once.
        read_timeout_s: How long a client may take to send its headers, or its body.
    """

    max_body_bytes: int = 16 * 2**20
    max_buffered_bytes: int = 64 * 2**20
    read_timeout_s: float = 30.0


# How long a refusal for an overloaded model is held before it is answered. A client that
# retries at once (a closed loop of users, a naive retry loop) otherwise spins: on 2 cores, 32
# users against a cap of ~27 sent ~1300 refusals/s, whose CPU (guard and clients) halved the
# encoder's throughput, and with it the cap, so goodput fell to 0.25-0.4 of capacity with P99 at
# 2-3x the objective. Held, each such client refuses at most 1/REFUSAL_HOLD_S times a second; an
# open loop's refusals only hold a connection that long. A timer, not CPU. At most
# MAX_HELD_REFUSALS are held at once per guard, the rest answered at once: a flood of refusals
# (an open loop at many times capacity) would otherwise hold a client's whole connection pool
# (1270 refusals/s x 0.2 s = 254 of 256 connections), and a hostile client the guard's timers.
REFUSAL_HOLD_S = 0.2
MAX_HELD_REFUSALS = 32


def refusal_hold_s(held: int) -> float:
    """How long to hold the next admission refusal while ``held`` are held already."""
    return REFUSAL_HOLD_S if held < MAX_HELD_REFUSALS else 0.0


class Refusal(Exception):
    """A request the guard answers itself: HTTP ``status`` with ``{"error": message}``, after
    ``hold_s`` (``REFUSAL_HOLD_S`` for an admission's refusal, else at once)."""

    def __init__(self, status: int, reason: str, message: str, *, close: bool = True,
                 headers: tuple[tuple[str, str], ...] = (), hold_s: float = 0.0) -> None:
        super().__init__(message)
        self.status, self.reason, self.close, self.headers = status, reason, close, headers
        self.hold_s = hold_s


def _bad(message: str) -> Refusal:
    return Refusal(400, "Bad Request", message)


class Overloaded(Exception):
    """Raised by an ``Admission`` to refuse a request (HTTP 503 with ``Retry-After``)."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Admission:
    """Decides per inference request whether it goes to tritonserver; this one admits all.

    A subclass (an SLO-aware gate) overrides ``admit``: raise ``Overloaded`` to refuse, or
    return a callable that the guard calls with the response status once it has been relayed
    (or with 0 when the request failed without one), e.g. to learn the model's latency.
    """

    def admit(self, model: str, size: int = 1) -> Callable[[int], None] | None:
        """Admit a request of ``size`` bytes (its body; gRPC: its message) to ``model`` (the
        ``/v2/models/<model>/.../infer`` path segment)."""
        return None


@dataclass
class Request:
    """A request head as the guard parsed it (and forwards it).

    Attributes:
        method: The method token.
        target: The request target (origin form, or ``*``).
        minor: 1 for HTTP/1.1, 0 for HTTP/1.0.
        fields: The header fields in order, ``(name as sent, value)``.
        length: The body length (``Content-Length``, else 0).
        header_length: ``Inference-Header-Content-Length``, or None.
        expect_continue: The client waits for ``100 Continue`` before its body.
        close: The connection closes after this request's response.
        coding: ``Content-Encoding`` (``gzip``, ``deflate``), or None.
    """

    method: bytes
    target: bytes
    minor: int
    fields: list[tuple[bytes, bytes]]
    length: int = 0
    header_length: int | None = None
    expect_continue: bool = False
    close: bool = False
    coding: bytes | None = None

    def head(self) -> bytes:
        """The head sent upstream: serialised from the parsed fields."""
        lines = [b"%s %s HTTP/1.%d" % (self.method, self.target, self.minor)]
        lines += [name + b": " + value for name, value in self.fields
                  if name.lower() not in _NOT_FORWARDED]
        return b"\r\n".join(lines) + b"\r\n\r\n"

    @property
    def is_infer(self) -> bool:
        """True for an inference request (a path that ends in ``/infer``)."""
        return self.target.split(b"?", 1)[0].endswith(_INFER_SUFFIX)

    @property
    def model(self) -> str | None:
        """The model of an inference request (``/v2/models/<model>[/versions/<v>]/infer``)."""
        path = self.target.split(b"?", 1)[0]
        if not path.endswith(_INFER_SUFFIX) or not path.startswith(b"/v2/models/"):
            return None
        return path[len(b"/v2/models/"):].split(b"/", 1)[0].decode("latin-1")


def parse_head(head: bytes) -> Request:
    """Parse a request head (without its final empty line) the one way RFC 9112 allows.

    Raises:
        Refusal: 400 for anything ambiguous or malformed, 414 / 431 over the size limits, 411
            for a body without ``Content-Length``, 417 for an expectation other than
            100-continue; each closes the connection.
    """
    match = _HEAD.fullmatch(head)  # one pass over the whole head; the details only on failure
    if match is None:
        raise _malformed(head)
    method, target, minor = match.group(1), match.group(2), int(match.group(3))
    if match.start(4) > MAX_REQUEST_LINE_BYTES:
        raise Refusal(414, "URI Too Long", f"request line over {MAX_REQUEST_LINE_BYTES} bytes")
    if not (target.startswith(b"/") or (target == b"*" and method == b"OPTIONS")):
        raise _bad(f"request target {target[:100]!r} is not a path")
    lines = match.group(4).split(b"\r\n")
    if len(lines) > MAX_HEADERS + 1:
        raise Refusal(431, "Request Header Fields Too Large", f"more than {MAX_HEADERS} headers")
    request = Request(method, target, minor, [])
    seen: dict[bytes, bytes] = {}
    connection = b""
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        value = value.strip(b" \t")
        key = name.lower()
        if b"_" in key and key.replace(b"_", b"-") in _SINGLE + (b"transfer-encoding",):
            raise _bad(f"header {name.decode('latin-1')!r}: an underscore in a framing header's "
                       f"name (a server behind may read it as {key.replace(b'_', b'-').decode()})")
        if key in seen and key in _SINGLE:
            raise _bad(f"more than one {name.decode('latin-1')} header")
        if key not in seen:
            seen[key] = value
        if key == b"connection":
            connection += b"," + value.lower()
        request.fields.append((name, value))
    if b"transfer-encoding" in seen:
        if b"content-length" in seen:
            raise _bad("Content-Length together with Transfer-Encoding (RFC 9112 section 6.3)")
        raise Refusal(411, "Length Required", "send the request body with a Content-Length "
                      "(chunked bodies are not accepted)")
    if minor == 1 and b"host" not in seen:
        raise _bad("HTTP/1.1 request without a Host header")
    raw = seen.get(b"content-length")
    if raw is not None:
        if _DIGITS.fullmatch(raw) is None:
            raise _bad(f"Content-Length {raw[:40].decode('latin-1')!r} is not a number of at "
                       f"most 18 digits")
        request.length = int(raw)
        if raw[:1] == b"0" and request.length:  # forwarded as the number it was read as
            request.fields = [(n, b"%d" % request.length if n.lower() == b"content-length" else v)
                              for n, v in request.fields]
    raw = seen.get(b"inference-header-content-length")
    if raw is not None:
        if _DIGITS.fullmatch(raw) is None or int(raw) > request.length:
            raise _bad(f"Inference-Header-Content-Length {raw[:40].decode('latin-1')!r} is not "
                       f"a number within the {request.length}-byte body")
        request.header_length = int(raw)
    expect = seen.get(b"expect")
    if expect is not None:
        if expect.lower() != b"100-continue":
            raise Refusal(417, "Expectation Failed",
                          f"expectation {expect[:40].decode('latin-1')!r} is not supported")
        request.expect_continue = True
    coding = seen.get(b"content-encoding")
    if coding is not None:
        if coding.lower() not in _CODINGS:
            raise Refusal(415, "Unsupported Media Type", f"Content-Encoding "
                          f"{coding[:40].decode('latin-1')!r} (tritonserver decodes gzip and "
                          f"deflate)")
        request.coding = None if coding.lower() == b"identity" else coding.lower()
    tokens = {t.strip() for t in connection.split(b",")}
    request.close = b"close" in tokens or (minor == 0 and b"keep-alive" not in tokens)
    return request


def _malformed(head: bytes) -> Refusal:
    """Why ``head`` does not parse, in words (the first problem, line by line)."""
    lines = head.split(b"\r\n")
    if len(lines[0]) > MAX_REQUEST_LINE_BYTES:
        return Refusal(414, "URI Too Long", f"request line over {MAX_REQUEST_LINE_BYTES} bytes")
    if head.count(b"\n") != len(lines) - 1 or head.count(b"\r") != len(lines) - 1:
        return _bad("a line of the request head ends in a bare LF or CR (only CRLF ends a line)")
    if _REQUEST_LINE.fullmatch(lines[0]) is None:
        return _bad(f"malformed request line {lines[0][:100]!r} (expected METHOD TARGET HTTP/1.x)")
    for line in lines[1:]:
        if _FIELD.fullmatch(line) is None:
            if line[:1] in (b" ", b"\t"):
                return _bad("obs-fold: a header line starts with whitespace (line folding is "
                            "not accepted)")
            return _bad(f"malformed header line {line[:100]!r} (expected Name: value, no "
                        f"whitespace before the colon, no control characters)")
    return _bad("malformed request head")


def _small_shapes(header: bytes, body_bytes: int) -> bool:
    """True when, without parsing the JSON, every ``shape`` in it is known to fit the body (the
    common case); False when that takes the JSON parser."""
    if b"\\" in header:
        return False
    shapes = _SHAPES.findall(header)
    if len(shapes) != header.count(b'"shape"'):
        return False
    try:
        return all(math.prod(int(d) for d in dims.split(b",")) <= body_bytes
                   for dims in shapes if dims.strip())
    except ValueError:  # e.g. [1,,2]
        return False


def shape_problem(header: bytes, body_bytes: int) -> str | None:
    """Why an inference request's JSON part cannot match its body, or None.

    ``header`` is the JSON part (the whole body, or its first ``Inference-Header-Content-Length``
    bytes); ``body_bytes`` the size of the whole body. Bodies that are not JSON objects are left
    to Triton, which answers them with its own error.
    """
    if _small_shapes(header, body_bytes):
        return None
    try:
        request = json.loads(header)
    except ValueError:
        return None
    inputs = request.get("inputs") if isinstance(request, dict) else None
    if not isinstance(inputs, list):
        return None
    for index, item in enumerate(inputs):
        if not isinstance(item, dict):
            continue
        name = item.get("name", f"#{index}")
        parameters = item.get("parameters")
        if isinstance(parameters, dict) and "shared_memory_region" in parameters:
            continue  # its data is not in the body
        shape = item.get("shape")
        if not isinstance(shape, list) or not all(type(d) is int for d in shape):
            continue  # Triton explains a malformed shape itself
        if any(d < 0 for d in shape):
            return f"input '{name}': shape {shape} has a negative dimension"
        elements = math.prod(shape)
        if elements > body_bytes:
            return (f"input '{name}': shape {shape} has {elements} elements, more than the "
                    f"{body_bytes}-byte request body can hold (the guard in front of "
                    f"tritonserver 2.51 refuses it: that server would try to allocate it)")
    return None


def decoded(body: bytes, coding: bytes, limit: int) -> bytes:
    """``body`` decoded from ``coding`` (gzip or deflate), at most ``limit`` bytes of it.

    Raises:
        Refusal: 413 when it decodes to more than ``limit`` bytes, 400 when it does not decode.
    """
    inflater = zlib.decompressobj(_CODINGS[coding])
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise _bad(f"request body is not valid {coding.decode()} data ({exc})") from None
    if len(data) > limit:
        raise Refusal(413, "Content Too Large", f"request body decodes ({coding.decode()}) to "
                      f"more than the limit of {limit} bytes")
    return data


def _response(refusal: Refusal) -> bytes:
    body = json.dumps({"error": str(refusal)}).encode()
    head = (f"HTTP/1.1 {refusal.status} {refusal.reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n")
    head += "".join(f"{name}: {value}\r\n" for name, value in refusal.headers)
    if refusal.close:
        head += "Connection: close\r\n"
    return head.encode() + b"\r\n" + body


class _State(enum.Enum):
    HEAD = "reading a request head"
    BODY = "reading a request body"
    WAITING = "waiting for tritonserver's response"
    HOLDING = "holding a refusal before answering it"
    CLOSING = "closing"


class HttpGuard:
    """The guard's connections and the budget they share.

    Args:
        upstream_port: tritonserver's HTTP port on 127.0.0.1.
        limits: What passes.
        admission: Decides per inference request (default: admit all).
    """

    def __init__(self, upstream_port: int, limits: GuardLimits,
                 admission: Admission | None = None) -> None:
        self.upstream_port = upstream_port
        self.limits = limits
        self.admission = admission or Admission()
        self.buffered = 0
        self.connections: set[_Client] = set()
        self.held = 0  # refusals being held (at most MAX_HELD_REFUSALS)
        self._sweeper: asyncio.Task | None = None

    async def listen(self, address: str = LOOPBACK, port: int = 0, *,
                     sock: socket.socket | None = None) -> asyncio.AbstractServer:
        """Listen on ``address:port`` (or on the listening ``sock``); the server's connections
        are this guard's."""
        loop = asyncio.get_running_loop()
        if sock is not None:
            return await loop.create_server(lambda: _Client(self), sock=sock)
        return await loop.create_server(lambda: _Client(self), address, port, reuse_address=True)

    def start_sweeping(self) -> None:
        """Time out this guard's connections while it has any (each new one calls this)."""
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def adopt(self, sock: socket.socket, initial: bytes) -> None:
        """Serve a connection accepted elsewhere (the native front's hand-off), which has sent
        ``initial`` so far, from a request's first byte."""
        loop = asyncio.get_running_loop()
        sock.setblocking(False)
        loop.create_task(loop.connect_accepted_socket(lambda: _Client(self, initial), sock))

    async def _sweep(self) -> None:
        """Time out slow senders (408), idle keep-alive connections and lingering closes; ends
        once there is no connection (a wakeup costs a cold interpreter up to a millisecond of
        CPU, and with the native front in place this process mostly has none)."""
        interval = min(0.5, self.limits.read_timeout_s / 4)
        loop = asyncio.get_running_loop()
        try:
            while self.connections:
                await asyncio.sleep(interval)
                now = loop.time()
                for client in [c for c in self.connections if c.deadline < now]:
                    client.timed_out()
        finally:
            self._sweeper = None


class _Client(asyncio.Protocol):
    """One client connection: parses its requests, sends them upstream, relays the answers."""

    def __init__(self, guard: HttpGuard, initial: bytes = b"") -> None:
        self.guard = guard
        self.loop = asyncio.get_running_loop()
        self.buf = bytearray(initial)  # a handed-off connection's bytes read before
        self.state = _State.HEAD
        self.request: Request | None = None
        self.reserved = 0  # body bytes counted against the guard's budget
        self.deadline = self.loop.time() + guard.limits.read_timeout_s
        self.transport: asyncio.Transport | None = None
        self.upstream: _Upstream | None = None
        self.pending: tuple[bytes, bytes] | None = None  # sent upstream, no answer yet
        self.retried = False
        self.done: Callable[[int], None] | None = None
        self.eof = False
        self.paused = False
        self.held: asyncio.TimerHandle | None = None  # a refusal being held (HOLDING)

    # ---- client side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.guard.connections.add(self)
        self.guard.start_sweeping()
        if self.buf:  # handed off with a request begun
            self.loop.call_soon(self._begin)

    def _begin(self) -> None:
        if self.state is _State.HEAD and self.buf and not self.transport.is_closing():
            self._advance()

    def data_received(self, data: bytes) -> None:
        if self.state is _State.CLOSING:
            return  # lingering after a refusal: discard
        self.buf += data
        self._advance()

    def eof_received(self) -> bool:
        self.eof = True
        if self.state in (_State.WAITING, _State.HOLDING):
            return True  # half-closed after sending: the answer still goes back
        self.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.connections.discard(self)
        if self.held is not None:
            self.held.cancel()
            self.held = None
            self.guard.held -= 1
        self._release()
        self._finish(0)
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None

    def pause_writing(self) -> None:  # the client reads slower than tritonserver answers
        if self.upstream is not None:
            self.upstream.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.resume_reading()

    def _advance(self) -> None:
        """Handle what ``buf`` holds: heads, bodies, pipelined requests (in order)."""
        while True:
            if self.state is _State.HEAD:
                while self.buf.startswith(b"\r\n"):  # RFC 9112 2.2: empty lines before a request
                    del self.buf[:2]
                end = self.buf.find(b"\r\n\r\n")
                try:
                    if end < 0:
                        self._check_partial_head()
                        return
                    if end > MAX_HEAD_BYTES:
                        raise Refusal(431, "Request Header Fields Too Large",
                                      f"request headers over {MAX_HEAD_BYTES} bytes")
                    request = parse_head(bytes(self.buf[:end]))
                    del self.buf[:end + 4]
                    self._start_body(request)
                except Refusal as refusal:
                    self.refuse(refusal)
                    return
            if self.state is _State.BODY:
                need = self.request.length
                if len(self.buf) < need:
                    return
                body = bytes(self.buf[:need]) if need else b""
                del self.buf[:need]
                self._release()
                try:
                    self._check_body(self.request, body)
                except Refusal as refusal:
                    if refusal.hold_s:
                        self._hold(refusal)
                        return
                    self.refuse(refusal)
                    if refusal.close:
                        return
                    continue  # refused after its body was read: the connection serves on
                self._send(self.request.head(), body)
            if self.state in (_State.WAITING, _State.HOLDING):
                if len(self.buf) > MAX_HEAD_BYTES and not self.paused:  # pipelined ahead
                    self.paused = True
                    self.transport.pause_reading()
                return
            if self.state is _State.CLOSING:
                return

    def _check_partial_head(self) -> None:
        """A head not complete yet: refuse what can never become a valid one."""
        crlf = self.buf.count(b"\r\n")
        if self.buf.count(b"\n") != crlf or self.buf.count(b"\r") - self.buf.endswith(b"\r") != crlf:
            raise _bad("a line of the request head ends in a bare LF or CR (only CRLF ends a line)")
        line_end = self.buf.find(b"\r\n")
        if (line_end < 0 and len(self.buf) > MAX_REQUEST_LINE_BYTES) or \
                line_end > MAX_REQUEST_LINE_BYTES:
            raise Refusal(414, "URI Too Long", f"request line over {MAX_REQUEST_LINE_BYTES} bytes")
        if len(self.buf) > MAX_HEAD_BYTES:
            raise Refusal(431, "Request Header Fields Too Large",
                          f"request headers over {MAX_HEAD_BYTES} bytes")

    def _start_body(self, request: Request) -> None:
        limits, guard = self.guard.limits, self.guard
        length = request.length
        if length > limits.max_body_bytes:
            raise Refusal(413, "Content Too Large", f"request body of {length} bytes is over the "
                          f"limit of {limits.max_body_bytes} bytes")
        if length > SMALL_BODY_BYTES:
            if guard.buffered + length > limits.max_buffered_bytes:
                raise Refusal(503, "Service Unavailable",
                              f"the server is reading {guard.buffered} bytes of request bodies "
                              f"already (limit {limits.max_buffered_bytes}); retry later")
            guard.buffered += length
            self.reserved = length
        if request.expect_continue and len(self.buf) < length:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.request = request
        self.state = _State.BODY
        self.deadline = self.loop.time() + limits.read_timeout_s

    def _check_body(self, request: Request, body: bytes) -> None:
        if not request.is_infer:
            return
        model = request.model
        if model is not None:  # admission first: a refusal costs no decoding
            try:
                self.done = self.guard.admission.admit(model, len(body))
            except Overloaded as exc:
                raise Refusal(503, "Service Unavailable", str(exc), close=request.close,
                              headers=(("Retry-After",
                                        str(max(1, math.ceil(exc.retry_after_s)))),),
                              hold_s=refusal_hold_s(self.guard.held)) from None
        try:
            if request.coding is not None:  # tritonserver decodes it whole: bound, check that
                body = decoded(body, request.coding, self.guard.limits.max_body_bytes)
            if body:
                split = request.header_length
                problem = shape_problem(body if split is None else body[:split], len(body))
                if problem:
                    raise Refusal(400, "Bad Request", problem, close=request.close)
        except Refusal:
            self._finish(0)  # admitted, never sent: out of the model's count again
            raise

    def _release(self) -> None:
        self.guard.buffered -= self.reserved
        self.reserved = 0

    def _hold(self, refusal: Refusal) -> None:
        """Answer ``refusal`` after its ``hold_s``; what the client sends meanwhile waits."""
        self.state = _State.HOLDING
        self.guard.held += 1
        self.held = self.loop.call_later(refusal.hold_s, self._unhold, refusal)

    def _unhold(self, refusal: Refusal) -> None:
        self.held = None
        self.guard.held -= 1
        if self.state is not _State.HOLDING:
            return
        self.refuse(refusal)
        if self.state is _State.HEAD:
            if self.paused:
                self.paused = False
                self.transport.resume_reading()
            self._advance()  # requests pipelined behind the refused one

    def refuse(self, refusal: Refusal) -> None:
        """Answer ``refusal``; when it closes, half-close and linger so the client reads it."""
        if self.transport.is_closing():
            return
        self.transport.write(_response(refusal))
        if not (refusal.close or self.eof):
            self.state = _State.HEAD
            self.deadline = self.loop.time() + self.guard.limits.read_timeout_s
            return
        self.state = _State.CLOSING
        self.buf.clear()
        self._release()
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.deadline = self.loop.time() + LINGER_S

    def timed_out(self) -> None:
        """Called by the sweeper once ``deadline`` passed."""
        if self.state is _State.HEAD and not self.buf:
            self.close()  # an idle kept-alive connection
        elif self.state in (_State.HEAD, _State.BODY):
            what = "headers" if self.state is _State.HEAD else "body"
            self.refuse(Refusal(408, "Request Timeout", f"request {what} not received within "
                                f"{self.guard.limits.read_timeout_s:g} s"))
        elif self.state is _State.CLOSING:
            self.close()
        else:  # waiting for tritonserver: its own timeouts apply
            self.deadline = self.loop.time() + self.guard.limits.read_timeout_s

    def close(self) -> None:
        self.state = _State.CLOSING
        if self.transport is not None:
            self.transport.close()

    def _finish(self, status: int) -> None:
        done, self.done = self.done, None
        if done is not None:
            done(status)

    # ---- upstream side

    def _send(self, head: bytes, body: bytes) -> None:
        self.state = _State.WAITING
        self.pending = (head, body)
        if self.upstream is not None and self.upstream.usable:
            self.upstream.send(head, body)
        else:
            self.loop.create_task(self._connect())

    async def _connect(self) -> None:
        if self.upstream is not None:
            self.upstream.close()
        self.upstream = None
        try:
            _, upstream = await self.loop.create_connection(
                lambda: _Upstream(self), LOOPBACK, self.guard.upstream_port)
        except OSError as exc:
            self._upstream_failed(f"tritonserver is not answering on {LOOPBACK}:"
                                  f"{self.guard.upstream_port} ({exc.strerror or exc})")
            return
        if self.state is not _State.WAITING:  # the client went away meanwhile
            upstream.close()
            return
        self.upstream = upstream
        upstream.send(*self.pending)

    def _upstream_failed(self, message: str) -> None:
        self._finish(0)
        self.refuse(Refusal(502, "Bad Gateway", message))

    def upstream_lost(self, upstream: _Upstream, answered: bool) -> None:
        """``upstream`` closed; ``answered`` when part of a response had come back."""
        if upstream is not self.upstream:
            return
        self.upstream = None
        if self.state is not _State.WAITING:
            return  # idle: the next request opens a fresh connection
        if answered:
            self.close()  # mid-response: the client sees the connection end
        elif not self.retried:
            # e.g. tritonserver closed the idle kept-alive connection, or restarted: nothing of
            # the response came back, so send it once more, fresh
            self.retried = True
            self.loop.create_task(self._connect())
        else:
            self._upstream_failed("tritonserver closed the connection without answering")

    def response_started(self) -> None:
        self.pending = None

    def response_done(self, status: int, keep_alive: bool) -> None:
        """The whole response has been relayed."""
        self._finish(status)
        self.retried = False
        if self.request.close or self.eof or not keep_alive:
            self.close()
            return
        self.state = _State.HEAD
        self.request = None
        self.deadline = self.loop.time() + self.guard.limits.read_timeout_s
        if self.paused:
            self.paused = False
            self.transport.resume_reading()
        if self.buf:
            self._advance()


class _Relay(enum.Enum):
    HEAD = 0
    LENGTH = 1
    CHUNK_SIZE = 2
    CHUNK_DATA = 3
    TRAILERS = 4
    UNTIL_CLOSE = 5


class _Upstream(asyncio.Protocol):
    """The connection to tritonserver of one client connection; relays responses as they come."""

    def __init__(self, client: _Client) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.relay = _Relay.HEAD
        self.remaining = 0
        self.status = 0
        self.keep_alive = True
        self.answered = False
        self.usable = True
        self._out: list[bytes] = []  # relayed bytes not written yet

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def send(self, head: bytes, body: bytes) -> None:
        self.answered = False
        if len(body) <= SMALL_BODY_BYTES:
            self.transport.write(head + body)
        else:
            self.transport.writelines((head, body))

    def pause_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def close(self) -> None:
        self.usable = False
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.usable = False
        self.client.upstream_lost(self, self.answered)

    def data_received(self, data: bytes) -> None:
        client = self.client
        if client.state is not _State.WAITING:
            self.close()  # bytes nobody asked for
            return
        if not self.answered:
            self.answered = True
            client.response_started()
        if not self.buf:  # the common cases: passed on as they came, one write each
            if self.relay is _Relay.LENGTH and len(data) < self.remaining:
                self.remaining -= len(data)  # part of a large body
                client.transport.write(data)
                return
            if self.relay is _Relay.HEAD:
                end = data.find(b"\r\n\r\n")
                if end >= 0 and self._whole(data, end):
                    return
        self.buf += data
        try:
            self._relay(self._out.append)
        except ValueError:  # a response the guard cannot frame: end both connections
            self._out.clear()
            self.close()
            client.close()
            return
        self._flush()

    def _flush(self) -> None:
        """Write what ``_relay`` gathered, in one write."""
        if self._out:
            data = b"".join(self._out)
            self._out.clear()
            if not self.client.transport.is_closing():
                self.client.transport.write(data)

    def _whole(self, data: bytes, end: int) -> bool:
        """True when ``data`` is one whole response with a ``Content-Length`` body (its head
        ending at ``end``): relayed in one write."""
        try:
            self._frame(data[:end + 4])
        except ValueError:
            self.close()
            self.client.close()
            return True
        if self.relay is _Relay.LENGTH and len(data) - end - 4 == self.remaining:
            self.client.transport.write(data)
            self.relay, self.remaining = _Relay.HEAD, 0
            self._done()
            return True
        self.relay, self.remaining = _Relay.HEAD, 0  # framed again by _relay
        return False

    def _relay(self, write: Callable[[bytes], None]) -> None:
        buf = self.buf
        while buf:
            if self.relay is _Relay.HEAD:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > MAX_HEAD_BYTES:
                        raise ValueError("response head too large")
                    return
                head = bytes(buf[:end + 4])
                del buf[:end + 4]
                self._frame(head)
                write(head)
                if self.relay is _Relay.HEAD:  # no body (or an interim 1xx response)
                    if self.status >= 200:
                        self._done()
                    continue
            elif self.relay is _Relay.LENGTH:
                take = min(self.remaining, len(buf))
                write(bytes(buf[:take]))
                del buf[:take]
                self.remaining -= take
                if not self.remaining:
                    self._done()
            elif self.relay is _Relay.CHUNK_SIZE:
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                self.remaining = int(bytes(buf[:end]).split(b";", 1)[0], 16) + 2
                self.relay = _Relay.CHUNK_DATA if self.remaining > 2 else _Relay.TRAILERS
                write(bytes(buf[:end + 2]))
                del buf[:end + 2]
                if self.relay is _Relay.TRAILERS:
                    self.remaining = 0
            elif self.relay is _Relay.CHUNK_DATA:
                take = min(self.remaining, len(buf))
                write(bytes(buf[:take]))
                del buf[:take]
                self.remaining -= take
                if not self.remaining:
                    self.relay = _Relay.CHUNK_SIZE
            elif self.relay is _Relay.TRAILERS:
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                write(bytes(buf[:end + 2]))
                del buf[:end + 2]
                if end == 0:
                    self._done()
            else:  # until close
                write(bytes(buf))
                buf.clear()

    def _frame(self, head: bytes) -> None:
        """Set how the body of the response with this head ends."""
        lines = head[:-4].split(b"\r\n")
        match = _STATUS_LINE.fullmatch(lines[0])
        if match is None:
            raise ValueError(f"malformed status line {lines[0][:100]!r}")
        self.status = int(match.group(1))
        length, chunked, connection = None, False, b""
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            key, value = name.strip().lower(), value.strip()
            if key == b"content-length":
                if length is not None or _DIGITS.fullmatch(value) is None:
                    raise ValueError("ambiguous Content-Length in the response")
                length = int(value)
            elif key == b"transfer-encoding":
                chunked = value.lower().endswith(b"chunked")
            elif key == b"connection":
                connection += b"," + value.lower()
        self.keep_alive = b"close" not in {t.strip() for t in connection.split(b",")}
        if self.status < 200 or self.status in (204, 304) or self.client.request.method == b"HEAD":
            self.relay = _Relay.HEAD
        elif chunked:
            self.relay = _Relay.CHUNK_SIZE
        elif length is not None:
            self.relay, self.remaining = (_Relay.LENGTH, length) if length else (_Relay.HEAD, 0)
        else:
            self.relay, self.keep_alive = _Relay.UNTIL_CLOSE, False

    def _done(self) -> None:
        self._flush()  # before the client moves on to its next request
        self.relay = _Relay.HEAD
        if self.buf:  # more than one response for one request
            self.buf.clear()
            self.keep_alive = False
        if not self.keep_alive:
            self.close()
        self.client.response_done(self.status, self.keep_alive)


def _alive(pid: int) -> bool:
    # not tools.process.is_alive: this file runs alone (standard library only) in the CPU image
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _pidfd(pid: int | None) -> int | None:
    """A descriptor that becomes readable when ``pid`` exits (Linux 5.3+), or None."""
    if pid is None or not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


async def run_until_gone(watch_pid: int | None, drain_s: float = 60.0) -> None:
    """Return once ``watch_pid`` (tritonserver) is gone, or on SIGTERM/SIGINT.

    With ``watch_pid``, a SIGTERM while it still runs (in a container the whole process group
    gets it) waits up to ``drain_s`` for it to exit: the responses of its drain still pass here.
    Where Linux gives a pidfd the exit wakes this at once, with no polling in between (each
    wakeup costs a cold interpreter up to a millisecond of CPU); elsewhere it polls every 0.5 s.
    """
    terminated, gone = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, terminated.set)
    pidfd = _pidfd(watch_pid)
    if pidfd is not None:
        loop.add_reader(pidfd, gone.set)
    try:
        deadline = None
        while watch_pid is None or not (gone.is_set() or not _alive(watch_pid)):
            if not terminated.is_set():
                waits = [loop.create_task(terminated.wait()), loop.create_task(gone.wait())]
                polled = watch_pid is not None and pidfd is None
                await asyncio.wait(waits, timeout=0.5 if polled else None,
                                   return_when=asyncio.FIRST_COMPLETED)
                for wait in waits:
                    wait.cancel()
                continue
            if watch_pid is None:
                return
            deadline = deadline or loop.time() + drain_s
            if loop.time() > deadline:
                return
            try:
                await asyncio.wait_for(gone.wait(), 0.2)
            except asyncio.TimeoutError:
                pass
    finally:
        if pidfd is not None:
            loop.remove_reader(pidfd)
            os.close(pidfd)


def run(main: object, event_loop: str = "auto") -> None:
    """Run the coroutine ``main`` on uvloop's event loop (``auto``: when importable) or asyncio's."""
    if event_loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if event_loop == "uvloop":
                raise
        else:
            uvloop.run(main)
            return
    asyncio.run(main)


def slo_admission_for(config_port: int) -> Admission | None:
    """Admission by each model's latency target (``tools/serve/admission.py``), reading the
    configs from tritonserver's HTTP port ``config_port``; None where that file is missing (an
    image that copied the guards without it: then every request is admitted, as before)."""
    try:
        from tools.serve.admission import SloAdmission
    except ImportError:
        try:  # a file beside this one, as the CPU image runs it
            from admission import SloAdmission  # type: ignore[no-redef]
        except ImportError:
            print("guard: no tools/serve/admission.py beside the guard: requests are admitted "
                  "without a latency target", file=sys.stderr, flush=True)
            return None
    return SloAdmission(config_port, Overloaded)


def native_front_binary(front: str) -> object | None:
    """The compiled native front (``tools/serve/http_front.py``) for ``--front`` ``auto`` or
    ``native``; None for ``python``, and for ``auto`` where it cannot be built (no C compiler,
    or this file runs alone, as in the CPU image)."""
    if front == "python":
        return None
    try:
        from tools.serve.http_front import front_binary
    except ImportError:
        binary = None
    else:
        binary = front_binary()
    if binary is None and front == "native":
        raise SystemExit("http guard: --front native, but the native front cannot be built here")
    return binary


async def serve(listen_port: int, upstream_port: int, limits: GuardLimits,
                watch_pid: int | None = None, listen_address: str = LOOPBACK,
                drain_s: float = 60.0, slo_admission: bool = True, front: str = "auto") -> None:
    """Serve until ``watch_pid`` (tritonserver) is gone, or on SIGTERM/SIGINT
    (``run_until_gone``); with the native front (``front``: auto, native or python) where it
    can be built."""
    guard = HttpGuard(upstream_port, limits,
                      slo_admission_for(upstream_port) if slo_admission else None)
    binary = native_front_binary(front)
    print(f"http guard: {listen_address}:{listen_port} -> {LOOPBACK}:{upstream_port}, bodies up "
          f"to {limits.max_body_bytes} bytes, " + (f"native front {binary}" if binary else
                                                  "served in Python"),
          file=sys.stderr, flush=True)
    if binary is None:
        server = await guard.listen(listen_address, listen_port)
        async with server:
            await run_until_gone(watch_pid, drain_s)
        return
    from tools.serve.http_front import NativeFront
    listener = socket.create_server((listen_address, listen_port), backlog=512)
    taken_over: list[asyncio.AbstractServer] = []

    def take_over() -> None:
        async def listen() -> None:
            taken_over.append(await guard.listen(sock=listener))
        asyncio.get_running_loop().create_task(listen())

    native = NativeFront(listener, upstream_port, limits.read_timeout_s, guard.adopt, take_over,
                         slo_admission_for(upstream_port) if slo_admission else None, binary)
    try:
        await run_until_gone(watch_pid, drain_s)
    finally:
        await native.close()
        for server in taken_over:
            server.close()
        listener.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen-address", default=LOOPBACK)
    parser.add_argument("--listen-port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--max-body-bytes", type=int, default=GuardLimits.max_body_bytes)
    parser.add_argument("--max-buffered-bytes", type=int, default=GuardLimits.max_buffered_bytes)
    parser.add_argument("--read-timeout-s", type=float, default=GuardLimits.read_timeout_s)
    parser.add_argument("--watch-pid", type=int)
    parser.add_argument("--event-loop", choices=("auto", "uvloop", "asyncio"), default="auto")
    parser.add_argument("--slo-admission", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--front", choices=("auto", "native", "python"), default="auto",
                        help="who accepts connections: the native front (C) for the common "
                             "request, handing the rest to Python (auto: where a C compiler "
                             "builds it), or Python alone")
    args = parser.parse_args(argv)
    limits = GuardLimits(args.max_body_bytes, args.max_buffered_bytes, args.read_timeout_s)
    run(serve(args.listen_port, args.upstream_port, limits, args.watch_pid, args.listen_address,
              slo_admission=args.slo_admission, front=args.front), args.event_loop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
