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
# HAProxy, the front tools serve puts before tritonserver (docs/serving.md): Debian's package
# where this runs as root with apt-get (CI, containers); elsewhere tools serve says it is missing
# and serves without it.
haproxy_bin="$(command -v haproxy || true)"
[ -n "$haproxy_bin" ] || [ ! -x /usr/sbin/haproxy ] || haproxy_bin=/usr/sbin/haproxy
if [ -z "$haproxy_bin" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing Debian's haproxy (the front of tools serve)"
  { timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 600 \
      apt-get install -y -qq --no-install-recommends haproxy; } >/dev/null 2>&1 \
    || echo "haproxy could not be installed: tools serve will serve without its front"
  haproxy_bin="$(command -v haproxy || true)"
  [ -n "$haproxy_bin" ] || [ ! -x /usr/sbin/haproxy ] || haproxy_bin=/usr/sbin/haproxy
fi
front="no haproxy"
[ -z "$haproxy_bin" ] || front="haproxy $("$haproxy_bin" -v | awk 'NR == 1 { print $3 }')"
echo "environment ready: $(.venv/bin/python --version), $(.venv/bin/tools --version), $front"
