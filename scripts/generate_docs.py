"""Regenerate schemas/*.schema.json, the tables of docs/spec.md and of docs/cli.md.

The spec's from the typed models, the command line's from the click commands.

usage: .venv/bin/python scripts/generate_docs.py [--check]
--check writes nothing and exits 1 when a generated file is stale (for CI).
"""

from __future__ import annotations

import argparse
import sys

from tools import cli_doc
from tools.spec_schema import ROOT, generated, stale, write_schemas


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args()
    files = {**generated(ROOT), **cli_doc.generated(ROOT)}
    if args.check:
        old = stale(ROOT, files)
        for path in old:
            print(f"stale: {path.relative_to(ROOT)}")
        return 1 if old else 0
    for path in write_schemas(ROOT, files):
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
