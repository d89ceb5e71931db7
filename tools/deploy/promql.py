"""The PromQL of the deployment, as data: the autoscaling signal, the SLO recording rules and
the multi-window burn-rate alerts, rendered into rule files, the adapter config and the docs.

Queue time per request is Triton's own counters: rate(nv_inference_queue_duration_us) over
rate(nv_inference_request_success), per model, worst model per pod.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tools.loadtest.slo import DEFAULT_SLO_FILE, PROTOCOLS, load_slo

# ---------------------------------------------------------------------------- autoscaling signal

QUEUE_WINDOW = "1m"
QUEUE_RECORD = "triton_forge:queue_time_per_request_us"
# The name the custom-metrics API (prometheus-adapter) exposes it under: no colons there.
QUEUE_METRIC = "triton_queue_time_per_request_us"
# clamp_min keeps an idle pod at 0 instead of 0/0 = NaN (0.001 req/s: far below any real load).
QUEUE_EXPR = (
    "max by (namespace, pod) ("
    f"sum by (namespace, pod, model) (rate(nv_inference_queue_duration_us[{QUEUE_WINDOW}]))"
    " / clamp_min("
    f"sum by (namespace, pod, model) (rate(nv_inference_request_success[{QUEUE_WINDOW}])), 0.001))"
)
# The HPA's target: a fraction of the strictest P99 objective spent waiting in Triton's queues.
QUEUE_TARGET_FRACTION_OF_P99 = 0.1
# kube-controller-manager's --horizontal-pod-autoscaler-tolerance default.
HPA_TOLERANCE = 0.1

# ---------------------------------------------------------------------------- SLO burn rates

# Error budget when loadtests/slo.yaml asks for zero errors (a load-test gate: no error at that
# load). A burn rate needs a budget above 0; 0.1% is the budget the alerts spend.
ERROR_BUDGET_FLOOR = 0.001
# P99 objective as time slices: the per-pod P99 (Triton's summary, about the last minute) must be
# within target in 99% of the evaluations. Triton 2.51 has no latency histogram for non-decoupled
# models, so "fraction of requests slower than X" cannot be computed from its metrics.
LATENCY_BUDGET = 0.01
SLO_WINDOWS = ("5m", "30m", "1h", "6h", "3d")


@dataclass(frozen=True)
class BurnAlert:
    """One row of the SRE workbook's multi-window, multi-burn-rate table (30-day SLO)."""

    severity: str
    burn_rate: float
    long_window: str
    short_window: str


BURN_ALERTS = (
    BurnAlert("page", 14.4, "1h", "5m"),  # 2% of a 30-day budget in one hour
    BurnAlert("page", 6.0, "6h", "30m"),  # 5% in six hours
    BurnAlert("ticket", 1.0, "3d", "6h"),  # 10% in three days
)


@dataclass(frozen=True)
class Objective:
    """The SLO of one scenario (a pipeline model) on one target.

    Attributes:
        scenario: The pipeline (Triton model) name.
        p99_s: The strictest P99 target over the protocols, in seconds.
        error_budget: The error ratio the alerts spend (the SLO's, or ``ERROR_BUDGET_FLOOR``).
    """

    scenario: str
    p99_s: float
    error_budget: float


def objectives(profile: str, slo_file: Path = DEFAULT_SLO_FILE) -> tuple[Objective, ...]:
    """Every scenario's objective of one profile of ``loadtests/slo.yaml``.

    Raises:
        UserInputError: the file is malformed or lacks the profile.
    """
    data = yaml.safe_load(Path(slo_file).read_text(encoding="utf-8")) or {}
    names = sorted(((data.get("profiles") or {}).get(profile) or {}).get("scenarios") or {})
    found = []
    for name in names or [""]:
        slo = load_slo(slo_file, profile, name)  # raises naming the file, profile and field
        targets = [slo.targets[p] for p in PROTOCOLS]
        found.append(
            Objective(
                scenario=name,
                p99_s=min(t.p99_ms for t in targets) / 1000,
                error_budget=max(min(t.max_error_ratio for t in targets), ERROR_BUDGET_FLOOR),
            )
        )
    return tuple(found)


def queue_target_us(objs: Sequence[Objective]) -> int:
    """The HPA target of ``QUEUE_METRIC``: a fraction of the strictest P99, in microseconds."""
    return int(min(o.p99_s for o in objs) * 1e6 * QUEUE_TARGET_FRACTION_OF_P99)


def hpa_desired_replicas(current: int, value: float, target: float) -> int:
    """What the HPA controller asks for: ``ceil(current * value / target)`` outside tolerance."""
    ratio = value / target
    if abs(ratio - 1.0) <= HPA_TOLERANCE:
        return current
    return max(1, math.ceil(current * ratio))


