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

from tools.slo import DEFAULT_SLO_FILE, PROTOCOLS, load_slo

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
# Requests/s one pod answers for the measured pipeline (``--from-tune``): the capacity signal.
RATE_RECORD = "triton_forge:requests_per_second"
RATE_METRIC = "triton_requests_per_second"


def rate_expr(model: str) -> str:
    """Successful requests/s of ``model`` per pod, over the queue signal's window."""
    return (f'sum by (namespace, pod) (rate(nv_inference_request_success{{model="{model}"}}'
            f"[{QUEUE_WINDOW}]))")


# The job every scrape of the pods carries: the PodMonitor takes it from the pods'
# app.kubernetes.io/name label; docker/prometheus.yml names its job the same.
JOB = "triton-forge"
# How long a missing signal or a down target waits before it alerts.
ABSENT_FOR = "10m"
DOWN_FOR = "5m"

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


def signal_alerts(namespace: str) -> list[dict[str, Any]]:
    """Alerts on the signals themselves: a scrape target down, no target at all, the autoscaling
    signal missing, the HPA unable to scale, a model the supervisor keeps down."""
    hpas = f"{JOB}|keda-hpa-{JOB}"  # KEDA names the HPA it creates keda-hpa-<ScaledObject>

    def alert(name: str, expr: str, duration: str, severity: str, summary: str,
              description: str) -> dict[str, Any]:
        return {"alert": name, "expr": expr, "for": duration,
                "labels": {"severity": severity},
                "annotations": {"summary": summary, "description": description}}

    return [
        alert("TritonForgeTargetDown", f'up{{job="{JOB}"}} == 0', DOWN_FOR, "page",
              "{{ $labels.instance }}: Prometheus cannot scrape it",
              "A triton-forge pod's metrics endpoint does not answer: its queue signal, SLO "
              "figures and recovery metrics are missing."),
        alert("TritonForgeMetricsAbsent", f'absent(up{{job="{JOB}"}})', ABSENT_FOR, "page",
              f"No {JOB} target is scraped at all",
              "The PodMonitor is not selected by the Prometheus Operator (check its labels: "
              "--monitor-label), or no pod runs. The autoscaler is blind."),
        alert("TritonForgeScalingSignalAbsent", f"absent({QUEUE_RECORD})", ABSENT_FOR, "page",
              f"The autoscaling signal {QUEUE_RECORD} is missing",
              "The recording rule is not loaded or has no input: the HPA reports <unknown> and "
              "holds its replica count; KEDA falls back to its fallback replicas."),
        alert("TritonForgeHPAScalingInactive",
              f'kube_horizontalpodautoscaler_status_condition{{namespace="{namespace}", '
              f'horizontalpodautoscaler=~"{hpas}", condition="ScalingActive", status="false"}} == 1',
              ABSENT_FOR, "page",
              "{{ $labels.horizontalpodautoscaler }}: ScalingActive is False",
              "The HPA cannot compute a replica count (metric missing in the custom-metrics "
              "API: prometheus-adapter, its rules, or the recording rule)."),
        alert("TritonForgeModelDown", "max by (namespace, pod, model) (triton_forge_model_down) > 0",
              DOWN_FOR, "ticket",
              "{{ $labels.pod }}: model {{ $labels.model }} down",
              "The supervisor reports the model down or retrying in backoff (its Python stub "
              "keeps dying); the pod is out of the Service while it is."),
    ]


def rule_groups(objs: Sequence[Objective], namespace: str = "triton-forge",
                rate_model: str | None = None) -> list[dict[str, Any]]:
    """The Prometheus rule groups: the queue signal (and with ``rate_model`` the request rate),
    SLO recording rules, burn-rate alerts and alerts on the signals themselves."""
    models = _models(objs)
    recording: list[dict[str, Any]] = [{"record": QUEUE_RECORD, "expr": QUEUE_EXPR}]
    if rate_model:
        recording.append({"record": RATE_RECORD, "expr": rate_expr(rate_model)})
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
        {"name": "triton-forge-signal-alerts", "rules": signal_alerts(namespace)},
    ]


def rule_file(objs: Sequence[Objective], namespace: str = "triton-forge",
              rate_model: str | None = None) -> dict[str, Any]:
    """A Prometheus rule file (``rule_files:`` / ``promtool test rules``)."""
    return {"groups": rule_groups(objs, namespace, rate_model)}


def adapter_rules(with_rate: bool = False) -> dict[str, Any]:
    """prometheus-adapter's ``rules:`` config exposing ``QUEUE_METRIC`` (and ``RATE_METRIC``)
    per pod.

    No namespace is written into the series query (the mistake of server#6247): the adapter's
    resource overrides map the ``namespace`` and ``pod`` labels that the PodMonitor attaches.
    """
    pairs = [(QUEUE_RECORD, QUEUE_METRIC)] + ([(RATE_RECORD, RATE_METRIC)] if with_rate else [])
    return {
        "rules": [{
            "seriesQuery": f'{record}{{namespace!="",pod!=""}}',
            "resources": {
                "overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}},
            },
            "name": {"matches": f"^{record}$", "as": metric},
            "metricsQuery": "max(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
        } for record, metric in pairs]
    }


def keda_query(namespace: str, pod_prefix: str, record: str = QUEUE_RECORD) -> str:
    """KEDA's Prometheus trigger query: a signal summed over the pods (AverageValue divides).

    No ``or vector(0)``: a missing series must be an error (the trigger sets
    ``ignoreNullValues: false``), so KEDA falls back instead of holding minReplicas silently.
    """
    return f'sum({record}{{namespace="{namespace}", pod=~"{pod_prefix}-.*"}})'


def keda_rate_query(namespace: str, pod_prefix: str) -> str:
    """The measured-capacity trigger's query (``--from-tune``)."""
    return keda_query(namespace, pod_prefix, RATE_RECORD)
