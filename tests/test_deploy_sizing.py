"""``tools deploy k8s`` sizes memory from the files a spec names, read where the build reads them:
relative to the spec's folder, whatever folder the command runs from.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.scenario_helpers import ids_onnx, start_spec
from tools.add.command import add_model
from tools.build_repo.spec import load_spec
from tools.deploy import sizing

VOCABULARY = 60_000  # 60000 x 8 float32 rows: a 1.8 MiB graph, sized as 2 MiB


def _elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)


def test_an_onnx_file_is_sized_relative_to_the_spec_not_the_current_folder(tmp_path, monkeypatch):
    spec_path = start_spec(tmp_path / "project")
    graph = ids_onnx(tmp_path / "project" / "models" / "token_sum.onnx", VOCABULARY, width=8)
    add_model("onnx", str(graph), "token_sum", spec_path)
    assert not Path(load_spec(spec_path).find("token_sum").onnx).is_absolute()  # relative, as
    # tools add writes it: the case where the current folder matters
    _elsewhere(tmp_path, monkeypatch)

    spec = load_spec(spec_path)
    model = spec.find("token_sum")
    expected = math.ceil(graph.stat().st_size / sizing.MIB)

    pod = sizing.size_pod(spec, "cpu")
    count = model.instances.cpu.count
    assert expected == 2 and dict(pod.breakdown)[f"token_sum x{count}"] == count * (
        sizing.STUB_MIB + 2 * expected + sizing.ACTIVATION_MIB)
    assert sizing.weights_mib(model, root=spec.root) == expected


@pytest.mark.torch
def test_a_recipe_folder_is_sized_relative_to_the_spec_not_the_current_folder(tmp_path,
                                                                              monkeypatch):
    from tests.add_helpers import tiny_bert_folder

    spec_path = start_spec(tmp_path / "project")
    folder = tiny_bert_folder(tmp_path / "project" / "embedder")
    add_model("hf-text-embedding", str(folder), "embedder", spec_path, pooling="cls",
              normalize=False)
    _elsewhere(tmp_path, monkeypatch)

    spec = load_spec(spec_path)
    (model,) = [m for m in spec.models if m.recipe is not None]
    assert not Path(model.recipe.path).is_absolute()
    weights = sum(p.stat().st_size for p in folder.rglob("*") if p.suffix in sizing.WEIGHT_SUFFIXES)

    expected = max(1, math.ceil(weights / sizing.MIB))
    count = model.instances.cpu.count

    assert expected != sizing.DEFAULT_WEIGHTS_MIB
    assert dict(sizing.size_pod(spec, "cpu").breakdown)[f"{model.name} x{count}"] == count * (
        sizing.STUB_MIB + 2 * expected + sizing.ACTIVATION_MIB)
