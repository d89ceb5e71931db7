"""The bench report: the side-by-side tables, the tail ratio, bench.json and bench.png.

Every figure is a ``tools.load.Point`` (served) or a ``LimitResult`` (in process); this module
only arranges them: ratios over each pipeline's own limit, each variant against the first one,
and the tail target (P99 at half of the best served throughput over P99 at concurrency 1).
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tools import paths
from tools.bench.api_cost import cost_line
from tools.bench.inprocess import LimitResult
from tools.bench.sweep import AROUND, BenchRun
from tools.bench.targets import compute_model
from tools.load import Point

# Issue 27's tail target: queueing at half of the best served throughput adds at most this
# factor to the P99 of one request at a time (same texts, same protocol).
TAIL_TARGET = 1.5


def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def _closed(served: Sequence[Point], pipeline: str, protocol: str | None = None) -> list[Point]:
    """Closed-loop points of ``pipeline`` on ``protocol`` (None: every protocol users get, so
    not the comparisons around the front)."""
    return [s for s in served if s.model == pipeline and not s.offered_rps
            and (s.protocol == protocol if protocol else s.protocol not in AROUND)]


def front_costs(served: Sequence[Point]) -> list[dict[str, Any]]:
    """Per pipeline and protocol measured around the front too (``--front-cost``): throughput
    through the front over around it, at the concurrency where the arm through the front had
    its best throughput with no error in either arm (a refusal by the admission is an error: at
    a concurrency it refuses, the two arms do not carry the same load), and best over best."""
    out = []
    for pipeline in dict.fromkeys(s.model for s in served):
        for around_label, protocol in AROUND.items():
            around = {p.concurrency: p for p in _closed(served, pipeline, around_label)}
            through = {p.concurrency: p for p in _closed(served, pipeline, protocol)}
            if not around or not through:
                continue
            matched = [c for c in through if c in around
                       and not through[c].errors and not around[c].errors]
            at = max(matched, key=lambda c: through[c].throughput, default=None)
            best_through = max(p.throughput for p in through.values())
            best_around = max(p.throughput for p in around.values())
            out.append({
                "pipeline": pipeline, "protocol": protocol, "concurrency": at,
                "through": through[at].throughput if at is not None else None,
                "around": around[at].throughput if at is not None else None,
                "ratio": (through[at].throughput / around[at].throughput
                          if at is not None and around[at].throughput else None),
                "best_through": best_through, "best_around": best_around,
                "best_ratio": best_through / best_around if best_around else None,
            })
    return out


def _front_line(cost: Mapping[str, Any]) -> str:
    name = {"http": "the front, HTTP", "grpc": "the front, gRPC"}[cost["protocol"]]
    line = f"{name}, {cost['pipeline']}: "
    if cost["ratio"] is not None:
        line += (f"at c={cost['concurrency']} through it {cost['through']:.1f} req/s, around it "
                 f"{cost['around']:.1f} req/s = {cost['ratio']:.3f}; ")
    else:
        line += "no concurrency without errors in both arms; "
    return line + (f"best through {cost['best_through']:.1f}, best around "
                   f"{cost['best_around']:.1f} = {cost['best_ratio']:.3f} (same server, one "
                   f"after the other)")


def best_limits(limits: Sequence[LimitResult]) -> dict[str, LimitResult]:
    """Pipeline -> its best in-process result."""
    out: dict[str, LimitResult] = {}
    for r in limits:
        if r.pipeline not in out or r.throughput > out[r.pipeline].throughput:
            out[r.pipeline] = r
    return out


def compute_figures(point: Point) -> dict[str, Any]:
    """The executed batch, queue and compute ms of the model that computed most for ``point``
    (an ensemble's encoder), from Triton's window."""
    name = compute_model(point.models, point.model)
    model = point.models.get(name) if name else None
    return {"compute_model": name,
            "encoder_mean_batch": model.mean_batch if model else None,
            "encoder_queue_ms": model.queue_ms if model else None,
            "encoder_compute_ms": model.compute_ms if model else None}


def cores_busy(point: Point | None) -> dict[str, float] | None:
    """Cores the point's processes kept busy, by role (its ``cores`` meter; roles that used
    none left out), the mean over its passes, and their ``total``; None when the point was not
    metered (a server given by URL)."""
    figures = point.meters.get("cores") if point else None
    if not figures:
        return None
    passes = figures if isinstance(figures, list) else [figures]
    roles = dict.fromkeys(role for one in passes for role in one)
    mean = {role: round(sum(one.get(role, 0.0) for one in passes) / len(passes), 3)
            for role in roles}
    return {**{role: v for role, v in mean.items() if v > 0}, "total": round(sum(mean.values()), 3)}


def tail_ratios(served: Sequence[Point]) -> list[dict[str, Any]]:
    """Per pipeline and protocol with an open-loop point: its P99 against the P99 at c=1, and
    whether both counted the same requests (``same_requests``: as many, from the first, which
    ``--tail-cycles`` gives them), with the cores the server, its front and the load generator
    kept busy at each of the two points (``cores_busy``, ``cores_busy_c1``; ``cpus``: how many
    this process may run on)."""
    out = []
    for s in served:
        if not s.offered_rps:
            continue
        single = next((u for u in _closed(served, s.model, s.protocol) if u.concurrency == 1),
                      None)
        p99_1 = single.p99_ms if single else None
        ratio = (s.p99_ms / p99_1) if (p99_1 and s.p99_ms) else None
        counted = s.requests + s.errors
        counted_1 = single.requests + single.errors if single else 0
        halves = [p.p99_ms for p in s.passes] or [s.p99_ms]
        singles = ([p.p99_ms for p in single.passes] or [single.p99_ms]) if single else []
        out.append({
            "pipeline": s.model, "protocol": s.protocol, "offered_rps": s.offered_rps,
            "throughput": s.throughput, "p99_ms": s.p99_ms, "p99_c1_ms": p99_1,
            "requests": counted, "requests_c1": counted_1,
            "same_requests": bool(counted) and counted == counted_1,
            "ratio": ratio, "target": TAIL_TARGET,
            "passed": None if ratio is None else ratio <= TAIL_TARGET,
            # pass by pass (--tail-cycles N: N of each, the i-th half-load pass against the
            # i-th c=1 pass, measured next to it)
            "p99_passes_ms": halves, "p99_c1_passes_ms": singles,
            "pass_ratios": [h / c if (h and c) else None for h, c in zip(halves, singles)]
            if len(halves) == len(singles) else [],
            "cores_busy": cores_busy(s), "cores_busy_c1": cores_busy(single),
            "cpus": len(os.sched_getaffinity(0)),
        })
    return out


def _tail_line(tail: Mapping[str, Any]) -> str:
    where = f"tail at half load, {tail['pipeline']} {tail['protocol']}"
    if tail["ratio"] is None:
        return f"{where}: no c=1 point (or no success) to compare with"
    verdict = "pass" if tail["passed"] else "FAIL"
    over = (f"both over the same {tail['requests']} requests" if tail["same_requests"] else
            f"over {tail['requests']} and {tail['requests_c1']} requests, not the same ones: "
            f"--tail-cycles 1 sends both every one")
    by_pass = tail.get("pass_ratios") or []
    passes = ("; pass by pass " + " / ".join("-" if r is None else f"{r:.2f}" for r in by_pass)
              if len(by_pass) > 1 else "")
    return (f"{where}: P99 {tail['p99_ms']:.1f} ms at r={tail['offered_rps']:.0f}/s = "
            f"{tail['ratio']:.2f} x the P99 at c=1 {tail['p99_c1_ms']:.1f} ms "
            f"(target <= {tail['target']:g} x: {verdict}; {over}{passes}){_busy_line(tail)}")


def _busy_line(tail: Mapping[str, Any]) -> str:
    """``; cores busy ...`` of a tail line: at half load by role, and at c=1 (empty unmetered)."""
    half, single = tail.get("cores_busy"), tail.get("cores_busy_c1")
    if not half:
        return ""
    server = sum(v for k, v in half.items() if k == "tritonserver" or k.startswith("stubs"))
    front = half.get("front", 0.0)
    return (f"; cores busy {half['total']:.2f} of {tail['cpus']} at half load (tritonserver "
            f"and stubs {server:.2f}, front {front:.2f}, load generator "
            f"{half.get('load generator', 0.0):.2f})"
            + (f", {single['total']:.2f} at c=1" if single else ""))


def format_table(limits: Sequence[LimitResult], served: Sequence[Point],
                 limit_na: Mapping[str, str] | None = None) -> str:
    """The main table, one block per pipeline; ratio is over that pipeline's own limit.

    With several pipelines a line compares each one's best served throughput with the first
    pipeline's, in the same run; the tail ratio of each open-loop point closes the table.
    """
    pipelines = list(dict.fromkeys([r.pipeline for r in limits] + [s.model for s in served]))
    several = len(pipelines) > 1
    width = max([36] + [len(f"{r.pipeline}: {r.variant} *") for r in limits if several]
                + [len(f"served {s.model} {s.protocol}") for s in served])
    header = (f"{'what':<{width}} {'batch/conc':>10} {'req/s':>9} {'P50 ms':>8} {'P99 ms':>8} "
              f"{'batch':>6} {'queue':>7} {'ratio':>6}")
    lines = [header, "-" * len(header)]
    footers, best_served = [], {}
    bests = best_limits(limits)
    for pipeline in pipelines:
        own = [r for r in limits if r.pipeline == pipeline]
        best = bests.get(pipeline)
        tag = f"{pipeline}: " if several else ""
        for r in own:
            mark = " *" if r is best else ""
            lines.append(
                f"{tag + r.variant + mark:<{width}} {'b=' + str(r.batch_size):>10} "
                f"{r.throughput:>9.1f} {r.p50_ms:>8.1f} {r.p99_ms:>8.1f} {'-':>6} {'-':>7} "
                f"{r.throughput / best.throughput:>6.2f}")
        points = [s for s in served if s.model == pipeline]
        for s in points:
            figures = compute_figures(s)
            ratio = s.throughput / best.throughput if best else None
            lines.append(
                f"{'served ' + pipeline + ' ' + s.protocol:<{width}} {s.label:>10} "
                f"{s.throughput:>9.1f} {_fmt(s.p50_ms):>8} {_fmt(s.p99_ms):>8} "
                f"{_fmt(figures['encoder_mean_batch'], '.2f'):>6} "
                f"{_fmt(figures['encoder_queue_ms']):>7} {_fmt(ratio, '.2f'):>6}")
        closed = _closed(points, pipeline)
        if closed:
            best_served[pipeline] = max(closed, key=lambda s: s.throughput)
        if several:
            lines.append("")
        if best:
            footers.append(f"* {tag}limit = {best.variant}, batch {best.batch_size}: "
                           f"{best.throughput:.1f} texts/s.")
        else:
            reason = (limit_na or {}).get(pipeline, "not measured")
            footers.append(f"* {tag}no in-process limit: {reason}")
    lines += footers
    lines.append("batch = mean executed batch of the model that computed most (an ensemble's "
                 "encoder), queue = its mean queue ms (Triton, over the window).")
    if len(best_served) > 1:
        first, base = next(iter(best_served.items()))
        for pipeline, point in best_served.items():
            lines.append(f"best served {pipeline}: {point.throughput:.1f} req/s "
                         f"({point.protocol} c={point.concurrency}) = "
                         f"{point.throughput / base.throughput:.2f} x {first}")
    lines += [_tail_line(t) for t in tail_ratios(served)]
    return "\n".join(lines)


def variant_rows(limits: Sequence[LimitResult], served: Sequence[Point]) -> list[dict[str, Any]]:
    """Per pipeline and protocol: best served throughput, over its own limit, over the first
    pipeline's on the same protocol, and the tail ratio."""
    bests = best_limits(limits)
    pipelines = list(dict.fromkeys(s.model for s in served))
    protocols = list(dict.fromkeys(s.protocol for s in served))
    tails = {(t["pipeline"], t["protocol"]): t for t in tail_ratios(served)}
    rows = []
    for pipeline in pipelines:
        for protocol in protocols:
            own = _closed(served, pipeline, protocol)
            if not own:
                continue
            top = max(own, key=lambda s: s.throughput)
            base = _closed(served, pipelines[0], protocol)
            base_top = max((s.throughput for s in base), default=0.0)
            limit = bests.get(pipeline)
            tail = tails.get((pipeline, protocol), {})
            rows.append({
                "pipeline": pipeline, "protocol": protocol, "best_served": top.throughput,
                "at": top.label, "limit": limit.throughput if limit else None,
                "served_over_limit": top.throughput / limit.throughput if limit else None,
                "base": pipelines[0],
                "over_base": top.throughput / base_top if base_top else None,
                "tail_ratio": tail.get("ratio"), "tail_passed": tail.get("passed"),
            })
    return rows


