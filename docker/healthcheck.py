"""Healthcheck of the `triton` service: every model of the repository must be ready.

Server health can stay 200 while a Python stub is dead, so this checks each model's readiness
and, for the models in the probe file, a real inference. Standard library only (NGC image).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path


def repository_models(repository: Path) -> list[str]:
    """Every model folder of the repository (a folder holding config.pbtxt)."""
    return sorted(p.parent.name for p in repository.glob("*/config.pbtxt"))


def _request(url: str, body: bytes | None, timeout: float) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method="POST" if body else "GET")
    if body:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc).encode()


def check(url: str, repository: Path, probes: dict, timeout: float) -> list[str]:
    """Return one problem per model that is not ready or fails its probe inference."""
    status, body = _request(f"{url}/v2/health/live", None, timeout)
    if status != 200:
        return [f"server not live: HTTP {status} {body[:200]!r}"]
    models = repository_models(repository)
    if not models:
        return [f"no models in {repository}"]
    problems = []
    for name in models:
        quoted = urllib.parse.quote(name)
        status, body = _request(f"{url}/v2/models/{quoted}/ready", None, timeout)
        if status != 200:
            problems.append(f"model '{name}' not ready: HTTP {status} {body[:200]!r}")
    for name, request in probes.items():
        if name not in models:
            continue
        quoted = urllib.parse.quote(name)
        payload = json.dumps(request).encode()
        status, body = _request(f"{url}/v2/models/{quoted}/infer", payload, timeout)
        if status != 200 or not json.loads(body or b"{}").get("outputs"):
            problems.append(f"model '{name}' probe inference failed: HTTP {status} {body[:200]!r}")
    return problems


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when healthy; otherwise print each problem and exit 1."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--repository", type=Path, default=Path("/models"))
    parser.add_argument("--probes", type=Path, help="JSON: model name -> KServe v2 JSON request")
    parser.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args(argv)
    probes = json.loads(args.probes.read_text()) if args.probes else {}
    problems = check(args.url.rstrip("/"), args.repository, probes, args.timeout)
    for problem in problems:
        print(f"unhealthy: {problem}", file=sys.stderr)
    if not problems:
        print(f"healthy: {len(repository_models(args.repository))} models ready")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
