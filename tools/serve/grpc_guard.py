"""A bound on gRPC message size in front of tritonserver, which has none.

Every Triton release builds its gRPC server with ``SetMaxMessageSize(INT32_MAX)``
(``src/grpc/grpc_server.cc``) and no flag changes it: one 200 MB ``ModelInfer`` is read whole
(tritonserver 2.51's RSS went from 48 to 609 MiB) before any model can refuse it. This guard
listens on the public gRPC port and forwards every call, of any service, to tritonserver's gRPC
port on loopback as raw bytes (no protobuf is parsed, so the messages tritonserver gets and the
answers the client gets are byte-identical): unary calls, and the bidirectional
``ModelStreamInfer`` stream message by message. Its gRPC server's receive limit
(``grpc.max_receive_message_length``) refuses a message over ``max_message_bytes`` with
``RESOURCE_EXHAUSTED``; metadata (the admin key among it), deadlines, cancellation, status codes
and trailing metadata pass through.

Run by ``EmbeddedServer(grpc_guard=...)`` (``python -m tools.serve.grpc_guard --listen-port P
--upstream-port U --watch-pid PID``) and by the CPU image's ``tritonserver`` wrapper
(docker/tritonserver-cpu.sh). Needs grpcio and the standard library only. It exits when ``PID``
(tritonserver) is gone.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import AsyncIterator, Callable, Sequence

import grpc

try:  # a module of the project
    from tools.serve.http_guard import LOOPBACK, run_until_gone
except ImportError:  # a file beside http_guard.py, as the CPU image runs it
    from http_guard import LOOPBACK, run_until_gone  # type: ignore[no-redef]

MAX_MESSAGE_BYTES = 16 * 2**20  # as the HTTP body limit (docker-compose.yml)
# The streaming methods of every service tritonserver serves; every other method is unary.
STREAMING_METHODS = frozenset({"/inference.GRPCInferenceService/ModelStreamInfer"})
# Metadata that belongs to one HTTP/2 hop, not to the call; gRPC sets it again upstream.
_HOP_METADATA = ("user-agent", "grpc-", ":")
_UNLIMITED = -1

Metadata = Sequence[tuple[str, str | bytes]]


def _forwarded(metadata: Metadata | None) -> tuple[tuple[str, str | bytes], ...]:
    return tuple((k, v) for k, v in metadata or () if not k.startswith(_HOP_METADATA))


class GrpcGuard(grpc.GenericRpcHandler):
    """Forwards every method to ``channel`` (tritonserver's gRPC port), bytes in, bytes out."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._channel = channel
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        handler = self._handlers.get(method)
        if handler is None:
            if method in STREAMING_METHODS:
                handler = grpc.stream_stream_rpc_method_handler(
                    self._stream(self._channel.stream_stream(method)))
            else:
                handler = grpc.unary_unary_rpc_method_handler(
                    self._unary(self._channel.unary_unary(method)))
            self._handlers[method] = handler
        return handler

    @staticmethod
    def _unary(upstream: grpc.aio.UnaryUnaryMultiCallable) -> Callable:
        async def forward(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            call = upstream(request, timeout=context.time_remaining(),
                            metadata=_forwarded(context.invocation_metadata()))
            try:
                response = await call
            except grpc.aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or "",
                                    _forwarded(exc.trailing_metadata()))
            trailing = _forwarded(await call.trailing_metadata())
            if trailing:
                context.set_trailing_metadata(trailing)
            return response
        return forward

    @staticmethod
    def _stream(upstream: grpc.aio.StreamStreamMultiCallable) -> Callable:
        async def forward(requests: AsyncIterator[bytes],
                          context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            call = upstream(timeout=context.time_remaining(),
                            metadata=_forwarded(context.invocation_metadata()))

            async def send() -> None:
                async for request in requests:
                    await call.write(request)
                await call.done_writing()

            sending = asyncio.get_running_loop().create_task(send())
            try:
                async for response in call:
                    yield response
                await sending  # a failure reading the client's stream surfaces here
            except grpc.aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or "",
                                    _forwarded(exc.trailing_metadata()))
            finally:
                sending.cancel()
                call.cancel()
        return forward


async def serve(listen_port: int, upstream_port: int, max_message_bytes: int = MAX_MESSAGE_BYTES,
                watch_pid: int | None = None, listen_address: str = LOOPBACK,
                drain_s: float = 60.0) -> None:
    """Serve until ``watch_pid`` (tritonserver) is gone, or on SIGTERM/SIGINT (``run_until_gone``:
    with ``watch_pid``, a SIGTERM waits up to ``drain_s`` for it to exit)."""
    channel = grpc.aio.insecure_channel(
        f"{LOOPBACK}:{upstream_port}",
        options=[("grpc.max_receive_message_length", _UNLIMITED),
                 ("grpc.max_send_message_length", _UNLIMITED)])
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", max_message_bytes),
                                      ("grpc.max_send_message_length", _UNLIMITED),
                                      ("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((GrpcGuard(channel),))
    if not server.add_insecure_port(f"{listen_address}:{listen_port}"):
        raise OSError(f"cannot listen on {listen_address}:{listen_port}")
    await server.start()
    print(f"grpc guard: {listen_address}:{listen_port} -> {LOOPBACK}:{upstream_port}, messages "
          f"up to {max_message_bytes} bytes", file=sys.stderr, flush=True)
    try:
        await run_until_gone(watch_pid, drain_s)
    finally:
        await server.stop(grace=1.0)
        await channel.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen-address", default=LOOPBACK)
    parser.add_argument("--listen-port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--max-message-bytes", type=int, default=MAX_MESSAGE_BYTES)
    parser.add_argument("--watch-pid", type=int)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.listen_port, args.upstream_port, args.max_message_bytes,
                      args.watch_pid, args.listen_address))
    return 0


if __name__ == "__main__":
    sys.exit(main())
