"""Run tritonserver in the container and stop it when its models stop answering.

Compose restarts a container that exits (restart: unless-stopped) but not one that is merely
unhealthy, and a dead Python stub leaves Triton up with a broken model: after consecutive failed
checks (docker/healthcheck.py) this stops the server and exits 1 so the container restarts.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import healthcheck  # docker/healthcheck.py, next to this file


def _log(message: str) -> None:
    print(f"triton_supervisor: {message}", file=sys.stderr, flush=True)


def stop(server: subprocess.Popen, timeout_s: float) -> int:
    """SIGTERM (Triton finishes in-flight requests), then SIGKILL after ``timeout_s``."""
    server.terminate()
    try:
        return server.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        server.kill()
        return server.wait()


def supervise(command: list[str], args: argparse.Namespace) -> int:
    """Run ``command`` until it exits, is signalled, or fails ``args.failures`` checks in a row.

    Returns:
        The server's own exit code (128 + N when signal N ended it), or 1 when the watchdog
        stopped it.
    """
    probes = json.loads(args.probes.read_text()) if args.probes else {}
    server = subprocess.Popen(command)
    stopping = False

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        server.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    started, healthy_once, failures = time.monotonic(), False, 0
    while True:
        try:
            code = server.wait(timeout=args.interval)
            return code if code >= 0 else 128 - code
        except subprocess.TimeoutExpired:
            pass
        if stopping:
            continue
        problems = healthcheck.check(args.url, args.repository, probes, args.timeout)
        if not problems:
            if not healthy_once:
                _log(f"all models of {args.repository} ready; watching every {args.interval:g}s")
            healthy_once, failures = True, 0
            continue
        if not healthy_once:
            if time.monotonic() - started > args.start_timeout:
                _log(f"not healthy after {args.start_timeout:g}s: {'; '.join(problems)}")
                stop(server, args.stop_timeout)
                return 1
            continue
        failures += 1
        _log(f"check {failures}/{args.failures} failed: {'; '.join(problems)}")
        if failures >= args.failures:
            _log("stopping tritonserver so the container restarts")
            stop(server, args.stop_timeout)
            return 1


def main(argv: list[str] | None = None) -> int:
    """``triton_supervisor.py [options] -- tritonserver ...``"""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--repository", type=Path, default=Path("/models"))
    parser.add_argument("--probes", type=Path, help="JSON: model name -> KServe v2 JSON request")
    parser.add_argument("--interval", type=float, default=15.0, help="seconds between checks")
    parser.add_argument("--failures", type=int, default=3, help="failed checks in a row to act")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    parser.add_argument("--start-timeout", type=float, default=900.0,
                        help="seconds the server may take to become healthy the first time")
    parser.add_argument("--stop-timeout", type=float, default=45.0)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- tritonserver ...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the server command after --")
    return supervise(command, args)


if __name__ == "__main__":
    sys.exit(main())
