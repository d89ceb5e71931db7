#!/bin/sh
# /opt/tritonserver/bin/tritonserver of the CPU image (docker/triton-cpu.Dockerfile): the
# nvidia-pytriton wheel's Triton 2.51, started with the compose file's flags. 2.51 has no
# --http-max-input-size (25.x+): it is dropped with a note, so docker-compose.yml stays the one
# command line for the NGC image and this one.
binary=/opt/tritonserver/libexec/tritonserver
for arg in "$@"; do
    shift
    case "$arg" in
        --http-max-input-size=*)
            echo "tritonserver-cpu: Triton 2.51 has no ${arg%%=*}; dropped (its HTTP limit stays 64 MiB)" >&2
            continue ;;
    esac
    set -- "$@" "$arg"
done
exec "$binary" "$@"
