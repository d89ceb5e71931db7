"""The model-repository artifact: verification against build_manifest.json, the packaging steps
(with a recorded engine), the record, and the CLI's bad input. The real build with Podman is in
tests/test_deploy_podman.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tools.manifest import Manifest, ModelEntry, artifacts_of
from tools.cli import cli
from tools.deploy import artifact
from tools.deploy.artifact import ArtifactRecord, ArtifactRecordError, package
from tools.deploy.verify import verify_repository
from tools.errors import UserInputError

ROOT = Path(__file__).resolve().parents[1]
VERIFY = ROOT / "docker" / "verify_repository.py"
_PICK_ENGINE = artifact.pick_engine  # before the fixture below replaces it


def make_repository(root: Path, target: str = "cpu") -> Path:
    """A two-model repository with a real manifest (the builder's own artifacts_of) and the
    front's two files beside the models, as tools build-repo writes them."""
    repo = root / "repo"
    files = {"encoder": {"config.pbtxt": "name: 'encoder'", "1/model.onnx": "weights" * 100},
             "tokenizer": {"config.pbtxt": "name: 'tokenizer'", "1/model.py": "print()",
                           "1/tokenizer.json": "{}"},
             "pipeline": {"config.pbtxt": "name: 'pipeline' platform: 'ensemble'"}}
    (repo / "pipeline" / "1").mkdir(parents=True)  # an ensemble's version folder is empty
    manifest = Manifest(spec="spec-hash", target=target)
    for model, contents in files.items():
        for relative, text in contents.items():
            path = repo / model / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        manifest.models[model] = ModelEntry(kind="python", target=target,
                                            artifacts=artifacts_of(repo / model))
    (repo / "build_manifest.json").write_text(manifest.to_text())
    (repo / "haproxy.cfg").write_text("global\n    lua-load front.lua\n")
    (repo / "front.lua").write_text("-- the front's rules\n")
    return repo


def test_a_built_repository_verifies(tmp_path):
    repo = make_repository(tmp_path)
    result = verify_repository(repo, target="cpu")
    assert result.ok and result.files == 6 and result.target == "cpu"


@pytest.mark.parametrize("damage, expected", [
    (lambda r: (r / "encoder/1/model.onnx").write_text("weights" * 99 + "weightz"), r"model.onnx: sha256 [0-9a-f]{64}, the manifest says"),
    (lambda r: (r / "encoder/1/model.onnx").write_text("short"), r"model.onnx: 5 bytes, the manifest says 700"),
    (lambda r: (r / "tokenizer/1/tokenizer.json").unlink(), r"tokenizer.json: missing"),
    (lambda r: (r / "tokenizer/1/extra.py").write_text("x"), r"extra.py: not recorded in the manifest"),
    (lambda r: (r / "stray").mkdir(), r"stray: a folder the manifest does not record"),
    (lambda r: (r / "build_manifest.json").unlink(), r"build_manifest.json: missing"),
    (lambda r: (r / "pipeline" / "1").rmdir(), r"pipeline: no version folder"),
])
def test_every_mismatch_is_named(tmp_path, damage, expected):
    repo = make_repository(tmp_path)
    damage(repo)
    result = verify_repository(repo)
    assert not result.ok
    assert any(__import__("re").search(expected, p) for p in result.problems), result.problems


def test_the_wrong_target_or_manifest_hash_is_refused(tmp_path):
    repo = make_repository(tmp_path)
    assert "built for target 'cpu', not 'gpu'" in verify_repository(repo, target="gpu").problems[0]
    assert "is not the expected 0000" in verify_repository(repo, expected_manifest_sha256="0000").problems[0]
    digest = artifact.verify_repository(repo).manifest_sha256
    assert verify_repository(repo, expected_manifest_sha256=digest[:24]).ok


def test_the_init_containers_command_exits_1_with_the_reason(tmp_path):
    repo = make_repository(tmp_path)
    ok = subprocess.run([sys.executable, str(VERIFY), "--repository", str(repo), "--target", "cpu"],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "6 files" in ok.stdout
    (repo / "encoder/1/model.onnx").write_text("tampered")
    bad = subprocess.run([sys.executable, str(VERIFY), "--repository", str(repo)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    assert "model.onnx: 8 bytes, the manifest says 700" in bad.stderr
    assert "refusing to serve it" in bad.stderr


class Engine:
    """Records engine commands; answers inspect/build/push like podman would.

    ``labels``: the labels of an image already there under the tag (None: no such image).
    """

    def __init__(self, labels: dict[str, str] | None = None) -> None:
        self.commands: list[list[str]] = []
        self.labels = labels
        self.contexts: list[dict[str, str]] = []

    def __call__(self, command, timeout=None):
        self.commands.append(command)
        out, code = "", 0
        if command[1:3] == ["image", "inspect"] and "{{json .Config.Labels}}" in command:
            code = 1 if self.labels is None else 0
            out = json.dumps(self.labels) + "\n"
        elif command[1] == "build":
            context = Path(command[-1])
            self.contexts.append({str(p.relative_to(context)): p.read_text()
                                  for p in context.rglob("*") if p.is_file()})
        elif command[1:3] == ["image", "inspect"]:
            out = "sha256:" + "c" * 64 + "\n"
        elif command[1] == "push":
            Path(command[command.index("--digestfile") + 1]).write_text("sha256:" + "d" * 64)
        return subprocess.CompletedProcess(command, code, out, "")


@pytest.fixture(autouse=True)
def _engine_on_path(monkeypatch):
    """The tests here run ``package`` with the fake ``Engine``: the engine named is taken as
    installed (a fresh machine without podman ran the fast tier into "--engine podman: not
    installed"). ``pick_engine`` itself: the test below."""
    monkeypatch.setattr(artifact, "pick_engine", lambda engine=None: engine or "podman")


def test_an_engine_that_is_not_installed_is_named_and_podman_is_found_without_docker(monkeypatch):
    monkeypatch.setattr(artifact.shutil, "which", lambda name: None)
    with pytest.raises(artifact.ArtifactError, match="--engine podman: not installed"):
        _PICK_ENGINE("podman")
    with pytest.raises(artifact.ArtifactError, match="no container engine"):
        _PICK_ENGINE()
    monkeypatch.setattr(artifact.shutil, "which",
                        lambda name: "/usr/bin/podman" if name == "podman" else None)
    assert _PICK_ENGINE() == "podman" and _PICK_ENGINE("podman") == "podman"


def test_package_stages_exactly_the_manifest_files_and_tags_by_the_manifest_hash(tmp_path):
    repo = make_repository(tmp_path)
    (repo / "tokenizer" / "__pycache__").mkdir()
    (repo / "tokenizer" / "__pycache__" / "model.cpython-311.pyc").write_text("cache")
    engine = Engine()
    record = package(repo, "registry.example/tf/models", "copier:1", engine="podman", run=engine)
    manifest_sha = verify_repository(repo).manifest_sha256
    assert record.tag == f"cpu-{manifest_sha[:24]}" and record.manifest_sha256 == manifest_sha
    assert record.digest == "sha256:" + "c" * 64 and not record.pushed and not record.reused
    assert record.reference == f"registry.example/tf/models:{record.tag}@sha256:{'c' * 64}"
    (context,) = engine.contexts
    staged = sorted(k for k in context if k.startswith("repository/"))
    assert staged == ["repository/build_manifest.json", "repository/encoder/1/model.onnx",
                      "repository/encoder/config.pbtxt", "repository/front.lua",
                      "repository/haproxy.cfg", "repository/pipeline/config.pbtxt",
                      "repository/tokenizer/1/model.py",
                      "repository/tokenizer/1/tokenizer.json", "repository/tokenizer/config.pbtxt"]
    containerfile = context["Containerfile"]
    assert "FROM copier:1 AS copier\nFROM scratch\n" in containerfile
    assert f'LABEL org.triton-forge.manifest.sha256="{manifest_sha}"' in containerfile
    assert f'LABEL {artifact.FRONT_LABEL}="{artifact.front_key(repo)}"' in containerfile
    build = next(c for c in engine.commands if c[1] == "build")
    assert build[build.index("-t") + 1] == f"registry.example/tf/models:{record.tag}"
    assert "--timestamp" in build  # reproducible layers
    assert record.weights_bytes == {"encoder": 700, "tokenizer": 2, "pipeline": 0}  # code is not weights


def test_package_reuses_an_image_with_the_same_tag_and_push_records_the_registrys_digest(tmp_path):
    repo = make_repository(tmp_path)
    engine = Engine(labels={artifact.PACKAGING_LABEL: artifact.packaging_key("copier:1"),
                            artifact.FRONT_LABEL: artifact.front_key(repo)})
    record = package(repo, "registry.example/tf/models", "copier:1", engine="podman", push=True,
                     run=engine)
    assert record.reused and record.pushed and record.digest == "sha256:" + "d" * 64
    assert not any(c[1] == "build" for c in engine.commands)


@pytest.mark.parametrize("labels", [
    {},  # packaged before the label existed
    {artifact.PACKAGING_LABEL: artifact.packaging_key("copier:1", code=b"older packaging code")},
    {artifact.PACKAGING_LABEL: artifact.packaging_key("copier:0")},  # another copier image
    {artifact.PACKAGING_LABEL: artifact.packaging_key("copier:1"),
     artifact.FRONT_LABEL: "an older haproxy.cfg"},  # the same models, another front config
], ids=["no-label", "other-code", "other-copier", "other-front"])
def test_an_image_with_the_tag_but_packaged_otherwise_is_rebuilt_not_reused(tmp_path, labels):
    repo = make_repository(tmp_path)
    engine = Engine(labels=labels)
    record = package(repo, "registry.example/tf/models", "copier:1", engine="podman", run=engine)
    assert not record.reused
    (context,) = engine.contexts
    key = artifact.packaging_key("copier:1")
    assert f'LABEL {artifact.PACKAGING_LABEL}="{key}"' in context["Containerfile"]
    wanted = {artifact.PACKAGING_LABEL: key, artifact.FRONT_LABEL: artifact.front_key(repo)}
    assert {k: labels.get(k) for k in wanted} != wanted  # each case is a mismatch indeed


def test_the_packaging_key_follows_the_packaging_code_and_the_copier():
    source = Path(artifact.__file__).read_bytes()
    key = artifact.packaging_key("copier:1")
    assert key == artifact.packaging_key("copier:1", code=source)  # this module's code by default
    assert key != artifact.packaging_key("copier:1", code=source + b"\n# layout 2\n")
    assert key != artifact.packaging_key("copier:2")
    assert len(key) == artifact.TAG_HEX


@pytest.mark.parametrize("name", ["haproxy.cfg", "front.lua"])
def test_package_refuses_a_repository_without_the_fronts_files_naming_the_file(tmp_path, name):
    repo = make_repository(tmp_path)
    (repo / name).unlink()
    engine = Engine()
    with pytest.raises(UserInputError, match=rf"no {re.escape(name)} \(the front's config.*rebuild it with tools build-repo"):
        package(repo, "tf/models", "copier:1", engine="podman", run=engine)
    assert engine.commands == []


def test_package_refuses_a_repository_that_does_not_match_its_manifest(tmp_path):
    repo = make_repository(tmp_path)
    (repo / "encoder/1/model.onnx").write_text("changed by hand")
    with pytest.raises(UserInputError, match=r"does not match its build_manifest.json: .*model.onnx"):
        package(repo, "tf/models", "copier:1", engine="podman", run=Engine())
    with pytest.raises(UserInputError, match=r"--name 'tf/models:v1': give the image name without a tag"):
        package(make_repository(tmp_path / "b"), "tf/models:v1", "copier:1", engine="podman", run=Engine())


@pytest.mark.parametrize("name", ["$REGISTRY/models", "/models", "tf//models", "tf/Models",
                                  "tf/models-", "registry.example:port/models"])
def test_package_refuses_what_is_not_an_image_name_before_any_engine_call(tmp_path, name):
    engine = Engine()
    with pytest.raises(UserInputError, match=r"--name .*: not an image name"):
        package(make_repository(tmp_path), name, "copier:1", engine="podman", run=engine)
    assert engine.commands == []


@pytest.mark.parametrize("name", ["models", "tf/models", "localhost:5000/tf/models",
                                  "registry.example/triton-forge/my_model__v2"])
def test_image_names_of_the_reference_grammar_are_taken(name):
    assert artifact.IMAGE_NAME.fullmatch(name)


def test_the_record_round_trips_and_a_bad_one_names_the_problem(tmp_path):
    repo = make_repository(tmp_path)
    record = package(repo, "tf/models", "copier:1", engine="podman", run=Engine())
    path = tmp_path / "record.json"
    path.write_text(record.to_text())
    assert ArtifactRecord.read(path) == record
    assert json.loads(path.read_text())["reference"] == record.reference
    path.write_text("[]")
    with pytest.raises(ArtifactRecordError, match="not a format-1 artifact record"):
        ArtifactRecord.read(path)
    with pytest.raises(ArtifactRecordError, match="no such file"):
        ArtifactRecord.read(tmp_path / "nowhere.json")


def test_the_cli_refuses_a_folder_that_is_not_a_built_repository(tmp_path):
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(cli, ["deploy", "package", "--repository", str(tmp_path / "empty"),
                                      "--name", "tf/models", "--copier-image", "copier:1",
                                      "--engine", "podman"])
    assert result.exit_code == 2, result.output
    assert "build_manifest.json: missing (not a built repository)" in result.output


def test_a_file_only_its_owner_may_read_is_staged_readable_for_the_pods_user(tmp_path):
    repo = make_repository(tmp_path)
    (repo / "build_manifest.json").chmod(0o600)  # as the builder's mkstemp leaves it
    engine = Engine()
    package(repo, "tf/models", "copier:1", engine="podman", run=engine)
    build = next(c for c in engine.commands if c[1] == "build")
    assert build  # staged copies are gone with the context; the mode is checked by staging again
    staged = tmp_path / "staged"
    artifact._stage(repo, Manifest.read(repo), staged)
    assert (staged / "build_manifest.json").stat().st_mode & 0o444 == 0o444
    assert (staged / "pipeline" / "1").is_dir()  # the empty version folder is kept
    assert (repo / "build_manifest.json").stat().st_mode & 0o777 == 0o600  # the source untouched


def test_the_manifest_is_written_readable_by_the_serving_user(tmp_path):
    """The builder (root in compose) writes it; triton (uid 1000) reads it: not 0600."""
    import os

    from tools.files import write_atomically

    old = os.umask(0o022)
    try:
        write_atomically(tmp_path / "build_manifest.json", "{}")
    finally:
        os.umask(old)
    assert (tmp_path / "build_manifest.json").stat().st_mode & 0o777 == 0o644
