"""The load of any pipeline or model of the spec, derived from its typed inputs.

A string input is text or an encoded image, as the Python step that consumes it says (its
backend); several text inputs go as pairs; numeric inputs are generated inside the spec's shape
ranges (token ids within the vocabulary, masks all ones). ``data`` replaces the shipped payloads:
a file of texts, a folder of images, or JSON lines (one request per line, any input names).
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from tools import paths
from tools.errors import UserInputError
from tools.load.request import Request

IMAGES_DIR = paths.IMAGES_DIR
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png"})
JSON_LINES_SUFFIXES = frozenset({".jsonl", ".ndjson", ".json"})
# Python backends that take a string input as an encoded image; every other string is text.
IMAGE_BACKENDS = frozenset({"image_preprocess"})
GENERATED_REQUESTS = 64
# Generated lengths of a dynamic axis stop at twice its `opt` (the length the spec calls typical),
# never past its `max`: the spec's longest inputs are for parity, not for a realistic load.
OPT_FACTOR = 2
UNDECLARED_AXIS = (1, 16)  # a dynamic dim without a declared range (Python models have none)
# Token ids below this exist in every vocabulary (BERT's [unused] block starts at 1).
SAFE_VOCABULARY = 100
_SEGMENT_IDS = ("token_type_ids", "segment_ids")


class InputKind(str, enum.Enum):
    """What a scenario sends for one input."""

    TEXT = "text"
    IMAGE = "image"
    TENSOR = "tensor"


class UnknownScenario(UserInputError):
    """The name is not a pipeline or model of the spec (the message lists the known ones)."""


class DataError(UserInputError):
    """A ``--data`` file or folder does not fit the scenario (the message names line and input)."""


@dataclass(frozen=True)
class OutputContract:
    """What an answer must hold for one output: dtype and dims (``-1`` where dynamic)."""

    name: str
    dtype: str
    dims: tuple[int, ...]

    def problem(self, array: Any, batch: int) -> str | None:
        """Why ``array`` is not this output for ``batch`` rows, or None when it is."""
        if array is None:
            return f"{self.name} is missing from the response"
        expected = (batch, *self.dims)
        shape = tuple(getattr(array, "shape", ()))
        if len(shape) != len(expected) or any(e not in (-1, s) for e, s in zip(expected, shape)):
            shown = "(" + ", ".join("N" if e == -1 else str(e) for e in expected) + ")"
            return f"{self.name} has shape {shape}, expected {shown}"
        if array.dtype != np.dtype(self.dtype):
            return f"{self.name} is {array.dtype}, expected {self.dtype}"
        if array.dtype.kind == "f" and np.isnan(array).any():
            return f"{self.name} holds NaN"
        return None


@dataclass(frozen=True)
class InputSource:
    """How one input of a scenario is filled, in words (``describe``, reports)."""

    name: str
    kind: InputKind
    how: str


@dataclass(frozen=True)
class Scenario:
    """A pipeline or model under load: its requests and the contract of its answers.

    Attributes:
        name: The scenario's name: the pipeline or model (SLO entries use it).
        model: The model requests go to (the same name).
        requests: Every request (``tools.load.Request``), in order; users cycle through them.
        labels: Which payload each request is (``text-3``, a file name, ``line-7``), for the
            records.
        sources: How each input was filled.
        outputs: What each answer must hold.
    """

    name: str
    model: str
    requests: tuple[Request, ...]
    labels: tuple[str, ...]
    sources: tuple[InputSource, ...]
    outputs: tuple[OutputContract, ...]

    @property
    def output_names(self) -> tuple[str, ...]:
        """The outputs every request asks for."""
        return tuple(o.name for o in self.outputs)

    def check(self, request: Request, outputs: Mapping[str, np.ndarray]) -> str | None:
        """Why an answer to ``request`` breaks the contract, or None when it holds."""
        batch = int(next(iter(request.inputs.values())).shape[0])
        for contract in self.outputs:
            problem = contract.problem(outputs.get(contract.name), batch)
            if problem:
                return problem
        return None

    @cached_property
    def digest(self) -> str:
        """sha256 over every request's inputs: equal digests mean the same load data."""
        digest = hashlib.sha256(self.model.encode())
        for request, label in zip(self.requests, self.labels):
            digest.update(label.encode() + b"\0")
            for name in sorted(request.inputs):
                array = request.inputs[name]
                digest.update(f"{name}:{array.dtype}:{array.shape}".encode())
                if array.dtype == np.object_:
                    for value in array.reshape(-1):
                        digest.update(len(value).to_bytes(8, "little") + bytes(value))
                else:
                    digest.update(np.ascontiguousarray(array).tobytes())
        return digest.hexdigest()

    def describe(self) -> list[str]:
        """One line per input: what is sent and where it comes from."""
        return [f"{s.name}: {s.how}" for s in self.sources]


