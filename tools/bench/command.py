"""``tools bench``: served pipelines against their in-process limits, one run (options only).

The sweep lives in ``tools.bench.sweep``, the tables and files in ``tools.bench.report``.
"""

from __future__ import annotations

from pathlib import Path

import click
from click.core import ParameterSource

from tools import paths
from tools.bench import report
from tools.bench.sweep import BenchPlan, run_bench
from tools.command import ToolCommand
from tools.errors import UserInputError

DEFAULT_TEXTS = paths.TEXTS_FILE
DEFAULT_PIPELINES = "text_embedding,text_embedding_int8,text_embedding_bf16"


def _ints(value: str, option: str) -> list[int]:
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError as exc:
        raise UserInputError(f"{option}: expected comma-separated integers, got {value!r}") from exc
    if not out or min(out) < 1:
        raise UserInputError(f"{option}: expected integers >= 1, got {value!r}")
    return out


def _texts(path: Path) -> tuple[str, ...]:
    if not path.is_file():
        raise UserInputError(f"texts file {path} not found")
    texts = tuple(t for t in path.read_text(encoding="utf-8").splitlines() if t.strip())
    if not texts:
        raise UserInputError(f"texts file {path} has no texts")
    return texts


@click.command("bench", cls=ToolCommand)
@click.option("--repository", type=click.Path(file_okay=False, path_type=Path),
              default=Path("model_repository"), show_default=True,
              help="Built repository: the in-process limit reads its files and settings.")
@click.option("--url", help="HTTP host:port of a running server on the same repository "
              "(with --grpc-url; default: start the embedded server).")
@click.option("--grpc-url", help="gRPC host:port of that server.")
@click.option("--texts", "texts_file", type=click.Path(dir_okay=False, path_type=Path),
              default=DEFAULT_TEXTS, show_default="loadtests/data/texts.txt of this project",
              help="One text per line.")
@click.option("--pipelines", default=DEFAULT_PIPELINES, show_default=True,
              help="Pipelines or models of the repository to measure side by side; string "
              "inputs get the texts, an IMAGE input the shipped photos. Of the default ones, "
              "those the repository lacks are skipped with a note; a name given here that it "
              "lacks is an error.")
@click.option("--batch-sizes", default="1,8,32", show_default=True,
              help="In-process batch sizes.")
@click.option("--concurrency", default="1,8,32", show_default=True,
              help="Served concurrency sweep (1 gives the tail ratio its reference).")
@click.option("--protocol", type=click.Choice(["grpc", "http", "both"]), default="both",
              show_default=True)
@click.option("--duration", type=click.FloatRange(min=1), default=15.0, show_default=True,
              help="Measured seconds per served point.")
@click.option("--warmup", type=click.FloatRange(min=0), default=3.0, show_default=True,
              help="Unmeasured seconds before each served point.")
@click.option("--min-seconds", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="In-process: repeat passes over the texts for at least this long.")
@click.option("--half-load/--no-half-load", default=True, show_default=True,
              help="After each protocol's sweep, an open loop at half of its best served "
              "throughput: its P99 over the P99 at c=1 is the tail ratio (target <= "
              f"{report.TAIL_TARGET:g}).")
@click.option("--http-guard/--no-http-guard", default=None,
              help="The embedded server's HTTP guard [default: as tools serve: on for a "
              "binary without --http-max-input-size, such as the nvidia-pytriton wheel's 2.51]; "
              "--no-http-guard measures HTTP without it, for comparison.")
@click.option("--guard-cost", is_flag=True,
              help="Also sweep HTTP on tritonserver's own port around the guard, on the same "
              "server, and print through/around.")
@click.option("--output", type=click.Path(file_okay=False, path_type=Path),
              default=Path("reports/bench"), show_default=True,
              help="Folder for bench.json and bench.png.")
def bench(repository: Path, url: str | None, grpc_url: str | None, texts_file: Path,
          pipelines: str, batch_sizes: str, concurrency: str, protocol: str, duration: float,
          warmup: float, min_seconds: float, half_load: bool, http_guard: bool | None,
          guard_cost: bool, output: Path) -> None:
    """Measure served pipelines against their in-process limits, in one run on this machine.

    For each pipeline (text_embedding: the exported fp32 encoder; text_embedding_int8: the int8
    one; text_embedding_bf16: OpenVINO in bf16; or any pipeline or model of the repository):
    (a) for a text pipeline (tokenizer -> encoder), its tokenizer and encoder from REPOSITORY,
    in this process, with the server's runtime settings, at each batch size (padded to the
    longest text of the batch, and also split into length chunks the way the served runner
    does); (b) the pipeline over gRPC and HTTP with asyncio clients at each concurrency, one
    text (or photo) per request, HTTP through the guard when tools serve would put one there;
    then an open loop at half of the best served throughput (the tail ratio: its P99 over the
    P99 at c=1, target <= 1.5). All use the same texts. The ratio column is throughput over
    that pipeline's best in-process throughput; the side-by-side table puts each pipeline
    against the first one on the same protocol.
    """
    if bool(url) != bool(grpc_url):
        raise UserInputError("give both --url and --grpc-url, or neither (embedded server)")
    source = click.get_current_context().get_parameter_source("pipelines")
    plan = BenchPlan(
        repository=repository, texts_file=texts_file, texts=_texts(texts_file),
        pipelines=tuple(dict.fromkeys(p.strip() for p in pipelines.split(",") if p.strip())),
        explicit=source is not ParameterSource.DEFAULT,
        batch_sizes=tuple(_ints(batch_sizes, "--batch-sizes")),
        levels=tuple(_ints(concurrency, "--concurrency")),
        protocols=("grpc", "http") if protocol == "both" else (protocol,),
        duration_s=duration, warmup_s=warmup, min_seconds=min_seconds, half_load=half_load,
        output=output, url=url, grpc_url=grpc_url, http_guard=http_guard, guard_cost=guard_cost,
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
