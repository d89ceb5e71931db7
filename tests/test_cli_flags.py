"""One spelling per concept across the commands, and the old spellings still working.

The old names (``tools.command.ToolOption.old_names``) must give what the new names give: the
same parsed options (so the same call of the command), the same outcome on real runs that fail
early, and, for ``tools infer``'s old ``--protocol grpc --url``, the same answer from a server.
No server except in the last test.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.core import ParameterSource
from click.testing import CliRunner

from tools.cli import cli
from tools.cli_doc import commands, visible_options
from tools.command import HostPort, ToolCommand, option, renamed_options

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "repository.yaml"
# Spellings that one concept had in one command and another in the next: none is an option now.
RETIRED = {"--users": "--concurrency", "--report-dir": "--output", "--slo": "--slo-file",
           "--profile": "--slo-profile", "--texts": "--data", "--pipelines": "--scenario"}


def _command(path: str) -> click.Command:
    return dict(commands())[path]


def _parsed(path: str, args: list[str]) -> tuple[dict, dict]:
    """The parameters the command would be called with, and where each came from."""
    command = _command(path)
    with command.make_context(f"tools {path}", list(args)) as ctx:
        return dict(ctx.params), {name: ctx.get_parameter_source(name) for name in ctx.params}


def _file(tmp_path: Path, name: str, text: str = "a text\n") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# (command, old spelling, new spelling, value): one row per old name of every command.
ALIASES = [
    ("loadtest", "--users", "--concurrency", "8"),
    ("loadtest", "--report-dir", "--output", "reports/x"),
    ("bench", "--pipelines", "--scenario", "text_embedding,text_embedding_int8"),
    ("bench", "--texts", "--data", "FILE"),
    ("build-repo", "--output", "--repository", "build/repo"),
    ("tune", "--slo", "--slo-file", "FILE"),
    ("tune", "--profile", "--slo-profile", "gpu"),
]
REQUIRED = {"tune": ["--scenario", "text_embedding"]}


def test_every_old_spelling_of_every_command_has_a_row_here():
    have = {(path, old) for path, command in commands() for old in renamed_options(command)}
    assert have == {(path, old) for path, old, _, _ in ALIASES}


@pytest.mark.parametrize(("path", "old", "new", "value"), ALIASES,
                         ids=[f"{p}{o}" for p, o, _, _ in ALIASES])
def test_an_old_spelling_parses_to_what_the_new_one_does(tmp_path, capsys, path, old, new,
                                                         value):
    value = _file(tmp_path, "payload.txt") if value == "FILE" else value
    base = REQUIRED.get(path, [])
    with_new = _parsed(path, [*base, new, value])
    assert _parsed(path, [*base, old, value]) == with_new
    assert _parsed(path, [*base, f"{old}={value}"]) == with_new
    (name,) = [p.name for p in _command(path).params if new in p.opts]
    assert with_new[1][name] is ParameterSource.COMMANDLINE and with_new[0][name] not in (None, ())
    assert f"note: tools {path} {old} is now {new} (the old name still works)" in \
        capsys.readouterr().err


def test_a_value_that_looks_like_an_old_name_is_left_as_it_is():
    params, _ = _parsed("loadtest", ["--scenario", "--users", "--output", "--report-dir"])
    assert params["scenarios"] == ("--users",) and params["output"] == Path("--report-dir")
    assert params["concurrency"] is None


def test_old_spellings_are_hidden_from_help():
    for path, command in commands():
        shown = {opt for opts, _ in visible_options(path, command)
                 for opt in opts.split(" ")[0].split("/")}
        assert not shown & set(renamed_options(command)), path
        result = CliRunner().invoke(cli, [*path.split(), "--help"], terminal_width=200)
        for old in renamed_options(command):
            assert not any(line.strip().startswith(old + " ") for line in
                           result.output.splitlines()), (path, old)


def test_one_concept_has_one_spelling_in_every_command():
    seen: dict[str, list[tuple[str, click.Option]]] = {}
    for path, command in commands():
        for param in command.params:
            if isinstance(param, click.Option):
                for opt in param.opts:
                    seen.setdefault(opt, []).append((path, param))
    assert not set(RETIRED) & set(seen), "a retired spelling is an option again"
    for opt in ("--url", "--grpc-url"):
        assert {p for p, _ in seen[opt]} - {"api"} == {"bench", "infer", "loadtest", "tune"}
        assert all(isinstance(o.type, HostPort) for _, o in seen[opt]), opt
    for opt in ("--spec", "--data", "--slo-file", "--output", "--repository"):
        assert len({(o.name, type(o.type)) for _, o in seen[opt]}) == 1, opt
    for path, protocol in seen["--protocol"]:
        choices = list(protocol.type.choices)
        assert choices == [c for c in ("http", "grpc", "both") if c in choices], path
    for path, concurrency in seen["--concurrency"]:
        assert concurrency.name == "concurrency", path


@pytest.mark.parametrize("path", ["bench", "infer x", "loadtest", "tune"])
@pytest.mark.parametrize("opt", ["--url", "--grpc-url"])
def test_every_endpoint_is_host_port_without_a_scheme_exit_2_naming_the_option(path, opt):
    result = CliRunner().invoke(cli, [*path.split(), opt, "http://127.0.0.1:8000"])
    assert result.exit_code == 2, result.output
    last = result.output.strip().splitlines()[-1]
    assert last == (f"Error: {opt} 'http://127.0.0.1:8000': give host:port without the http:// "
                    f"scheme (e.g. 127.0.0.1:8000); --url is the HTTP endpoint, --grpc-url the "
                    f"gRPC one")


def test_an_old_name_that_is_an_option_of_the_command_is_refused_at_definition():
    with pytest.raises(TypeError, match=r"old option names \['--b'\] are options of their own"):
        click.command("x", cls=ToolCommand)(option("--a", old_names=("--b",))(
            click.option("--b")(lambda a, b: None)))
    with pytest.raises(TypeError, match="old names are for options that take a value"):
        option("--flag", is_flag=True, old_names=("--old",))(lambda flag: None)


# --------------------------------------------------------------------------- real runs


def _run(args: list[str]):
    result = CliRunner().invoke(cli, args)
    lines = [line for line in result.output.splitlines() if not line.startswith("note: ")]
    return result.exit_code, lines


def test_build_repo_check_with_output_is_build_repo_check_with_repository(tmp_path):
    new = _run(["build-repo", "--spec", str(SPEC), "--repository", str(tmp_path / "r"),
                "--check"])
    assert new[0] == 1 and any(str(tmp_path / "r") in line for line in new[1])
    assert _run(["build-repo", "--spec", str(SPEC), "--output", str(tmp_path / "r"),
                 "--check"]) == new


def test_tune_with_slo_and_profile_fails_as_with_slo_file_and_slo_profile(tmp_path):
    slo = _file(tmp_path, "slo.yaml", "profiles:\n  cpu:\n    scenarios: {}\n")
    base = ["tune", "--spec", str(SPEC), "--output", str(tmp_path / "out"), "--scenario",
            "minilm_encoder"]
    new = _run([*base, "--slo-file", slo, "--slo-profile", "cpu"])
    assert new[0] == 2 and "profile 'cpu' has no scenario 'minilm_encoder'" in new[1][-1]
    assert _run([*base, "--slo", slo, "--profile", "cpu"]) == new


def test_loadtest_with_users_and_report_dir_fails_as_with_concurrency_and_output(tmp_path):
    base = ["loadtest", "--spec", str(SPEC), "--url", "127.0.0.1:9", "--rate", "2"]
    new = _run([*base, "--concurrency", "2", "--output", str(tmp_path)])
    assert new[0] == 2 and new[1][-1] == ("Error: give --concurrency (closed loop) or --rate "
                                          "(open loop), not both")
    assert _run([*base, "--users", "2", "--report-dir", str(tmp_path)]) == new


@pytest.mark.server
@pytest.mark.timeout(300)
def test_infer_protocol_grpc_with_url_answers_as_with_grpc_url(toy_server):
    base = ["infer", "toy_double", "--input", "INPUT0=[1.5,2.0]", "--protocol", "grpc", "--json"]
    new = CliRunner().invoke(cli, [*base, "--grpc-url", toy_server.grpc_url])
    old = CliRunner().invoke(cli, [*base, "--url", toy_server.grpc_url])
    assert new.exit_code == old.exit_code == 0, (new.output, old.output)
    assert "note: tools infer --protocol grpc --url is now --grpc-url" in old.output
    answers = [json.loads(r.output.strip().splitlines()[-1])["outputs"] for r in (old, new)]
    assert answers[0] == answers[1] == {"OUTPUT0": [[3.0, 4.0]]}
