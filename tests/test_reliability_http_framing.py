"""HTTP framing through the front (RFC 9112 section 6.3): refused, or re-framed, never passed on
as sent.

A corpus of malformed and of tricky-but-valid requests (tests/data/http_framing_corpus.json),
then requests made malformed by construction (hypothesis), each sent on a fresh connection with
a readiness request pipelined behind it. Two servers sit behind the same rendered front: a
recorder that keeps every request the front forwards, byte for byte (it shows what tritonserver
would receive), and a real tritonserver. A malformed request is either refused (a 4xx, nothing
of it forwarded) or re-framed: the server behind gets one request per request, with CRLF line
ends, a well-formed request line, no folded line, no Transfer-Encoding and one Content-Length
matching its body, so it cannot read a second request out of the first. After the corpus the
same tritonserver answers, and neither it nor HAProxy grew.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
from pathlib import Path

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tools.front.plan import FrontPlan, Limits
from tools.front.process import FrontProcess, find_haproxy
from tools.net import free_ports
from tools.serve.server import EmbeddedServer

pytestmark = [pytest.mark.reliability, pytest.mark.server]

CORPUS = json.loads((Path(__file__).parent / "data" / "http_framing_corpus.json").read_text())
LIMITS = Limits(max_body_bytes=1 << 20, request_timeout_s=3)
READY = "GET /v2/health/ready HTTP/1.1\r\nHost: {host}\r\n\r\n"
ANSWER_WITHIN_S = 5.0
RSS_GROWTH_BYTES = 32 << 20
_REQUEST_LINE = re.compile(rb"^[!#$%&'*+.^_`|~0-9A-Za-z-]+ /\S* HTTP/1\.1$")


class Recorder:
    """A server behind the front that keeps the raw head and body of every request it gets and
    answers each ``200 {"ok": true}``."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.requests: list[tuple[bytes, bytes]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        data = b""
        with conn:
            try:
                while True:
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(65536)
                        if not chunk:
                            return
                        data += chunk
                    head, _, data = data.partition(b"\r\n\r\n")
                    lengths = re.findall(rb"(?im)^content-length:\s*(\d+)\s*$", head)
                    length = int(lengths[0]) if lengths else 0
                    while len(data) < length:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    with self._lock:
                        self.requests.append((head, data[:length]))
                    data = data[length:]
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: 11\r\n\r\n{\"ok\":true}")
            except OSError:
                return

    def since(self, count: int) -> list[tuple[bytes, bytes]]:
        with self._lock:
            return [r for r in self.requests[count:] if b"/config" not in r[0].split(b"\r\n")[0]]

    def close(self) -> None:
        self._listener.close()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory):
    """The front, rendered for one capped model, with the recorder behind it."""
    recorder = Recorder()
    http, grpc = free_ports(2)
    front = FrontProcess(FrontPlan({"toy_double": 300.0}, ("toy_double",), LIMITS),
                         find_haproxy(), http_port=http, grpc_port=grpc,
                         triton_http_port=recorder.port, triton_grpc_port=recorder.port,
                         watch_pid=os.getpid())
    front.start(tmp_path_factory.mktemp("framing") / "front.log")
    try:
        yield front, recorder
    finally:
        front.stop()
        recorder.close()


@pytest.fixture(scope="module")
def fronted(toy_repository: Path, tmp_path_factory: pytest.TempPathFactory):
    """A real tritonserver on the toy repository behind the front, for the whole module."""
    log = tmp_path_factory.mktemp("framing-triton") / "tritonserver.log"
    server = EmbeddedServer(toy_repository, front=LIMITS, log_path=log, exit_timeout_s=5)
    server.start(timeout_s=120)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def baseline(fronted: EmbeddedServer) -> dict[str, int]:
    return {"triton": psutil.Process(fronted.pid).memory_info().rss,
            "haproxy": _haproxy_rss(fronted), "pid": fronted.pid}


def _haproxy_rss(server: EmbeddedServer) -> int:
    return sum(p.memory_info().rss
               for p in psutil.Process(server.front._proc.pid).children(recursive=True))


def _expand(template: str, host: str) -> bytes:
    text = re.sub(r"\{([^{}*]+)\*(\d+)\}", lambda m: m.group(1) * int(m.group(2)), template)
    return text.replace("{host}", host).encode("latin-1")


def _exchange(port: int, request: bytes) -> list[tuple[int, bytes]]:
    """Send ``request`` and a pipelined readiness request on a fresh connection; every response
    until the front closes or nothing more comes within ``ANSWER_WITHIN_S`` (a refusal closes
    the connection: the readiness request behind it then gets no answer)."""
    host = f"127.0.0.1:{port}"
    data, responses = b"", []
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_WITHIN_S) as sock:
        try:
            sock.sendall(request + READY.format(host=host).encode())
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused and closed while the rest was still being sent
        while len(responses) < 2:
            try:
                chunk = sock.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not chunk:
                break
            data += chunk
            while b"\r\n\r\n" in data:
                head, _, rest = data.partition(b"\r\n\r\n")
                length = int((re.search(rb"(?im)^content-length:\s*(\d+)", head) or [0, b"0"])[1])
                if len(rest) < length:
                    break
                status = int(head.split(b" ", 2)[1])
                if status != 100:
                    responses.append((status, rest[:length]))
                data = rest[length:]
    return responses


