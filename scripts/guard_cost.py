"""What the HTTP and gRPC guards cost: `tools bench --url` through and around them, interleaved.

One embedded tritonserver (no guard of its own); the HTTP guard and the gRPC guard run beside it
as `tools serve` runs them, in front of tritonserver's own ports. Each round measures every
pipeline and protocol through the guard and around it (tritonserver's port), each round starting
with the next arm, after one unrecorded run per pipeline, so drift on a shared machine hits every
arm alike; each ``--compare-http-guard FILE`` adds an arm,
another HTTP guard in front of the same server: a Python file (e.g. an older version from git)
or a C file (compiled here with ``cc``), with the guard's command line. The relays in
``scripts/relay_floor/`` are such files: the floor of any process in front of tritonserver
(C) and of one in Python, against which the guard's own work is read. Besides throughput it
reports each guard's CPU time per request (psutil), a figure the neighbours' load disturbs less.

    python scripts/guard_cost.py --repository /tmp/repo --rounds 2 --output reports/guard-cost
    python scripts/guard_cost.py --repository model_repository --protocols http --rounds 3 \
        --concurrency 8 --pipelines text_embedding_int8,text_embedding_bf16 \
        --compare-http-guard scripts/relay_floor/relay_floor.py \
        --compare-http-guard scripts/relay_floor/relay_floor.c

Prints one table (throughput per arm and round, the through/around ratio, guard CPU per
request) and writes ``guard_cost.json`` in ``--output``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools import net  # noqa: E402
from tools import native_build  # noqa: E402
from tools.serve import guards  # noqa: E402
from tools.serve.http_guard import GuardLimits  # noqa: E402
from tools.serve.server import EmbeddedServer  # noqa: E402


def _bench(args: argparse.Namespace, http: str, grpc: str, pipeline: str, protocol: str,
           out: Path) -> dict:
    """One `tools bench --url` point; its served figures."""
    command = [sys.executable, "-m", "tools.cli", "bench", "--repository", str(args.repository),
               "--url", http, "--grpc-url", grpc, "--scenario", pipeline,
               "--protocol", protocol, "--concurrency", str(args.concurrency),
               "--batch-sizes", "1", "--min-seconds", "0", "--no-half-load",
               "--duration", str(args.duration), "--warmup", str(args.warmup),
               "--output", str(out)] + (["--data", str(args.texts)] if args.texts else [])
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL,
                   stderr=open(out.with_suffix(".log"), "w"), timeout=600)
    served = json.loads((out / "bench.json").read_text())["served"][0]
    return {"command": " ".join(command[1:]), **served}


def _cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and of its live children (the HTTP guard's native front)."""
    process = psutil.Process(pid)
    total = 0.0
    for each in [process, *process.children(recursive=True)]:
        try:
            times = each.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repository", type=Path, required=True)
    parser.add_argument("--pipelines", default="text_embedding_int8,text_embedding")
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--texts", type=Path,
                        help="Texts for `tools bench` (default: its own; fewer make its "
                        "in-process step, which this script does not use, shorter).")
    parser.add_argument("--event-loop", choices=("auto", "uvloop", "asyncio"), default="auto",
                        help="The HTTP guard's event loop.")
    parser.add_argument("--compare-http-guard", type=Path, action="append", default=[],
                        help="Another HTTP guard (a .py file, or a .c file compiled here) with "
                        "the guard's command line, measured as one more arm; repeatable.")
    parser.add_argument("--output", type=Path, default=ROOT / "reports" / "guard-cost")
    args = parser.parse_args()
    names = [path.name for path in args.compare_http_guard]
    if len(set(names)) != len(names) or {"through", "around"} & set(names):
        parser.error(f"--compare-http-guard files name their arms, so they need distinct names "
                     f"other than 'through' and 'around' (given: {', '.join(names)})")
    args.output.mkdir(parents=True, exist_ok=True)

    server = EmbeddedServer(args.repository, exit_timeout_s=5,
                            log_path=args.output / "tritonserver.log")
    server.start(timeout_s=300)
    pool = guards.Guards()
    try:
        http_port, grpc_port, *other_ports = net.free_ports(2 + len(args.compare_http_guard))
        triton_http = int(server.http_url.rpartition(":")[2])
        triton_grpc = int(server.grpc_url.rpartition(":")[2])
        limits = GuardLimits(16 * 2**20, 64 * 2**20)
        http_guard = guards.http_guard(limits, http_port, triton_http, server.pid)
        http_guard.command += ["--event-loop", args.event_loop]
        grpc_guard = guards.grpc_guard(16 * 2**20, grpc_port, triton_grpc, server.pid, triton_http)
        arms = {"through": (http_guard, grpc_guard), "around": (None, None)}
        wanted = [http_guard, grpc_guard]
        compared = {}  # arm name -> its guard
        for path, port in zip(args.compare_http_guard, other_ports):
            other = guards.GuardProcess(f"the compared HTTP guard {path.name}", _command(
                path) + ["--listen-port", str(port), "--upstream-port", str(triton_http),
                                "--watch-pid", str(server.pid)], port)
            compared[path.name] = other
            arms[path.name] = (other, grpc_guard)
            wanted.append(other)
        pool.start(wanted, args.output / "guards.log")
        pids = {name: _guard_pid(guard) for name, guard in
                (("http", http_guard), ("grpc", grpc_guard), *compared.items())}
        runs = []
        # Not recorded: each pipeline once around the guards first. The first run on a fresh
        # server was the slowest of its round in every run of 2026-12-05 (0.84-0.93 of the next
        # arm), and it was always the same arm.
        for pipeline in args.pipelines.split(","):
            for protocol in args.protocols.split(","):
                _bench(args, server.http_url, server.grpc_url, pipeline, protocol,
                       args.output / f"warm-{pipeline}-{protocol}")
        for round_ in range(1, args.rounds + 1):
            for pipeline in args.pipelines.split(","):
                for protocol in args.protocols.split(","):
                    # each round starts one arm later: no arm always runs first (or last)
                    order = list(arms.items())
                    shift = (round_ - 1) % len(order)
                    for arm, (h, g) in order[shift:] + order[:shift]:
                        if arm in compared and protocol != "http":
                            continue
                        http = f"{net.LOOPBACK}:{h.listen_port}" if h else server.http_url
                        grpc = f"{net.LOOPBACK}:{g.listen_port}" if g else server.grpc_url
                        guard_pid = None
                        if arm != "around":
                            guard_pid = pids[arm if arm in compared else protocol]
                        before = _cpu_s(guard_pid) if guard_pid else 0.0
                        triton_before = _cpu_s(server.pid)
                        out = args.output / f"r{round_}-{pipeline}-{protocol}-{arm}"
                        served = _bench(args, http, grpc, pipeline, protocol, out)
                        total = served["requests"] + served["errors"]
                        run = {"round": round_, "pipeline": pipeline, "protocol": protocol,
                               "arm": arm, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                               "load1": os.getloadavg()[0],
                               "triton_cpu_s": _cpu_s(server.pid) - triton_before, **served}
                        if guard_pid:
                            # the whole run (warm-up too) over the requests measured: upper bound
                            run["guard_cpu_s"] = _cpu_s(guard_pid) - before
                            run["guard_cpu_us_per_request"] = (
                                1e6 * run["guard_cpu_s"] / max(total, 1)
                                * args.duration / (args.duration + args.warmup))
                        runs.append(run)
                        print(f"round {round_} {pipeline} {protocol} {arm}: "
                              f"{served['throughput']:.1f} req/s, P50 {served['p50_ms']:.1f} ms, "
                              f"P99 {served['p99_ms']:.1f} ms, errors {served['errors']}"
                              + (f", guard {run['guard_cpu_us_per_request']:.0f} us CPU/request"
                                 if guard_pid else "")
                              + f" (load {run['load1']:.1f})", flush=True)
    finally:
        pool.stop()
        server.stop()
    summary = _summary(runs)
    print(summary)
    (args.output / "guard_cost.json").write_text(json.dumps(
        {"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs, "summary": summary},
        indent=2) + "\n")
    return 0


def _command(path: Path) -> list[str]:
    """How to run the compared guard ``path``: Python with this interpreter, C once compiled
    (``tools/native_build.py``: ``cc -O2`` into the cache, on first use)."""
    if path.suffix != ".c":
        return [sys.executable, str(path)]
    try:
        return [str(native_build.compiled(path))]
    except native_build.NotCompiled as exc:
        raise SystemExit(f"cannot run {path}: {exc}") from None


def _guard_pid(guard: guards.GuardProcess) -> int:
    return guard._proc.pid  # noqa: SLF001 (this script measures the process itself)


def _summary(runs: list[dict]) -> str:
    lines = ["| pipeline | protocol | arm | req/s per round | mean | / around "
             "| median of the rounds' / around | guard CPU us/req |",
             "|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["pipeline"], r["protocol"]) for r in runs}, key=lambda k: (k[0], k[1]))
    for pipeline, protocol in keys:
        mine = [r for r in runs if (r["pipeline"], r["protocol"]) == (pipeline, protocol)]
        means = {}
        for arm in dict.fromkeys(r["arm"] for r in mine):
            values = [r["throughput"] for r in mine if r["arm"] == arm]
            means[arm] = sum(values) / len(values)
        for arm, mean in means.items():
            values = [r["throughput"] for r in mine if r["arm"] == arm]
            cpu = [r["guard_cpu_us_per_request"] for r in mine
                   if r["arm"] == arm and "guard_cpu_us_per_request" in r]
            around = {r["round"]: r["throughput"] for r in mine if r["arm"] == "around"}
            paired = [r["throughput"] / around[r["round"]] for r in mine
                      if r["arm"] == arm and around.get(r["round"])]
            lines.append(f"| {pipeline} | {protocol} | {arm} | "
                         f"{' / '.join(f'{v:.1f}' for v in values)} | {mean:.1f} | "
                         f"{mean / means['around']:.3f} | "
                         f"{statistics.median(paired):.3f} | "
                         f"{' / '.join(f'{c:.0f}' for c in cpu) or '-'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
