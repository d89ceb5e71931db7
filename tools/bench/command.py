"""``tools bench``: the served text pipeline against the in-process ONNX Runtime limit, one run.

Measures the tokenizer + encoder in this process at several batch sizes, then ``text_embedding``
over gRPC and HTTP at a concurrency sweep, on the same texts; prints the table, writes JSON + PNG.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from tools import paths
from tools.command import ToolCommand
from tools.bench.inprocess import InProcessEncoder, LimitResult, measure, read_setup
from tools.bench.served import ServedResult, measure_served
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


# Issue 13's tail target: P99 at half of the maximum throughput within this many times the
# unloaded P50 (concurrency 1).
HALF_LOAD_TARGET = 2.5


def half_load_tails(served: Sequence[ServedResult]) -> list[dict[str, Any]]:
    """Per pipeline and protocol with an open-loop point: its P99 against the P50 at c=1."""
    out = []
    for s in served:
        if not s.offered_rps:
            continue
        unloaded = next((u for u in served if u.pipeline == s.pipeline and u.protocol == s.protocol
                         and u.concurrency == 1 and not u.offered_rps), None)
        p50 = unloaded.p50_ms if unloaded else None
        out.append({
            "pipeline": s.pipeline, "protocol": s.protocol, "offered_rps": s.offered_rps,
            "throughput": s.throughput, "p99_ms": s.p99_ms, "unloaded_p50_ms": p50,
            "ratio": (s.p99_ms / p50) if (p50 and s.p99_ms) else None,
            "target": HALF_LOAD_TARGET,
        })
    return out


def format_table(limits: Sequence[LimitResult], served: Sequence[ServedResult]) -> str:
    """The side-by-side table, one block per pipeline; ratio is over that pipeline's own limit.

    With several pipelines a last block compares each one's best served throughput with the
    first pipeline's, in the same run.
    """
    pipelines = list(dict.fromkeys([r.pipeline for r in limits] + [s.pipeline for s in served]))
    header = (
        f"{'what':<36} {'batch/conc':>10} {'texts/s':>9} {'P50 ms':>8} {'P99 ms':>8} "
        f"{'enc batch':>9} {'enc queue':>9} {'ratio':>6}"
    )
    lines = [header, "-" * len(header)]

    def fmt(v: float | None, spec: str = ".1f") -> str:
        return "-" if v is None else format(v, spec)

    footers, best_served = [], {}
    for pipeline in pipelines:
        own = [r for r in limits if r.pipeline == pipeline]
        if not own:
            continue
        best = max(own, key=lambda r: r.throughput)
        tag = "" if len(pipelines) == 1 else f"{pipeline}: "
        for r in own:
            mark = " *" if r is best else ""
            lines.append(
                f"{tag + r.variant + mark:<36} {'b=' + str(r.batch_size):>10} {r.throughput:>9.1f} "
                f"{r.p50_ms:>8.1f} {r.p99_ms:>8.1f} {'-':>9} {'-':>9} "
                f"{r.throughput / best.throughput:>6.2f}"
            )
        points = [s for s in served if s.pipeline == pipeline]
        for s in points:
            lines.append(
                f"{'served ' + pipeline + ' ' + s.protocol:<36} {s.label:>10} "
                f"{s.throughput:>9.1f} {fmt(s.p50_ms):>8} {fmt(s.p99_ms):>8} "
                f"{fmt(s.encoder_mean_batch, '.2f'):>9} {fmt(s.encoder_queue_ms):>9} "
                f"{s.throughput / best.throughput:>6.2f}"
            )
        closed = [s for s in points if not s.offered_rps]
        if closed:
            best_served[pipeline] = max(closed, key=lambda s: s.throughput)
        if len(pipelines) > 1:
            lines.append("")
        footers.append(f"* {tag}limit = {best.variant}, batch {best.batch_size}: "
                       f"{best.throughput:.1f} texts/s.")
    lines += footers
    lines.append("enc batch = mean executed batch of the pipeline's encoder; enc queue = its mean "
                 "queue ms.")
    if len(best_served) > 1:
        first, base = next(iter(best_served.items()))
        for pipeline, point in best_served.items():
            lines.append(f"best served {pipeline}: {point.throughput:.1f} texts/s "
                         f"({point.protocol} c={point.concurrency}) = "
                         f"{point.throughput / base.throughput:.2f} x {first}")
    for tail in half_load_tails(served):
        if tail["ratio"] is None:
            lines.append(f"tail at half load, {tail['pipeline']} {tail['protocol']}: no c=1 point "
                         f"(or no success) to compare with")
            continue
        verdict = "met" if tail["ratio"] <= tail["target"] else "not met"
        lines.append(f"tail at half load, {tail['pipeline']} {tail['protocol']}: P99 "
                     f"{tail['p99_ms']:.1f} ms at r={tail['offered_rps']:.0f}/s = "
                     f"{tail['ratio']:.1f} x the unloaded P50 {tail['unloaded_p50_ms']:.1f} ms "
                     f"(target <= {tail['target']:g} x: {verdict})")
    return "\n".join(lines)


def save_plot(limits: Sequence[LimitResult], served: Sequence[ServedResult], path: Path) -> None:
    """Latency (P50 dashed, P99 solid) against throughput per protocol; limits as verticals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    palette = iter(["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"])
    several = len({s.pipeline for s in served}) > 1
    for pipeline, protocol in sorted({(s.pipeline, s.protocol) for s in served}):
        points = sorted((s for s in served if s.pipeline == pipeline and s.protocol == protocol
                         and s.p99_ms and not s.offered_rps),
                        key=lambda s: s.concurrency)
        xs = [s.throughput for s in points]
        color = next(palette, None)
        name = f"{pipeline} {protocol}" if several else protocol
        ax.plot(xs, [s.p99_ms for s in points], "o-", color=color, label=f"served {name} P99")
        ax.plot(xs, [s.p50_ms for s in points], "s--", color=color, alpha=0.6,
                label=f"served {name} P50")
        for s in points:
            ax.annotate(f"c={s.concurrency}", (s.throughput, s.p99_ms), textcoords="offset points",
                        xytext=(4, 4), fontsize=8)
    bests = {max((r for r in limits if r.pipeline == p), key=lambda r: r.throughput).pipeline:
             max((r for r in limits if r.pipeline == p), key=lambda r: r.throughput)
             for p in {r.pipeline for r in limits}}
    for r in limits:
        best = r is bests[r.pipeline]
        if several and not best:
            continue  # one limit line per pipeline keeps the plot readable
        ax.axvline(r.throughput, color="grey", linestyle="-" if best else ":",
                   linewidth=1.8 if best else 1.0)
        label = f"{r.pipeline} limit" if several else f"{'limit ' if best else ''}b={r.batch_size}"
        ax.annotate(f"{label}{' chunks' if 'chunk' in r.variant and not several else ''}",
                    (r.throughput, 0.98), xycoords=("data", "axes fraction"), rotation=90,
                    va="top", ha="right", fontsize=7, color="dimgrey")
    ax.set_xlabel("throughput (texts/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.set_title(", ".join(sorted({s.pipeline for s in served})) + ": served vs in-process limit")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


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
@click.option("--pipelines", default="text_embedding,text_embedding_int8,text_embedding_bf16",
              show_default=True,
              help="Text pipelines (tokenizer -> encoder ensembles) to measure side by side; "
              "those the repository lacks are skipped with a note.")
@click.option("--batch-sizes", default="1,8,32", show_default=True,
              help="In-process batch sizes.")
@click.option("--concurrency", default="1,8,32", show_default=True,
              help="Served concurrency sweep.")
@click.option("--protocol", type=click.Choice(["grpc", "http", "both"]), default="both",
              show_default=True)
@click.option("--duration", type=click.FloatRange(min=1), default=15.0, show_default=True,
              help="Measured seconds per served point.")
@click.option("--warmup", type=click.FloatRange(min=0), default=3.0, show_default=True,
              help="Unmeasured seconds before each served point.")
@click.option("--min-seconds", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="In-process: repeat passes over the texts for at least this long.")
@click.option("--half-load/--no-half-load", default=True, show_default=True,
              help="After each pipeline's sweep, an open loop at half of its best served "
              "throughput: its P99 against the unloaded P50 (c=1).")
@click.option("--output", type=click.Path(file_okay=False, path_type=Path),
              default=Path("reports/bench"), show_default=True,
              help="Folder for bench.json and bench.png.")
def bench(repository: Path, url: str | None, grpc_url: str | None, texts_file: Path,
          pipelines: str, batch_sizes: str, concurrency: str, protocol: str, duration: float,
          warmup: float, min_seconds: float, half_load: bool, output: Path) -> None:
    """Measure served text pipelines against their in-process limits, in one run on this machine.

    For each pipeline (text_embedding: the exported fp32 encoder; text_embedding_int8: the int8
    one; text_embedding_bf16: OpenVINO in bf16): (a) its tokenizer and encoder from REPOSITORY,
    in this process, with the server's runtime settings, at each batch size (padded to the longest text of the batch, and also split
    into length chunks the way the served runner does); (b) the pipeline over gRPC and HTTP with
    asyncio clients at each concurrency, one text per request. All use the same texts. The ratio
    column is throughput over that pipeline's best in-process throughput.
    """
    if bool(url) != bool(grpc_url):
        raise UserInputError("give both --url and --grpc-url, or neither (embedded server)")
    if not texts_file.is_file():
        raise UserInputError(f"texts file {texts_file} not found")
    texts = [t for t in texts_file.read_text(encoding="utf-8").splitlines() if t.strip()]
    if not texts:
        raise UserInputError(f"texts file {texts_file} has no texts")
    sizes = _ints(batch_sizes, "--batch-sizes")
    levels = _ints(concurrency, "--concurrency")
    protocols = ["grpc", "http"] if protocol == "both" else [protocol]
    names = [p.strip() for p in pipelines.split(",") if p.strip()]
    present = [p for p in names if (repository / p / "config.pbtxt").is_file()]
    for missing in sorted(set(names) - set(present)):
        click.echo(f"pipeline {missing} is not in {repository}: skipped", err=True)
    if not present:
        raise UserInputError(f"--pipelines {pipelines}: none is in {repository} (build it first: "
                             f"tools build-repo --output {repository})")
    setups = [read_setup(repository, p) for p in present]
    output.mkdir(parents=True, exist_ok=True)
    started = time.time()

    limits: list[LimitResult] = []
    for setup in setups:
        click.echo(f"in-process limit of {setup.pipeline} ({setup.encoder}, {setup.onnx_file}, "
                   f"{setup.runtime}): {len(texts)} texts, one session with "
                   f"{setup.limit_threads} intra-op threads "
                   f"(served: {setup.instances} x {setup.intra_op_threads}), "
                   f"max_length {setup.max_length}", err=True)
        encoder = InProcessEncoder(setup)
        for size in sizes:
            variants = [False, True] if (size > 1 and encoder.can_chunk) else [False]
            for chunked in variants:
                result = measure(encoder, texts, size, chunked=chunked, min_seconds=min_seconds)
                limits.append(result)
                click.echo(f"  {result.variant} b={size}: {result.throughput:.1f} texts/s", err=True)
        del encoder  # free the session's threads and memory before the next one and the server
    setup = setups[0]

    served: list[ServedResult] = []
    from tools.serve.session import endpoints

    say = lambda line: click.echo(line, err=True)  # noqa: E731
    embedded = None if (url and grpc_url) else repository
    with endpoints(embedded, url, grpc_url, output / "tritonserver.log", say) as (
        http_url, grpc_endpoint
    ):
        endpoints = {"grpc": grpc_endpoint, "http": http_url}
        for one in setups:
            for proto in protocols:
                for level in levels:
                    result = measure_served(proto, endpoints[proto], http_url, texts, level,
                                            warmup_s=warmup, duration_s=duration,
                                            pipeline=one.pipeline, encoder_model=one.encoder)
                    served.append(result)
                    click.echo(f"  served {one.pipeline} {proto} c={level}: "
                               f"{result.throughput:.1f} texts/s, "
                               f"P99 {result.p99_ms or float('nan'):.1f} ms, errors "
                               f"{result.errors}", err=True)
                if half_load:
                    top = max((x for x in served if x.pipeline == one.pipeline
                               and x.protocol == proto), key=lambda x: x.throughput)
                    result = measure_served(proto, endpoints[proto], http_url, texts, 0,
                                            warmup_s=warmup, duration_s=duration,
                                            pipeline=one.pipeline, encoder_model=one.encoder,
                                            rate=max(top.throughput / 2, 1.0))
                    served.append(result)
                    click.echo(f"  served {one.pipeline} {proto} {result.label} (half of "
                               f"{top.throughput:.1f}): {result.throughput:.1f} texts/s, P99 "
                               f"{result.p99_ms or float('nan'):.1f} ms, errors {result.errors}",
                               err=True)

    table = format_table(limits, served)
    click.echo(table)
    per_pipeline = {}
    for one in setups:
        own = [r for r in limits if r.pipeline == one.pipeline]
        points = [x for x in served if x.pipeline == one.pipeline and not x.offered_rps]
        best, top = max(own, key=lambda r: r.throughput), max(points, key=lambda x: x.throughput)
        per_pipeline[one.pipeline] = {
            "encoder": one.encoder,
            "onnx_file": one.onnx_file,
            "runtime": one.runtime,
            "encoder_setup": {
                "tokenizer_dir": str(one.tokenizer_dir),
                "encoder_dir": str(one.encoder_dir),
                "max_length": one.max_length,
                "intra_op_threads": one.intra_op_threads,
                "instances": one.instances,
                "limit_threads": one.limit_threads,
                "tokenizer_parameters": one.tokenizer_config.get("parameters", {}),
                "encoder_parameters": one.encoder_config.get("parameters", {}),
            },
            "limit": best.to_dict(),
            "best_served": top.to_dict(),
            "best_ratio": top.throughput / best.throughput,
            "half_load": [t for t in half_load_tails(served) if t["pipeline"] == one.pipeline],
        }
    first = per_pipeline[setups[0].pipeline]
    payload: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "repository": str(repository.resolve()),
        "texts_file": str(texts_file.resolve()),
        "texts": len(texts),
        "pipelines": per_pipeline,
        # The first pipeline's figures at the top level, as before several pipelines existed.
        "encoder_setup": first["encoder_setup"],
        "limit": first["limit"],
        "best_served": first["best_served"],
        "best_ratio": first["best_ratio"],
        "in_process": [r.to_dict() for r in limits],
        "served": [x.to_dict() for x in served],
        "table": table,
    }
    (output / "bench.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    save_plot(limits, served, output / "bench.png")
    for name, figures in per_pipeline.items():
        top = figures["best_served"]
        click.echo(f"{name}: best served / limit = {figures['best_ratio']:.2f} "
                   f"({top['protocol']} c={top['concurrency']})")
    click.echo(f"wrote {output / 'bench.json'} and {output / 'bench.png'}")
