"""SLO entries for new pipelines: ``tools add`` writes one (comments of the file kept), and
``--p99-ms`` alone gives targets to a scenario without one. No server.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.scenario_helpers import linear_onnx, start_spec
from tools.cli import cli
from tools.errors import ModelSourceError, UserInputError
from tools.slo import (
    DEFAULT_LOAD,
    DEFAULT_SLO_FILE,
    NEW_P99_MS,
    NoScenarioSLO,
    load_slo,
    plan_new_scenario,
    scenario_slo,
    slo_file_for,
)


def _comments(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.lstrip().startswith("#")]


def test_a_new_entry_goes_last_in_the_cpu_profile_and_every_comment_stays(tmp_path):
    path = tmp_path / "slo.yaml"
    shutil.copy(DEFAULT_SLO_FILE, path)
    before = path.read_text()
    line = plan_new_scenario(path, "clf3").write()
    after = path.read_text()
    assert _comments(before) == _comments(after)
    cpu_before, gpu_before = before.split("\n  gpu:\n")
    cpu_after, gpu_after = after.split("\n  gpu:\n")
    assert gpu_after == gpu_before and cpu_after.startswith(cpu_before)
    added = cpu_after[len(cpu_before):].strip("\n").splitlines()
    assert added[0].startswith("      clf3:  # tools add: ") and len(added) == 4
    slo = load_slo(path, "cpu", "clf3")
    assert {p: (t.p99_ms, t.max_error_ratio, t.min_throughput_rps)
            for p, t in slo.targets.items()} == {"http": (NEW_P99_MS, 0.0, None),
                                                 "grpc": (NEW_P99_MS, 0.0, None)}
    assert slo.load.users == DEFAULT_LOAD.users
    assert load_slo(path, "cpu", "text_embedding").targets["http"].min_throughput_rps == 30
    assert "throughput for you to set" in line


def test_an_existing_entry_is_kept_as_the_user_set_it(tmp_path):
    path = tmp_path / "slo.yaml"
    shutil.copy(DEFAULT_SLO_FILE, path)
    planned = plan_new_scenario(path, "text_embedding")
    assert planned.text is None and "kept" in planned.write()
    assert path.read_text() == DEFAULT_SLO_FILE.read_text()


def test_a_missing_file_is_created_and_a_missing_profile_added(tmp_path):
    created = tmp_path / "new" / "slo.yaml"
    plan_new_scenario(created, "mine").write()
    assert load_slo(created, "cpu", "mine").targets["grpc"].p99_ms == NEW_P99_MS
    assert created.read_text().startswith("# yaml-language-server: $schema=")
    gpu_only = tmp_path / "gpu.yaml"
    gpu_only.write_text("profiles:\n  gpu:  # measured on a T4\n    scenarios:\n      a:\n"
                        "        load: {users: 1}\n        http: {p99_ms: 5, max_error_ratio: 0}\n"
                        "        grpc: {p99_ms: 5, max_error_ratio: 0}\n")
    plan_new_scenario(gpu_only, "b").write()
    assert load_slo(gpu_only, "cpu", "b").load == DEFAULT_LOAD
    assert load_slo(gpu_only, "gpu", "a").targets["http"].p99_ms == 5
    assert "# measured on a T4" in gpu_only.read_text()


def test_a_file_laid_out_in_flow_style_gets_the_entry_inside_its_braces(tmp_path):
    path = tmp_path / "slo.yaml"
    path.write_text("profiles: {cpu: {scenarios: {}}}  # kept\n")
    plan_new_scenario(path, "x").write()
    assert load_slo(path, "cpu", "x").targets["http"].p99_ms == NEW_P99_MS
    assert path.read_text().startswith("profiles: {cpu: {scenarios: {x: {load: ")
    assert path.read_text().endswith("}}}}}  # kept\n")


def test_a_malformed_slo_file_is_refused_unchanged_naming_the_line(tmp_path):
    path = tmp_path / "slo.yaml"
    text = "profiles:\n  cpu:\n    scenarios: [a, b]\n"
    path.write_text(text)
    with pytest.raises(UserInputError, match=r"slo.yaml:3:5: profiles.cpu.scenarios must be a mapping"):
        plan_new_scenario(path, "x")
    assert path.read_text() == text


def test_the_slo_file_of_a_spec_is_the_one_beside_it():
    project = DEFAULT_SLO_FILE.parents[1] / "repository.yaml"
    assert slo_file_for(project) == DEFAULT_SLO_FILE
    assert slo_file_for(Path("/somewhere/else/repository.yaml")) == Path(
        "/somewhere/else/slo.yaml")


def test_p99_ms_alone_gives_targets_to_a_scenario_without_an_entry(tmp_path):
    with pytest.raises(NoScenarioSLO, match=r"has no scenario 'mine'.*give --p99-ms"):
        scenario_slo(DEFAULT_SLO_FILE, "cpu", "mine")
    slo = scenario_slo(tmp_path / "none.yaml", "cpu", "mine", p99_ms=250.0)
    assert slo.source == "--p99-ms" and slo.load == DEFAULT_LOAD
    assert slo.targets["http"].p99_ms == 250.0 and slo.targets["http"].max_error_ratio == 0.0
    over = scenario_slo(DEFAULT_SLO_FILE, "cpu", "text_embedding", p99_ms=90.0)
    assert over.targets["grpc"].p99_ms == 90.0 and over.targets["grpc"].min_throughput_rps == 28


def test_tools_add_writes_the_slo_entry_beside_the_spec(tmp_path):
    spec = start_spec(tmp_path)
    model = linear_onnx(tmp_path / "scorer.onnx")
    result = CliRunner().invoke(cli, ["add", "onnx", str(model), "--name", "scorer",
                                      "--spec", str(spec)])
    assert result.exit_code == 0, result.output
    assert "SLO of scorer in " in result.output
    assert load_slo(tmp_path / "slo.yaml", "cpu", "scorer").targets["http"].p99_ms == NEW_P99_MS


def test_a_failed_add_writes_neither_the_spec_nor_the_slo_file(tmp_path):
    from tools.add.command import add_model

    spec = start_spec(tmp_path)
    (tmp_path / "broken.onnx").write_bytes(b"not onnx")
    before = spec.read_text()
    with pytest.raises(ModelSourceError):
        add_model("onnx", str(tmp_path / "broken.onnx"), "broken", spec)
    assert spec.read_text() == before and not (tmp_path / "slo.yaml").exists()
