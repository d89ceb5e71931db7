"""Run tritonserver in the container and stop it when its models stop answering.

Compose restarts a container that exits (restart: unless-stopped) but not one that is merely
unhealthy, and a dead Python stub leaves Triton up with a broken model: after consecutive failed
checks (tools/serve/health.py, as the healthcheck) this stops the server and exits 1 so the
container restarts.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # /opt/triton-forge in the image
from tools import process  # noqa: E402
from tools.errors import UserInputError  # noqa: E402
from tools.serve import health  # noqa: E402


def _log(message: str) -> None:
    print(f"triton_supervisor: {message}", file=sys.stderr, flush=True)


def stop(server: subprocess.Popen, timeout_s: float) -> int:
    """SIGTERM (Triton finishes in-flight requests), then SIGKILL after ``timeout_s`` for the
    server and every process it started; returns the server's exit code."""
    survivors = process.stop(server, timeout_s, group=False)  # the server shares our group
    if survivors:
        _log(f"processes {survivors} survived SIGKILL")
    return server.returncode


def supervise(command: list[str], args: argparse.Namespace) -> int:
    """Run ``command`` until it exits, is signalled, or fails ``args.failures`` checks in a row.

    Returns:
        The server's own exit code (128 + N when signal N ended it), 1 when the watchdog
        stopped it, or 2 when the probe file is unusable (the server is not started).
    """
    try:
        probes = health.read_probes(args.probes)
    except UserInputError as exc:
        _log(str(exc))
        return 2
    server = process.start(command, new_session=False, stdin=None)
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
        problems = health.check_repository(args.url, args.repository, probes, args.timeout).problems
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
