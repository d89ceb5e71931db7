"""HTTP framing through the guard in front of a real tritonserver (RFC 9112 section 6.3).

A corpus of malformed and of tricky-but-valid requests (tests/data/http_framing_corpus.json), then
requests made malformed by construction (hypothesis), each sent on a fresh connection with a
readiness request pipelined behind it. A refused request gets its 4xx and the connection closes:
the request behind it is never answered, so no second response can be smuggled onto the
connection. After every case the same tritonserver answers; the RSS of it and of the guard stays
bounded over the whole run.
"""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tools.serve.http_guard import GuardLimits
from tools.serve.server import EmbeddedServer
from waits import child_running

pytestmark = pytest.mark.reliability

CORPUS = json.loads((Path(__file__).parent / "data" / "http_framing_corpus.json").read_text())
LIMITS = GuardLimits(max_body_bytes=1 << 20, max_buffered_bytes=4 << 20, read_timeout_s=5.0)
READY = "GET /v2/health/ready HTTP/1.1\r\nHost: {host}\r\n\r\n"
ANSWER_WITHIN_S = 3.0  # bare LF used to get no answer at all within this time
EXTRA_WAIT_S = 0.3
RSS_GROWTH_BYTES = 32 << 20


@pytest.fixture(scope="module")
def guarded(toy_repository: Path, tmp_path_factory: pytest.TempPathFactory):
    """One tritonserver on the toy repository behind the HTTP guard, for the whole module."""
    log = tmp_path_factory.mktemp("framing") / "tritonserver.log"
    server = EmbeddedServer(toy_repository, http_guard=LIMITS, log_path=log, exit_timeout_s=5)
    server.start(timeout_s=120)
    try:
        yield server
    finally:
        server.stop()


def _guard_process(server: EmbeddedServer) -> psutil.Process:
    port = server.http_url.rpartition(":")[2]
    return child_running("tools.serve.http_guard", port)


def _expand(template: str, host: str) -> bytes:
    text = re.sub(r"\{([^{}*]+)\*(\d+)\}", lambda m: m.group(1) * int(m.group(2)), template)
    return text.replace("{host}", host).encode("latin-1")


def _responses(sock: socket.socket, expected: int | None = None
               ) -> tuple[list[tuple[int, bytes]], bool]:
    """Every response on ``sock`` until it closes or ``ANSWER_WITHIN_S`` passes with nothing more
    (once ``expected`` responses are in: ``EXTRA_WAIT_S``): (status, body) each, and whether the
    server closed the connection."""
    sock.settimeout(ANSWER_WITHIN_S)
    data, responses = b"", []
    closed = False
    while True:
        while True:  # take every whole response out of data
            end = data.find(b"\r\n\r\n")
            if end < 0:
                break
            head = data[:end].decode("latin-1")
            length = int((re.search(r"(?im)^content-length:\s*(\d+)", head) or [0, 0])[1])
            if len(data) < end + 4 + length:
                break
            status = int(head.split(" ", 2)[1])
            if status != 100:
                responses.append((status, data[end + 4:end + 4 + length]))
            data = data[end + 4 + length:]
        if expected is not None and len(responses) >= expected:
            sock.settimeout(EXTRA_WAIT_S)  # long enough for a smuggled extra response to show
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            break
        except ConnectionResetError:
            closed = True
            break
        if not chunk:
            closed = True
            break
        data += chunk
    return responses, closed


def _exchange(server: EmbeddedServer, request: bytes, expected: int | None = None
              ) -> tuple[list[tuple[int, bytes]], bool]:
    host = server.http_url
    address, _, port = host.rpartition(":")
    with socket.create_connection((address, int(port)), timeout=10) as sock:
        try:
            sock.sendall(request + READY.format(host=host).encode())
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused and closed while the rest was still being sent
        return _responses(sock, expected)


def _still_serving(server: EmbeddedServer, pid: int) -> None:
    assert server.pid == pid and psutil.pid_exists(pid) and server.poll() is None
    responses, _ = _exchange(server, b"", expected=1)
    assert [status for status, _ in responses[:1]] == [200], "the next good request is answered"


