"""The keys that decide skip / repackage / build cover what shapes the artifacts.

Tool versions under every distribution name, the GPU a plan is built for, and every module of
the build package that writes or shapes a file.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from tools import manifest
from tools.build_repo import fingerprints, onnx2trt
from tools.build_repo.builders import PytorchBuilder
from tools.build_repo.config import render
from tools.build_repo.ensemble import render_all
from tools.build_repo.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]


def _installed(packages: dict[str, str]):
    def version(name: str) -> str:
        if name in packages:
            return packages[name]
        raise importlib.metadata.PackageNotFoundError(name)

    return version


@pytest.mark.parametrize("distribution", ["tensorrt", "tensorrt-cu12", "tensorrt-cu13"])
def test_tool_versions_find_tensorrt_under_each_distribution_name_beside_onnxruntime(
    monkeypatch, distribution
):
    installed = {"onnxruntime": "1.22.0", distribution: "10.13.2", "torch": "2.13.0"}
    monkeypatch.setattr(importlib.metadata, "version", _installed(installed))

    versions = manifest.tool_versions()

    assert versions["tensorrt"] == "10.13.2"
    assert versions["onnxruntime"] == "1.22.0"


def test_tool_versions_take_onnxruntime_gpu_when_the_cpu_wheel_is_absent(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", _installed({"onnxruntime-gpu": "1.22.0"}))
    assert manifest.tool_versions()["onnxruntime"] == "1.22.0"


def _gpu_plan(monkeypatch, device):
    spec = load_spec(ROOT / "repository.yaml")
    model = spec.find("minilm_encoder")
    text = render(render_all(spec, "gpu")["minilm_encoder"].to_message())
    monkeypatch.setattr(onnx2trt, "device_record", lambda: device)
    return PytorchBuilder(spec, model, "gpu", text).plan(None)


def test_a_new_tensorrt_or_another_gpu_changes_the_export_key_of_a_tensorrt_model(monkeypatch):
    base = _gpu_plan(monkeypatch, {"tensorrt": "10.13.2", "compute_capability": "8.6"})
    image = _gpu_plan(monkeypatch, {"tensorrt": "10.11.0", "compute_capability": "8.6"})
    gpu = _gpu_plan(monkeypatch, {"tensorrt": "10.13.2", "compute_capability": "8.9"})
    same = _gpu_plan(monkeypatch, {"tensorrt": "10.13.2", "compute_capability": "8.6"})

    assert len({base.export_fingerprint, image.export_fingerprint, gpu.export_fingerprint}) == 3
    assert len({base.fingerprint, image.fingerprint, gpu.fingerprint}) == 3
    assert same.export_fingerprint == base.export_fingerprint


def test_every_module_of_the_build_package_is_in_the_full_key_unless_declared_not_shaping():
    package = {p.relative_to(fingerprints.PACKAGE).as_posix()
               for p in fingerprints.PACKAGE.rglob("*.py")}
    assert fingerprints.NOT_SHAPING <= package and fingerprints.PACKAGING_ONLY <= package

    full = set(fingerprints.builder_sources())
    export = set(fingerprints.builder_sources(export_only=True))

    assert full == package - fingerprints.NOT_SHAPING
    # The modules that write the folders and trace the export are in the keys.
    assert {"builders.py", "repository.py", "config.py"} <= full
    assert {"builders.py", "torch2onnx.py", "parity.py", "onnx2trt.py", "model_source.py"} <= export
    # the spec's defaults and derived values shape the export too (a subpackage is in the key)
    assert {"spec/entries.py", "spec/settings.py", "spec/values.py"} <= export
    assert export == full - fingerprints.PACKAGING_ONLY
