"""The HTTP guard with its native front off: every request served in Python, as before the front
(measurement only: ``scripts/guard_cost.py --compare-http-guard`` runs it beside the guard as
users get it, so the front's gain is read in the same interleaved rounds). The guard's command
line; ``--front python`` added."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.serve.http_guard import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main([*sys.argv[1:], "--front", "python"]))
