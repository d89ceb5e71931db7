"""The example alerts on the model status endpoint (tests/data/promtool/recovery_rules.yaml)
under ``promtool``, and on the metric names ``tools/serve/recovery.py`` really serves."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tools.serve.recovery import ModelStatus, State, metrics_text

DATA = Path(__file__).parent / "data" / "promtool"
RULES, RULES_TEST = DATA / "recovery_rules.yaml", DATA / "recovery_rules_test.yaml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not on PATH (apt-get install prometheus)")


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.fixture
def rules_folder(tmp_path) -> Path:
    for path in (RULES, RULES_TEST):
        shutil.copy(path, tmp_path / path.name)
    return tmp_path


@needs_promtool
def test_recovery_alerts_pass_promtool_check_and_their_unit_tests(rules_folder):
    checked = _promtool("check", "rules", RULES.name, cwd=rules_folder)
    tested = _promtool("test", "rules", RULES_TEST.name, cwd=rules_folder)

    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert tested.returncode == 0, tested.stdout + tested.stderr


@needs_promtool
def test_the_down_alert_test_fails_when_the_alert_waits_longer(rules_folder):
    rules = rules_folder / RULES.name
    rules.write_text(rules.read_text().replace("for: 5m", "for: 10m", 1))

    result = _promtool("test", "rules", RULES_TEST.name, cwd=rules_folder)

    assert result.returncode != 0 and "TritonForgeModelDown" in result.stdout + result.stderr


def test_every_metric_the_alerts_use_is_served_by_the_status_endpoint():
    served = set(re.findall(r"^(triton_forge_\w+)\{", metrics_text(
        {"m": ModelStatus(State.BACKOFF, 1, 1, (), 5.0)}), re.MULTILINE))
    used = set(re.findall(r"\b(triton_forge_\w+)\b", RULES.read_text()))

    assert used and used <= served, used - served
