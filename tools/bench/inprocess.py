"""The in-process limit: the served text pipeline's own code in this process, without a server.

Loads ``pipeline_ops`` from the built repository and builds the tokenizer and the encoder's
``OnnxRunner`` from the models' own ``config.pbtxt`` exactly as ``text_tokenizer`` and
``minilm_encoder`` do in ``initialize``; a batch of texts is one request to each, so the padding,
the length chunks and the ONNX Runtime settings are the served ones.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from tools import stats
from tools.errors import InferenceError, UserInputError

TOKENIZER_MODEL = "text_tokenizer"
ENCODER_MODEL = "minilm_encoder"
PIPELINE = "text_embedding"
VERSION = "1"


@dataclass(frozen=True)
class EncoderSetup:
    """The served text pipeline's configs (Triton's JSON form) and version folders."""

    tokenizer_config: dict[str, Any]
    tokenizer_dir: Path
    encoder_config: dict[str, Any]
    encoder_dir: Path
    pipeline: str = PIPELINE

    @property
    def encoder(self) -> str:
        """The encoder model's name."""
        return self.encoder_config.get("name", ENCODER_MODEL)

    @property
    def onnx_file(self) -> str:
        """The ONNX graph the encoder serves (``model.onnx``, ``.fused`` or ``.int8``)."""
        return self._parameter(self.encoder_config, "onnx_file", "model.onnx")

    @property
    def runtime(self) -> str:
        """What runs the encoder's graph: ``onnxruntime``, or ``openvino fp32|bf16``."""
        runtime = self._parameter(self.encoder_config, "runtime", "onnxruntime")
        if runtime == "onnxruntime":
            return runtime
        return f"{runtime} {self._parameter(self.encoder_config, 'inference_precision', 'fp32')}"

    def _parameter(self, config: dict[str, Any], key: str, default: str) -> str:
        return config.get("parameters", {}).get(key, {}).get("string_value") or default

    @property
    def max_length(self) -> int:
        """The tokenizer's ``max_length`` (as ``text_tokenizer`` reads it)."""
        return int(self._parameter(self.tokenizer_config, "max_length", "256"))

    @property
    def intra_op_threads(self) -> int:
        """The encoder's ONNX Runtime intra-op threads (per instance)."""
        return int(self._parameter(self.encoder_config, "intra_op_threads", "1"))

    @property
    def instances(self) -> int:
        """How many instances of the encoder the server runs."""
        return sum(int(g.get("count", 1)) for g in self.encoder_config.get("instance_group", [])) or 1

    @property
    def limit_threads(self) -> int:
        """Threads of the in-process limit: the cores all served instances use together
        (2 instances x 1 thread are measured against one session with 2 threads)."""
        return self.instances * self.intra_op_threads

    def limit_config(self) -> dict[str, Any]:
        """The encoder's config with ``intra_op_threads`` set to ``limit_threads``."""
        config = copy.deepcopy(self.encoder_config)
        config.setdefault("parameters", {})["intra_op_threads"] = {"string_value": str(self.limit_threads)}
        return config


@dataclass
class LimitResult:
    """Throughput and per-batch latency of one in-process variant of one pipeline."""

    variant: str
    batch_size: int
    texts: int
    seconds: float
    throughput: float
    p50_ms: float
    p99_ms: float
    pipeline: str = PIPELINE

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return asdict(self)


