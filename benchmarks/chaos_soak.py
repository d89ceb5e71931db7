"""Chaos soak: text, image and bad requests at half capacity through ``tools serve`` while a
Python stub is killed every 2 minutes; exits 1 when a target is missed.

    python benchmarks/chaos_soak.py --repository model_repository            # 30 minutes
    python benchmarks/chaos_soak.py --repository R --minutes 1 --kill-every 20 --warmup-s 10

Works on any repository: the models clients call (those no ensemble uses as a step) get valid
requests made from their configs (string inputs named like ``IMAGE`` get the shipped photos,
other string inputs the shipped texts, numeric inputs a probe tensor) and bad ones (malformed
JSON, a wrong datatype, a 256 KiB text). Capacity is measured first, closed loop, with the valid
requests (or given by ``--rate``); the soak then sends at ``--load`` (0.5) of it, open loop, 90 %
valid and 10 % bad requests.

Targets, as the report lists them:

- **lost requests outside the kill windows: 0.** A valid request is lost when it did not get
  HTTP 200; a bad one when it got no HTTP answer (a timeout or a dropped connection; Triton 2.51
  answers malformed JSON with 500, which is an answer). A kill window is, for the killed model
  and the ensembles that use it (and only for them), the time from the kill until ``/status``
  reports the model ready again plus the client timeout; a request whose time in flight
  overlaps it is excused. Requests that started in the warm-up are not counted.
- **RSS growth of tritonserver + its Python stubs < 50 MB**, from the first sample after the
  warm-up to the last sample outside any kill window (sampled every 5 s).
- **every restart counted:** for every killed model, ``triton_forge_model_restarts_total`` on
  the status endpoint equals the number of times its stub was killed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import triton_to_np_dtype

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools import paths, process  # noqa: E402
from tools.load.scenario import load_images, load_texts  # noqa: E402
from tools.serve import faults, health  # noqa: E402
from tools.load import Background, ClosedLoop, OpenLoop, RawHttp, Request  # noqa: E402
from tools.load.senders import CLIENT_TIMEOUT, Sender, TritonGrpc  # noqa: E402
from tools.serve.recovery import instance_model  # noqa: E402
from tools.stats import Record, end_s  # noqa: E402

RSS_TARGET_MB = 50.0
BAD_SHARE = 0.10
_OVERSIZE_TEXT_BYTES = 256 * 1024
_RSS_EVERY_S = 5.0
_MAX_IDLE_S = 15.0


# ---- the load: lanes over the load engine (tools/load)


class _ReadyHttp(RawHttp):
    """``RawHttp`` sending each request's body as the complete HTTP/1.1 request it already is
    (head and body: binary-tensor requests, malformed ones)."""

    def prepare(self, request: Request) -> bytes:
        assert request.body is not None
        return request.body


class Lane:
    """One stream of requests to one model, sent by the load engine in a thread of its own.

    Args:
        model: The model the requests go to (for the kill windows).
        kind: ``valid`` or ``bad``.
        sender: How they go: ``_ReadyHttp`` (keep-alive connections) or ``TritonGrpc`` (one
            channel, through the gRPC guard).
        requests: Sent in turn (for ``_ReadyHttp``, complete HTTP requests as their ``body``).
    """

    def __init__(self, model: str, kind: str, sender: Sender, requests: Sequence[Request]) -> None:
        self.model, self.kind, self.protocol = model, kind, sender.protocol
        self._sender, self._requests = sender, list(requests)
        self._load: Background | None = None

    @classmethod
    def http(cls, url: str, model: str, kind: str, requests: Sequence[bytes],
             timeout_s: float) -> Lane:
        """A lane of complete HTTP/1.1 requests to ``url``."""
        return cls(model, kind, _ReadyHttp(url, timeout_s=timeout_s),
                   [Request(model, body=raw) for raw in requests])

    def start(self, *, rate: float = 0.0, users: int = 0, duration_s: float) -> Lane:
        """Send for ``duration_s``: open loop at ``rate``/s, or closed loop with ``users``."""
        pacing = ClosedLoop(users) if users else OpenLoop(
            rate, max_in_flight=lane_connections(rate, self._sender.timeout_s or 10.0))
        self._load = Background(self._requests, self._sender, pacing,
                                duration_s=duration_s).start()
        return self

    def join(self) -> list[Record]:
        """Wait for the planned duration (and the requests in flight); the records."""
        assert self._load is not None
        self._load.join()
        return list(self._load.records)


def lane_connections(rate: float, timeout_s: float) -> int:
    """Keep-alive connections for an open-loop lane: enough for the requests in flight at
    ``rate`` within ``timeout_s``, few enough that each is used again within ``_MAX_IDLE_S``.

    The HTTP guard closes a client connection idle for 30 s (its read timeout); a request sent
    on it just then is refused as "connection closed by the server", an artefact of a client
    that keeps more connections than its rate uses (seen: half the bad requests of a 0.36
    req/s lane over 11 connections).
    """
    return max(1, min(math.ceil(rate * timeout_s) + 2, int(rate * _MAX_IDLE_S)))


# ---- requests made from the served models' configs


def _shape(config: Mapping[str, Any], dims: Sequence[int]) -> list[int]:
    batch = [1] if int(config.get("max_batch_size", 0)) > 0 else []
    return batch + [1 if int(d) < 0 else int(d) for d in dims]


def _string_inputs(config: Mapping[str, Any]) -> list[dict] | None:
    inputs = config.get("input", [])
    if inputs and all(i.get("data_type") == "TYPE_STRING" for i in inputs):
        return inputs
    return None


def _binary_request(host: str, model: str, inputs: Mapping[str, np.ndarray]) -> bytes:
    tensors = []
    for name, array in inputs.items():
        tensor = httpclient.InferInput(name, list(array.shape), "BYTES")
        tensor.set_data_from_numpy(array, binary_data=True)
        tensors.append(tensor)
    body, json_size = httpclient.InferenceServerClient.generate_request_body(tensors)
    head = (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {host}\r\n"
            "Content-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {json_size}\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


def _json_request(host: str, model: str, inputs: Iterable[tuple[str, list[int], str, list]]) -> bytes:
    body = {"inputs": [{"name": n, "shape": s, "datatype": d, "data": v} for n, s, d, v in inputs]}
    return faults.infer_request(host, model, body)


def valid_inputs(config: Mapping[str, Any]) -> tuple[str, list[dict[str, np.ndarray]]]:
    """(kind, the inputs of each valid request) for a model: ``image`` (the shipped photos),
    ``text`` (the shipped texts) or ``tensor`` (a probe tensor)."""
    strings = _string_inputs(config)
    if strings and any("IMAGE" in i["name"].upper() for i in strings):
        return "image", [{i["name"]: np.full(_shape(config, i["dims"]), data, dtype=np.object_)
                          for i in strings} for _, data in load_images(paths.IMAGES_DIR)]
    if strings:
        texts = [t.encode() for t in load_texts(paths.TEXTS_FILE)[:200]]
        return "text", [
            {i["name"]: np.full(_shape(config, i["dims"]), texts[(n + k) % len(texts)],
                                dtype=np.object_) for k, i in enumerate(strings)}
            for n in range(len(texts))]
    probe = health.probe_request(config)["inputs"]
    return "tensor", [{i["name"]: np.array(i["data"], dtype=triton_to_np_dtype(i["datatype"]))
                       .reshape(i["shape"]) for i in probe}]


def valid_requests(host: str, model: str, kind: str,
                   inputs: Sequence[Mapping[str, np.ndarray]]) -> list[bytes]:
    """Complete HTTP requests of ``inputs`` to ``model``: binary tensors for images, KServe v2
    JSON otherwise."""
    if kind == "image":
        return [_binary_request(host, model, tensors) for tensors in inputs]
    return [faults.infer_request(host, model, Request(model, tensors).http_body())
            for tensors in inputs]


def bad_requests(host: str, model: str, config: Mapping[str, Any]) -> list[bytes]:
    """Malformed JSON, a wrong datatype and (string inputs) a 256 KiB text, for ``model``."""
    first = config["input"][0]
    shape = _shape(config, first["dims"])
    wrong = ("FP32", [0.5] * int(np.prod(shape))) if first["data_type"] == "TYPE_STRING" else (
        "BYTES", ["not a number"] * int(np.prod(shape)))
    requests = [
        faults.infer_request(host, model, b'{"inputs": [{"name": "' + first["name"].encode()
                             + b'", "shape": [1, '),
        _json_request(host, model, [(first["name"], shape, *wrong)]),
    ]
    strings = _string_inputs(config)
    if strings and not any("IMAGE" in i["name"].upper() for i in strings):
        words = ("lorem ipsum dolor sit amet " * (_OVERSIZE_TEXT_BYTES // 27 + 1))
        requests.append(_json_request(host, model, [
            (i["name"], _shape(config, i["dims"]), "BYTES", [words[:_OVERSIZE_TEXT_BYTES]])
            for i in strings]))
    return requests


def ensemble_steps(config: Mapping[str, Any]) -> set[str]:
    """The models an ensemble config runs (empty for other models)."""
    return {s["model_name"] for s in config.get("ensemble_scheduling", {}).get("step", [])}


def affected(model: str, configs: Mapping[str, Mapping[str, Any]]) -> set[str]:
    """``model`` and every ensemble that uses it, directly or through another ensemble."""
    found, grew = {model}, True
    while grew:
        users = {name for name, c in configs.items() if ensemble_steps(c) & found}
        grew = not users <= found
        found |= users
    return found


# ---- the server under test: `tools serve`


class Serve:
    """``tools serve`` on free ports, as a subprocess; endpoints read from its output, and the
    tritonserver pid followed across whole-server restarts (``tools serve`` restarts a
    tritonserver that exits by itself on the same ports).

    Attributes:
        pid: The running tritonserver.
        starts: How many times a tritonserver became ready (1 + whole-server restarts).
    """

    def __init__(self, repository: Path, log_path: Path, start_timeout_s: float = 600) -> None:
        self.log_path = log_path
        self._log = log_path.open("w", encoding="utf-8")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tools.cli", "serve", "--repository", str(repository),
             "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
             "--forge-metrics-port", "0", "--exit-timeout", "5"],
            stdout=subprocess.PIPE, stderr=self._log, text=True, start_new_session=True,
            cwd=Path(__file__).resolve().parents[1])
        self.pid, self.starts, self.http, self.grpc, self.status_url = 0, 0, "", "", ""
        self.server_log = ""  # tritonserver's; a restart keeps the crashed run's beside it
        announced = threading.Event()

        def follow() -> None:
            for line in self.proc.stdout:
                if m := re.match(r"^tritonserver ready: pid (\d+), log (.+)$", line.rstrip()):
                    self.pid, self.starts = int(m.group(1)), self.starts + 1
                    self.server_log = m.group(2)
                elif m := re.match(r"^(http|grpc)\s+(\S+)$", line.strip()):
                    setattr(self, m.group(1), m.group(2))
                elif m := re.match(r"^status\s+(\S+)/status,", line):
                    self.status_url = m.group(1)
                    announced.set()

        threading.Thread(target=follow, daemon=True).start()
        if not announced.wait(start_timeout_s):
            self.stop()
            raise SystemExit(f"tools serve not ready after {start_timeout_s:g} s "
                             f"(its log: {log_path})")

    def restart_reasons(self) -> list[str]:
        """Why ``tools serve`` restarted tritonserver, one line each (from its log), each with
        the end of the crashed run's log, which ``tools serve`` keeps."""
        self._log.flush()
        return [line.strip() for line in self.log_path.read_text(errors="replace").splitlines()
                if "restarting the server" in line]

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.status_url}/status", timeout=5) as response:
            return json.loads(response.read())["models"]

    def metric(self, name: str) -> dict[str, float]:
        """model -> value of one ``triton_forge_*`` metric."""
        with urllib.request.urlopen(f"{self.status_url}/metrics", timeout=5) as response:
            text = response.read().decode()
        return {m: float(v) for m, v in re.findall(rf'^{name}{{model="([^"]+)"}} (\S+)$', text,
                                                    re.MULTILINE)}

    def rss_mb(self) -> dict[str, float]:
        """RSS in MB by role: ``tools serve`` itself (the watch loop, the status endpoint),
        ``tritonserver``, ``stubs <model>`` (its instances summed), the guards (``http guard``, ``grpc guard``) and ``others`` (anything else tools serve
        runs)."""
        stubs = process.stub_processes(self.pid)
        roles: dict[str, list[int]] = {"tools serve": [self.proc.pid], "tritonserver": [self.pid]}
        for instance, pid in stubs.items():
            roles.setdefault(f"stubs {instance_model(instance)}", []).append(pid)
        for proc in process.descendants(self.proc.pid):
            if proc.pid == self.pid or proc.pid in stubs.values():
                continue
            argv = " ".join(process.command_line(proc.pid))
            role = next((f"{kind} guard" for kind in ("http", "grpc")
                         if f"tools.serve.{kind}_guard" in argv), "others")
            roles.setdefault(role, []).append(proc.pid)
        return {role: faults.sample(pids).rss_bytes / 1e6 for role, pids in roles.items()}

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                pass
        process.stop(self.proc.pid, 10)
        self._log.close()
        return self.proc.returncode


