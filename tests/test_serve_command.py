"""``tools serve`` as a person or a script runs it: refusals in one line, clean drain on SIGTERM.

The long-running cases start ``tools serve`` as a real subprocess on the toy repository.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from click.testing import CliRunner

from server_helpers import fake_tritonserver
from waits import arrived, wait_until
from tools import process
from tools.front.process import fronts_of
from tools.cli import cli

pytestmark = pytest.mark.server

TOOLS = [sys.executable, "-m", "tools.cli"]
FREE_PORTS = ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
              "--forge-metrics-port", "0"]


_alive = process.is_alive


def _stubs_of(server_pid: int) -> list[int]:
    return [
        p.pid
        for p in psutil.Process(server_pid).children(recursive=True)
        if "triton_python_backend_stub" in " ".join(p.cmdline())
    ]


class ServeProcess:
    """``tools serve`` in the foreground, as a subprocess; endpoints parsed from its output."""

    def __init__(self, *args: str, ready_timeout_s: float = 120) -> None:
        self.proc = subprocess.Popen(
            [*TOOLS, "serve", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(
            target=self._pump, args=(self.proc.stdout, self.lines.put), daemon=True
        ).start()
        threading.Thread(
            target=self._pump, args=(self.proc.stderr, self.stderr.append), daemon=True
        ).start()
        self.endpoints = self.wait_for_endpoints(ready_timeout_s)

    @staticmethod
    def _pump(stream, sink) -> None:
        for line in stream:
            sink(line.rstrip("\n"))

    def wait_for_endpoints(self, timeout_s: float) -> dict[str, str]:
        endpoints: dict[str, str] = {}
        deadline = time.monotonic() + timeout_s
        while "models" not in endpoints:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                raise AssertionError(f"tools serve not ready; stderr: {self.stderr}") from None
            if m := re.match(r"^tritonserver ready: pid (\d+), log (.+)$", line):
                endpoints["pid"], endpoints["log"] = m.groups()
            elif m := re.match(r"^(http|grpc|metrics|models)\s+(.+)$", line):
                endpoints[m.group(1)] = m.group(2)
        return endpoints

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        if "pid" in getattr(self, "endpoints", {}):
            try:
                os.killpg(int(self.endpoints["pid"]), signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def serve_process():
    started: list[ServeProcess] = []

    def start(*args: str) -> ServeProcess:
        started.append(ServeProcess(*args))
        return started[-1]

    yield start
    for serve in started:
        serve.kill()


def _double_request(protocol: str, url: str, x: np.ndarray, delay_ms: float):
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(url)
    inputs = [
        module.InferInput("INPUT0", list(x.shape), "FP32"),
        module.InferInput("DELAY_MS", [1, 1], "FP32"),
    ]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(np.array([[delay_ms]], dtype=np.float32))
    try:
        return client.infer("toy_double", inputs).as_numpy("OUTPUT0")
    finally:
        client.close()


def test_serve_refuses_a_port_in_use_with_a_one_line_cause(toy_repository):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]

        result = CliRunner().invoke(
            cli,
            ["serve", "--repository", str(toy_repository), *FREE_PORTS, "--http-port", str(port)],
        )

    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        (
            f"Error: port {port} (HTTP) is already in use on 127.0.0.1; "
            "choose another --http-port, or 0 for a free one"
        )
    ]


def test_serve_reports_a_missing_repository_as_a_usage_error(tmp_path):
    missing = tmp_path / "model_repository"

    result = CliRunner().invoke(cli, ["serve", "--repository", str(missing), *FREE_PORTS])

    assert result.exit_code == 2
    assert f"model repository {missing} does not exist" in result.output


def test_serve_refuses_a_broken_model_with_the_servers_reason_in_one_line(toy_repository, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(toy_repository, repo, ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "toy_text" / "1" / "model.py").write_text(
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        "        raise ValueError('tokenizer.json not found next to model.py')\n"
    )

    done = subprocess.run(
        [*TOOLS, "serve", "--repository", str(repo), *FREE_PORTS, "--exit-timeout", "2"],
        capture_output=True,
        check=False,
        text=True,
        timeout=120,
    )

    assert done.returncode == 1
    errors = done.stderr.strip().splitlines()
    assert len(errors) == 1, done.stderr
    assert "model 'toy_text' version 1 failed to load" in errors[0]
    assert "ValueError: tokenizer.json not found next to model.py" in errors[0]
    assert not [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(repo) in " ".join(p.info["cmdline"] or [])
    ]


def test_sigterm_lets_in_flight_requests_finish_and_leaves_no_process_behind(
    serve_process, toy_repository, toy_started
):
    serve = serve_process("--repository", str(toy_repository), *FREE_PORTS, "--exit-timeout", "20")
    server_pid = int(serve.endpoints["pid"])
    stubs = _stubs_of(server_pid)
    assert stubs, "the toy models run in Python stubs"
    results: dict[str, np.ndarray | Exception] = {}

    def send(key: str, protocol: str, url: str, x: np.ndarray) -> None:
        try:
            results[key] = _double_request(protocol, url, x, delay_ms=2000)
        except Exception as exc:  # noqa: BLE001 - recorded, asserted below
            results[key] = exc

    inputs = {
        f"{p}-{i}": np.full((1, 4), i + 1, np.float32) for p in ("http", "grpc") for i in range(3)
    }
    threads = [
        threading.Thread(
            target=send, args=(key, key.split("-")[0], serve.endpoints[key.split("-")[0]], x)
        )
        for key, x in inputs.items()
    ]
    for thread in threads:
        thread.start()
    metrics = serve.endpoints["metrics"].removeprefix("http://").removesuffix("/metrics")
    wait_until(lambda: arrived(metrics, "toy_double", toy_started) == len(inputs), 30,
               lambda: f"all {len(inputs)} requests to reach toy_double (queued or executing); "
                       f"results so far {results}")
    serve.proc.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join(timeout=60)
    code = serve.proc.wait(timeout=60)

    for key, x in inputs.items():
        assert isinstance(results[key], np.ndarray), f"{key}: {results[key]!r}"
        np.testing.assert_array_equal(results[key], 2 * x)
    assert code == 0
    assert [pid for pid in [server_pid, *stubs] if _alive(pid)] == []
    assert any("SIGTERM: draining" in line for line in serve.stderr)


def test_background_start_then_stop_with_a_pid_file_leaves_nothing_behind(toy_repository, tmp_path):
    pid_file = tmp_path / "run" / "triton.pid"

    started = subprocess.run(
        [
            *TOOLS,
            "serve",
            "--repository",
            str(toy_repository),
            *FREE_PORTS,
            "--background",
            "--pid-file",
            str(pid_file),
            "--exit-timeout",
            "5",
        ],
        capture_output=True,
        check=False,
        text=True,
        timeout=120,
    )
    pid = int(pid_file.read_text())
    try:
        http_url = re.search(r"^http\s+(\S+)$", started.stdout, re.MULTILINE).group(1)
        stubs = _stubs_of(pid)
        fronts = fronts_of(pid)  # the front holds the public ports, in a session of its own
        answer = _double_request("http", http_url, np.ones((1, 2), np.float32), delay_ms=0)

        stopped = subprocess.run(
            [*TOOLS, "serve", "--stop", "--pid-file", str(pid_file), "--exit-timeout", "5"],
            capture_output=True,
            check=False,
            text=True,
            timeout=60,
        )
    finally:
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)

    assert started.returncode == 0, started.stderr
    np.testing.assert_array_equal(answer, np.full((1, 2), 2, np.float32))
    assert stopped.returncode == 0, stopped.stderr
    assert f"stopped tritonserver pid {pid}" in stopped.stdout
    assert [p for p in [pid, *stubs] if _alive(p)] == []
    assert not pid_file.exists()
    assert "front    HAProxy: HTTP bodies and gRPC messages up to 16777216" in started.stdout
    assert len(fronts) == 1 and not _alive(fronts[0]), "stopped with its server"


def test_stop_refuses_a_pid_file_naming_a_process_that_is_not_tritonserver(tmp_path):
    pid_file = tmp_path / "triton.pid"
    pid_file.write_text(f"{os.getpid()}\n")  # this pytest process: must survive

    result = CliRunner().invoke(cli, ["serve", "--stop", "--pid-file", str(pid_file)])

    assert result.exit_code == 2
    assert f"names pid {os.getpid()}, which is not a running tritonserver" in result.output
    assert _alive(os.getpid())


def _wait_for_line(serve: ServeProcess, text: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [line for line in serve.stderr if text in line]
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no line with {text!r} on stderr: {serve.stderr}")


def test_serve_reloads_only_the_model_whose_python_stub_died(serve_process, toy_repository):
    serve = serve_process("--repository", str(toy_repository), *FREE_PORTS, "--exit-timeout", "2")
    server_pid = int(serve.endpoints["pid"])
    children = {p.pid: p.cmdline() for p in psutil.Process(server_pid).children()}
    text_stub = next(pid for pid, argv in children.items() if "toy_text_0_0" in argv)
    others = sorted(pid for pid in children if pid != text_stub)

    os.kill(text_stub, signal.SIGKILL)
    line = _wait_for_line(serve, "reloaded model 'toy_text'", timeout_s=30)
    client = httpclient.InferenceServerClient(serve.endpoints["http"])
    text = httpclient.InferInput("TEXT", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"back again"]], dtype=np.object_))
    answer = client.infer("toy_text", [text]).as_numpy("EMBEDDING")
    client.close()
    children_after = psutil.Process(server_pid).children()
    serve.proc.send_signal(signal.SIGTERM)
    code = serve.proc.wait(timeout=60)

    assert "Python stub of toy_text_0_0 died" in line
    assert answer.shape == (1, 8)
    assert sorted(p.pid for p in children_after if p.pid in others) == others  # untouched
    assert not any("tritonserver ready" in l for l in serve.stderr)
    assert code == 0


def test_serve_restarts_tritonserver_when_it_exits_by_itself_on_the_same_ports(
    serve_process, toy_repository
):
    serve = serve_process("--repository", str(toy_repository), *FREE_PORTS, "--exit-timeout", "2")
    first_pid = int(serve.endpoints["pid"])

    os.kill(first_pid, signal.SIGKILL)  # as Triton 2.51 aborting on std::bad_alloc
    again = serve.wait_for_endpoints(timeout_s=60)
    answer = _double_request("grpc", again["grpc"], np.ones((1, 1), np.float32), delay_ms=0)
    # the front was restarted with it, on the same public port
    through_guard = _double_request("http", again["http"], np.ones((1, 1), np.float32), delay_ms=0)
    serve.proc.send_signal(signal.SIGTERM)
    code = serve.proc.wait(timeout=60)

    assert any("exited unexpectedly (exit code -9)" in line for line in serve.stderr)
    assert again["grpc"] == serve.endpoints["grpc"]  # clients keep their endpoint
    assert int(again["pid"]) != first_pid and not _alive(first_pid)
    np.testing.assert_array_equal(answer, np.full((1, 1), 2, np.float32))
    np.testing.assert_array_equal(through_guard, np.full((1, 1), 2, np.float32))
    assert again["http"] == serve.endpoints["http"]
    assert code == 0


def test_a_crash_of_tritonserver_stays_readable_after_the_restart(serve_process, toy_repository):
    """A whole-server restart moves the crashed run's log aside (never truncates it) and quotes
    its end on the restart line: here Triton's own SIGSEGV report."""
    serve = serve_process("--repository", str(toy_repository), *FREE_PORTS, "--exit-timeout", "2")
    log = Path(serve.endpoints["log"])

    os.kill(int(serve.endpoints["pid"]), signal.SIGSEGV)  # as the crash of the chaos soak
    again = serve.wait_for_endpoints(timeout_s=60)
    serve.proc.send_signal(signal.SIGTERM)
    serve.proc.wait(timeout=60)

    restart = next(line for line in serve.stderr if "restarting the server" in line)
    kept = process.previous_log(log)
    assert "exit code -11" in restart
    assert f"the log of the run that ended is kept as {kept}" in restart
    assert "Signal (11) received." in restart.split("it ends: ", 1)[1]
    assert "Signal (11) received." in kept.read_text()
    assert "Signal (11)" not in log.read_text()  # the log of the run after the restart
    assert again["log"] == str(log)


