"""The in-process limit: tokenizer + the exported MiniLM ONNX model in this process, no server.

Reads the same files and settings the served models use from the built repository
(``tokenizer.json``, ``max_length``, ``model.onnx``, ONNX Runtime threads) and times batches.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tools.errors import UserInputError
from tools.loadtest.gate import percentile

TOKENIZER_MODEL = "text_tokenizer"
ENCODER_MODEL = "minilm_encoder"


@dataclass(frozen=True)
class EncoderSetup:
    """What the served text pipeline runs with, read from the built repository."""

    tokenizer_file: Path
    max_length: int
    onnx_file: Path
    intra_op_threads: int
    inter_op_threads: int
    pad_values: dict[str, int]
    pipeline_ops_dir: Path
    run_overhead: int | None


@dataclass
class LimitResult:
    """Throughput and per-batch latency of one in-process variant."""

    variant: str
    batch_size: int
    texts: int
    seconds: float
    throughput: float
    p50_ms: float
    p99_ms: float

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return asdict(self)


def _parameters(config_path: Path) -> dict[str, str]:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    try:
        config = text_format.Parse(config_path.read_text(encoding="utf-8"),
                                   model_config_pb2.ModelConfig())
    except (OSError, text_format.ParseError) as exc:
        raise UserInputError(f"cannot read model config {config_path}: {exc}") from exc
    return {key: value.string_value for key, value in config.parameters.items()}


def read_setup(repository: Path) -> EncoderSetup:
    """Read the tokenizer's and the encoder's files and settings from a built repository.

    Raises:
        UserInputError: the repository lacks the text pipeline's models or files.
    """
    tok_dir, enc_dir = repository / TOKENIZER_MODEL, repository / ENCODER_MODEL
    for d in (tok_dir, enc_dir):
        if not (d / "config.pbtxt").is_file():
            raise UserInputError(f"{d}/config.pbtxt not found: build the repository first "
                                 f"(tools build-repo --output {repository})")
    tok, enc = _parameters(tok_dir / "config.pbtxt"), _parameters(enc_dir / "config.pbtxt")
    tok_file = tok_dir / "1" / tok.get("tokenizer_file", "tokenizer.json")
    onnx_file = enc_dir / "1" / enc.get("onnx_file", "model.onnx")
    for f, model in ((tok_file, TOKENIZER_MODEL), (onnx_file, ENCODER_MODEL)):
        if not f.is_file():
            raise UserInputError(f"model {model}: {f} not found in the built repository")
    return EncoderSetup(
        tokenizer_file=tok_file,
        max_length=int(tok.get("max_length", "256")),
        onnx_file=onnx_file,
        intra_op_threads=int(enc.get("intra_op_threads", "1")),
        inter_op_threads=int(enc.get("inter_op_threads", "1")),
        pad_values={k: int(v) for k, v in json.loads(enc.get("pad_values", "{}")).items()},
        pipeline_ops_dir=enc_dir / "1",
        run_overhead=int(enc["run_overhead"]) if "run_overhead" in enc else None,
    )


def _pipeline_ops(setup: EncoderSetup) -> tuple[Any, Any]:
    """The served code's own ``pipeline_ops.text`` and ``pipeline_ops.onnx_session`` modules."""
    path = str(setup.pipeline_ops_dir)
    if path not in sys.path:
        sys.path.insert(0, path)
    text = importlib.import_module("pipeline_ops.text")
    session = importlib.import_module("pipeline_ops.onnx_session")
    return text, session


class InProcessEncoder:
    """Tokenize + pad + one ONNX Runtime run per batch, exactly as configured for serving."""

    def __init__(self, setup: EncoderSetup) -> None:
        text_ops, session_ops = _pipeline_ops(setup)
        self.setup = setup
        self.tokenizer = text_ops.load_tokenizer(setup.tokenizer_file, setup.max_length)
        self.session = session_ops.make_session(
            setup.onnx_file, setup.intra_op_threads, setup.inter_op_threads
        )
        self._plan_chunks: Callable[..., list[list[int]]] | None = getattr(
            session_ops, "plan_chunks", None
        )
        self._overhead = (
            setup.run_overhead
            if setup.run_overhead is not None
            else getattr(session_ops, "DEFAULT_RUN_OVERHEAD", 0)
        )
        self._input_names = [i.name for i in self.session.get_inputs()]

    @property
    def can_chunk(self) -> bool:
        """True when the served runner splits batches by length (``plan_chunks``)."""
        return self._plan_chunks is not None and self._overhead > 0

    def _run(self, rows_ids: Sequence[Sequence[int]], rows_mask: Sequence[Sequence[int]]) -> np.ndarray:
        longest = max(len(r) for r in rows_ids)
        ids = np.full((len(rows_ids), longest), self.setup.pad_values.get("input_ids", 0), np.int64)
        mask = np.full((len(rows_ids), longest), self.setup.pad_values.get("attention_mask", 0),
                       np.int64)
        for i, (r, m) in enumerate(zip(rows_ids, rows_mask)):
            ids[i, : len(r)] = r
            mask[i, : len(m)] = m
        feed = {"input_ids": ids, "attention_mask": mask}
        return self.session.run(None, {k: feed[k] for k in self._input_names})[0]

    def encode(self, texts: Sequence[str], chunked: bool = False) -> np.ndarray:
        """Embeddings of ``texts`` as one batch (or in the server's length chunks)."""
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=True)
        ids = [e.ids for e in encodings]
        mask = [e.attention_mask for e in encodings]
        if not (chunked and self.can_chunk and len(texts) > 1):
            return self._run(ids, mask)
        out = np.empty((len(texts), 384), np.float32)
        for chunk in self._plan_chunks([len(r) for r in ids], self._overhead):
            out[chunk] = self._run([ids[i] for i in chunk], [mask[i] for i in chunk])
        return out


def measure(
    encoder: InProcessEncoder,
    texts: Sequence[str],
    batch_size: int,
    *,
    chunked: bool = False,
    min_seconds: float = 0.0,
) -> LimitResult:
    """Encode all ``texts`` in consecutive batches (at least one pass, at least ``min_seconds``).

    One untimed batch warms the session up first.
    """
    encoder.encode(texts[:batch_size], chunked=chunked)
    latencies, done = [], 0
    start = time.perf_counter()
    while True:
        for i in range(0, len(texts), batch_size):
            batch = texts[i : i + batch_size]
            t0 = time.perf_counter()
            encoder.encode(batch, chunked=chunked)
            latencies.append((time.perf_counter() - t0) * 1000.0)
            done += len(batch)
        if time.perf_counter() - start >= min_seconds:
            break
    seconds = time.perf_counter() - start
    latencies.sort()
    variant = "in-process, length chunks" if chunked else "in-process, pad to longest"
    return LimitResult(
        variant=variant,
        batch_size=batch_size,
        texts=done,
        seconds=seconds,
        throughput=done / seconds,
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
    )