# ---- the run


@dataclass
class Kill:
    """One stub kill: when, which, and when ``/status`` said the model was ready again."""

    model: str
    instance: str
    at_s: float
    ready_s: float | None = None

    def window(self, timeout_s: float, end_s: float) -> tuple[float, float]:
        return self.at_s, (self.ready_s if self.ready_s is not None else end_s) + timeout_s


@dataclass
class Figures:
    """What the soak measured; ``misses`` lists the targets it missed."""

    minutes: float
    capacity_rps: float
    rate_rps: float
    kills_planned: bool = True  # False with --kill-every 0 (a run measuring memory alone)
    server_log: str = ""  # tritonserver's log (earlier runs' beside it: tools.process.rotate_log)
    requests: dict[str, int] = field(default_factory=dict)
    bad_answers: dict[str, dict[str, int]] = field(default_factory=dict)
    lost_outside_windows: int = 0
    lost_to_overload: int = 0  # of those: timeouts (the client's, or a queue's HTTP 503)
    lost_examples: list[str] = field(default_factory=list)
    excused_in_windows: int = 0
    kills: list[dict] = field(default_factory=list)
    server_restarts: list[str] = field(default_factory=list)
    restarts: dict[str, float] = field(default_factory=dict)
    rss_mb: dict[str, float] = field(default_factory=dict)
    rss_by_role_mb: dict[str, list[float]] = field(default_factory=dict)  # [after warm-up, end]
    rss_by_minute_mb: dict[str, list[float]] = field(default_factory=dict)  # role -> per minute
    lost_kinds: dict[str, int] = field(default_factory=dict)
    misses: list[str] = field(default_factory=list)


