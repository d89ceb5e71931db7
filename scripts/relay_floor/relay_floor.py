"""The floor of a hop in Python: bytes relayed on uvloop, nothing checked (measurement only).

What a Python process in front of tritonserver costs at the least, against which the HTTP
guard's own work is read (``scripts/guard_cost.py --compare-http-guard``; ``relay_floor.c`` is
the same in C). The guard's command line (``--listen-port P --upstream-port U
[--watch-pid PID]``), 127.0.0.1 only, one upstream connection per client connection; exits once
PID is gone or on SIGTERM. Not a guard: no limit, no framing, no admission.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.serve.http_guard import LOOPBACK, run, run_until_gone  # noqa: E402


class _Upstream(asyncio.Protocol):
    def __init__(self, client: _Client) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.transport.close()


class _Client(asyncio.Protocol):
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.upstream: asyncio.Transport | None = None
        self.early: list[bytes] = []  # sent before the upstream connection was open

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        try:
            self.upstream, _ = await asyncio.get_running_loop().create_connection(
                lambda: _Upstream(self), LOOPBACK, self.upstream_port)
        except OSError:
            self.transport.close()
            return
        for data in self.early:
            self.upstream.write(data)
        self.early.clear()

    def data_received(self, data: bytes) -> None:
        if self.upstream is None:
            self.early.append(data)
        else:
            self.upstream.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None:
            self.upstream.close()


async def _serve(listen_port: int, upstream_port: int, watch_pid: int | None) -> None:
    server = await asyncio.get_running_loop().create_server(
        lambda: _Client(upstream_port), LOOPBACK, listen_port, reuse_address=True)
    print(f"relay floor: {LOOPBACK}:{listen_port} -> {LOOPBACK}:{upstream_port}",
          file=sys.stderr, flush=True)
    async with server:
        await run_until_gone(watch_pid, drain_s=0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen-port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--watch-pid", type=int)
    args = parser.parse_args(argv)
    run(_serve(args.listen_port, args.upstream_port, args.watch_pid))
    return 0


if __name__ == "__main__":
    sys.exit(main())
