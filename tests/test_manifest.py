"""The build manifest (``tools/manifest.py``): kinds and stages are enums, written as their words.

Standard library only; ``tests/test_trt_guard.py`` runs the guard that reads it from the files
the serving image copies.
"""

from __future__ import annotations

import json

import pytest

from tools.build_repo.builder_base import Stages
from tools.build_repo.progress import BuildProgress
from tools.build_repo.results import ModelResult
from tools.manifest import (
    Manifest,
    ManifestError,
    ModelEntry,
    ModelKind,
    Stage,
    StageRecord,
    StageStatus,
)


def test_an_entry_writes_its_kind_and_stages_as_words_and_reads_them_back_as_enums():
    entry = ModelEntry(kind=ModelKind.PYTORCH, target="cpu",
                       stages={Stage.EXPORT: StageRecord(StageStatus.DONE, 1.5),
                               Stage.ONNX2TRT: StageRecord(StageStatus.SKIPPED, reason="no GPU")})
    text = Manifest("repository.yaml", "cpu", {"enc": entry}).to_text()
    written = json.loads(text)["models"]["enc"]
    assert written["kind"] == "pytorch"
    assert written["stages"] == {"export": {"status": "done", "seconds": 1.5},
                                 "onnx2trt": {"status": "skipped", "reason": "no GPU"}}
    back = Manifest.from_text(text).models["enc"]
    assert back.kind is ModelKind.PYTORCH
    assert back.stages == entry.stages and all(isinstance(s, Stage) for s in back.stages)


def test_an_entry_given_the_word_of_its_kind_holds_the_enum():
    assert ModelEntry(kind="ensemble", target="gpu").kind is ModelKind.ENSEMBLE


@pytest.mark.parametrize(("field", "value"), [("kind", "tensorflow"),
                                              ("stages", {"exprot": {"status": "done"}})])
def test_an_unknown_kind_or_stage_makes_the_manifest_unreadable_naming_the_model(field, value):
    data = {"format": 1, "models": {"enc": {"kind": "pytorch", "target": "cpu", field: value}}}
    with pytest.raises(ManifestError, match=r"model 'enc'"):
        Manifest.from_text(json.dumps(data))


def test_a_stage_is_run_only_by_a_name_the_manifest_knows():
    stages = Stages(ModelResult("enc", ModelKind.PYTORCH), BuildProgress(enabled=False))
    assert stages.run(Stage.EXPORT, lambda: 7) == 7
    assert list(stages.records) == [Stage.EXPORT]
    with pytest.raises(ValueError, match="exprot"):
        stages.run("exprot", lambda: 7)
