"""The HTTP guard in front of the embedded tritonserver 2.51 (``tools.serve.http_guard``).

Triton 2.51 reads any body whole and aborts on a JSON shape whose byte size overflows
(tests/test_reliability_faults.py shows what it does unguarded). Here a real tritonserver on the
toy repository runs behind the guard, as ``tools serve`` starts it for that binary.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
import numpy as np
import psutil
import tritonclient.http as httpclient

from tools import native_build
from tools.serve import faults
from tools.serve.http_guard import GuardLimits, shape_problem
from tools.net import free_ports, port_in_use
from waits import read_by_peer, wait_until

pytestmark = pytest.mark.reliability

LIMITS = GuardLimits(max_body_bytes=1 << 20, max_buffered_bytes=3 << 20, read_timeout_s=2.0)


def _double(shape: list[int], data: list[float]) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32",
                                   "data": data}]}).encode()


def _head(url: str, length: int, extra: str = "", model: str = "toy_double") -> bytes:
    return (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {url}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n{extra}\r\n").encode()


def _connect(url: str) -> socket.socket:
    host, _, port = url.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _read_response(sock: socket.socket) -> tuple[int, dict, bytes]:
    """One HTTP response from ``sock``: status, headers (lower-case), body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
    length = int(headers.get("content-length", 0))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return int(lines[0].split(" ")[1]), headers, rest[:length]


def _exchange(url: str, request: bytes) -> tuple[int, dict, bytes]:
    with _connect(url) as sock:
        sock.sendall(request)
        return _read_response(sock)


def _infer_ok(url: str) -> np.ndarray:
    with httpclient.InferenceServerClient(url) as client:
        data = np.arange(4, dtype=np.float32).reshape(1, 4)
        tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(data)
        return client.infer("toy_double", [tensor]).as_numpy("OUTPUT0")


def test_a_shape_is_refused_only_when_its_body_cannot_hold_it():
    assert shape_problem(_double([1, 4], [1, 2, 3, 4]), 80) is None
    assert "shape [1, 1099511627776] has 1099511627776 elements, more than the 80-byte" in \
        shape_problem(_double([1, 2 ** 40], [1]), 80)
    assert "input 'INPUT0': shape [1, -4] has a negative dimension" == \
        shape_problem(_double([1, -4], [1, 2, 3, 4]), 80)
    in_shm = json.dumps({"inputs": [{"name": "x", "shape": [1, 2 ** 40], "datatype": "FP32",
                                     "parameters": {"shared_memory_region": "r"}}]}).encode()
    assert shape_problem(in_shm, 90) is None, "data in shared memory is not in the body"
    assert shape_problem(b"not json", 8) is None and shape_problem(b"[1, 2]", 6) is None


def test_the_guard_serves_through_and_refuses_an_oversized_body_before_reading_it(server_factory,
                                                                               toy_repository):
    server = server_factory(toy_repository, http_guard=LIMITS)
    assert server.http_url != server.triton_http_url
    assert np.array_equal(_infer_ok(server.http_url), 2 * np.arange(4, dtype=np.float32).reshape(1, 4))
    rss = faults.sample([server.pid]).rss_bytes

    # 80 MB announced, nothing sent: refused at once and the connection closed
    started = time.monotonic()
    status, headers, body = _exchange(server.http_url, _head(server.http_url, 80_000_000))
    assert status == 413 and headers.get("connection") == "close"
    assert "request body of 80000000 bytes is over the limit of 1048576 bytes" in \
        json.loads(body)["error"]
    assert time.monotonic() - started < 2
    # a client that waits for 100-continue is refused before it sends a byte of its body
    status, _, _ = _exchange(server.http_url,
                             _head(server.http_url, 5_000_000, "Expect: 100-continue\r\n"))
    assert status == 413
    # and one with a body that fits gets 100 Continue, then its answer
    request = _double([1, 4], [1, 2, 3, 4])
    with _connect(server.http_url) as sock:
        sock.sendall(_head(server.http_url, len(request), "Expect: 100-continue\r\n"))
        assert sock.recv(64).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(request)
        status, _, body = _read_response(sock)
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [2, 4, 6, 8]
    assert faults.sample([server.pid]).rss_bytes - rss < 16 << 20, "tritonserver never saw the body"


