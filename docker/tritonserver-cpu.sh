#!/bin/sh
# /opt/tritonserver/bin/tritonserver of the CPU image (docker/triton-cpu.Dockerfile): the
# nvidia-pytriton wheel's Triton 2.51, started with the compose file's flags. 2.51 has no
# --http-max-input-size (25.x+), so docker-compose.yml stays the one command line for the NGC
# image and this one: here the flag starts the HTTP guard (tools/serve/http_guard.py, standard
# library only) on the HTTP address and port, with that bound, and tritonserver's own HTTP
# endpoint moves to 127.0.0.1, port + 10000, behind it. No Triton has a gRPC message-size flag:
# with the same flag, where tools/serve/grpc_guard.py (standard library only too) is in the
# image, the gRPC guard bounds gRPC messages to the same size on the gRPC address and port,
# tritonserver's own gRPC moving to 127.0.0.1, port + 10000 (without it gRPC stays unbounded,
# and this says so).
# The HTTP guard serves the common request in its native front (tools/serve/http_front.c), the
# image's copy prebuilt by scripts/compose-images.sh and named by TRITON_FORGE_HTTP_FRONT (the
# image has no compiler); it imports its Python half from $home (PYTHONPATH), and serves in Python
# alone where there is no front.
# The guards watch this pid (tritonserver after the exec below), outlive a SIGTERM until
# tritonserver has drained, and exit with it.
# (both paths can be given for tests/test_serve_http_guard.py, which runs this script on the host)
binary=${TRITONSERVER_CPU_BINARY:-/opt/tritonserver/libexec/tritonserver}
home=${TRITON_FORGE_HOME:-/opt/triton-forge}
guard=$home/tools/serve/http_guard.py
grpc_guard=$home/tools/serve/grpc_guard.py
max_input="" http_port=8000 http_address=0.0.0.0 metrics_address=""
grpc_port=8001 grpc_address=0.0.0.0
for arg in "$@"; do
    shift
    case "$arg" in
        --http-max-input-size=*) max_input="${arg#*=}"; continue ;;
        --http-port=*) http_port="${arg#*=}"; continue ;;
        --http-address=*) http_address="${arg#*=}"; continue ;;
        --metrics-address=*) metrics_address="${arg#*=}"; continue ;;
        --grpc-port=*) grpc_port="${arg#*=}"; continue ;;
        --grpc-address=*) grpc_address="${arg#*=}"; continue ;;
    esac
    set -- "$@" "$arg"
done
if [ -n "$max_input" ]; then
    inner=$((http_port + 10000))
    echo "tritonserver-cpu: Triton 2.51 has no --http-max-input-size; the HTTP guard on" \
         "$http_address:$http_port bounds bodies to $max_input bytes (tritonserver's HTTP on 127.0.0.1:$inner)" >&2
    PYTHONPATH="$home${PYTHONPATH:+:$PYTHONPATH}" python3 "$guard" --listen-address "$http_address" \
        --listen-port "$http_port" --upstream-port "$inner" --max-body-bytes "$max_input" \
        --max-buffered-bytes $((4 * max_input)) --watch-pid $$ &
    # the metrics port follows --http-address unless given: keep it where it was
    set -- "$@" --http-address=127.0.0.1 --http-port="$inner" \
        --metrics-address="${metrics_address:-$http_address}"
    if [ -f "$grpc_guard" ]; then
        grpc_inner=$((grpc_port + 10000))
        echo "tritonserver-cpu: the gRPC guard on $grpc_address:$grpc_port bounds messages to" \
             "$max_input bytes (tritonserver's gRPC on 127.0.0.1:$grpc_inner)" >&2
        python3 "$grpc_guard" --listen-address "$grpc_address" --listen-port "$grpc_port" \
            --upstream-port "$grpc_inner" --max-message-bytes "$max_input" --watch-pid $$ &
        set -- "$@" --grpc-address=127.0.0.1 --grpc-port="$grpc_inner"
    else
        echo "tritonserver-cpu: no $grpc_guard in this image: gRPC messages are not bounded" >&2
        set -- "$@" --grpc-address="$grpc_address" --grpc-port="$grpc_port"
    fi
else
    set -- "$@" --http-address="$http_address" --http-port="$http_port" \
        ${metrics_address:+--metrics-address="$metrics_address"} \
        --grpc-address="$grpc_address" --grpc-port="$grpc_port"
fi
exec "$binary" "$@"
