"""The front against the guards it replaced and against no front, side by side in one run.

Each round starts ``tools serve`` three times on the same built repository, one arm after the
other in an order that rotates by round: tritonserver alone (``--no-front``), the HAProxy front
(this checkout), and the home-made guards of an earlier checkout (``--guard-checkout``, e.g. a
worktree of fdc1fac, the last commit that had them). In each arm: HTTP and gRPC throughput of
text_embedding at c=32 (tritonclient asyncio clients, the shipped texts), then overload: capacity
in a closed loop of 32 users on tritonserver's own port, an open loop at 4x it on the public
port (the C open-loop sender), goodput and accepted P99. Prints a row per arm and round, with
the cores tritonserver (and its stubs), the front or the guards (``tools serve``'s processes
outside tritonserver) and the load generator used during the 4x point.

    python benchmarks/front_vs_guard.py --repository model_repository \\
        --guard-checkout /path/to/a/checkout/at/fdc1fac --rounds 3
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tools import net, paths  # noqa: E402
from tools.bench.served import measure_served  # noqa: E402
from tools.serve.overload import run_point, scenario_bodies  # noqa: E402

MODEL = "text_embedding"
ARMS = ("none", "front", "guard")


def _serve(arm: str, repository: Path, guard_checkout: Path | None, log: Path) -> tuple[subprocess.Popen, dict[str, str]]:
    """``tools serve`` for ``arm`` on free ports; its endpoints once it printed them."""
    http, grpc, metrics, status = net.free_ports(4)
    command = [sys.executable, "-m", "tools.cli", "serve", "--repository", str(repository),
               "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
               "--forge-metrics-port", str(status), "--exit-timeout", "5"]
    env = dict(os.environ)
    if arm == "none":
        command.append("--no-front")
    elif arm == "guard":
        env["PYTHONPATH"] = str(guard_checkout)  # its tools package: guards on by default
    out = log.open("w")
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=out, text=True,
                            cwd=guard_checkout if arm == "guard" else ROOT)
    found = {"http": f"127.0.0.1:{http}", "grpc": f"127.0.0.1:{grpc}"}
    for line in proc.stdout:
        own = re.search(r"tritonserver's own HTTP (?:on )?(127\.0\.0\.1:\d+)", line)
        if own:
            found["own_http"] = own[1]
        if line.startswith("status "):
            break
    else:
        raise SystemExit(f"{arm}: tools serve ended before it served (log: {log})")
    found.setdefault("own_http", found["http"])
    return proc, found


def _triton_pid(serve: subprocess.Popen) -> int:
    import psutil

    for child in psutil.Process(serve.pid).children(recursive=True):
        if child.name() == "tritonserver":
            return child.pid
    raise SystemExit("no tritonserver under tools serve")


def _side_cpu_s(serve_pid: int, triton_pid: int) -> float:
    """CPU seconds so far of ``tools serve`` and its processes outside tritonserver's tree: the
    front (HAProxy and its controller) or the guards (in ``tools serve``), and the idle rest."""
    import psutil

    try:
        serve = psutil.Process(serve_pid)
        inside = {triton_pid, *(c.pid for c in psutil.Process(triton_pid).children(recursive=True))}
        tree = [serve, *(c for c in serve.children(recursive=True) if c.pid not in inside)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for proc in tree:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--guard-checkout", type=Path, default=None,
                        help="a checkout with the guards (fdc1fac); without it that arm is left out")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per point")
    parser.add_argument("--warmup", type=float, default=3.0)
    args = parser.parse_args(argv)
    args.repository = args.repository.resolve()  # the guard arm runs in its own checkout
    arms = [a for a in ARMS if a != "guard" or args.guard_checkout]
    texts = [t for t in paths.TEXTS_FILE.read_text().splitlines() if t.strip()]
    bodies = scenario_bodies(paths.SPEC_FILE, MODEL, 200)
    logs = Path("reports") / "front_vs_guard"
    logs.mkdir(parents=True, exist_ok=True)
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; {MODEL}, c=32, "
          f"overload at 4x", flush=True)
    print("| round | arm | HTTP req/s c=32 | gRPC req/s c=32 | capacity req/s | 4x accepted req/s "
          "| goodput | accepted P99 ms | refused | tritonserver cores | front or guard cores "
          "| load generator cores |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for round_index in range(args.rounds):
        order = arms[round_index % len(arms):] + arms[:round_index % len(arms)]
        for arm in order:
            serve, found = _serve(arm, args.repository, args.guard_checkout,
                                  logs / f"{round_index}-{arm}.log")
            try:
                pid = _triton_pid(serve)
                http = measure_served("http", found["http"], found["own_http"], texts, 32,
                                      warmup_s=args.warmup, duration_s=args.duration)
                grpc = measure_served("grpc", found["grpc"], found["own_http"], texts, 32,
                                      warmup_s=args.warmup, duration_s=args.duration)
                time.sleep(2)
                capacity = run_point(found["own_http"], MODEL, bodies, pid, [MODEL], "capacity",
                                     users=32, duration_s=12, warmup_s=3)
                time.sleep(2)  # what the capacity point left queued drains
                side, began = _side_cpu_s(serve.pid, pid), time.monotonic()
                over = run_point(found["http"], MODEL, bodies, pid, [MODEL], "4x",
                                 rate=4 * capacity.accepted_rps, duration_s=12, warmup_s=3)
                side = (_side_cpu_s(serve.pid, pid) - side) / (time.monotonic() - began)
                server = sum(v for k, v in over.cores.items()
                             if k == "tritonserver" or k.startswith("stubs "))
                goodput = over.accepted_rps / max(capacity.accepted_rps, 1e-9)
                print(f"| {round_index + 1} | {arm} | {http.throughput:.1f} | {grpc.throughput:.1f} "
                      f"| {capacity.accepted_rps:.1f} | {over.accepted_rps:.1f} | "
                      f"{goodput:.2f} | {over.p99_ms or 0:.0f} | "
                      f"{sum(over.refused.values())} | {server:.2f} | {side:.2f} | "
                      f"{over.cores.get('load generator', 0.0):.2f} |", flush=True)
            finally:
                serve.send_signal(signal.SIGINT)
                try:
                    serve.wait(60)
                except subprocess.TimeoutExpired:
                    serve.kill()
                    serve.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