def _unambiguous(head: bytes, body: bytes) -> list[str]:
    """What makes a forwarded request ambiguous, in words (none: it is not)."""
    problems = []
    lines = head.split(b"\r\n")
    if b"\n" in head.replace(b"\r\n", b"") or b"\r" in head.replace(b"\r\n", b""):
        problems.append("a bare LF or CR")
    if not _REQUEST_LINE.match(lines[0]):
        problems.append(f"request line {lines[0]!r}")
    names = [line.partition(b":")[0].lower() for line in lines[1:]]
    if any(line[:1] in (b" ", b"\t") for line in lines[1:]):
        problems.append("a folded line")
    if any(not re.fullmatch(rb"[!#$%&'*+.^_`|~0-9a-z-]+", n) for n in names):
        problems.append(f"a header name that is not a token: {names}")
    if b"transfer-encoding" in names:
        problems.append("Transfer-Encoding")
    lengths = [line.partition(b":")[2].strip() for line in lines[1:]
               if line.partition(b":")[0].lower() == b"content-length"]
    if len(lengths) > 1 or (lengths and int(lengths[0]) != len(body)):
        problems.append(f"Content-Length {lengths} for a body of {len(body)}")
    return problems


def _check_refused_or_reframed(recorded, request: bytes) -> None:
    front, recorder = recorded
    before = len(recorder.requests)
    responses = _exchange(front.http_port, request)
    forwarded = recorder.since(before)
    assert responses, "the front answered"
    status = responses[0][0]
    if 400 <= status < 500:
        # refused: nothing of it forwarded, and the connection closed behind the refusal
        assert forwarded == [] and len(responses) == 1, (responses, forwarded)
    else:
        assert status == 200, responses
        for head, body in forwarded:
            assert _unambiguous(head, body) == [], (head, body)
        assert len(forwarded) <= 3, "one request forwarded per request the front answered"
    assert not any(b"toy_text" in head for head, _ in forwarded), "nothing smuggled"


@pytest.mark.parametrize("case", CORPUS["malformed"], ids=lambda c: c["name"])
def test_a_malformed_request_is_refused_or_reframed_never_passed_on_as_sent(recorded, case):
    front, _ = recorded
    _check_refused_or_reframed(recorded, _expand(case["request"], f"127.0.0.1:{front.http_port}"))


@pytest.mark.parametrize("case", CORPUS["valid"], ids=lambda c: c["name"])
def test_a_valid_request_is_answered_by_tritonserver_and_the_one_behind_it_too(fronted, baseline,
                                                                              case):
    port = int(fronted.http_url.rpartition(":")[2])
    responses = _exchange(port, _expand(case["request"], fronted.http_url))
    assert [status for status, _ in responses] == [case["status"], 200], responses


# ---- requests made malformed by construction

_NAMES = st.sampled_from(["Accept", "User-Agent", "X-Trace", "Content-Type", "Cache-Control"])
_VALUES = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e, exclude_characters="{}"),
                  min_size=1, max_size=20)
_INFER_BODY = ('{"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}')
# The request a smuggling attempt would hide in a body: its path names toy_text.
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
def test_fuzz_a_malformed_request_is_refused_or_reframed_and_smuggles_nothing(recorded, request):
    front, _ = recorded
    _check_refused_or_reframed(recorded, _expand(request, f"127.0.0.1:{front.http_port}"))


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(parts=_valid())
def test_fuzz_a_valid_request_is_answered_by_tritonserver_and_the_connection_serves_on(
        fronted, baseline, parts):
    port = int(fronted.http_url.rpartition(":")[2])
    responses = _exchange(port, _expand(_render(*parts), fronted.http_url))
    assert [status for status, _ in responses] == [200, 200], (parts, responses)


def test_the_malformed_corpus_leaves_tritonserver_the_same_and_nothing_grew(fronted, baseline):
    """Runs after the tests above (file order): the whole malformed corpus through the front to
    the real tritonserver, then the same pid answers, and neither tritonserver nor HAProxy grew
    by more than RSS_GROWTH_BYTES."""
    port = int(fronted.http_url.rpartition(":")[2])
    for case in CORPUS["malformed"]:
        responses = _exchange(port, _expand(case["request"], fronted.http_url))
        assert responses and responses[0][0] < 500, (case["name"], responses)
    assert fronted.pid == baseline["pid"] and fronted.poll() is None
    assert [s for s, _ in _exchange(port, b"")] == [200], "the next good request is answered"
    triton = psutil.Process(fronted.pid).memory_info().rss
    assert triton - baseline["triton"] < RSS_GROWTH_BYTES, (triton, baseline)
    assert _haproxy_rss(fronted) - baseline["haproxy"] < RSS_GROWTH_BYTES
