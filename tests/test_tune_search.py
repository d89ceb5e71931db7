"""tools tune's coordinate descent: it climbs, keeps only moves that pay, and honours the budget.

The objective is a made-up function of the settings; no server.
"""

from __future__ import annotations

import pytest

from tools.tune.knobs import KnobSpace, ModelKnobs, settings_key
from tools.tune.search import BudgetExhausted, Score, coordinate_descent

START = {"minilm_encoder": ModelKnobs(1, 1, 0, (), 128),
         "text_tokenizer": ModelKnobs(1, None, 500, (), 128)}


def _space() -> KnobSpace:
    return KnobSpace(2, {"minilm_encoder": 32, "text_tokenizer": 32}, dict(START))


def _throughput(settings) -> float:
    """Unimodal in each knob: best at encoder 1x2, a 4 ms delay and preferred 8; the tokenizer
    does not matter."""
    enc = settings["minilm_encoder"]
    value = 40.0 * enc.cores() + (10.0 if enc.threads == 2 else 0.0)
    value += {0: 0, 500: 5, 1000: 10, 2000: 15, 4000: 20, 8000: 12}[
        enc.max_queue_delay_microseconds]
    value += {(): 0, (2,): 4, (4,): 8, (8,): 12, (16,): 6, (32,): 0}[enc.preferred_batch_size]
    return value


class Counting:
    def __init__(self, objective):
        self.objective, self.calls = objective, []

    def __call__(self, settings):
        self.calls.append(settings_key(settings))
        return Score(True, self.objective(settings), 100.0)


def test_descent_reaches_the_optimum_of_a_unimodal_objective_with_far_fewer_trials_than_the_grid():
    space = _space()
    evaluate = Counting(_throughput)
    outcome = coordinate_descent(space, evaluate)
    best = outcome.best["minilm_encoder"]
    assert (best.instances, best.threads, best.max_queue_delay_microseconds,
            best.preferred_batch_size) == (1, 2, 4000, (8,))
    assert outcome.complete
    assert len(evaluate.calls) < 40 < space.grid_size()


def test_every_setting_is_evaluated_once():
    evaluate = Counting(_throughput)
    coordinate_descent(_space(), evaluate)
    assert len(evaluate.calls) == len(set(evaluate.calls))


def test_a_gain_below_min_gain_is_not_kept():
    def flat(settings):  # 1% better with more delay: noise, not a reason to change
        return 100.0 * (1.01 if settings["minilm_encoder"].max_queue_delay_microseconds else 1.0)

    outcome = coordinate_descent(_space(), Counting(flat), min_gain=0.03)
    assert outcome.best == START


def test_a_budget_that_runs_out_ends_the_search_with_the_incumbent_as_incomplete():
    evaluate = Counting(_throughput)

    def limited(settings):
        if len(evaluate.calls) >= 3:
            raise BudgetExhausted()
        return evaluate(settings)

    outcome = coordinate_descent(_space(), limited)
    assert not outcome.complete
    assert outcome.steps == 3
    assert outcome.score.throughput == max(_throughput(START), outcome.score.throughput)


def test_a_budget_too_small_for_the_start_itself_propagates():
    def none_left(settings):
        raise BudgetExhausted()

    with pytest.raises(BudgetExhausted):
        coordinate_descent(_space(), none_left)


def test_a_feasible_trial_beats_any_infeasible_one_and_infeasible_ones_rank_by_p99():
    assert Score(True, 1.0, 500.0).beats(Score(False, 0.0, 10.0))
    assert not Score(False, 0.0, 10.0).beats(Score(True, 1.0, 500.0))
    assert Score(False, 0.0, 700.0).beats(Score(False, 0.0, 900.0))
    assert not Score(False, 0.0, None).beats(Score(False, 0.0, 900.0))
