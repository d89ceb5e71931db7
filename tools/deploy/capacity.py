"""Replica bounds and the per-pod HPA target from what ``tools tune`` measured.

``reports/tune/<scenario>/results.json`` (``tools/tune/results.py``) holds the winner's
throughput within the P99 target (``best``), and, where the tuner confirmed the winner in
repeats, those figures (``confirmation``): the smallest confirmed throughput is used then. The
arithmetic is kept as lines for the rendered README.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tools.deploy import promql
from tools.deploy.manifests import Capacity
from tools.errors import UserInputError

RESULTS_NAME = "results.json"
DEFAULT_HEADROOM = 0.7  # run a pod at 70% of what it held within the P99 target
MIN_REPLICAS_FLOOR = 2  # one pod may be down (rollout, drain) with the other serving


class TuneResultsError(UserInputError):
    """The ``--from-tune`` folder holds no usable results file; the message names the field."""


def _numbers(value: Any) -> list[float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [float(value)]
    if isinstance(value, list):
        return [float(v) for v in value if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return []


def _confirmed_throughput(data: Mapping[str, Any]) -> list[float]:
    """The winner's repeated throughputs, if the tuner confirmed it (any of the shapes
    ``confirmation: {winner: {throughput: x | [..] | throughputs: [..]}}``)."""
    confirmation = data.get("confirmation")
    if not isinstance(confirmation, Mapping):
        return []
    winner = confirmation.get("winner")
    if not isinstance(winner, Mapping):
        return []
    for key in ("throughputs", "throughput", "throughput_rps"):
        found = _numbers(winner.get(key))
        if found:
            return found
    return []


def read_results(folder: Path) -> dict[str, Any]:
    """The results file of a tuning run (``folder`` or ``folder/results.json``)."""
    path = Path(folder)
    if path.is_dir():
        path = path / RESULTS_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TuneResultsError(f"--from-tune {folder}: no {RESULTS_NAME} (tools tune writes "
                               f"reports/tune/<scenario>/{RESULTS_NAME})") from None
    except (OSError, ValueError) as exc:
        raise TuneResultsError(f"--from-tune {path}: not a tools tune results file ({exc})") from None
    if not isinstance(data, dict):
        raise TuneResultsError(f"--from-tune {path}: not a tools tune results file")
    data["_path"] = str(path)
    return data


def capacity_from_tune(folder: Path, peak_rps: float | None, *, headroom: float = DEFAULT_HEADROOM,
                       min_floor: int = MIN_REPLICAS_FLOOR) -> Capacity:
    """Per-pod target and replica bounds from a tuning run.

    Args:
        folder: ``reports/tune/<scenario>`` (or its results.json).
        peak_rps: The load to size for; default the scenario's measured throughput x the
            floor (no demand figure: the bounds then only guarantee the floor).
        headroom: Fraction of the measured per-pod throughput the HPA aims at.
        min_floor: The fewest replicas.

    Raises:
        TuneResultsError: no winner within the target, or a field missing (named).
    """
    data = read_results(folder)
    where = f"--from-tune {data['_path']}"
    best = data.get("best")
    if not isinstance(best, Mapping):
        raise TuneResultsError(f"{where}: field 'best' is null: no trial met the P99 target, so "
                               "there is no per-pod capacity to size from (rerun tools tune)")
    throughput = _numbers(best.get("throughput"))
    p99 = _numbers(best.get("p99_ms"))
    target = _numbers((data.get("target") or {}).get("p99_ms"))
    if not throughput or throughput[0] <= 0:
        raise TuneResultsError(f"{where}: field 'best.throughput' is missing or not positive")
    if not p99 or not target:
        raise TuneResultsError(f"{where}: fields 'best.p99_ms' and 'target.p99_ms' are needed")
    confirmed = _confirmed_throughput(data)
    per_pod = min(confirmed) if confirmed else throughput[0]
    scenario = str(data.get("scenario") or Path(data["_path"]).parent.name)
    target_rps = per_pod * headroom
    peak = peak_rps if peak_rps is not None else target_rps * min_floor
    needed = math.ceil(peak / target_rps)
    min_replicas = max(min_floor, 1)
    max_replicas = max(min_replicas, needed + 1)  # one more than the peak needs: a pod may fail
    figure = (f"min of {len(confirmed)} confirmation runs ({', '.join(f'{v:g}' for v in confirmed)})"
              if confirmed else "the winner's single measurement (no confirmation in the file)")
    lines = (
        f"Measured ({data['_path']}): {scenario} held {per_pod:g} req/s per pod with P99 "
        f"{p99[0]:g} ms <= target {target[0]:g} ms; {figure}.",
        f"HPA target per pod = {per_pod:g} x headroom {headroom:g} = {target_rps:.2f} req/s "
        f"(metric {promql.RATE_METRIC}).",
        f"Peak {peak:g} req/s{'' if peak_rps is not None else ' (no --peak-rps: the floor x target)'}"
        f" / {target_rps:.2f} = {peak / target_rps:.2f} -> {needed} pods at the peak.",
        f"minReplicas = max(floor {min_floor}, 1) = {min_replicas}; maxReplicas = peak pods + 1 "
        f"(one may fail) = {max_replicas}; KEDA falls back to {max_replicas} when the signal is missing.",
    )
    return Capacity(
        scenario=scenario, per_pod_rps=per_pod, p99_ms=p99[0], p99_target_ms=target[0],
        headroom=headroom, target_rps=target_rps, peak_rps=peak, min_replicas=min_replicas,
        max_replicas=max_replicas, source=data["_path"], confirmed=bool(confirmed), lines=lines,
    )
