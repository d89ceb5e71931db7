#!/bin/sh
# Entry point of the `triton` service: run the TensorRT guard, then start tritonserver ("$@")
# under the watchdog (docker/triton_supervisor.py), which stops it, and so restarts the
# container, when a model stops answering. TRITON_WATCHDOG=off execs tritonserver directly.
# A plan built with another TensorRT version or for another GPU is refused here with the command
# that rebuilds it, instead of failing inside Triton with "version tag does not match".
set -eu
here="$(dirname "$0")"
repository="${MODEL_REPOSITORY:-/models}"
PYTHONPATH="/opt/triton-forge${PYTHONPATH:+:${PYTHONPATH}}" \
    python3 -m tools.serve.trt_guard --repository "${repository}"
if [ "${TRITON_WATCHDOG:-on}" = "off" ]; then
    exec "$@"
fi
exec python3 "${here}/triton_supervisor.py" --repository "${repository}" \
    --probes "${here}/healthcheck_probes.json" -- "$@"
