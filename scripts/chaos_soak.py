"""Chaos soak: text, image and bad requests at half capacity through ``tools serve`` while a
Python stub is killed every 2 minutes; exits 1 when a target is missed.

    python scripts/chaos_soak.py --repository model_repository            # 30 minutes
    python scripts/chaos_soak.py --repository R --minutes 1 --kill-every 20 --warmup-s 10

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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.load.scenario import load_images, load_texts  # noqa: E402
from tools import process  # noqa: E402
from tools.serve import faults, health  # noqa: E402
from tools.serve.recovery import instance_model  # noqa: E402
from tools.stats import Record, end_s  # noqa: E402

RSS_TARGET_MB = 50.0
BAD_SHARE = 0.10
_OVERSIZE_TEXT_BYTES = 256 * 1024
_RSS_EVERY_S = 5.0
_MAX_IDLE_S = 15.0


# ---- the seam to the load code: the only place that touches it


@dataclass
class _RawHttpLoad(faults.HttpLoad):
    """``faults.HttpLoad`` sending ready-made requests (head and body), such as binary-tensor
    bodies, which it cannot build itself."""

    raw: Sequence[bytes] = ()

    def _requests(self) -> list[bytes]:
        return list(self.raw)


class Lane:
    """One stream of requests to one model, run by the project's load code in a thread.

    Today ``tools.serve.faults.HttpLoad`` (keep-alive, open loop timed from the scheduled send);
    when the ``tools/load`` engine lands, its raw-bytes HTTP sender replaces it here and
    nowhere else.

    Args:
        url: ``host:port`` of the HTTP endpoint.
        model: The model the requests go to (for the kill windows).
        kind: ``valid`` or ``bad``.
        requests: Complete HTTP/1.1 requests, sent in turn.
        timeout_s: Client timeout per request.
    """

    def __init__(self, url: str, model: str, kind: str, requests: Sequence[bytes],
                 timeout_s: float) -> None:
        self.model, self.kind, self._requests = model, kind, list(requests)
        self._url, self._timeout_s = url, timeout_s
        self._load: _RawHttpLoad | None = None

    def start(self, *, rate: float = 0.0, users: int = 0, duration_s: float) -> Lane:
        """Send for ``duration_s``: open loop at ``rate``/s, or closed loop with ``users``."""
        self._load = _RawHttpLoad(self._url, self.model, (), self._timeout_s, raw=self._requests)
        options: dict[str, Any] = {"users": users} if users else {
            "rate": rate, "connections": lane_connections(rate, self._timeout_s)}
        self._load.start(duration_s=duration_s, **options)
        return self

    def join(self) -> list[Record]:
        """Wait for the planned duration (and the requests in flight); the records."""
        assert self._load is not None
        return list(self._load.join())


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


def _binary_request(host: str, model: str, inputs: list[tuple[str, list[int], bytes]]) -> bytes:
    tensors = []
    for name, shape, value in inputs:
        tensor = httpclient.InferInput(name, shape, "BYTES")
        tensor.set_data_from_numpy(np.full(shape, value, dtype=np.object_), binary_data=True)
        tensors.append(tensor)
    body, json_size = httpclient.InferenceServerClient.generate_request_body(tensors)
    head = (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {host}\r\n"
            "Content-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {json_size}\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


def _json_request(host: str, model: str, inputs: Iterable[tuple[str, list[int], str, list]]) -> bytes:
    body = {"inputs": [{"name": n, "shape": s, "datatype": d, "data": v} for n, s, d, v in inputs]}
    return faults.infer_request(host, model, body)


def valid_requests(host: str, model: str, config: Mapping[str, Any]) -> tuple[str, list[bytes]]:
    """(kind, requests) for ``model``: ``image``, ``text`` or ``tensor``."""
    strings = _string_inputs(config)
    if strings and any("IMAGE" in i["name"].upper() for i in strings):
        return "image", [
            _binary_request(host, model, [(i["name"], _shape(config, i["dims"]), data)
                                          for i in strings])
            for _, data in load_images()]
    if strings:
        texts = load_texts()[:200]
        return "text", [
            _json_request(host, model, [(i["name"], _shape(config, i["dims"]), "BYTES",
                                         [texts[(n + k) % len(texts)]])
                                        for k, i in enumerate(strings)])
            for n in range(len(texts))]
    return "tensor", [faults.infer_request(host, model, health.probe_request(config))]


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
        self.pid, self.starts, self.http, self.status_url = 0, 0, "", ""
        announced = threading.Event()

        def follow() -> None:
            for line in self.proc.stdout:
                if m := re.match(r"^tritonserver ready: pid (\d+), log (.+)$", line.rstrip()):
                    self.pid, self.starts = int(m.group(1)), self.starts + 1
                    if self.starts == 1:
                        threading.Thread(target=self._keep_log, args=(Path(m.group(2)),),
                                         daemon=True).start()
                elif m := re.match(r"^http\s+(\S+)$", line.strip()):
                    self.http = m.group(1)
                elif m := re.match(r"^status\s+(\S+)/status,", line):
                    self.status_url = m.group(1)
                    announced.set()

        threading.Thread(target=follow, daemon=True).start()
        if not announced.wait(start_timeout_s):
            self.stop()
            raise SystemExit(f"tools serve not ready after {start_timeout_s:g} s "
                             f"(its log: {log_path})")

    def _keep_log(self, server_log: Path) -> None:
        """Copy tritonserver's log next to ``log_path`` as it grows: a restarted server starts
        its log anew, and the crash that made it restart would be lost."""
        kept, offset = self.log_path.with_suffix(".tritonserver.log").open("ab"), 0
        while self.proc.poll() is None:
            try:
                size = server_log.stat().st_size
                if size < offset:  # started anew
                    kept.write(b"\n---- tritonserver restarted: a new log ----\n")
                    offset = 0
                with server_log.open("rb") as log:
                    log.seek(offset)
                    chunk = log.read()
                kept.write(chunk)
                kept.flush()
                offset += len(chunk)
            except OSError:
                pass
            time.sleep(0.2)
        kept.close()

    def restart_reasons(self) -> list[str]:
        """Why ``tools serve`` restarted tritonserver, one line each (from its log)."""
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
        """RSS in MB by role: ``tritonserver``, ``stubs <model>`` (its instances summed), and
        ``others`` (what else tools serve runs: the HTTP guard)."""
        stubs = process.stub_processes(self.pid)
        roles: dict[str, list[int]] = {"tritonserver": [self.pid]}
        for instance, pid in stubs.items():
            roles.setdefault(f"stubs {instance_model(instance)}", []).append(pid)
        roles["others"] = [p.pid for p in process.descendants(self.proc.pid)
                           if p.pid != self.pid and p.pid not in stubs.values()]
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
    requests: dict[str, int] = field(default_factory=dict)
    bad_answers: dict[str, dict[str, int]] = field(default_factory=dict)
    lost_outside_windows: int = 0
    lost_examples: list[str] = field(default_factory=list)
    excused_in_windows: int = 0
    kills: list[dict] = field(default_factory=list)
    server_restarts: list[str] = field(default_factory=list)
    restarts: dict[str, float] = field(default_factory=dict)
    rss_mb: dict[str, float] = field(default_factory=dict)
    rss_by_role_mb: dict[str, list[float]] = field(default_factory=dict)  # [after warm-up, end]
    lost_kinds: dict[str, int] = field(default_factory=dict)
    misses: list[str] = field(default_factory=list)


def _status_code(record: Record) -> int | None:
    if record.ok:
        return 200
    m = re.match(r"HTTP (\d{3})", record.error)
    return int(m.group(1)) if m else None


def lost(record: Record, kind: str) -> bool:
    """A valid request not answered 200; a bad one not answered at all (Triton 2.51 answers
    some bad requests with 500, e.g. malformed JSON: an answer, not a loss)."""
    if kind == "valid":
        return not record.ok
    return _status_code(record) is None


def count_lost(lanes: Iterable[tuple[str, str, list[Record]]], kills: Sequence[Kill],
               configs: Mapping[str, Mapping[str, Any]], counted_from_s: float,
               timeout_s: float, end_s_: float) -> tuple[int, int, list[str], dict[str, int]]:
    """(lost outside the kill windows, excused inside them, a few lost examples, how many of
    each kind of error were lost outside) of lanes given as (model, kind, records)."""
    windows = [(affected(k.model, configs), *k.window(timeout_s, end_s_)) for k in kills]
    outside, excused, examples, kinds = 0, 0, [], {}
    for model, kind, records in lanes:
        for record in records:
            if record.start_s < counted_from_s or not lost(record, kind):
                continue
            if any(model in models and record.start_s <= stop and end_s(record) >= start
                   for models, start, stop in windows):
                excused += 1
                continue
            outside += 1
            what = f"{model} ({kind}): " + re.sub(r"\d+", "N", record.error)[:90]
            kinds[what] = kinds.get(what, 0) + 1
            if len(examples) < 5:
                examples.append(f"{model} ({kind}) at +{record.start_s - counted_from_s:.1f} s: "
                                f"{record.error}")
    return outside, excused, examples, dict(sorted(kinds.items(), key=lambda kv: -kv[1]))


def rss_growth(samples: Sequence[tuple[float, float]], kills: Sequence[Kill], timeout_s: float,
               from_s: float) -> tuple[float, float, float] | None:
    """(first, last, largest) RSS sample at or after ``from_s`` outside every kill window."""
    quiet = [mb for t, mb in samples if t >= from_s and not any(
        k.at_s <= t <= k.window(timeout_s, t)[1] for k in kills)]
    return (quiet[0], quiet[-1], max(quiet)) if len(quiet) >= 2 else None


def misses(figures: Figures) -> list[str]:
    """The targets ``figures`` misses, one line each."""
    found = []
    if figures.server_restarts:
        found.append(f"tritonserver restarted {len(figures.server_restarts)} times: "
                     f"{figures.server_restarts[0]}")
    if figures.lost_outside_windows:
        found.append(f"{figures.lost_outside_windows} requests lost outside the kill windows "
                     f"(target 0), e.g. {figures.lost_examples[:2]}")
    growth = figures.rss_mb.get("growth")
    if growth is None:
        found.append("RSS growth not measured (fewer than 2 samples outside the kill windows)")
    elif growth >= RSS_TARGET_MB:
        found.append(f"RSS of tritonserver + stubs grew {growth:.1f} MB (target < {RSS_TARGET_MB:g})")
    killed: dict[str, int] = {}
    for kill in figures.kills:
        killed[kill["model"]] = killed.get(kill["model"], 0) + 1
        if kill["ready_s"] is None:
            found.append(f"model '{kill['model']}' was not ready again after its stub was killed")
    for model in sorted(set(killed) | {m for m, n in figures.restarts.items() if n}):
        count, seen = killed.get(model, 0), figures.restarts.get(model, 0)
        if seen != count:
            found.append(f"model '{model}': {count} kills but {seen:g} restarts in the metrics")
    if not figures.kills:
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
    valid = {m: valid_requests(serve.http, m, configs[m]) for m in entries}
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    say(f"chaos soak on {args.repository}: entry models "
        + ", ".join(f"{m} ({kind})" for m, (kind, _) in valid.items()))

    if args.rate:
        capacity, shares = 0.0, {m: 1 / len(entries) for m in entries}
    else:
        lanes = [Lane(serve.http, m, "valid", r, args.timeout_s).start(
            users=args.capacity_users, duration_s=args.capacity_s) for m, (_, r) in valid.items()]
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
    lanes = [Lane(serve.http, m, "valid", r, args.timeout_s).start(
        rate=rate * (1 - BAD_SHARE) * shares[m], duration_s=duration) for m, (_, r) in valid.items()]
    lanes += [Lane(serve.http, m, "bad", bad_requests(serve.http, m, configs[m]),
                   args.timeout_s).start(rate=rate * BAD_SHARE / len(entries), duration_s=duration)
              for m in entries]
    say(f"soak: {rate:.1f} req/s for {args.minutes:g} min ({BAD_SHARE:.0%} bad requests); "
        f"a stub killed every {args.kill_every:g} s")

    samples: list[tuple[float, float]] = []  # (time, tritonserver + stubs)
    by_role: list[tuple[float, dict[str, float]]] = []
    stop = threading.Event()

    def sample_rss() -> None:
        while not stop.is_set():
            roles, now = serve.rss_mb(), time.monotonic()
            samples.append((now, sum(mb for role, mb in roles.items() if role != "others")))
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
    while next_kill <= start + duration - args.quiet_tail_s:
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
    end = time.monotonic()
    stop.set()
    sampler.join()
    restarts = serve.metric("triton_forge_model_restarts_total")

    figures = Figures(minutes=args.minutes, capacity_rps=round(capacity, 1), rate_rps=round(rate, 1))
    for model, kind, recs in records:
        key = f"{model} {kind}"
        figures.requests[key] = figures.requests.get(key, 0) + sum(r.start_s >= warm for r in recs)
        if kind == "bad":
            answers = figures.bad_answers.setdefault(model, {})
            for code in (_status_code(r) for r in recs if r.start_s >= warm):
                answers[str(code or "none")] = answers.get(str(code or "none"), 0) + 1
    (figures.lost_outside_windows, figures.excused_in_windows, figures.lost_examples,
     figures.lost_kinds) = count_lost(records, kills, configs, warm, args.timeout_s, end)
    figures.kills = [{"model": k.model, "instance": k.instance, "at_s": round(k.at_s - start, 1),
                      "ready_s": None if k.ready_s is None else round(k.ready_s - k.at_s, 2)}
                     for k in kills]
    figures.server_restarts = serve.restart_reasons()
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
    figures.misses = misses(figures)
    return figures


def main(argv: list[str] | None = None) -> int:
    """Run the soak, print its figures (JSON on stdout), exit 1 when a target is missed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, required=True, help="the repository to serve")
    parser.add_argument("--minutes", type=float, default=30.0, help="soak length")
    parser.add_argument("--kill-every", type=float, default=120.0,
                        help="seconds between stub kills (round-robin over the models with stubs)")
    parser.add_argument("--kill-models", type=lambda text: [m for m in text.split(",") if m],
                        help="comma-separated models whose stubs are killed, in turn "
                             "[default: every model with a Python stub]")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="requests/s in all (default: --load x the capacity measured first)")
    parser.add_argument("--load", type=float, default=0.5, help="fraction of capacity")
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
