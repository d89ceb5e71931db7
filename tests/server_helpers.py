"""Stand-ins for the tritonserver binary, for tests of what the server code adapts to."""

from __future__ import annotations

import socket
from pathlib import Path


def fake_tritonserver(tmp_path: Path, options: list[str]) -> Path:
    """A script whose ``--help`` lists ``options``: what ``command()`` adapts to."""
    binary = tmp_path / "fake-bin" / "tritonserver"
    binary.parent.mkdir()
    lines = "\n".join(f"  {o} <string>" for o in options)
    binary.write_text(f"#!/bin/sh\ncat <<'EOF'\nUsage: tritonserver [options]\n{lines}\nEOF\n")
    binary.chmod(0o755)
    return binary


def copy_serving_stage(destination: Path) -> Path:
    """Copy the project files the serve stage of docker/triton.Dockerfile copies into the image
    (``tools/...`` and ``docker/...``, packages whole) under ``destination``, as
    /opt/triton-forge holds them there; returns ``destination``."""
    import re
    import shutil

    root = Path(__file__).resolve().parents[1]
    text = (root / "docker" / "triton.Dockerfile").read_text().replace("\\\n", " ")
    serve_stage = text.split("FROM serve AS builder")[0]
    for line in re.findall(r"^COPY (.+)$", serve_stage, re.MULTILINE):
        for relative in (p for p in line.split()[:-1] if p.startswith(("tools/", "docker/"))):
            (destination / relative).parent.mkdir(parents=True, exist_ok=True)
            if (root / relative).is_dir():  # a package copied whole (tools/front/)
                shutil.copytree(root / relative, destination / relative, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(root / relative, destination / relative)
    return destination


def slow_bodies(http_url: str, count: int, promised: int) -> list[socket.socket]:
    """``count`` connections to ``http_url``, each sending an inference request's head that
    promises a ``promised``-byte body, then only 10 bytes of it (a slow client). The caller
    closes them."""
    host, _, port = http_url.rpartition(":")
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.create_connection((host, int(port)), timeout=5)
            held.append(sock)
            sock.sendall(b"POST /v2/models/toy_double/infer HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Length: %d\r\n\r\n" % promised + b"{" * 10)
    except OSError:
        for sock in held:
            sock.close()
        raise
    return held