def format_variants(rows: Sequence[Mapping[str, Any]], conditions: Mapping[str, Any],
                    costs: Sequence[Mapping[str, Any]] = ()) -> str:
    """The variants side by side over the protocols, with the ratios, then what the front
    costs (``front_costs``)."""
    if not rows:
        return ""
    base = rows[0]["base"]
    http = {True: "through the front, as tools serve puts it",
            False: "without the front",
            None: "as the given server serves it"}[conditions.get("front")]
    header = (f"{'pipeline':<28} {'protocol':<15} {'best req/s':>10} {'at':>6} "
              f"{'limit':>7} {'x limit':>8} {'x ' + base:>{max(10, len(base) + 2)}} "
              f"{'tail':>6}")
    lines = [f"side by side ({http}; x limit = over its own in-process limit; x {base} = "
             f"over {base} on the same protocol; tail = P99 at half load / P99 at c=1, target "
             f"<= {TAIL_TARGET:g}):", header, "-" * len(header)]
    for r in rows:
        tail = "-" if r["tail_ratio"] is None else (
            f"{r['tail_ratio']:.2f}{'' if r['tail_passed'] else '!'}")
        lines.append(
            f"{r['pipeline']:<28} {r['protocol']:<15} {r['best_served']:>10.1f} {r['at']:>6} "
            f"{_fmt(r['limit']):>7} {_fmt(r['served_over_limit'], '.2f'):>8} "
            f"{_fmt(r['over_base'], '.2f'):>{max(10, len(base) + 2)}} {tail:>6}")
    lines.append("! = tail ratio over the target")
    lines += [_front_line(cost) for cost in costs]
    return "\n".join(lines)


