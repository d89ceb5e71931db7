#!/usr/bin/env bash
# Build the CPU images of docker-compose.cpu.yml where no image registry is reachable, each
# tagged with the hash of its inputs and skipped when that tag exists (the engine's image store
# is the cache), and write build/images/tags.env for compose. Prints size and build time.
#
#   debian-base   Debian root filesystem (docker/debian-rootfs.sh, the host's apt source), imported
#   prometheus    Debian's prometheus package on its own root filesystem, imported
#   front-cpu     Debian's haproxy package (2.6, built with Lua) on its own root filesystem,
#                 imported: the front of docker-compose.cpu.yml and of a pod on the CPU image
#   triton-cpu    docker/triton-cpu.Dockerfile, target serve (no torch)
#   builder-cpu   docker/triton-cpu.Dockerfile, target builder (CPU torch)
#
# pip runs in the base image with the host's pip configuration handed in (index URLs,
# find-links, certificate, constraints as PIP_* variables, and every local path they name
# mounted read-only at the same place), to fill build/images/wheelhouse; the image builds then
# install from that folder alone. TORCH_INDEX_URL is honoured as in scripts/setup.sh.
# Tags hash the resolved locks (docker/requirements-cpu.lock; the builder's also
# docker/requirements-builder-cpu.lock). `--print-tags`: print the tags and build nothing.
set -euo pipefail
source "$(dirname "$0")/compose-lib.sh"
cd "$TF_ROOT"
[ -n "${ENGINE:-}" ] && [ "${TF_ENGINE_READY:-}" = 1 ] || tf_pick_engine

IMAGES="$TF_ROOT/build/images"
WHEELHOUSE="$IMAGES/wheelhouse"
mkdir -p "$IMAGES" "$WHEELHOUSE"
SUITE="${SUITE:-$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")}"
# tini: PID 1 of the pod (reaps orphans, forwards signals); busybox-static: the one binary of the
# model-repository artifact (tools deploy package copies it from the serving image).
BASE_PACKAGES="python3,python3-venv,ca-certificates,tini,busybox-static"
# The Python-backend stub loads libpython3.X.so.1.0 of the image's own Python.
BASE_SETUP='apt-get install -y -q --no-install-recommends "libpython$(python3 -c "import sys; print(\"%d.%d\" % sys.version_info[:2])")" >/dev/null'
PROM_PACKAGES="prometheus,ca-certificates"
# Debian's prometheus keeps its data in /var/lib/prometheus/metrics2, owned by user prometheus.
# /prometheus: the TSDB path compose gives (--storage.tsdb.path), as in the prom/prometheus image.
PROM_SETUP='mkdir -p /var/lib/prometheus/metrics2 /prometheus && chown -R prometheus:prometheus /var/lib/prometheus /prometheus'
# The front runs the haproxy.cfg `tools build-repo` wrote into the repository (compose and the pod
# give the command); docker/front.sh, compose's entry point of it, needs a shell and /proc alone.
FRONT_PACKAGES="haproxy"
FRONT_SETUP=""
# As the official image: a user of its own, SIGUSR1 stops it gracefully (HAProxy stops listening
# and finishes what runs; SIGTERM would drop every connection at once).
FRONT_CHANGES=('USER haproxy' 'STOPSIGNAL SIGUSR1' 'EXPOSE 8000' 'EXPOSE 8001'
  'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
  'CMD ["haproxy", "-W", "-db", "-f", "/etc/haproxy/haproxy.cfg"]')

