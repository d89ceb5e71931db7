"""The raw HTTP sender on the wire, against a scripted socket server on loopback: responses that
arrive in pieces, a server that closes mid-response, a timeout, a chunked answer, a full pool.
Each failure drops its connection only; the next request reconnects and succeeds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from tests.wire_helpers import read_request
from tools.load import Request
from tools.load.senders import CLIENT_TIMEOUT, RawHttp, SendError

OK_BODY = b'{"outputs": []}'


def _ok(body: bytes = OK_BODY) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


async def _serve(script: Callable[[int], bytes | None], *, split: int = 0):
    """A server answering its n-th request (from 0, over all connections) with ``script(n)``:
    bytes to send (in ``split``-byte pieces when ``split``), or None to close the connection
    without answering. Returns the server, its URL and the list of connections it accepted."""
    count = [0]
    accepted: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        while await read_request(reader):
            answer = script(count[0])
            count[0] += 1
            if answer is None:
                writer.close()
                return
            pieces = [answer[i:i + split] for i in range(0, len(answer), split)] if split \
                else [answer]
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
                if split:
                    await asyncio.sleep(0.001)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"127.0.0.1:{port}", accepted


def _request() -> Request:
    return Request.json("toy", {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32",
                                             "data": [1.0]}]})


async def _outcomes(sender: RawHttp, count: int, slots: int = 1) -> list[str]:
    await sender.open(slots)
    prepared = sender.prepare(_request())
    outcomes = []
    try:
        for _ in range(count):
            try:
                body = await sender.send(prepared)
                outcomes.append("ok" if body == OK_BODY else f"body {body!r}")
            except SendError as exc:
                outcomes.append(str(exc))
    finally:
        await sender.close()
    return outcomes


def _run(script: Callable[[int], bytes | None], count: int, *, split: int = 0,
         timeout_s: float = 5.0) -> tuple[list[str], int]:
    async def main() -> tuple[list[str], int]:
        server, url, accepted = await _serve(script, split=split)
        async with server:
            outcomes = await _outcomes(RawHttp(url, timeout_s=timeout_s), count)
        return outcomes, len(accepted)
    return asyncio.run(main())


def test_a_response_that_arrives_a_few_bytes_at_a_time_is_read_whole_on_one_connection():
    outcomes, connections = _run(lambda n: _ok(), 3, split=7)
    assert outcomes == ["ok", "ok", "ok"]
    assert connections == 1


def test_a_server_that_closes_without_answering_fails_that_request_and_the_next_reconnects():
    outcomes, connections = _run(lambda n: None if n == 1 else _ok(), 3)
    assert outcomes[0] == "ok" and outcomes[2] == "ok"
    assert "connection closed by the server" in outcomes[1]
    assert connections == 2


def test_a_timeout_fails_as_client_timeout_and_drops_the_connection():
    def script(n: int) -> bytes | None:
        return b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial" if n == 0 else _ok()

    outcomes, connections = _run(script, 2, timeout_s=0.3)
    assert outcomes == [CLIENT_TIMEOUT, "ok"]
    assert connections == 2


def test_a_non_200_answer_fails_with_its_status_and_error_and_keeps_the_connection():
    refusal = b'{"error": "over its latency target"}'

    def script(n: int) -> bytes:
        if n == 0:
            return (b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: %d"
                    b"\r\n\r\n%s" % (len(refusal), refusal))
        return _ok()

    outcomes, connections = _run(script, 2)
    assert outcomes == ["HTTP 503 over its latency target", "ok"]
    assert connections == 1


def test_a_chunked_answer_is_refused_naming_it_and_the_next_request_reconnects():
    def script(n: int) -> bytes:
        if n == 0:
            return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        return _ok()

    outcomes, connections = _run(script, 2)
    assert "chunked HTTP responses are not supported" in outcomes[0]
    assert outcomes[1] == "ok" and connections == 2


def test_requests_beyond_the_pool_wait_for_a_connection_and_all_get_answers():
    async def main() -> tuple[list[str], int]:
        server, url, accepted = await _serve(lambda n: _ok(), split=0)
        sender = RawHttp(url, timeout_s=5)
        async with server:
            await sender.open(2)
            prepared = sender.prepare(_request())
            bodies = await asyncio.gather(*(sender.send(prepared) for _ in range(6)))
            await sender.close()
        return [b.decode() for b in bodies], len(accepted)

    bodies, connections = asyncio.run(main())
    assert bodies == [OK_BODY.decode()] * 6
    assert connections == 2


@pytest.mark.parametrize("slots", [1, 3])
def test_a_cancelled_send_frees_its_connection_for_the_next(slots):
    async def main() -> list[str]:
        server, url, _ = await _serve(lambda n: _ok(), split=0)
        sender = RawHttp(url, timeout_s=5)
        async with server:
            await sender.open(slots)
            prepared = sender.prepare(_request())
            hung = [asyncio.ensure_future(sender.send(prepared)) for _ in range(slots + 2)]
            await asyncio.sleep(0)
            for task in hung:
                task.cancel()
            await asyncio.gather(*hung, return_exceptions=True)
            bodies = await asyncio.wait_for(
                asyncio.gather(*(sender.send(prepared) for _ in range(slots))), 5)
            await sender.close()
        return [b.decode() for b in bodies]

    assert asyncio.run(main()) == [OK_BODY.decode()] * slots


def test_a_malformed_status_line_fails_that_request_at_once_and_the_next_reconnects():
    outcomes, connections = _run(lambda n: b"HTTP/1.1\r\n\r\n" if n == 0 else _ok(), 2,
                                 timeout_s=5.0)
    assert "malformed status line" in outcomes[0]
    assert outcomes[1] == "ok" and connections == 2
