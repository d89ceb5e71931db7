"""A bound on gRPC message size in front of tritonserver, which has none.

Every Triton release builds its gRPC server with ``SetMaxMessageSize(INT32_MAX)``
(``src/grpc/grpc_server.cc``) and no flag changes it: one 200 MB ``ModelInfer`` is read whole
(tritonserver 2.51's RSS went from 48 to 609 MiB) before any model can refuse it. This guard
listens on the public gRPC port and relays each HTTP/2 connection to tritonserver's gRPC port on
loopback frame by frame, unchanged (so metadata, the admin key, deadlines, cancellation, status
codes, every service and the bidirectional ``ModelStreamInfer`` pass as they are, and answers are
byte-identical). It reads only the 9-byte frame headers and, in the client's DATA frames, the
5-byte prefix of each gRPC message. A message announced over ``max_message_bytes`` (or a
compressed one that decodes past it) ends its call before tritonserver has it: the guard resets
the stream upstream (RST_STREAM CANCEL), answers the client ``RESOURCE_EXHAUSTED`` ("Received
message larger than max (N vs. M)", as gRPC's own limit words it), drops that stream's other
frames and returns their flow-control credit (WINDOW_UPDATE), so the connection serves on.

Run by ``EmbeddedServer(grpc_guard=...)`` (``python -m tools.serve.grpc_guard --listen-port P
--upstream-port U --watch-pid PID``) and by the CPU image's ``tritonserver`` wrapper
(docker/tritonserver-cpu.sh). Standard library only (uvloop's event loop when importable), like
http_guard.py beside it. It exits when ``PID`` (tritonserver) is gone.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import zlib

try:  # a module of the project
    from tools.serve.http_guard import (
        LOOPBACK, Admission, Overloaded, refusal_hold_s, run, run_until_gone, slo_admission_for)
except ImportError:  # a file beside http_guard.py, as the CPU image runs it
    from http_guard import (  # type: ignore[no-redef]
        LOOPBACK, Admission, Overloaded, refusal_hold_s, run, run_until_gone, slo_admission_for)

MAX_MESSAGE_BYTES = 16 * 2**20  # as the HTTP body limit (docker-compose.yml)
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
UNAVAILABLE, RESOURCE_EXHAUSTED = 14, 8
# ModelInferRequest (grpc_service.proto): model_name = 1, inputs = 5, raw_input_contents = 7;
# the other requests that start with a name (metadata, ready, config, statistics) have no 5-7.
_INFER_FIELDS = frozenset({5, 6, 7})
_SNIFF_BYTES = 512  # of a stream's first message: enough for its name and the next field's tag
# frame types and flags (RFC 9113 section 6)
DATA, HEADERS, RST_STREAM, PUSH_PROMISE, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 5, 8, 9
END_STREAM, END_HEADERS, PADDED = 0x1, 0x4, 0x8
CANCEL = 0x8
# Frames of a refused stream that are dropped; header blocks always pass (both HPACK decoders
# must see every block, RFC 9113 section 4.3), the receiver discarding them itself.
_DROPPED = frozenset({DATA, RST_STREAM, WINDOW_UPDATE})
_STATUS_200 = b"\x88"  # HPACK static table entry 8, ":status: 200" (changes no table)


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


def _literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal header field without indexing, new name, no Huffman: it leaves the
    decoder's dynamic table as it was (RFC 7541 section 6.2.2)."""
    return b"\x00" + _hpack_length(len(name)) + name + _hpack_length(len(value)) + value


def _hpack_length(n: int) -> bytes:
    if n < 127:
        return bytes((n,))
    out, n = bytearray((127,)), n - 127
    while n >= 128:
        out.append(n % 128 + 128)
        n //= 128
    out.append(n)
    return bytes(out)


