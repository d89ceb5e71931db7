"""``scripts/relay_floor/``: the two relays `scripts/guard_cost.py` measures the HTTP guard
against (the floor of a hop in C and in Python) relay keep-alive HTTP both ways, byte for byte,
and end by themselves once the process they watch is gone, as the guards do."""

from __future__ import annotations

import http.client
import shutil
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tools import net

ROOT = Path(__file__).resolve().parents[1]
RELAYS = ROOT / "scripts" / "relay_floor"


class _Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        answer = b"echo:" + body[::-1]
        self.send_response(200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def upstream():
    server = ThreadingHTTPServer((net.LOOPBACK, 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _command(kind: str, tmp_path: Path) -> list[str]:
    if kind == "python":
        return [sys.executable, str(RELAYS / "relay_floor.py")]
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler (cc or gcc) on PATH to build relay_floor.c")
    binary = tmp_path / "relay_floor"
    subprocess.run([compiler, "-O2", "-Wall", "-Werror", "-o", str(binary),
                    str(RELAYS / "relay_floor.c")], check=True)
    return [str(binary)]


@pytest.mark.parametrize("kind", ["c", "python"])
def test_a_relay_floor_relays_keep_alive_requests_and_ends_with_the_watched_process(
        kind, upstream, tmp_path):
    watched = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    port = net.free_ports(1)[0]
    relay = subprocess.Popen(_command(kind, tmp_path) + [
        "--listen-port", str(port), "--upstream-port", str(upstream),
        "--watch-pid", str(watched.pid)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not net.accepts(port) and relay.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert net.accepts(port), f"the relay does not listen (exit code {relay.poll()})"
        connection = http.client.HTTPConnection(net.LOOPBACK, port, timeout=10)
        for body in (b"first", b"x" * 200_000, b"third"):  # one connection, kept alive
            connection.request("POST", "/v2/models/m/infer", body=body)
            response = connection.getresponse()
            assert (response.status, response.read()) == (200, b"echo:" + body[::-1])
        connection.close()
        watched.kill()
        watched.wait()
        assert relay.wait(timeout=10) == 0
    finally:
        for process in (watched, relay):
            if process.poll() is None:
                process.kill()
                process.wait()
