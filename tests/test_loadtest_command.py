"""``tools loadtest`` on bad input: one line, exit 2, before any server or Locust starts.

The spec holds a model added with ``tools add onnx`` on a graph the test writes.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.scenario_helpers import linear_onnx, start_spec
from tools.add.command import add_model
from tools.cli import cli


@pytest.fixture
def spec(tmp_path):
    path = start_spec(tmp_path)
    add_model("onnx", str(linear_onnx(tmp_path / "scorer.onnx")), "scorer", path)
    return path


def _loadtest(spec, *args):
    # Port 9 of loopback: nothing listens; every case must fail before it is used.
    return CliRunner().invoke(cli, ["loadtest", "--spec", str(spec), "--url", "127.0.0.1:9",
                                    "--output", str(spec.parent / "report"), *args])


def test_an_unknown_scenario_exits_2_naming_the_known_ones(spec):
    result = _loadtest(spec, "--scenario", "nope")
    assert result.exit_code == 2, result.output
    assert "--scenario nope: not a pipeline or model of" in result.output
    assert "(known: scorer)" in result.output


def test_a_data_line_that_does_not_fit_exits_2_naming_the_line_and_the_input(spec, tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"features": [0.0] * 6}) + "\n"
                    + json.dumps({"features": [0.0] * 6, "bias": [1.0]}) + "\n")
    result = _loadtest(spec, "--scenario", "scorer", "--data", str(data))
    assert result.exit_code == 2, result.output
    assert f"{data}:2: input 'bias' is not an input of scorer (inputs: features)" in result.output
    assert not (tmp_path / "report").exists()  # nothing ran


def test_a_scenario_without_targets_exits_2_naming_the_way_out(spec, tmp_path):
    (tmp_path / "slo.yaml").unlink()  # the entry tools add wrote: the project's file is next
    result = _loadtest(spec, "--scenario", "scorer", "--protocol", "http")
    assert result.exit_code == 2, result.output
    assert "profile 'cpu' has no scenario 'scorer'" in result.output
    assert result.output.rstrip().endswith("give --p99-ms")


def test_without_scenario_every_pipeline_with_an_slo_runs_and_none_is_an_error(spec):
    result = _loadtest(spec)  # the spec has a model, no pipeline
    assert result.exit_code == 2, result.output
    assert "no pipeline of" in result.output and "name one with --scenario" in result.output
