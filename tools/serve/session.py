"""An embedded server for the length of one command (``tools loadtest``, ``tools bench``), or the
endpoints of a running one given by URL.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from tools.front.plan import Limits
from tools.front.process import INSTALL_HINT, find_haproxy
from tools.serve.server import EmbeddedServer


@contextlib.contextmanager
def endpoints(
    repository: Path | None, url: str | None, grpc_url: str | None, log_path: Path,
    say: Callable[[str], None],
) -> Iterator[tuple[str | None, str | None]]:
    """``(http, grpc)`` of the running server given by ``url``/``grpc_url``, or of an embedded
    server started on ``repository`` for the block (when ``repository`` is given)."""
    if repository is None:
        yield url, grpc_url
        return
    with started_server(repository, log_path, say) as server:
        yield server.http_url, server.grpc_url


def front_if_installed(say: Callable[[str], None]) -> Limits | None:
    """The front's default limits where haproxy is installed (the server is measured as ``tools
    serve`` runs it); else None, and ``say`` says so."""
    if find_haproxy() is not None:
        return Limits()
    say(f"note: haproxy is not installed: measuring tritonserver without the front ({INSTALL_HINT})")
    return None


@contextlib.contextmanager
def started_server(
    repository: Path, log_path: Path, say: Callable[[str], None], timeout_s: float = 300
) -> Iterator[EmbeddedServer]:
    """An embedded server on ``repository`` (free ports), ready, stopped on leaving the block.

    For the commands that measure against their own server (``tools loadtest``, ``tools bench``);
    ``say`` reports start and readiness (e.g. ``click.echo`` to stderr).
    """
    server = EmbeddedServer(Path(repository), log_path=log_path, exit_timeout_s=10,
                            front=front_if_installed(say))
    say(f"starting the embedded tritonserver on {repository} ...")
    server.start(timeout_s=timeout_s)
    say(f"tritonserver ready: http {server.http_url}, grpc {server.grpc_url}")
    try:
        yield server
    finally:
        server.stop()
