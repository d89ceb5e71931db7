"""One tools tune trial without a server: the concurrency climb, the score, and the rule that a
trial build repackages and never exports.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.build_repo.results import BuildResult, ModelKind, ModelResult, ModelStatus
from tools.errors import BuildError
from tools.tune import trial as trial_module
from tools.tune.knobs import ModelKnobs
from tools.tune.trial import LoadPlan, Point, climb, score, within

PLAN = LoadPlan("grpc", (4, 8, 16, 32), 1.0, 4.0, p99_ms=600.0, max_error_ratio=0.0)


def _point(concurrency: int, throughput: float, p99: float, errors: int = 0) -> Point:
    ratio = errors / 100
    return Point(concurrency, 100, errors, ratio, throughput, p99 / 2, p99,
                 within(p99, ratio, 100, PLAN))


def _measured(table):
    seen = []

    def measure(level):
        seen.append(level)
        return table[level]

    return measure, seen


def test_the_climb_stops_at_the_first_point_over_the_target():
    measure, seen = _measured({4: _point(4, 40, 200), 8: _point(8, 60, 700),
                               16: _point(16, 70, 900), 32: _point(32, 70, 1500)})
    points = climb(PLAN, measure)
    assert seen == [4, 8] and not points[-1].within_target


def test_the_climb_stops_when_throughput_no_longer_grows():
    measure, seen = _measured({4: _point(4, 60, 100), 8: _point(8, 62, 200),
                               16: _point(16, 70, 300), 32: _point(32, 71, 500)})
    climb(PLAN, measure)
    assert seen == [4, 8]


def test_errors_over_the_limit_put_a_point_over_target_whatever_its_p99():
    assert not _point(8, 100, 50, errors=1).within_target
    assert not within(None, 0.0, 0, PLAN)


def test_the_score_is_the_best_throughput_within_target():
    points = [_point(4, 40, 200), _point(8, 65, 500), _point(16, 80, 800)]
    result, best = score(points)
    assert result.feasible and result.throughput == 65 and best.concurrency == 8


def test_a_trial_with_no_point_within_target_scores_by_its_lowest_p99():
    result, best = score([_point(4, 40, 700), _point(8, 60, 900)])
    assert not result.feasible and result.p99_ms == 700 and best is None


def _fake_baseline(tmp_path: Path) -> Path:
    baseline = tmp_path / "baseline"
    for name in ("text_tokenizer", "minilm_encoder", "text_embedding"):
        (baseline / name / "1").mkdir(parents=True)
        (baseline / name / "config.pbtxt").write_text("name: 'x'\n")
    (baseline / "build_manifest.json").write_text("{}")
    return baseline


@pytest.mark.parametrize("status, kind, refused", [
    (ModelStatus.BUILT, ModelKind.PYTORCH, True),
    (ModelStatus.REPACKAGED, ModelKind.PYTORCH, False),
    (ModelStatus.BUILT, ModelKind.PYTHON, False),  # a Python model has no export to redo
    (ModelStatus.BUILT, ModelKind.ONNX, False),  # nor has an ONNX file: it is copied again
])
def test_a_trial_build_that_exports_a_model_again_is_refused(tmp_path, monkeypatch, status, kind,
                                                             refused):
    spec = tmp_path / "repository.yaml"
    spec.write_text("models:\n  minilm_encoder:\n    instances: {cpu: {count: 1}}\n")
    seen_specs = []

    def fake_build(spec_path, output, **kwargs):
        seen_specs.append(Path(spec_path))
        assert Path(spec_path).parent == spec.parent  # relative paths resolve as in the spec
        assert "count: 2" in Path(spec_path).read_text()
        return BuildResult(output, "cpu", [ModelResult("minilm_encoder", kind, status)], 0.1,
                           output / "build_manifest.json")

    monkeypatch.setattr(trial_module, "build_repository", fake_build)
    start = {"minilm_encoder": ModelKnobs(1, None, None)}
    call = lambda: trial_module.build_trial(  # noqa: E731
        spec, spec.read_text(), start, {"minilm_encoder": ModelKnobs(2, None, None)},
        _fake_baseline(tmp_path), tmp_path / "trial", ["text_tokenizer", "minilm_encoder",
                                                       "text_embedding"], "cpu")
    if refused:
        with pytest.raises(BuildError, match="exported minilm_encoder again"):
            call()
    else:
        call()
    assert seen_specs and not seen_specs[0].exists()  # the trial spec is removed after the build
    assert (tmp_path / "trial" / "minilm_encoder" / "config.pbtxt").is_file()


def test_a_point_carries_every_models_executed_batch_and_queue_split(monkeypatch):
    from tools.load import Point
    from tools.load import triton_stats

    def counters(inferences, executions, queue_ns):
        durations = dict.fromkeys(triton_stats._DURATIONS, 0)
        counts = {**durations, "success": inferences, "queue": inferences,
                  "compute_infer": inferences}
        ns = {**durations, "queue": queue_ns, "compute_infer": 2 * queue_ns}
        return triton_stats.ModelCounters(inferences, executions, counts, ns, {})

    before = {"minilm_encoder": counters(10, 10, 0), "text_tokenizer": counters(10, 10, 0)}
    after = {"minilm_encoder": counters(110, 30, 100 * 4_000_000),
             "text_tokenizer": counters(110, 60, 100 * 1_000_000)}

    def fake_measure(requests, protocol, url, stats_url, *, concurrency, **kwargs):
        # the load engine's Triton meter: the window between the warm-up's end and the end
        return Point("text_embedding", protocol, concurrency, None, 100, 0, 4.0, 25.0, 80.0,
                     300.0, meters={"triton": triton_stats.window(before, after)})

    monkeypatch.setattr(trial_module, "measure", fake_measure)
    plan = LoadPlan("grpc", (8,), 0.05, 4.0, p99_ms=600.0, max_error_ratio=0.0)
    point = trial_module.measure_point(plan, "u", "s", ["a"], 8, "text_embedding", "minilm_encoder")
    assert point.within_target and point.throughput == 25.0
    assert point.models["minilm_encoder"]["mean_batch"] == 5.0
    assert point.models["minilm_encoder"]["queue_ms"] == 4.0
    assert point.models["text_tokenizer"]["mean_batch"] == 2.0


def test_only_models_whose_knobs_changed_are_reloaded():
    from tools.tune.servers import changed_models

    before = {"a": ModelKnobs(1, 2, 0), "b": ModelKnobs(1, None, 0)}
    after = {"a": ModelKnobs(1, 2, 0), "b": ModelKnobs(2, None, 0)}
    assert changed_models(before, after) == ["b"]
    assert changed_models(None, after) == ["a", "b"]
