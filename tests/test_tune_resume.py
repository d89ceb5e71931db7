"""What a tools tune figure depends on: the resume key, the cores that bound the ladder, the
open-loop climb and the confirmation verdict. No server: trials are fake, files are written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.manifest import MANIFEST_NAME
from tools.tune.confirm import Side, Spread, verdict
from tools.tune.context import export_hashes, resume_context, spec_hash
from tools.tune.knobs import Cores, KnobSpace, ModelKnobs, host_cores
from tools.tune.results import Trial, save
from tools.tune.trial import LoadPlan, Point, climb, within
from tools.tune.tuner import Session, run_search

PLAN = LoadPlan("grpc", (4, 8), 1.0, 4.0, p99_ms=600.0, max_error_ratio=0.0)
START = {"enc": ModelKnobs(1, 1, 0, (), 128), "tok": ModelKnobs(1, None, 500, (), 128)}
SPEC = """target: cpu
cpu_cores: 2
models:
  enc:
    onnx: enc.onnx
    max_batch_size: 8
    instances: {cpu: {count: 1, intra_op_threads: 1}}
    dynamic_batching: {max_queue_delay_microseconds: 0}
python_models:
  tok:
    backend: text_tokenizer
    parameters: {max_length: 64}
pipelines:
  pipe:
    steps: [{model: tok}, {model: enc}]
"""


class Trials:
    """Throughput grows with the encoder's cores; P99 stays at 300 ms."""

    def __init__(self):
        self.calls = []

    def __call__(self, settings, trial_id):
        self.calls.append(trial_id)
        rps = 30.0 * settings["enc"].cores()
        point = {"concurrency": 4, "requests": 100, "errors": 0, "error_ratio": 0.0,
                 "throughput": rps, "p50_ms": 150.0, "p99_ms": 300.0, "within_target": True,
                 "first_error": "", "models": {}, "rate": None}
        return [point], {}


def _context(plan: LoadPlan, spec_text: str = SPEC, exports=None, data: str = "d" * 64):
    return resume_context(plan.context(), {"served": "embedded"}, "pipe", data,
                          spec_hash(spec_text, ["enc", "tok", "pipe"]),
                          exports or {"enc": "e1", "tok": "t1"}, 2)


def _run(tmp_path: Path, context, trials=(), max_trials=None):
    runner = Trials()
    path = tmp_path / "results.json"
    session = Session(PLAN, context, list(trials), runner, 1e6,
                      lambda all_trials: save(path, {}, all_trials, None), max_trials=max_trials)
    outcome = run_search(KnobSpace(2, {"enc": 8, "tok": 8}, dict(START)), session, 0.03)
    session.outcome = outcome
    return session, runner


def test_max_trials_stops_the_search_after_that_many_new_trials_and_a_rerun_goes_on(tmp_path):
    unlimited, _ = _run(tmp_path, _context(PLAN))
    assert len(unlimited.trials) > 2
    first, runner = _run(tmp_path, _context(PLAN), max_trials=2)
    assert runner.calls == [1, 2] and first.out_of_trials()
    assert not first.outcome.search.complete and first.outcome.best is not None
    second, runner = _run(tmp_path, _context(PLAN), first.trials, max_trials=2)
    assert second.reused >= 1 and runner.calls == [3, 4]  # resumed trials do not count


def test_a_rerun_with_the_same_context_reuses_every_trial(tmp_path):
    first, _ = _run(tmp_path, _context(PLAN))
    second, runner = _run(tmp_path, _context(PLAN), first.trials)
    assert runner.calls == [] and second.reused == len(first.trials)


@pytest.mark.parametrize("changed", [
    pytest.param(lambda: _context(LoadPlan("grpc", (4, 8), 1.0, 4.0, 500.0, 0.0)),
                 id="stricter P99 target"),
    pytest.param(lambda: _context(LoadPlan("grpc", (4, 8), 1.0, 4.0, 600.0, 0.01)),
                 id="another error limit"),
    pytest.param(lambda: _context(PLAN, SPEC.replace("max_length: 64", "max_length: 128")),
                 id="changed spec hash"),
    pytest.param(lambda: _context(PLAN, exports={"enc": "e2", "tok": "t1"}),
                 id="rebuilt export"),
    pytest.param(lambda: _context(PLAN, data="x" * 64), id="other request data"),
    pytest.param(lambda: _context(LoadPlan("grpc", (), 1.0, 4.0, 600.0, 0.0, (10.0, 20.0))),
                 id="open loop"),
])
def test_trials_of_another_context_are_not_reused(tmp_path, changed):
    first, _ = _run(tmp_path, _context(PLAN))
    second, runner = _run(tmp_path, changed(), first.trials)
    assert second.reused == 0 and runner.calls[0] == len(first.trials) + 1


def test_the_spec_hash_leaves_out_the_knobs_the_tuner_sets_and_nothing_else():
    members = ["enc", "tok", "pipe"]
    base = spec_hash(SPEC, members)
    knobs = SPEC.replace("count: 1, intra_op_threads: 1", "count: 2, intra_op_threads: 1") \
        .replace("max_queue_delay_microseconds: 0", "max_queue_delay_microseconds: 500")
    assert spec_hash(knobs, members) == base
    assert spec_hash(SPEC.replace("max_batch_size: 8", "max_batch_size: 16"), members) != base
    assert spec_hash(SPEC + "  other: {steps: []}\n", members) == base  # not a member


