#!/usr/bin/env bash
# Set up the environment, check the committed configs and generated docs against the spec, run
# the test suite: the fast tier first (`-m fast`: no server, no load, no torch; docs/testing.md),
# stopping at its first failure, then everything else (`-m "not fast"`), so no test runs twice.
# Arguments go to both pytest calls; arguments that choose tests by marker (`-m`) make it one
# call with them alone. Where this runs as root with apt-get (CI), Debian's prometheus package is
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
for arg in "$@"; do
  case "$arg" in
    -m|-m*) exec .venv/bin/python -m pytest "$@" ;;
  esac
done
# pytest exits 5 when it selected nothing: fine for one tier (the arguments chose tests of the
# other), not for both
echo "fast tier: pytest -m fast -x"
fast=0; .venv/bin/python -m pytest -m fast -x "$@" || fast=$?
[ "$fast" = 0 ] || [ "$fast" = 5 ] || exit "$fast"
echo "the rest: pytest -m 'not fast'"
rest=0; .venv/bin/python -m pytest -m "not fast" --durations=15 "$@" || rest=$?
if [ "$rest" = 5 ] && [ "$fast" = 0 ]; then exit 0; fi
exit "$rest"
