#!/bin/sh
# /opt/tritonserver/bin/tritonserver of the CPU image (docker/triton-cpu.Dockerfile): the
# nvidia-pytriton wheel's Triton 2.51, started with the compose file's flags, so docker-compose.yml
# stays the one command line for the NGC image and this one.
# Triton 2.51 has no --http-max-input-size (25.06+): it is dropped here; the front (HAProxy, the
# compose `front` service or the pod's `front` container) bounds request bodies before they reach
# tritonserver.
binary=${TRITONSERVER_CPU_BINARY:-/opt/tritonserver/libexec/tritonserver}
for arg in "$@"; do
    shift
    case "$arg" in
        --http-max-input-size=*) continue ;;
    esac
    set -- "$@" "$arg"
done
exec "$binary" "$@"
