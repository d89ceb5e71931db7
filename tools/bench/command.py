"""``tools bench``: served pipelines against their in-process limits, one run (options only).

The sweep lives in ``tools.bench.sweep``, the tables and files in ``tools.bench.report``.
"""

from __future__ import annotations

from pathlib import Path

import click
from tools import paths
from tools.bench import report
from tools.bench.sweep import BenchPlan, run_bench
from tools.bench.targets import DEFAULT_PIPELINES
from tools.command import (ToolCommand, data_option, grpc_url_option, option, protocol_option,
                           scenario_names, spec_option, url_option)
from tools.errors import UserInputError

DEFAULT_TEXTS = paths.TEXTS_FILE


def _ints(value: str, option: str) -> list[int]:
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError as exc:
        raise UserInputError(f"{option}: expected comma-separated integers, got {value!r}") from exc
    if not out or min(out) < 1:
        raise UserInputError(f"{option}: expected integers >= 1, got {value!r}")
    return out


@click.command("bench", cls=ToolCommand)
@spec_option("The spec each pipeline's load is derived from (as tools loadtest's).")
@option("--repository", type=click.Path(file_okay=False, path_type=Path),
        default=Path("model_repository"), show_default=True,
        help="Repository built from the spec: the in-process limit reads its files and settings.")
@url_option("a running server on the same repository (with --grpc-url; default: start the "
            "embedded server).")
@grpc_url_option("that server.")
@data_option(old_names=("--texts",))
@option("--scenario", "scenarios", multiple=True, metavar="NAME", old_names=("--pipelines",),
        help="Pipeline or model of the spec to measure, side by side (repeatable, or "
        f"comma-separated) [default: {', '.join(DEFAULT_PIPELINES)} where the spec has them "
        "(those the repository lacks are skipped with a note), else every pipeline of the "
        "spec]; each is sent its scenario, as tools loadtest sends it.")
@option("--batch-sizes", default="1,8,32", show_default=True, help="In-process batch sizes.")
@option("--concurrency", default="1,8,32", show_default=True,
        help="Closed loop: requests in flight, a sweep (1 gives the tail ratio its reference).")
@protocol_option(["http", "grpc", "both"], "both", "Client protocol; both sweeps gRPC, then HTTP.")
@option("--duration", type=click.FloatRange(min=1), default=15.0, show_default=True,
        help="Measured seconds per served point.")
@option("--warmup", type=click.FloatRange(min=0), default=3.0, show_default=True,
        help="Unmeasured seconds before each served point.")
@option("--min-seconds", type=click.FloatRange(min=0), default=5.0, show_default=True,
        help="In-process: repeat passes over the texts for at least this long.")
@click.option("--half-load/--no-half-load", default=True, show_default=True,
              help="After each protocol's sweep, an open loop at half of its best served "
              "throughput: its P99 over the P99 at c=1 is the tail ratio (target <= "
              f"{report.TAIL_TARGET:g}).")
@option("--tail-cycles", type=click.IntRange(min=0), default=1, show_default=True,
        help="The two points of the tail ratio (c=1 and half load) are measured in this many "
        "passes each, alternating (c=1, half load, half load, c=1, ...) so a machine that "
        "slows down weighs on both, each pass sending every distinct request once whatever "
        "--duration says (both P99s over the same texts); 0: one pass each, lasting --duration.")
@click.option("--front/--no-front", default=None,
              help="The embedded server's front (HAProxy: limits and SLO admission) [default: as "
              "tools serve: on where haproxy is installed]; --no-front measures tritonserver "
              "alone, for comparison.")
@click.option("--front-cost", is_flag=True,
              help="Also sweep each protocol on tritonserver's own port, around the front, on "
              "the same server, and print through/around (at the same concurrency).")
@click.option("--api-cost", is_flag=True,
              help="Also measure each pipeline the OpenAI/TEI routes serve through the API "
              "gateway (tools api, started in front of Triton's own HTTP port) and straight to "
              "that port with KServe v2 JSON, the same requests at each concurrency, rounds "
              "alternating; print through/direct per round.")
@option("--api-rounds", type=click.IntRange(min=1), default=3, show_default=True,
        help="Rounds of --api-cost at each concurrency.")
@option("--output", type=click.Path(file_okay=False, path_type=Path),
        default=Path("reports/bench"), show_default=True,
        help="Folder for bench.json and bench.png.")
def bench(spec_path: Path, repository: Path, url: str | None, grpc_url: str | None,
          data: Path | None, scenarios: tuple[str, ...], batch_sizes: str, concurrency: str,
          protocol: str, duration: float, warmup: float, min_seconds: float, half_load: bool,
          tail_cycles: int, front: bool | None, front_cost: bool, api_cost: bool,
          api_rounds: int, output: Path) -> None:
    """Measure served pipelines against their in-process limits, in one run on this machine.

    For each pipeline (text_embedding: the exported fp32 encoder; text_embedding_int8: the int8
    one; text_embedding_bf16: OpenVINO in bf16; or any pipeline or model of the spec):
    (a) for a text pipeline (tokenizer -> encoder), its tokenizer and encoder from REPOSITORY,
    in this process, with the server's runtime settings, at each batch size (padded to the
    longest text of the batch, and also split into length chunks the way the served runner
    does); (b) the pipeline over gRPC and HTTP with asyncio clients at each concurrency, its
    scenario's requests (derived from the spec's inputs as tools loadtest derives them: texts,
    photos, text pairs, generated tensors; --data replaces them), through the front as tools
    serve puts it; then an open loop at half of the best served throughput
    (the tail ratio: its P99 over the P99 at c=1, target <= 1.5; the two points are measured
    back to back, in --tail-cycles alternating passes each sending every distinct request). The in-process limit encodes
    the texts the served requests carry. The ratio column is throughput over that pipeline's
    best in-process throughput; the side-by-side table puts each pipeline against the first one
    on the same protocol.
    """
    if bool(url) != bool(grpc_url):
        raise UserInputError("give both --url and --grpc-url, or neither (embedded server)")
    names = scenario_names(scenarios)
    if not names:
        from tools.bench.targets import default_names
        from tools.build_repo.spec import load_spec

        names = default_names(load_spec(spec_path))
    plan = BenchPlan(
        repository=repository, spec_path=spec_path, data=data, pipelines=names,
        explicit=bool(scenarios),
        batch_sizes=tuple(_ints(batch_sizes, "--batch-sizes")),
        levels=tuple(_ints(concurrency, "--concurrency")),
        protocols=("grpc", "http") if protocol == "both" else (protocol,),
        duration_s=duration, warmup_s=warmup, min_seconds=min_seconds, half_load=half_load,
        tail_cycles=tail_cycles, output=output, url=url, grpc_url=grpc_url, front=front,
        front_cost=front_cost, api_cost=api_cost, api_rounds=api_rounds,
    )
    run = run_bench(plan, lambda line: click.echo(line, err=True))
    table, variants = report.write(run, output)
    click.echo(table)
    if variants:
        click.echo("")
        click.echo(variants)
    for line in report.summary_lines(run):
        click.echo(line)
    click.echo(f"wrote {output / 'bench.json'} and {output / 'bench.png'}")
