"""The winner against the start, measured again in interleaved repeats.

The search compares one sample of each setting on a shared machine; before a winner is trusted,
the start and the winner are measured alternately (start, winner, start, winner, ...) at their
own best load level, and the report gives both with their spread.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tools.errors import ServerError
from tools.serve.server_log import one_line
from tools.tune.results import Trial
from tools.tune.servers import EmbeddedTarget, changed_models
from tools.tune.trial import LoadPlan, Point, level_text

MIN_REPEATS = 3


@dataclass(frozen=True)
class Spread:
    """Minimum, median and maximum of a figure over the repeats (None: never measured)."""

    min: float | None
    median: float | None
    max: float | None

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Spread:
        """The spread of the measured values (``None`` ones left out)."""
        seen = [v for v in values if v is not None]
        if not seen:
            return cls(None, None, None)
        return cls(min(seen), statistics.median(seen), max(seen))

    def text(self, spec: str = ".1f") -> str:
        """``41.2 / 43.0 / 44.1``."""
        return " / ".join("-" if v is None else format(v, spec)
                          for v in (self.min, self.median, self.max))

    def to_dict(self) -> dict[str, float | None]:
        """For the results file."""
        return {"min": self.min, "median": self.median, "max": self.max}


@dataclass
class Side:
    """One of the two settings under confirmation and its repeated points."""

    label: str
    trial: Trial
    level: float
    open_loop: bool = False
    points: list[Point] = field(default_factory=list)
    failure: str = ""

    @property
    def throughput(self) -> Spread:
        """Throughput over the repeats."""
        return Spread.of([p.throughput for p in self.points])

    @property
    def p99(self) -> Spread:
        """P99 over the repeats."""
        return Spread.of([p.p99_ms for p in self.points])

    @property
    def goodput(self) -> float | None:
        """Median throughput of the repeats, a repeat past the target counting as none: what the
        setting delivers within the target (None: never measured)."""
        if not self.points:
            return None
        return statistics.median(p.throughput if p.within_target else 0.0 for p in self.points)

    @property
    def within(self) -> int:
        """Repeats within the target."""
        return sum(p.within_target for p in self.points)

    def line(self, width: int) -> str:
        """One line of the report."""
        point = {"concurrency": 0, "rate": self.level} if self.open_loop else {
            "concurrency": self.level, "rate": None}
        where = f"{self.label:<{width}} (trial {self.trial.id}, {level_text(point)})"
        if self.failure:
            return f"  {where}: could not be served: {self.failure}"
        return (f"  {where}: throughput {self.throughput.text()} req/s, P99 {self.p99.text('.0f')}"
                f" ms (min / median / max), within target {self.within}/{len(self.points)}")

    def to_dict(self) -> dict[str, Any]:
        """For the results file."""
        return {"trial": self.trial.id, "level": self.level, "failure": self.failure,
                "throughput": self.throughput.to_dict(), "p99_ms": self.p99.to_dict(),
                "within_target": self.within, "points": [p.to_dict() for p in self.points]}


@dataclass
class Confirmation:
    """The interleaved repeats of the start and the winner, and the verdict."""

    repeats: int
    start: Side
    winner: Side
    confirmed: bool
    reason: str

    def lines(self) -> list[str]:
        """The report: both settings with their spread, then the verdict."""
        width = max(len(self.start.label), len(self.winner.label))
        return [f"confirmation: {self.repeats} interleaved repeats each (start, winner, ...)",
                self.start.line(width), self.winner.line(width),
                f"  {'confirmed' if self.confirmed else 'NOT confirmed'}: {self.reason}"]

    def to_dict(self) -> dict[str, Any]:
        """For the results file."""
        return {"repeats": self.repeats, "confirmed": self.confirmed, "reason": self.reason,
                "start": self.start.to_dict(), "winner": self.winner.to_dict()}


def _level(trial: Trial, fallback: float, open_loop: bool) -> float:
    point = trial.best_point()
    if point is None:
        return fallback
    return float(point["rate"]) if open_loop else int(point["concurrency"])


def confirmation_estimate_s(plan: LoadPlan, repeats: int, setup_s: float) -> float:
    """Seconds the confirmation takes about: two servers and every repeat."""
    return 2 * setup_s + 2 * repeats * plan.point_seconds()


def verdict(start: Side, winner: Side, plan: LoadPlan) -> tuple[bool, str]:
    """Confirmed when the winner's median point meets the target and its median throughput
    within target (a repeat that misses the target counting as none) beats the start's."""
    if winner.failure or not winner.points:
        return False, f"the winner could not be measured again ({winner.failure or 'no point'})"
    p99, ratio = winner.p99.median, statistics.median(p.error_ratio for p in winner.points)
    if p99 is None or p99 > plan.p99_ms or ratio > plan.max_error_ratio:
        shown = "-" if p99 is None else f"{p99:.0f}"
        return False, (f"the winner's median P99 {shown} ms or error ratio {ratio:.3f} misses "
                       f"the target (P99 <= {plan.p99_ms:g} ms, errors <= "
                       f"{plan.max_error_ratio:g})")
    if start.failure or not start.points:
        return True, "the winner meets the target in its repeats; the start could not be served"
    # Throughput counts where the target holds: a start that beats the winner's req/s only by
    # missing the P99 target in some repeats does not beat it (those repeats count as none).
    ours, theirs = winner.goodput, start.goodput
    assert ours is not None  # the winner has points (checked above)
    missed = len(start.points) - start.within
    note = f" ({missed} of the start's {len(start.points)} repeats missed the target)" \
        if missed else ""
    if not theirs or ours > theirs:
        gain = f"{ours / theirs:.2f}x" if theirs else "more than"
        return True, (f"the winner's median throughput within target is {gain} the start's"
                      f"{note}, its median P99 within {plan.p99_ms:g} ms")
    return False, (f"the winner's median throughput within target {ours:.1f} req/s does not beat "
                   f"the start's {theirs:.1f} req/s in the repeats")


