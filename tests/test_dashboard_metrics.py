"""The Grafana dashboard is valid, has the panels the issue asks for (by title, query and
legend), and queries only metrics Triton exports.

Metrics that exist on a CPU host are checked against a real server's /metrics; the GPU ones
(collected through DCGM, absent here) against the list in Triton's metrics documentation.
"""

from __future__ import annotations

import json
import re
import urllib.request
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Query:
    """One series a panel must draw: ``metric`` (a rate of it when ``rate``), divided by
    ``per`` when set, one line per value of the ``by`` labels."""

    metric: str
    per: str | None = None
    by: tuple[str, ...] = ("model",)
    rate: bool = True


SUCCESS = "nv_inference_request_success"
# The panels the issue asks for: title -> the queries the panel must contain.
PANELS = {
    "request rate": ("Request rate", [Query(SUCCESS)]),
    "latency": ("Average request latency", [Query("nv_inference_request_duration_us", SUCCESS)]),
    "queue vs compute": ("Queue vs compute time per request", [
        Query("nv_inference_queue_duration_us", SUCCESS),
        Query("nv_inference_compute_input_duration_us", SUCCESS),
        Query("nv_inference_compute_infer_duration_us", SUCCESS),
        Query("nv_inference_compute_output_duration_us", SUCCESS)]),
    "executed batch size": ("Executed batch size",
                            [Query("nv_inference_count", "nv_inference_exec_count")]),
    "failures by reason": ("Failures by reason",
                           [Query("nv_inference_request_failure", by=("model", "reason"))]),
    "GPU utilisation": ("GPU utilisation",
                        [Query("nv_gpu_utilization", by=("gpu_uuid",), rate=False)]),
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


def _draws(target: dict, query: Query) -> bool:
    """Whether a panel target's expression and legend draw ``query``."""
    expr, legend = target["expr"], target.get("legendFormat", "")
    parts = [p for p in expr.split(" / ") if _metric_names(p)]
    if [_metric_names(p) for p in parts] != [{query.metric}] + ([{query.per}] if query.per else []):
        return False
    for metric, part in zip([query.metric, query.per], parts):
        if query.rate and not re.search(rf"rate\({metric}\{{[^}}]*\}}\[\$__rate_interval\]\)",
                                        part):
            return False
        if query.rate and not part.startswith(f"sum by ({', '.join(query.by)}) ("):
            return False
    return all(f"{{{{{label}}}}}" in legend for label in query.by)


def _panel_problems(dashboard: dict, title: str, queries: list[Query]) -> list[str]:
    panels = [p for p in dashboard["panels"] if p["title"] == title]
    if len(panels) != 1:
        return [f"{len(panels)} panels titled {title!r}"]
    (panel,) = panels
    targets = panel["targets"]
    problems = [f"panel {title!r} does not draw {q}" for q in queries
                if not any(_draws(t, q) for t in targets)]
    legends = [t.get("legendFormat") for t in targets]
    if len(set(legends)) != len(legends):
        problems.append(f"panel {title!r}: two series share a legend ({legends})")
    if panel["type"] != "timeseries":
        problems.append(f"panel {title!r} is a {panel['type']}, not a timeseries")
    return problems


@pytest.mark.parametrize("panel", sorted(PANELS))
def test_dashboard_has_the_panel_the_issue_asks_for(dashboard, panel):
    title, queries = PANELS[panel]

    assert not _panel_problems(dashboard, title, queries)


@pytest.mark.parametrize("breakage, panel", [
    ("retitled", "request rate"), ("raw counter", "request rate"),
    ("not per model", "request rate"), ("no divisor", "latency"),
    ("queue dropped", "queue vs compute"), ("gpu panel removed", "GPU utilisation")])
def test_panel_check_rejects_a_dashboard_without_the_panel(dashboard, breakage, panel):
    """The panel check can fail: each of these breaks one required panel."""
    broken = json.loads(json.dumps(dashboard))
    panels = {p["title"]: p for p in broken["panels"]}
    first = {title: panels[title]["targets"][0] for title in panels}
    if breakage == "retitled":
        panels["Request rate"]["title"] = "Requests"
    elif breakage == "raw counter":
        first["Request rate"]["expr"] = f'sum by (model) ({SUCCESS}{{model=~"$model"}})'
    elif breakage == "not per model":
        first["Request rate"]["expr"] = first["Request rate"]["expr"].replace("by (model) ", "")
    elif breakage == "no divisor":
        expr = first["Average request latency"]["expr"]
        first["Average request latency"]["expr"] = expr.split(" / ")[0]
    elif breakage == "queue dropped":
        panels["Queue vs compute time per request"]["targets"].pop(0)
    else:
        broken["panels"].remove(panels["GPU utilisation"])

    assert _panel_problems(broken, *PANELS[panel])


def test_executed_batch_size_divides_inferences_by_executions(dashboard):
    (panel,) = [p for p in dashboard["panels"] if p["title"] == "Executed batch size"]
    (expr,) = [t["expr"] for t in panel["targets"]]

    numerator, denominator = expr.split(" / ")
    assert "nv_inference_count" in numerator and "nv_inference_exec_count" in denominator


def test_failures_are_broken_down_by_reason(dashboard):
    (panel,) = [p for p in dashboard["panels"] if p["title"] == "Failures by reason"]

    assert "by (model, reason)" in panel["targets"][0]["expr"]


@pytest.mark.server
def test_every_dashboard_metric_is_one_triton_exports(dashboard, toy_server):
    server = toy_server
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
