# Shared by scripts/compose-images.sh and scripts/compose-smoke.sh (source it; bash only).
# Picks the container engine and the compose client, the only things that differ between an
# ordinary host (Docker Engine + Compose v2) and one with Podman (podman-compose):
#   ENGINE=docker|podman   default: docker when its engine answers, else podman when installed
#   PODMAN_COMPOSE=PATH    default: podman-compose on PATH, else .cache/compose-venv/bin/...
# Every engine call is bounded by a timeout (TF_ENGINE_TIMEOUT seconds, default 120).

TF_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TF_PROJECT=triton-forge
TF_STATE="$TF_ROOT/build/compose-smoke"
TF_ENGINE_TIMEOUT="${TF_ENGINE_TIMEOUT:-120}"

tf_die() { echo "compose-smoke: error: $*" >&2; exit 1; }
tf_log() { echo "compose-smoke: $*" >&2; }

# Set ENGINE, or explain in one line why no engine can run containers here (exit 1).
tf_pick_engine() {
  if [ -n "${ENGINE:-}" ]; then
    case "$ENGINE" in docker|podman) ;; *) tf_die "ENGINE=$ENGINE: use docker or podman";; esac
    command -v "$ENGINE" >/dev/null || tf_die "ENGINE=$ENGINE but '$ENGINE' is not installed"
  elif command -v docker >/dev/null && timeout 15 docker info >/dev/null 2>&1; then
    ENGINE=docker
  elif command -v podman >/dev/null; then
    ENGINE=podman
  else
    tf_die "no container engine: Docker's engine does not answer ('docker info') and podman is not installed (apt-get install podman runc)"
  fi
  if [ "$ENGINE" = docker ] && ! timeout 15 docker info >/dev/null 2>&1; then
    tf_die "the Docker engine does not answer ('docker info' failed): start dockerd or use ENGINE=podman"
  fi
  if [ "$ENGINE" = podman ]; then
    tf_podman_conf
    timeout 30 podman info >/dev/null 2>&1 || tf_die "podman cannot run here ('podman info' failed)"
  fi
  export ENGINE
}

# Podman as root without systemd: runc, the cgroupfs manager, no default ulimits (a sandbox
# without CAP_SYS_RESOURCE cannot raise RLIMIT_NOFILE/NPROC to Podman's defaults), file events.
# A CONTAINERS_CONF given by the caller wins.
tf_podman_conf() {
  [ -z "${CONTAINERS_CONF:-}" ] || return 0
  mkdir -p "$TF_STATE"
  local runtime=""
  command -v runc >/dev/null && runtime='runtime = "runc"'
  cat >"$TF_STATE/containers.conf" <<CONF
[containers]
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
$runtime
CONF
  export CONTAINERS_CONF="$TF_STATE/containers.conf"
}

tf_engine() { timeout "$TF_ENGINE_TIMEOUT" "$ENGINE" "$@"; }

tf_image_exists() { "$ENGINE" image inspect "$1" >/dev/null 2>&1; }

# The compose client with the CPU override, as an array in TF_COMPOSE.
tf_pick_compose() {
  local files=(-f "$TF_ROOT/docker-compose.yml" -f "$TF_ROOT/docker-compose.cpu.yml")
  if [ "$ENGINE" = docker ]; then
    docker compose version >/dev/null 2>&1 || tf_die "Docker Compose v2 is missing ('docker compose version' failed)"
    TF_COMPOSE=(docker compose -p "$TF_PROJECT" "${files[@]}")
  else
    local pc="${PODMAN_COMPOSE:-}"
    [ -n "$pc" ] || pc="$(command -v podman-compose || true)"
    [ -n "$pc" ] || [ ! -x "$TF_ROOT/.cache/compose-venv/bin/podman-compose" ] || pc="$TF_ROOT/.cache/compose-venv/bin/podman-compose"
    [ -n "$pc" ] || tf_die "podman-compose is missing: python3 -m venv .cache/compose-venv && .cache/compose-venv/bin/pip install podman-compose==1.6.0"
    TF_COMPOSE=("$pc" -p "$TF_PROJECT" "${files[@]}")
  fi
}

tf_compose() { timeout "$TF_ENGINE_TIMEOUT" "${TF_COMPOSE[@]}" "$@"; }

# Container ids of one service of the project (both compose clients set these labels).
tf_service_ids() {
  "$ENGINE" ps -aq --filter "label=com.docker.compose.project=$TF_PROJECT" \
    --filter "label=com.docker.compose.service=$1"
}

# Whether a container's log holds PATTERN. The log is read whole first: `logs | grep -q` under
# pipefail fails with SIGPIPE (141) when grep stops at an early match of a long log.
tf_log_has() {
  local text
  text="$(tf_engine logs "$1" 2>&1 || true)"
  grep -q -- "$2" <<<"$text"
}
