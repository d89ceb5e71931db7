#!/usr/bin/env bash
# Set up the environment, check the committed configs and generated docs against the spec, run
# the test suite. Where this runs as root with apt-get (CI), Debian's prometheus package is
# installed for the promtool and Prometheus tests; elsewhere those tests skip and say why.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if ! command -v promtool >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing Debian's prometheus (promtool) for the rule tests"
  { timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 600 \
      apt-get install -y -qq --no-install-recommends prometheus; } >/dev/null 2>&1 \
    || echo "prometheus could not be installed: the promtool/Prometheus tests will skip"
fi
.venv/bin/tools build-repo --check
.venv/bin/python scripts/generate_docs.py --check
exec .venv/bin/python -m pytest "$@"