# --------------------------------------------------------------------------- the spec


def _is_pipeline(entry: Any) -> bool:
    return hasattr(entry, "steps")


def _is_python(entry: Any) -> bool:
    return hasattr(entry, "backend")


def scenario_names(spec: Any) -> list[str]:
    """Every pipeline, then every model, of the spec's own target: what a scenario may name."""
    own = spec.for_target(spec.target)
    return [e.name for e in (*own.pipelines, *own.models, *own.python_models)]


def _entry(spec: Any, name: str) -> Any:
    known = scenario_names(spec)
    if name not in known:
        raise UnknownScenario(
            f"--scenario {name}: not a pipeline or model of {spec.path} for target {spec.target}"
            f" (known: {', '.join(known) or 'none'})")
    return spec.find(name)


def _tensor(entry: Any, name: str) -> Any:
    return next(t for t in entry.inputs if t.name == name)


def _leaf(spec: Any, entry: Any, name: str) -> tuple[Any, Any]:
    """The model that consumes input ``name`` of ``entry`` (through a pipeline's steps), and its
    own input tensor; the entry itself when it is not a pipeline."""
    seen = 0
    while _is_pipeline(entry) and seen < 16:
        seen += 1
        step = next((s for s in entry.steps if name in dict(s.inputs).values()), None)
        if step is None:
            break
        model_input = next(k for k, v in dict(step.inputs).items() if v == name)
        entry, name = spec.find(step.model), model_input
    return entry, _tensor(entry, name)


def _kind(leaf: Any, tensor: Any) -> InputKind:
    if tensor.dtype != "string":
        return InputKind.TENSOR
    if _is_python(leaf) and leaf.backend in IMAGE_BACKENDS:
        return InputKind.IMAGE
    return InputKind.TEXT


def _consumer_text(leaf: Any) -> str:
    return f"backend {leaf.backend} of {leaf.name}" if _is_python(leaf) else leaf.name


def _declared_axis(leaf: Any, axis: str) -> Any | None:
    find = getattr(leaf, "axis", None)
    if find is None:
        return None
    try:
        return find(axis)
    except (StopIteration, KeyError, LookupError, ValueError):
        return None


@dataclass(frozen=True)
class _AxisRange:
    low: int
    high: int  # highest generated length
    limit: int  # highest length the spec serves (what --data may send)
    how: str


def _axis_range(leaf: Any, axis: str) -> _AxisRange:
    declared = _declared_axis(leaf, axis)
    if declared is None:
        low, high = UNDECLARED_AXIS
        return _AxisRange(low, high, high, f"{low}..{high} (no range declared for axis {axis!r} "
                                          f"of {leaf.name})")
    high = min(declared.max, max(declared.min, OPT_FACTOR * declared.opt))
    return _AxisRange(declared.min, high, declared.max,
                      f"{declared.min}..{high} (axis {axis!r} of {leaf.name}: min {declared.min},"
                      f" opt {declared.opt}, max {declared.max}; capped at {OPT_FACTOR} x opt)")


