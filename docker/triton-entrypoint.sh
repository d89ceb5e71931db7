#!/bin/sh
# Entry point of the `triton` service: run the TensorRT guard, then start tritonserver ("$@")
# under the watchdog (docker/triton_supervisor.py), which reloads a model whose Python stub died
# and stops the server, and so restarts the container, when models stop answering.
# TRITON_WATCHDOG=recover only reloads (Kubernetes), =off execs tritonserver directly.
# A plan built with another TensorRT version or for another GPU is refused here with the command
# that rebuilds it, instead of failing inside Triton with "unable to create TensorRT engine"
# (TensorRT's "expecting library version X got Y" or "Version tag does not match").
set -eu
# NGC images start containers through /opt/nvidia/nvidia_entrypoint.sh, which wires CUDA forward
# compatibility (older drivers) and prints the image's banner; replacing the entrypoint loses it.
# Re-run this script through it once, where it exists (not in the CPU image).
nv_entrypoint="${NVIDIA_ENTRYPOINT:-/opt/nvidia/nvidia_entrypoint.sh}"
if [ -z "${TRITON_FORGE_VIA_NV_ENTRYPOINT:-}" ] && [ -x "${nv_entrypoint}" ]; then
    export TRITON_FORGE_VIA_NV_ENTRYPOINT=1
    exec "${nv_entrypoint}" /bin/sh "$0" "$@"
fi
here="$(dirname "$0")"
repository="${MODEL_REPOSITORY:-/models}"
PYTHONPATH="/opt/triton-forge${PYTHONPATH:+:${PYTHONPATH}}" \
    python3 -m tools.serve.trt_guard --repository "${repository}"
case "${TRITON_WATCHDOG:-on}" in
    off) exec "$@" ;;
    # Kubernetes: reload a model whose stub died; the kubelet's probes restart the container.
    recover) watchdog="--no-restart" ;;
    on) watchdog="" ;;
    *) echo "TRITON_WATCHDOG must be on, recover or off, got '${TRITON_WATCHDOG}'" >&2; exit 2 ;;
esac
# The retry of a model past its restart budget: TRITON_RETRY_BACKOFF (first delay, s) and
# TRITON_RETRY_BACKOFF_MAX (longest, s), passed only when set (compose and the pod set them).
retry=""
[ -z "${TRITON_RETRY_BACKOFF:-}" ] || retry="--retry-backoff ${TRITON_RETRY_BACKOFF}"
[ -z "${TRITON_RETRY_BACKOFF_MAX:-}" ] || retry="${retry} --retry-backoff-max ${TRITON_RETRY_BACKOFF_MAX}"
if [ -n "$retry" ] && ! grep -q -- '"--retry-backoff"' "${here}/triton_supervisor.py"; then
    echo "triton-entrypoint: TRITON_RETRY_BACKOFF* set, but this supervisor has no --retry-backoff: ignored" >&2
    retry=""
fi
# shellcheck disable=SC2086  # $watchdog and $retry are flags or nothing
exec python3 "${here}/triton_supervisor.py" --repository "${repository}" \
    --probes "${here}/healthcheck_probes.json" --recover-models ${watchdog} ${retry} -- "$@"
