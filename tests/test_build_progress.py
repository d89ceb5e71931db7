"""The build's progress display and summary print names, paths and notes as they are.

Rich reads square brackets as markup; a pip hint like ``triton-forge[gpu]`` must survive.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from tools.build_repo.progress import BuildProgress
from tools.build_repo.results import BuildResult, ModelKind, ModelResult, ModelStatus

NOTE = "onnx2trt skipped: no GPU (the tensorrt package is not installed (pip install 'triton-forge[gpu]'))"


def _console() -> Console:
    return Console(record=True, width=400, force_terminal=False)


def test_summary_keeps_brackets_in_notes_and_paths():
    console = _console()
    model = ModelResult("minilm_encoder", ModelKind.PYTORCH, ModelStatus.BUILT, 1.0, note=NOTE)
    result = BuildResult(Path("/srv/[models]"), "gpu", [model], 1.0, Path("/srv/[models]/m.json"))

    BuildProgress(enabled=False, console=console).summary(result)

    text = console.export_text()
    assert "pip install 'triton-forge[gpu]'" in text
    assert "/srv/[models]" in text
    assert "built" in text and "ModelStatus" not in text


def test_live_display_keeps_brackets_in_the_finished_line():
    console = _console()
    progress = BuildProgress(enabled=True, console=console)
    with progress:
        progress.start_model("minilm_encoder")
        progress.stage("minilm_encoder", "onnx2trt", ["load 1.0s"])
        progress.finish_model("minilm_encoder", ModelStatus.BUILT, NOTE)

    assert "pip install 'triton-forge[gpu]'" in console.export_text()
