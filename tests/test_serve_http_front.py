"""The HTTP guard's native front (``tools/serve/http_front.c``): it serves the common request
itself, hands every other connection to the Python guard at a request boundary with exactly the
bytes read so far, counts each model's work in flight against the cap Python pushes, and ends
with the guard (which takes the port over if the front dies).

Real sockets on loopback: the front process, the Python guard in this event loop, and a fake
tritonserver that records what reaches it.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tools import native_build, net
from tools.serve.admission import SloAdmission
from tools.serve.http_front import NativeFront, front_binary
from tools.serve.http_guard import REFUSAL_HOLD_S, GuardLimits, HttpGuard, Overloaded

pytestmark = pytest.mark.skipif(native_build.compiler() is None or not sys.platform.startswith(
    "linux"), reason="the native front needs Linux and a C compiler (cc or gcc) on PATH")

HOST = "Host: 127.0.0.1\r\n"
JSON = b'{"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["hi"]}]}'
# As json.dumps writes text: every non-ASCII character escaped (and a quoted "shape" in the text)
ESCAPED = json.dumps({"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES",
                                  "data": ['caf\u00e9 \u4e2d "shape": [99999] \\ \n']}]}).encode()


class _Upstream:
    """A fake tritonserver: records each request (head and body) and answers 200 ``ok``, each
    after ``gate`` opens when one is set."""

    def __init__(self) -> None:
        self.requests: list[bytes] = []
        self.gate: asyncio.Event | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                match = re.search(rb"\r\ncontent-length: *([0-9]+)", head, re.IGNORECASE)
                body = await reader.readexactly(int(match.group(1)) if match else 0)
                self.requests.append(head + body)
                if self.gate is not None:
                    await self.gate.wait()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                             b"Content-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


class _Front:
    """The front on a port of its own, the Python guard it hands off to, and the hand-offs."""

    def __init__(self, upstream_port: int, admission: SloAdmission | None = None,
                 read_timeout_s: float = 5.0) -> None:
        self.guard = HttpGuard(upstream_port, GuardLimits(read_timeout_s=read_timeout_s))
        self.listener = socket.create_server((net.LOOPBACK, 0))
        self.port = self.listener.getsockname()[1]
        self.handed: list[bytes] = []
        self.guard.start_sweeping()
        self.native = NativeFront(self.listener, upstream_port, read_timeout_s, self._adopt,
                                  lambda: None, admission, front_binary())

    def _adopt(self, sock: socket.socket, initial: bytes) -> None:
        self.handed.append(initial)
        self.guard.adopt(sock, initial)

    async def close(self) -> None:
        await self.native.close()
        self.listener.close()


async def _with_front(test: Callable, admission: SloAdmission | None = None,
                      read_timeout_s: float = 5.0) -> None:
    upstream = _Upstream()
    server = await asyncio.start_server(upstream.handle, net.LOOPBACK, 0)
    front = _Front(server.sockets[0].getsockname()[1], admission, read_timeout_s)
    try:
        await asyncio.wait_for(test(front, upstream), 30)
    finally:
        await front.close()
        server.close()


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes, bytes]:
    """One response: status, head, body (Content-Length framed, as every answer here is)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(re.search(rb"\r\ncontent-length: *([0-9]+)", head, re.IGNORECASE).group(1))
    return int(head[9:12]), head, await reader.readexactly(length)


