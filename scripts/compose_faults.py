"""Faults in the running compose stack (scripts/compose-smoke.sh up first), under load from the host.

  python scripts/compose_faults.py kill   kill tritonserver inside the triton container mid-load;
                                          report downtime, failed requests, time back to healthy
  python scripts/compose_faults.py down   `compose-smoke.sh down` mid-load; report whether the
                                          requests in flight when it started finished

Load: USERS closed-loop HTTP users sending text_embedding, bounded by --duration. Loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
URL = "http://127.0.0.1:8000/v2/models/text_embedding/infer"
BODY = json.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1],
                               "data": ["a cat sat on the mat"]}]}).encode()


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


class Load:
    """Closed-loop users; every request is recorded as (start, end, ok)."""

    def __init__(self, users: int, duration_s: float) -> None:
        self.records: list[tuple[float, float, bool]] = []
        self.deadline = time.monotonic() + duration_s
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._user, daemon=True) for _ in range(users)]

    def _user(self) -> None:
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            start = time.monotonic()
            try:
                request = urllib.request.Request(URL, BODY, {"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=10) as response:
                    ok = response.status == 200 and b"EMBEDDING" in response.read()
            except (urllib.error.URLError, OSError):
                ok = False
            self.records.append((start, time.monotonic(), ok))
            if not ok:
                time.sleep(0.2)

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=15)


def kill(args: argparse.Namespace) -> dict:
    engine = _engine()
    cid = _triton_id(engine)
    load = Load(args.users, args.duration)
    load.start()
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
    load.join()
    failed = [r for r in load.records if not r[2]]
    ok_ends = sorted(r[1] for r in load.records if r[2] and r[1] > t_kill - 1)
    gaps = [b - a for a, b in zip(ok_ends, ok_ends[1:])]
    return {
        "requests": len(load.records), "failed": len(failed),
        "downtime_s": round(max(gaps), 1) if gaps else None,
        "back_to_healthy_s": round(healthy_at - t_kill, 1) if healthy_at else None,
        "restarts": int(status[0]) - restarts0 if status else None,
    }


def down(args: argparse.Namespace) -> dict:
    load = Load(args.users, args.duration)
    load.start()
    time.sleep(5)
    t_down = time.monotonic()
    in_flight_before = len(load.records)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "compose-smoke.sh"), "down"],
                          capture_output=True, text=True, timeout=300)
    load.join()
    # Requests already started when `down` began: did they get their answer?
    started_before = [r for r in load.records if r[0] < t_down]
    failed_in_flight = [r for r in started_before if not r[2] and r[1] > t_down]
    return {
        "down_rc": proc.returncode, "down_s": round(time.monotonic() - t_down, 1),
        "requests_before_down": in_flight_before,
        "in_flight_at_down": len([r for r in started_before if r[1] > t_down]),
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