def _status_code(record: Record) -> int | None:
    if record.ok:
        return 200
    m = re.match(r"HTTP (\d{3})", record.error)
    return int(m.group(1)) if m else None


def overload(record: Record) -> bool:
    """A request that failed by waiting too long: the client's timeout, or tritonserver's queue
    timeout (HTTP 503 "Request timeout expired"), what an overloaded machine gives; anything
    else that fails is an error."""
    return record.error == CLIENT_TIMEOUT or (
        _status_code(record) == 503 and "timeout" in record.error.lower())


def lost(record: Record, kind: str) -> bool:
    """A valid request not answered 200; a bad one not answered at all (Triton 2.51 answers
    some bad requests with 500, e.g. malformed JSON: an answer, not a loss)."""
    if kind == "valid":
        return not record.ok
    return _status_code(record) is None


@dataclass
class Lost:
    """The lost requests of a soak.

    Attributes:
        outside: Lost outside the kill windows.
        overload: Of ``outside``, those lost to a timeout (``overload``), not to an error.
        excused: Lost inside a kill window of their model.
        examples: A few of ``outside``, with their time and error.
        kinds: How many of ``outside`` each kind of error (model, lane, message) lost.
    """

    outside: int = 0
    overload: int = 0
    excused: int = 0
    examples: list[str] = field(default_factory=list)
    kinds: dict[str, int] = field(default_factory=dict)


