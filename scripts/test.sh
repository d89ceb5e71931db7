#!/usr/bin/env bash
# Set up the environment, check the committed configs against the spec, run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/tools build-repo --check
exec .venv/bin/python -m pytest "$@"