def _is_token_ids(name: str) -> bool:
    lower = name.lower()
    return lower not in _SEGMENT_IDS and (lower.endswith("input_ids") or lower in ("ids",
                                                                                  "token_ids"))


def _vocabulary_size(path: Path) -> int:
    if path.name == "vocab.txt":
        return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path)).get_vocab_size(with_added_tokens=True)


def _tokenizer_files(spec: Any, leaf: Any) -> Iterator[Path]:
    """Tokenizer files that describe ``leaf``'s ids: beside its source, or the ``files`` of the
    Python model that produces its ids in a pipeline."""
    from tools.build_repo.spec import resolve_file

    root = Path(spec.path).parent
    folders = []
    recipe = getattr(leaf, "recipe", None)
    if recipe is not None and getattr(recipe, "path", None):
        folders.append(root / recipe.path)
    if getattr(leaf, "onnx", ""):
        folders.append((root / leaf.onnx).parent)
    for folder in folders:
        for name in ("tokenizer.json", "vocab.txt"):
            if (folder / name).is_file():
                yield folder / name
    for pipeline in spec.pipelines:
        for index, step in enumerate(pipeline.steps):
            if step.model != leaf.name:
                continue
            fed = set(dict(step.inputs).values())
            for earlier in pipeline.steps[:index]:
                if not fed & set(dict(earlier.outputs).values()):
                    continue
                producer = spec.find(earlier.model)
                for name, location in dict(getattr(producer, "files", ())).items():
                    if name.endswith(("tokenizer.json", "vocab.txt")):
                        try:
                            yield resolve_file(location, root)
                        except UserInputError:
                            continue


def _vocabulary(spec: Any, leaf: Any) -> tuple[int, str]:
    for path in _tokenizer_files(spec, leaf):
        size = _vocabulary_size(path)
        return size, f"token ids in [0, {size}) (vocabulary of {path})"
    return SAFE_VOCABULARY, (f"token ids in [0, {SAFE_VOCABULARY}) (no tokenizer found for "
                             f"{leaf.name}: a bound every vocabulary holds)")


# --------------------------------------------------------------------------- payload sources


def load_texts(path: Path = paths.TEXTS_FILE) -> list[str]:
    """Texts one per line (UTF-8; default: the shipped ones), empty lines skipped."""
    return [line for line in _read_lines(path) if line.strip()]


def load_images(directory: Path = IMAGES_DIR) -> list[tuple[str, bytes]]:
    """The images of a folder (default: the shipped photos) as (file name, encoded bytes),
    sorted by name."""
    return [(p.name, p.read_bytes()) for p in sorted(directory.iterdir())
            if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()]


def _read_lines(path: Path) -> list[str]:
    try:
        return Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise DataError(f"{path}: {exc.strerror}") from None


def _is_json_lines(path: Path) -> bool:
    if path.suffix.lower() in JSON_LINES_SUFFIXES:
        return True
    first = next((line for line in _read_lines(path) if line.strip()), "")
    try:
        return isinstance(json.loads(first), dict)
    except ValueError:
        return False


def _bytes_array(value: bytes, tensor: Any) -> np.ndarray:
    """One row of ``tensor``'s shape (dynamic dims 1) holding ``value`` everywhere."""
    shape = tuple(d if isinstance(d, int) else 1 for d in tensor.shape[1:])
    return np.full((1, *shape), value, dtype=np.object_)


# --------------------------------------------------------------------------- --data JSON lines


