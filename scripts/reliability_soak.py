"""Soak and overload figures of the embedded server for the README's reliability table.

Steady load on text_embedding with per-model recovery on, RSS sampled; then capacity vs 4x overload.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.load.scenario import load_texts  # noqa: E402
from tools import load  # noqa: E402
from tools.load.meters import sample  # noqa: E402
from tools.serve import faults  # noqa: E402
from tools.serve.recovery import ModelRecovery  # noqa: E402
from tools.serve.server import EmbeddedServer  # noqa: E402

WARMUP_S = 2.0


def _failures(metrics_url: str) -> dict[str, int]:
    text = urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=10).read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith("nv_inference_request_failure{") and not line.endswith(" 0"):
            labels, value = line.rsplit(" ", 1)
            found[labels.removeprefix("nv_inference_request_failure")] = int(float(value))
    return found


def _run(server: EmbeddedServer, label: str, pacing: load.Pacing, duration_s: float) -> dict:
    """One load of JSON text requests over raw HTTP, measured after a 2 s warm-up."""
    requests = load.text_requests("text_embedding", load_texts()[:200])
    cores = load.Cores(lambda: faults.roles(server.pid, os.getpid()))
    point = load.run(requests, load.RawHttp(server.http_url, timeout_s=10), pacing,
                     warmup_s=WARMUP_S, duration_s=duration_s - WARMUP_S, meters=[cores])
    summary = point.summary
    return {
        "run": label, "sent": len(point.records), "ok": point.requests, "errors": point.errors,
        "throughput_rps": round(point.throughput, 1),
        "p99_ms": round(point.p99_ms, 1) if point.p99_ms is not None else None,
        "error_kinds": dict(list(summary.error_kinds.items())[:4]),
        "cores": point.meters["cores"],
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
                rss.append(round(sample(pids()).rss_bytes / 2**20))

        threading.Thread(target=sample_rss, daemon=True).start()
        figures["soak"] = _run(server, f"soak {args.rate:g} req/s",
                               load.OpenLoop(args.rate, max_in_flight=64), args.soak_s)
        stop.set()
        figures["soak"]["rss_mib_every_10s"] = rss
        capacity = _run(server, "capacity, 32 users", load.ClosedLoop(32), 12)
        overload = _run(server, f"{args.overload:g}x overload",
                        load.OpenLoop(args.overload * capacity["throughput_rps"],
                                      max_in_flight=256), 12)
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
