"""``tools init DIR``: starter files an editor validates, ready for ``tools add``; a folder that
is not empty is refused. A spec without ``backends`` uses the installed Python backends.

No torch: the ONNX model is written with ``onnx.helper``.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from tests.install_helpers import write_tiny_onnx
from tools import paths
from tools.add.command import add_model
from tools.build_repo.spec import load_spec
from tools.cli import cli
from tools.errors import UserInputError
from tools.slo import load_slo
from tools.spec_schema import REPOSITORY_SCHEMA, SLO_SCHEMA

STARTER = ["repository.yaml", "schemas/repository.schema.json", "schemas/slo.schema.json",
           "slo.yaml"]


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _schema_of(yaml_file: Path) -> Path:
    """The file the ``yaml-language-server`` line points at, resolved as editors do."""
    first = yaml_file.read_text(encoding="utf-8").splitlines()[0]
    prefix = "# yaml-language-server: $schema="
    assert first.startswith(prefix), first
    return yaml_file.parent / first.removeprefix(prefix)


def test_init_writes_a_spec_and_slo_file_that_their_schemas_accept(tmp_path):
    folder = tmp_path / "new" / "project"
    result = CliRunner().invoke(cli, ["init", str(folder)])

    assert result.exit_code == 0, result.output
    assert _files(folder) == STARTER
    assert f"cd {folder} && tools add" in result.output
    for name, schema in (("repository.yaml", REPOSITORY_SCHEMA), ("slo.yaml", SLO_SCHEMA)):
        assert _schema_of(folder / name) == folder / schema
        assert (folder / schema).read_text() == (paths.ROOT / schema).read_text()
        jsonschema.validate(yaml.safe_load((folder / name).read_text()),
                            json.loads((folder / schema).read_text()))
    spec = load_spec(folder / "repository.yaml")
    assert spec.names() == [] and spec.backends == paths.BACKENDS
    with pytest.raises(UserInputError, match=r"profile 'cpu' has no scenario 'mine' \(has: none\)"):
        load_slo(folder / "slo.yaml", "cpu", "mine")


def test_init_refuses_a_folder_that_is_not_empty_naming_what_it_holds(tmp_path):
    for name in ("repository.yaml", "notes.txt", "a", "b", "c", "d"):
        (tmp_path / name).write_text("mine\n")
    result = CliRunner().invoke(cli, ["init", str(tmp_path)])

    assert result.exit_code == 2
    assert (f"{tmp_path} is not empty (has a, b, c, d, notes.txt and 1 more): tools init writes "
            "only into a new or empty folder") in result.output
    assert (tmp_path / "repository.yaml").read_text() == "mine\n"
    assert not (tmp_path / "slo.yaml").exists() and not (tmp_path / "schemas").exists()


def test_init_refuses_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    result = CliRunner().invoke(cli, ["init", str(tmp_path / "file")])
    assert result.exit_code == 2 and "file is a file: tools init writes into a new" in result.output


def test_add_into_an_initialised_folder_appends_and_keeps_the_schema_line(tmp_path):
    CliRunner().invoke(cli, ["init", str(tmp_path / "p")], catch_exceptions=False)
    spec_file = tmp_path / "p" / "repository.yaml"
    add_model("onnx", str(write_tiny_onnx(tmp_path / "tiny.onnx")), "tiny", spec_file)

    text = spec_file.read_text()
    assert text.startswith("# yaml-language-server: $schema=schemas/repository.schema.json\n")
    assert "backends" not in yaml.safe_load(text)
    spec = load_spec(spec_file)
    assert spec.names() == ["tiny"] and spec.backends == paths.BACKENDS
    schema = json.loads((tmp_path / "p" / REPOSITORY_SCHEMA).read_text())
    jsonschema.validate(yaml.safe_load(text), schema)


def test_a_spec_created_by_add_outside_the_checkout_does_not_point_at_it(tmp_path):
    spec_file = tmp_path / "elsewhere" / "repository.yaml"
    spec_file.parent.mkdir()
    add_model("onnx", str(write_tiny_onnx(tmp_path / "tiny.onnx")), "tiny", spec_file)

    assert "backends" not in yaml.safe_load(spec_file.read_text())
    assert str(paths.CHECKOUT) not in spec_file.read_text()
    assert load_spec(spec_file).backends == paths.BACKENDS
