"""A bound on HTTP request size in front of an embedded tritonserver that has none.

Triton 2.51 (the nvidia-pytriton wheel) has no ``--http-max-input-size``: it reads a whole body
into memory before any check, and a JSON request whose ``shape`` is huge (``[1, 2**40]``) makes
it allocate that many bytes and abort (``std::bad_alloc``), taking every model down. This guard
listens on the public HTTP port and forwards to tritonserver on a loopback port of its own,
one upstream connection per client connection (keep-alive kept). Before a body is read it
refuses, with a JSON ``{"error": ...}`` naming the limit:

- a body over ``max_body_bytes`` (HTTP 413, the connection closed without reading it; an
  ``Expect: 100-continue`` client is refused before it sends anything);
- a body over 64 KiB when the bodies being read already hold ``max_buffered_bytes`` (HTTP 503;
  smaller bodies, such as every text request, are not counted);
- a body without ``Content-Length`` (HTTP 411: Triton's clients always send one);
- headers over ``MAX_HEAD_BYTES`` (HTTP 431), a client that sends too slowly (HTTP 408).

and, once the body is read, an inference request with an input whose ``shape`` is negative or
holds more elements than the body has bytes (HTTP 400): every element takes at least one byte in
JSON and in binary tensor data alike, so only a shape that cannot match its data is refused
(inputs in shared memory are left to Triton). Everything else passes through unchanged.

Run by ``EmbeddedServer(http_guard=...)`` (``python -m tools.serve.http_guard --listen-port P
--upstream-port U --watch-pid PID``) and by the CPU image's ``tritonserver`` wrapper
(docker/tritonserver-cpu.sh). Standard library only. It exits when ``PID`` (tritonserver) is gone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import sys
from dataclasses import dataclass

LOOPBACK = "127.0.0.1"
MAX_HEAD_BYTES = 64 * 1024
SMALL_BODY_BYTES = 64 * 1024  # bodies up to this size are not counted against the budget
_INFER_SUFFIX = "/infer"


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


class Refusal(Exception):
    """A request the guard answers itself: HTTP ``status`` with ``{"error": message}``."""

    def __init__(self, status: int, reason: str, message: str, *, close: bool = False) -> None:
        super().__init__(message)
        self.status, self.reason, self.close = status, reason, close


def shape_problem(header: bytes, body_bytes: int) -> str | None:
    """Why an inference request's JSON part cannot match its body, or None.

    ``header`` is the JSON part (the whole body, or its first ``Inference-Header-Content-Length``
    bytes); ``body_bytes`` the size of the whole body. Bodies that are not JSON objects are left
    to Triton, which answers them with its own error.
    """
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


def _response(status: int, reason: str, message: str, close: bool) -> bytes:
    body = json.dumps({"error": message}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n")
    if close:
        head += "Connection: close\r\n"
    return head.encode() + b"\r\n" + body


def _headers(head: bytes) -> tuple[str, str, dict[str, str]]:
    """Request line (method, target) and headers (lower-case names) of a request head."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise Refusal(400, "Bad Request", f"malformed request line {lines[0][:100]!r}", close=True)
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return parts[0], parts[1], headers


