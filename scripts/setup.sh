#!/usr/bin/env bash
# Create .venv (or reuse it) and install the project for CPU with its test and load extras.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# TORCH_INDEX_URL (e.g. https://download.pytorch.org/whl/cpu) keeps PyTorch CPU-only on machines
# whose package index would otherwise serve the multi-GB CUDA build of torch.
extra=()
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  extra=(--extra-index-url "$TORCH_INDEX_URL")
fi
# Editable: the CLI finds backends/python/, loadtests/ and repository.yaml in this checkout.
.venv/bin/python -m pip install --quiet "${extra[@]}" -c scripts/constraints-cpu.txt -e ".[test,load]"
echo "environment ready: $(.venv/bin/python --version), $(.venv/bin/tools --version)"