def confirm(runner: Any, start: Trial, winner: Trial, repeats: int,
            echo: Callable[[str], None]) -> Confirmation:
    """Measure ``start`` and ``winner`` alternately, ``repeats`` times each.

    The embedded target serves both at once (two servers, only one loaded at a time); a
    remote server reloads the models that differ before each repeat.

    Args:
        runner: The ``TrialRunnerImpl`` of the run (its folders, load and server).
        start: The trial of the starting settings.
        winner: The search's winner.
        repeats: Repeats of each (at least ``MIN_REPEATS``).
        echo: Prints one line.
    """
    plan = runner.plan
    winner_level = _level(winner, plan.levels[0], plan.open_loop)
    sides = [Side("start", start, _level(start, winner_level, plan.open_loop), plan.open_loop),
             Side("winner", winner, winner_level, plan.open_loop)]
    echo(f"confirming trial {winner.id} against the start (trial {start.id}): {repeats} "
         f"interleaved repeats each")
    servers: dict[str, Any] = {}
    urls: dict[str, tuple[str, str]] = {}
    try:
        if runner.server.kind == "embedded":
            runner.server.close()
            for side in sides:
                folder, _ = runner.build_folder(side.trial.settings, f"confirm-{side.label}")
                servers[side.label] = EmbeddedTarget(runner.server.logs,
                                                     runner.server.start_timeout_s)
                try:
                    urls[side.label] = servers[side.label].serve(folder, [],
                                                                 f"{side.trial.id}-confirm")
                except ServerError as exc:
                    side.failure = one_line(str(exc))
        applied = None
        for _ in range(repeats):
            for side in sides:
                if side.failure:
                    continue
                try:
                    if runner.server.kind != "embedded":
                        folder, _ = runner.build_folder(side.trial.settings,
                                                        f"confirm-{side.label}")
                        urls[side.label] = runner.server.serve(
                            folder, changed_models(applied, side.trial.settings), side.trial.id)
                        applied = side.trial.settings
                    point = runner.measure(urls[side.label], side.level)
                except ServerError as exc:
                    side.failure = one_line(str(exc))
                    applied = None
                    continue
                side.points.append(point)
                p99 = "-" if point.p99_ms is None else f"{point.p99_ms:.0f}"
                echo(f"  {side.label} {level_text(point.to_dict())}: {point.throughput:.1f} "
                     f"req/s, P99 {p99} ms")
    finally:
        for server in servers.values():
            server.close()
    confirmed, reason = verdict(sides[0], sides[1], plan)
    return Confirmation(repeats, sides[0], sides[1], confirmed, reason)