def model_config(config_path: Path) -> dict[str, Any]:
    """``config.pbtxt`` as the JSON-style dict Triton hands a Python model's ``initialize``."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    try:
        config = text_format.Parse(config_path.read_text(encoding="utf-8"),
                                   model_config_pb2.ModelConfig())
    except (OSError, text_format.ParseError) as exc:
        raise UserInputError(f"cannot read model config {config_path}: {exc}") from exc
    return json_format.MessageToDict(config, preserving_proto_field_name=True)


def pipeline_models(repository: Path, pipeline: str) -> tuple[str, str]:
    """(tokenizer, encoder) model names of a text pipeline: its ensemble's two steps.

    Raises:
        UserInputError: no such ensemble, or not a tokenizer -> encoder pipeline.
    """
    path = repository / pipeline / "config.pbtxt"
    if not path.is_file():
        raise UserInputError(f"{path} not found: no pipeline {pipeline!r} in {repository} "
                             f"(build it first: tools build-repo --repository {repository})")
    steps = model_config(path).get("ensemble_scheduling", {}).get("step", [])
    if len(steps) != 2:
        raise UserInputError(f"pipeline {pipeline!r} has {len(steps)} steps; tools bench measures "
                             f"text pipelines of two (tokenizer -> encoder)")
    return steps[0]["model_name"], steps[1]["model_name"]


def read_setup(repository: Path, pipeline: str = PIPELINE) -> EncoderSetup:
    """Read a text pipeline's tokenizer and encoder configs from a built repository.

    Raises:
        UserInputError: the repository lacks the pipeline or its models.
    """
    tokenizer, encoder = (TOKENIZER_MODEL, ENCODER_MODEL)
    if (repository / pipeline / "config.pbtxt").is_file() or pipeline != PIPELINE:
        tokenizer, encoder = pipeline_models(repository, pipeline)
    tok_dir, enc_dir = repository / tokenizer, repository / encoder
    for d in (tok_dir, enc_dir):
        if not (d / "config.pbtxt").is_file():
            raise UserInputError(f"{d}/config.pbtxt not found: build the repository first "
                                 f"(tools build-repo --repository {repository})")
    return EncoderSetup(
        tokenizer_config=model_config(tok_dir / "config.pbtxt"),
        tokenizer_dir=tok_dir / VERSION,
        encoder_config=model_config(enc_dir / "config.pbtxt"),
        encoder_dir=enc_dir / VERSION,
        pipeline=pipeline,
    )


def _pipeline_ops(setup: EncoderSetup) -> SimpleNamespace:
    """The served code's own ``pipeline_ops`` modules (copied into the encoder's version folder)."""
    path = str(setup.encoder_dir)
    if path not in sys.path:
        sys.path.insert(0, path)
    names = ("errors", "onnx_session", "text", "triton_io")
    return SimpleNamespace(**{n: importlib.import_module(f"pipeline_ops.{n}") for n in names})


class InProcessEncoder:
    """``text_tokenizer`` + ``minilm_encoder`` as served, called in this process.

    ``encode(texts)`` sends the texts as one request through ``tokenize_requests`` and then
    ``OnnxRunner.run``. ``chunked=False`` runs the batch as one padded ONNX Runtime run
    (``run_overhead`` 0), ``chunked=True`` with the served ``run_overhead`` (length chunks).
    """

    def __init__(self, setup: EncoderSetup) -> None:
        ops = _pipeline_ops(setup)
        self.setup = setup
        self._text = ops.text
        try:
            self.settings = ops.text.TokenizerSettings.from_parameters(
                ops.triton_io.parameters(setup.tokenizer_config), setup.tokenizer_dir,
                setup.tokenizer_config.get("name", TOKENIZER_MODEL),
            )
            self.chunked_runner = ops.onnx_session.load_runner(setup.limit_config(),
                                                               setup.encoder_dir)
        except ops.errors.ConfigurationError as exc:
            raise UserInputError(f"built repository: {exc}") from exc
        self.tokenizer = ops.text.load_tokenizer(self.settings.tokenizer_file,
                                                 self.settings.max_length)
        self.pad_id = ops.text.pad_token_id(self.tokenizer)
        self.padded_runner = ops.onnx_session.OnnxRunner(
            dataclasses.replace(self.chunked_runner.config, run_overhead=0),
            self.chunked_runner.session,
        )

    @property
    def can_chunk(self) -> bool:
        """True when the served runner splits batches by length."""
        return self.chunked_runner.chunks_by_length

    def encode(self, texts: Sequence[str], chunked: bool = False) -> np.ndarray:
        """Embeddings of ``texts`` as one request (or in the served runner's length chunks).

        Raises:
            InferenceError: the served code rejected the texts or failed on them (names the model).
        """
        request = {self._text.TEXT_INPUT: np.array([[t.encode("utf-8")] for t in texts],
                                                   dtype=np.object_)}
        (tokens,) = self._text.tokenize_requests(
            self.tokenizer, [request], self.pad_id, self.settings.buckets,
            self.settings.max_text_bytes,
        )
        if isinstance(tokens, Exception):
            raise InferenceError(f"model {self.setup.tokenizer_config.get('name')}: {tokens}")
        runner = self.chunked_runner if chunked else self.padded_runner
        (outputs,) = runner.run([tokens])
        if isinstance(outputs, Exception):
            raise InferenceError(f"model {self.setup.encoder}: {outputs}")
        (embedding,) = outputs.values()
        return embedding


def measure(
    encoder: InProcessEncoder,
    texts: Sequence[str],
    batch_size: int,
    *,
    chunked: bool = False,
    min_seconds: float = 0.0,
) -> LimitResult:
    """Encode all ``texts`` in consecutive batches (at least one pass, at least ``min_seconds``).

    One untimed batch warms the session up first. P50/P99 are ``tools.stats``' percentiles of
    the per-batch latencies.
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
    latency = stats.latency_summary(latencies)
    variant = "in-process, length chunks" if chunked else "in-process, pad to longest"
    return LimitResult(
        pipeline=encoder.setup.pipeline,
        variant=variant,
        batch_size=batch_size,
        texts=done,
        seconds=seconds,
        throughput=done / seconds,
        p50_ms=latency.p50_ms,
        p99_ms=latency.p99_ms,
    )
