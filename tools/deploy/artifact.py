"""The model-repository artifact: a built repository as a content-addressed OCI image.

``package`` checks the repository against its manifest, then builds (Podman or Docker, whichever
runs here) an image ``FROM scratch`` holding only ``/repository`` (the models,
``build_manifest.json`` and the front's ``haproxy.cfg`` and ``front.lua`` that ``tools build-repo``
wrote beside them) and one static ``busybox`` for the init container that copies it into the
pod. The tag is the target and the manifest's sha256 (``cpu-<24 hex>``); the image is referenced
by its digest. The label ``org.triton-forge.packaging`` holds the hash of how it was packaged
(this module's code and the copier image named) and ``org.triton-forge.front.sha256`` that of the
front's two files (not in the manifest): an image with the tag is reused only when both match,
so a change to either rebuilds it even for the same manifest.
The record (``ArtifactRecord``, JSON beside the repository) is what
``tools deploy k8s --artifact`` reads: the reference, the manifest hash the pod's verifier
expects, and each model's weight bytes for sizing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tools.manifest import MANIFEST_NAME, Manifest
from tools.deploy.verify import verify_repository
from tools.errors import ToolkitError, UserInputError
from tools.front import haproxy_config

RECORD_FORMAT = 1
TAG_HEX = 24  # of the manifest's sha256 in the tag; the whole hash is a label and in the record
ARTIFACT_ROOT = "/repository"  # where the image holds the repository
BUSYBOX = "/bin/busybox"  # the copier's one binary (Debian's busybox-static in the serving images)
LABEL_PREFIX = "org.triton-forge"
PACKAGING_LABEL = f"{LABEL_PREFIX}.packaging"
FRONT_LABEL = f"{LABEL_PREFIX}.front.sha256"
# The front's config and Lua, beside the models (the pod's front container runs them)
FRONT_FILES = (haproxy_config.CONFIG_NAME, haproxy_config.LUA_NAME)
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
ENGINE_TIMEOUT_S = 1800


# An image name as the distribution reference grammar has it (docker/distribution reference.go):
# an optional registry host (with port) and slash-separated lowercase path components.
_HOST = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_NAME = re.compile(rf"(?:{_HOST}(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*")


class ArtifactError(ToolkitError):
    """Building or reading the artifact failed (the engine's output is in the message)."""


class ArtifactRecordError(UserInputError):
    """An ``--artifact`` record that is missing, malformed or not pinned by digest."""


@dataclass(frozen=True)
class ArtifactRecord:
    """What ``package`` built, as ``tools deploy k8s --artifact`` reads it.

    Attributes:
        image: The image name (without tag or digest).
        tag: ``<target>-<first 24 hex of the manifest's sha256>``.
        digest: ``sha256:...`` of the image manifest (the registry's, after ``--push``).
        target: The repository's target.
        manifest_sha256: sha256 of ``build_manifest.json``; the pod's verifier checks it.
        weights_bytes: Model -> bytes of the files in its version folder (sizing reads these).
        files: Files in the repository.
        bytes: Their total size.
        engine: ``podman`` or ``docker``.
        pushed: The digest is the registry's (``--push``), not only the local store's.
        reused: An image with this tag was there already (the same manifest): not rebuilt.
    """

    image: str
    tag: str
    digest: str
    target: str
    manifest_sha256: str
    weights_bytes: dict[str, int] = field(default_factory=dict)
    files: int = 0
    bytes: int = 0
    engine: str = ""
    pushed: bool = False
    reused: bool = False
    format: int = RECORD_FORMAT

    @property
    def reference(self) -> str:
        """``image:tag@sha256:...``: readable, and pulled by digest."""
        return f"{self.image}:{self.tag}@{self.digest}"

    def to_text(self) -> str:
        """The record file's JSON."""
        return json.dumps({**asdict(self), "reference": self.reference}, indent=2,
                          sort_keys=True) + "\n"

    @classmethod
    def read(cls, path: Path) -> ArtifactRecord:
        """Read a record file.

        Raises:
            ArtifactRecordError: the file is missing, not a record, or has no digest.
        """
        where = f"--artifact {path}"
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ArtifactRecordError(f"{where}: no such file (tools deploy package writes it)") from None
        except (OSError, ValueError) as exc:
            raise ArtifactRecordError(f"{where}: not a JSON artifact record ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT:
            raise ArtifactRecordError(f"{where}: not a format-{RECORD_FORMAT} artifact record")
        data.pop("reference", None)
        try:
            record = cls(**data)
        except TypeError as exc:
            raise ArtifactRecordError(f"{where}: {exc}") from None
        if not DIGEST.fullmatch(record.digest):
            raise ArtifactRecordError(
                f"{where}: field 'digest' {record.digest!r} is not sha256:<64 hex>; pods pull the "
                "artifact by digest (tools deploy package --push gives the registry's)")
        return record


def artifact_tag(target: str, manifest_sha256: str) -> str:
    """The image tag of a repository: its target and its manifest's hash."""
    return f"{target}-{manifest_sha256[:TAG_HEX]}"


def packaging_key(copier_image: str, code: bytes | None = None) -> str:
    """What shapes the image besides the repository, hashed: the packaging code (``code``,
    default this module's source: layout, staging, Containerfile) and the copier image named."""
    digest = hashlib.sha256(Path(__file__).read_bytes() if code is None else code)
    digest.update(b"\0" + copier_image.encode())
    return digest.hexdigest()[:TAG_HEX]


def front_key(repository: Path) -> str:
    """The hash of the front's files in ``repository`` (names and contents).

    Raises:
        UserInputError: one is missing (a repository built before the front existed).
    """
    missing = [name for name in FRONT_FILES if not (Path(repository) / name).is_file()]
    if missing:
        raise UserInputError(f"{repository}: no {' or '.join(missing)} (the front's config, which "
                             "tools build-repo writes beside the models): rebuild it with tools "
                             "build-repo")
    digest = hashlib.sha256()
    for name in FRONT_FILES:
        digest.update(name.encode() + b"\0" + (Path(repository) / name).read_bytes() + b"\0")
    return digest.hexdigest()


def _image_labels(run: Runner, engine: str, reference: str) -> dict[str, str] | None:
    """The labels of a local image; None when there is no image by that reference."""
    result = run([engine, "image", "inspect", "--format", "{{json .Config.Labels}}", reference])
    if result.returncode != 0:
        return None
    try:
        labels = json.loads(result.stdout.strip() or "null")
    except ValueError:
        return {}
    return labels if isinstance(labels, dict) else {}


def weights_bytes(manifest: Manifest) -> dict[str, int]:
    """Per model, the bytes of what its instances load: files of its version folder but code."""
    out = {}
    for name, entry in manifest.models.items():
        out[name] = sum(int(info.get("bytes", 0)) for relative, info in entry.artifacts.items()
                        if "/" in relative and not relative.endswith(".py"))
    return out


def pick_engine(engine: str | None = None) -> str:
    """``podman`` or ``docker``: the one given, else Docker when its engine answers, else Podman.

    Raises:
        ArtifactError: neither can run here.
    """
    if engine:
        if shutil.which(engine) is None:
            raise ArtifactError(f"--engine {engine}: not installed")
        return engine
    if shutil.which("docker") and subprocess.run(
            ["docker", "info"], capture_output=True, timeout=30).returncode == 0:
        return "docker"
    if shutil.which("podman"):
        return "podman"
    raise ArtifactError("no container engine: Docker's engine does not answer and podman is not "
                        "installed (apt-get install podman runc)")


Runner = Callable[..., subprocess.CompletedProcess]


def _run(command: list[str], timeout: float = ENGINE_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def _checked(run: Runner, command: list[str], what: str) -> str:
    result = run(command)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise ArtifactError(f"{what} failed ({' '.join(command[:3])} ... exit {result.returncode}):\n{tail}")
    return result.stdout


def containerfile(copier_image: str, labels: Mapping[str, str]) -> str:
    """The artifact's Containerfile: busybox from the copier image, the repository, labels."""
    label_lines = "".join(f'LABEL {key}="{value}"\n' for key, value in sorted(labels.items()))
    return (
        "# Written by tools deploy package: a model repository, nothing else but the copier.\n"
        f"FROM {copier_image} AS copier\n"
        "FROM scratch\n"
        f"COPY --from=copier {BUSYBOX} {BUSYBOX}\n"
        f"COPY repository/ {ARTIFACT_ROOT}/\n"
        f"{label_lines}"
        'USER 1000:1000\n'
        f'ENTRYPOINT ["{BUSYBOX}"]\n'
    )


def _stage(repository: Path, manifest: Manifest, into: Path) -> None:
    """Exactly the files the manifest records, the manifest and the front's files, hard-linked
    (or copied).

    A file not readable by everyone (the builder writes the manifest through mkstemp, 0600) is
    copied and made so: the pod reads the artifact as uid 1000, not as the files' owner.
    """
    files = [MANIFEST_NAME, *(f for f in FRONT_FILES if (repository / f).is_file())] + [
        f"{name}/{relative}" for name, entry in manifest.models.items()
        for relative in entry.artifacts]
    for name in manifest.models:  # folders too: an ensemble's version folder is empty
        for folder in (p for p in (repository / name).rglob("*") if p.is_dir()):
            if "__pycache__" not in folder.parts:
                (into / folder.relative_to(repository)).mkdir(parents=True, exist_ok=True)
    for relative in files:
        source, dest = repository / relative, into / relative
        dest.parent.mkdir(parents=True, exist_ok=True)
        mode = source.stat().st_mode
        if mode & 0o444 != 0o444:
            shutil.copyfile(source, dest)
            dest.chmod((mode | 0o444) & 0o7777)
            continue
        try:
            os.link(source, dest)
        except OSError:
            shutil.copy2(source, dest)


def package(
    repository: Path,
    image: str,
    copier_image: str,
    *,
    engine: str | None = None,
    push: bool = False,
    run: Runner = _run,
) -> ArtifactRecord:
    """Build (and optionally push) the artifact of a built repository.

    Args:
        repository: A folder ``tools build-repo`` wrote (with ``build_manifest.json``).
        image: The image name, e.g. ``registry.example/triton-forge/models``.
        copier_image: An image holding a static busybox at ``/bin/busybox`` (the serving
            images do).
        engine: ``podman`` or ``docker``; default: whichever runs here.
        push: Push to ``image``'s registry and record the registry's digest.
        run: Runs an engine command (tests pass a recorder).

    Returns:
        The record (write it with ``to_text``).

    Raises:
        UserInputError: the repository does not match its manifest (each file named).
        ArtifactError: the engine failed.
    """
    repository = Path(repository)
    if ":" in image.rsplit("/", 1)[-1] or "@" in image:
        raise UserInputError(f"--name {image!r}: give the image name without a tag or digest "
                             "(the tag is made from the manifest's hash)")
    if not IMAGE_NAME.fullmatch(image):
        raise UserInputError(f"--name {image!r}: not an image name ([registry[:port]/]path of "
                             "lowercase letters, digits and . _ - separators, e.g. "
                             "registry.example/triton-forge/models); an unexpanded variable?")
    verified = verify_repository(repository)
    if not verified.ok:
        shown = "; ".join(verified.problems[:5])
        more = f" (and {len(verified.problems) - 5} more)" if len(verified.problems) > 5 else ""
        raise UserInputError(f"{repository}: does not match its {MANIFEST_NAME}: {shown}{more}; "
                             "rebuild it with tools build-repo")
    manifest = Manifest.read(repository)
    assert manifest is not None  # verified above
    front = front_key(repository)
    engine = pick_engine(engine)
    tag = artifact_tag(manifest.target, verified.manifest_sha256)
    labels = {
        f"{LABEL_PREFIX}.manifest.sha256": verified.manifest_sha256,
        f"{LABEL_PREFIX}.target": manifest.target,
        PACKAGING_LABEL: packaging_key(copier_image),
        FRONT_LABEL: front,
        "org.opencontainers.image.title": "triton-forge model repository",
    }
    reference = f"{image}:{tag}"
    # The tag is the manifest's hash: an image that has it holds this very repository; it is
    # reused only when it was packaged the same way and holds the same front config too (else
    # rebuilt, and the tag moves).
    found = _image_labels(run, engine, reference)
    exists = found is not None and all(found.get(k) == labels[k] for k in (PACKAGING_LABEL, FRONT_LABEL))
    with tempfile.TemporaryDirectory(prefix="tf-artifact-") as tmp:
        context = Path(tmp)
        if not exists:
            _stage(repository, manifest, context / "repository")
            (context / "Containerfile").write_text(containerfile(copier_image, labels),
                                                   encoding="utf-8")
            build = [engine, "build", "-q", "-f", str(context / "Containerfile"), "-t", reference]
            # Timestamps fixed, so the same repository gives the same layers (and digest) again.
            build += ["--timestamp", "0"] if engine == "podman" else []
            _checked(run, [*build, str(context)], "building the artifact image")
    if push:
        with tempfile.TemporaryDirectory(prefix="tf-digest-") as tmp:
            digest_file = Path(tmp) / "digest"
            if engine == "podman":
                _checked(run, ["podman", "push", "--digestfile", str(digest_file), reference],
                         "pushing the artifact")
                digest = digest_file.read_text(encoding="utf-8").strip()
            else:
                _checked(run, ["docker", "push", reference], "pushing the artifact")
                out = _checked(run, ["docker", "image", "inspect", "--format",
                                     "{{json .RepoDigests}}", reference], "reading the digest")
                digest = next((d.split("@", 1)[1] for d in json.loads(out or "[]")
                               if d.startswith(f"{image}@")), "")
    elif engine == "podman":
        digest = _checked(run, ["podman", "image", "inspect", "--format", "{{.Digest}}", reference],
                          "reading the digest").strip()
    else:
        raise UserInputError("docker keeps no manifest digest for a local image: give --push "
                             "(pods pull the artifact by digest)")
    if not DIGEST.fullmatch(digest):
        raise ArtifactError(f"{engine} gave no sha256 digest for {reference} (got {digest!r})")
    return ArtifactRecord(
        image=image, tag=tag, digest=digest, target=manifest.target,
        manifest_sha256=verified.manifest_sha256, weights_bytes=weights_bytes(manifest),
        files=verified.files, bytes=verified.bytes, engine=engine, pushed=push, reused=exists,
    )


def default_record_path(repository: Path) -> Path:
    """Where ``package`` writes the record by default: beside the repository folder."""
    repository = Path(repository).absolute()
    return repository.with_name(f"{repository.name}.artifact.json")


def describe(record: ArtifactRecord) -> dict[str, Any]:
    """The record's headline figures, for the CLI."""
    return {"reference": record.reference, "files": record.files,
            "megabytes": round(record.bytes / 1e6, 1), "target": record.target}
