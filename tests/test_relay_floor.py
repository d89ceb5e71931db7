"""``scripts/relay_floor/``: the two relays `scripts/guard_cost.py` measures the HTTP guard
against (the floor of a hop in C and in Python), started as that script starts a compared guard
(the C one compiled first), relay keep-alive HTTP both ways, byte for byte, and end by
themselves once the process they watch is gone, as the guards do."""

from __future__ import annotations

import http.client
import importlib.util
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tools import net
from tools import native_build

ROOT = Path(__file__).resolve().parents[1]
RELAYS = ROOT / "scripts" / "relay_floor"
_spec = importlib.util.spec_from_file_location("guard_cost", ROOT / "scripts" / "guard_cost.py")
guard_cost = importlib.util.module_from_spec(_spec)  # how it runs a compared guard: tested here
_spec.loader.exec_module(guard_cost)


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


@pytest.mark.parametrize("name", ["relay_floor.c", "relay_floor.py"])
def test_a_relay_floor_relays_keep_alive_requests_and_ends_with_the_watched_process(
        name, upstream, tmp_path):
    if name.endswith(".c") and native_build.compiler() is None:
        pytest.skip("no C compiler (cc or gcc) on PATH to build relay_floor.c")
    watched = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    port = net.free_ports(1)[0]
    relay = subprocess.Popen(guard_cost._command(RELAYS / name) + [
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


def test_compared_guards_with_the_same_file_name_are_refused_before_any_server_starts(tmp_path):
    # the arms are named by their files: two of one name would have been measured as one
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "guard_cost.py"), "--repository", str(tmp_path),
         "--output", str(tmp_path / "out"), "--compare-http-guard", "/old/http_guard.py",
         "--compare-http-guard", str(ROOT / "tools" / "serve" / "http_guard.py")],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "distinct names" in result.stderr and "http_guard.py, http_guard.py" in result.stderr
    assert not (tmp_path / "out").exists()


def test_the_summary_reads_each_arm_against_around_per_round_and_over_the_rounds():
    runs = [{"pipeline": "p", "protocol": "http", "round": r, "arm": arm, "throughput": value,
             **({"guard_cpu_us_per_request": 100.0} if arm != "around" else {})}
            for r, values in ((1, (80.0, 100.0)), (2, (99.0, 100.0)), (3, (102.0, 100.0)))
            for arm, value in zip(("through", "around"), values)]
    row = next(line for line in guard_cost._summary(runs).splitlines() if "| through |" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    # the mean over the rounds (93.7 / 100), and the median of the rounds' ratios (0.99), which
    # one slow round does not move
    assert cells[3:7] == ["80.0 / 99.0 / 102.0", "93.7", "0.937", "0.990"], cells