class HttpGuard:
    """The guard's connections; one asyncio task per client connection."""

    def __init__(self, upstream_port: int, limits: GuardLimits) -> None:
        self.upstream_port = upstream_port
        self.limits = limits
        self.buffered = 0

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"),
                                                  self.limits.read_timeout_s)
                except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError):
                    return  # the client closed, or kept an idle connection too long
                try:  # headers over MAX_HEAD_BYTES: readuntil raised LimitOverrunError (431)
                    method, target, headers = _headers(head)
                    body = await self._body(reader, writer, headers, target)
                    if upstream is None:
                        upstream = await self._open_upstream()
                    try:
                        response = await self._send(head, body, headers, upstream)
                    except _UpstreamLost:
                        # e.g. tritonserver closed the idle kept-alive connection, or restarted:
                        # nothing of the response came back, so send it once more, fresh
                        upstream[1].close()
                        upstream = await self._open_upstream()
                        try:
                            response = await self._send(head, body, headers, upstream)
                        except _UpstreamLost:
                            raise Refusal(502, "Bad Gateway", "tritonserver closed the connection "
                                          "without answering", close=True) from None
                except Refusal as refusal:
                    writer.write(_response(refusal.status, refusal.reason, str(refusal),
                                           refusal.close))
                    await writer.drain()
                    if refusal.close:
                        return
                    continue  # refused after its body was read: the connection serves on
                keep = await self._relay(response, method, upstream[0], writer)
                if not keep or headers.get("connection", "").lower() == "close":
                    return
        except asyncio.LimitOverrunError:
            writer.write(_response(431, "Request Header Fields Too Large",
                                   f"request headers over {MAX_HEAD_BYTES} bytes", True))
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass  # either side went away mid-request, or tritonserver answered malformed
        finally:
            for w in (writer, upstream[1] if upstream else None):
                if w is not None:
                    w.close()

    async def _body(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    headers: dict[str, str], target: str) -> bytes:
        if "transfer-encoding" in headers:
            raise Refusal(411, "Length Required", "send the request body with a Content-Length "
                          "(chunked bodies are not accepted)", close=True)
        raw = headers.get("content-length", "0")
        if not raw.isdigit():
            raise Refusal(400, "Bad Request", f"Content-Length {raw[:40]!r} is not a number",
                          close=True)
        length = int(raw)
        if length > self.limits.max_body_bytes:
            raise Refusal(413, "Content Too Large",
                          f"request body of {length} bytes is over the limit of "
                          f"{self.limits.max_body_bytes} bytes", close=True)
        if length > SMALL_BODY_BYTES and self.buffered + length > self.limits.max_buffered_bytes:
            raise Refusal(503, "Service Unavailable",
                          f"the server is reading {self.buffered} bytes of request bodies "
                          f"already (limit {self.limits.max_buffered_bytes}); retry later",
                          close=True)
        if headers.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.buffered += length
        try:
            body = await asyncio.wait_for(reader.readexactly(length), self.limits.read_timeout_s)
        except asyncio.TimeoutError:
            raise Refusal(408, "Request Timeout",
                          f"request body not received within {self.limits.read_timeout_s:g} s",
                          close=True) from None
        finally:
            self.buffered -= length
        if target.split("?", 1)[0].endswith(_INFER_SUFFIX) and body:
            split = headers.get("inference-header-content-length", "")
            header = body[: int(split)] if split.isdigit() else body
            problem = shape_problem(header, length)
            if problem:
                raise Refusal(400, "Bad Request", problem)
        return body

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.open_connection(LOOPBACK, self.upstream_port, limit=MAX_HEAD_BYTES)
        except OSError as exc:
            raise Refusal(502, "Bad Gateway", f"tritonserver is not answering on "
                          f"{LOOPBACK}:{self.upstream_port} ({exc.strerror or exc})",
                          close=True) from None

    @staticmethod
    async def _send(head: bytes, body: bytes, headers: dict[str, str],
                    upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> bytes:
        """Send one request upstream; its response head.

        Raises:
            _UpstreamLost: the connection failed before any of the response came back.
        """
        up_reader, up_writer = upstream
        if "expect" in headers:  # answered here already; the body goes up in one piece
            head = b"\r\n".join(line for line in head.split(b"\r\n")
                                if not line.lower().startswith(b"expect:"))
        try:
            up_writer.write(head + body)
            await up_writer.drain()
            return await up_reader.readuntil(b"\r\n\r\n")
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            raise _UpstreamLost() from exc

    @staticmethod
    async def _relay(response: bytes, method: str, up_reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> bool:
        """Pass a response (its ``response`` head read already) back; False when it closes."""
        status_line, _, _ = response.partition(b"\r\n")
        _, _, response_headers = _headers(b"RESPONSE - -\r\n" + response.split(b"\r\n", 1)[1])
        writer.write(response)
        status = status_line.split(b" ")[1] if status_line.count(b" ") else b""
        if method == "HEAD" or status in (b"204", b"304"):
            pass  # no body
        elif "content-length" in response_headers:
            writer.write(await up_reader.readexactly(int(response_headers["content-length"])))
        elif response_headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = await up_reader.readuntil(b"\r\n")
                size = int(size_line.split(b";", 1)[0], 16)
                writer.write(size_line + await up_reader.readexactly(size + 2))
                if size == 0:
                    break
        else:
            writer.write(await up_reader.read())
            await writer.drain()
            return False
        await writer.drain()
        return response_headers.get("connection", "").lower() != "close"


class _UpstreamLost(Exception):
    """The upstream connection failed before any of its response came back."""


def _alive(pid: int) -> bool:
    # not tools.process.is_alive: this file runs alone (standard library only) in the CPU image
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


async def run_until_gone(watch_pid: int | None, drain_s: float = 60.0) -> None:
    """Return once ``watch_pid`` (tritonserver) is gone, or on SIGTERM/SIGINT.

    With ``watch_pid``, a SIGTERM while it still runs (in a container the whole process group
    gets it) waits up to ``drain_s`` for it to exit: the responses of its drain still pass here.
    """
    terminated = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, terminated.set)
    deadline = None
    while watch_pid is None or _alive(watch_pid):
        if not terminated.is_set():
            try:
                await asyncio.wait_for(terminated.wait(), 0.5)
            except asyncio.TimeoutError:
                pass
            continue
        if watch_pid is None:
            return
        deadline = deadline or loop.time() + drain_s
        if loop.time() > deadline:
            return
        await asyncio.sleep(0.2)


async def serve(listen_port: int, upstream_port: int, limits: GuardLimits,
                watch_pid: int | None = None, listen_address: str = LOOPBACK,
                drain_s: float = 60.0) -> None:
    """Serve until ``watch_pid`` (tritonserver) is gone, or on SIGTERM/SIGINT
    (``run_until_gone``)."""
    guard = HttpGuard(upstream_port, limits)
    server = await asyncio.start_server(guard.connection, listen_address, listen_port,
                                        limit=MAX_HEAD_BYTES, reuse_address=True)
    print(f"http guard: {listen_address}:{listen_port} -> {LOOPBACK}:{upstream_port}, bodies up "
          f"to {limits.max_body_bytes} bytes", file=sys.stderr, flush=True)
    async with server:
        await run_until_gone(watch_pid, drain_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen-address", default=LOOPBACK)
    parser.add_argument("--listen-port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--max-body-bytes", type=int, default=GuardLimits.max_body_bytes)
    parser.add_argument("--max-buffered-bytes", type=int, default=GuardLimits.max_buffered_bytes)
    parser.add_argument("--read-timeout-s", type=float, default=GuardLimits.read_timeout_s)
    parser.add_argument("--watch-pid", type=int)
    args = parser.parse_args(argv)
    limits = GuardLimits(args.max_body_bytes, args.max_buffered_bytes, args.read_timeout_s)
    asyncio.run(serve(args.listen_port, args.upstream_port, limits, args.watch_pid,
                      args.listen_address))
    return 0


if __name__ == "__main__":
    sys.exit(main())
