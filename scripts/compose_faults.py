"""Faults in the running compose stack (scripts/compose-smoke.sh up first), under load from the host.

  python scripts/compose_faults.py kill   kill tritonserver inside the triton container mid-load;
                                          report downtime, failed requests, time back to healthy
  python scripts/compose_faults.py down   `compose-smoke.sh down` mid-load; report whether the
                                          requests in flight when it started finished

Load: USERS closed-loop HTTP users sending text_embedding (the load engine's raw HTTP sender),
bounded by --duration. Loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tools import load  # noqa: E402
from tools.stats import end_s  # noqa: E402

URL = "127.0.0.1:8000"
TEXT = "a cat sat on the mat"


def _engine() -> str:
    return os.environ.get("ENGINE") or ("podman" if subprocess.run(
        ["docker", "info"], capture_output=True).returncode else "docker")


def _triton_id(engine: str) -> str:
    return subprocess.run(
        [engine, "ps", "-q", "--filter", "label=com.docker.compose.project=triton-forge",
         "--filter", "label=com.docker.compose.service=triton"],
        capture_output=True, text=True, check=True).stdout.split()[0]


KILL_TRITONSERVER = """
import os, signal
pids = [int(p) for p in os.listdir("/proc") if p.isdigit()
        and open(f"/proc/{p}/comm").read().strip() == "tritonserver"]
assert pids, "no tritonserver process"
for pid in pids:
    os.kill(pid, signal.SIGKILL)
print("killed", pids)
"""


def _must_embed(body: bytes) -> None:
    if b"EMBEDDING" not in body:
        raise ValueError(f"no EMBEDDING in the answer: {body[:120]!r}")


def start_load(users: int, duration_s: float) -> load.Background:
    """USERS closed-loop raw-HTTP users on text_embedding (a failed user pauses 0.2 s)."""
    requests = load.text_requests("text_embedding", [TEXT])
    sender = load.RawHttp(URL, timeout_s=10, check=_must_embed)
    return load.Background(requests, sender, load.ClosedLoop(users, pause_after_error_s=0.2),
                           duration_s=duration_s).start()


def kill(args: argparse.Namespace) -> dict:
    engine = _engine()
    cid = _triton_id(engine)
    running = start_load(args.users, args.duration)
    time.sleep(10)
    t_kill = time.monotonic()
    # The images have no procps: find tritonserver through /proc with the image's python3.
    subprocess.run([engine, "exec", cid, "python3", "-c", KILL_TRITONSERVER], check=True)
    inspect = f"{engine} inspect --format '{{{{.RestartCount}}}} {{{{.State.Health.Status}}}}' {cid}"
    check = f"podman healthcheck run {cid} >/dev/null 2>&1; " if engine == "podman" else ""
    restarts0 = int(subprocess.run(["bash", "-c", inspect], capture_output=True, text=True).stdout.split()[0])
    healthy_at, status = None, []
    while time.monotonic() - t_kill < args.duration - 15:
        status = subprocess.run(["bash", "-c", check + inspect], capture_output=True, text=True).stdout.split()
        if len(status) == 2 and int(status[0]) > restarts0 and status[1] == "healthy":
            healthy_at = time.monotonic()
            break
        time.sleep(1)
    time.sleep(5)
    running.join(timeout_s=0)
    records = running.records
    failed = [r for r in records if not r.ok]
    ok_ends = sorted(end_s(r) for r in records if r.ok and end_s(r) > t_kill - 1)
    gaps = [b - a for a, b in zip(ok_ends, ok_ends[1:])]
    return {
        "requests": len(records), "failed": len(failed),
        "downtime_s": round(max(gaps), 1) if gaps else None,
        "back_to_healthy_s": round(healthy_at - t_kill, 1) if healthy_at else None,
        "restarts": int(status[0]) - restarts0 if status else None,
    }


def down(args: argparse.Namespace) -> dict:
    running = start_load(args.users, args.duration)
    time.sleep(5)
    t_down = time.monotonic()
    in_flight_before = len(running.records)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "compose-smoke.sh"), "down"],
                          capture_output=True, text=True, timeout=300)
    running.join(timeout_s=0)
    # Requests already started when `down` began: did they get their answer?
    started_before = [r for r in running.records if r.start_s < t_down]
    failed_in_flight = [r for r in started_before if not r.ok and end_s(r) > t_down]
    return {
        "down_rc": proc.returncode, "down_s": round(time.monotonic() - t_down, 1),
        "requests_before_down": in_flight_before,
        "in_flight_at_down": len([r for r in started_before if end_s(r) > t_down]),
        "in_flight_failed": len(failed_in_flight),
        "down_output": proc.stderr.strip().splitlines()[-1:] if proc.stderr else [],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("fault", choices=["kill", "down"])
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--duration", type=float, default=180.0, help="bound of the load, seconds")
    args = parser.parse_args()
    result = (kill if args.fault == "kill" else down)(args)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
