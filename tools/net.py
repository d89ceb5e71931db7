"""Loopback ports: is one taken, which are free, does one accept connections yet, and starting
again on others when a port chosen free was taken before it was bound.

Every server this project starts (tritonserver, its front, Locust, the servers compared) binds
127.0.0.1 on ports chosen here.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Mapping
from typing import TypeVar

from tools.errors import ServerError, UserInputError

LOOPBACK = "127.0.0.1"
T = TypeVar("T")
_HOST_PORT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(?P<port>[0-9]+)$")


def check_host_port(text: str, option: str, example: str) -> str:
    """``text`` stripped of surrounding blanks if it is ``host:port``, as tritonclient expects.

    Args:
        text: The endpoint given.
        option: The option it was given with (``--url``, ``--grpc-url``), for the message.
        example: An endpoint of the right form, shown in the message.

    Raises:
        UserInputError: a scheme (``http://``), a path, a missing or non-numeric port, or a
            port outside 1-65535; the message shows the form expected.
    """
    value = text.strip()
    if "://" in value:
        scheme, _, rest = value.partition("://")
        raise UserInputError(
            f"{option} {text!r}: give host:port without the {scheme}:// scheme "
            f"(e.g. {rest.split('/')[0] or example}); --url is the HTTP endpoint, --grpc-url "
            f"the gRPC one"
        )
    match = _HOST_PORT.match(value)
    if not match or not 0 < int(match.group("port")) < 65536:
        raise UserInputError(
            f"{option} {text!r} is not host:port with a port from 1 to 65535 (e.g. {example})"
        )
    return value


def port_in_use(port: int, host: str = LOOPBACK) -> bool:
    """True when ``host:port`` cannot be bound (some process listens there)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports on 127.0.0.1 that were free a moment ago (bound together)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((LOOPBACK, 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def accepts(port: int, host: str = LOOPBACK, timeout_s: float = 0.5) -> bool:
    """True when a TCP connection to ``host:port`` succeeds (the connection is closed again)."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError:
        return False
    return True



def choose_ports(requested: Mapping[str, int]) -> dict[str, int]:
    """Ports for ``requested`` (kind -> port, 0 for any free one), e.g. ``{"HTTP": 8000}``.

    Raises:
        ServerError: a requested port is in use; the message names its ``--<kind>-port``.
    """
    for kind, port in requested.items():
        if port and port_in_use(port):
            raise ServerError(
                f"port {port} ({kind}) is already in use on {LOOPBACK}; "
                f"choose another --{kind.lower()}-port, or 0 for a free one"
            )
    auto = [k for k, p in requested.items() if not p]
    chosen = dict(zip(auto, free_ports(len(auto))))
    return {k: p or chosen[k] for k, p in requested.items()}


def start_choosing_again(start: Callable[[], T], chosen: Callable[[], Mapping[str, int]],
                         choose_again: Callable[[dict[str, int]], None], attempts: int = 3) -> T:
    """``start()``, again while it fails because another process took a port chosen for it.

    A free port is chosen some time before the process that binds it starts (the front's and
    the gateway's wait for tritonserver to load the models); any other process may take it in
    between. A port the user gave is never moved: ``chosen`` lists only the ones picked here.

    Args:
        start: Starts the server; raises ``ServerError`` when it could not.
        chosen: Kind -> port of the ports picked free for it, read after each failure.
        choose_again: Given ``{kind: 0}`` for those now held by another process, picks others.
        attempts: How many starts at most.

    Raises:
        ServerError: ``start``'s own error, when no chosen port was taken or the attempts ran out.
    """
    for _ in range(attempts - 1):
        try:
            return start()
        except ServerError:
            taken = {kind: 0 for kind, port in chosen().items() if port_in_use(port)}
            if not taken:
                raise
            choose_again(taken)
    return start()
