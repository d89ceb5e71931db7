"""The rendered Prometheus rules under `promtool`: they parse, lint clean, and the burn-rate
alerts and the queue signal behave as tests/data/promtool/slo_rules_test.yaml specifies.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tools.deploy.render import render_k8s

ROOT = Path(__file__).resolve().parents[1]
RULES_TEST = Path(__file__).parent / "data" / "promtool" / "slo_rules_test.yaml"
SIGNAL_TEST = Path(__file__).parent / "data" / "promtool" / "signal_alerts_test.yaml"
RECORD = Path(__file__).parent / "data" / "artifact" / "cpu.artifact.json"
PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not on PATH (apt-get install prometheus)"
)


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.fixture
def rules_folder(tmp_path) -> Path:
    render_k8s(ROOT / "repository.yaml", "cpu", tmp_path / "out", artifact=RECORD, image="x/y:1")
    folder = tmp_path / "promtool"
    folder.mkdir()
    shutil.copy(tmp_path / "out" / "prometheus" / "rules.yaml", folder / "rules.yaml")
    shutil.copy(RULES_TEST, folder / RULES_TEST.name)
    shutil.copy(SIGNAL_TEST, folder / SIGNAL_TEST.name)
    return folder


def test_rendered_rule_file_passes_promtool_check_rules(rules_folder):
    result = _promtool("check", "rules", "rules.yaml", cwd=rules_folder)
    assert result.returncode == 0, result.stdout + result.stderr


def test_burn_rate_alerts_and_queue_signal_pass_promtool_test_rules(rules_folder):
    result = _promtool("test", "rules", RULES_TEST.name, cwd=rules_folder)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_test_fails_when_the_fast_burn_threshold_is_wrong(rules_folder):
    rules = rules_folder / "rules.yaml"
    rules.write_text(rules.read_text().replace("(14.4 * 0.001)", "(144 * 0.001)"))
    result = _promtool("test", "rules", RULES_TEST.name, cwd=rules_folder)
    assert result.returncode != 0
    assert 'long_window="1h"' in result.stdout + result.stderr


def test_signal_alerts_pass_promtool_test_rules(rules_folder):
    result = _promtool("test", "rules", SIGNAL_TEST.name, cwd=rules_folder)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_test_fails_when_an_absence_alert_waits_too_long(rules_folder):
    rules = rules_folder / "rules.yaml"
    text = rules.read_text()
    assert "for: 10m" in text
    rules.write_text(text.replace("for: 10m", "for: 30m"))
    result = _promtool("test", "rules", SIGNAL_TEST.name, cwd=rules_folder)
    assert result.returncode != 0
    assert "TritonForgeMetricsAbsent" in result.stdout + result.stderr