def count_lost(lanes: Iterable[tuple[str, str, list[Record]]], kills: Sequence[Kill],
               configs: Mapping[str, Mapping[str, Any]], counted_from_s: float,
               timeout_s: float, end_s_: float) -> Lost:
    """The lost requests of lanes given as (model, kind, records)."""
    windows = [(affected(k.model, configs), *k.window(timeout_s, end_s_)) for k in kills]
    found = Lost()
    for model, kind, records in lanes:
        for record in records:
            if record.start_s < counted_from_s or not lost(record, kind):
                continue
            if any(model in models and record.start_s <= stop and end_s(record) >= start
                   for models, start, stop in windows):
                found.excused += 1
                continue
            found.outside += 1
            found.overload += overload(record)
            what = f"{model} ({kind}): " + re.sub(r"\d+", "N", record.error)[:90]
            found.kinds[what] = found.kinds.get(what, 0) + 1
            if len(found.examples) < 5:
                found.examples.append(f"{model} ({kind}) at +{record.start_s - counted_from_s:.1f}"
                                      f" s: {record.error}")
    found.kinds = dict(sorted(found.kinds.items(), key=lambda kv: -kv[1]))
    return found


def rss_growth(samples: Sequence[tuple[float, float]], kills: Sequence[Kill], timeout_s: float,
               from_s: float) -> tuple[float, float, float] | None:
    """(first, last, largest) RSS sample at or after ``from_s`` outside every kill window."""
    quiet = [mb for t, mb in samples if t >= from_s and not any(
        k.at_s <= t <= k.window(timeout_s, t)[1] for k in kills)]
    return (quiet[0], quiet[-1], max(quiet)) if len(quiet) >= 2 else None