@pytest.fixture(scope="module")
def baseline(guarded: EmbeddedServer) -> dict[str, int]:
    return {"triton": psutil.Process(guarded.pid).memory_info().rss,
            "guard": _guard_process(guarded).memory_info().rss, "pid": guarded.pid}


@pytest.mark.parametrize("case", CORPUS["refused"], ids=lambda c: c["name"])
def test_a_malformed_request_is_refused_alone_and_the_connection_closed(guarded, baseline, case):
    started = time.monotonic()
    responses, closed = _exchange(guarded, _expand(case["request"], guarded.http_url))
    assert responses, f"no answer within {ANSWER_WITHIN_S} s"
    assert time.monotonic() - started < ANSWER_WITHIN_S + 1
    (status, body), *rest = responses
    assert status == case["status"], body
    assert "error" in json.loads(body), "the guard's own answer names the problem"
    assert rest == [], "nothing after the refusal: the pipelined request is not answered"
    assert closed
    _still_serving(guarded, baseline["pid"])


@pytest.mark.parametrize("case", CORPUS["accepted"], ids=lambda c: c["name"])
def test_a_valid_request_is_answered_and_the_one_behind_it_too(guarded, baseline, case):
    responses, closed = _exchange(guarded, _expand(case["request"], guarded.http_url), expected=2)
    assert [status for status, _ in responses] == [case["status"], 200], responses
    assert not closed


# ---- requests made malformed by construction

_NAMES = st.sampled_from(["Accept", "User-Agent", "X-Trace", "Content-Type", "Cache-Control"])
_VALUES = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e, exclude_characters="{}"),
                  min_size=1, max_size=20)
_INFER_BODY = ('{"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}')
# The request a smuggling attempt would hide in a body: its answer names toy_text.
SMUGGLED = "GET /v2/models/toy_text/config HTTP/1.1\r\nHost: x\r\n\r\n"


@st.composite
def _valid(draw) -> tuple[str, list[tuple[str, str]], str]:
    """A valid request: request line, headers (name, value), body."""
    extra = draw(st.lists(st.tuples(_NAMES, _VALUES), max_size=4))
    if draw(st.booleans()):
        body = _INFER_BODY
        return ("POST /v2/models/toy_double/infer HTTP/1.1",
                [("Host", "{host}"), *extra, ("Content-Length", str(len(body)))], body)
    return "GET /v2/health/ready HTTP/1.1", [("Host", "{host}"), *extra], ""


def _render(line: str, headers: list[tuple[str, str]], body: str, sep: str = "\r\n") -> str:
    return line + sep + "".join(f"{n}: {v}{sep}" for n, v in headers) + sep + body


_CTL = st.sampled_from([chr(c) for c in [*range(0, 9), 11, 12, *range(14, 32), 127]])
_BAD_LENGTHS = st.one_of(
    st.integers(1, 999).map(lambda n: f"+{n}"), st.integers(1, 999).map(lambda n: f"-{n}"),
    st.integers(1, 999).map(lambda n: f"{n}, {n}"), st.integers(1, 999).map(hex),
    st.integers(10, 999).map(lambda n: f"{n // 10} {n % 10}"), st.just(""),
    st.integers(10**18, 10**30).map(str), st.integers(1, 99).map(lambda n: f"{n}.0"))