def _processes_mentioning(text: str) -> list[int]:
    return [
        p.info["pid"]
        for p in psutil.process_iter(["pid", "cmdline"])
        if text in " ".join(p.info["cmdline"] or []) and _alive(p.info["pid"])
    ]


def test_background_refuses_a_pid_file_whose_folder_cannot_be_made_before_starting(
    toy_repository, tmp_path
):
    not_a_folder = tmp_path / "a-file"
    not_a_folder.write_text("")
    pid_file = not_a_folder / "triton.pid"
    log = tmp_path / "server.log"

    result = subprocess.run(
        [*TOOLS, "serve", "--repository", str(toy_repository), *FREE_PORTS, "--background",
         "--pid-file", str(pid_file), "--log-file", str(log)],
        capture_output=True, text=True, timeout=120, check=False,
    )

    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"Error: cannot write pid file {pid_file}: ")
    assert not log.exists(), "no server may start when its pid cannot be recorded"
    assert _processes_mentioning(str(log)) == []


def test_background_stops_the_server_when_the_pid_file_cannot_be_written_after_start(
    toy_repository, tmp_path, monkeypatch
):
    from tools.serve import command

    repo = tmp_path / "repo"
    shutil.copytree(toy_repository, repo, ignore=shutil.ignore_patterns("__pycache__", "*.md"))
    pid_file = tmp_path / "run" / "triton.pid"
    started: list[int] = []

    def refuse(path, pid):
        started.append(pid)
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(command, "_write_pid_file", refuse)
    try:
        result = CliRunner().invoke(
            cli,
            ["serve", "--repository", str(repo), *FREE_PORTS, "--background", "--pid-file",
             str(pid_file), "--exit-timeout", "2"],
        )
    finally:
        for pid in started:
            if _alive(pid):
                os.killpg(pid, signal.SIGKILL)

    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines()[-1] == (
        f"Error: cannot write pid file {pid_file}: Permission denied; the server was stopped"
    )
    assert len(started) == 1 and not _alive(started[0])
    assert _processes_mentioning(str(repo)) == []  # no tritonserver, no stub
    assert not pid_file.exists()


