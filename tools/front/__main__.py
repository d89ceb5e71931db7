"""``python -m tools.front``: run HAProxy on a rendered config with its admission controller.

Started by ``tools serve`` (``tools.front.process.FrontProcess``) beside tritonserver, in a
session of its own: binds the controller's log socket, starts ``haproxy -W -db``, feeds the
controller until HAProxy exits, SIGTERM arrives, or the watched tritonserver is gone; then
stops HAProxy gracefully (in-flight requests finish, idle connections close) and removes its
run folder. Where things are comes from the environment (``haproxy_config.ENV_DEFAULTS``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from tools.front.controller import AdmissionController, RuntimeApi, log_socket, read_objective

POLL_S = 0.2
SOFT_STOP_S = 10.0  # in-flight requests get this long once HAProxy stops listening


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of someone else counts as gone
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.front", description=__doc__)
    parser.add_argument("--haproxy", required=True, help="the haproxy binary")
    parser.add_argument("--config", type=Path, required=True, help="the rendered haproxy.cfg")
    parser.add_argument("--triton-http", required=True,
                        help="tritonserver's own HTTP HOST:PORT (its model-config API)")
    parser.add_argument("--watch-pid", type=int, default=None,
                        help="stop once this process (tritonserver) is gone")
    parser.add_argument("--remove-dir", action="store_true",
                        help="remove the config's folder on exit (a private run folder)")
    args = parser.parse_args(argv)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    sock = log_socket(os.environ["FORGE_FRONT_LOG"])
    if sock.family == socket.AF_INET:  # HAProxy logs to the port bound (FORGE_FRONT_LOG may say 0)
        os.environ["FORGE_FRONT_LOG"] = "{}:{}".format(*sock.getsockname())
    haproxy = subprocess.Popen([args.haproxy, "-W", "-db", "-f", str(args.config)],
                               stdin=subprocess.DEVNULL)
    controller = AdmissionController(RuntimeApi(os.environ["FORGE_FRONT_ADMIN"]),
                                     lambda model: read_objective(args.triton_http, model))
    done = threading.Event()
    thread = threading.Thread(target=controller.serve, args=(sock, done), daemon=True)
    thread.start()
    code = 0
    try:
        while not stopping.is_set():
            if haproxy.poll() is not None:
                code = haproxy.returncode or 1
                print(f"front: haproxy exited (exit code {haproxy.returncode})",
                      file=sys.stderr, flush=True)
                break
            if args.watch_pid is not None and not _alive(args.watch_pid):
                break
            time.sleep(POLL_S)
    finally:
        if haproxy.poll() is None:
            haproxy.send_signal(signal.SIGUSR1)  # soft stop: stop listening, finish what runs
            try:
                haproxy.wait(SOFT_STOP_S)
            except subprocess.TimeoutExpired:
                haproxy.terminate()
                try:
                    haproxy.wait(2.0)
                except subprocess.TimeoutExpired:
                    haproxy.kill()
                    haproxy.wait()
        done.set()
        thread.join(1.0)
        sock.close()
        if args.remove_dir:
            shutil.rmtree(args.config.parent, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
