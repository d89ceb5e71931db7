"""The shipped spec as data, for tests that change one field and parse the result."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]


def project_spec() -> dict:
    """``repository.yaml`` as a dict (a fresh copy each call)."""
    return yaml.safe_load((REPO_ROOT / "repository.yaml").read_text())


def write_spec(tmp_path: Path, data: dict) -> Path:
    """Write ``data`` as ``tmp_path/repository.yaml`` and return the path."""
    path = tmp_path / "repository.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
