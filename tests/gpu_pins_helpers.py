"""An offline resolver over the PyPI metadata recorded in tests/data/gpu_pins/pypi.json.

Enough of pip's rules to judge a pin: the highest matching, unyanked release that has a wheel for
the target Python and machine (or an sdist), then its ``Requires-Dist`` (markers evaluated,
extras followed) recursively. An sdist that is known not to build (the recorded
``nvidia-cuda-runtime-cu13`` stub) makes the requirement unresolvable. scripts/record_gpu_pins.py
refreshes the data; tests/test_gpu_pins.py and the fake ``pip`` of its Dockerfile test use this.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT / "tests" / "data" / "gpu_pins"


def recorded() -> dict:
    """The recorded PyPI metadata."""
    return json.loads((DATA_DIR / "pypi.json").read_text())


def ngc_images() -> dict:
    """The NGC images of docker-compose.yml, as their release notes give them."""
    return json.loads((DATA_DIR / "ngc_images.json").read_text())["images"]


class Unresolvable(Exception):
    """A requirement pip could not install from what PyPI holds; the message says why."""


@dataclass(frozen=True)
class Target:
    """Where a requirement is installed: a CPython version on Linux and a machine."""

    python: str  # "3.12"
    machine: str = "x86_64"

    def environment(self, extra: str = "") -> dict[str, str]:
        env = default_environment()
        env.update(python_version=self.python, python_full_version=f"{self.python}.0",
                   sys_platform="linux", platform_system="Linux", platform_machine=self.machine,
                   os_name="posix", implementation_name="cpython", platform_python_implementation="CPython",
                   extra=extra)
        return env

    def accepts_wheel(self, filename: str) -> bool:
        """A wheel this interpreter and machine can install."""
        _, _, _, tags = parse_wheel_filename(filename)
        interpreter = f"cp{self.python.replace('.', '')}"
        for tag in tags:
            python_ok = tag.interpreter in (interpreter, "py3") or (
                tag.interpreter.startswith("cp3") and tag.abi == "abi3"
                and int(tag.interpreter[3:]) <= int(interpreter[3:]))
            abi_ok = tag.abi in ("none", "abi3", interpreter)
            platform_ok = tag.platform == "any" or (
                tag.platform.startswith("manylinux") and tag.platform.endswith(self.machine))
            if python_ok and abi_ok and platform_ok:
                return True
        return False


class Index:
    """The recorded releases and metadata, answering like an index."""

    def __init__(self, data: dict | None = None) -> None:
        self.data = data if data is not None else recorded()
        self.projects = {canonicalize_name(n): r for n, r in self.data["projects"].items()}
        self.metadata: dict[tuple[str, str], list[str]] = {}
        # projects whose releases were not recorded: what pip picked, with the file it took
        self.picked: dict[str, set[tuple[str, str]]] = {}
        for resolution in [*(b["install"] for b in self.data["builder"].values()),
                           self.data["gpu_check"]["install"]]:
            for item in resolution:
                if "name" in item:
                    name = canonicalize_name(item["name"])
                    self.metadata[(name, item["version"])] = item["requires_dist"]
                    self.picked.setdefault(name, set()).add((item["version"], item["file"]))
        for name, releases in self.projects.items():
            for version, release in releases.items():
                if release.get("requires_dist") is not None:
                    self.metadata.setdefault((name, version), release["requires_dist"])
        stub = self.data["stub_build"]
        self.broken = {}
        if stub["exit_code"] != 0:
            req = Requirement(stub["requirement"])
            self.broken[(canonicalize_name(req.name), str(next(iter(req.specifier)).version))] = (
                f"`{stub['command']}` fails: {' / '.join(stub['output_tail'][3:5])}")

    def candidates(self, name: str, target: Target) -> list[tuple[Version, str, str]]:
        """``(version, kind, file)`` of every unyanked release of ``name`` installable on ``target``."""
        name = canonicalize_name(name)
        if name not in self.projects:
            return sorted(((Version(v), "wheel" if f.endswith(".whl") else "sdist", f)
                           for v, f in self.picked.get(name, ())
                           if not f.endswith(".whl") or target.accepts_wheel(f)), reverse=True)
        out = []
        for version, release in self.projects[name].items():
            files = [f for f in release["files"] if not f["yanked"]]
            wheel = next((f["filename"] for f in files if f["filename"].endswith(".whl")
                          and target.accepts_wheel(f["filename"])), None)
            sdist = next((f["filename"] for f in files if not f["filename"].endswith(".whl")), None)
            if wheel or sdist:
                out.append((Version(version), "wheel" if wheel else "sdist", wheel or sdist))
        return sorted(out, reverse=True)

    def best(self, requirement: str | Requirement, target: Target) -> tuple[str, str, str]:
        """``(name, version, file)`` pip would pick for ``requirement`` (wheels before sdists)."""
        req = Requirement(str(requirement))
        name = canonicalize_name(req.name)
        if name not in self.projects and name not in self.picked:
            raise Unresolvable(f"{req}: nothing of {name} was recorded")
        for version, _, file in self.candidates(name, target):
            if req.specifier.contains(version, prereleases=False):
                return name, str(version), file
        raise Unresolvable(f"{req}: no recorded release of {name} matches and installs with "
                           f"Python {target.python} on {target.machine}")

    def requires(self, name: str, version: str, extras: set[str], target: Target) -> list[Requirement]:
        """The requirements of one release for ``target`` and ``extras``.

        Raises:
            Unresolvable: the release is a known-broken sdist, or no metadata was recorded.
        """
        key = (canonicalize_name(name), version)
        if key in self.broken:
            raise Unresolvable(f"{name} {version} does not install: {self.broken[key]}")
        if key not in self.metadata:
            raise Unresolvable(f"{name} {version}: no metadata recorded (run scripts/record_gpu_pins.py)")
        out = []
        for line in self.metadata[key]:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate(target.environment(e)) for e in {"", *extras}):
                out.append(req)
        return out

    def resolve(self, requirements: list[str], target: Target, pinned: dict[str, str] | None = None,
                skip: set[str] = frozenset()) -> dict[str, str]:
        """Every distribution ``requirements`` install: ``{name: version}``.

        Args:
            pinned: versions that must be used where a requirement names the project (a lock).
            skip: projects installed from elsewhere (torch), not followed.

        Raises:
            Unresolvable: with the chain of requirements that led to the failure.
        """
        chosen: dict[str, str] = {}
        todo = [(Requirement(r), (str(r),)) for r in requirements]
        while todo:
            req, chain = todo.pop(0)
            name = canonicalize_name(req.name)
            if name in skip:
                continue
            if name in chosen:
                if not req.specifier.contains(Version(chosen[name]), prereleases=True):
                    raise Unresolvable(f"{' -> '.join(chain)}: {name} {chosen[name]} is already chosen")
                version = chosen[name]
            elif pinned is not None:
                if name not in pinned:
                    raise Unresolvable(f"{' -> '.join(chain)}: {name} is not pinned")
                version = pinned[name]
                if not req.specifier.contains(Version(version), prereleases=True):
                    raise Unresolvable(f"{' -> '.join(chain)}: the pin {name}=={version} does not satisfy it")
            else:
                _, version, _ = self.best(req, target)
            chosen[name] = version
            try:
                deps = self.requires(name, version, set(req.extras), target)
            except Unresolvable as exc:
                raise Unresolvable(f"{' -> '.join(chain)}: {exc}") from None
            todo += [(d, (*chain, f"{name} {version} requires {d}")) for d in deps]
        return chosen


def read_lock(path: Path) -> tuple[dict[str, str], dict[str, set[str]]]:
    """``({name: version}, {name: extras})`` of a lock of ``name[extras]==version`` lines."""
    versions, extras = {}, {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        (spec,) = req.specifier
        if spec.operator != "==":
            raise ValueError(f"{path}: {line!r} is not pinned with ==")
        versions[canonicalize_name(req.name)] = spec.version
        extras[canonicalize_name(req.name)] = set(req.extras)
    return versions, extras