# Hash of strings and of the contents of files/folders (sorted; caches and results left out).
input_hash() {
  local strings=() paths=()
  for a in "$@"; do if [ -e "$a" ]; then paths+=("$a"); else strings+=("$a"); fi; done
  {
    printf '%s\n' "${strings[@]}"
    find "${paths[@]}" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path 'loadtests/results/*' \
      -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-16
}

timed() {  # timed NAME command... : run, report seconds
  local start=$SECONDS
  "${@:2}"
  BUILT+=("$1 $((SECONDS - start))")
}

rootfs_image() {  # rootfs_image IMAGE PACKAGES SETUP [--change ...]
  local image="$1" packages="$2" setup="$3"; shift 3
  local tar="$IMAGES/${image##*/}.tar"; tar="${tar%%:*}.tar"
  tf_log "building $image: Debian $SUITE root filesystem ($packages)"
  SUITE="$SUITE" timeout 900 bash docker/debian-rootfs.sh "$tar" "$packages" "$setup"
  local changes=()
  for c in "$@"; do changes+=(--change "$c"); done
  tf_engine import -q "${changes[@]}" "$tar" "$image" >/dev/null
  rm -f "$tar"
}

# Inside the base image, pip with the host's configuration downloads what the builds install.
fill_wheelhouse() {
  local host_pip=(python3 -m pip)
  [ -x .venv/bin/python ] && host_pip=(.venv/bin/python -m pip)
  local envs=() mounts=() seen=" " key value token path
  while IFS= read -r line; do
    key="${line%%=*}"; key="${key#*.}"; value="${line#*=}"; value="${value#\'}"; value="${value%\'}"
    case "$key" in cert|client-cert|find-links|index-url|extra-index-url|constraint|trusted-host|default-timeout|retries|proxy) ;; *) continue;; esac
    envs+=(-e "PIP_$(echo "$key" | tr 'a-z-' 'A-Z_')=$value")
    for token in $value; do
      path="${token#file://}"
      case "$path" in /*) ;; *) continue;; esac
      # A local simple index links to files beside it (<root>/simple -> <root>/files).
      [ "$path" = "$token" ] || [ "$(basename "$path")" != simple ] || path="$(dirname "$path")"
      [ -e "$path" ] || continue
      [[ "$seen" == *" $path "* ]] || { mounts+=(-v "$path:$path:ro"); seen+="$path "; }
    done
  done < <("${host_pip[@]}" config list 2>/dev/null)
  local extra=""
  [ -z "${TORCH_INDEX_URL:-}" ] || extra="--extra-index-url $TORCH_INDEX_URL"
  tf_log "downloading wheels into build/images/wheelhouse (pip in $BASE_IMAGE, host pip config: ${#envs[@]} settings, ${#mounts[@]} mounts)"
  timeout 1800 "$ENGINE" run --rm --network host "${envs[@]}" "${mounts[@]}" \
    -v "$TF_ROOT:/src:ro" -v "$WHEELHOUSE:/wheels" "$BASE_IMAGE" sh -euc "
      python3 -m venv /tmp/pip
      /tmp/pip/bin/pip download --quiet --disable-pip-version-check --dest /wheels \
        --require-hashes --no-deps -r /src/docker/requirements-cpu.lock
      /tmp/pip/bin/pip download --quiet --disable-pip-version-check --dest /wheels $extra \
        --require-hashes --no-deps -r /src/docker/requirements-builder-cpu.lock"
}

build_target() {  # build_target TARGET IMAGE
  local ignore=()
  [ "$ENGINE" = podman ] && ignore=(--ignorefile docker/triton-cpu.Dockerfile.dockerignore)
  tf_log "building $2 (docker/triton-cpu.Dockerfile, target $1)"
  timeout 1800 "$ENGINE" build -q "${ignore[@]}" -f docker/triton-cpu.Dockerfile --target "$1" \
    --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$2" . >/dev/null
}

BUILT=()
BASE_IMAGE="triton-forge/debian-base:$(input_hash docker/debian-rootfs.sh "$SUITE" "$BASE_PACKAGES" "$BASE_SETUP")"
PROMETHEUS_IMAGE="triton-forge/prometheus-cpu:$(input_hash docker/debian-rootfs.sh "$SUITE" "$PROM_PACKAGES" "$PROM_SETUP")"
FRONT_CPU_IMAGE="triton-forge/front-cpu:$(input_hash docker/debian-rootfs.sh "$SUITE" "$FRONT_PACKAGES" "$FRONT_SETUP" \
  "${FRONT_CHANGES[*]}")"
# The resolved locks, not only their inputs: a tag names the exact wheels inside.
deps=(pyproject.toml scripts/constraints-cpu.txt docker/requirements-cpu.lock)
builder_deps=(docker/requirements-builder-cpu.lock)
WHEELS_HASH="$(input_hash "$BASE_IMAGE" "${TORCH_INDEX_URL:-}" "${deps[@]}" "${builder_deps[@]}")"
SERVE_HASH="$(input_hash "$BASE_IMAGE" docker/triton-cpu.Dockerfile docker/tritonserver-cpu.sh \
  docker/triton-entrypoint.sh docker/triton_supervisor.py docker/healthcheck.py \
  docker/healthcheck_probes.json docker/verify_repository.py "${deps[@]}" tools)"
TRITON_CPU_IMAGE="triton-forge/triton-cpu:$SERVE_HASH"
BUILDER_CPU_IMAGE="triton-forge/builder-cpu:$(input_hash "$SERVE_HASH" "${builder_deps[@]}" backends loadtests \
  README.md repository.yaml)"
if [ "${1:-}" = --print-tags ]; then  # the tags these inputs give; nothing is built
  printf 'TRITON_CPU_IMAGE=%s\nBUILDER_CPU_IMAGE=%s\nPROMETHEUS_IMAGE=%s\nFRONT_CPU_IMAGE=%s\n' \
    "$TRITON_CPU_IMAGE" "$BUILDER_CPU_IMAGE" "$PROMETHEUS_IMAGE" "$FRONT_CPU_IMAGE"
  exit 0
fi

tf_image_exists "$BASE_IMAGE" || timed "$BASE_IMAGE" rootfs_image "$BASE_IMAGE" "$BASE_PACKAGES" "$BASE_SETUP"
tf_image_exists "$PROMETHEUS_IMAGE" || timed "$PROMETHEUS_IMAGE" rootfs_image "$PROMETHEUS_IMAGE" \
  "$PROM_PACKAGES" "$PROM_SETUP" 'USER prometheus' 'WORKDIR /var/lib/prometheus' 'EXPOSE 9090' \
  'ENTRYPOINT ["/usr/bin/prometheus"]' 'CMD ["--config.file=/etc/prometheus/prometheus.yml"]'
tf_image_exists "$FRONT_CPU_IMAGE" || timed "$FRONT_CPU_IMAGE" rootfs_image "$FRONT_CPU_IMAGE" \
  "$FRONT_PACKAGES" "$FRONT_SETUP" "${FRONT_CHANGES[@]}"
if ! tf_image_exists "$TRITON_CPU_IMAGE" || ! tf_image_exists "$BUILDER_CPU_IMAGE"; then
  if [ "$(cat "$WHEELHOUSE/.inputs" 2>/dev/null)" != "$WHEELS_HASH" ]; then
    timed wheelhouse fill_wheelhouse
    echo "$WHEELS_HASH" >"$WHEELHOUSE/.inputs"
  fi
  tf_image_exists "$TRITON_CPU_IMAGE" || timed "$TRITON_CPU_IMAGE" build_target serve "$TRITON_CPU_IMAGE"
  tf_image_exists "$BUILDER_CPU_IMAGE" || timed "$BUILDER_CPU_IMAGE" build_target builder "$BUILDER_CPU_IMAGE"
fi

cat >"$IMAGES/tags.env" <<ENV
TRITON_CPU_IMAGE=$TRITON_CPU_IMAGE
BUILDER_CPU_IMAGE=$BUILDER_CPU_IMAGE
PROMETHEUS_IMAGE=$PROMETHEUS_IMAGE
FRONT_CPU_IMAGE=$FRONT_CPU_IMAGE
ENV
for line in "${BUILT[@]}"; do tf_log "built ${line% *} in ${line##* } s"; done
for image in "$BASE_IMAGE" "$PROMETHEUS_IMAGE" "$FRONT_CPU_IMAGE" "$TRITON_CPU_IMAGE" "$BUILDER_CPU_IMAGE"; do
  size="$("$ENGINE" image inspect --format '{{.Size}}' "$image")"
  tf_log "image $image: $((size / 1000000)) MB"
done
