"""What a trial's figure depends on besides its knobs: the parts of the resume key.

A trial is reused only when the load, the target, the spec of the tuned entries (knobs aside),
the baseline's exports and the request data are all the same as when it was measured.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tools.manifest import load_manifest
from tools.tune.spec_patch import PATHS, SECTIONS
from tools.typed_yaml import YamlDocument

HASH_CHARS = 16


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_CHARS]


def _without(entry: Any, path: Sequence[str]) -> None:
    for key in path[:-1]:
        if not isinstance(entry, dict):
            return
        entry = entry.get(key)
    if isinstance(entry, dict):
        entry.pop(path[-1], None)


def spec_hash(spec_text: str, members: Sequence[str]) -> str:
    """A hash of the spec entries of ``members`` (models and the pipeline), the knobs the tuner
    sets left out: the same hash means the same models were tuned."""
    data = YamlDocument(spec_text).data or {}
    entries = {}
    for section in (*SECTIONS, "pipelines"):
        for name, entry in (data.get(section) or {}).items():
            if name not in members:
                continue
            entry = copy.deepcopy(entry)
            for path in PATHS.values():
                _without(entry, path)
            entries[f"{section}.{name}"] = entry
    return _digest({"target": data.get("target"), "backends": data.get("backends"),
                    "entries": entries})


def export_hashes(baseline: Path, members: Sequence[str]) -> dict[str, str]:
    """Per model of the baseline's manifest: a hash of its artifacts' sha256 (the export, the
    Python code and data files), so a rebuilt model does not reuse trials of the old one."""
    manifest = load_manifest(baseline)
    out = {}
    for name in members:
        entry = manifest.models.get(name)
        if entry is not None:
            files = {path: item.get("sha256") for path, item in sorted(entry.artifacts.items())}
            out[name] = _digest({"artifacts": files,
                                 "export": (entry.export or {}).get("fingerprint")})
    return out


def resume_context(plan_context: Mapping[str, Any], where: Mapping[str, Any], scenario: str,
                   data_digest: str, spec_digest: str, exports: Mapping[str, str],
                   cores: int) -> dict[str, Any]:
    """Everything a trial's figure depends on besides its settings (stored with each trial)."""
    return {**plan_context, **where, "scenario": scenario, "data": data_digest[:HASH_CHARS],
            "spec": spec_digest, "exports": dict(exports), "cores": cores}
