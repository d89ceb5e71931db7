#!/usr/bin/env bash
# Set up the environment, check the committed configs and generated docs against the spec, then
# run the test tiers (docs/testing.md): the fast tier first (`-m fast`: no server, no load, no
# torch), stopping at its first failure, then the integration tier (`-m integration`: real
# servers, exports, bounded loads), both on two pytest-xdist workers, each module on one worker;
# the session's builds are made once for every worker and tier (in $FORGE_TEST_SHARED).
# `--system` adds the system tier (`-m system`: the wheel install, the README's whole path, soaks,
# tune budgets, pods, the measurements), on one worker. No test runs twice.
# Other arguments go to every pytest call; arguments that choose tests by marker (`-m`) make it
# one call with them alone. With FORGE_TEST_DURATIONS=FILE, each tier's wall time and every
# test's seconds are appended to FILE (.ci/run prints it). Where this runs as root with apt-get
# (CI), Debian's prometheus package is installed for the promtool and Prometheus tests;
# elsewhere those tests skip and say why.
set -euo pipefail
cd "$(dirname "$0")/.."
system=0
args=()
for arg in "$@"; do
  if [ "$arg" = --system ]; then system=1; else args+=("$arg"); fi
done
bash scripts/setup.sh
if ! command -v promtool >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing Debian's prometheus (promtool) for the rule tests"
  { timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 600 \
      apt-get install -y -qq --no-install-recommends prometheus; } >/dev/null 2>&1 \
    || echo "prometheus could not be installed: the promtool/Prometheus tests will skip"
fi
.venv/bin/tools build-repo --check
.venv/bin/python scripts/generate_docs.py --check
for arg in "${args[@]}"; do
  case "$arg" in
    -m|-m*) exec .venv/bin/python -m pytest "${args[@]}" ;;
  esac
done

shared=$(mktemp -d)
trap 'rm -rf "$shared"' EXIT
export FORGE_TEST_SHARED=$shared
workers=(-n 2 --dist loadfile --no-loadscope-reorder)

# One tier: `tier NAME PYTEST_ARGS...`; sets $code (pytest's exit status) and records the wall
# time. pytest exits 5 when it selected nothing: fine for a tier the arguments did not reach.
ran=0
tier() {
  local name=$1 start=$SECONDS
  shift
  echo "the $name tier: pytest -m $name $*"
  code=0; .venv/bin/python -m pytest -m "$name" "$@" "${args[@]}" || code=$?
  if [ -n "${FORGE_TEST_DURATIONS:-}" ]; then
    echo "tier $name: $((SECONDS - start)) s wall, pytest exit $code" >> "$FORGE_TEST_DURATIONS"
  fi
  [ "$code" = 5 ] || ran=1
}
tier fast -x "${workers[@]}"
[ "$code" = 0 ] || [ "$code" = 5 ] || exit "$code"
tier integration --durations=15 "${workers[@]}"
failed=0
[ "$code" = 0 ] || [ "$code" = 5 ] || failed=$code
if [ "$system" = 1 ]; then
  tier system --durations=15
  [ "$code" = 0 ] || [ "$code" = 5 ] || failed=$code
fi
[ "$failed" = 0 ] || exit "$failed"
[ "$ran" = 1 ] || { echo "no tier selected any test"; exit 5; }
