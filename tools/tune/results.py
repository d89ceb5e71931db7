"""The tuning record: every trial in ``results.json`` (written atomically after each), the table
of trials, and the throughput-vs-P99 plot with the target and the winner.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.files import write_atomically
from tools.errors import UserInputError
from tools.tune.knobs import Settings, settings_from_dict, settings_key, settings_to_dict
from tools.tune.search import Score
from tools.tune.trial import level_text

RESULTS_NAME = "results.json"
PLOT_NAME = "pareto.png"
PATCH_NAME = "repository.yaml.patch"


@dataclass
class Trial:
    """One completed trial.

    Attributes:
        id: 1, 2, ... in the order run (across resumed runs).
        settings: The knobs tried.
        context: The load it was measured under (``LoadPlan.context``) and where it was served.
        points: Each concurrency point (``Point.to_dict``).
        seconds: Wall time of the trial: build, serve and load.
        build: Model -> what the build did (``repackaged``, ``built``, ``skipped``).
        started: UTC time it started.
        failure: Why the trial ended early (the server did not load it, or stopped during it),
            in the server's words; such a trial is infeasible. Empty when it ran through.
    """

    id: int
    settings: Settings
    context: dict[str, Any]
    points: list[dict[str, Any]]
    seconds: float
    build: dict[str, str] = field(default_factory=dict)
    started: str = ""
    failure: str = ""

    @property
    def key(self) -> str:
        """Settings and load context: the same key means the same experiment."""
        return settings_key(self.settings) + json.dumps(self.context, sort_keys=True)

    def best_point(self) -> dict[str, Any] | None:
        """The point of highest throughput within the target, if any (none for a failed trial:
        a server that crashed under a setting is no winner, whatever it measured first)."""
        if self.failure:
            return None
        good = [p for p in self.points if p["within_target"]]
        return max(good, key=lambda p: p["throughput"]) if good else None

    def score(self) -> Score:
        """The search's view of this trial."""
        best = self.best_point()
        if best is not None:
            return Score(True, best["throughput"], best["p99_ms"])
        seen = [p["p99_ms"] for p in self.points if p["p99_ms"] is not None]
        return Score(False, 0.0, min(seen) if seen else None)

    def to_dict(self) -> dict[str, Any]:
        """The results-file form: settings, figures and the trial's headline numbers."""
        best = self.best_point()
        return {
            "id": self.id, "started": self.started, "seconds": round(self.seconds, 1),
            "settings": settings_to_dict(self.settings), "context": self.context,
            "build": self.build,
            "failure": self.failure,
            "within_target": best is not None,
            "throughput": best["throughput"] if best else None,
            "p50_ms": best["p50_ms"] if best else None,
            "p99_ms": best["p99_ms"] if best else None,
            "error_ratio": best["error_ratio"] if best else None,
            "concurrency": best["concurrency"] if best else None,
            "rate": best.get("rate") if best else None,
            "points": self.points,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Trial:
        """Read a trial back from the results file."""
        return cls(int(data["id"]), settings_from_dict(data["settings"]), dict(data["context"]),
                   list(data["points"]), float(data.get("seconds", 0.0)),
                   dict(data.get("build", {})), data.get("started", ""), data.get("failure", ""))


def load_trials(path: Path) -> list[Trial]:
    """The trials of an earlier run (none when the file does not exist).

    Raises:
        UserInputError: the file exists but is not a results file (naming it).
    """
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [Trial.from_dict(t) for t in data["trials"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise UserInputError(f"{path}: not a tools tune results file ({exc!r}); move it away or "
                             f"pass --fresh to start over") from exc


def save(path: Path, header: Mapping[str, Any], trials: Sequence[Trial],
         best: Trial | None, extra: Mapping[str, Any] | None = None) -> None:
    """Write the results file atomically: the header, every trial, and the winner (or null)."""
    payload = {**header, "trials": [t.to_dict() for t in trials],
               "best": best.to_dict() if best else None, **(extra or {})}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(payload, indent=2) + "\n")


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def format_table(trials: Sequence[Trial], models: Sequence[str], best: Trial | None,
                 p99_target: float) -> str:
    """One row per trial: settings per model, then the best in-target point's figures.

    Settings read ``instances x threads d<delay µs> p<preferred> q<queue size>``.
    """
    width = {m: max(len(m), *(len(t.settings[m].short()) for t in trials)) if trials else len(m)
             for m in models}
    header = (f"{'#':>3} " + " ".join(f"{m:<{width[m]}}" for m in models)
              + f" {'req/s':>7} {'P50 ms':>7} {'P99 ms':>7} {'err':>5} {'load':>6} "
              + " ".join(f"{'batch ' + m[:10]:>16}" for m in models) + "  note")
    lines = [header, "-" * len(header)]
    for trial in trials:
        point = trial.best_point()
        shown = point or (trial.points[-1] if trial.points else None)
        cells = " ".join(f"{trial.settings[m].short():<{width[m]}}" for m in models)
        if shown is None:
            why = f"failed: {trial.failure}" if trial.failure else "no point measured"
            lines.append(f"{trial.id:>3} {cells}  ({why})")
            continue
        batches = " ".join(
            f"{_fmt((shown['models'].get(m) or {}).get('mean_batch'), '.2f'):>16}" for m in models)
        note = "winner" if best is not None and trial.id == best.id else (
            "" if point else f"over target (P99 > {p99_target:g} ms or errors)")
        if trial.failure:
            note = f"failed: {trial.failure}"
        lines.append(
            f"{trial.id:>3} {cells} {_fmt(shown['throughput']):>7} {_fmt(shown['p50_ms']):>7} "
            f"{_fmt(shown['p99_ms']):>7} {shown['error_ratio']:>5.3f} {level_text(shown):>6} "
            f"{batches}  {note}")
    return "\n".join(lines)


def save_plot(trials: Sequence[Trial], best: Trial | None, p99_target: float, title: str,
              path: Path) -> None:
    """Every measured point (throughput vs P99), each trial's best, the target and the winner."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    every = [(p["throughput"], p["p99_ms"]) for t in trials for p in t.points if p["p99_ms"]]
    if every:
        ax.scatter(*zip(*every), s=14, color="lightgrey", label="every concurrency point")
    heads = [(t.best_point(), t) for t in trials]
    heads = [(p, t) for p, t in heads if p is not None]
    if heads:
        ax.scatter([p["throughput"] for p, _ in heads], [p["p99_ms"] for p, _ in heads], s=30,
                   color="tab:blue", label="each trial's best within target")
        for p, t in heads:
            ax.annotate(str(t.id), (p["throughput"], p["p99_ms"]), textcoords="offset points",
                        xytext=(3, 3), fontsize=7)
        front, top = [], -1.0  # Pareto front: no other point is both faster and lower
        for p, _ in sorted(heads, key=lambda h: (h[0]["p99_ms"], -h[0]["throughput"])):
            if p["throughput"] > top:
                front.append(p)
                top = p["throughput"]
        ax.plot([p["throughput"] for p in front], [p["p99_ms"] for p in front], "-",
                color="tab:blue", alpha=0.5, label="Pareto front")
    ax.axhline(p99_target, color="tab:red", linestyle="--", label=f"P99 target {p99_target:g} ms")
    point = best.best_point() if best is not None else None
    if point is not None:
        ax.scatter([point["throughput"]], [point["p99_ms"]], marker="*", s=260, color="tab:orange",
                   edgecolor="black", zorder=5, label=f"winner (trial {best.id})")
    ax.set_xlabel("throughput (req/s)")
    ax.set_ylabel("P99 latency (ms)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