def save_plot(limits: Sequence[LimitResult], served: Sequence[Point], path: Path) -> None:
    """Latency (P50 dashed, P99 solid) against throughput per protocol; limits as verticals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    palette = iter(["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
                    "tab:pink", "tab:gray", "tab:olive", "tab:cyan"])
    several = len({s.model for s in served}) > 1
    for pipeline, protocol in sorted({(s.model, s.protocol) for s in served}):
        points = sorted((s for s in _closed(served, pipeline, protocol) if s.p99_ms),
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
    bests = best_limits(limits)
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
    ax.set_xlabel("throughput (req/s; one text or image per request)")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.set_title(", ".join(sorted({s.model for s in served})) + ": served vs in-process limit")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def served_row(point: Point) -> dict[str, Any]:
    """One served point for bench.json: the engine's figures, the pipeline and its compute
    model's batch and queue (the keys bench.json always had)."""
    return {**point.to_dict(), "pipeline": point.model, **compute_figures(point)}


def _pipeline_figures(run: BenchRun, name: str) -> dict[str, Any]:
    target = next(t for t in run.targets if t.name == name)
    own = [r for r in run.limits if r.pipeline == name]
    closed = _closed(run.served, name)
    best = max(own, key=lambda r: r.throughput) if own else None
    top = max(closed, key=lambda s: s.throughput) if closed else None
    figures: dict[str, Any] = {"payload": target.payload, "steps": list(target.steps),
                               "requests": len(target.requests),
                               "load": target.scenario.describe(),
                               "limit": best.to_dict() if best else None,
                               "limit_na": run.limit_na.get(name, ""),
                               "best_served": served_row(top) if top else None,
                               "best_ratio": (top.throughput / best.throughput
                                              if best and top else None),
                               "tail": [t for t in tail_ratios(run.served)
                                        if t["pipeline"] == name]}
    setup = target.setup
    if setup is not None:
        figures.update({
            "encoder": setup.encoder, "onnx_file": setup.onnx_file, "runtime": setup.runtime,
            "encoder_setup": {
                "tokenizer_dir": str(setup.tokenizer_dir),
                "encoder_dir": str(setup.encoder_dir),
                "max_length": setup.max_length,
                "intra_op_threads": setup.intra_op_threads,
                "instances": setup.instances,
                "limit_threads": setup.limit_threads,
                "tokenizer_parameters": setup.tokenizer_config.get("parameters", {}),
                "encoder_parameters": setup.encoder_config.get("parameters", {}),
            }})
    return figures


