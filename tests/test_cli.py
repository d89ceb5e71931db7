"""The `tools` group: lazy subcommands, and errors reaching the person at one edge."""

from __future__ import annotations

import pytest

import subprocess
import sys

from click.testing import CliRunner

from tools.cli import _COMMANDS, cli


def test_help_lists_every_subcommand_without_importing_torch():
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from tools.cli import cli\n"
        "result = CliRunner().invoke(cli, ['--help'])\n"
        "print(result.output)\n"
        "print('TORCH_IMPORTED' if 'torch' in sys.modules else 'TORCH_NOT_IMPORTED')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    for name in _COMMANDS:
        assert name in out.stdout
    assert "TORCH_NOT_IMPORTED" in out.stdout


def test_every_registered_subcommand_imports_and_has_help():
    runner = CliRunner()
    for name in _COMMANDS:
        result = runner.invoke(cli, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)
        assert f"tools {name}" in result.output or f"{name} [OPTIONS]" in result.output


def test_user_input_error_exits_2_with_the_subcommands_usage_line(tmp_path):
    missing = tmp_path / "no-such-spec.yaml"
    result = CliRunner().invoke(cli, ["build-repo", "--spec", str(missing), "--repository",
                                      str(tmp_path / "repo")])
    assert result.exit_code == 2
    assert "no-such-spec.yaml" in result.output
    assert "build-repo" in result.output.splitlines()[0]


def test_every_subcommand_translates_the_projects_errors_at_the_one_edge():
    from tools.cli import _COMMANDS, cli
    from tools.command import ToolCommand, ToolGroup

    for name in _COMMANDS:
        command = cli.get_command(None, name)
        assert isinstance(command, (ToolCommand, ToolGroup)), name
        if isinstance(command, ToolGroup):
            assert all(isinstance(c, ToolCommand) for c in command.commands.values()), name


def test_a_nested_subcommands_usage_error_shows_its_own_usage_line(tmp_path):
    from click.testing import CliRunner

    from tools.cli import cli

    result = CliRunner().invoke(cli, ["deploy", "k8s", "--target", "cpu", "--spec",
                                      str(tmp_path / "missing.yaml"), "--output", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert "Usage: cli deploy k8s" in result.output or "Usage: tools deploy k8s" in result.output


def test_a_project_file_missing_from_an_install_is_named_with_the_way_to_install(
    tmp_path, monkeypatch
):
    from tools import paths
    from tools.errors import ToolkitError

    assert paths.project_file(paths.LOCUSTFILE, "scenarios") == paths.LOCUSTFILE
    missing = tmp_path / "loadtests" / "locustfile.py"
    with pytest.raises(ToolkitError, match=r"not found \(the scenarios\): the checkout .* lacks "
                                           r"it \(restore it from git\)"):
        paths.project_file(missing, "the scenarios")
    monkeypatch.setattr(paths, "IN_CHECKOUT", False)
    with pytest.raises(ToolkitError, match=r"locustfile.py not found \(the scenarios\): the "
                                           r"installed triton-forge lacks it .*reinstall"):
        paths.project_file(missing, "the scenarios")
