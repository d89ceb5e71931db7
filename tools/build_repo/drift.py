"""`tools build-repo --check`: do the committed config.pbtxt files still match the spec?

Compares parsed ModelConfig messages, not text, and names each drifted or unknown model.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from tools.build_repo import config as cfg
from tools.build_repo.ensemble import render_all
from tools.build_repo.spec import load_spec


def check_repository(spec_path: Path, output: Path, target: str | None = None) -> list[str]:
    """Compare committed ``config.pbtxt`` files with what the spec renders (no export).

    Returns:
        One unified diff (or message) per drifted model; empty when everything matches.
    """
    spec = load_spec(Path(spec_path))
    target = target or spec.target
    spec = spec.for_target(target)
    output = Path(output)
    drift = []
    for name, config in render_all(spec, target).items():
        expected = config.to_message()
        path = output / name / "config.pbtxt"
        if not path.is_file():
            drift.append(f"{path}: missing (the spec renders model {name!r})")
            continue
        committed = cfg.parse_config(path.read_text(), path)
        if committed != expected:
            diff = difflib.unified_diff(
                cfg.render(committed).splitlines(), cfg.render(expected).splitlines(),
                f"{path} (committed)", f"{path} (rendered from {spec.path.name})", lineterm="",
            )
            drift.append("\n".join(diff))
    known = set(spec.names())
    if output.is_dir():
        for path in sorted(output.glob("*/config.pbtxt")):
            if path.parent.name not in known and not path.parent.name.startswith("."):
                drift.append(f"{path}: not in the spec {spec.path}")
    return drift