def _models(objs: Iterable[Objective]) -> str:
    return "|".join(o.scenario for o in objs)


def _error_ratio(window: str, models: str) -> str:
    sel = f'{{model=~"{models}"}}'
    ok = f"sum by (namespace, model) (rate(nv_inference_request_success{sel}[{window}]))"
    bad = f"sum by (namespace, model) (rate(nv_inference_request_failure{sel}[{window}]))"
    return f"{bad} / clamp_min({ok} + {bad}, 1e-9)"


def error_record(window: str) -> str:
    """The recorded error ratio of each scenario over ``window``."""
    return f"triton_forge:request_errors:ratio_rate{window}"


def latency_record(window: str) -> str:
    """The recorded fraction of time each scenario's P99 was over target, over ``window``."""
    return f"triton_forge:p99_over_slo:ratio_{window}"


P99_RECORD = "triton_forge:request_p99_seconds"
P99_BAD_RECORD = "triton_forge:p99_over_slo:bool"


def rule_groups(objs: Sequence[Objective]) -> list[dict[str, Any]]:
    """The Prometheus rule groups: the queue signal, SLO recording rules, burn-rate alerts."""
    models = _models(objs)
    recording: list[dict[str, Any]] = [{"record": QUEUE_RECORD, "expr": QUEUE_EXPR}]
    recording += [{"record": error_record(w), "expr": _error_ratio(w, models)} for w in SLO_WINDOWS]
    recording.append({
        "record": P99_RECORD,
        "expr": f'max by (namespace, model) (nv_inference_request_summary_us{{quantile="0.99", '
        f'model=~"{models}"}}) / 1e6',
    })
    recording.append({
        "record": P99_BAD_RECORD,
        "expr": "\nor\n".join(
            f'({P99_RECORD}{{model="{o.scenario}"}} > bool {o.p99_s:g})' for o in objs
        ),
    })
    recording += [
        {"record": latency_record(w), "expr": f"avg_over_time({P99_BAD_RECORD}[{w}])"}
        for w in SLO_WINDOWS
    ]
    alerts: list[dict[str, Any]] = []
    for o in objs:
        for a in BURN_ALERTS:
            for slo, record, budget, what, objective in (
                ("errors", error_record, o.error_budget, "error ratio", "failed / sent"),
                ("latency", latency_record, LATENCY_BUDGET, "time with P99 over target",
                 f"P99 <= {o.p99_s:g} s"),
            ):
                threshold = f"({a.burn_rate:g} * {budget:g})"
                sel = f'{{model="{o.scenario}"}}'
                alerts.append({
                    "alert": f"TritonForge{slo.capitalize()}BudgetBurn",
                    "expr": f"{record(a.long_window)}{sel} > {threshold}\n"
                    f"and\n{record(a.short_window)}{sel} > {threshold}",
                    "labels": {
                        "severity": a.severity,
                        "slo": slo,
                        "scenario": o.scenario,
                        "long_window": a.long_window,
                        "short_window": a.short_window,
                    },
                    "annotations": {
                        "summary": f"{o.scenario}: {what} burns the {slo} budget "
                        f"{a.burn_rate:g}x too fast ({a.long_window} and {a.short_window})",
                        "description": f"Objective: {objective}, budget {budget:g}, namespace "
                        "{{ $labels.namespace }}.",
                    },
                })
    return [
        {"name": "triton-forge-recording", "rules": recording},
        {"name": "triton-forge-slo-alerts", "rules": alerts},
    ]


def rule_file(objs: Sequence[Objective]) -> dict[str, Any]:
    """A Prometheus rule file (``rule_files:`` / ``promtool test rules``)."""
    return {"groups": rule_groups(objs)}


def adapter_rules() -> dict[str, Any]:
    """prometheus-adapter's ``rules:`` config exposing ``QUEUE_METRIC`` per pod.

    No namespace is written into the series query (the mistake of server#6247): the adapter's
    resource overrides map the ``namespace`` and ``pod`` labels that the PodMonitor attaches.
    """
    return {
        "rules": [{
            "seriesQuery": f'{QUEUE_RECORD}{{namespace!="",pod!=""}}',
            "resources": {
                "overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}},
            },
            "name": {"matches": f"^{QUEUE_RECORD}$", "as": QUEUE_METRIC},
            "metricsQuery": "max(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
        }]
    }


def keda_query(namespace: str, pod_prefix: str) -> str:
    """KEDA's Prometheus trigger query: the signal summed over the pods (AverageValue divides)."""
    return f'sum({QUEUE_RECORD}{{namespace="{namespace}", pod=~"{pod_prefix}-.*"}}) or vector(0)'