_fake_tritonserver = fake_tritonserver


def test_serve_refuses_a_binary_that_cannot_restrict_the_admin_apis(toy_repository, tmp_path):
    binary = _fake_tritonserver(tmp_path, ["--model-repository", "--http-port"])

    result = CliRunner().invoke(
        cli, ["serve", "--repository", str(toy_repository), *FREE_PORTS, "--binary", str(binary)]
    )

    assert result.exit_code == 1, result.output
    (error,) = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert error.startswith(
        f"Error: tritonserver {binary} has no --http-restricted-api / --grpc-restricted-protocol,"
        " so its admin APIs (model-repository, shared-memory, trace, logging) would be open"
    )
    assert "--allow-open-admin-apis" in error


def _probe_file(tmp_path, text: str):
    probes = tmp_path / "probes.json"
    probes.write_text(json.dumps({"toy_text": {"inputs": [
        {"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": [text]}]}}))
    return probes


def test_serve_refuses_a_server_whose_probe_answers_with_an_error_in_one_line(
    toy_repository, tmp_path
):
    repo = tmp_path / "repo"
    shutil.copytree(toy_repository, repo, ignore=shutil.ignore_patterns("__pycache__", "*.md"))

    done = subprocess.run(
        [*TOOLS, "serve", "--repository", str(repo), *FREE_PORTS, "--exit-timeout", "2",
         "--probes", str(_probe_file(tmp_path, ""))],
        capture_output=True, check=False, text=True, timeout=120,
    )

    assert done.returncode == 1
    assert "tritonserver ready" not in done.stdout
    (error,) = done.stderr.strip().splitlines()
    assert error.startswith("Error: model 'toy_text' failed its probe inference: HTTP 400 ")
    assert "input 'TEXT': empty text" in error and "(server log: " in error
    assert _processes_mentioning(str(repo)) == []


def test_background_start_sends_the_probes_before_recording_the_server(toy_repository, tmp_path):
    pid_file = tmp_path / "triton.pid"
    probes = _probe_file(tmp_path, "a probe text")

    started = CliRunner().invoke(
        cli, ["serve", "--repository", str(toy_repository), *FREE_PORTS, "--background",
              "--pid-file", str(pid_file), "--exit-timeout", "2", "--probes", str(probes)],
    )
    pid = int(pid_file.read_text()) if pid_file.exists() else None
    try:
        stopped = CliRunner().invoke(cli, ["serve", "--stop", "--pid-file", str(pid_file)])
    finally:
        if pid is not None and _alive(pid):
            os.killpg(pid, signal.SIGKILL)

    assert started.exit_code == 0, started.output
    assert re.search(r"^models\s+toy_classify, toy_double, toy_text$", started.output, re.M)
    assert stopped.exit_code == 0, stopped.output
    assert not _alive(pid)
