#!/usr/bin/env bash
# One command for a bare GPU host (no Docker): scripts/gpu-check.sh [--offline] [OPTIONS]
#
#   1. preflight  the NVIDIA driver against what the pinned CUDA wheels need (standard library)
#   2. offline    with only what is installed, no registry: the device, torch-CUDA fp32/fp16 error
#                 of every exported model, the plan runner on real cudart (--offline stops here)
#   3. .venv-gpu  the pinned GPU wheels of scripts/gpu-requirements.txt (PyPI, and NVIDIA's index
#                 for the TensorRT libraries), after torch from TORCH_INDEX_URL (default: PyTorch's
#                 CPU index, never the multi-GB CUDA build unless asked); then `pip check`
#   4. full       the gpu build as the compose builder runs it, TensorRT fp32/fp16 and ONNX Runtime
#                 CUDA parity against PyTorch, timings at batch 1/8/32 (CUDA events)
#
# Every section writes its part of .cache/gpu-check/gpu-check.json. Exit 0 only when every
# section that ran passed; OPTIONS go to `python -m tools.gpu_check` (see its --help).
# PYTHON (default python3) runs sections 1-2 and makes .venv-gpu; it needs Python >= 3.11.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_INDEX_URL="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
NVIDIA_INDEX_URL="${NVIDIA_INDEX_URL:-https://pypi.nvidia.com}"
report="${GPU_CHECK_REPORT:-.cache/gpu-check/gpu-check.json}"
venv=.venv-gpu
offline=0
args=()
for arg in "$@"; do
  if [ "$arg" = --offline ]; then offline=1; else args+=("$arg"); fi
done
check() { "$1" -m tools.gpu_check "$2" --json "$report" "${args[@]}"; }
say() { echo "gpu-check: $*"; }

check "$PYTHON" preflight || exit $?

check "$PYTHON" offline
offline_code=$?
if [ "$offline" = 1 ]; then exit "$offline_code"; fi
case "$offline_code" in 0|3) ;; *) say "offline section failed (exit $offline_code); going on with the pinned wheels" ;; esac

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  say "$("$PYTHON" --version 2>&1) is too old for the pinned GPU wheels (onnxruntime-gpu 1.31 needs Python >= 3.11); set PYTHON"
  exit 2
fi
[ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv" || exit 1
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
say "installing the pinned GPU wheels into $venv (torch from $TORCH_INDEX_URL)"
"${pip[@]}" install --quiet --upgrade pip \
  && "${pip[@]}" install --quiet --index-url "$TORCH_INDEX_URL" -c scripts/constraints-cpu.txt torch \
  && "${pip[@]}" uninstall --quiet -y onnxruntime >/dev/null 2>&1
# onnxruntime (the project's CPU wheel) beside onnxruntime-gpu can lose the CUDA provider
# (microsoft/onnxruntime#26996): the lock has only the GPU wheel and the project is run from the
# checkout, not installed, so `pip check` judges exactly the pinned set.
"${pip[@]}" install --quiet --extra-index-url "$NVIDIA_INDEX_URL" -c scripts/constraints-cpu.txt \
  -r scripts/gpu-requirements.txt || { say "installing scripts/gpu-requirements.txt failed"; exit 1; }
if ! problems="$("${pip[@]}" check 2>&1)"; then
  say "the pinned GPU wheels do not resolve together (pip check): ${problems//$'\n'/; }"
  exit 1
fi

check "$venv/bin/python" full
full_code=$?
[ "$full_code" = 0 ] || exit "$full_code"
case "$offline_code" in 0|3) exit 0 ;; *) exit "$offline_code" ;; esac
