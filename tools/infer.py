"""``tools infer``: send one request to a served model or pipeline and print a readable result.

Inputs are built from the model's own metadata and config as the server reports them, so the
command works for any model: text and image bytes feed string inputs, ``--input`` feeds any.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np

from tools.command import ToolCommand, grpc_url_option, protocol_option, url_option
from tools.errors import InferenceError, UserInputError
from tools.net import check_host_port

DEFAULT_URLS = {"http": "127.0.0.1:8000", "grpc": "127.0.0.1:8001"}
_FLOAT_TYPES = ("FP16", "FP32", "FP64", "BF16")


def check_url(url: str, protocol: str) -> str:
    """``url`` stripped of surrounding blanks if it is ``host:port``, as tritonclient expects.

    Raises:
        UserInputError: not ``host:port`` (``tools.net.check_host_port``), naming the option of
            ``protocol``'s endpoint (``--url`` for HTTP, ``--grpc-url`` for gRPC).
    """
    option = "--grpc-url" if protocol == "grpc" else "--url"
    return check_host_port(url, option, DEFAULT_URLS.get(protocol, DEFAULT_URLS["http"]))


@dataclass(frozen=True)
class ServedTensor:
    """One input or output of a served model, as the server describes it."""

    name: str
    datatype: str  # KServe v2 name: FP32, INT64, BYTES, ...
    dims: tuple[int, ...]  # without the batch axis
    optional: bool = False


@dataclass(frozen=True)
class ServedModel:
    """What ``tools infer`` needs to know about a served model."""

    name: str
    max_batch_size: int
    inputs: tuple[ServedTensor, ...]
    outputs: tuple[ServedTensor, ...]

    @property
    def batching(self) -> bool:
        """True when the model takes a leading batch axis."""
        return self.max_batch_size > 0


@dataclass
class InferResult:
    """Outputs of one request and its round-trip latency."""

    model: ServedModel
    outputs: dict[str, np.ndarray]
    latency_ms: float


class Client:
    """A thin, protocol-neutral wrapper over tritonclient's HTTP and gRPC clients.

    Args:
        url: ``host:port`` of the server's endpoint for ``protocol``.
        protocol: ``"http"`` or ``"grpc"``.
        timeout_s: Network timeout of each call (gRPC: the deadline of each call).

    Raises:
        UserInputError: ``url`` is not ``host:port`` or ``protocol`` is unknown.
        InferenceError: tritonclient could not create a client for ``url``.
    """

    def __init__(self, url: str, protocol: str = "http", timeout_s: float = 60.0) -> None:
        if protocol not in ("http", "grpc"):
            raise UserInputError(f"protocol {protocol!r} is neither 'http' nor 'grpc'")
        url = check_url(url, protocol)
        self.url, self.protocol, self.timeout_s = url, protocol, timeout_s
        if protocol == "http":
            import tritonclient.http as module

            create = functools.partial(
                module.InferenceServerClient,
                url,
                connection_timeout=timeout_s,
                network_timeout=timeout_s,
            )
        else:
            import tritonclient.grpc as module

            create = functools.partial(module.InferenceServerClient, url)
        try:
            self._client = create()
        except Exception as exc:  # tritonclient raises anything from ValueError to its own
            message = exc.message() if hasattr(exc, "message") else str(exc)
            raise InferenceError(
                f"cannot create a {protocol} client for {url}: {message or type(exc).__name__}"
            ) from exc
        self._module = module

    def _call(self, what: str, fn, *args, **kwargs):
        from tritonclient.utils import InferenceServerException

        try:
            return fn(*args, **kwargs)
        except InferenceServerException as exc:
            raise InferenceError(
                f"{what} at {self.url} ({self.protocol}): {exc.message()}"
            ) from exc
        except OSError as exc:
            raise InferenceError(
                f"cannot reach tritonserver at {self.url} ({self.protocol}) for {what}: {exc}; "
                "is `tools serve` running?"
            ) from exc

    def model_spec(self, model: str) -> ServedModel:
        """Read a model's inputs, outputs and batching from the server.

        Raises:
            InferenceError: the server does not know the model or cannot be reached.
        """
        what = f"model '{model}'"
        if self.protocol == "http":
            metadata = self._call(what, self._client.get_model_metadata, model)
            config = self._call(what, self._client.get_model_config, model)
        else:
            deadline = {"as_json": True, "client_timeout": self.timeout_s}
            metadata = self._call(what, self._client.get_model_metadata, model, **deadline)
            config = self._call(what, self._client.get_model_config, model, **deadline)["config"]
        max_batch = int(config.get("max_batch_size", 0))
        optional = {i["name"] for i in config.get("input", []) if i.get("optional")}

        def tensors(entries: Sequence[Mapping[str, Any]]) -> tuple[ServedTensor, ...]:
            specs = []
            for entry in entries:
                shape = tuple(int(d) for d in entry.get("shape", []))
                dims = shape[1:] if max_batch > 0 else shape
                specs.append(
                    ServedTensor(entry["name"], entry["datatype"], dims, entry["name"] in optional)
                )
            return tuple(specs)

        return ServedModel(
            model,
            max_batch,
            tensors(metadata.get("inputs", [])),
            tensors(metadata.get("outputs", [])),
        )

    def infer(self, spec: ServedModel, inputs: Mapping[str, np.ndarray]) -> InferResult:
        """Send one request; every output of the model is requested.

        Raises:
            InferenceError: the server refused or failed the request (its message is kept).
        """
        m = self._module
        request = []
        for name, array in inputs.items():
            datatype = next(i.datatype for i in spec.inputs if i.name == name)
            tensor = m.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            request.append(tensor)
        if self.protocol == "http":
            outputs = [m.InferRequestedOutput(o.name, binary_data=True) for o in spec.outputs]
            kwargs: dict[str, Any] = {}
        else:
            outputs = [m.InferRequestedOutput(o.name) for o in spec.outputs]
            kwargs = {"client_timeout": self.timeout_s}
        start = time.perf_counter()
        result = self._call(
            f"model '{spec.name}'",
            self._client.infer,
            spec.name,
            request,
            outputs=outputs,
            **kwargs,
        )
        latency_ms = (time.perf_counter() - start) * 1000.0
        return InferResult(
            spec, {o.name: result.as_numpy(o.name) for o in spec.outputs}, latency_ms
        )

    def close(self) -> None:
        """Close the underlying connection."""
        self._client.close()


# ------------------------------------------------------------------------------ building inputs


def _np_dtype(datatype: str) -> Any:
    from tritonclient.utils import triton_to_np_dtype

    return triton_to_np_dtype(datatype)


def _shape_rows(spec: ServedModel, tensor: ServedTensor, rows: list[bytes]) -> np.ndarray:
    """Rows of bytes -> an object array shaped [rows, *dims] (or dims without batching)."""
    if not spec.batching and len(rows) != 1:
        raise UserInputError(
            f"model '{spec.name}' does not batch (max_batch_size 0): give one value for "
            f"input '{tensor.name}', not {len(rows)}"
        )
    per_row = [d if d > 0 else 1 for d in tensor.dims] or [1]
    if int(np.prod(per_row)) != 1:
        raise UserInputError(
            f"input '{tensor.name}' of model '{spec.name}' takes {list(tensor.dims)} strings per "
            "row; pass it with --input NAME=JSON"
        )
    array = np.array(rows, dtype=np.object_)
    return array.reshape([len(rows), *per_row] if spec.batching else list(per_row))


def _string_input(spec: ServedModel, preferred: str, option: str) -> ServedTensor:
    strings = [t for t in spec.inputs if t.datatype == "BYTES"]
    for tensor in strings:
        if tensor.name.upper() == preferred:
            return tensor
    if len(strings) == 1:
        return strings[0]
    names = ", ".join(t.name for t in strings) or "none"
    raise UserInputError(
        f"{option} needs one string input but model '{spec.name}' has: {names}; "
        "use --input NAME=JSON"
    )


def build_inputs(
    spec: ServedModel,
    *,
    texts: Sequence[str] = (),
    images: Sequence[Path] = (),
    raw: Sequence[str] = (),
) -> dict[str, np.ndarray]:
    """Turn command-line values into named arrays the model accepts.

    Args:
        spec: The model, as the server describes it.
        texts: Values for the model's string input (``TEXT`` if it has several), one row each.
        images: Files whose bytes feed the string input (``IMAGE`` if it has several).
        raw: ``NAME=JSON`` values; a value without the batch axis gets one added.

    Returns:
        Input name -> array.

    Raises:
        UserInputError: an unknown or missing input, bad JSON, or a file that cannot be read.
    """
    inputs: dict[str, np.ndarray] = {}
    if texts:
        tensor = _string_input(spec, "TEXT", "--text")
        inputs[tensor.name] = _shape_rows(spec, tensor, [t.encode("utf-8") for t in texts])
    if images:
        tensor = _string_input(spec, "IMAGE", "--image")
        try:
            data = [Path(p).read_bytes() for p in images]
        except OSError as exc:
            raise UserInputError(f"cannot read image {exc.filename}: {exc.strerror}") from exc
        inputs[tensor.name] = _shape_rows(spec, tensor, data)
    by_name = {t.name: t for t in spec.inputs}
    for item in raw:
        name, sep, value = item.partition("=")
        if not sep or name not in by_name:
            known = ", ".join(by_name)
            raise UserInputError(
                f"--input {item!r}: model '{spec.name}' has no input {name!r} (inputs: {known})"
            )
        tensor = by_name[name]
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            raise UserInputError(f"--input {name}: value is not JSON ({exc})") from exc
        if tensor.datatype == "BYTES":
            array = np.vectorize(lambda v: str(v).encode("utf-8"), otypes=[np.object_])(
                np.array(parsed, dtype=np.object_)
            )
        else:
            try:
                array = np.array(parsed, dtype=_np_dtype(tensor.datatype))
            except (TypeError, ValueError) as exc:
                raise UserInputError(
                    f"--input {name}: not {tensor.datatype} values ({exc})"
                ) from exc
        if spec.batching and array.ndim == len(tensor.dims):
            array = array[np.newaxis, ...]
        inputs[name] = array
    missing = [t for t in spec.inputs if t.name not in inputs and not t.optional]
    if missing:
        wanted = ", ".join(f"{t.name} ({t.datatype} {list(t.dims)})" for t in missing)
        raise UserInputError(f"model '{spec.name}' also needs input {wanted}")
    return inputs


# ---------------------------------------------------------------------------------- rendering


def _text(value: Any) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _classification_outputs(spec: ServedModel) -> tuple[str, str, str | None] | None:
    """(label, score, index) output names when the model answers with a top-k table."""
    labels = [o for o in spec.outputs if o.datatype == "BYTES" and "LABEL" in o.name.upper()]
    scores = [o for o in spec.outputs if o.datatype in _FLOAT_TYPES and "SCORE" in o.name.upper()]
    if not labels or not scores:
        return None
    index = [o for o in spec.outputs if o.datatype.startswith(("INT", "UINT"))]
    return labels[0].name, scores[0].name, index[0].name if index else None


def _entity_lists(value: np.ndarray) -> list[list[dict[str, Any]]] | None:
    """Per row, the entities a token-classification pipeline answered (one JSON array of
    objects with ``start`` and ``end`` per element), or None when ``value`` holds something else."""
    found = []
    for element in value.reshape(-1):
        try:
            entities = json.loads(_text(element))
        except ValueError:
            return None
        if not isinstance(entities, list) or not all(
                isinstance(e, dict) and {"start", "end"} <= set(e) for e in entities):
            return None
        found.append(entities)
    return found


def _entity_table(rows: list[list[dict[str, Any]]]) -> list[str]:
    """One table per text: label, score, character span, and the word last."""
    lines = []
    for r, entities in enumerate(rows):
        lines.append(f"  row {r}: {len(entities)} entit{'y' if len(entities) == 1 else 'ies'}")
        if not entities:
            continue
        label = "entity_group" if "entity_group" in entities[0] else "entity"
        index = "index" in entities[0]
        lines.append(f"    {label:<16} {'score':>8} {'start':>6} {'end':>6}"
                     + (f" {'index':>6}" if index else "") + "  word")
        for e in entities:
            lines.append(f"    {str(e.get(label, ''))[:16]:<16} {float(e.get('score', 0)):>8.4f} "
                         f"{e['start']:>6} {e['end']:>6}"
                         + (f" {e.get('index', ''):>6}" if index else "") + f"  {e.get('word', '')}")
    return lines


def render(result: InferResult) -> str:
    """A readable report: a top-k table for classifiers, dims/norm/first values for vectors."""
    spec = result.model
    lines = [f"model {spec.name}: {result.latency_ms:.1f} ms"]
    shown: set[str] = set()
    table = _classification_outputs(spec)
    if table:
        label_name, score_name, index_name = table
        labels, scores = result.outputs[label_name], result.outputs[score_name]
        indices = result.outputs[index_name] if index_name else None
        rows = labels.reshape(-1, labels.shape[-1]) if labels.ndim else labels.reshape(1, 1)
        for r in range(rows.shape[0]):
            lines.append(f"row {r}" if rows.shape[0] > 1 else "top-k")
            header = f"  {'rank':>4}  " + (f"{index_name:>12}  " if index_name else "")
            lines.append(header + f"{label_name:<28} {score_name:>10}")
            for k in range(rows.shape[1]):
                index_cell = f"{int(indices.reshape(rows.shape)[r, k]):>12}  " if index_name else ""
                score = float(scores.reshape(rows.shape)[r, k])
                lines.append(
                    f"  {k + 1:>4}  {index_cell}{_text(rows[r, k])[:28]:<28} {score:>10.4f}"
                )
        shown.update(n for n in table if n)
    for out in spec.outputs:
        if out.name in shown:
            continue
        value = result.outputs[out.name]
        lines.append(f"{out.name} {out.datatype} shape {list(value.shape)}")
        if out.datatype in _FLOAT_TYPES and value.ndim >= 1 and value.size:
            rows = value.reshape(-1, value.shape[-1]) if spec.batching else value.reshape(1, -1)
            for r, row in enumerate(rows):
                first = ", ".join(f"{v:.4f}" for v in row[:8])
                more = ", ..." if row.size > 8 else ""
                prefix = f"  row {r}: " if rows.shape[0] > 1 else "  "
                lines.append(
                    f"{prefix}dims {row.size}, L2 norm {float(np.linalg.norm(row)):.4f}, "
                    f"values [{first}{more}]"
                )
        elif out.datatype == "BYTES" and _entity_lists(value) is not None:
            lines += _entity_table(_entity_lists(value))
        elif out.datatype == "BYTES":
            texts = [_text(v) for v in value.reshape(-1)[:8]]
            lines.append("  " + ", ".join(repr(t) for t in texts))
        else:
            lines.append("  " + np.array2string(value, threshold=16, edgeitems=4))
    return "\n".join(lines)


def as_json(result: InferResult) -> str:
    """The outputs and latency as one JSON object (strings decoded as UTF-8; an output of entity
    arrays, as a token-classification pipeline answers, decoded into them)."""

    def plain(array: np.ndarray) -> Any:
        if array.dtype == np.object_:
            decode = json.loads if _entity_lists(array) is not None else _text
            return np.vectorize(lambda v: decode(_text(v)), otypes=[np.object_])(array).tolist()
        return array.tolist()

    return json.dumps(
        {
            "model": result.model.name,
            "latency_ms": round(result.latency_ms, 3),
            "outputs": {name: plain(value) for name, value in result.outputs.items()},
        }
    )


def endpoint(protocol: str, url: str | None, grpc_url: str | None) -> str:
    """The endpoint ``protocol`` uses: ``--url`` (HTTP) or ``--grpc-url`` (gRPC), else its default.

    ``--url`` with ``--protocol grpc`` and no ``--grpc-url`` is the old spelling (``--url`` was
    the endpoint of the protocol chosen): it is read as ``--grpc-url``, with a note.
    """
    if protocol == "http":
        return url or DEFAULT_URLS["http"]
    if grpc_url is None and url is not None:
        click.echo("note: tools infer --protocol grpc --url is now --grpc-url (--url is the HTTP "
                   "endpoint; the old use still works)", err=True)
        return url
    return grpc_url or DEFAULT_URLS["grpc"]


@click.command("infer", cls=ToolCommand)
@click.argument("model")
@click.option(
    "--text", "texts", multiple=True, help="Text for the model's string input; repeat for a batch."
)
@click.option(
    "--image",
    "images",
    multiple=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="Image file whose bytes feed the model's string input; repeat for a batch.",
)
@click.option(
    "--input",
    "raw",
    multiple=True,
    metavar="NAME=JSON",
    help="Any input as JSON, e.g. --input INPUT0=[1,2,3]; the batch axis is added if missing.",
)
@protocol_option(["http", "grpc"], "http", "Client protocol: which endpoint gets the request.")
@url_option("the server (with --protocol http).", show_default=DEFAULT_URLS["http"])
@grpc_url_option("the server (with --protocol grpc).", show_default=DEFAULT_URLS["grpc"])
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=60.0,
    show_default=True,
    help="Network timeout in seconds.",
)
@click.option("--json", "json_output", is_flag=True, help="Print outputs and latency as JSON.")
def infer(
    model: str,
    texts: tuple[str, ...],
    images: tuple[Path, ...],
    raw: tuple[str, ...],
    protocol: str,
    url: str | None,
    grpc_url: str | None,
    timeout: float,
    json_output: bool,
) -> None:
    """Send one request to MODEL (a model or a pipeline) and print its outputs and latency.

    \b
    Examples:
      tools infer text_embedding --text "a cat on a mat"
      tools infer image_classification --image cat.jpg --protocol grpc
      tools infer minilm_encoder --input input_ids=[101,2023,102] --input attention_mask=[1,1,1]
    """
    client = Client(endpoint(protocol, url, grpc_url), protocol, timeout)
    try:
        spec = client.model_spec(model)
        result = client.infer(spec, build_inputs(spec, texts=texts, images=images, raw=raw))
    finally:
        client.close()
    click.echo(as_json(result) if json_output else render(result))
