#!/usr/bin/env bash
# Resolve every image's requirements into docker/requirements-*.lock, each file with its sha256
# (pip-compile under each image's Python, with the host's pip configuration): see
# scripts/lock_requirements.py for the locks, their inputs and the Pythons they need.
# After a lock changes, scripts/compose-images.sh rebuilds the images whose tags hash it.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/lock_requirements.py "$@"