def refusal_headers(stream: int, message: str, *, trailers_only: bool,
                    status: int = RESOURCE_EXHAUSTED,
                    metadata: tuple[tuple[bytes, bytes], ...] = ()) -> bytes:
    """The HEADERS frame that ends ``stream`` with ``status`` (a trailers-only response when
    tritonserver has not answered the stream yet, else its trailers), ``metadata`` added."""
    block = (_STATUS_200 + _literal(b"content-type", b"application/grpc")) if trailers_only \
        else b""
    block += _literal(b"grpc-status", str(status).encode())
    block += _literal(b"grpc-message", message.encode("ascii").replace(b"%", b"%25"))
    block += b"".join(_literal(name, value) for name, value in metadata)
    return _frame(HEADERS, END_STREAM | END_HEADERS, stream, block)


def _varint(data: bytes, pos: int) -> tuple[int, int] | None:
    """The varint at ``pos`` and the position after it, or None when ``data`` ends first."""
    value, shift = 0, 0
    while pos < len(data) and shift < 64:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7
    return None


def infer_model(head: bytes, complete: bool) -> str | None | bool:
    """The model of a ``ModelInferRequest`` from the first bytes of a serialised message.

    Returns the ``model_name`` (field 1) once a field of the request's tensors (5, 6 or 7)
    follows it; ``False`` when the message is some other request (it ends, or another field
    comes, without those); ``None`` when ``head`` is too short to tell (``complete``: the whole
    message).
    """
    pos, name = 0, None
    while True:
        tag = _varint(head, pos)
        if tag is None:
            return False if complete else None
        field, wire = tag[0] >> 3, tag[0] & 7
        if field in _INFER_FIELDS:
            return name if name is not None else False
        pos = tag[1]
        if wire == 2:  # length-delimited
            length = _varint(head, pos)
            if length is None or length[1] + length[0] > len(head):
                return False if complete else None
            if field == 1:
                name = head[length[1]:length[1] + length[0]].decode("utf-8", "replace")
            pos = length[1] + length[0]
        elif wire == 0:
            value = _varint(head, pos)
            if value is None:
                return False if complete else None
            pos = value[1]
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            return False


class _Message:
    """Where one client stream is in its sequence of length-prefixed gRPC messages."""

    __slots__ = ("prefix", "remaining", "inflater", "decoded", "index", "head", "length")

    def __init__(self) -> None:
        self.prefix = b""
        self.remaining = 0
        self.inflater = None
        self.decoded = 0
        self.index = 0  # messages begun on this stream
        self.head: bytearray | None = bytearray()  # the first message's first bytes (sniffed)
        self.length = 0

    def too_large(self, data: memoryview, limit: int) -> str | None:
        """Follow ``data`` (a DATA payload); why the stream must end, or None."""
        pos, end = 0, len(data)
        while pos < end:
            if not self.remaining:
                take = min(5 - len(self.prefix), end - pos)
                self.prefix += bytes(data[pos:pos + take])
                pos += take
                if len(self.prefix) < 5:
                    return None
                compressed, length = self.prefix[0], int.from_bytes(self.prefix[1:5], "big")
                self.prefix = b""
                if length > limit:
                    return f"Received message larger than max ({length} vs. {limit})"
                self.remaining = length
                self.inflater = zlib.decompressobj(47) if compressed else None  # gzip or zlib
                self.decoded = 0
                self.index += 1
                if self.index > 1 or compressed:
                    self.head = None  # only a first, uncompressed message is sniffed
                self.length = length
                continue
            take = min(self.remaining, end - pos)
            if self.head is not None and len(self.head) < _SNIFF_BYTES:
                self.head += data[pos:pos + min(take, _SNIFF_BYTES - len(self.head))]
            if self.inflater is not None:
                try:
                    self.decoded += len(self.inflater.decompress(data[pos:pos + take],
                                                                 limit + 1 - self.decoded))
                except zlib.error:
                    return "a compressed message the guard cannot decode (gzip and deflate only)"
                if self.decoded > limit or self.inflater.unconsumed_tail:
                    return f"Received message larger than max (decompressed over {limit})"
            self.remaining -= take
            pos += take
        return None


