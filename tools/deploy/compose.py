"""The compose stack's Prometheus rules: the same SLO rules and alerts ``tools deploy k8s``
renders, one file per SLO profile (``docker/prometheus/rules-<profile>.yml``).

``python -c 'from tools.deploy import compose; compose.write_rules()'`` re-renders them after
``loadtests/slo.yaml`` or the PromQL changes; tests/test_compose_file.py compares.
"""

from __future__ import annotations

from pathlib import Path

from tools.deploy import promql
from tools.deploy.render import to_yaml

RULES_DIR = Path(__file__).resolve().parents[2] / "docker" / "prometheus"
PROFILES = ("cpu", "gpu")


def rules_text(profile: str) -> str:
    """The rule file of one profile, with a header saying where it comes from."""
    header = (f"# Rendered from loadtests/slo.yaml (profile {profile}) by tools/deploy/promql.py: the "
              "same rules as\n# `tools deploy k8s` writes to prometheus/rules.yaml. Re-render, do "
              "not edit:\n#   python -c 'from tools.deploy import compose; compose.write_rules()'\n")
    return header + to_yaml(promql.rule_file(promql.objectives(profile)))


def write_rules(folder: Path = RULES_DIR) -> None:
    """Write ``rules-<profile>.yml`` for every profile."""
    for profile in PROFILES:
        (folder / f"rules-{profile}.yml").write_text(rules_text(profile), encoding="utf-8")