def payload(run: BenchRun, table: str, variants: str) -> dict[str, Any]:
    """bench.json: the run's conditions, every figure, the tables."""
    plan = run.plan
    per_pipeline = {t.name: _pipeline_figures(run, t.name) for t in run.targets}
    first = per_pipeline[run.targets[0].name]
    texts = next((t.texts for t in run.targets if t.texts), ())
    texts_file = (plan.data if plan.data else paths.TEXTS_FILE) if texts else None
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(run.started)),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "conditions": run.conditions,
        "repository": str(plan.repository.resolve()),
        "spec": str(plan.spec_path.resolve()),
        "data": str(plan.data.resolve()) if plan.data else None,
        # The texts of the first text pipeline (what its in-process limit encodes).
        "texts_file": str(texts_file.resolve()) if texts_file else None,
        "texts": len(texts),
        "pipelines": per_pipeline,
        "notes": run.notes,
        # The first pipeline's figures at the top level, as before several pipelines existed.
        "encoder_setup": first.get("encoder_setup"),
        "limit": first["limit"],
        "best_served": first["best_served"],
        "best_ratio": first["best_ratio"],
        "tail_target": TAIL_TARGET,
        "tail": tail_ratios(run.served),
        "variants": variant_rows(run.limits, run.served),
        "front_cost": front_costs(run.served),
        "api_cost": [c.to_dict() for c in run.api_costs],
        "in_process": [r.to_dict() for r in run.limits],
        "served": [served_row(s) for s in run.served],
        "table": table,
        "variants_table": variants,
    }


