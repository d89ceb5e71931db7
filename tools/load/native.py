"""An open loop in C (``open_loop.c``), for overload runs on the cores the server shares.

At 8x capacity the Python open loop (``RawHttp``, 123-158 µs of CPU a request) took 0.14-0.15
of the 2 cores here from the server it measured; the C one sends the same bytes the same way
(keep-alive connections, one request in flight on each, latency from when a request was due,
a client timeout that drops the connection) for a small part of that. It is compiled on first
use with the machine's C compiler (``cc``, else ``gcc``) into a cache keyed by the source's
hash, and run as a child process; its CPU time comes back from ``wait4``.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.errors import LoadTestError
from tools.native_build import NotCompiled, compiled, compiler
from tools.load.senders import error_of
from tools.stats import Record

SOURCE = Path(__file__).with_name("open_loop.c")


def binary() -> Path:
    """The compiled open loop, compiled now if its source changed since.

    Raises:
        LoadTestError: no C compiler, or the source did not compile (with the compiler's words).
    """
    try:
        return compiled(SOURCE)
    except NotCompiled as exc:
        if compiler() is None:
            raise LoadTestError("the C open loop needs a C compiler (cc or gcc) on PATH; install "
                                "one (Debian: apt-get install gcc) or use the Python open loop "
                                "(--generator python)") from None
        raise LoadTestError(str(exc)) from None


@dataclass(frozen=True)
class NativeRun:
    """What one run of the C open loop left.

    Attributes:
        records: One per request, ``start_s`` = when it was due (on ``time.monotonic``).
        cpu_s: The child's CPU time (user + system).
        seconds: Wall time of the child.
    """

    records: list[Record]
    cpu_s: float
    seconds: float


def _record(t0: float, line: str) -> Record:
    offset, latency, status, detail = line.split(" ", 3)
    start, latency_ms, code = t0 + float(offset), float(latency), int(status)
    if code == 200:
        return Record(start, latency_ms, True)
    if code == 0:  # the C loop's reason, '_' for spaces ("client_timeout": CLIENT_TIMEOUT)
        return Record(start, latency_ms, False, detail.replace("_", " "))
    body = b"" if detail == "-" else bytes.fromhex(detail)
    return Record(start, latency_ms, False, f"HTTP {code} {error_of(body)}")


def open_loop(url: str, requests: Sequence[bytes], *, rate: float, duration_s: float,
              connections: int = 256, timeout_s: float = 10.0) -> NativeRun:
    """Send ``requests`` (whole HTTP/1.1 requests, in turn) to ``url`` at ``rate`` a second.

    Args:
        url: ``host:port`` (a name resolves to its IPv4 address; loopback in this project).
        requests: The bytes of each request; request k sends ``requests[k % len]``.
        rate: Requests a second, whatever the answers.
        duration_s: How long to send.
        connections: Keep-alive connections, the most requests in flight.
        timeout_s: Per request, from its send; past it the request fails with "client timeout".

    Raises:
        LoadTestError: no requests, no compiler, or the child failed (with its words).
    """
    if not requests:
        raise LoadTestError("the open loop has no request to send")
    host, _, port = url.rpartition(":")
    try:
        address = socket.gethostbyname(host)
    except OSError as exc:
        raise LoadTestError(f"the open loop's host {host!r} does not resolve to IPv4: {exc}") \
            from None
    with tempfile.NamedTemporaryFile(prefix="open-loop-", suffix=".bin") as blob:
        for request in requests:
            blob.write(struct.pack("<I", len(request)) + request)
        blob.flush()
        argv = [str(binary()), address, port, repr(float(rate)), repr(float(duration_s)),
                str(connections), repr(float(timeout_s)), blob.name]
        started = time.monotonic()
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            child = subprocess.Popen(argv, stdout=out, stderr=err)
            _, status, usage = os.wait4(child.pid, 0)
            child.returncode = os.waitstatus_to_exitcode(status)
            seconds = time.monotonic() - started
            out.seek(0)
            err.seek(0)
            lines = out.read().decode().splitlines()
            if child.returncode != 0 or not lines or not lines[0].startswith("t0 "):
                raise LoadTestError(f"the C open loop failed (exit {child.returncode}): "
                                    f"{err.read().decode(errors='replace').strip()}")
    t0 = float(lines[0].split()[1])
    return NativeRun([_record(t0, line) for line in lines[1:]],
                     usage.ru_utime + usage.ru_stime, seconds)