def _infer(model: str = "m", body: bytes = JSON, extra: str = "") -> bytes:
    return (f"POST /v2/models/{model}/infer HTTP/1.1\r\n{HOST}{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def _binary_infer() -> bytes:
    """As tritonclient.http sends a tensor in binary: a JSON part, then its bytes."""
    header = b'{"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"FP32","parameters":' \
             b'{"binary_data_size":16}}]}'
    return _infer(body=header + bytes(16), extra=f"Inference-Header-Content-Length: "
                                                 f"{len(header)}\r\nUser-Agent: client\r\n")


def test_the_common_requests_are_served_by_the_front_with_the_head_as_parsed():
    async def test(front: _Front, upstream: _Upstream) -> None:
        reader, writer = await asyncio.open_connection(net.LOOPBACK, front.port)
        requests = [_binary_infer(), _infer(), _infer(body=ESCAPED), b"GET /v2/health/ready HTTP/1.1\r\n" + HOST.encode()
                    + b"Accept:   */*  \r\n\r\n", b"\r\n" + _infer(model="other")]
        for request in requests:
            writer.write(request)
            status, _, body = await _response(reader)
            assert (status, body) == (200, b"ok")
        writer.write(_infer() + _infer(model="pipelined"))  # pipelined: answered in order
        assert [(await _response(reader))[0] for _ in range(2)] == [200, 200]
        writer.close()
        assert front.handed == []
        assert len(upstream.requests) == 7
        assert upstream.requests[0] == _binary_infer()  # already as the guard would write it
        assert upstream.requests[2] == _infer(body=ESCAPED)
        assert b"\r\nAccept: */*\r\n" in upstream.requests[3]  # serialised from the parsed field
        assert upstream.requests[4] == _infer(model="other")  # the empty line before it dropped

    asyncio.run(_with_front(test))


HANDED_OFF = {
    "HTTP/1.0": (b"GET /v2/health/ready HTTP/1.0\r\n\r\n", 200),
    "Expect: 100-continue": (_infer(extra="Expect: 100-continue\r\n"), 200),
    "chunked body": (b"POST /v2/models/m/infer HTTP/1.1\r\n" + HOST.encode()
                     + b"Transfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n", 411),
    "gzip body": (_infer(body=gzip.compress(JSON), extra="Content-Encoding: gzip\r\n"), 200),
    "Content-Length with a leading zero": (b"POST /x HTTP/1.1\r\n" + HOST.encode()
                                           + b"Content-Length: 02\r\n\r\nhi", 200),
    "an underscore in a name": (b"GET /x HTTP/1.1\r\n" + HOST.encode()
                                + b"Content_Length: 5\r\n\r\n", 400),
    "OPTIONS *": (b"OPTIONS * HTTP/1.1\r\n" + HOST.encode() + b"\r\n", 200),
    "a body over 64 KiB": (_infer(body=b'{"inputs": []}' + b" " * 70000), 200),
    "an escaped key": (_infer(body=b'{"inputs": [{"sh\\u0061pe": [1]}]}'), 200),
    "an escaped key over the body": (_infer(body=b'{"inputs": [{"name": "x", "\\u0073hape": '
                                                b'[1, 99999], "datatype": "FP32", "data": [1]}]}'),
                                     400),
    "a string that does not end": (_infer(body=b'{"inputs": [{"shape": [1], "name": "x}]}'), 200),
    "a shape over the body": (_infer(body=b'{"inputs": [{"name": "x", "shape": [1, 99999], '
                                          b'"datatype": "FP32", "data": [1]}]}'), 400),
    "a shape over the body, then zero": (_infer(body=b'{"inputs": [{"shape": [99999, 0]}]}'),
                                         None),
    "a bare LF": (b"GET /x HTTP/1.1\n" + HOST.encode() + b"\r\n", 400),
    "obs-fold": (b"GET /x HTTP/1.1\r\n" + HOST.encode() + b" folded\r\n\r\n", 400),
    "two Host": (b"GET /x HTTP/1.1\r\n" + HOST.encode() * 2 + b"\r\n", 400),
    "no Host": (b"GET /x HTTP/1.1\r\nAccept: */*\r\n\r\n", 400),
    "two Content-Length": (b"POST /x HTTP/1.1\r\n" + HOST.encode()
                           + b"Content-Length: 1\r\nContent-Length: 1\r\n\r\nx", 400),
    "Inference-Header-Content-Length over the body": (
        _infer(extra="Inference-Header-Content-Length: 999\r\n"), 400),
}


@pytest.mark.parametrize("case", sorted(HANDED_OFF))
def test_every_other_request_goes_to_python_at_its_boundary_with_the_bytes_sent(case):
    request, status = HANDED_OFF[case]

    async def test(front: _Front, upstream: _Upstream) -> None:
        reader, writer = await asyncio.open_connection(net.LOOPBACK, front.port)
        writer.write(_infer())  # served by the front first: the hand-off is mid-connection
        assert (await _response(reader))[0] == 200
        writer.write(request)
        if status is None:  # served: a zero dimension holds nothing, whatever the others
            assert (await _response(reader))[0] == 200
            assert front.handed == []
            return
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n"), 5)
        assert answer.startswith(b"HTTP/1.1 %d " % status), answer
        # every byte after the first request, none before (the rest of a long body follows on
        # the socket itself)
        assert len(front.handed) == 1 and request.startswith(front.handed[0]), front.handed
        assert b"\r\n\r\n" in front.handed[0] or front.handed[0] == request

    asyncio.run(_with_front(test))


def test_a_slow_sender_gets_408_from_the_front_and_an_idle_connection_is_closed():
    async def test(front: _Front, upstream: _Upstream) -> None:
        reader, writer = await asyncio.open_connection(net.LOOPBACK, front.port)
        writer.write(b"GET /v2/health/ready HTTP/1.1\r\n" + HOST.encode())  # and no more
        status, head, body = await asyncio.wait_for(_response(reader), 5)
        assert status == 408 and b"Connection: close" in head and b"headers" in body
        idle_reader, _ = await asyncio.open_connection(net.LOOPBACK, front.port)
        assert await asyncio.wait_for(idle_reader.read(), 5) == b""  # closed, nothing said
        assert front.handed == []

    asyncio.run(_with_front(test, read_timeout_s=1.0))


def test_the_front_counts_a_models_work_in_flight_against_the_pushed_cap_and_reports_back():
    async def read_config(port: int, model: str) -> dict:
        return {"parameters": {"admission_p99_ms": {"string_value": "200"}}}

    admission = SloAdmission(1, Overloaded, read_config=read_config)

    async def test(front: _Front, upstream: _Upstream) -> None:
        reader, writer = await asyncio.open_connection(net.LOOPBACK, front.port)
        writer.write(_infer())  # the model is seen: its target is read and its cap pushed
        assert (await _response(reader))[0] == 200
        await asyncio.sleep(0.4)
        upstream.gate = asyncio.Event()
        # Until its rate is measured the cap is 32 requests of the mean size: 32 held upstream
        held = [await asyncio.open_connection(net.LOOPBACK, front.port) for _ in range(32)]
        for _, w in held:
            w.write(_infer())
        while len(upstream.requests) < 33:
            await asyncio.sleep(0.01)
        started = time.monotonic()
        writer.write(_infer())
        status, head, body = await _response(reader)
        waited = time.monotonic() - started
        assert status == 503 and b"Retry-After: 1\r\n" in head, head
        assert b"model 'm' is over its latency target (32 requests in flight" in body, body
        assert waited >= REFUSAL_HOLD_S * 0.9, waited
        upstream.gate.set()
        assert [(await _response(r))[0] for r, _ in held] == [200] * 32
        writer.write(_infer())  # the connection serves on after its refusal
        assert (await _response(reader))[0] == 200
        limit = admission.limits["m"]
        for _ in range(100):  # completions are reported within 0.25 s
            if len(limit._recent) >= 33:
                break
            await asyncio.sleep(0.02)
        # every success but the first (sent before the target was read, so not counted, as in
        # SloAdmission), the refusal not
        assert len(limit._recent) == 33, len(limit._recent)
        assert front.handed == []

    asyncio.run(_with_front(test, admission))


def _guard(upstream_port: int, command: tuple[str, ...] = ("-m", "tools.serve.http_guard"),
           front: str = "native", env: dict[str, str] | None = None,
           expect_front: bool = True) -> tuple[subprocess.Popen, int]:
    port = net.free_ports(1)[0]
    process = subprocess.Popen(
        [sys.executable, *command, "--listen-port", str(port),
         "--upstream-port", str(upstream_port), "--no-slo-admission", "--front", front],
        stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        front_started = [c for c in psutil.Process(process.pid).children()
                         if "http_front" in c.name()]
        if (front_started or not expect_front) and net.accepts(port):
            return process, port
        time.sleep(0.05)
    process.kill()
    raise AssertionError(f"the guard did not start: {process.communicate()[1]}")


def _get_ready(port: int) -> bytes:
    with socket.create_connection((net.LOOPBACK, port), timeout=5) as sock:
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\n" + HOST.encode() + b"\r\n")
        return sock.recv(4096)


@pytest.fixture()
def upstream_port():
    """A fake tritonserver in a thread of its own."""
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(_Upstream().handle, net.LOOPBACK, 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield server.sockets[0].getsockname()[1]
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def test_when_the_front_dies_the_guard_serves_the_port_itself(upstream_port):
    process, port = _guard(upstream_port)
    try:
        assert _get_ready(port).startswith(b"HTTP/1.1 200")
        front = next(c for c in psutil.Process(process.pid).children() if "http_front" in c.name())
        front.kill()
        front.wait(5)
        deadline = time.monotonic() + 5
        answer = b""
        while time.monotonic() < deadline and not answer.startswith(b"HTTP/1.1 200"):
            try:
                answer = _get_ready(port)
            except OSError:
                time.sleep(0.1)
        assert answer.startswith(b"HTTP/1.1 200"), answer
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=10)
    assert "the native front exited" in err and "the Python guard serves the port now" in err, err


def test_the_front_ends_with_the_guard_and_frees_the_port(upstream_port):
    process, port = _guard(upstream_port)
    front = next(c for c in psutil.Process(process.pid).children() if "http_front" in c.name())
    os.kill(process.pid, signal.SIGKILL)
    process.communicate(timeout=10)
    front.wait(5)  # raises if it is still running
    assert not net.accepts(port)


def _as_in_the_cpu_image(tmp_path, front: str) -> dict[str, str]:
    """The environment docker/tritonserver-cpu.sh gives the guard in the CPU image: the project
    on PYTHONPATH, ``TRITON_FORGE_HTTP_FRONT`` naming ``front``, and no C compiler on PATH."""
    no_compiler = tmp_path / "bin"
    no_compiler.mkdir(exist_ok=True)
    root = Path(__file__).resolve().parents[1]
    return {**os.environ, "PATH": str(no_compiler), "PYTHONPATH": str(root),
            "TRITON_FORGE_HTTP_FRONT": front}


def test_a_front_built_beforehand_serves_where_there_is_no_compiler(upstream_port, tmp_path):
    """As in the CPU image: scripts/compose-images.sh links the front statically
    (``python -m tools.native_build ... --static``), the guard runs as a script with no
    compiler on PATH, and the front it starts is that binary, serving the common request."""
    root = Path(__file__).resolve().parents[1]
    prebuilt = tmp_path / "front" / "http_front"
    subprocess.run([sys.executable, "-m", "tools.native_build", str(root / "tools" / "serve" /
                    "http_front.c"), "--static", "--output", str(prebuilt)], check=True, cwd=root)
    process, port = _guard(upstream_port, (str(root / "tools" / "serve" / "http_guard.py"),),
                           "auto", _as_in_the_cpu_image(tmp_path, str(prebuilt)))
    try:
        front = next(c for c in psutil.Process(process.pid).children() if "http_front" in c.name())
        assert front.exe() == str(prebuilt)
        assert _get_ready(port).startswith(b"HTTP/1.1 200")
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=10)
    assert f"native front {prebuilt}" in err, err


def test_a_named_front_that_is_not_there_leaves_the_guard_serving_in_python(upstream_port, tmp_path):
    missing = tmp_path / "nowhere" / "http_front"
    root = Path(__file__).resolve().parents[1]
    process, port = _guard(upstream_port, (str(root / "tools" / "serve" / "http_guard.py"),),
                           "auto", _as_in_the_cpu_image(tmp_path, str(missing)), expect_front=False)
    try:
        assert not [c for c in psutil.Process(process.pid).children() if "http_front" in c.name()]
        assert _get_ready(port).startswith(b"HTTP/1.1 200")
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=10)
    assert f"TRITON_FORGE_HTTP_FRONT={missing} is not an executable file" in err, err
    assert "served in Python" in err, err