def summary_lines(run: BenchRun) -> list[str]:
    """One line per pipeline: best served over its limit (or why there is none)."""
    lines = []
    for target in run.targets:
        figures = _pipeline_figures(run, target.name)
        top = figures["best_served"]
        if top is None:
            lines.append(f"{target.name}: nothing served")
        elif figures["best_ratio"] is None:
            lines.append(f"{target.name}: best served {top['throughput']:.1f} req/s "
                         f"({top['protocol']} c={top['concurrency']}); in-process limit n/a "
                         f"({figures['limit_na']})")
        else:
            lines.append(f"{target.name}: best served / limit = {figures['best_ratio']:.2f} "
                         f"({top['protocol']} c={top['concurrency']})")
    return lines + [cost_line(c) for c in run.api_costs]


def write(run: BenchRun, output: Path) -> tuple[str, str]:
    """Write bench.json and bench.png into ``output``; return the two tables."""
    table = format_table(run.limits, run.served, run.limit_na)
    variants = format_variants(variant_rows(run.limits, run.served), run.conditions,
                               front_costs(run.served))
    output.mkdir(parents=True, exist_ok=True)
    document = payload(run, table, variants)
    (output / "bench.json").write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    save_plot(run.limits, run.served, output / "bench.png")
    return table, variants
