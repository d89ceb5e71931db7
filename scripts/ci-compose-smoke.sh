#!/usr/bin/env bash
# CI step: run scripts/compose-smoke.sh (images, stack, probes, SLO gate, down) when a container
# engine is there or installs (Debian's podman, runc, mmdebstrap, and podman-compose from PyPI);
# otherwise say why it was skipped and succeed. A smoke that runs and fails fails CI.
set -euo pipefail
cd "$(dirname "$0")/.."
skip() { echo "compose smoke SKIPPED: $*"; exit 0; }

if ! { command -v docker >/dev/null && timeout 15 docker info >/dev/null 2>&1; }; then
  # catatonit: podman's pause image (kube play) and `init: true`; promtool: the rule tests.
  if ! command -v podman >/dev/null || ! command -v mmdebstrap >/dev/null || ! command -v catatonit >/dev/null; then
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
      || skip "no Docker engine, and podman cannot be installed here (needs root and apt-get)"
    echo "installing podman, runc, catatonit, mmdebstrap (Debian packages)"
    timeout 300 apt-get update -qq >/dev/null 2>&1 || skip "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq podman runc catatonit mmdebstrap >/dev/null 2>&1 \
      || skip "apt-get install podman runc catatonit mmdebstrap failed"
  fi
  if ! command -v podman-compose >/dev/null && [ ! -x .cache/compose-venv/bin/podman-compose ]; then
    python3 -m venv .cache/compose-venv && timeout 300 .cache/compose-venv/bin/pip install -q podman-compose==1.6.0 \
      || skip "pip install podman-compose failed"
  fi
fi
TRITON_ADMIN_KEY="$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
export TRITON_ADMIN_KEY
# 10 s measured per load run (the cpu targets hold; a full 30 s run adds ~1.5 min).
export LOAD_DURATION="${LOAD_DURATION:-10}"
exec timeout --kill-after=60 1800 bash scripts/compose-smoke.sh
