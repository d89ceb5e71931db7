"""tools tune's session and results file: written after every trial, resumed without reruns,
bounded by the budget, and a clear error when no trial met the target. No server: fake trials.
"""

from __future__ import annotations

import json

import pytest

from tools.errors import ServerError, ToolkitError, UserInputError
from tools.tune.knobs import KnobSpace, ModelKnobs
from tools.tune.results import Trial, format_table, load_trials, save, save_plot
from tools.tune.search import BudgetExhausted
from tools.tune.trial import LoadPlan
from tools.tune.tuner import Session, check_budget, no_trial_met, run_search

PLAN = LoadPlan("grpc", (4, 8), 1.0, 4.0, p99_ms=600.0, max_error_ratio=0.0)
CONTEXT = {**PLAN.context(), "served": "embedded"}
START = {"minilm_encoder": ModelKnobs(1, 1, 0, (), 128),
         "text_tokenizer": ModelKnobs(1, None, 500, (), 128)}


def _space() -> KnobSpace:
    return KnobSpace(2, {"minilm_encoder": 32, "text_tokenizer": 32}, dict(START))


def _point(concurrency: int, throughput: float, p99: float, errors: int = 0) -> dict:
    return {"concurrency": concurrency, "requests": 100, "errors": errors,
            "error_ratio": errors / (100 + errors), "throughput": throughput, "p50_ms": p99 / 2,
            "p99_ms": p99, "within_target": p99 <= PLAN.p99_ms and not errors, "first_error": "",
            "models": {"minilm_encoder": {"mean_batch": 3.5, "queue_ms": 10.0, "compute_ms": 50.0}}}


class FakeTrials:
    """Throughput grows with encoder cores and delay; P99 is fixed."""

    def __init__(self, p99: float = 300.0, fail_at: int | None = None):
        self.calls, self.p99, self.fail_at = [], p99, fail_at

    def __call__(self, settings, trial_id):
        self.calls.append(trial_id)
        if trial_id == self.fail_at:
            raise ServerError("the embedded tritonserver exited (code -9) during the trial")
        enc = settings["minilm_encoder"]
        rps = 30.0 * enc.cores() + enc.max_queue_delay_microseconds / 200.0
        points = [_point(4, rps * 0.8, self.p99 / 2), _point(8, rps, self.p99)]
        return points, {"minilm_encoder": "repackaged"}


class Clock:
    def __init__(self, per_call: float = 0.0):
        self.now, self.per_call = 0.0, per_call

    def __call__(self):
        self.now += self.per_call
        return self.now


def _session(tmp_path, runner, trials=(), budget_s=1e6, clock=None):
    path = tmp_path / "results.json"
    return Session(PLAN, CONTEXT, list(trials), runner, budget_s,
                   lambda all_trials: save(path, {"scenario": "text_embedding"}, all_trials, None),
                   clock=clock or Clock()), path


def test_the_results_file_holds_every_completed_trial_after_each_one(tmp_path):
    session, path = _session(tmp_path, FakeTrials())
    run_search(_space(), session, 0.03)
    data = json.loads(path.read_text())
    assert [t["id"] for t in data["trials"]] == [t.id for t in session.trials]
    assert all(t["points"] and t["settings"] for t in data["trials"])


def test_a_trial_whose_server_stops_is_recorded_infeasible_and_the_search_goes_on(tmp_path):
    runner = FakeTrials(fail_at=3)
    session, path = _session(tmp_path, runner)
    outcome = run_search(_space(), session, 0.03)
    trials = json.loads(path.read_text())["trials"]
    failed = [t for t in trials if t["failure"]]
    assert [t["id"] for t in failed] == [3]
    assert "exited (code -9)" in failed[0]["failure"] and not failed[0]["within_target"]
    assert max(runner.calls) > 3  # the search went on after the failure
    assert outcome.best is not None and outcome.best.id != 3
    assert load_trials(path)[2].score().feasible is False  # and so it stays when resumed


def test_a_resumed_run_reruns_no_completed_trial_and_ends_at_the_same_winner(tmp_path):
    first_runner = FakeTrials()
    first, path = _session(tmp_path, first_runner)
    done = run_search(_space(), first, 0.03)
    second_runner = FakeTrials()
    second, _ = _session(tmp_path, second_runner, trials=load_trials(path))
    again = run_search(_space(), second, 0.03)
    assert second_runner.calls == []
    assert again.best.id == done.best.id and second.reused == len(first_runner.calls)


def test_a_run_cut_by_the_budget_resumes_where_it_stopped(tmp_path):
    cut, path = _session(tmp_path, FakeTrials(), budget_s=3 * 100.0, clock=Clock(per_call=25.0))
    partial = run_search(_space(), cut, 0.03)
    assert not partial.search.complete
    runner = FakeTrials()
    resumed, _ = _session(tmp_path, runner, trials=load_trials(path))
    full = run_search(_space(), resumed, 0.03)
    assert full.search.complete
    assert runner.calls and min(runner.calls) == len(partial.trials) + 1


def test_trials_of_another_load_are_not_reused(tmp_path):
    first, path = _session(tmp_path, FakeTrials())
    run_search(_space(), first, 0.03)
    other = [Trial(t.id, t.settings, {**t.context, "duration_s": 99.0}, t.points, t.seconds)
             for t in load_trials(path)]
    runner = FakeTrials()
    session, _ = _session(tmp_path, runner, trials=other)
    run_search(_space(), session, 0.03)
    assert runner.calls[0] == len(other) + 1


def test_the_session_stops_before_a_trial_that_would_overrun_the_budget(tmp_path):
    clock = Clock(per_call=0.0)
    runner = FakeTrials()
    session, _ = _session(tmp_path, runner, budget_s=10.0, clock=clock)
    with pytest.raises(BudgetExhausted):
        session.evaluate(START)  # the first estimate (setup + 2 points) is over 10 s
    assert runner.calls == []


def test_a_budget_too_small_for_one_trial_is_bad_input_naming_what_a_trial_needs():
    with pytest.raises(UserInputError, match=r"too small for one trial.*2 concurrency points"):
        check_budget(20.0, PLAN)
    check_budget(60.0, PLAN)


def test_no_trial_meeting_the_target_is_an_error_naming_the_best_p99_and_the_target(tmp_path):
    session, _ = _session(tmp_path, FakeTrials(p99=1400.0))  # c=4 at 700 ms, c=8 at 1400
    outcome = run_search(_space(), session, 0.03)
    assert outcome.best is None
    error = no_trial_met(outcome.trials, PLAN)
    assert isinstance(error, ToolkitError) and not isinstance(error, UserInputError)
    assert "best P99 seen was 700.0 ms" in str(error) and "concurrency 4" in str(error)
    assert "target of P99 <= 600 ms" in str(error)


def test_a_file_that_is_not_a_results_file_is_refused_naming_it(tmp_path):
    path = tmp_path / "results.json"
    path.write_text('{"something": 1}')
    with pytest.raises(UserInputError, match="not a tools tune results file"):
        load_trials(path)


def test_the_table_marks_the_winner_and_the_plot_is_a_png(tmp_path):
    session, _ = _session(tmp_path, FakeTrials())
    outcome = run_search(_space(), session, 0.03)
    table = format_table(outcome.trials, ["text_tokenizer", "minilm_encoder"], outcome.best, 600)
    winner_rows = [line for line in table.splitlines() if line.endswith("winner")]
    assert len(winner_rows) == 1 and winner_rows[0].split()[0] == str(outcome.best.id)
    save_plot(outcome.trials, outcome.best, 600.0, "t", tmp_path / "pareto.png")
    assert (tmp_path / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