class _Direction:
    """The frames going one way: relayed ones and the guard's own, in order, and never one of
    the guard's inside a header block (HEADERS or PUSH_PROMISE then CONTINUATION frames, which
    HTTP/2 does not let another frame interrupt)."""

    __slots__ = ("out", "in_block", "pending")

    def __init__(self) -> None:
        self.out: list[bytes | memoryview] = []
        self.in_block = False
        self.pending: list[bytes] = []

    def relay(self, frame: memoryview, kind: int, flags: int) -> None:
        self.out.append(frame)
        if kind in (HEADERS, PUSH_PROMISE, CONTINUATION):
            self.in_block = not flags & END_HEADERS
            if not self.in_block and self.pending:
                self.out += self.pending
                self.pending.clear()

    def own(self, frame: bytes) -> None:
        (self.pending if self.in_block else self.out).append(frame)

    def flush(self, transport: asyncio.Transport | None) -> None:
        if self.out:
            data = b"".join(self.out)
            self.out.clear()
            if transport is not None and not transport.is_closing():
                transport.write(data)


class _Side(asyncio.Protocol):
    """One end of a relayed connection; ``pair`` holds both and does the work."""

    def __init__(self, pair: _Pair, client: bool) -> None:
        self.pair, self.client = pair, client
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if self.client:
            asyncio.get_running_loop().create_task(self.pair.connect())

    def data_received(self, data: bytes) -> None:
        self.pair.received(self.client, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.pair.close()

    def pause_writing(self) -> None:  # this side reads slower than the other sends
        self.pair.flow(not self.client, pause=True)

    def resume_writing(self) -> None:
        self.pair.flow(not self.client, pause=False)


class _Pair:
    """A client connection and its connection to tritonserver, relayed frame by frame."""

    def __init__(self, guard: GrpcGuard) -> None:
        self.guard = guard
        self.client = _Side(self, True)
        self.upstream = _Side(self, False)
        self.inbox = {True: bytearray(), False: bytearray()}
        self.to = {True: _Direction(), False: _Direction()}  # to the client / to tritonserver
        self.preface = True  # the client's connection preface is still to come
        self.messages: dict[int, _Message] = {}
        self.answered: set[int] = set()  # streams tritonserver sent headers on
        self.refused: set[int] = set()
        self.admitted: dict[int, list] = {}  # stream -> [done callback, a response came back]
        self.early = bytearray()  # client bytes before tritonserver is connected
        self.closed = False

    async def connect(self) -> None:
        try:
            await asyncio.get_running_loop().create_connection(
                lambda: self.upstream, LOOPBACK, self.guard.upstream_port)
        except OSError:
            self.close()
            return
        if self.closed:
            self.upstream.transport.close()
        elif self.early:
            data, self.early = bytes(self.early), bytearray()
            self.received(True, data)

    def received(self, from_client: bool, data: bytes) -> None:
        if self.closed:
            return
        if from_client and self.upstream.transport is None:
            self.early += data
            return
        buf = self.inbox[from_client]
        buf += data
        relayed, back = self.to[not from_client], self.to[from_client]
        pos = 0
        view = memoryview(buf)
        try:
            if from_client and self.preface:
                if len(buf) < len(PREFACE):
                    if not PREFACE.startswith(bytes(buf)):
                        self.close()  # not HTTP/2 with prior knowledge, as gRPC speaks it
                    return
                if not buf.startswith(PREFACE):
                    self.close()
                    return
                self.preface = False
                relayed.out.append(view[:len(PREFACE)])
                pos = len(PREFACE)
            while len(buf) - pos >= 9:
                length = int.from_bytes(view[pos:pos + 3], "big")
                end = pos + 9 + length
                if len(buf) < end:
                    break
                kind, flags = view[pos + 3], view[pos + 4]
                stream = int.from_bytes(view[pos + 5:pos + 9], "big") & 0x7FFFFFFF
                if from_client:
                    keep = self._from_client(kind, flags, stream, view[pos + 9:end], length)
                else:
                    keep = self._from_upstream(kind, flags, stream, length)
                if keep:
                    relayed.relay(view[pos:end], kind, flags)
                pos = end
            relayed.flush((self.upstream if from_client else self.client).transport)
            back.flush((self.client if from_client else self.upstream).transport)
        finally:
            view.release()
        del buf[:pos]

    def _from_client(self, kind: int, flags: int, stream: int, payload: memoryview,
                     length: int) -> bool:
        if stream in self.refused:
            if kind == DATA and length:  # the credit the client spent on a dropped frame
                self.to[True].own(_frame(WINDOW_UPDATE, 0, 0, length.to_bytes(4, "big")))
            return kind not in _DROPPED
        if kind == DATA:
            message = self.messages.get(stream)
            if message is None:
                message = self.messages[stream] = _Message()
            data = payload[1:length - payload[0]] if flags & PADDED and length else payload
            problem = message.too_large(data, self.guard.max_message_bytes)
            if problem is not None:
                self._refuse(stream, problem, length)
                return False
            if message.head is not None and self.guard.admission is not None \
                    and not self._admit(stream, message, length, bool(flags & END_STREAM)):
                return False
            if flags & END_STREAM:
                del self.messages[stream]
        elif kind == RST_STREAM:
            self.messages.pop(stream, None)
            self._finish(stream)
        return True

    def _admit(self, stream: int, message: _Message, length: int, ended: bool) -> bool:
        """Ask the admission about a stream's first message once its model is known; False when
        it refused (the stream is then ended)."""
        model = infer_model(bytes(message.head), ended or len(message.head) >= message.length)
        if model is None:
            return True  # more of the message to come
        message.head = None
        if model is False:
            return True
        try:
            done = self.guard.admission.admit(model, message.length)
        except Overloaded as exc:
            self._refuse(stream, str(exc), length, hold_s=refusal_hold_s(self.guard.held),
                         status=UNAVAILABLE, metadata=_pushback(exc.retry_after_s))
            return False
        if done is not None:
            self.admitted[stream] = [done, False]
        return True

    def _finish(self, stream: int) -> None:
        admitted = self.admitted.pop(stream, None)
        if admitted is not None:
            admitted[0](200 if admitted[1] else 0)

    def _refuse(self, stream: int, message: str, length: int, hold_s: float = 0.0,
                **trailers) -> None:
        """End ``stream``: its further frames dropped, the client's credit for them returned,
        tritonserver's side cancelled and the client's refusal sent, now or, with ``hold_s``
        (an admission's refusal: see ``http_guard.REFUSAL_HOLD_S``), that much later. Held, the
        cancel goes upstream after the refusal went to the client: tritonserver answers a
        cancelled stream (INTERNAL, "Unable to parse request"), and the client must have
        ended the stream by then, or that answer would be its result."""
        self.refused.add(stream)
        self.messages.pop(stream, None)
        self._finish(stream)
        if length:
            self.to[True].own(_frame(WINDOW_UPDATE, 0, 0, length.to_bytes(4, "big")))
        refusal = refusal_headers(stream, message, trailers_only=stream not in self.answered,
                                  **trailers)
        if hold_s:
            self.guard.held += 1
            asyncio.get_running_loop().call_later(hold_s, self._send_held, stream, refusal)
            return
        self.to[False].own(_frame(RST_STREAM, 0, stream, CANCEL.to_bytes(4, "big")))
        self.to[True].own(refusal)

    def _send_held(self, stream: int, refusal: bytes) -> None:
        self.guard.held -= 1
        if self.closed:
            return
        self.to[True].own(refusal)
        self.to[True].flush(self.client.transport)
        self.to[False].own(_frame(RST_STREAM, 0, stream, CANCEL.to_bytes(4, "big")))
        self.to[False].flush(self.upstream.transport)

    def _from_upstream(self, kind: int, flags: int, stream: int, length: int) -> bool:
        if stream in self.refused:
            if kind == DATA and length:  # tritonserver's credit for a frame the client never gets
                self.to[False].own(_frame(WINDOW_UPDATE, 0, 0, length.to_bytes(4, "big")))
            return kind not in _DROPPED
        if kind == HEADERS:
            if flags & END_STREAM:
                self.answered.discard(stream)
                self._finish(stream)
            else:
                self.answered.add(stream)
        elif kind == DATA:
            admitted = self.admitted.get(stream)
            if admitted is not None:
                admitted[1] = True  # a response message: errors come as trailers alone
        elif kind == RST_STREAM:
            self.answered.discard(stream)
            self._finish(stream)
        return True

    def flow(self, reading_client: bool, *, pause: bool) -> None:
        transport = (self.client if reading_client else self.upstream).transport
        if transport is not None and not transport.is_closing():
            (transport.pause_reading if pause else transport.resume_reading)()

    def close(self) -> None:
        self.closed = True
        for stream in list(self.admitted):
            self._finish(stream)
        for side in (self.client, self.upstream):
            if side.transport is not None:
                side.transport.close()


def _pushback(retry_after_s: float) -> tuple[tuple[bytes, bytes], ...]:
    """Trailing metadata asking the client to wait: gRPC's retry pushback (in ms) and
    ``retry-after`` (whole seconds, as HTTP's)."""
    return ((b"grpc-retry-pushback-ms", b"%d" % round(retry_after_s * 1000)),
            (b"retry-after", b"%d" % max(1, math.ceil(retry_after_s))))


class GrpcGuard:
    """Relays gRPC connections to tritonserver's gRPC port, bounding message size.

    Args:
        upstream_port: tritonserver's gRPC port on 127.0.0.1.
        max_message_bytes: The largest message a client may send.
        admission: Decides per ``ModelInferRequest`` (the first message of a stream) whether it
            goes on, as ``http_guard.Admission`` does for HTTP (None: all go on); a refusal ends
            the call with ``UNAVAILABLE`` and retry pushback before tritonserver has the message.
            The callable it returns gets 200 once the call ended with a response message, else 0.
    """

    def __init__(self, upstream_port: int, max_message_bytes: int = MAX_MESSAGE_BYTES,
                 admission: Admission | None = None) -> None:
        self.upstream_port = upstream_port
        self.max_message_bytes = max_message_bytes
        self.admission = admission
        self.held = 0  # refusals being held (http_guard.refusal_hold_s)

    async def listen(self, address: str = LOOPBACK, port: int = 0) -> asyncio.AbstractServer:
        """Listen on ``address:port``."""
        return await asyncio.get_running_loop().create_server(
            lambda: _Pair(self).client, address, port, reuse_address=True)


async def serve(listen_port: int, upstream_port: int, max_message_bytes: int = MAX_MESSAGE_BYTES,
                watch_pid: int | None = None, listen_address: str = LOOPBACK,
                drain_s: float = 60.0, triton_http_port: int | None = None) -> None:
    """Serve until ``watch_pid`` (tritonserver) is gone, or on SIGTERM/SIGINT (``run_until_gone``:
    with ``watch_pid``, a SIGTERM waits up to ``drain_s`` for it to exit). With
    ``triton_http_port`` (where the model configs are read), requests are admitted by each
    model's latency target (``tools.serve.admission``)."""
    admission = slo_admission_for(triton_http_port) if triton_http_port is not None else None
    server = await GrpcGuard(upstream_port, max_message_bytes, admission).listen(
        listen_address, listen_port)
    print(f"grpc guard: {listen_address}:{listen_port} -> {LOOPBACK}:{upstream_port}, messages "
          f"up to {max_message_bytes} bytes", file=sys.stderr, flush=True)
    async with server:
        await run_until_gone(watch_pid, drain_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen-address", default=LOOPBACK)
    parser.add_argument("--listen-port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--max-message-bytes", type=int, default=MAX_MESSAGE_BYTES)
    parser.add_argument("--watch-pid", type=int)
    parser.add_argument("--event-loop", choices=("auto", "uvloop", "asyncio"), default="auto")
    parser.add_argument("--triton-http-port", type=int,
                        help="tritonserver's HTTP port on loopback: admit inference requests by "
                        "each model's latency target (its config's admission_p99_ms)")
    args = parser.parse_args(argv)
    run(serve(args.listen_port, args.upstream_port, args.max_message_bytes, args.watch_pid,
              args.listen_address, triton_http_port=args.triton_http_port), args.event_loop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
