#!/usr/bin/env bash
# GPU host check (no Docker), in .venv-gpu: the gpu build as the compose builder runs it (CPU
# torch, TensorRT 10, cuda-python), plan parity fp32/fp16, ONNX Runtime CUDA vs TensorRT timings;
# a table and .cache/gpu-check/gpu-check.json. Exit 0 only when every step ran and passed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
venv=.venv-gpu
[ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet)
extra=()
[ -n "${TORCH_INDEX_URL:-}" ] && extra=(--extra-index-url "$TORCH_INDEX_URL")
"${pip[@]}" --upgrade pip
"${pip[@]}" "${extra[@]}" -c scripts/constraints-cpu.txt -e ".[gpu]"
# onnxruntime (a base dependency) and onnxruntime-gpu side by side can lose the CUDA execution
# provider (microsoft/onnxruntime#26996): keep only the GPU wheel, at the CPU wheel's version.
ort_version="$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("onnxruntime"))' 2>/dev/null || true)"
"$venv/bin/python" -m pip uninstall --quiet -y onnxruntime onnxruntime-gpu >/dev/null 2>&1 || true
"${pip[@]}" "onnxruntime-gpu${ort_version:+==$ort_version}"
exec "$venv/bin/python" -m tools.gpu_check "$@"