def _strings(value: Any, kind: InputKind, where: str, base: Path) -> Any:
    """Nested lists of JSON strings -> nested lists of bytes (an image input reads files)."""
    if isinstance(value, list):
        return [_strings(v, kind, where, base) for v in value]
    if isinstance(value, dict) and set(value) == {"base64"} and isinstance(value["base64"], str):
        try:
            return base64.b64decode(value["base64"], validate=True)
        except binascii.Error as exc:
            raise DataError(f"{where}: not base64 ({exc})") from None
    if not isinstance(value, str):
        raise DataError(f"{where}: expected a string (or {{\"base64\": ...}}), got "
                        f"{type(value).__name__}")
    if kind is InputKind.IMAGE:
        file = base / value
        if not file.is_file():
            raise DataError(f"{where}: image file {value!r} not found (resolved to {file})")
        return file.read_bytes()
    return value.encode("utf-8")


def _numbers(value: Any, dtype: np.dtype, where: str) -> np.ndarray:
    try:
        array = np.array(value)
    except ValueError:
        raise DataError(f"{where}: nested lists of unequal lengths") from None
    if array.size and array.dtype.kind not in "biuf":
        got = "strings" if array.dtype.kind in "US" else str(array.dtype)
        raise DataError(f"{where}: expected numbers, got {got}")
    if dtype.kind in "iu" and array.size:
        if array.dtype.kind == "f" and not np.all(np.equal(np.mod(array, 1), 0)):
            raise DataError(f"{where}: expected integers ({dtype}), got fractions")
        info = np.iinfo(dtype)
        if array.min() < info.min or array.max() > info.max:
            raise DataError(f"{where}: a value is outside {dtype}'s range {info.min}..{info.max}")
    return array.astype(dtype)


@dataclass(frozen=True)
class _Input:
    """One input of the scenario: its tensor, the model that consumes it, and what it is."""

    tensor: Any
    leaf: Any
    leaf_tensor: Any
    kind: InputKind

    @property
    def name(self) -> str:
        return self.tensor.name

    def axis_range(self, position: int) -> _AxisRange | None:
        """The range of dim ``position`` (batch is 0) when it is dynamic, else None."""
        dim = self.tensor.shape[position]
        if not isinstance(dim, str):
            return None
        leaf_shape = tuple(self.leaf_tensor.shape)
        leaf_dim = leaf_shape[position] if len(leaf_shape) == len(self.tensor.shape) else dim
        if not isinstance(leaf_dim, str):
            return _AxisRange(leaf_dim, leaf_dim, leaf_dim,
                              f"{leaf_dim} (fixed in {self.leaf.name})")
        return _axis_range(self.leaf, leaf_dim)


def _check_json_request(arrays: Mapping[str, np.ndarray], inputs: Sequence[_Input],
                        max_batch: int, where: str) -> None:
    batches = {name: a.shape[0] for name, a in arrays.items()}
    if len(set(batches.values())) > 1:
        raise DataError(f"{where}: inputs disagree on the batch size: {batches}")
    batch = next(iter(batches.values()))
    if not 1 <= batch <= max_batch:
        raise DataError(f"{where}: batch of {batch} rows, the model takes 1..{max_batch}")
    lengths: dict[str, tuple[str, int]] = {}
    for item in inputs:
        for position, dim in enumerate(item.tensor.shape[1:], start=1):
            if not isinstance(dim, str):
                continue
            size = arrays[item.name].shape[position]
            first = lengths.setdefault(dim, (item.name, size))
            if first[1] != size:
                raise DataError(f"{where}: input {item.name!r} has axis {dim!r} of {size}, but "
                                f"input {first[0]!r} has {first[1]}")


def _json_requests(path: Path, model: str, inputs: Sequence[_Input], outputs: tuple[str, ...],
                   max_batch: int) -> tuple[list[Request], list[str]]:
    names = [i.name for i in inputs]
    requests, labels = [], []
    for number, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise DataError(f"{where}: not JSON ({getattr(exc, 'msg', exc)})") from None
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object of input name -> value, got "
                            f"{type(row).__name__}")
        for key in row:
            if key not in names:
                raise DataError(f"{where}: input {key!r} is not an input of {model} "
                                f"(inputs: {', '.join(names)})")
        arrays = {}
        for item in inputs:
            if item.name not in row:
                raise DataError(f"{where}: input {item.name!r} is missing (inputs of {model}: "
                                f"{', '.join(names)})")
            arrays[item.name] = _json_value(row[item.name], item, f"{where}: input "
                                            f"{item.name!r}", path.parent)
        _check_json_request(arrays, inputs, max_batch, where)
        requests.append(Request(model, arrays, outputs))
        labels.append(f"line-{number}")
    if not requests:
        raise DataError(f"{path}: no request in it (every line is empty)")
    return requests, labels


