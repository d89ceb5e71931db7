"""Overload of one pipeline or model against its P99 objective, as `tools serve` runs it.

Each run measures capacity (closed loop on tritonserver's own port), then open loops at 2x, 4x
and 8x of it through the front (``--no-front``: tritonserver alone), and prints every point: accepted P99 and throughput, goodput
(accepted / capacity), refusals by where they happened (the front's admission, Triton's queue
size or timeout, the first step's gate) and the cores each process used. Exits 1 when any run
misses a target: accepted P99 <= 1.5 x the objective and goodput >= 0.85, at every multiple.
The objective is the one the build renders into the model's config (``admission_p99_ms``, from
the SLO file: a pipeline's own, a step's from its pipeline), so ``--model minilm_encoder`` loads
the encoder directly against the text pipeline's objective.

    python benchmarks/overload.py --repository model_repository --runs 3
    python benchmarks/overload.py --repository model_repository --model minilm_encoder --runs 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools import paths  # noqa: E402
from tools.build_repo.admission import objectives  # noqa: E402
from tools.build_repo.spec import load_spec  # noqa: E402
from tools.front.plan import Limits  # noqa: E402
from tools.serve.overload import GENERATORS, GOODPUT_TARGET, P99_FACTOR, overload_run, scenario_bodies  # noqa: E402
from tools.serve.server import EmbeddedServer  # noqa: E402

def _table(run_index: int, run) -> list[str]:
    lines = []
    for point in (run.capacity, *run.points):
        goodput = "" if point is run.capacity else f"{run.goodput(point):.2f}"
        refused = ", ".join(f"{k} {v}" for k, v in sorted(point.refused.items())) or "-"
        cores = ", ".join(f"{role.removeprefix('stubs ')} {value:.2f}"
                          for role, value in sorted(point.cores.items(), key=lambda kv: -kv[1])
                          if value >= 0.01)
        lines.append(f"| {run_index} | {point.label} | {point.offered_rps or 0:.0f} | "
                     f"{point.accepted_rps:.1f} | {goodput} | {point.p50_ms or 0:.0f} | "
                     f"{point.p99_ms or 0:.0f} | {refused} | {cores} | {point.load_average:.1f} |")
    return lines


def summary(runs, objective: float) -> list[str]:
    """One row per run: capacity, then goodput and accepted P99 at each multiple, the misses
    in bold (the compact table the README carries)."""
    labels = [p.label for p in runs[0].points] if runs else []
    lines = ["| run | capacity req/s | " + " | ".join(f"{label}: goodput, P99 ms"
                                                    for label in labels) + " |",
             "|---" * (2 + len(labels)) + "|"]
    for index, run in enumerate(runs, 1):
        cells = []
        for point in run.points:
            goodput, p99 = run.goodput(point), point.p99_ms or 0
            good = f"{goodput:.2f}" if goodput >= GOODPUT_TARGET else f"**{goodput:.2f}**"
            fast = f"{p99:.0f}" if p99 and p99 <= P99_FACTOR * objective else f"**{p99:.0f}**"
            cells.append(f"{good}, {fast}")
        lines.append(f"| {index} | {run.capacity.accepted_rps:.1f} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repository", type=Path, required=True, help="a built model repository")
    parser.add_argument("--spec", type=Path, default=paths.SPEC_FILE)
    parser.add_argument("--model", "--pipeline", dest="model", default="text_embedding",
                        help="the pipeline or model to load (a scenario of the spec)")
    parser.add_argument("--target", default="cpu", help="the build target (the SLO profile)")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--factors", default="2,4,8")
    parser.add_argument("--users", type=int, default=32, help="closed-loop users for capacity")
    parser.add_argument("--duration", type=float, default=12.0, help="seconds per point")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds left out per point")
    parser.add_argument("--max-length", type=int, default=None,
                        help="only requests whose tensors are at most this long (token ids)")
    parser.add_argument("--no-front", action="store_true", help="tritonserver alone")
    parser.add_argument("--generator", choices=GENERATORS, default="c",
                        help="what sends the open loops: C (tools/load/open_loop.c, little CPU "
                             "on the cores the server shares) or the Python load engine")
    parser.add_argument("--json", type=Path, help="also write every point here")
    args = parser.parse_args(argv)
    found = objectives(load_spec(args.spec).for_target(args.target), args.target)
    if args.model not in found:
        parser.error(f"{args.model!r} has no P99 objective in the SLO file of {args.spec}")
    objective = found[args.model]
    bodies = scenario_bodies(args.spec, args.model, max_length=args.max_length)
    factors = [float(f) for f in args.factors.split(",")]
    front = None if args.no_front else Limits()
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, load average "
          f"{os.getloadavg()[0]:.1f}; {args.model}: P99 objective {objective:g} ms "
          f"({args.target}), targets: accepted P99 <= {P99_FACTOR * objective:g} ms, "
          f"goodput >= {GOODPUT_TARGET}; {'no front' if args.no_front else 'through the front'}; "
          f"open loops sent by the {args.generator} load generator",
          flush=True)
    header = ["| run | point | offered req/s | accepted req/s | goodput | P50 ms | P99 ms | "
              "refused by | cores | load |", "|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(header), flush=True)
    runs, failed = [], []
    with EmbeddedServer(args.repository, exit_timeout_s=10, front=front) as server:
        for index in range(1, args.runs + 1):
            run = overload_run(server.http_url, server.triton_http_url, args.model, bodies,
                               server.pid, server.models, factors, users=args.users,
                               duration_s=args.duration, warmup_s=args.warmup,
                               generator=args.generator)
            runs.append(run)
            print("\n".join(_table(index, run)), flush=True)
            failed += [f"run {index}, {miss}" for miss in run.misses(objective)]
    if args.json:
        args.json.write_text(json.dumps([{"capacity": r.capacity.__dict__,
                                          "points": [p.__dict__ for p in r.points]} for r in runs],
                                        indent=2, default=str))
    print("\n" + "\n".join(summary(runs, objective)))
    for line in failed:
        print(f"MISS {line}")
    print(f"{len(runs) - len({f.split(',')[0] for f in failed})} of {len(runs)} runs met every "
          f"target")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