def by_minute(by_role: Sequence[tuple[float, Mapping[str, float]]],
              from_s: float) -> dict[str, list[float]]:
    """Role -> its RSS at ``from_s`` and at each whole minute after it (the first sample at or
    after each mark; 0 where the role had no process), for the growth over time."""
    picked, mark = [], from_s
    for t, roles in by_role:
        if t >= mark:
            picked.append(roles)
            mark += 60.0 * (1 + (t - mark) // 60.0)
    names = sorted({role for roles in picked for role in roles})
    return {role: [round(roles.get(role, 0.0), 1) for roles in picked] for role in names}


def misses(figures: Figures) -> list[str]:
    """The targets ``figures`` misses, one line each."""
    found = []
    if figures.server_restarts:
        found.append(f"tritonserver restarted {len(figures.server_restarts)} times: "
                     f"{figures.server_restarts[0]}")
    if figures.lost_outside_windows:
        errors = figures.lost_outside_windows - figures.lost_to_overload
        found.append(f"{figures.lost_outside_windows} requests lost outside the kill windows "
                     f"(target 0: {figures.lost_to_overload} to timeouts under load, {errors} to "
                     f"errors), e.g. {figures.lost_examples[:2]}")
    growth = figures.rss_mb.get("growth")
    if growth is None:
        found.append("RSS growth not measured (fewer than 2 samples outside the kill windows)")
    elif growth >= RSS_TARGET_MB:
        found.append(f"RSS of tools serve's processes grew {growth:.1f} MB "
                     f"(target < {RSS_TARGET_MB:g})")
    killed: dict[str, int] = {}
    for kill in figures.kills:
        killed[kill["model"]] = killed.get(kill["model"], 0) + 1
        if kill["ready_s"] is None:
            found.append(f"model '{kill['model']}' was not ready again after its stub was killed")
    for model in sorted(set(killed) | {m for m, n in figures.restarts.items() if n}):
        count, seen = killed.get(model, 0), figures.restarts.get(model, 0)
        if seen != count:
            found.append(f"model '{model}': {count} kills but {seen:g} restarts in the metrics")
    if not figures.kills and figures.kills_planned:
        found.append("no stub was killed (the run is shorter than the first kill)")
    return found


def _kill_and_wait(serve: Serve, model: str, recovery_limit_s: float) -> Kill | None:
    """Kill the first stub of ``model`` and wait until it is ready again; None when the model
    has no stub for ``recovery_limit_s`` (tritonserver itself is restarting)."""
    deadline = time.monotonic() + recovery_limit_s
    while not (instances := sorted(i for i in process.stub_processes(serve.pid)
                                   if instance_model(i) == model)):
        if time.monotonic() > deadline:
            return None
        time.sleep(0.5)
    pid = process.stub_processes(serve.pid).get(instances[0])
    if pid is None:
        return None
    kill = Kill(model, instances[0], time.monotonic())
    os.kill(pid, signal.SIGKILL)
    deadline = kill.at_s + recovery_limit_s
    while time.monotonic() < deadline:
        state = serve.status().get(model, {})
        stub = process.stub_processes(serve.pid).get(instances[0])
        if state.get("state") == "ready" and not state.get("dead_stubs") and stub not in (None, pid):
            kill.ready_s = time.monotonic()
            break
        time.sleep(0.1)
    return kill


def run(args: argparse.Namespace) -> Figures:
    log = args.log or Path(f"chaos-soak-serve-{time.strftime('%Y%m%d-%H%M%S')}.log")
    serve = Serve(args.repository, log)
    try:
        return _soak(serve, args)
    finally:
        serve.stop()


def _soak(serve: Serve, args: argparse.Namespace) -> Figures:
    models = sorted(serve.status())
    with health.client(serve.http, 10) as triton:
        configs = {m: triton.get_model_config(m) for m in models}
    steps = set().union(*(ensemble_steps(c) for c in configs.values()))
    entries = [m for m in models if m not in steps]
    inputs = {m: valid_inputs(configs[m]) for m in entries}
    valid = {m: valid_requests(serve.http, m, kind, tensors) for m, (kind, tensors) in inputs.items()}
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    say(f"chaos soak on {args.repository}: entry models "
        + ", ".join(f"{m} ({kind})" for m, (kind, _) in inputs.items()))

    if args.rate:
        capacity, shares = 0.0, {m: 1 / len(entries) for m in entries}
    else:
        lanes = [Lane.http(serve.http, m, "valid", r, args.timeout_s).start(
            users=args.capacity_users, duration_s=args.capacity_s) for m, r in valid.items()]
        ok = {lane.model: sum(r.ok for r in lane.join()) / args.capacity_s for lane in lanes}
        capacity = sum(ok.values())
        if capacity <= 0:
            raise SystemExit("capacity measured as 0 req/s: the models do not answer")
        shares = {m: v / capacity for m, v in ok.items()}
        say(f"capacity {capacity:.1f} req/s closed loop ({args.capacity_users} users per model, "
            f"{args.capacity_s:g} s): " + ", ".join(f"{m} {v:.1f}" for m, v in ok.items()))
    rate = args.rate or args.load * capacity
    duration = args.minutes * 60.0
    start = time.monotonic()
    http_share = (1 - BAD_SHARE) * (1 - args.grpc_share)
    lanes = [Lane.http(serve.http, m, "valid", r, args.timeout_s).start(
        rate=rate * http_share * shares[m], duration_s=duration) for m, r in valid.items()]
    if args.grpc_share:
        lanes += [Lane(m, "valid", TritonGrpc(serve.grpc, timeout_s=args.timeout_s),
                       [Request(m, tensors) for tensors in inputs[m][1]]).start(
            rate=rate * (1 - BAD_SHARE) * args.grpc_share * shares[m], duration_s=duration)
            for m in entries]
    lanes += [Lane.http(serve.http, m, "bad", bad_requests(serve.http, m, configs[m]),
                        args.timeout_s).start(rate=rate * BAD_SHARE / len(entries),
                                              duration_s=duration)
              for m in entries]
    say(f"soak: {rate:.1f} req/s for {args.minutes:g} min ({BAD_SHARE:.0%} bad requests, "
        f"{args.grpc_share:.0%} of the valid ones over gRPC); "
        + (f"a stub killed every {args.kill_every:g} s" if args.kill_every else "no kills"))

    samples: list[tuple[float, float]] = []  # (time, every process tools serve runs)
    by_role: list[tuple[float, dict[str, float]]] = []
    stop = threading.Event()

    def sample_rss() -> None:
        while not stop.is_set():
            roles, now = serve.rss_mb(), time.monotonic()
            samples.append((now, sum(roles.values())))
            by_role.append((now, roles))
            stop.wait(_RSS_EVERY_S)

    sampler = threading.Thread(target=sample_rss, daemon=True)
    sampler.start()
    with_stubs = sorted({instance_model(i) for i in process.stub_processes(serve.pid)})
    unknown = sorted(set(args.kill_models or ()) - set(with_stubs))
    if unknown:
        raise SystemExit(f"--kill-models: {', '.join(unknown)} have no Python stub "
                         f"(models with stubs: {', '.join(with_stubs)})")
    stub_models = itertools.cycle(args.kill_models or with_stubs)
    kills: list[Kill] = []
    warm = start + args.warmup_s
    next_kill = warm + args.kill_every
    while args.kill_every and next_kill <= start + duration - args.quiet_tail_s:
        time.sleep(max(0.0, next_kill - time.monotonic()))
        model = next(stub_models)
        kill = _kill_and_wait(serve, model, args.recovery_limit_s)
        next_kill += args.kill_every
        if kill is None:
            say(f"+{time.monotonic() - start:.0f} s: {model} has no stub to kill; skipped")
            continue
        kills.append(kill)
        say(f"+{kill.at_s - start:.0f} s: killed {kill.instance}: "
            + (f"ready again after {kill.ready_s - kill.at_s:.1f} s" if kill.ready_s
               else f"not ready after {args.recovery_limit_s:g} s"))
    records = [(lane.model, lane.kind, lane.join()) for lane in lanes]
    protocols = [lane.protocol for lane in lanes]
    end = time.monotonic()
    stop.set()
    sampler.join()
    restarts = serve.metric("triton_forge_model_restarts_total")

    figures = Figures(minutes=args.minutes, capacity_rps=round(capacity, 1),
                      rate_rps=round(rate, 1), kills_planned=bool(args.kill_every))
    for (model, kind, recs), protocol in zip(records, protocols):
        key = f"{model} {kind}" + (" grpc" if protocol == "grpc" else "")
        figures.requests[key] = figures.requests.get(key, 0) + sum(r.start_s >= warm for r in recs)
        if kind == "bad":
            answers = figures.bad_answers.setdefault(model, {})
            for code in (_status_code(r) for r in recs if r.start_s >= warm):
                answers[str(code or "none")] = answers.get(str(code or "none"), 0) + 1
    lost_ = count_lost(records, kills, configs, warm, args.timeout_s, end)
    figures.lost_outside_windows, figures.lost_to_overload = lost_.outside, lost_.overload
    figures.excused_in_windows, figures.lost_examples = lost_.excused, lost_.examples
    figures.lost_kinds = lost_.kinds
    figures.kills = [{"model": k.model, "instance": k.instance, "at_s": round(k.at_s - start, 1),
                      "ready_s": None if k.ready_s is None else round(k.ready_s - k.at_s, 2)}
                     for k in kills]
    figures.server_restarts = serve.restart_reasons()
    figures.server_log = serve.server_log
    figures.restarts = {m: n for m, n in sorted(restarts.items())
                        if n or m in {k.model for k in kills}}
    growth = rss_growth(samples, kills, args.timeout_s, warm)
    figures.rss_mb = {"first": round(growth[0], 1), "last": round(growth[1], 1),
                      "largest": round(growth[2], 1),
                      "growth": round(growth[1] - growth[0], 1)} if growth else {}
    if growth and by_role:
        first = next(roles for t, roles in by_role if t >= warm)
        last = by_role[-1][1]
        figures.rss_by_role_mb = {role: [round(first.get(role, 0.0), 1), round(mb, 1)]
                                  for role, mb in sorted(last.items())}
        figures.rss_by_minute_mb = by_minute(by_role, warm)
    figures.misses = misses(figures)
    return figures


def main(argv: list[str] | None = None) -> int:
    """Run the soak, print its figures (JSON on stdout), exit 1 when a target is missed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, required=True, help="the repository to serve")
    parser.add_argument("--minutes", type=float, default=30.0, help="soak length")
    parser.add_argument("--kill-every", type=float, default=120.0,
                        help="seconds between stub kills (round-robin over the models with stubs; "
                             "0: none, a run that measures memory and lost requests alone)")
    parser.add_argument("--kill-models", type=lambda text: [m for m in text.split(",") if m],
                        help="comma-separated models whose stubs are killed, in turn "
                             "[default: every model with a Python stub]")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="requests/s in all (default: --load x the capacity measured first)")
    parser.add_argument("--load", type=float, default=0.5, help="fraction of capacity")
    parser.add_argument("--grpc-share", type=float, default=0.25,
                        help="share of the valid requests sent over gRPC (tritonclient, through "
                             "the gRPC guard); the others and the bad ones go over HTTP")
    parser.add_argument("--capacity-s", type=float, default=20.0,
                        help="seconds of the closed-loop capacity run")
    parser.add_argument("--capacity-users", type=int, default=4, help="users per model")
    parser.add_argument("--warmup-s", type=float, default=30.0,
                        help="seconds of the soak not counted (and before the first RSS sample)")
    parser.add_argument("--timeout-s", type=float, default=10.0, help="client timeout per request")
    parser.add_argument("--recovery-limit-s", type=float, default=120.0,
                        help="how long a killed model may take to be ready again")
    parser.add_argument("--quiet-tail-s", type=float, default=30.0,
                        help="no kill in the last seconds (the last RSS sample is taken there)")
    parser.add_argument("--log", type=Path, help="tools serve's output [default: ./chaos-soak-serve-*.log]")
    parser.add_argument("--json-out", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if not (args.repository / "").is_dir():
        parser.error(f"--repository {args.repository} is not a folder")
    figures = run(args)
    text = json.dumps(asdict(figures), indent=2)
    print(text)
    if args.json_out:
        args.json_out.write_text(text + "\n", encoding="utf-8")
    for miss in figures.misses:
        print(f"CHAOS SOAK FAIL: {miss}", file=sys.stderr)
    return 1 if figures.misses else 0


if __name__ == "__main__":
    sys.exit(main())
