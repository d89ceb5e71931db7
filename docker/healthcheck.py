"""Healthcheck and Kubernetes probes of the `triton` service.

--mode full (compose's healthcheck, the default): every model of the repository ready and every
probe answered with outputs (tools/serve/health.py, the one definition of healthy that `tools
serve` and the watchdog use). --mode liveness / readiness: the probes that tell a busy server from
a dead one (tools/serve/probes.py, standard library only, cheap to exec every few seconds).
In the image tools/ sits next to this folder.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # /opt/triton-forge in the image
from tools.serve import probes as kube_probes  # noqa: E402


def _read_probe_file(path: Path | None) -> dict:
    if path is None:
        return {}
    probes = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(probes, dict) or not all(isinstance(v, dict) for v in probes.values()):
        raise ValueError("expected an object of model name -> request")
    return probes


def _probe(args: argparse.Namespace) -> int:
    try:
        probes = _read_probe_file(args.probes)
    except (OSError, ValueError) as exc:
        print(f"unhealthy: probe file {args.probes}: {exc}", file=sys.stderr)
        return 1
    if args.mode == "liveness":
        result = kube_probes.liveness(args.url, args.status_url, args.timeout)
    else:
        models = kube_probes.repository_models(args.repository)
        if not models:
            print(f"unhealthy: no models in {args.repository}", file=sys.stderr)
            return 1
        result = kube_probes.readiness(args.url, models, probes, args.status_url, args.timeout)
    for reason in result.reasons:
        print(f"{'unhealthy' if not result.verdict.passes else result.verdict.value}: {reason}",
              file=sys.stderr)
    print(f"{args.mode}: {result.verdict.value}")
    return 0 if result.verdict.passes else 1


def _full(args: argparse.Namespace) -> int:
    from tools.errors import UserInputError
    from tools.serve import health

    try:
        probes = health.read_probes(args.probes)
    except UserInputError as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    report = health.check_repository(args.url, args.repository, probes, args.timeout)
    for problem in report.problems:
        print(f"unhealthy: {problem}", file=sys.stderr)
    if report.healthy:
        print(f"healthy: {len(report.models)} models ready")
    return 0 if report.healthy else 1


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when the check passes (busy passes liveness and readiness); otherwise print each
    problem and exit 1."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=("full", "liveness", "readiness"), default="full")
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--repository", type=Path, default=Path("/models"))
    parser.add_argument("--probes", type=Path, help="JSON: model name -> KServe v2 JSON request")
    parser.add_argument("--status-url", help="the supervisor's status endpoint "
                        "(http://127.0.0.1:8003/status); liveness and readiness read it")
    parser.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args(argv)
    return _full(args) if args.mode == "full" else _probe(args)


if __name__ == "__main__":
    sys.exit(main())
