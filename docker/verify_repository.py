"""Verify a copied model repository against its build_manifest.json (the pod's init container).

Exit 0 when every recorded file matches its sha256 and nothing else is there; otherwise print
each problem and exit 1, so the init container fails with the reason in its log. A thin command
line over tools/deploy/verify.py; in the image tools/ sits next to this folder.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # /opt/triton-forge in the image
from tools.deploy.verify import verify_repository  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """``verify_repository.py --repository DIR [--target T] [--manifest-sha256 HEX]``"""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repository", type=Path, required=True)
    parser.add_argument("--target", help="the target the repository must be built for")
    parser.add_argument("--manifest-sha256", help="the manifest's sha256 (or its prefix)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    result = verify_repository(args.repository, target=args.target,
                               expected_manifest_sha256=args.manifest_sha256)
    for problem in result.problems:
        print(f"verify: {problem}", file=sys.stderr)
    if not result.ok:
        print(f"verify: {args.repository} does not match its build manifest "
              f"({len(result.problems)} problem(s)); refusing to serve it", file=sys.stderr)
        return 1
    print(f"verify: {args.repository}: {result.files} files, {result.bytes / 1e6:.1f} MB match "
          f"build_manifest.json (sha256 {result.manifest_sha256[:16]}, target {result.target}) "
          f"in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