def _json_value(value: Any, item: _Input, where: str, base: Path) -> np.ndarray:
    shape = tuple(item.tensor.shape)
    if item.tensor.dtype == "string":
        nested = _strings(value, item.kind, where, base)
        if isinstance(nested, list):
            try:
                array = np.array(nested, dtype=np.object_)
            except ValueError:
                raise DataError(f"{where}: nested lists of unequal lengths") from None
            if array.size and not all(isinstance(v, bytes) for v in array.reshape(-1)):
                raise DataError(f"{where}: nested lists of unequal lengths")
        else:
            array = np.empty((), dtype=np.object_)
            array[()] = nested
    else:
        array = _numbers(value, np.dtype(item.tensor.numpy_dtype), where)
    if array.ndim == 0 and all(d == 1 for d in shape[1:]):
        array = array.reshape((1,) * len(shape))
    elif array.ndim == len(shape) - 1:
        array = array[np.newaxis]
    elif array.ndim != len(shape):
        dims = ", ".join(map(str, shape[1:]))
        raise DataError(f"{where}: {array.ndim} dims, expected {len(shape) - 1} ([{dims}]) or "
                        f"{len(shape)} with the batch axis first")
    for position, dim in enumerate(shape[1:], start=1):
        size = array.shape[position]
        if isinstance(dim, int) and size != dim:
            raise DataError(f"{where}: dim {position} is {size}, expected {dim}")
        served = item.axis_range(position)
        if served is not None and not served.low <= size <= served.limit:
            raise DataError(f"{where}: axis {dim!r} is {size}, outside {served.low}.."
                            f"{served.limit} (the range {item.leaf.name} serves)")
    return array


# --------------------------------------------------------------------------- generated tensors


def _generated(item: _Input, lengths: Mapping[str, int], rng: np.random.Generator,
               vocabulary: int) -> np.ndarray:
    shape = tuple(1 if i == 0 else (lengths[d] if isinstance(d, str) else d)
                  for i, d in enumerate(item.tensor.shape))
    dtype = np.dtype(item.tensor.numpy_dtype)
    lower = item.name.lower()
    if "mask" in lower:
        return np.ones(shape, dtype=dtype)
    if dtype.kind in "iu":
        if _is_token_ids(item.name):
            return rng.integers(0, vocabulary, size=shape).astype(dtype)
        if "position" in lower and len(shape) > 1:
            return np.broadcast_to(np.arange(shape[-1], dtype=dtype), shape).copy()
        return np.zeros(shape, dtype=dtype)
    if dtype.kind == "b":
        return np.ones(shape, dtype=dtype)
    return rng.standard_normal(shape).astype(dtype)


def _tensor_how(item: _Input, spec: Any) -> tuple[str, int]:
    """The description of a generated input, and the vocabulary its ids come from."""
    parts, vocabulary = [], SAFE_VOCABULARY
    dtype = np.dtype(item.tensor.numpy_dtype)
    lower = item.name.lower()
    if "mask" in lower:
        parts.append("all ones")
    elif dtype.kind in "iu" and _is_token_ids(item.name):
        vocabulary, how = _vocabulary(spec, item.leaf)
        parts.append(how)
    elif dtype.kind in "iu":
        parts.append("0..length-1 along the last axis" if "position" in lower and
                     len(item.tensor.shape) > 2 else "zeros")
    elif dtype.kind == "b":
        parts.append("all true")
    else:
        parts.append("standard normal")
    for position, dim in enumerate(item.tensor.shape[1:], start=1):
        served = item.axis_range(position)
        if served is not None:
            parts.append(f"{dim} {served.how}")
    return f"generated {item.tensor.dtype} [{', '.join(map(str, item.tensor.shape))}]: " + \
        "; ".join(parts), vocabulary


