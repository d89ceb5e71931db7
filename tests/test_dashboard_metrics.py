"""The Grafana dashboard is valid and queries only metrics Triton exports.

Metrics that exist on a CPU host are checked against a real server's /metrics; the GPU ones
(collected through DCGM, absent here) against the list in Triton's metrics documentation.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "docker" / "grafana" / "dashboards" / "triton.json"

# Triton's docs/user_guide/metrics.md, "GPU Metrics": exported per GPU (label gpu_uuid) when a
# GPU and DCGM are present, never on a CPU-only host.
TRITON_GPU_METRICS = frozenset({
    "nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes",
    "nv_gpu_power_usage", "nv_gpu_power_limit", "nv_energy_consumption",
})
# Panels the issue asks for, by the metrics that make them.
REQUIRED = {
    "request rate": {"nv_inference_request_success"},
    "latency": {"nv_inference_request_duration_us"},
    "queue vs compute": {"nv_inference_queue_duration_us",
                         "nv_inference_compute_infer_duration_us"},
    "executed batch size": {"nv_inference_count", "nv_inference_exec_count"},
    "failures by reason": {"nv_inference_request_failure"},
    "GPU utilisation": {"nv_gpu_utilization"},
}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def _expressions(dashboard: dict) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    return exprs


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(nv_[a-z0-9_]+)\b", expr))


def _used_metrics(dashboard: dict) -> set[str]:
    return set().union(*map(_metric_names, _expressions(dashboard)))


def test_dashboard_is_provisionable_json_with_unique_panels(dashboard):
    ids = [p["id"] for p in dashboard["panels"]]

    assert dashboard["uid"] and dashboard["title"]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "prometheus"}
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"])


def test_dashboard_uses_the_provisioned_datasource_uid(dashboard):
    datasource = (ROOT / "docker/grafana/provisioning/datasources/prometheus.yml").read_text()

    assert re.search(r"^\s*uid: prometheus$", datasource, re.MULTILINE)
    assert {t["datasource"]["uid"] for p in dashboard["panels"] for t in p["targets"]} == {
        "prometheus"}


@pytest.mark.parametrize("panel", sorted(REQUIRED))
def test_dashboard_has_the_panel_the_issue_asks_for(dashboard, panel):
    assert REQUIRED[panel] <= _used_metrics(dashboard)


def test_executed_batch_size_divides_inferences_by_executions(dashboard):
    (panel,) = [p for p in dashboard["panels"] if p["title"] == "Executed batch size"]
    (expr,) = [t["expr"] for t in panel["targets"]]

    numerator, denominator = expr.split(" / ")
    assert "nv_inference_count" in numerator and "nv_inference_exec_count" in denominator


def test_failures_are_broken_down_by_reason(dashboard):
    (panel,) = [p for p in dashboard["panels"] if p["title"] == "Failures by reason"]

    assert "by (model, reason)" in panel["targets"][0]["expr"]


@pytest.mark.server
def test_every_dashboard_metric_is_one_triton_exports(dashboard, server_factory, toy_repository):
    server = server_factory(toy_repository)
    body = json.dumps({"inputs": [
        {"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["metrics"]}]}).encode()
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/toy_text/infer",
                                     data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
    with urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=30) as response:
        text = response.read().decode()
    exported = set(re.findall(r"^# TYPE (\S+) ", text, re.MULTILINE))

    used = _used_metrics(dashboard)
    unknown = used - exported - TRITON_GPU_METRICS
    assert not unknown, f"not exported by Triton: {sorted(unknown)}"
    assert used & exported, "the check compared against a real /metrics"
    assert 'reason="BACKEND"' in text, "failures carry the reason label the dashboard groups by"
