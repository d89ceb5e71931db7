"""The guards alone: CPU per request of an HTTP or gRPC guard in front of a fake upstream.

No tritonserver: a fake upstream answers at once (HTTP: a text_embedding response of 1.7 KB; gRPC:
a grpcio server returning 1.6 KB), and 32 keep-alive clients (HTTP: raw sockets; gRPC: one grpcio
channel, 32 calls in flight) send a captured tritonclient request for 5 s. Prints requests/s and
the guard process's CPU time per request, the figure that says what the guard itself costs.

    python scripts/guard_micro.py http tools/serve/http_guard.py [--event-loop asyncio]
    python scripts/guard_micro.py grpc tools/serve/grpc_guard.py
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
CLIENTS, SECONDS = 32, 5.0
BODY = (b'{"inputs":[{"name":"TEXT","shape":[1,1],"datatype":"BYTES","parameters":'
        b'{"binary_data_size":15}}],"outputs":[{"name":"EMBEDDING","parameters":'
        b'{"binary_data":true}}]}\x0b\x00\x00\x00hello world')
HEADER = (b'{"model_name":"text_embedding","model_version":"1","outputs":[{"name":"EMBEDDING",'
          b'"datatype":"FP32","shape":[1,384],"parameters":{"binary_data_size":1536}}]}')
RESPONSE = (b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
            b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
            % (len(HEADER), len(HEADER) + 1536)) + HEADER + b"\0" * 1536
METHOD = "/inference.GRPCInferenceService/ModelInfer"
GRPC_REQUEST, GRPC_RESPONSE = b"\n\x0etext_embedding" + b"x" * 150, b"\0" * 1600


def _request(port: int) -> bytes:
    return (b"POST /v2/models/text_embedding/infer HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
            b"Inference-Header-Content-Length: 165\r\nAccept: */*\r\n"
            b"Accept-Encoding: gzip, deflate, br\r\nUser-Agent: Python/3.11 aiohttp/3.14.5\r\n"
            b"Content-Length: %d\r\nContent-Type: application/octet-stream\r\n\r\n"
            % (port, len(BODY))) + BODY


class _Upstream(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buf = transport, b""

    def data_received(self, data):
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            length = int(self.buf[:end].lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length:]
            self.transport.write(RESPONSE)


class _Client(asyncio.Protocol):
    def __init__(self, request, counter):
        self.request, self.counter, self.buf = request, counter, b""

    def connection_made(self, transport):
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data):
        self.buf += data
        if len(self.buf) >= len(RESPONSE):
            self.buf = self.buf[len(RESPONSE):]
            self.counter[0] += 1
            self.transport.write(self.request)


async def _http_upstream(port: int) -> None:
    await asyncio.get_running_loop().create_server(_Upstream, "127.0.0.1", port)
    await asyncio.Event().wait()


async def _http_clients(port: int) -> tuple[int, float]:
    counter, loop = [0], asyncio.get_running_loop()
    for _ in range(CLIENTS):
        await loop.create_connection(lambda: _Client(_request(port), counter), "127.0.0.1", port)
    return await _count(counter)


async def _count(counter: list[int]) -> tuple[int, float]:
    await asyncio.sleep(1)
    start_n, start = counter[0], time.monotonic()
    await asyncio.sleep(SECONDS)
    return counter[0] - start_n, time.monotonic() - start


async def _grpc_upstream(port: int) -> None:
    import grpc

    class Answer(grpc.GenericRpcHandler):
        def service(self, details):
            async def answer(request, context):
                return GRPC_RESPONSE
            return grpc.unary_unary_rpc_method_handler(answer)

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((Answer(),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


async def _grpc_clients(port: int) -> tuple[int, float]:
    import grpc

    call = grpc.aio.insecure_channel(f"127.0.0.1:{port}").unary_unary(METHOD)
    counter, running = [0], [True]

    async def user():
        while running[0]:
            await call(GRPC_REQUEST)
            counter[0] += 1

    users = [asyncio.ensure_future(user()) for _ in range(CLIENTS)]
    result = await _count(counter)
    running[0] = False
    await asyncio.gather(*users)
    return result


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> int:
    if sys.argv[1] in ("_up", "_clients"):
        protocol, port = sys.argv[2], int(sys.argv[3])
        if sys.argv[1] == "_up":
            asyncio.run(_http_upstream(port) if protocol == "http" else _grpc_upstream(port))
        else:
            n, seconds = asyncio.run(_http_clients(port) if protocol == "http"
                                     else _grpc_clients(port))
            print(n, seconds)
        return 0
    protocol, guard, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
    upstream_port, guard_port = _free_port(), _free_port()
    upstream = subprocess.Popen([sys.executable, __file__, "_up", protocol, str(upstream_port)])
    proc = subprocess.Popen([sys.executable, guard, "--listen-port", str(guard_port),
                             "--upstream-port", str(upstream_port), *extra],
                            stderr=subprocess.DEVNULL, env={"PYTHONPATH": str(ROOT)})
    try:
        time.sleep(2)
        guard_proc = psutil.Process(proc.pid)
        before = sum(guard_proc.cpu_times()[:2])
        out = subprocess.run([sys.executable, __file__, "_clients", protocol, str(guard_port)],
                             capture_output=True, text=True, check=True).stdout.split()
        cpu = sum(guard_proc.cpu_times()[:2]) - before
        n, seconds = int(out[0]), float(out[1])
        per_request = 1e6 * cpu / (n * (seconds + 1) / seconds)  # the 1 s warm-up ran too
        print(f"{protocol} {guard} {' '.join(extra)}: {n / seconds:.0f} req/s through the guard, "
              f"guard CPU {per_request:.0f} us/request (load {psutil.getloadavg()[0]:.1f})")
    finally:
        proc.terminate()
        upstream.kill()
        proc.wait(10)
        upstream.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