# --------------------------------------------------------------------------- the scenario


def _inputs(spec: Any, entry: Any) -> list[_Input]:
    out = []
    for tensor in entry.inputs:
        leaf, leaf_tensor = _leaf(spec, entry, tensor.name)
        out.append(_Input(tensor, leaf, leaf_tensor, _kind(leaf, leaf_tensor)))
    return out


def _text_rows(path: Path, text_inputs: Sequence[_Input]) -> list[tuple[str, ...]]:
    """One tuple of texts per request: a line, or tab-separated texts for several inputs."""
    texts = load_texts(path)
    if not texts:
        raise DataError(f"{path}: no text in it")
    count = len(text_inputs)
    if count > 1 and any("\t" in t for t in texts):
        rows = []
        for number, line in enumerate(_read_lines(path), start=1):
            if not line.strip():
                continue
            fields = tuple(line.split("\t"))
            if len(fields) != count:
                names = ", ".join(i.name for i in text_inputs)
                raise DataError(f"{path}:{number}: {len(fields)} tab-separated text(s), "
                                f"expected {count} ({names})")
            rows.append(fields)
        return rows
    # One text per line; several text inputs take consecutive lines (a pair: line i and i+1).
    return [tuple(texts[(i + k) % len(texts)] for k in range(count)) for i in range(len(texts))]


