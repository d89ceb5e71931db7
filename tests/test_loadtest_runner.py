"""Tests of the Locust runner: the child's command line, progress parsing, and the hard timeout
that kills a run which does not end by itself.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tools.loadtest.runner import (
    LOCUSTFILE,
    RunSpec,
    locust_command,
    parse_progress,
    run_locust,
)
from tools.loadtest.slo import DEFAULT_SLO_FILE


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
    assert cmd[-1] == "ImageClassificationGrpcUser"
    assert cmd[cmd.index("-t") + 1] == "25s"
    assert cmd[cmd.index("-u") + 1] == "4"
    assert cmd[cmd.index("-f") + 1] == str(LOCUSTFILE)
    assert cmd[cmd.index("--html") + 1] == str(tmp_path / "locust.html")
    assert "--arrival-rate" not in cmd


def test_locust_command_uses_dispatchers_when_rate_is_given(tmp_path):
    cmd = locust_command(_spec(tmp_path, users=None, rate=40.0, protocol="http",
                               scenario="text_embedding"))
    assert cmd[-1] == "TextEmbeddingHttpUser"
    assert cmd[cmd.index("--arrival-rate") + 1] == "40"
    assert cmd[cmd.index("-u") + 1] == "1"


def test_locustfile_defines_a_user_class_for_every_scenario_and_protocol():
    text = LOCUSTFILE.read_text()
    for scenario in ("text_embedding", "image_classification"):
        for protocol in ("http", "grpc"):
            name = _spec(Path("."), scenario=scenario, protocol=protocol).user_class
            assert f"class {name}(" in text


def test_parse_progress_reads_fields_and_ignores_other_lines():
    fields = parse_progress("progress t=12s phase=measure requests=1234 rps=98.1 p99_ms=45.2 errors=0")
    assert fields == {"t": "12s", "phase": "measure", "requests": "1234", "rps": "98.1",
                      "p99_ms": "45.2", "errors": "0"}
    assert parse_progress("text_embedding/grpc: 231 requests in 5.5 s") is None


def _locust_children(marker: str) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [int(line.split()[0]) for line in out.splitlines()[1:]
            if marker in line and "locust" in line and str(os.getpid()) != line.split()[0]]


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
