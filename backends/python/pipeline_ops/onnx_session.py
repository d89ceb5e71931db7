"""ONNX execution for the generic ``onnx_runner`` Python model (CPU target): one session (ONNX
Runtime, or OpenVINO with ``runtime: openvino``), requests validated one by one (variable dims
within ``max_dims``), ragged inputs padded, rows run in length-homogeneous chunks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .batching import pad_stack, run_batched
from .errors import ConfigurationError, InvalidInput

# Triton data types (model config spelling) -> NumPy dtypes.
TRITON_DTYPES: dict[str, Any] = {
    "TYPE_BOOL": np.bool_,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
}

# A separate ONNX Runtime run costs about as much as this many extra (row x token) positions of
# MiniLM on the 2-core CPU machine: batch 1 at ~31 tokens took 9.2 ms, batch 32 x 32 tokens took
# 127 ms (0.124 ms per position), so one run's fixed cost is ~5 ms ~ 40 positions. Used to decide
# how to split rows of different lengths into chunks (see docs/padding.md).
DEFAULT_RUN_OVERHEAD = 40

# The runtimes ``make_session`` opens, and the inference precisions each accepts.
RUNTIME_PRECISIONS: dict[str, tuple[str, ...]] = {
    "onnxruntime": ("fp32",),
    "openvino": ("fp32", "bf16"),
}


@dataclass(frozen=True)
class RunnerTensor:
    """One input or output of the model config (dims exclude the batch axis)."""

    name: str
    dtype: Any
    dims: tuple[int, ...]

    @property
    def ragged_axes(self) -> tuple[int, ...]:
        """Axes (counting the batch axis as 0) whose size varies (``-1`` in the config)."""
        return tuple(i + 1 for i, d in enumerate(self.dims) if d < 0)


@dataclass(frozen=True)
class RunnerConfig:
    """What ``onnx_runner`` reads from its Triton model config."""

    model_name: str
    inputs: tuple[RunnerTensor, ...]
    outputs: tuple[RunnerTensor, ...]
    onnx_file: str = "model.onnx"
    intra_op_threads: int = 1
    inter_op_threads: int = 1
    pad_values: Mapping[str, Any] = field(default_factory=dict)
    max_dims: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    run_overhead: int = DEFAULT_RUN_OVERHEAD
    runtime: str = "onnxruntime"
    inference_precision: str = "fp32"

    @classmethod
    def from_model_config(cls, config: Mapping[str, Any] | str) -> RunnerConfig:
        """Parse Triton's model config (``args['model_config']``, JSON text or dict).

        Parameters read (string values): ``onnx_file`` (default ``model.onnx``),
        ``intra_op_threads`` (1), ``inter_op_threads`` (1), ``pad_values`` (JSON object input
        name -> value; required for every input with a ``-1`` dim), ``max_dims`` (JSON object
        input name -> the largest size of each of its ``dims``, e.g. ``{"input_ids": [256]}``;
        required for every input with a ``-1`` dim, fixed dims repeat their size; a request
        beyond it is rejected), ``run_overhead`` (rows of different lengths are split into chunks
        when a chunk saves more padded positions than this; ``0`` runs every execute call as one
        padded batch), ``runtime`` (``onnxruntime``, the default, or ``openvino``),
        ``inference_precision`` (``fp32``, or ``bf16`` with ``openvino``).

        Raises:
            ConfigurationError: a parameter is malformed or a ragged input has no pad value or
                no maximum dims.
        """
        if isinstance(config, str):
            config = json.loads(config)
        name = config.get("name", "<unnamed>")
        params = {k: v.get("string_value", "") for k, v in (config.get("parameters") or {}).items()}

        def spec(entry: Mapping[str, Any], kind: str) -> RunnerTensor:
            data_type = entry.get("data_type", "")
            if data_type not in TRITON_DTYPES:
                raise ConfigurationError(
                    f"model '{name}': {kind} '{entry.get('name')}' has data_type {data_type!r}, "
                    f"which onnx_runner does not serve"
                )
            dims = tuple(int(d) for d in entry.get("dims", []))
            return RunnerTensor(entry["name"], np.dtype(TRITON_DTYPES[data_type]), dims)

        inputs = tuple(spec(e, "input") for e in config.get("input", []))
        outputs = tuple(spec(e, "output") for e in config.get("output", []))
        if not inputs or not outputs:
            raise ConfigurationError(f"model '{name}': the config declares no inputs or no outputs")

        def integer(key: str, default: int) -> int:
            raw = params.get(key, "")
            if raw == "":
                return default
            try:
                value = int(raw)
            except ValueError:
                raise ConfigurationError(
                    f"model '{name}': parameter '{key}' must be an integer, got {raw!r}"
                ) from None
            if value < 0:
                raise ConfigurationError(
                    f"model '{name}': parameter '{key}' must be >= 0, got {value}"
                )
            return value

        def per_input(key: str) -> dict[str, Any]:
            """A JSON object parameter keyed by input name, with an entry for every ragged input."""
            try:
                value = json.loads(params.get(key) or "{}")
            except json.JSONDecodeError as exc:
                raise ConfigurationError(
                    f"model '{name}': parameter '{key}' is not valid JSON ({exc})"
                ) from None
            if not isinstance(value, dict):
                raise ConfigurationError(f"model '{name}': parameter '{key}' must be a JSON object")
            unknown = sorted(set(value) - {s.name for s in inputs})
            if unknown:
                raise ConfigurationError(
                    f"model '{name}': parameter '{key}' names unknown inputs {unknown}"
                )
            missing = [s.name for s in inputs if s.ragged_axes and s.name not in value]
            if missing:
                raise ConfigurationError(
                    f"model '{name}': inputs {missing} have variable dims but no entry in "
                    f"parameter '{key}'"
                )
            return value

        pad_values = per_input("pad_values")
        max_dims = {}
        for input_name, sizes in per_input("max_dims").items():
            dims = next(s.dims for s in inputs if s.name == input_name)
            if not (
                isinstance(sizes, list)
                and len(sizes) == len(dims)
                and all(type(m) is int and m > 0 for m in sizes)
                and all(d < 0 or m == d for m, d in zip(sizes, dims))
            ):
                raise ConfigurationError(
                    f"model '{name}': parameter 'max_dims' entry '{input_name}' must list a "
                    f"positive size for each of its dims {list(dims)} (a fixed dim repeats its "
                    f"size), got {sizes!r}"
                )
            max_dims[input_name] = tuple(sizes)
        runtime = params.get("runtime") or "onnxruntime"
        precision = params.get("inference_precision") or "fp32"
        if runtime not in RUNTIME_PRECISIONS:
            raise ConfigurationError(
                f"model '{name}': parameter 'runtime' must be one of "
                f"{sorted(RUNTIME_PRECISIONS)}, got {runtime!r}"
            )
        if precision not in RUNTIME_PRECISIONS[runtime]:
            raise ConfigurationError(
                f"model '{name}': parameter 'inference_precision' {precision!r} is not one "
                f"{runtime} runs (it runs {list(RUNTIME_PRECISIONS[runtime])})"
            )
        return cls(
            model_name=name,
            inputs=inputs,
            outputs=outputs,
            onnx_file=params.get("onnx_file") or "model.onnx",
            intra_op_threads=integer("intra_op_threads", 1),
            inter_op_threads=integer("inter_op_threads", 1),
            pad_values=pad_values,
            max_dims=max_dims,
            run_overhead=integer("run_overhead", DEFAULT_RUN_OVERHEAD),
            runtime=runtime,
            inference_precision=precision,
        )


def make_session(
    path: str | Path, intra_op_threads: int, inter_op_threads: int = 1,
    runtime: str = "onnxruntime", precision: str = "fp32",
) -> Any:
    """Build one CPU session for a shared, small machine: ONNX Runtime, or OpenVINO
    (:class:`OpenVinoSession`, same ``run``/``get_inputs``/``get_outputs`` surface).

    ONNX Runtime: sequential execution, the given thread counts, no memory patterns, and
    thread spinning off for both thread pools: idle ORT threads otherwise busy-wait and steal
    the cores from the tokenizer, the server and the load generator.


    Args:
        path: the ``.onnx`` file.
        intra_op_threads: threads inside one operator (0 lets the runtime choose).
        inter_op_threads: threads across operators (unused in sequential mode, kept at 1).
        runtime: ``onnxruntime`` or ``openvino``.
        precision: ``fp32``, or ``bf16`` (openvino).

    Returns:
        An ``onnxruntime.InferenceSession`` or an :class:`OpenVinoSession`.
    """
    if runtime == "openvino":
        return OpenVinoSession(path, intra_op_threads, precision)
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = inter_op_threads
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Memory patterns are planned per input shape and kept; batches of every size and length
    # reach this session, so they only add memory (EfficientNet-Lite0, batches 1-16: 652 MB with
    # them, 477 without, at the same speed; MiniLM, lengths 8-256: 372 vs 340 MB).
    options.enable_mem_pattern = False
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@dataclass(frozen=True)
class SessionTensor:
    """An input or output of a session, as ``session.get_inputs()`` lists it (``.name``)."""

    name: str


def openvino_properties(threads: int, precision: str) -> dict[str, Any]:
    """OpenVINO CPU plugin properties of one served instance.

    One stream of ``threads`` threads, latency-oriented, and **no CPU pinning**: OpenVINO pins a
    stream's threads to cores by default, and two instances (two stub processes) then pin to the
    same core and share it: served throughput fell from 358 to 186 texts/s on a 2-core machine.
    ``bf16`` runs MatMuls in bfloat16 where the CPU has AVX512_BF16 or AMX;
    elsewhere OpenVINO runs fp32.
    """
    return {
        "INFERENCE_NUM_THREADS": max(int(threads), 1),
        "NUM_STREAMS": 1,
        "PERFORMANCE_HINT": "LATENCY",
        "ENABLE_CPU_PINNING": False,
        "INFERENCE_PRECISION_HINT": {"fp32": "f32", "bf16": "bf16"}[precision],
    }


class OpenVinoSession:
    """One compiled OpenVINO model behind ONNX Runtime's ``run``/``get_inputs``/``get_outputs``.

    The ONNX file is read directly (no IR on disk); one infer request is reused, since a stub
    runs one ``execute`` at a time. Outputs are copied out of the request's buffers, which the
    next ``run`` overwrites.
    """

    def __init__(self, path: str | Path, threads: int, precision: str = "fp32"):
        import openvino

        core = openvino.Core()
        self.compiled = core.compile_model(str(path), "CPU", openvino_properties(threads, precision))
        self.request = self.compiled.create_infer_request()
        self._outputs = {o.get_any_name(): o for o in self.compiled.outputs}
        # What the plugin actually runs: "bf16", or "f32" on a CPU without bf16 support.
        hint = self.compiled.get_property("INFERENCE_PRECISION_HINT")
        self.precision = hint.to_string() if hasattr(hint, "to_string") else str(hint)

    def get_inputs(self) -> list[SessionTensor]:
        return [SessionTensor(i.get_any_name()) for i in self.compiled.inputs]

    def get_outputs(self) -> list[SessionTensor]:
        return [SessionTensor(name) for name in self._outputs]

    def run(self, names: Sequence[str] | None, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        result = self.request.infer(dict(feed))
        return [np.array(result[self._outputs[n]]) for n in (names or list(self._outputs))]


def plan_chunks(lengths: Sequence[int], run_overhead: int) -> list[list[int]]:
    """Group rows into chunks that minimise padded positions plus a fixed cost per run.

    Rows are sorted by length; a chunk is a run of consecutive sorted rows padded to its longest.
    The cost of a chunk is ``run_overhead + rows * longest``; dynamic programming finds the
    cheapest split. ``run_overhead`` 0 or uniform lengths give one chunk with all rows.

    Args:
        lengths: the unpadded length of each row.
        run_overhead: fixed cost of one extra run, in padded positions.

    Returns:
        Row indices per chunk; every row appears exactly once.
    """
    n = len(lengths)
    if n == 0:
        return []
    if run_overhead <= 0 or min(lengths) == max(lengths):
        return [list(range(n))]
    order = sorted(range(n), key=lambda i: lengths[i])
    ordered = [lengths[i] for i in order]
    best = [0.0] + [float("inf")] * n  # best[j]: cheapest split of the first j sorted rows
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        longest = ordered[j - 1]
        for i in range(j):
            cost = best[i] + run_overhead + (j - i) * longest
            if cost < best[j]:
                best[j], cut[j] = cost, i
    chunks = []
    j = n
    while j > 0:
        chunks.append(order[cut[j] : j])
        j = cut[j]
    return chunks[::-1]


class OnnxRunner:
    """Validates requests against the config and runs them through one session.

    Ragged inputs (``-1`` dims) are right-padded with their ``pad_values`` to the longest request
    of the call. For ``[rows, length]`` inputs, trailing positions where every ragged input equals
    its pad value are treated as padding: rows are trimmed to their real length, sorted, and run in
    the chunks :func:`plan_chunks` picks. An output ``[rows, length, ...]`` of such inputs is per
    token (a token classifier's logits): each request gets it at its own inputs' length, 0 at the
    padding positions its chunk left out. This relies on the premise of ``pad_values``: padding
    does not change a row's outputs. A request whose variable dims exceed ``max_dims`` is
    rejected before it reaches ONNX Runtime.
    """

    def __init__(self, config: RunnerConfig, session: Any):
        """Check that the session's inputs and outputs match the config.

        Raises:
            ConfigurationError: a config input or output is missing from the ONNX graph.
        """
        self.config = config
        self.session = session
        graph_inputs = {i.name for i in session.get_inputs()}
        graph_outputs = {o.name for o in session.get_outputs()}
        for kind, specs, names in (
            ("input", config.inputs, graph_inputs),
            ("output", config.outputs, graph_outputs),
        ):
            absent = [s.name for s in specs if s.name not in names]
            if absent:
                raise ConfigurationError(
                    f"model '{config.model_name}': config {kind}s {absent} are not in "
                    f"{config.onnx_file} (it has {sorted(names)})"
                )
        self.output_names = [s.name for s in config.outputs]
        ragged = [s for s in config.inputs if s.ragged_axes]
        tokens = bool(ragged) and all(s.ragged_axes == (1,) and len(s.dims) == 1 for s in ragged)
        # Outputs [rows, length, ...] of token inputs [rows, length] are per token (a token
        # classifier's logits): each request gets them at its own length.
        self._per_token = tuple(
            s.name for s in config.outputs if tokens and s.ragged_axes == (1,))
        # Chunking by length applies when every ragged input is [rows, length] sharing one length
        # and every output has a fixed shape or is per token (chunks of different widths are
        # written into one array at the call's width).
        self._chunkable = tokens and all(
            not s.ragged_axes or s.name in self._per_token for s in config.outputs)
        self._ragged = ragged

    @property
    def chunks_by_length(self) -> bool:
        """True when ``compute`` splits rows into length chunks (``run_overhead`` > 0)."""
        return self._chunkable and self.config.run_overhead > 0

    def prepare(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Validate one request: every input present, dtype and rank as configured, variable dims
        within ``max_dims``.

        Raises:
            InvalidInput: names the input and the problem.
        """
        prepared = {}
        for spec in self.config.inputs:
            value = inputs.get(spec.name)
            if value is None:
                raise InvalidInput(f"input '{spec.name}' is missing")
            if not isinstance(value, np.ndarray):
                raise InvalidInput(
                    f"input '{spec.name}' must be a tensor, got {type(value).__name__}"
                )
            if value.dtype != spec.dtype:
                raise InvalidInput(
                    f"input '{spec.name}' must have dtype {spec.dtype}, got {value.dtype}"
                )
            expected = ["batch"] + list(spec.dims)
            if value.ndim != len(expected):
                raise InvalidInput(
                    f"input '{spec.name}' must have rank {len(expected)} (shape {expected}), "
                    f"got shape {list(value.shape)}"
                )
            for axis, dim in enumerate(spec.dims, start=1):
                if dim >= 0 and value.shape[axis] != dim:
                    raise InvalidInput(
                        f"input '{spec.name}' must have shape {expected}, got {list(value.shape)}"
                    )
            if value.shape[0] == 0:
                raise InvalidInput(f"input '{spec.name}' holds an empty batch (0 rows)")
            limits = self.config.max_dims.get(spec.name, ())
            for axis, limit in enumerate(limits, start=1):
                if value.shape[axis] > limit:
                    raise InvalidInput(
                        f"input '{spec.name}' has shape {list(value.shape)}: axis {axis} holds "
                        f"{value.shape[axis]}, above this model's limit of {limit} (max_dims)"
                    )
            prepared[spec.name] = value
        if self._chunkable:
            lengths = {prepared[s.name].shape[1] for s in self._ragged}
            if len(lengths) != 1:
                detail = ", ".join(f"{s.name}={list(prepared[s.name].shape)}" for s in self._ragged)
                raise InvalidInput(f"inputs disagree on the sequence length ({detail})")
        return prepared

    def _row_lengths(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """Unpadded length per row: up to the last position where a ragged input is not padding."""
        width = batch[self._ragged[0].name].shape[1]
        content = np.zeros((len(batch[self._ragged[0].name]), width), dtype=bool)
        for spec in self._ragged:
            content |= batch[spec.name] != self.config.pad_values[spec.name]
        last = width - np.argmax(content[:, ::-1], axis=1)
        return np.where(content.any(axis=1), last, 1)

    def _run(self, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        try:
            outputs = self.session.run(self.output_names, dict(feed))
        except Exception as exc:  # the runtime's own exception types
            runtime = {"openvino": "OpenVINO"}.get(self.config.runtime, "ONNX Runtime")
            raise RuntimeError(
                f"model '{self.config.model_name}': {runtime} failed: {exc}"
            ) from exc
        return [
            np.ascontiguousarray(out, dtype=spec.dtype)
            for out, spec in zip(outputs, self.config.outputs)
        ]

    def compute(self, prepared: list[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """Pad ragged inputs, run (in length-homogeneous chunks when they pay), keep row order."""
        batch = {}
        for spec in self.config.inputs:
            parts = [item[spec.name] for item in prepared]
            if spec.ragged_axes:
                batch[spec.name] = pad_stack(parts, self.config.pad_values[spec.name])
            else:
                batch[spec.name] = np.concatenate(parts, axis=0)
        if not self._chunkable:
            return dict(zip(self.output_names, self._run(batch)))

        lengths = self._row_lengths(batch)
        chunks = plan_chunks(lengths.tolist(), self.config.run_overhead)
        rows, call_width = len(lengths), batch[self._ragged[0].name].shape[1]
        results: list[np.ndarray | None] = [None] * len(self.output_names)
        for chunk in chunks:
            index = np.asarray(chunk)
            width = int(lengths[index].max())
            feed = {
                name: (
                    value[index, :width] if name in {s.name for s in self._ragged} else value[index]
                )
                for name, value in batch.items()
            }
            for k, out in enumerate(self._run(feed)):
                per_token = self.output_names[k] in self._per_token
                if results[k] is None:
                    # a per-token output is 0 at positions its chunk left out (all padding)
                    inner = (call_width, *out.shape[2:]) if per_token else out.shape[1:]
                    results[k] = np.zeros((rows, *inner), dtype=out.dtype)
                if per_token:
                    results[k][index, :width] = out
                else:
                    results[k][index] = out
        return dict(zip(self.output_names, results))

    def run(
        self, requests: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, np.ndarray] | Exception]:
        """Answer one ``execute`` call: per request its outputs, or its own error (see
        ``run_batched``: ``InvalidInput`` for a bad request, what the run raised for a request
        ONNX Runtime fails on). A per-token output has its request's own length."""
        results = run_batched(requests, self.prepare, self.compute)
        for inputs, result in zip(requests, results):
            if self._per_token and isinstance(result, dict):
                width = np.shape(inputs[self._ragged[0].name])[1]
                for name in self._per_token:
                    result[name] = np.ascontiguousarray(result[name][:, :width])
        return results


def load_runner(model_config: Mapping[str, Any] | str, version_dir: str | Path) -> OnnxRunner:
    """Parse the config, open ``onnx_file`` from ``version_dir`` in one session, check the fit.

    Raises:
        ConfigurationError: the config is malformed, the file is missing, or the graph's inputs
            and outputs do not match the config.
    """
    config = RunnerConfig.from_model_config(model_config)
    onnx_path = Path(version_dir) / config.onnx_file
    if not onnx_path.is_file():
        raise ConfigurationError(
            f"model '{config.model_name}': parameter 'onnx_file' names {onnx_path}, "
            "which does not exist"
        )
    session = make_session(onnx_path, config.intra_op_threads, config.inter_op_threads,
                           config.runtime, config.inference_precision)
    return OnnxRunner(config, session)
