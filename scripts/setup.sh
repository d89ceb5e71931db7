#!/usr/bin/env bash
# Create .venv (or reuse it) and install the project for CPU with its test and load extras.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -c scripts/constraints-cpu.txt -e ".[test,load]"
echo "environment ready: $(.venv/bin/python --version), $(.venv/bin/tools --version)"