def test_export_hashes_follow_the_manifests_artifacts(tmp_path):
    def manifest(sha: str) -> None:
        entry = {"kind": "onnx", "target": "cpu",
                 "artifacts": {"1/model.onnx": {"bytes": 3, "sha256": sha}}}
        (tmp_path / MANIFEST_NAME).write_text(json.dumps(
            {"format": 1, "spec": "s", "target": "cpu", "models": {"enc": entry}}))

    manifest("a" * 64)
    first = export_hashes(tmp_path, ["enc", "pipe"])
    manifest("b" * 64)
    assert set(first) == {"enc"} and export_hashes(tmp_path, ["enc"]) != first


def test_the_hosts_cores_bound_the_ladder_and_say_so_when_the_spec_differs():
    cores = host_cores(spec_cores=64)
    assert cores.bound == cores.host < 64 and "not the spec's cpu_cores 64" in cores.describe()
    space = KnobSpace(Cores(4, 1, "test").bound, {"enc": 8}, {"enc": ModelKnobs(1, 1, 0)})
    assert space.values("enc", "instances") == [1, 2, 3, 4]
    assert "agrees" in Cores(2, 2, "os.sched_getaffinity").describe()


def test_a_trial_spec_gets_the_hosts_cpu_cores_when_the_ladder_goes_past_the_specs(
        tmp_path, monkeypatch):
    from tools.build_repo.results import BuildResult
    from tools.tune import trial as trial_module

    spec = tmp_path / "repository.yaml"
    spec.write_text("cpu_cores: 1\nmodels:\n  enc:\n    instances: {cpu: {count: 1}}\n")
    baseline = tmp_path / "baseline"
    (baseline / "enc").mkdir(parents=True)
    (baseline / MANIFEST_NAME).write_text("{}")
    seen = []

    def fake_build(spec_path, output, **kwargs):
        seen.append(Path(spec_path).read_text())
        return BuildResult(output, "cpu", [], 0.1, output / MANIFEST_NAME)

    monkeypatch.setattr(trial_module, "build_repository", fake_build)
    trial_module.build_trial(spec, spec.read_text(), {"enc": ModelKnobs(1, None, None)},
                             {"enc": ModelKnobs(2, None, None)}, baseline, tmp_path / "t", ["enc"],
                             "cpu", cpu_cores=2)
    assert "cpu_cores: 2" in seen[0] and "count: 2" in seen[0]


def _point(level: float, throughput: float, p99: float, plan: LoadPlan) -> Point:
    return Point(0, 100, 0, 0.0, throughput, p99 / 2, p99, within(p99, 0.0, 100, plan),
                 rate=level)


def test_the_open_loop_climbs_rates_then_bisects_to_the_highest_that_meets_the_target():
    plan = LoadPlan("grpc", (), 1.0, 2.0, 600.0, 0.0, (10.0, 20.0, 40.0), refine=2)
    capacity = 27.0  # P99 stays low below this rate, explodes above
    seen = []

    def measure(rate):
        seen.append(rate)
        return _point(rate, min(rate, capacity), 100.0 if rate <= capacity else 5000.0, plan)

    points = climb(plan, measure)
    assert seen == [10.0, 20.0, 40.0, 30.0, 25.0]
    best = max((p for p in points if p.within_target), key=lambda p: p.throughput)
    assert best.rate == 25.0 and plan.points_at_most() == 5


def _side(label: str, throughputs, p99s, plan=PLAN) -> Side:
    trial = Trial(1 if label == "start" else 2, {}, {}, [], 0.0)
    side = Side(label, trial, 8)
    side.points = [Point(8, 100, 0, 0.0, t, p / 2, p, within(p, 0.0, 100, plan))
                   for t, p in zip(throughputs, p99s)]
    return side


def test_the_winner_is_confirmed_only_when_its_median_beats_the_start_within_target():
    start = _side("start", [40, 42, 41], [300, 320, 310])
    assert verdict(start, _side("winner", [50, 55, 52], [400, 420, 410]), PLAN)[0]
    slower, why = verdict(start, _side("winner", [39, 45, 40], [400, 420, 410]), PLAN)
    assert not slower and "does not beat the start's 41.0 req/s" in why
    # a start that is faster only in repeats past the target does not beat a winner within it
    late_start = _side("start", [60, 62, 58], [300, 900, 950])
    beaten, why = verdict(late_start, _side("winner", [50, 55, 52], [400, 420, 410]), PLAN)
    assert beaten and "2 of the start's 3 repeats missed the target" in why
    late, why = verdict(start, _side("winner", [50, 55, 52], [700, 650, 500]), PLAN)
    assert not late and "median P99 650 ms" in why
    assert Spread.of([3.0, None, 1.0, 2.0]).text() == "1.0 / 2.0 / 3.0"
