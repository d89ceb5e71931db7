#!/usr/bin/env bash
# The main job on the embedded default, on a fresh machine: set up .venv, build the repository,
# serve it with a real tritonserver on 127.0.0.1, answer real inferences over HTTP and gRPC,
# run a short load check with its exact-P99 table, and stop the server.
set -euo pipefail
cd "$(dirname "$0")/.."

HTTP_PORT="${QUICKSTART_HTTP_PORT:-8000}"
GRPC_PORT="${QUICKSTART_GRPC_PORT:-8001}"
METRICS_PORT="${QUICKSTART_METRICS_PORT:-8002}"
LOAD_SECONDS="${QUICKSTART_LOAD_SECONDS:-10}"
PID_FILE=".cache/quickstart/tritonserver.pid"
CHELSEA="tests/data/images/chelsea_small.jpg"
COFFEE="tests/data/images/coffee_exif_rotated.jpg"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1/5 environment"
bash scripts/setup.sh
TOOLS=.venv/bin/tools

step "2/5 tools build-repo (export, parity, configs)"
$TOOLS build-repo

step "3/5 tools serve (embedded tritonserver on 127.0.0.1)"
mkdir -p "$(dirname "$PID_FILE")"
stop_server() { $TOOLS serve --stop --pid-file "$PID_FILE" >/dev/null 2>&1 || true; }
trap stop_server EXIT
$TOOLS serve --background --pid-file "$PID_FILE" \
  --http-port "$HTTP_PORT" --grpc-port "$GRPC_PORT" --metrics-port "$METRICS_PORT"

step "4/5 real inferences over HTTP and gRPC"
endpoints=(--url "127.0.0.1:$HTTP_PORT" --grpc-url "127.0.0.1:$GRPC_PORT")
for protocol in http grpc; do
  $TOOLS infer text_embedding --protocol "$protocol" "${endpoints[@]}" \
    --text "Triton serves this sentence as a 384-dimensional unit vector." \
    --text "Une phrase en français, pour changer."
  $TOOLS infer image_classification --protocol "$protocol" "${endpoints[@]}" \
    --image "$CHELSEA" --image "$COFFEE"
done
# the same text through the OpenVINO variants, int8 and bf16 (which one suits which CPU: docs/pipelines.md)
for variant in text_embedding_int8 text_embedding_bf16; do
  $TOOLS infer "$variant" --protocol grpc --grpc-url "127.0.0.1:$GRPC_PORT" \
    --text "Triton serves this sentence as a 384-dimensional unit vector."
done

step "5/5 short load check (Locust, exact-P99 gate, CPU SLO profile)"
gate=0
$TOOLS loadtest --url "127.0.0.1:$HTTP_PORT" --grpc-url "127.0.0.1:$GRPC_PORT" \
  --duration "$LOAD_SECONDS" --warmup 3 --output .cache/quickstart/loadtest-report || gate=$?

if [ "$gate" -ne 0 ]; then
  step "done, but the load check missed a CPU SLO (lines 'SLO FAIL' above; a busy machine can do that)"
  exit "$gate"
fi
step "done: every inference answered and every SLO held; the server is stopped ('tools serve' keeps one up)"
