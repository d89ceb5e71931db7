"""Healthcheck of the `triton` service: every model of the repository ready, every probe answered.

A thin command line over tools/serve/health.py, the one definition of healthy (also run by
`tools serve` and the watchdog); in the image tools/ sits next to this folder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # /opt/triton-forge in the image
from tools.errors import UserInputError  # noqa: E402
from tools.serve import health  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when healthy; otherwise print each problem and exit 1."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--repository", type=Path, default=Path("/models"))
    parser.add_argument("--probes", type=Path, help="JSON: model name -> KServe v2 JSON request")
    parser.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args(argv)
    try:
        probes = health.read_probes(args.probes)
    except UserInputError as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    report = health.check_repository(args.url, args.repository, probes, args.timeout)
    for problem in report.problems:
        print(f"unhealthy: {problem}", file=sys.stderr)
    if report.healthy:
        print(f"healthy: {len(report.models)} models ready")
    return 0 if report.healthy else 1


if __name__ == "__main__":
    sys.exit(main())
