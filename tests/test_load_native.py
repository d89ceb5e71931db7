"""The C open loop (tools/load/open_loop.c) on the wire, against a scripted socket server on
loopback in a thread: answers in pieces, an error status with its JSON message, a server that
closes mid-request, a chunked answer, a timeout, and latency counted from when a request was due.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from tests.wire_helpers import read_request
from tools.errors import LoadTestError
from tools.load import native
from tools.load.senders import CLIENT_TIMEOUT, http_request_bytes

OK_BODY = b'{"outputs": []}'


def _answer(status: str, body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %s\r\n%sContent-Length: %d\r\n\r\n%s" % (status.encode(), extra,
                                                               len(body), body)


Step = tuple[float, bytes | None]  # seconds to wait, then bytes to send (None: close)


@contextmanager
def _server(script: Callable[[int], Step], split: int = 0) -> Iterator[str]:
    """A server in a thread answering its n-th request (over all connections) per ``script``."""
    ready: list[str] = []
    started = threading.Event()
    count = [0]
    stop: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader):
            wait_s, answer = script(count[0])
            count[0] += 1
            await asyncio.sleep(wait_s)
            if answer is None:
                break
            pieces = [answer[i:i + split] for i in range(0, len(answer), split)] if split \
                else [answer]
            try:
                for piece in pieces:
                    writer.write(piece)
                    await writer.drain()
                    if split:
                        await asyncio.sleep(0.001)
            except ConnectionError:
                break
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        ready.append(f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
        loop = asyncio.get_running_loop()
        stop.append((loop, loop.create_future()))
        started.set()
        async with server:
            await stop[0][1]

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    assert started.wait(5), "the scripted server did not start"
    try:
        yield ready[0]
    finally:
        loop, done = stop[0]
        loop.call_soon_threadsafe(done.set_result, None)
        thread.join(5)


def _requests(url: str, count: int = 1) -> list[bytes]:
    body = b'{"inputs": []}'
    return [http_request_bytes(url, f"/v2/models/toy{i}/infer", body) for i in range(count)]


def test_answers_in_pieces_errors_and_closes_each_fail_alone_and_the_next_reconnects():
    error = _answer("503 Service Unavailable", b'{"error": "model \'toy\' is over its latency '
                    b'target"}', b"Retry-After: 1\r\n")
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    script = {0: (0, _answer("200 OK", OK_BODY)), 1: (0, error), 2: (0, None),
              3: (0, _answer("200 OK", OK_BODY)), 4: (0, chunked),
              5: (0, _answer("200 OK", OK_BODY, b"Connection: close\r\n")),
              6: (0, _answer("200 OK", OK_BODY))}
    with _server(lambda n: script[n], split=7) as url:
        run = native.open_loop(url, _requests(url), rate=20, duration_s=0.35, connections=1,
                               timeout_s=5)
    outcomes = [("ok" if r.ok else r.error) for r in run.records]
    assert outcomes == ["ok", "HTTP 503 model 'toy' is over its latency target",
                        "connection closed", "ok", "chunked answer", "ok", "ok"]
    assert all(r.latency_ms >= 0 for r in run.records)
    assert run.cpu_s >= 0 and run.seconds > 0.3


def test_a_request_past_its_timeout_fails_and_the_next_gets_a_new_connection():
    with _server(lambda n: (1.0 if n == 0 else 0, _answer("200 OK", OK_BODY))) as url:
        run = native.open_loop(url, _requests(url), rate=10, duration_s=0.2, connections=1,
                               timeout_s=0.3)
    first, second = run.records
    assert (first.ok, first.error) == (False, CLIENT_TIMEOUT)
    assert 250 <= first.latency_ms < 900
    assert second.ok


def test_latency_counts_from_when_a_request_was_due_not_from_its_send():
    """One connection, a server taking 0.1 s, a request due every 0.025 s: each waits for the
    connection, so the k-th is answered about 0.1 (k + 1) - 0.025 k s after it was due."""
    with _server(lambda n: (0.1, _answer("200 OK", OK_BODY))) as url:
        run = native.open_loop(url, _requests(url, 3), rate=40, duration_s=0.2, connections=1,
                               timeout_s=5)
    assert [r.ok for r in run.records] == [True] * 8
    starts = [r.start_s for r in run.records]
    assert all(abs((b - a) - 0.025) < 1e-6 for a, b in zip(starts, starts[1:]))
    last = run.records[-1].latency_ms
    assert last >= 0.1 * 8 * 1000 - 0.025 * 7 * 1000 - 5, last
    assert run.records[0].latency_ms < last / 3


def test_many_connections_send_in_parallel():
    with _server(lambda n: (0.2, _answer("200 OK", OK_BODY))) as url:
        run = native.open_loop(url, _requests(url, 4), rate=50, duration_s=0.2, connections=16,
                               timeout_s=5)
    assert len(run.records) == 10 and all(r.ok for r in run.records)
    assert max(r.latency_ms for r in run.records) < 1200  # 10 x 0.2 s would be 2 s on one


def test_nothing_listening_fails_every_request_with_a_reason():
    with _server(lambda n: (0, None)) as url:
        pass  # the port is free again once the server has stopped
    run = native.open_loop(url, _requests(url), rate=20, duration_s=0.1, connections=2,
                           timeout_s=1)
    assert run.records and {r.error for r in run.records} == {"connection refused"}


def test_without_a_compiler_it_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(LoadTestError, match=r"needs a C compiler .* \(--generator python\)"):
        native.binary()


def test_no_requests_is_refused_before_anything_starts():
    with pytest.raises(LoadTestError, match="no request"):
        native.open_loop("127.0.0.1:1", [], rate=1, duration_s=1)