def build_scenario(spec: Any, name: str, data: Path | None = None, *,
                   generated: int = GENERATED_REQUESTS, seed: int = 0) -> Scenario:
    """The scenario of pipeline or model ``name`` of ``spec`` (``load_spec``'s object).

    Args:
        spec: The spec.
        name: A pipeline or model of the spec's target.
        data: A text file (one text per line; tab-separated for several text inputs), a folder
            of images, or JSON lines (one request per line: input name -> value as nested lists
            or strings; an image input's string is a file path relative to the data file).
            None: the shipped texts and images, generated tensors.
        generated: Requests made when every input is generated.
        seed: Seed of the generated values.

    Raises:
        UnknownScenario: ``name`` is not in the spec (the known names are listed).
        DataError: ``data`` does not fit the inputs (naming the file, line and input).
    """
    entry = _entry(spec, name)
    inputs = _inputs(spec, entry)
    outputs = tuple(OutputContract(t.name, t.numpy_dtype, tuple(t.dims)) for t in entry.outputs)
    output_names = tuple(o.name for o in outputs)
    kinds = {kind: [i for i in inputs if i.kind is kind] for kind in InputKind}
    data = Path(data) if data is not None else None
    if data is not None and not data.exists():
        raise DataError(f"--data {data}: no such file or folder")
    if data is not None and data.is_file() and _is_json_lines(data):
        requests, labels = _json_requests(data, name, inputs, output_names, entry.max_batch_size)
        sources = tuple(InputSource(i.name, i.kind, f"from {data} (JSON lines, "
                                    f"{len(requests)} requests)") for i in inputs)
        return Scenario(name, name, tuple(requests), tuple(labels), sources, outputs)

    signature = ", ".join(f"{i.name} ({i.tensor.dtype})" for i in inputs)
    if data is not None and data.is_file() and not kinds[InputKind.TEXT]:
        raise DataError(f"--data {data}: lines of text feed text inputs; {name} takes "
                        f"{signature}: give JSON lines (one request per line)")
    if data is not None and data.is_dir() and not kinds[InputKind.IMAGE]:
        raise DataError(f"--data {data}: a folder gives images; {name} takes {signature}")

    columns: list[tuple[list[_Input], list[tuple[Any, ...]], list[str]]] = []
    sources: list[InputSource] = []
    texts_file = data if data is not None and data.is_file() else paths.TEXTS_FILE
    if kinds[InputKind.TEXT]:
        text_inputs = kinds[InputKind.TEXT]
        rows = _text_rows(texts_file, text_inputs)
        label = "pair" if len(text_inputs) > 1 else "text"
        columns.append((text_inputs, [tuple(t.encode("utf-8") for t in row) for row in rows],
                        [f"{label}-{i}" for i in range(len(rows))]))
        paired = " (consecutive lines as pairs)" if len(text_inputs) > 1 and not any(
            "\t" in "".join(r) for r in rows) else ""
        for item in text_inputs:
            sources.append(InputSource(item.name, item.kind, f"text, {len(rows)} rows from "
                                       f"{texts_file}{paired}; consumed by "
                                       f"{_consumer_text(item.leaf)}"))
    if kinds[InputKind.IMAGE]:
        folder = data if data is not None and data.is_dir() else IMAGES_DIR
        images = load_images(folder)
        if not images:
            raise DataError(f"--data {folder}: no .jpg/.jpeg/.png file in it")
        for item in kinds[InputKind.IMAGE]:
            columns.append(([item], [(blob,) for _, blob in images], [n for n, _ in images]))
            sources.append(InputSource(item.name, item.kind, f"encoded image, {len(images)} "
                                       f"files of {folder}; consumed by "
                                       f"{_consumer_text(item.leaf)}"))
    count = max((len(rows) for _, rows, _ in columns), default=generated)
    rng = np.random.default_rng(seed)
    tensor_inputs = kinds[InputKind.TENSOR]
    vocabularies = {}
    for item in tensor_inputs:
        how, vocabularies[item.name] = _tensor_how(item, spec)
        sources.append(InputSource(item.name, item.kind, how))
    requests, request_labels = [], []
    for index in range(count):
        arrays: dict[str, np.ndarray] = {}
        labels = []
        for column_inputs, rows, column_labels in columns:
            row = rows[index % len(rows)]
            labels.append(column_labels[index % len(rows)])
            for item, value in zip(column_inputs, row):
                arrays[item.name] = _bytes_array(value, item.tensor)
        if tensor_inputs:
            lengths = _lengths(tensor_inputs, rng)
            for item in tensor_inputs:
                arrays[item.name] = _generated(item, lengths, rng, vocabularies[item.name])
            if not columns:
                labels.append(f"generated-{index}")
        requests.append(Request(name, {i.name: arrays[i.name] for i in inputs}, output_names))
        request_labels.append("+".join(labels))
    order = {i.name: n for n, i in enumerate(inputs)}
    return Scenario(name, name, tuple(requests), tuple(request_labels),
                    tuple(sorted(sources, key=lambda s: order[s.name])), outputs)


def _lengths(items: Sequence[_Input], rng: np.random.Generator) -> dict[str, int]:
    """One length per named axis of the request (inputs sharing an axis get the same)."""
    ranges: dict[str, tuple[int, int]] = {}
    for item in items:
        for position, dim in enumerate(item.tensor.shape[1:], start=1):
            served = item.axis_range(position)
            if served is None:
                continue
            low, high = ranges.get(dim, (served.low, served.high))
            ranges[dim] = (max(low, served.low), min(high, served.high))
    return {dim: int(rng.integers(low, max(low, high) + 1)) for dim, (low, high) in
            sorted(ranges.items())}


def load_scenario(spec_path: Path, name: str, data: Path | None = None) -> Scenario:
    """``build_scenario`` on the spec file ``spec_path``.

    Raises:
        SpecError: the spec is invalid.
        UnknownScenario: see ``build_scenario``.
        DataError: see ``build_scenario``.
    """
    from tools.build_repo.spec import load_spec

    return build_scenario(load_spec(Path(spec_path)), name, data)
