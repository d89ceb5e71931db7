#!/usr/bin/env bash
# Run docker-compose.yml for real on this host, on the CPU images (docker-compose.cpu.yml).
#
#   scripts/compose-smoke.sh up     build missing images, run the builder, start triton, the front,
#                                   the OpenAI/TEI gateway (api) and prometheus on 127.0.0.1
#                                   (8000/8001 the front, 8002/8003, 9090), wait until healthy,
#                                   print the endpoints, leave it running
#   scripts/compose-smoke.sh down   remove every container, volume and network of the project
#   scripts/compose-smoke.sh        up, probe (HTTP + gRPC inference through the front, its body
#                                   bound, Prometheus scrape), the OpenAI and TEI routes through
#                                   the front (and again after the gateway restarted), a killed
#                                   stub, the Locust SLO gate (cpu profile), an admission refusal
#                                   under a burst, down - whatever fails
#
# Needs TRITON_ADMIN_KEY, the project's .venv (scripts/setup.sh) for the host-side probes, and
# Docker Engine + Compose v2 or Podman + podman-compose (scripts/compose-lib.sh picks; ENGINE=
# forces one). Every wait is bounded: HEALTH_TIMEOUT (s, default 600), BUILD_REPO_TIMEOUT (900),
# LOAD_TIMEOUT (900). SKIP_BUILD_REPO=1 serves the repository an earlier builder run left in
# build/model_repositories/cpu. LOAD_DURATION=S shortens each measured load run; BURST_CLIENTS
# (96) and BURST_SECONDS (10) size the burst that must draw an admission refusal.
set -euo pipefail
source "$(dirname "$0")/compose-lib.sh"
cd "$TF_ROOT"

HEALTH_TIMEOUT="${HEALTH_TIMEOUT:-600}"
BUILD_REPO_TIMEOUT="${BUILD_REPO_TIMEOUT:-900}"
LOAD_TIMEOUT="${LOAD_TIMEOUT:-900}"
BURST_CLIENTS="${BURST_CLIENTS:-96}"
BURST_SECONDS="${BURST_SECONDS:-10}"
PORTS=(8000 8001 8002 8003 9090)
TARGET="${BUILD_TARGET:-cpu}"
# The SLO rules Prometheus loads (docker/prometheus/rules-<profile>.yml): this stack's profile.
export SLO_PROFILE="${SLO_PROFILE:-cpu}"
REPOSITORY="build/model_repositories/$TARGET"
TICKER_PID="$TF_STATE/health-ticker.pid"
T0=$SECONDS
STARTED=0

