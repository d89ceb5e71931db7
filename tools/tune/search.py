"""Coordinate descent over the knob space: one knob at a time, keep a move only if it pays.

The search is a pure function of the scores it is given, so a resumed run replays the same path
from the results file (no trial rerun) and carries on where the last one stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tools.tune.knobs import KnobSpace, Settings, settings_key

MIN_GAIN = 0.03  # a move must raise throughput by 3%: less is within a shared machine's noise


@dataclass(frozen=True)
class Score:
    """How good a trial was: feasible trials by throughput, the others by how close they came.

    Attributes:
        feasible: Some concurrency point met the P99 target and the error limit.
        throughput: The best such point's throughput (req/s); 0 when not feasible.
        p99_ms: That point's P99; for an infeasible trial, the lowest P99 seen (None if none).
    """

    feasible: bool
    throughput: float
    p99_ms: float | None

    def beats(self, other: Score, min_gain: float = MIN_GAIN) -> bool:
        """True when this is clearly better than ``other`` (by ``min_gain`` in throughput)."""
        if self.feasible != other.feasible:
            return self.feasible
        if self.feasible:
            return self.throughput > other.throughput * (1.0 + min_gain)
        if self.p99_ms is None:
            return False
        return other.p99_ms is None or self.p99_ms < other.p99_ms * (1.0 - min_gain)


class BudgetExhausted(Exception):
    """Raised by an evaluation that would not fit in the time left; the search stops there."""


@dataclass
class SearchOutcome:
    """Where the search ended.

    Attributes:
        best: The incumbent settings (the start, unless a move paid).
        score: Their score.
        complete: True when a full pass over every knob found no better move (a local optimum);
            False when the budget ran out first.
        steps: Settings evaluated (cached ones included), in order.
    """

    best: Settings
    score: Score
    complete: bool
    steps: int


def coordinate_descent(space: KnobSpace, evaluate: Callable[[Settings], Score], *,
                       min_gain: float = MIN_GAIN) -> SearchOutcome:
    """Hill-climb from ``space.start`` one knob at a time (Model Analyzer's quick mode).

    For each knob in ``space.coordinates()`` order: step it up while each step beats the
    incumbent by ``min_gain``; if the first step up did not, try down the same way. Passes repeat
    until one changes nothing. ``evaluate`` is called once per distinct setting (the caller
    caches); raising ``BudgetExhausted`` ends the search with the incumbent so far.

    Args:
        space: The knob ladders, the cores rule and the start.
        evaluate: Settings -> score; may raise ``BudgetExhausted``.
        min_gain: The relative throughput gain a move must show to be kept.

    Returns:
        The incumbent, its score and whether the search converged.
    """
    seen: dict[str, Score] = {}
    steps = 0

    def score_of(settings: Settings) -> Score:
        nonlocal steps
        key = settings_key(settings)
        if key not in seen:
            seen[key] = evaluate(settings)
            steps += 1
        return seen[key]

    current = dict(space.start)
    best = score_of(current)  # a budget too small for the start itself propagates
    try:
        changed = True
        while changed:
            changed = False
            for coordinate in space.coordinates():
                for direction in (+1, -1):
                    moved = False
                    candidate = space.step(current, coordinate, direction)
                    while candidate is not None:
                        score = score_of(candidate)
                        if not score.beats(best, min_gain):
                            break
                        current, best, moved, changed = candidate, score, True, True
                        candidate = space.step(current, coordinate, direction)
                    if moved:
                        break
    except BudgetExhausted:
        return SearchOutcome(current, best, False, steps)
    return SearchOutcome(current, best, True, steps)
