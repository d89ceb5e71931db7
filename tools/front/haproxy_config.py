"""The one HAProxy configuration every path runs, rendered from a ``FrontPlan``.

``tools build-repo`` writes it into the repository (``haproxy.cfg`` beside ``front.lua``), so the
compose front service and the Kubernetes sidecar run exactly what ``tools serve`` runs. Where
things are (ports, the admin socket, the controller's log socket) comes from the environment,
each with a default, so one file fits a laptop, a compose stack and a pod::

    FORGE_FRONT_HTTP    public HTTP bind        127.0.0.1:8000
    FORGE_FRONT_GRPC    public gRPC bind        127.0.0.1:8001
    FORGE_TRITON_HTTP   tritonserver's HTTP     127.0.0.1:18000
    FORGE_TRITON_GRPC   tritonserver's gRPC     127.0.0.1:18001
    FORGE_FRONT_ADMIN   runtime API socket      ipv4@127.0.0.1:18404
    FORGE_FRONT_LOG     the controller's log    127.0.0.1:18405 (UDP)
    FORGE_GATEWAY       the OpenAI/TEI gateway  127.0.0.1:18080 (or a host name, looked up
                        again while HAProxy runs: compose's `api`, a Service's FQDN)

What it does, in order (docs/serving.md has the why of each rule):

- HTTP/1.1 is parsed by HAProxy, strictly: a request with ambiguous framing is refused (400) or
  re-framed (one ``Content-Length``, CRLF line ends) before tritonserver sees it.
- Bodies over ``max_body_bytes`` get 413 before they are read; chunked bodies 411 (Triton 2.51
  predates the fixes for CVE-2025-23310/23311); compressed bodies 415 (Triton decodes them
  without a bound); a bad ``Inference-Header-Content-Length`` 400; a KServe JSON shape that
  promises more elements than its body has bytes 400 (``front.lua``: Triton 2.51 aborts on one).
- gRPC: the first message's length prefix is read; over ``max_grpc_message_bytes``:
  RESOURCE_EXHAUSTED, the message never forwarded (``front.lua``); compressed messages are
  refused too (UNIMPLEMENTED), as the front cannot bound what they decode to.
- Admission: each model with a P99 objective has an HTTP and a gRPC backend that admits a
  request while the bytes in flight to it stay within its cap (``front.lua``: ``lua.admit`` and
  ``lua.release``); the controller (``tools.front.controller``) sets the caps live from the
  latencies this file logs to it. A request over the cap is held ``refusal_hold_s`` and
  refused: HTTP 503 with ``Retry-After``, gRPC UNAVAILABLE with ``grpc-retry-pushback-ms``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tools.front.plan import FrontPlan

CONFIG_NAME = "haproxy.cfg"
LUA_NAME = "front.lua"
LUA_SOURCE = Path(__file__).with_name(LUA_NAME)
MAX_URL_BYTES = 8000  # within the request line tritonserver reads
GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"
GRPC_STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
# The KServe v2 inference paths: /v2/models/<m>/infer and /v2/models/<m>/versions/<v>/infer
HTTP_INFER = r"^/v2/models/[^/]+/(versions/[0-9]+/)?infer$"
# The log line the controller reads (tools/front/controller.parse_line): backend, server (a
# Lua service's name when the front answered itself), status, total active time (ms), the
# request's cost in bytes as admission counts it (the body, or the gRPC message), termination
# state.
LOG_FORMAT = "%b %s %ST %Ta %[var(txn.cost)] %ts"

ENV_DEFAULTS = {
    "FORGE_FRONT_HTTP": "127.0.0.1:8000",
    "FORGE_FRONT_GRPC": "127.0.0.1:8001",
    "FORGE_TRITON_HTTP": "127.0.0.1:18000",
    "FORGE_TRITON_GRPC": "127.0.0.1:18001",
    "FORGE_FRONT_ADMIN": "ipv4@127.0.0.1:18404",
    "FORGE_FRONT_LOG": "127.0.0.1:18405",
    "FORGE_GATEWAY": "127.0.0.1:18080",
}


def http_backend(model: str) -> str:
    """The HTTP backend of ``model`` (its server's maxconn is the model's HTTP cap)."""
    return f"h_{model}"


def grpc_backend(model: str) -> str:
    """The gRPC backend of ``model``."""
    return f"g_{model}"


def _env(name: str) -> str:
    return f'"${{{name}-{ENV_DEFAULTS[name]}}}"'


def _json(message: str) -> str:
    """An HAProxy ``string`` argument holding ``{"error": message}`` (Triton's error shape):
    double-quoted, so that single quotes stay literal (no ``$`` in messages: it would expand)."""
    text = json.dumps({"error": message}, separators=(",", ":"))
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render(plan: FrontPlan) -> str:
    """The text of ``haproxy.cfg`` for ``plan``."""
    limits = plan.limits
    hold_ms = max(1, round(limits.refusal_hold_s * 1000))
    retry_after = max(1, math.ceil(limits.refusal_hold_s))
    models = sorted(plan.objectives)
    lines = [
        "# Rendered by tools build-repo (tools/front/haproxy_config.py) from the model configs and",
        "# their P99 objectives; tools serve, both compose files and the Kubernetes pod run it.",
        "# Do not edit: change the spec or loadtests/slo.yaml and rebuild.",
        "global",
        "    default-path config",
        f"    lua-load {LUA_NAME}",
        f"    stats socket {_env('FORGE_FRONT_ADMIN')} level admin",
        # the admission controller reads one line per request (tools/front/controller.py)
        f"    log {_env('FORGE_FRONT_LOG')} len 256 format raw local0 info",
        "    maxconn 4096",
        "",
    ]
    if plan.gateway_paths:
        # The gateway may be another container or a Service (FORGE_GATEWAY a host name): HAProxy
        # starts without it (the server stays down, 503, until the name resolves) and follows a
        # new address when the gateway restarts, from the system's name servers (none: a warning).
        # A name that stops resolving (a stopped container) takes the server down within a
        # second or two, so its paths answer 503 at once instead of after connect timeouts to
        # the old address.
        lines += ["resolvers dns", "    parse-resolv-conf", "    hold nx 1s", ""]
    lines += [
        "defaults",
        "    mode http",
        "    log global",
        f'    log-format "{LOG_FORMAT}"',
        "    option http-keep-alive",
        "    timeout connect 5s",
        f"    timeout http-request {limits.request_timeout_s}s",
        f"    timeout client {limits.idle_timeout_s}s",
        f"    timeout http-keep-alive {limits.idle_timeout_s}s",
        f"    timeout server {limits.server_timeout_s}s",
        f"    timeout tarpit {hold_ms}ms",
        f"    http-error status 400 content-type application/json string {_json('malformed HTTP request')}",
        f"    http-error status 408 content-type application/json string "
        f"{_json(f'request not received within {limits.request_timeout_s} s')}",
        f"    http-error status 502 content-type application/json string {_json('tritonserver did not answer')}",
        f"    http-error status 503 content-type application/json string {_json('tritonserver is not available')}",
        f"    http-error status 504 content-type application/json string "
        f"{_json(f'no answer within {limits.server_timeout_s} s')}",
        "",
        "frontend http",
        f"    bind {_env('FORGE_FRONT_HTTP')}",
        # What HAProxy's parser tolerates or forwards as sent, refused here: an absolute-form or
        # over-long target, control bytes in a header, an underscore in a header name (a dash to some servers), a Content-Length
        # past 15 digits, HTTP/1.1 without exactly one Host, an expectation other than
        # 100-continue, and repeated headers tritonserver reads one of.
        f"    http-request return status 400 content-type application/json string "
        f"{_json('the request target must be a path (origin-form)')} if !{{ url_beg / }}",
        # tritonserver (evhtp) drops a connection whose request line is longer than about 8 KB
        f"    http-request return status 414 content-type application/json string "
        f"{_json(f'request target over {MAX_URL_BYTES} bytes')} if {{ url,length gt {MAX_URL_BYTES} }}",
        f"    http-request return status 400 content-type application/json string "
        f"{_json('control character in a header')} "
        r"if { req.hdrs -m reg '[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]' }",
        f"    http-request return status 400 content-type application/json string "
        f"{_json('underscore in a header name')} if {{ req.hdr_names -m sub _ }}",
        f"    http-request return status 400 content-type application/json string "
        f"{_json('Content-Length is not a number of bytes')} "
        "if { req.hdr_cnt(content-length) gt 0 } !{ req.hdr(content-length) -m reg ^[0-9]{1,15}$ }",
        f"    http-request return status 400 content-type application/json string "
        f"{_json('HTTP/1.1 needs exactly one Host header')} "
        "if { req.ver 1.1 } !{ req.hdr_cnt(host) eq 1 }",
        f"    http-request return status 417 content-type application/json string "
        f"{_json('the only expectation accepted is 100-continue')} "
        "if { req.hdr_cnt(expect) gt 0 } !{ req.hdr(expect) -i 100-continue }",
        f"    http-request return status 400 content-type application/json string "
        f"{_json('repeated Content-Encoding or Inference-Header-Content-Length')} "
        "if { req.hdr_cnt(content-encoding) gt 1 } || "
        "{ req.hdr_cnt(inference-header-content-length) gt 1 }",
        f"    http-request return status 411 content-type application/json string "
        f"{_json('chunked request bodies are not accepted: send Content-Length')} "
        "if { req.hdr_cnt(transfer-encoding) gt 0 }",
        f"    http-request return status 413 content-type application/json string "
        f"{_json(f'request body over {limits.max_body_bytes} bytes')} "
        f"if {{ req.hdr_val(content-length) gt {limits.max_body_bytes} }}",
        f"    http-request return status 415 content-type application/json string "
        f"{_json('compressed request bodies are not accepted: send them uncompressed')} "
        "if { req.hdr(content-encoding) -m found } !{ req.hdr(content-encoding) -i identity }",
        # digits only, at most the body's length (Triton 2.70-2.71 abort on a value over INT32_MAX)
        "    acl ihcl_given req.hdr_cnt(inference-header-content-length) gt 0",
        "    acl ihcl_digits req.hdr(inference-header-content-length) -m reg ^[0-9]{1,10}$",
        "    http-request set-var(txn.body_size) req.hdr_val(content-length) if ihcl_given ihcl_digits",
        "    http-request set-var(txn.ihcl_over) req.hdr_val(inference-header-content-length),"
        "sub(txn.body_size) if ihcl_given ihcl_digits",
        f"    http-request return status 400 content-type application/json string "
        f"{_json('Inference-Header-Content-Length must be a number of bytes within the body')} "
        "if ihcl_given !ihcl_digits || ihcl_given { var(txn.ihcl_over) -m int gt 0 }",
        f"    acl infer path_reg {HTTP_INFER}",
        # the part of an inference body the shape check reads (or all of it, if smaller)
        f"    http-request wait-for-body time {limits.request_timeout_s}s at-least 16k if infer METH_POST",
        "    http-request lua.check_shapes if infer METH_POST",
        "    http-request return status 400 content-type application/json "
        "lf-string '{\"error\":\"%[var(txn.shape_error)]\"}' if { var(txn.shape_error) -m found }",
        "    http-request set-var(txn.model) path,field(4,/) if infer",
        "    http-request set-var(txn.cost) req.hdr_val(content-length) if infer",
    ]
    if plan.gateway_paths:
        exact = " ".join(p for p in plan.gateway_paths if not p.endswith("/"))
        prefixes = " ".join(p for p in plan.gateway_paths if p.endswith("/"))
        conditions = [c for c in (f"{{ path_beg {prefixes} }}" if prefixes else "",
                                  f"{{ path {exact} }}" if exact else "") if c]
        lines.append(f"    use_backend gateway if {' || '.join(conditions)}")
    lines += [f"    use_backend {http_backend(m)} if {{ var(txn.model) -m str {m} }}"
              for m in models]
    lines += [
        # a request the front refused closes its connection (whatever follows on it is not
        # read as a request); an overload refusal keeps it, as tritonserver's own errors do
        "    http-after-response set-header connection close "
        "if { status ge 400 } !{ status 503 } !{ srv_name -m found }",
        "    default_backend h_triton",
        "",
        "frontend grpc",
        f"    bind {_env('FORGE_FRONT_GRPC')} proto h2",
        f"    acl stream path {GRPC_STREAM}",
        f"    http-request wait-for-body time {limits.request_timeout_s}s at-least 1k if !stream",
        "    http-request set-var(txn.compressed) req.body,bytes(0,1),be2dec(:,1) if !stream",
        "    http-request set-var(txn.length) req.body,bytes(1,4),be2dec(:,4) if !stream",
        "    http-request use-service lua.grpc_compressed if { var(txn.compressed) -m int gt 0 }",
        f"    http-request set-var(txn.limit) int({limits.max_grpc_message_bytes})",
        f"    http-request use-service lua.grpc_too_large "
        f"if {{ var(txn.length) -m int gt {limits.max_grpc_message_bytes} }}",
        # ModelInferRequest.model_name is field 1: the first field of the message
        f"    http-request set-var(txn.model) req.body,bytes(5),protobuf(1) if {{ path {GRPC_INFER} }}",
        "    http-request set-var(txn.cost) var(txn.length),add(5) if !stream",
    ]
    lines += [f"    use_backend {grpc_backend(m)} if {{ var(txn.model) -m str {m} }}" for m in models]
    lines += [
        "    default_backend g_triton",
        "",
        "backend h_triton",
        f"    server triton {_env('FORGE_TRITON_HTTP')}",
        "",
        "backend g_triton",
        f"    server triton {_env('FORGE_TRITON_GRPC')} proto h2",
    ]
    for model in models:
        over = (f"model '{model}' is over its latency target (P99 objective "
                f"{plan.objectives[model]:g} ms); retry later")
        lines += [
            "",
            f"backend {http_backend(model)}",
            "    http-request lua.admit",
            "    http-request tarpit deny_status 503 if { var(txn.over) -m found }",
            "    http-response lua.release",
            f"    http-error status 503 content-type application/json string {_json(over)} "
            f"hdr retry-after {retry_after}",
            f"    server triton {_env('FORGE_TRITON_HTTP')}",
            "",
            f"backend {grpc_backend(model)}",
            f"    http-request set-var(txn.hold_ms) int({hold_ms})",
            f"    http-request set-var(txn.p99_ms) str({plan.objectives[model]:g})",
            "    http-request lua.admit",
            "    http-request use-service lua.grpc_overloaded if { var(txn.over) -m found }",
            "    http-response lua.release",
            f"    server triton {_env('FORGE_TRITON_GRPC')} proto h2",
        ]
    if plan.gateway_paths:
        lines += ["", "backend gateway",
                  f"    http-error status 503 content-type application/json string "
                  f"{_json('the OpenAI/TEI gateway is not running')}",
                  f"    server gateway {_env('FORGE_GATEWAY')} resolvers dns init-addr libc,none"]
    return "\n".join(lines) + "\n"


def write(plan: FrontPlan, folder: Path) -> list[Path]:
    """Write ``haproxy.cfg`` and ``front.lua`` for ``plan`` into ``folder`` (each replaced
    atomically, and only when its text changed); returns the two paths."""
    from tools.files import write_atomically

    folder = Path(folder)
    written = []
    for name, text in ((CONFIG_NAME, render(plan)), (LUA_NAME, LUA_SOURCE.read_text())):
        path = folder / name
        if not path.is_file() or path.read_text() != text:
            write_atomically(path, text)
        written.append(path)
    return written