def test_a_json_shape_that_aborts_triton_251_is_refused_and_the_server_keeps_serving(
    server_factory, toy_repository,
):
    server = server_factory(toy_repository, http_guard=LIMITS)
    pid = server.pid
    with _connect(server.http_url) as sock:  # one keep-alive connection for all of them
        replies = []
        for shape in ([1, 2 ** 40], [2 ** 31, 2 ** 31], [-1, 4], [1, 4]):
            request = _double(shape, [1, 2, 3, 4])
            sock.sendall(_head(server.http_url, len(request)) + request)
            replies.append(_read_response(sock))
    assert [status for status, _, _ in replies] == [400, 400, 400, 200], replies
    assert "input 'INPUT0': shape [1, 1099511627776] has 1099511627776 elements" in \
        json.loads(replies[0][2])["error"]
    assert "negative dimension" in json.loads(replies[2][2])["error"]
    assert server.poll() is None and server.pid == pid
    assert np.array_equal(_infer_ok(server.http_url), 2 * np.arange(4, dtype=np.float32).reshape(1, 4))


def test_large_bodies_beyond_the_budget_and_slow_senders_are_refused_while_others_are_served(
    server_factory, toy_repository,
):
    server = server_factory(toy_repository, http_guard=LIMITS)
    size = 1 << 20  # each at the body limit; the budget holds three
    holders = []
    for _ in range(3):  # send headers and a little of the body, then stall
        sock = _connect(server.http_url)
        sock.sendall(_head(server.http_url, size) + b"{" * 10)
        holders.append(sock)
    wait_until(lambda: all(read_by_peer(sock) for sock in holders), 10,
               "the guard to read the three stalled heads (their bodies hold the budget)")
    try:
        status, _, body = _exchange(server.http_url, _head(server.http_url, size))
        assert status == 503 and "retry later" in json.loads(body)["error"], body
        served = [_infer_ok(server.http_url) for _ in range(20)]  # small bodies pass meanwhile
        assert len(served) == 20
        # the stalled senders get 408 once read_timeout_s (2 s) has passed, and are closed
        replies = [_read_response(sock) for sock in holders]
    finally:
        for sock in holders:
            sock.close()
    assert [status for status, _, _ in replies] == [408] * 3
    # with their budget free again, a large body that fits is served
    request = _double([1, 4], [1, 2, 3, 4]) + b" " * (size - 200)
    status, _, _ = _exchange(server.http_url, _head(server.http_url, len(request)) + request)
    assert status == 200


def test_the_guard_stops_with_the_server_and_frees_its_port(server_factory, toy_repository):
    server = server_factory(toy_repository, http_guard=LIMITS)
    port = int(server.http_url.rpartition(":")[2])
    assert port_in_use(port)
    server.stop()
    assert not port_in_use(port)


