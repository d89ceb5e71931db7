#!/usr/bin/env bash
# Resolve the serving images' requirements into lock files with every file's sha256 (pip-tools'
# pip-compile --generate-hashes, with the host's pip configuration; index URLs are not written
# into the locks), so the images install exactly these files (pip --require-hashes):
#
#   docker/requirements-serve.lock  <- docker/requirements-serve.txt   (triton.Dockerfile, NGC)
#   docker/requirements-cpu.lock    <- docker/requirements-cpu.in      (triton-cpu.Dockerfile)
#
# Both under scripts/constraints-cpu.txt (numpy<2, the measured OpenVINO). Resolved on this
# machine's Python (3.11): the hashes cover every wheel PyPI has of each pinned version, so the
# NGC image's Python 3.12 finds its own, but a requirement with a Python-version marker would be
# resolved for 3.11. scripts/compose-images.sh tags the CPU images by the lock's hash.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.cache/piptools
[ -x "$venv/bin/pip-compile" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q pip-tools; }
compile() {  # compile OUT IN
  (cd docker && timeout 900 "../$venv/bin/pip-compile" --quiet --generate-hashes --allow-unsafe \
    --strip-extras --no-emit-index-url --no-emit-find-links --no-emit-trusted-host \
    -c ../scripts/constraints-cpu.txt -o "$1" "$2")
}
compile requirements-serve.lock requirements-serve.txt
compile requirements-cpu.lock requirements-cpu.in
echo "locked: docker/requirements-serve.lock, docker/requirements-cpu.lock"
