#!/usr/bin/env bash
# GPU host check (no Docker): MiniLM TensorRT plans fp32/fp16, parity, ORT CUDA vs TensorRT timings.
cd "$(dirname "$0")/.." && exec "${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}" -m tools.gpu_check "$@"
