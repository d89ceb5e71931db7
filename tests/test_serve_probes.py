"""The liveness and readiness probes against a real HTTP server that answers as Triton and the
supervisor's status endpoint (contract 2) would, and through docker/healthcheck.py's exit code.

The server is a tiny real one on loopback (http.server), so the probe's own HTTP client, its
timeouts and its parsing run for real; what it answers is set per test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tools.serve import probes
from tools.serve.probes import Verdict

ROOT = Path(__file__).resolve().parents[1]
HEALTHCHECK = ROOT / "docker" / "healthcheck.py"
TEXT_PROBE = {"text_embedding": {"inputs": [
    {"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["x"]}]}}


class FakeServer:
    """Routes: path -> (status, JSON body, seconds to wait first)."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, object, float]] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                status, body, delay = server.routes.get(self.path, (404, {"error": "no route"}, 0))
                time.sleep(delay)
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # a probe that timed out during the delay has closed its connection

            do_GET = do_POST = _answer

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def healthy(self, models=("text_tokenizer", "text_embedding")) -> None:
        self.routes["/v2/health/live"] = (200, {}, 0)
        for m in models:
            self.routes[f"/v2/models/{m}/ready"] = (200, {}, 0)
        self.routes["/v2/models/text_embedding/infer"] = (200, {"outputs": [{"name": "EMBEDDING"}]}, 0)
        self.routes["/status"] = (200, {"models": {m: {"state": "ready", "restarts": 0,
                                                       "dead_stubs": [], "next_retry_s": None}
                                                   for m in models}}, 0)

    def state(self, model: str, state: str, **extra) -> None:
        status = self.routes["/status"][1]
        status["models"][model] = {"state": state, "restarts": 1, "dead_stubs": [],
                                   "next_retry_s": None, **extra}

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    fake = FakeServer()
    fake.healthy()
    yield fake
    fake.close()


def _ready(server, timeout_s: float = 2.0):
    return probes.readiness(server.url, ["text_tokenizer", "text_embedding"], TEXT_PROBE,
                            f"{server.url}/status", timeout_s)


def test_a_healthy_server_is_live_and_ready(server):
    assert probes.liveness(server.url, f"{server.url}/status").verdict is Verdict.OK
    assert _ready(server).verdict is Verdict.OK


@pytest.mark.parametrize("status, message", [
    (503, "Exceeds maximum queue size"),
    (429, "too many requests"),
    (400, "Request timeout expired"),  # Triton's words for a queue timeout, whatever the status
    (503, "the HTTP guard's buffer budget is spent"),
])
def test_a_refused_probe_inference_counts_as_busy_which_is_ready(server, status, message):
    server.routes["/v2/models/text_embedding/infer"] = (status, {"error": message}, 0)

    result = _ready(server)

    assert result.verdict is Verdict.BUSY and result.verdict.passes
    assert message in result.reasons[0]


def test_a_probe_inference_that_times_out_is_busy_not_dead(server):
    server.routes["/v2/models/text_embedding/infer"] = (200, {"outputs": [1]}, 1.5)

    result = _ready(server, timeout_s=0.5)

    assert result.verdict is Verdict.BUSY
    assert "no answer within 0.5 s" in result.reasons[0]


def test_a_probe_inference_error_that_is_not_busy_fails_readiness(server):
    server.routes["/v2/models/text_embedding/infer"] = (
        500, {"error": "Failed to process the request(s) for model 'text_tokenizer', message: "
                       "Stub process 'text_tokenizer_0_0' is not healthy."}, 0)

    result = _ready(server)

    assert result.verdict is Verdict.FAIL
    assert "Stub process" in result.reasons[0] and "HTTP 500" in result.reasons[0]


