"""Scripted HTTP servers' shared step for the load senders' wire tests."""

from __future__ import annotations

import asyncio


async def read_request(reader: asyncio.StreamReader) -> bool:
    """Read one request (head and Content-Length body); False when the client went away."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
    except (asyncio.IncompleteReadError, ConnectionError):
        return False
    return True
