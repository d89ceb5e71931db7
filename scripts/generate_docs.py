"""Regenerate schemas/*.schema.json and the field tables of docs/spec.md from the typed models.

usage: .venv/bin/python scripts/generate_docs.py [--check]
--check writes nothing and exits 1 when a generated file is stale (for CI).
"""

from __future__ import annotations

import argparse
import sys

from tools.spec_schema import ROOT, stale, write_schemas


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args()
    if args.check:
        files = stale()
        for path in files:
            print(f"stale: {path.relative_to(ROOT)}")
        return 1 if files else 0
    for path in write_schemas():
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