@pytest.mark.parametrize("state, extra", [
    ("recovering", {}), ("backoff", {"next_retry_s": 4.0}), ("down", {}),
    ("ready", {"dead_stubs": ["text_tokenizer_0_1"]}),
])
def test_a_model_the_supervisor_reports_outside_ready_fails_readiness(server, state, extra):
    server.state("text_tokenizer", state, **extra)

    result = _ready(server)

    assert result.verdict is Verdict.FAIL
    assert result.reasons[0].startswith("model 'text_tokenizer' is ")


def test_liveness_ignores_queues_and_recovering_models_but_fails_a_model_given_up(server):
    server.routes["/v2/models/text_embedding/infer"] = (503, {"error": "Exceeds maximum queue size"}, 0)
    server.state("text_tokenizer", "backoff", next_retry_s=8.0)
    assert probes.liveness(server.url, f"{server.url}/status").verdict is Verdict.OK

    server.state("text_tokenizer", "down", next_retry_s=None)
    result = probes.liveness(server.url, f"{server.url}/status")

    assert result.verdict is Verdict.FAIL
    assert "model 'text_tokenizer' is down and the supervisor plans no retry" in result.reasons


def test_liveness_fails_when_the_server_does_not_answer_or_is_not_live(server):
    server.routes["/v2/health/live"] = (200, {}, 1.5)
    assert probes.liveness(server.url, None, 0.5).verdict is Verdict.FAIL
    server.routes["/v2/health/live"] = (400, {}, 0)
    assert probes.liveness(server.url, None, 0.5).verdict is Verdict.FAIL
    assert probes.liveness("http://127.0.0.1:9", None, 0.5).verdict is Verdict.FAIL


def test_a_hung_status_endpoint_fails_both_probes_and_an_absent_one_is_skipped(server):
    server.routes["/status"] = (200, {"models": {}}, 1.5)
    assert probes.liveness(server.url, f"{server.url}/status", 0.5).verdict is Verdict.FAIL
    server.routes["/status"] = (200, {"not": "status"}, 0)
    assert "not the status JSON" in _ready(server).reasons[0]
    # Nothing listening: an image whose supervisor has no status endpoint; the stub watch is
    # left to the probe inference.
    assert probes.liveness(server.url, "http://127.0.0.1:9/status").verdict is Verdict.OK


def test_readiness_spends_at_most_its_budget_and_calls_the_rest_busy(server):
    for model in ("text_tokenizer", "text_embedding"):
        server.routes[f"/v2/models/{model}/ready"] = (200, {}, 2.5)
    started = time.monotonic()

    result = probes.readiness(server.url, ["text_tokenizer", "text_embedding"], TEXT_PROBE,
                              None, timeout_s=2.0, budget_s=1.0)

    # Within the budget, with room for a busy machine; without it, two 2 s timeouts: over 4 s.
    assert time.monotonic() - started < 2.5
    assert result.verdict is Verdict.BUSY


def test_healthcheck_exit_codes_follow_the_verdicts(server, tmp_path):
    repo = tmp_path / "repo"
    for model in ("text_tokenizer", "text_embedding"):
        (repo / model).mkdir(parents=True)
        (repo / model / "config.pbtxt").write_text("")
    probe_file = tmp_path / "probes.json"
    probe_file.write_text(json.dumps(TEXT_PROBE))

    def run(mode: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(HEALTHCHECK), "--mode", mode, "--url", server.url,
             "--repository", str(repo), "--probes", str(probe_file), "--status-url",
             f"{server.url}/status", "--timeout", "2"],
            capture_output=True, text=True, timeout=60)

    assert run("readiness").returncode == 0
    server.routes["/v2/models/text_embedding/infer"] = (503, {"error": "Exceeds maximum queue size"}, 0)
    busy = run("readiness")
    assert busy.returncode == 0 and "readiness: busy" in busy.stdout
    server.state("text_tokenizer", "backoff", next_retry_s=3.0)
    failed = run("readiness")
    assert failed.returncode == 1 and "model 'text_tokenizer' is backoff" in failed.stderr
    assert run("liveness").returncode == 0