def test_a_request_whose_upstream_connection_was_lost_is_sent_once_more_on_a_fresh_one():
    """A fake upstream that drops the first connection it is sent a request on (as a restarted
    or idle-closing server does) and answers on the next: the client sees only the answer."""
    import asyncio

    from tools.serve.http_guard import HttpGuard

    async def scenario() -> tuple[int, bytes, int]:
        seen = []

        async def upstream(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            seen.append(1)
            if len(seen) == 1:
                writer.close()
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            writer.close()

        fake = await asyncio.start_server(upstream, "127.0.0.1", 0)
        guard = HttpGuard(fake.sockets[0].getsockname()[1], LIMITS)
        front = await guard.listen("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", front.sockets[0].getsockname()[1])
        writer.write(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        body = await reader.readexactly(2)
        writer.close()
        fake.close()
        front.close()
        return int(head.split(b" ")[1]), body, len(seen)

    assert asyncio.run(scenario()) == (200, b"ok", 2)


def test_the_cpu_images_tritonserver_wrapper_puts_the_guard_in_front_for_the_compose_flag(
    server_factory, toy_repository, tmp_path,
):
    """docker/tritonserver-cpu.sh, run here on the host with the wheel's binary: compose's
    --http-max-input-size starts the guards on the HTTP and gRPC ports, tritonserver moves
    behind them."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from tools.serve.server import resolve_binary

    root = Path(__file__).resolve().parents[1]
    port, grpc_port = [p for p in free_ports(40) if p < 55000 and not port_in_use(p + 10000)][:2]
    wrapper = tmp_path / "bin" / "tritonserver"  # no ../backends beside it: the wheel's is used
    wrapper.parent.mkdir()
    wrapper.write_bytes((root / "docker" / "tritonserver-cpu.sh").read_bytes())
    wrapper.chmod(0o755)
    os.environ["TRITONSERVER_CPU_BINARY"] = str(resolve_binary())
    os.environ["TRITON_FORGE_HOME"] = str(root)
    try:
        server = server_factory(toy_repository, binary=wrapper, http_port=port,
                                grpc_port=grpc_port, extra_args=("--http-max-input-size=1048576",),
                                allow_open_admin_apis=True)
    finally:
        del os.environ["TRITONSERVER_CPU_BINARY"], os.environ["TRITON_FORGE_HOME"]
    guards = [p for p in psutil.process_iter(["cmdline"])
              if "http_guard.py" in " ".join(p.info["cmdline"] or [])
              and str(port) in (p.info["cmdline"] or [])]
    assert len(guards) == 1 and port_in_use(port + 10000), "tritonserver listens behind it"
    if native_build.compiler() is not None:  # the guard imports its front from the project
        assert [c for c in guards[0].children() if "http_front" in c.name()], \
            "the HTTP guard serves through its native front"
    grpc_guards = [p for p in psutil.process_iter(["cmdline"])
                   if "grpc_guard.py" in " ".join(p.info["cmdline"] or [])
                   and str(grpc_port) in (p.info["cmdline"] or [])]
    assert len(grpc_guards) == 1 and port_in_use(grpc_port + 10000)
    assert np.array_equal(_infer_ok(server.http_url), 2 * np.arange(4, dtype=np.float32).reshape(1, 4))
    status, _, body = _exchange(server.http_url, _head(server.http_url, 2_000_000))
    assert status == 413 and "over the limit of 1048576 bytes" in json.loads(body)["error"]
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        assert client.infer("toy_double", [tensor]).as_numpy("OUTPUT0").tolist() == [[2.0] * 4]
        tensor = grpcclient.InferInput("INPUT0", [1, 1 << 19], "FP32")  # 2 MiB
        tensor.set_data_from_numpy(np.ones((1, 1 << 19), np.float32))
        with pytest.raises(InferenceServerException, match="larger than max"):
            client.infer("toy_double", [tensor])
    server.stop()  # SIGTERM to the group: the guards wait for tritonserver, then exit with it
    guards[0].wait(timeout=10)
    grpc_guards[0].wait(timeout=10)
    assert not port_in_use(port) and not port_in_use(grpc_port)


@pytest.mark.parametrize("flags, metrics", [
    (["--http-port=8000", "--metrics-port=8002"], "0.0.0.0"),  # compose: every address default
    (["--http-port=8000", "--metrics-address=10.0.0.5"], "10.0.0.5"),
])
def test_the_wrapper_moves_only_http_behind_the_guard(tmp_path, flags, metrics):
    """The compose command through docker/tritonserver-cpu.sh, with stand-ins that record their
    arguments: tritonserver's HTTP goes to 127.0.0.1:18000, its metrics stay reachable (they follow
    --http-address unless given), and the guard takes the HTTP address and port."""
    root = Path(__file__).resolve().parents[1]
    record = tmp_path / "record"
    fake = tmp_path / "tritonserver"
    fake.write_text(f'#!/bin/sh\nsleep 0.5\necho "$@" > {record}.server\n')
    fake.chmod(0o755)
    guard = tmp_path / "tools" / "serve" / "http_guard.py"
    guard.parent.mkdir(parents=True)
    guard.write_text(f"import sys\nopen({str(record)!r} + '.guard', 'w').write(' '.join(sys.argv[1:]))\n")
    env = {**os.environ, "TRITONSERVER_CPU_BINARY": str(fake), "TRITON_FORGE_HOME": str(tmp_path)}
    subprocess.run(["sh", str(root / "docker" / "tritonserver-cpu.sh"), "--model-repository=/m",
                    *flags, "--http-max-input-size=16777216"], env=env, check=True, timeout=30)
    wait_until((tmp_path / "record.guard").exists, 10, "the guard, started in the background, "
               "to write its arguments")
    server = (tmp_path / "record.server").read_text().split()
    guard_args = (tmp_path / "record.guard").read_text().split()
    assert server[:1] == ["--model-repository=/m"] and "--http-max-input-size=16777216" not in server
    assert {"--http-address=127.0.0.1", "--http-port=18000", f"--metrics-address={metrics}"} <= set(server)
    assert " ".join(guard_args).startswith(
        "--listen-address 0.0.0.0 --listen-port 8000 --upstream-port 18000 --max-body-bytes 16777216")


async def _through_fake_upstream(raw: bytes, admission=None, answer=b"HTTP/1.1 200 OK\r\n"
                                 b"Content-Length: 2\r\n\r\nok") -> tuple[bytes, list[bytes]]:
    """Send ``raw`` to a guard in front of a fake upstream; (what the client got until the guard
    closed or went quiet, every request head and body the upstream received)."""
    import asyncio

    from tools.serve.http_guard import HttpGuard

    seen: list[bytes] = []

    async def upstream(reader, writer):
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            seen.append(head + await reader.readexactly(length))
            writer.write(answer)
            await writer.drain()

    fake = await asyncio.start_server(upstream, "127.0.0.1", 0)
    guard = HttpGuard(fake.sockets[0].getsockname()[1], LIMITS, admission)
    front = await guard.listen("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", front.sockets[0].getsockname()[1])
    writer.write(raw)
    got = b""
    while True:
        try:
            chunk = await asyncio.wait_for(reader.read(65536), 1.0)
        except asyncio.TimeoutError:
            break
        if not chunk:
            break
        got += chunk
    writer.close()
    fake.close()
    front.close()
    return got, seen


def test_what_goes_upstream_is_the_head_as_parsed_not_the_clients_bytes():
    import asyncio

    body = _double([1, 4], [1, 2, 3, 4])
    raw = (b"POST /v2/models/toy_double/infer HTTP/1.1\r\nHost:   x  \r\ncontent-length: 00"
           + str(len(body)).encode() + b"\r\nX-Trace:\tabc \t\r\nExpect: 100-continue\r\n"
           b"Upgrade: h2c\r\n\r\n" + body)
    got, seen = asyncio.run(_through_fake_upstream(raw))
    assert got.endswith(b"\r\n\r\nok")
    assert seen == [b"POST /v2/models/toy_double/infer HTTP/1.1\r\nHost: x\r\ncontent-length: "
                    + str(len(body)).encode() + b"\r\nX-Trace: abc\r\n\r\n" + body]


def test_a_gzip_body_is_bounded_and_its_shapes_checked_before_tritonserver_decodes_it():
    import asyncio
    import gzip

    def request(payload: bytes) -> bytes:
        return (b"POST /v2/models/toy_double/infer HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip"
                b"\r\nContent-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)

    huge_shape = gzip.compress(_double([1, 2 ** 40], [1]))
    got, seen = asyncio.run(_through_fake_upstream(request(huge_shape)))
    assert got.startswith(b"HTTP/1.1 400 ") and b"1099511627776 elements" in got and seen == []
    bomb = gzip.compress(b" " * (LIMITS.max_body_bytes + 1))  # ~1 KiB that decodes past the limit
    got, seen = asyncio.run(_through_fake_upstream(request(bomb)))
    assert got.startswith(b"HTTP/1.1 413 ") and b"decodes (gzip) to more than" in got
    assert seen == []
    fine = gzip.compress(_double([1, 4], [1, 2, 3, 4]))
    got, seen = asyncio.run(_through_fake_upstream(request(fine)))
    assert got.endswith(b"ok") and len(seen) == 1 and seen[0].endswith(fine)


def test_an_admission_decides_per_model_before_tritonserver_sees_the_request():
    import asyncio

    from tools.serve.http_guard import Admission, Overloaded

    finished = []

    class BusyModel(Admission):
        def admit(self, model, size=1):
            if model == "busy":
                raise Overloaded("model 'busy' is over its latency target", retry_after_s=2.5)
            return finished.append

    body = _double([1, 4], [1, 2, 3, 4])
    raw = (b"POST /v2/models/busy/infer HTTP/1.1\r\nHost: x\r\nContent-Length: "
           + str(len(body)).encode() + b"\r\n\r\n" + body
           + b"POST /v2/models/toy_double/versions/1/infer HTTP/1.1\r\nHost: x\r\n"
           b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got, seen = asyncio.run(_through_fake_upstream(raw, BusyModel()))
    first, _, second = got.partition(b"}")
    assert first.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 3\r\n" in first
    assert b"over its latency target" in first
    assert second.endswith(b"ok"), "the connection serves the next request"
    assert [s.split(b" ")[1] for s in seen] == [b"/v2/models/toy_double/versions/1/infer"]
    assert finished == [200]


def test_admission_decides_before_any_decoding_and_a_bad_shape_it_admitted_is_counted_out():
    # An overloaded model's refusal costs no gzip or JSON decoding (the cheapest refusal on the
    # cores the server shares); a request admitted and then refused for its shape releases its
    # place in the model's count at once, with a failure (it was never sent).
    import asyncio
    import gzip

    from tools.serve import http_guard
    from tools.serve.http_guard import Admission, Overloaded

    finished, decoded_bodies = [], []

    class Gate(Admission):
        def admit(self, model, size=1):
            if model == "busy":
                raise Overloaded("model 'busy' is over its latency target", retry_after_s=1.0)
            return finished.append

    def request(model: bytes, payload: bytes) -> bytes:
        return (b"POST /v2/models/" + model + b"/infer HTTP/1.1\r\nHost: x\r\nContent-Encoding: "
                b"gzip\r\nContent-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)

    real_decoded = http_guard.decoded

    def counting_decoded(body, coding, limit):
        decoded_bodies.append(body)
        return real_decoded(body, coding, limit)

    huge_shape = gzip.compress(_double([1, 2 ** 40], [1]))
    original = http_guard.decoded
    http_guard.decoded = counting_decoded
    try:
        busy, seen_busy = asyncio.run(_through_fake_upstream(request(b"busy", huge_shape), Gate()))
        bad, seen_bad = asyncio.run(_through_fake_upstream(request(b"toy_double", huge_shape),
                                                          Gate()))
    finally:
        http_guard.decoded = original
    assert busy.startswith(b"HTTP/1.1 503 ") and seen_busy == []
    assert bad.startswith(b"HTTP/1.1 400 ") and b"1099511627776 elements" in bad and seen_bad == []
    assert decoded_bodies == [huge_shape], "only the admitted request was decoded"
    assert finished == [0], "the admitted bad request was counted out as a failure"


def test_an_admission_refusal_is_held_before_it_is_sent_and_a_malformed_request_is_not():
    # A client that retries a refusal at once would otherwise spin (docs/guards.md): the 503 of
    # an overloaded model comes REFUSAL_HOLD_S after its request; a 400 at once. A client that
    # goes away during the hold leaves nothing behind.
    import asyncio
    import time

    from tools.serve.http_guard import (MAX_HELD_REFUSALS, REFUSAL_HOLD_S, Admission, HttpGuard,
                                        Overloaded)

    class Busy(Admission):
        def admit(self, model, size=1):
            raise Overloaded("model 'busy' is over its latency target", retry_after_s=1.0)

    body = _double([1, 4], [1, 2, 3, 4])
    busy = (b"POST /v2/models/busy/infer HTTP/1.1\r\nHost: x\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)
    malformed = b"POST /v2/models/busy/infer HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"

    async def first_byte_after(guard_port: int, raw: bytes) -> tuple[float, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", guard_port)
        start = time.monotonic()
        writer.write(raw)
        line = await asyncio.wait_for(reader.readline(), 5)
        elapsed = time.monotonic() - start
        writer.close()
        return elapsed, line

    async def main():
        upstream = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        guard = HttpGuard(upstream.sockets[0].getsockname()[1], LIMITS, Busy())
        front = await guard.listen("127.0.0.1", 0)
        port = front.sockets[0].getsockname()[1]
        held = await first_byte_after(port, busy)
        at_once = await first_byte_after(port, malformed)
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(busy)
        await writer.drain()
        writer.close()  # gone during the hold: answered into the void, then closed after lingering
        for _ in range(50):
            await asyncio.sleep(0.1)
            if not guard.connections:
                break
        left = len(guard.connections)
        # a flood: MAX_HELD_REFUSALS are held at a time, the rest answered at once
        flood = await asyncio.gather(*(first_byte_after(port, busy)
                                       for _ in range(MAX_HELD_REFUSALS + 8)))
        front.close()
        upstream.close()
        return held, at_once, left, flood, guard.held

    held, at_once, left, flood, still_held = asyncio.run(main())
    assert all(line.startswith(b"HTTP/1.1 503 ") for _, line in flood)
    assert sum(seconds >= REFUSAL_HOLD_S for seconds, _ in flood) == MAX_HELD_REFUSALS
    assert still_held == 0
    assert held[1].startswith(b"HTTP/1.1 503 ") and held[0] >= REFUSAL_HOLD_S, held
    assert at_once[1].startswith(b"HTTP/1.1 400 ") and at_once[0] < REFUSAL_HOLD_S, at_once
    assert left == 0
