"""Tests of the Locust runner: the child's command line, progress parsing, and the hard timeout
that kills a run which does not end by itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tools.errors import LoadTestError
from tools.loadtest import runner
from tools.loadtest.runner import (
    LOCUSTFILE,
    RunSpec,
    locust_command,
    parse_progress,
    run_locust,
)
from tools.slo import DEFAULT_SLO_FILE
from waits import wait_until


def _spec(tmp_path: Path, **kw) -> RunSpec:
    fields = {
        "scenario": "image_classification", "protocol": "grpc", "host": "127.0.0.1:8001",
        "users": 4, "rate": None, "duration_s": 20, "warmup_s": 5,
        "slo_file": DEFAULT_SLO_FILE, "slo_profile": "cpu", "report_dir": tmp_path,
    }
    fields.update(kw)
    return RunSpec(**fields)


def test_locust_command_runs_the_scenario_class_for_warmup_plus_duration(tmp_path):
    cmd = locust_command(_spec(tmp_path))
    assert cmd[-1] == "ScenarioGrpcUser"
    assert cmd[cmd.index("--scenario") + 1] == "image_classification"
    assert cmd[cmd.index("--spec") + 1] == str(runner.DEFAULT_SPEC.resolve())  # relative default, absolute for locust
    assert "--data" not in cmd and "--p99-ms" not in cmd
    assert cmd[cmd.index("-t") + 1] == "25s"
    assert cmd[cmd.index("-u") + 1] == "4"
    assert cmd[cmd.index("-f") + 1] == str(LOCUSTFILE)
    assert cmd[cmd.index("--html") + 1] == str(tmp_path / "locust.html")
    assert "--arrival-rate" not in cmd


def test_locust_command_uses_dispatchers_when_rate_is_given(tmp_path):
    cmd = locust_command(_spec(tmp_path, users=None, rate=40.0, protocol="http",
                               scenario="text_embedding"))
    assert cmd[-1] == "ScenarioHttpUser"
    assert cmd[cmd.index("--scenario") + 1] == "text_embedding"
    assert cmd[cmd.index("--arrival-rate") + 1] == "40"
    assert cmd[cmd.index("-u") + 1] == "1"


_LIST_USER_CLASSES = """
import importlib.util, json, sys
import locust  # monkey-patches like `locust -f` does, before the locustfile's gRPC set-up
from loadtests.users import ApiUser, TritonGrpcUser, TritonHttpUser
spec = importlib.util.spec_from_file_location("locustfile", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
bases = {"http": TritonHttpUser, "grpc": TritonGrpcUser}
print(json.dumps({
    name: [p for p, base in bases.items() if issubclass(cls, base)]
          + ([cls.api] if issubclass(cls, ApiUser) else []) + [cls.default_scenario]
    for name, cls in vars(module).items()
    if isinstance(cls, type) and issubclass(cls, locust.User) and cls.__module__ == "locustfile"
}))
"""


def test_locustfile_defines_one_user_per_protocol_and_api_and_the_compose_class_names():
    # In a child: importing locust monkey-patches the interpreter (gevent), not for pytest's.
    out = subprocess.run(
        [sys.executable, "-c", _LIST_USER_CLASSES, str(LOCUSTFILE)],
        capture_output=True, text=True, timeout=120, check=True, cwd=LOCUSTFILE.parents[1],
    ).stdout
    classes = json.loads(out.strip().splitlines()[-1])
    expected = {_spec(Path("."), protocol=p).user_class: [p, ""] for p in ("http", "grpc")}
    # tools loadtest --api: the scenario through the gateway, gated on the HTTP targets
    expected.update({dataclasses.replace(_spec(Path(".")), api=api).user_class: [api, ""]
                     for api in ("openai", "tei")})
    # docker-compose.yml's LOCUST_USER_CLASS names: the same users with a default scenario.
    for scenario in ("text_embedding", "image_classification"):
        for protocol in ("http", "grpc"):
            camel = "".join(part.capitalize() for part in scenario.split("_"))
            expected[f"{camel}{protocol.capitalize()}User"] = [protocol, scenario]
    assert classes == expected


def test_parse_progress_reads_fields_and_ignores_other_lines():
    fields = parse_progress("progress t=12s phase=measure requests=1234 rps=98.1 p99_ms=45.2 errors=0")
    assert fields == {"t": "12s", "phase": "measure", "requests": "1234", "rps": "98.1",
                      "p99_ms": "45.2", "errors": "0"}
    assert parse_progress("text_embedding/grpc: 231 requests in 5.5 s") is None


def _locust_children(marker: str) -> list[int]:
    """Live Locust processes whose command line mentions ``marker`` (read from /proc: `ps`
    cuts command lines to $COLUMNS, which pytest sets)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if (marker in cmdline and "locust" in cmdline and proc.info["pid"] != os.getpid()
                and proc.info["status"] != psutil.STATUS_ZOMBIE):
            found.append(proc.info["pid"])
    return found


@pytest.mark.load
@pytest.mark.timeout(120)
def test_run_kills_the_locust_group_when_hard_timeout_expires(tmp_path):
    # Nothing listens on port 9 of loopback: every request fails fast. The open loop at 2/s keeps
    # the CPU idle while the 300 s run outlives its 12 s hard limit.
    spec = _spec(tmp_path / "hung-run", protocol="http", host="127.0.0.1:9", users=None,
                 rate=2.0, duration_s=300, warmup_s=0)
    result = run_locust(spec, hard_timeout_s=12)
    assert result.timed_out
    assert result.seconds < 12 + 15
    assert result.verdicts[-1].startswith("LOCUST TIMEOUT image_classification/http")
    assert _locust_children(str(tmp_path / "hung-run")) == []


def _hung_spec(report_dir: Path) -> RunSpec:
    # Nothing listens on port 9 of loopback: every request fails fast; 2 arrivals/s keep the CPU
    # idle while the 300 s run would go on long after the test.
    return _spec(report_dir, protocol="http", host="127.0.0.1:9", users=None, rate=2.0,
                 duration_s=300, warmup_s=0)


@pytest.mark.load
@pytest.mark.timeout(120)
def test_run_kills_the_locust_group_and_reraises_when_interrupted(tmp_path):
    report_dir = tmp_path / "interrupted-run"
    seen: list[dict[str, str]] = []

    def interrupt(_spec: RunSpec, fields: dict[str, str]) -> None:
        seen.append(fields)
        assert _locust_children(str(report_dir)), "locust should be running now"
        raise KeyboardInterrupt  # as Ctrl-C would, at the first progress line

    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_locust(_hung_spec(report_dir), on_progress=interrupt, hard_timeout_s=100)

    assert len(seen) == 1
    assert time.monotonic() - start < 60  # start-up + one progress line + kill, not 100 s
    assert _locust_children(str(report_dir)) == []
    assert "interrupted (KeyboardInterrupt); killing group" in (report_dir / "locust.log").read_text()


@pytest.mark.load
@pytest.mark.timeout(120)
def test_ctrl_c_to_tools_loadtest_leaves_no_locust_process_behind(tmp_path):
    report_dir = tmp_path / "sigint-report"
    tools = subprocess.Popen(
        [sys.executable, "-m", "tools.cli", "loadtest", "--url", "127.0.0.1:9",
         "--scenario", "image_classification", "--protocol", "http", "--rate", "2",
         "--duration", "300", "--warmup", "0", "--output", str(report_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=LOCUSTFILE.parents[1],
        # as in a terminal: a suite started in the background (`cmd &` without job control)
        # inherits SIGINT ignored, and an ignored SIGINT would never reach tools
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    log = report_dir / "image_classification-http" / "locust.log"

    def locust_logging() -> bool:
        assert tools.poll() is None, tools.communicate()
        # the runner writes the command line first; a line after it is locust's own, so the
        # runner has started the child and is waiting on it
        return bool(_locust_children(str(report_dir))) and log.exists() \
            and len(log.read_text().splitlines()) > 1

    try:
        wait_until(locust_logging, 60, lambda: "locust to start and log under tools loadtest; "
                   f"log: {log.read_text()[-500:] if log.exists() else 'none'}")
        tools.send_signal(signal.SIGINT)  # Ctrl-C reaches tools only: locust has its own session
        _, err = tools.communicate(timeout=60)
    finally:
        if tools.poll() is None:
            tools.kill()
        for pid in _locust_children(str(report_dir)):
            os.kill(pid, signal.SIGKILL)

    assert tools.returncode != 0, err
    assert "Traceback" not in err
    assert _locust_children(str(report_dir)) == []


def test_run_names_the_summary_file_when_the_run_left_it_half_written(tmp_path, monkeypatch):
    half = '{"verdicts": ["SLO PASS text_embedding/http"], "results": [{"summa'
    writer = f"import pathlib; pathlib.Path({str(tmp_path / 'summary.json')!r}).write_text({half!r})"
    monkeypatch.setattr(runner, "locust_command", lambda spec: [sys.executable, "-c", writer])

    with pytest.raises(LoadTestError) as caught:
        run_locust(_spec(tmp_path), hard_timeout_s=60)

    message = str(caught.value)
    assert message.startswith(f"gate summary {tmp_path / 'summary.json'} is unreadable or not JSON")
    assert "\n" not in message


@pytest.mark.parametrize(
    ("command", "option", "shown"),
    [
        ("loadtest", "--slo-file", "loadtests/slo.yaml of this project"),
        ("tune", "--slo-file", "loadtests/slo.yaml of this project"),
        ("bench", "--data", "loadtests/data/texts.txt of this project"),
    ],
)
def test_help_shows_a_project_relative_default_not_this_machines_path(command, option, shown):
    from click.testing import CliRunner

    from tools.cli import cli

    result = CliRunner().invoke(cli, [command, "--help"], terminal_width=200)

    assert result.exit_code == 0, result.output
    # the option's help, its wrapped lines joined (up to the next option)
    after = result.output.split(f"\n  {option} ", 1)[1].split("\n  -", 1)[0]
    assert shown in " ".join(after.split())
    assert str(LOCUSTFILE.parents[1]) not in result.output
