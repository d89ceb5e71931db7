"""The ``tools tune`` runs the tests replay: their specs, and a trial runner that answers from a
recorded run instead of serving and loading (model_analyzer's checkpoint pattern).

Each recording is the ``results.json`` of one real ``tools tune`` run on a spec this module
writes (no torch: ONNX graphs written with ``onnx.helper`` and one Python model), kept in
tests/data/tune/. Record them again when the search, the knobs or the plan change what a run
asks for (the replay then fails naming the settings it has no trial for):

    .venv/bin/python tests/tune_helpers.py            # about 10 minutes on 2 cores
"""

from __future__ import annotations

import inspect
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
if str(TESTS.parent) not in sys.path:  # run as a script: the checkout's tools and tests
    sys.path.insert(0, str(TESTS.parent))

from tests.scenario_helpers import linear_onnx, start_spec  # noqa: E402
from tools.errors import ServerError  # noqa: E402
from tools.tune.knobs import Cores, settings_key  # noqa: E402
from tools.tune.results import RESULTS_NAME, Trial, load_trials  # noqa: E402
from tools.tune.trial import Point  # noqa: E402

RECORDINGS = TESTS / "data" / "tune"

# A Python step that refuses more than one instance when Triton loads it: a real load failure
# a knob setting causes, with the model's own reason in the server's answer.
PICKY_MODEL = '''
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        groups = json.loads(args["model_config"]).get("instance_group", [])
        count = sum(int(g.get("count", 1)) for g in groups)
        if count > 1:
            raise pb_utils.TritonModelException(f"picky refuses {count} instances")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "checked", pb_utils.get_input_tensor_by_name(r, "features").as_numpy())])
            for r in requests]
'''
PICKY_ENTRIES = """
python_models:
  picky:
    backend: picky
    max_batch_size: 16
    inputs:
      - {name: features, dtype: float32, shape: [batch, 6]}
    outputs:
      - {name: checked, dtype: float32, shape: [batch, 6]}
    dynamic_batching:
      max_queue_delay_microseconds: 0
      default_queue_policy: {max_queue_size: 64, default_timeout_microseconds: 1000000}
    instances: {cpu: {count: 1}}

pipelines:
  picky_scorer:
    max_batch_size: 16
    inputs:
      - {name: FEATURES, dtype: float32, shape: [batch, 6]}
    outputs:
      - {name: SCORES, dtype: float32, shape: [batch, 3]}
    steps:
      - model: picky
        inputs: {features: FEATURES}
        outputs: {checked: checked}
      - model: scorer
        inputs: {features: checked}
        outputs: {scores: SCORES}
"""


def scorer_spec(root: Path) -> Path:
    """A user's spec with one added ONNX graph, ``scorer`` (features [batch, 6] -> scores)."""
    from tools.add.command import add_model

    spec = start_spec(root)
    add_model("onnx", str(linear_onnx(root / "scorer.onnx")), "scorer", spec)
    return spec


def picky_spec(root: Path) -> Path:
    """``scorer`` behind ``picky``, a Python step that refuses to load with two instances, as the
    pipeline ``picky_scorer``; the spec says 1 core (the host has more)."""
    from tools import paths
    from tools.add.command import add_model

    backends = root / "backends"
    backends.mkdir(parents=True)
    for entry in paths.BACKENDS.iterdir():
        if entry.name != "__pycache__":
            (backends / entry.name).symlink_to(entry)
    (backends / "picky").mkdir()
    (backends / "picky" / "model.py").write_text(PICKY_MODEL)
    spec = start_spec(root, cpu_cores=1, backends=backends)
    add_model("onnx", str(linear_onnx(root / "scorer.onnx")), "scorer", spec)
    spec.write_text(spec.read_text() + PICKY_ENTRIES)
    return spec


def built(spec: Path) -> Path:
    """The spec built for the cpu target beside it (no export: ONNX files and Python models)."""
    from tools.build_repo.pipeline import build_repository

    repository = spec.parent / "repo"
    build_repository(spec, repository, progress=False)
    return repository


@dataclass(frozen=True)
class Recording:
    """One recorded run: how to make its spec and the ``tools tune`` arguments it ran with."""

    name: str
    make_spec: Callable[[Path], Path]
    scenario: str
    args: tuple[str, ...]

    @property
    def path(self) -> Path:
        """Its results file in tests/data/tune/."""
        return RECORDINGS / f"{self.name}.json"

    def data(self) -> dict[str, Any]:
        """The recorded results file."""
        return json.loads(self.path.read_text(encoding="utf-8"))