@st.composite
def _malformed(draw) -> str:
    """A valid request with one mutation that RFC 9112 forbids (each makes it malformed)."""
    line, headers, body = draw(_valid())
    index = draw(st.integers(0, len(headers) - 1))
    name, value = headers[index]
    kind = draw(st.sampled_from(["bare-lf", "bare-cr", "obs-fold", "space-before-colon",
                                 "ctl-in-value", "bad-name", "second-length", "bad-length",
                                 "length-and-te", "no-host", "second-host", "bad-line",
                                 "smuggle-cl-te", "smuggle-te-cl"]))
    if kind in ("bare-lf", "bare-cr"):
        text = _render(line, headers, body)
        head_end = text.index("\r\n\r\n")
        ends = [m.start() for m in re.finditer("\r\n", text[:head_end + 2])]
        at = draw(st.sampled_from(ends))
        return text[:at] + ("\n" if kind == "bare-lf" else "\r") + text[at + 2:]
    if kind == "obs-fold":
        headers.insert(index + 1, (draw(st.sampled_from([" ", "\t", "  "])) + "folded", "x"))
        return _render(line, headers, body).replace("folded: x", "folded x")
    if kind == "space-before-colon":
        headers[index] = (name + draw(st.sampled_from([" ", "\t", " \t"])), value)
    elif kind == "ctl-in-value":
        cut = draw(st.integers(0, len(value)))
        headers[index] = (name, value[:cut] + draw(_CTL) + "z" + value[cut:])
    elif kind == "bad-name":
        headers[index] = (name[:1] + draw(st.sampled_from(list('()<>@,;\\"/[]?={} '))) + name[1:],
                          value)
    elif kind == "second-length":
        headers.insert(index, ("Content-Length", str(draw(st.integers(0, 200)))))
        if not any(n == "Content-Length" for n, _ in headers[index + 1:]):
            headers.append(("Content-Length", str(len(body))))
    elif kind == "bad-length":
        headers = [h for h in headers if h[0] != "Content-Length"]
        headers.append(("Content-Length", draw(_BAD_LENGTHS)))
    elif kind == "length-and-te":
        headers.insert(index, (draw(st.sampled_from(["Transfer-Encoding", "transfer-encoding"])),
                               draw(st.sampled_from(["chunked", "identity", "gzip, chunked",
                                                     "xchunked", "chunked, identity"]))))
        if not any(n == "Content-Length" for n, _ in headers):
            headers.append(("Content-Length", str(len(body))))
    elif kind == "no-host":
        headers = [h for h in headers if h[0] != "Host"]
    elif kind == "second-host":
        headers.insert(index, ("Host", draw(_VALUES)))
    elif kind == "bad-line":
        method, target, version = line.split(" ")
        line = draw(st.sampled_from([f"{method}  {target} {version}", f"{method} {target}",
                                     f"{method} {target} HTTP/1.2", f"{method} {target} HTTP/1",
                                     f"{method} {target} {version} x",
                                     f"{method} x{target} {version}"]))
    elif kind == "smuggle-cl-te":
        hidden = "0\r\n\r\n" + SMUGGLED
        headers = [("Host", "{host}"), ("Content-Length", str(len(hidden))),
                   ("Transfer-Encoding", "chunked")]
        return _render("POST /v2/models/toy_double/infer HTTP/1.1", headers, hidden)
    else:  # smuggle-te-cl
        chunk = f"{len(SMUGGLED):x}\r\n{SMUGGLED}\r\n0\r\n\r\n"
        headers = [("Host", "{host}"), ("Transfer-Encoding", "chunked"), ("Content-Length", "4")]
        return _render("POST /v2/models/toy_double/infer HTTP/1.1", headers, chunk)
    return _render(line, headers, body)


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(request=_malformed())
def test_fuzz_no_malformed_request_is_answered_2xx_nor_smuggles_a_second_one(guarded, baseline,
                                                                          request):
    responses, closed = _exchange(guarded, _expand(request, guarded.http_url))
    assert len(responses) == 1 and 400 <= responses[0][0] < 500, (request, responses)
    assert closed, request
    assert b"toy_text" not in responses[0][1]
    assert guarded.pid == baseline["pid"] and guarded.poll() is None


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(parts=_valid())
def test_fuzz_a_valid_request_is_answered_and_the_connection_serves_on(guarded, baseline, parts):
    responses, closed = _exchange(guarded, _expand(_render(*parts), guarded.http_url), expected=2)
    assert [status for status, _ in responses] == [200, 200], (parts, responses)
    assert not closed


def test_after_the_corpus_and_the_fuzzing_the_server_is_the_same_and_its_memory_bounded(
        guarded, baseline):
    """Runs after the tests above (file order): same pid, and neither tritonserver nor the guard
    grew by more than RSS_GROWTH_BYTES."""
    _still_serving(guarded, baseline["pid"])
    triton = psutil.Process(guarded.pid).memory_info().rss
    guard = _guard_process(guarded).memory_info().rss
    assert triton - baseline["triton"] < RSS_GROWTH_BYTES, (triton, baseline)
    assert guard - baseline["guard"] < RSS_GROWTH_BYTES, (guard, baseline)
