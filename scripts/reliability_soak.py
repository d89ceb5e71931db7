"""Soak and overload figures of the embedded server for the README's reliability table.

Steady load on text_embedding with per-model recovery on, RSS sampled; then capacity vs 4x overload.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from loadtests.scenarios import load_texts  # noqa: E402
from tools.serve import faults  # noqa: E402
from tools.serve.recovery import ModelRecovery  # noqa: E402
from tools.serve.server import EmbeddedServer  # noqa: E402
from tools.stats import Window, summarize  # noqa: E402


def _bodies() -> list[dict]:
    return [{"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": [t]}]}
            for t in load_texts()[:200]]


def _failures(metrics_url: str) -> dict[str, int]:
    text = urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=10).read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith("nv_inference_request_failure{") and not line.endswith(" 0"):
            labels, value = line.rsplit(" ", 1)
            found[labels.removeprefix("nv_inference_request_failure")] = int(float(value))
    return found


def _run(server: EmbeddedServer, label: str, **load: float) -> dict:
    roles = faults.roles(server.pid, os.getpid())
    before = {k: faults.sample(v) for k, v in roles.items()}
    http = faults.HttpLoad(server.http_url, "text_embedding", _bodies(), timeout_s=10)
    start = time.monotonic()
    http.run(**load)
    seconds = time.monotonic() - start
    after = {k: faults.sample(v) for k, v in roles.items()}
    summary = summarize(http.records, Window(start + 2, start + load["duration_s"]))
    return {
        "run": label, "sent": len(http.records), "ok": summary.ok, "errors": summary.errors,
        "throughput_rps": round(summary.ok / summary.window.length_s, 1),
        "p99_ms": round(summary.latency.p99_ms, 1) if summary.latency else None,
        "error_kinds": dict(list(summary.error_kinds.items())[:4]),
        "cores": faults.cpu_share(before, after, seconds),
    }


def main(argv: list[str] | None = None) -> int:
    """Print one JSON object of figures; exit 1 when the soak saw an error."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repository", type=Path, required=True)
    parser.add_argument("--soak-s", type=float, default=300.0)
    parser.add_argument("--rate", type=float, default=100.0, help="soak requests/s (open loop)")
    parser.add_argument("--overload", type=float, default=4.0, help="x capacity")
    args = parser.parse_args(argv)
    figures: dict = {}
    with EmbeddedServer(args.repository, exit_timeout_s=10) as server:
        recovery, events, rss = ModelRecovery(server.control), [], []
        watcher = threading.Thread(target=lambda: _watch(server, recovery, events), daemon=True)
        watcher.start()
        pids = lambda: [server.pid, *server.control.stub_processes().values()]  # noqa: E731
        stop = threading.Event()

        def sample_rss() -> None:
            while not stop.wait(10):
                rss.append(round(faults.sample(pids()).rss_bytes / 2**20))

        threading.Thread(target=sample_rss, daemon=True).start()
        figures["soak"] = _run(server, f"soak {args.rate:g} req/s", rate=args.rate,
                               duration_s=args.soak_s, connections=64)
        stop.set()
        figures["soak"]["rss_mib_every_10s"] = rss
        capacity = _run(server, "capacity, 32 users", users=32, duration_s=12)
        overload = _run(server, f"{args.overload:g}x overload", duration_s=12, connections=256,
                        rate=args.overload * capacity["throughput_rps"])
        figures["capacity"], figures["overload"] = capacity, overload
        figures["goodput_ratio"] = round(overload["throughput_rps"]
                                         / max(capacity["throughput_rps"], 1e-9), 2)
        figures["triton_failures"] = _failures(server.metrics_url)
        figures["recovery_events"] = [e.describe() for e in events]
    print(json.dumps(figures, indent=2))
    return 0 if figures["soak"]["errors"] == 0 else 1


def _watch(server: EmbeddedServer, recovery: ModelRecovery, events: list) -> None:
    try:
        server.watch(recovery.stubs, recovery=recovery, on_event=events.append)
    except Exception:  # noqa: BLE001 - the server was stopped
        pass


if __name__ == "__main__":
    sys.exit(main())
