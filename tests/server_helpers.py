"""Stand-ins for the tritonserver binary, for tests of what the server code adapts to."""

from __future__ import annotations

from pathlib import Path


def fake_tritonserver(tmp_path: Path, options: list[str]) -> Path:
    """A script whose ``--help`` lists ``options``: what ``command()`` adapts to."""
    binary = tmp_path / "fake-bin" / "tritonserver"
    binary.parent.mkdir()
    lines = "\n".join(f"  {o} <string>" for o in options)
    binary.write_text(f"#!/bin/sh\ncat <<'EOF'\nUsage: tritonserver [options]\n{lines}\nEOF\n")
    binary.chmod(0o755)
    return binary