usage() { echo "usage: $0 [up|down]" >&2; exit 2; }
verb="${1:-smoke}"
case "$verb" in up|down|smoke) ;; *) usage ;; esac
[ $# -le 1 ] || usage

elapsed() { echo "$((SECONDS - T0)) s"; }

check_admin_key() {
  [ -n "${TRITON_ADMIN_KEY:-}" ] || tf_die "TRITON_ADMIN_KEY is not set (the admin-key header of Triton's admin APIs): export TRITON_ADMIN_KEY=\$(openssl rand -hex 16)"
}

check_ports() {
  local port
  for port in "${PORTS[@]}"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      local who=""
      command -v ss >/dev/null && who="$(ss -Hltnp "sport = :$port" 2>/dev/null | grep -o 'users:(("[^"]*"' | sed -n 1p | cut -d'"' -f2 || true)"
      tf_die "port 127.0.0.1:$port is already in use${who:+ by $who}: stop it, or run '$0 down' if it is this stack"
    fi
  done
}

check_repository() {
  compgen -G "$REPOSITORY/*/config.pbtxt" >/dev/null \
    || tf_die "model repository $REPOSITORY is missing or has no model (the builder writes it: run without SKIP_BUILD_REPO)"
}

running_project() { [ -n "$("$ENGINE" ps -q --filter "label=com.docker.compose.project=$TF_PROJECT")" ]; }

health_status() {  # the engine's health status of a container ('' when it has none yet)
  "$ENGINE" inspect --format '{{if .State.Health}}{{.State.Health.Status}}{{end}}' "$1" 2>/dev/null || true
}

# Podman without systemd runs no healthcheck timers: run the check at the compose file's
# interval ourselves, so the status the engine reports stays current while the stack is up.
start_health_ticker() {
  [ "$ENGINE" = podman ] || return 0
  [ ! -d /run/systemd/system ] || return 0
  stop_health_ticker
  local id="$1"
  mkdir -p "$TF_STATE"
  setsid bash -c "while podman container exists '$id'; do timeout 30 podman healthcheck run '$id' >/dev/null 2>&1; sleep 15; done" \
    </dev/null >/dev/null 2>&1 &
  echo $! >"$TICKER_PID"
}

stop_health_ticker() {
  if [ -f "$TICKER_PID" ]; then
    local pid; pid="$(cat "$TICKER_PID")"
    kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
    rm -f "$TICKER_PID"
  fi
}

wait_healthy() {  # wait_healthy CONTAINER-ID SERVICE WHAT
  local id="$1" service="$2" deadline=$((SECONDS + HEALTH_TIMEOUT)) status state
  tf_log "waiting up to ${HEALTH_TIMEOUT} s for $service to be healthy ($3)"
  while :; do
    [ "$ENGINE" = podman ] && timeout 30 podman healthcheck run "$id" >/dev/null 2>&1 || true
    status="$(health_status "$id")"
    [ "$status" = healthy ] && break
    state="$("$ENGINE" inspect --format '{{.State.Status}}' "$id" 2>/dev/null || echo gone)"
    if [ $SECONDS -ge $deadline ] || [ "$state" = gone ]; then
      "$ENGINE" logs --tail 40 "$id" >&2 2>&1 || true
      tf_die "$service is not healthy after ${HEALTH_TIMEOUT} s (state $state, health '${status:-none}'); its log is above"
    fi
    sleep 5
  done
  tf_log "$service healthy after $(elapsed)"
}

wait_prometheus() {
  local deadline=$((SECONDS + 120))
  until curl -fsS --max-time 5 'http://127.0.0.1:9090/api/v1/query?query=up%7Bjob%3D%22triton-forge%22%2Cinstance%3D%22triton%3A8002%22%7D' 2>/dev/null | grep -q '"value":\[[0-9.]*,"1"\]'; do
    [ $SECONDS -lt $deadline ] || tf_die "Prometheus on 127.0.0.1:9090 did not report the triton target up within 120 s"
    sleep 3
  done
  tf_log "prometheus scrapes triton:8002 (up{job=\"triton-forge\"} = 1)"
  check_rules
}

# The SLO rules of docker/prometheus/rules-<profile>.yml are loaded and evaluate without error.
check_rules() {
  local deadline=$((SECONDS + 60)) rules=""
  while :; do
    rules="$(curl -fsS --max-time 5 http://127.0.0.1:9090/api/v1/rules 2>/dev/null || true)"
    python3 - "$rules" <<'PY' && break
import json, sys
want = {"triton-forge-recording", "triton-forge-slo-alerts", "triton-forge-signal-alerts"}
try:
    groups = json.loads(sys.argv[1])["data"]["groups"]
except (ValueError, KeyError, TypeError):
    sys.exit(1)
names = {g["name"] for g in groups}
rules = [r for g in groups for r in g["rules"]]
bad = [r.get("name") for r in rules if r.get("health") == "err"]
evaluated = all(r.get("health") in ("ok", "unknown") for r in rules) and any(r.get("health") == "ok" for r in rules)
sys.exit(0 if want <= names and not bad and evaluated else 1)
PY
    [ $SECONDS -lt $deadline ] || tf_die "Prometheus /api/v1/rules does not hold the triton-forge rule groups evaluating cleanly within 60 s: ${rules:0:300}"
    sleep 3
  done
  tf_log "prometheus evaluates the SLO rules (/api/v1/rules: recording, SLO alerts, signal alerts)"
}

up() {
  check_admin_key
  tf_pick_engine
  tf_pick_compose
  if running_project; then
    tf_die "the $TF_PROJECT stack is already running on $ENGINE: run '$0 down' first"
  fi
  check_ports
  [ "${SKIP_BUILD_REPO:-0}" != 1 ] || check_repository
  STARTED=1  # from here on, a failure takes down what was started
  TF_ENGINE_READY=1 bash scripts/compose-images.sh
  set -a; source build/images/tags.env; set +a
  mkdir -p build/model_repositories loadtests/results
  if [ "${SKIP_BUILD_REPO:-0}" != 1 ]; then
    tf_log "builder: tools build-repo --target $TARGET into $REPOSITORY"
    TF_ENGINE_TIMEOUT="$BUILD_REPO_TIMEOUT" tf_compose run -T --rm --no-deps builder >&2 \
      || tf_die "the builder failed (tools build-repo); its output is above"
  fi
  check_repository
  tf_log "starting triton, the front, the gateway and prometheus ($(elapsed))"
  TF_ENGINE_TIMEOUT=300 tf_compose up -d --no-deps triton front api prometheus >&2
  local id front api
  id="$(tf_service_ids triton | sed -n 1p)"; front="$(tf_service_ids front | sed -n 1p)"
  api="$(tf_service_ids api | sed -n 1p)"
  [ -n "$id" ] || tf_die "compose started no triton container"
  [ -n "$front" ] || tf_die "compose started no front container"
  [ -n "$api" ] || tf_die "compose started no api container"
  start_health_ticker "$id"
  wait_healthy "$id" triton "every model ready, text_embedding answering"
  # The front's own healthcheck: tritonserver's readiness through HAProxy.
  wait_healthy "$front" front "tritonserver ready through HAProxy"
  # The gateway's: Triton and every pipeline it found ready, through the front.
  wait_healthy "$api" api "the OpenAI/TEI gateway's /health"
  wait_prometheus
  cat <<INFO
triton-forge stack up on $ENGINE in $(elapsed):
  HTTP (front)    http://127.0.0.1:8000   (tools infer text_embedding --text "a cat on a mat")
  OpenAI, TEI     http://127.0.0.1:8000/v1/embeddings, /embed, /rerank, /predict, /info (the api service)
  gRPC (front)    127.0.0.1:8001          (tools infer text_embedding --text hi --protocol grpc)
  Triton metrics  http://127.0.0.1:8002/metrics
  Prometheus      http://127.0.0.1:9090
  stop it with    $0 down
INFO
}

down() {
  if [ -z "${ENGINE:-}" ]; then tf_pick_engine; fi
  [ -n "${TF_COMPOSE+set}" ] || tf_pick_compose
  stop_health_ticker
  [ ! -f build/images/tags.env ] || { set -a; source build/images/tags.env; set +a; }
  # Compose interpolates the whole file: a key is needed even to take the stack down.
  TRITON_ADMIN_KEY="${TRITON_ADMIN_KEY:-down}" TF_ENGINE_TIMEOUT=180 \
    tf_compose --profile load --profile grafana down -v --remove-orphans -t 45 >/dev/null 2>&1 || true
  # Whatever the client left (a container of `run`, a network, the cache volume).
  local label="label=com.docker.compose.project=$TF_PROJECT" ids
  ids="$("$ENGINE" ps -aq --filter "$label")"; [ -z "$ids" ] || "$ENGINE" rm -f -t 10 $ids >/dev/null 2>&1 || "$ENGINE" rm -f $ids >/dev/null
  ids="$("$ENGINE" volume ls -q --filter "$label")"; [ -z "$ids" ] || "$ENGINE" volume rm -f $ids >/dev/null
  ids="$("$ENGINE" network ls -q --filter "$label")"; [ -z "$ids" ] || "$ENGINE" network rm $ids >/dev/null
  local left
  left="$("$ENGINE" ps -aq --filter "$label")$("$ENGINE" volume ls -q --filter "$label")$("$ENGINE" network ls -q --filter "$label")"
  [ -z "$left" ] || tf_die "down left objects of $TF_PROJECT behind: $left"
  tf_log "down: no container, volume or network of $TF_PROJECT left ($ENGINE)"
}

probe() {
  local tools=.venv/bin/tools image
  [ -x "$tools" ] || tf_die "$tools is missing: run scripts/setup.sh for the host-side probes"
  image="$(.venv/bin/python -c 'import skimage, pathlib; print(pathlib.Path(skimage.__file__).parent / "data" / "chelsea.png")' 2>/dev/null || true)"
  local protocol
  for protocol in http grpc; do
    timeout 60 "$tools" infer text_embedding --text "a cat on a mat" --protocol "$protocol" --json >/dev/null \
      || tf_die "text_embedding over $protocol failed"
    if [ -f "$image" ]; then
      timeout 60 "$tools" infer image_classification --image "$image" --protocol "$protocol" >/dev/null \
        || tf_die "image_classification over $protocol failed"
    fi
    tf_log "inference over $protocol from the host: ok"
  done
  # The front (HAProxy, the repository's haproxy.cfg) refuses a body over 16 MiB before reading
  # it, and the server keeps answering
  local code
  code="$(curl -sS -o /dev/null -w '%{http_code}' --max-time 10 -X POST \
      -H 'Content-Type: application/json' -H 'Content-Length: 80000000' -H 'Expect:' \
      http://127.0.0.1:8000/v2/models/text_embedding/infer 2>/dev/null || true)"
  [ "$code" = 413 ] || tf_die "an 80 MB body got HTTP ${code:-no answer}, not 413 from the front"
  timeout 60 "$tools" infer text_embedding --text "after the oversized body" --json >/dev/null \
    || tf_die "text_embedding failed after the oversized body"
  tf_log "an 80 MB body: HTTP 413 from the front, unread; the server answers on"
  # Prometheus has scraped the requests just sent.
  local deadline=$((SECONDS + 60))
  until curl -fsS --max-time 5 'http://127.0.0.1:9090/api/v1/query?query=sum(nv_inference_request_success%7Bjob%3D%22triton-forge%22%7D)' 2>/dev/null \
      | grep -q '"value":\[[0-9.]*,"[1-9]'; do
    [ $SECONDS -lt $deadline ] || tf_die "Prometheus has no nv_inference_request_success from triton after 60 s"
    sleep 3
  done
  tf_log "prometheus holds Triton's nv_inference_request_success"
}

# One call through the public port (the front) to the gateway: the OpenAI embeddings of two texts
# and TEI's /embed of one, each checked for its shape; KServe v2 beside them is Triton's.
api_answers() {  # api_answers WHEN
  timeout 60 .venv/bin/python - "$1" <<'PY' >&2 || tf_die "the OpenAI/TEI routes through the front failed ($1)"
import json, sys, urllib.request

def post(path, body):
    request = urllib.request.Request(f"http://127.0.0.1:8000{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return answer.status, json.loads(answer.read())

status, openai = post("/v1/embeddings", {"model": "text_embedding", "input": ["a cat", "a dog"]})
vectors = [item["embedding"] for item in openai["data"]]
assert status == 200 and openai["object"] == "list" and openai["model"] == "text_embedding", openai
assert [item["index"] for item in openai["data"]] == [0, 1], openai["data"]
assert [len(v) for v in vectors] == [384, 384] and all(isinstance(x, float) for v in vectors for x in v)
assert openai["usage"]["prompt_tokens"] > 0, openai["usage"]
status, tei = post("/embed", {"inputs": ["a cat on a mat"]})
assert status == 200 and [len(v) for v in tei] == [384], tei
status, kserve = post("/v2/models/text_embedding/infer", {"inputs": [
    {"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["a cat"]}]})
assert status == 200 and kserve["outputs"][0]["shape"] == [1, 384], kserve
print(f"api ({sys.argv[1]}): POST /v1/embeddings 2 x 384 floats, usage.prompt_tokens "
      f"{openai['usage']['prompt_tokens']}; POST /embed 1 x 384; /v2/ still tritonserver's")
PY
}

# Seconds until GET /v1/models through the front answers HTTP $1 (each try bounded to 3 s), or
# fail after 30 s saying $2.
until_api_status() {  # until_api_status CODE WHAT
  local started=$SECONDS code=""
  until code="$(curl -sS -o /dev/null -w '%{http_code}' --max-time 3 http://127.0.0.1:8000/v1/models 2>/dev/null || true)"; [ "$code" = "$1" ]; do
    [ $((SECONDS - started)) -lt 30 ] || tf_die "$2: /v1/models got HTTP ${code:-no answer} for 30 s, not $1"
    sleep 1
  done
  echo $((SECONDS - started))
}

api_routes() {
  # The gateway behind the front on port 8000; then a restart of its container, which gives it a
  # new address on Podman: while it is down the front answers its paths 503 and keeps serving
  # /v2/, and once it is back the front has found it again by name.
  api_answers "through the front"
  local api before after stopped found
  api="$(tf_service_ids api | sed -n 1p)"
  tf_log "api container: $("$ENGINE" stats --no-stream --format '{{.MemUsage}} memory, {{.CPUPerc}} CPU' "$api" 2>/dev/null || echo 'no stats')"
  before="$("$ENGINE" inspect --format '{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}' "$api")"
  tf_engine stop -t 15 "$api" >/dev/null
  # (a request in the first seconds waits on the old address until the name stops resolving)
  stopped="$(until_api_status 503 "with the gateway stopped")"
  timeout 60 .venv/bin/tools infer text_embedding --text "the gateway is down" --json >/dev/null \
    || tf_die "text_embedding over /v2/ failed while the gateway was stopped"
  tf_engine start "$api" >/dev/null
  wait_healthy "$api" api "the gateway restarted"
  after="$("$ENGINE" inspect --format '{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}' "$api")"
  found="$(until_api_status 200 "the restarted gateway (address ${before% } -> ${after% })")"
  tf_log "gateway stopped: its paths answered 503 within ${stopped} s, /v2/ served on; restarted at ${after% } (was ${before% }): the front reached it ${found} s after it was healthy"
  api_answers "after the restart"
}

stub_kill() {
  # A dead Python stub: the watchdog reloads that model alone, and the container keeps running.
  local id pid deadline restarts
  id="$(tf_service_ids triton | sed -n 1p)"
  deadline=$((SECONDS + 60))
  until tf_log_has "$id" "per-model recovery on"; do
    [ $SECONDS -lt $deadline ] || tf_die "the watchdog did not turn per-model recovery on within 60 s: $(tf_engine logs "$id" 2>&1 | grep triton_supervisor | tail -3)"
    sleep 1
  done
  pid="$(tf_engine exec "$id" python3 -c "import os
for p in filter(str.isdigit, os.listdir('/proc')):
    try:
        c = open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')
    except OSError:
        continue
    if c[0].endswith(b'stub') and b'/text_tokenizer/' in c[1]:
        os.kill(int(p), 9)
        print(p)")"
  [ -n "$pid" ] || tf_die "no text_tokenizer stub found in the triton container"
  local killed=$SECONDS
  deadline=$((SECONDS + 30))
  until timeout 20 .venv/bin/tools infer text_embedding --text "after the kill" --json >/dev/null 2>&1 \
      && tf_log_has "$id" "reloaded model 'text_tokenizer'"; do
    [ $SECONDS -lt $deadline ] || tf_die "text_embedding did not answer again within 30 s of killing its tokenizer's stub (triton log: $ENGINE logs $id)"
    sleep 1
  done
  restarts="$(tf_engine inspect --format '{{.RestartCount}}' "$id")"
  [ "$restarts" = 0 ] || tf_die "the triton container restarted ($restarts) instead of reloading the model"
  tf_log "killed the text_tokenizer stub: the watchdog reloaded that model, text_embedding answers again ($((SECONDS - killed)) s, no container restart)"
}

load_gate() {
  # The loadtest service of docker-compose.yml, gated on the cpu profile of loadtests/slo.yaml.
  local cmd=(tools loadtest --url triton:8000 --grpc-url triton:8001 --slo-profile cpu
    --output /results)
  [ -z "${LOAD_DURATION:-}" ] || cmd+=(--duration "$LOAD_DURATION")
  tf_log "SLO gate: compose run loadtest ${cmd[*]:1}"
  TF_ENGINE_TIMEOUT="$LOAD_TIMEOUT" tf_compose --profile load run -T --rm --no-deps loadtest "${cmd[@]}" >&2 \
    || tf_die "the SLO gate failed (loadtests/results has the report)"
  tf_log "SLO gate passed ($(elapsed))"
}

admission_refusal() {
  # Real overload through the front: the supervisor in the triton container runs the admission
  # controller, which learns text_embedding's throughput from the front's log and sets its cap;
  # a burst of more closed-loop clients than that cap must draw HTTP 503 with Retry-After from
  # the front, its JSON naming the latency target. Nothing touches the cap but the controller.
  # Each text fills the encoder's 256 tokens, so the burst is more than a CPU answers within the
  # 600 ms objective (short texts: 96 clients at ~360 req/s were within it, and rightly admitted).
  local id caps
  id="$(tf_service_ids triton | sed -n 1p)"
  # (grep reads the whole log: with -q it stops early, and pipefail sees the writer's SIGPIPE)
  tf_engine logs "$id" 2>&1 | grep "front admission on" >/dev/null \
    || tf_die "the supervisor did not start the front's admission controller: $(tf_engine logs "$id" 2>&1 | grep -i 'front admission' | tail -2)"
  tf_log "admission: 3 s warm-up of 8 clients, then $BURST_CLIENTS clients for $BURST_SECONDS s on text_embedding over HTTP (256-token texts)"
  timeout $((BURST_SECONDS + 90)) .venv/bin/python - "$BURST_CLIENTS" "$BURST_SECONDS" <<'PY' >&2 \
    || tf_die "no admission refusal (HTTP 503 + Retry-After, 'over its latency target') under the burst"
import http.client, json, sys, threading, time
from collections import Counter

TEXT = " ".join(["a long text that fills the encoder's whole sequence of tokens"] * 40)
BODY = json.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1],
                               "data": [TEXT]}]})


def run(clients, seconds):
    """Closed-loop clients on keep-alive connections: status counts and the first refusal."""
    statuses, refusals, lock = Counter(), [], threading.Lock()
    stop = time.monotonic() + seconds

    def client():
        conn = None
        while time.monotonic() < stop:
            try:
                conn = conn or http.client.HTTPConnection("127.0.0.1", 8000, timeout=60)
                conn.request("POST", "/v2/models/text_embedding/infer", BODY,
                             {"Content-Type": "application/json"})
                answer = conn.getresponse()
                data, key = answer.read(), answer.status
                if answer.status == 503:
                    with lock:
                        refusals.append((answer.getheader("Retry-After"), data.decode()))
                if (answer.getheader("Connection") or "").lower() == "close":
                    conn.close()
                    conn = None
            except OSError as exc:
                key, conn = type(exc).__name__, None
            with lock:
                statuses[key] += 1

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return statuses, refusals


clients, seconds = int(sys.argv[1]), float(sys.argv[2])
warm, _ = run(8, 3)
print(f"admission: warm-up, 8 clients x 3 s: {dict(warm)}")
statuses, refusals = run(clients, seconds)
print(f"admission: burst, {clients} clients x {seconds:g} s: {dict(statuses)}")
good = [(after, text) for after, text in refusals
        if after and "over its latency target" in json.loads(text or "{}").get("error", "")]
if good:
    after, text = good[0]
    print(f"admission: {len(good)} refusals like: HTTP 503, Retry-After: {after}, {text}")
else:
    print(f"admission: no HTTP 503 with Retry-After naming the latency target; 503s seen: "
          f"{refusals[:3]}")
sys.exit(0 if good else 1)
PY
  # The caps the controller wrote, read back through the runtime API inside the namespace
  caps="$(tf_engine exec "$id" python3 -c "import os, sys
sys.path.insert(0, '/opt/triton-forge')
from tools.front.controller import RuntimeApi
from tools.front.admission import INITIAL_IN_FLIGHT
caps = RuntimeApi(os.environ['FORGE_FRONT_ADMIN']).caps()
print(', '.join(f'{b} {c.bytes} bytes ({c.requests} requests of the mean size)'
                for b, c in sorted(caps.items()) if 'text_embedding' in b),
      f'(before the controller: {INITIAL_IN_FLIGHT} requests)')
cap = caps.get('h_text_embedding')
sys.exit(cap is None or cap.requests >= INITIAL_IN_FLIGHT)")" \
    || tf_die "the controller did not bring text_embedding's HTTP cap under the cold-start one: ${caps:-no answer from the runtime API}"
  tf_log "admission: the front's caps now (forge caps): $caps"
  tf_log "admission: refusals came from real overload, the cap from the controller ($(elapsed))"
}

case "$verb" in
  up)
    trap 'rc=$?; [ $rc -eq 0 ] || [ $STARTED = 0 ] || { tf_log "up failed: taking the stack down"; down; }; exit $rc' EXIT
    trap 'exit 130' INT TERM
    up ;;
  down)
    down ;;
  smoke)
    check_admin_key
    trap 'rc=$?; [ $STARTED = 0 ] || down; tf_log "smoke $([ $rc -eq 0 ] && echo passed || echo FAILED) in $(elapsed)"; exit $rc' EXIT
    trap 'exit 130' INT TERM
    up
    probe
    api_routes
    stub_kill
    load_gate
    admission_refusal ;;
esac