RUNS = {
    # a start with a 100 ms queue delay: the search must move away from it, and the winner is
    # then confirmed against the start in interleaved repeats
    "closed": Recording("closed", scorer_spec, "scorer", (
        "--p99-ms", "800", "--budget-minutes", "8", "--concurrency", "2,4", "--warmup", "1",
        "--duration", "2", "--start", "scorer.max_queue_delay_microseconds=100000")),
    "infeasible": Recording("infeasible", picky_spec, "picky_scorer", (
        "--p99-ms", "800", "--budget-minutes", "2", "--concurrency", "2", "--warmup", "1",
        "--duration", "2")),
    "open": Recording("open", scorer_spec, "scorer", (
        "--p99-ms", "800", "--budget-minutes", "0.7", "--rate", "5,10", "--warmup", "1",
        "--duration", "2")),
}


class _Clock:
    """Seconds that pass only as recorded trials are replayed."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Server:
    kind = "remote"  # the confirmation serves its two sides through serve(), not new servers

    def serve(self, folder: Path, changed: Sequence[str], trial: Any) -> tuple[str, str]:
        return str(folder), ""

    def stopped(self) -> str:
        return ""

    def close(self) -> None:
        pass


@dataclass
class Replay:
    """Answers ``tools.tune.run.tune`` from a recorded results file: each trial's points (or its
    failure) by its settings, and the confirmation's repeats in their recorded order.

    Attributes:
        recorded: The recorded trials.
        confirmation: The recorded confirmation (``None``: there was none).
        cores: The recording machine's cores (``host_cores`` answers with them).
        clock: Advanced by each replayed trial's recorded seconds.
        asked: The settings keys the search asked for, in order.
    """

    recorded: list[Trial]
    confirmation: dict[str, Any] | None
    cores: Cores
    clock: _Clock = field(default_factory=_Clock)
    asked: list[str] = field(default_factory=list)
    plan: Any = None

    @classmethod
    def of(cls, data: dict[str, Any]) -> Replay:
        cores = data["machine"]["cores"]
        return cls([Trial.from_dict(t) for t in data["trials"]], data.get("confirmation"),
                   Cores(cores["host"], cores["spec"], cores["source"]))

    def runner(self, *args: Any, **kwargs: Any) -> Replay:
        """Stands in for ``TrialRunnerImpl(...)``: keeps the plan, ignores the rest."""
        from tools.tune.tuner import TrialRunnerImpl

        self.plan = inspect.signature(TrialRunnerImpl).bind(*args, **kwargs).arguments["plan"]
        self.server = _Server()
        self._repeats = {side: [Point(**p) for p in self.confirmation[side]["points"]]
                         for side in ("start", "winner")} if self.confirmation else {}
        return self

    def __call__(self, settings: dict, trial_id: int) -> tuple[list[dict], dict[str, str]]:
        from tools.tune.tuner import TrialFailed

        key = settings_key(settings)
        self.asked.append(key)
        trial = next((t for t in self.recorded if settings_key(t.settings) == key), None)
        if trial is None:
            raise AssertionError(f"the search asked for settings the recording has no trial of "
                                 f"({key}); record again: python tests/tune_helpers.py")
        self.clock.now += trial.seconds
        if trial.failure:
            raise TrialFailed(trial.failure, trial.points, trial.build)
        return trial.points, trial.build

    def build_folder(self, settings: dict, name: str) -> tuple[Path, dict[str, str]]:
        return Path(name.removeprefix("confirm-")), {}

    def measure(self, urls: tuple[str, str], level: float) -> Point:
        side = self._repeats[urls[0]]
        if not side:
            raise ServerError("the recording has no more repeats of this side")
        return side.pop(0)

    def close(self) -> None:
        pass


def record(names: Sequence[str] = tuple(RUNS)) -> None:
    """Run each recording for real (``tools tune`` on its spec) and keep its results file."""
    RECORDINGS.mkdir(parents=True, exist_ok=True)
    for name in names:
        run = RUNS[name]
        with tempfile.TemporaryDirectory() as folder:
            root = Path(folder)
            spec = run.make_spec(root / "project")
            repository = built(spec)
            result = subprocess.run(
                [sys.executable, "-m", "tools.cli", "tune", "--spec", str(spec), "--repository",
                 str(repository), "--output", str(root / "out"), "--protocol", "grpc",
                 "--scenario", run.scenario, *run.args],
                text=True, cwd=TESTS.parent, check=False)
            results = root / "out" / run.scenario / RESULTS_NAME
            if result.returncode != 0 or not load_trials(results):
                raise SystemExit(f"{name}: tools tune exited {result.returncode}")
            shutil.copy(results, run.path)
            print(f"recorded {run.path}")


if __name__ == "__main__":
    record(sys.argv[1:] or tuple(RUNS))
