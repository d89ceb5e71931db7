"""The pipelines the gateway serves: found in the model repository, read from Triton.

Only the repository and Triton are needed (as in a container, where no spec exists): every
ensemble Triton has loaded is matched against the kinds by its inputs and outputs; its text step
is the model with a ``tokenizer_file`` parameter, whose own ``pipeline_ops`` and tokenizer files
(copied into its version folder by ``tools build-repo``) the gateway loads to count and check
tokens exactly as the pipeline will; the model that step feeds takes token ids directly (token
lists, raw classifier scores); the step producing the outputs names its ``labels_file`` and the
``activation`` applied.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from tools.api.route import Kind, kind_of
from tools.api.triton import TritonBackend
from tools.errors import ApiError, ApiInvalidRequest

logger = logging.getLogger("tools.api")

TEXT, PAIR = "TEXT", "TEXT_PAIR"
TOKENIZER_PARAMETER = "tokenizer_file"
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# A list longer than the pipeline's max_batch_size goes as consecutive full batches, this many
# in flight at once (two encoder instances stay busy; the rest of the list waits its turn
# instead of filling the tokenizer's bounded queue).
CHUNKS_IN_FLIGHT = 2
# Texts of more UTF-8 bytes than this in one request are tokenized off the event loop.
INLINE_TOKENIZE_BYTES = 16 * 1024


def _parameters(config: Mapping[str, Any]) -> dict[str, str]:
    return {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}


def _names(tensors: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    return tuple(t["name"] for t in tensors)


@dataclass(frozen=True)
class Step:
    """One model of an ensemble: its maps (model tensor -> ensemble tensor) and its config."""

    model: str
    inputs: Mapping[str, str]
    outputs: Mapping[str, str]
    config: Mapping[str, Any]
    version_dir: Path

    @property
    def parameters(self) -> dict[str, str]:
        """Its config's ``parameters`` as strings."""
        return _parameters(self.config)


def pipeline_ops(version_dir: Path) -> SimpleNamespace:
    """The served code's own ``pipeline_ops`` (``text``, ``classification``), as copied into a
    Python model's version folder: the gateway tokenizes and reads labels with it."""
    path = str(version_dir)
    if path not in sys.path:
        sys.path.insert(0, path)
    names = ("errors", "text", "classification")
    return SimpleNamespace(**{n: importlib.import_module(f"pipeline_ops.{n}") for n in names})


class Texts:
    """The pipeline's text step as the gateway runs it: checks, token counts, token ids.

    Args:
        step: The tokenizer model (``text_tokenizer`` backend) of the pipeline.
        ensemble_inputs: The ensemble's inputs (``TEXT``, and ``TEXT_PAIR`` for pairs).
    """

    def __init__(self, step: Step, ensemble_inputs: Sequence[str]) -> None:
        ops = pipeline_ops(step.version_dir)
        config = step.config
        self.settings = ops.text.TokenizerSettings.from_parameters(
            step.parameters, step.version_dir, step.model, _names(config["input"]),
            _names(config["output"]))
        self.tokenizer = ops.text.load_tokenizer(self.settings.tokenizer_file,
                                                 self.settings.max_length)
        self.pad_id = ops.text.pad_token_id(self.tokenizer)
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        self.model = step.model
        self.pairs = PAIR in ensemble_inputs

    @property
    def max_length(self) -> int:
        """Tokens per text (or pair), special tokens included; longer ones are truncated."""
        return int(self.settings.max_length)

    @property
    def max_text_bytes(self) -> int:
        """The longest text the pipeline accepts, in UTF-8 bytes."""
        return int(self.settings.max_text_bytes)

    def check(self, texts: Sequence[Any], param: str, *, single: bool = False) -> None:
        """Refuse what the pipeline's tokenizer would refuse, naming the API's field (``param``,
        with the index of the text unless ``single``).

        Raises:
            ApiInvalidRequest: a value that is not a string, an empty or blank one, or one above
                ``max_text_bytes``.
        """
        for index, text in enumerate(texts):
            where = param if single else f"{param}[{index}]"
            if not isinstance(text, str):
                raise ApiInvalidRequest(f"{where} must be a string, got {_json_type(text)}",
                                        param)
            if not text.strip():
                raise ApiInvalidRequest(f"{where} is {'empty' if not text else 'only blanks'}: "
                                        "send some text", param)
            if len(text) * 4 > self.max_text_bytes and \
                    len(text.encode("utf-8")) > self.max_text_bytes:
                raise ApiInvalidRequest(
                    f"{where} is {len(text.encode('utf-8'))} bytes, above the limit of "
                    f"{self.max_text_bytes} bytes (texts are cut at {self.max_length} tokens "
                    "anyway)", param)

    async def count(self, firsts: Sequence[str], seconds: Sequence[str] | None = None, *,
                    truncate: bool = True, param: str = "input", single: bool = False
                    ) -> list[int]:
        """Tokens the pipeline will run per text (or pair), as its tokenizer cuts them.

        Raises:
            ApiInvalidRequest: ``truncate`` is off and a text is longer than ``max_length``.
        """
        prompt = self.settings.prompt
        items: list[Any] = [prompt + t for t in firsts] if prompt else list(firsts)
        if seconds is not None:
            items = list(zip(items, seconds))
        size = sum(map(len, firsts)) + (sum(map(len, seconds)) if seconds else 0)
        # encode_batch_fast (tokenizers >= 0.20) leaves out the offsets: a quarter less CPU
        encode = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
        if size > INLINE_TOKENIZE_BYTES:
            encodings = await asyncio.to_thread(encode, items)
        else:
            encodings = encode(items)
        if not truncate:
            for index, encoding in enumerate(encodings):
                if encoding.overflowing:
                    where = param if single else f"{param}[{index}]"
                    raise ApiInvalidRequest(
                        f"{where} is longer than the {self.max_length} tokens the pipeline "
                        "takes: shorten it, or let it be cut (truncate: true)", param)
        return [len(e.ids) for e in encodings]

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """The token ids the pipeline's text step makes of ``texts`` (prompt, truncation)."""
        prompt = self.settings.prompt
        return [e.ids for e in self.tokenizer.encode_batch([prompt + t for t in texts])]

    def check_ids(self, rows: Sequence[Any], param: str, *, single: bool = False
                  ) -> list[list[int]]:
        """Token-id rows as the pipeline's own tokenizer would make them (special tokens
        included), checked.

        Raises:
            ApiInvalidRequest: a row that is empty or not integers, an id outside the
                vocabulary, a row longer than ``max_length``.
        """
        out = []
        for index, row in enumerate(rows):
            where = param if single else f"{param}[{index}]"
            if not isinstance(row, list) or not row:
                raise ApiInvalidRequest(f"{where} must be a non-empty list of token ids", param)
            if not all(isinstance(i, int) and not isinstance(i, bool) for i in row):
                raise ApiInvalidRequest(f"{where} must hold integers only", param)
            if len(row) > self.max_length:
                raise ApiInvalidRequest(f"{where} has {len(row)} tokens, the pipeline takes at "
                                        f"most {self.max_length}", param)
            low, high = min(row), max(row)
            if low < 0 or high >= self.vocab_size:
                bad = low if low < 0 else high
                raise ApiInvalidRequest(
                    f"{where} holds token id {bad}, outside the pipeline's vocabulary of "
                    f"{self.vocab_size} ids (token lists are ids of the pipeline's own "
                    f"tokenizer, {self.model}, special tokens included; a client that counts "
                    "with tiktoken, such as LangChain's OpenAIEmbeddings, must send text: "
                    "check_embedding_ctx_length=False)", param)
            out.append(row)
        return out


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null", str: "a string"}
    return names.get(type(value), type(value).__name__)


@dataclass
class Pipeline:
    """A served ensemble the APIs call, with what its kind needs to know about it.

    Attributes:
        name: The ensemble (the API's model name).
        kind: The kind it matched (``tools/api/kinds.py``).
        config: Its configuration as Triton loaded it.
        texts: Its text step (tokenizer), as the gateway runs it.
        id_step: The model the text step feeds, which takes token ids; None when there is none.
        id_inputs: That model's inputs -> the text step's outputs (``input_ids`` ...).
        labels: Class names by index (``labels_file`` of the step producing the outputs).
        activation: The activation the step producing the outputs applies (``softmax``,
            ``sigmoid``, ``identity``), when its config says.
    """

    name: str
    kind: Kind
    config: Mapping[str, Any]
    texts: Texts
    id_step: Step | None = None
    id_inputs: Mapping[str, str] = field(default_factory=dict)
    labels: tuple[str, ...] = ()
    activation: str | None = None

    @property
    def max_batch_size(self) -> int:
        """Rows of one Triton request at most."""
        return int(self.config.get("max_batch_size", 1)) or 1

    def width(self, output: str) -> int:
        """The size of ``output``'s one dimension after the batch axis (e.g. 384)."""
        for tensor in self.config["output"]:
            if tensor["name"] == output:
                return int(tensor["dims"][-1])
        raise KeyError(output)

    async def run_texts(self, backend: TritonBackend, columns: Mapping[str, Sequence[str]],
                        outputs: Sequence[str]) -> dict[str, np.ndarray]:
        """The pipeline on rows of text (``TEXT``, ``TEXT_PAIR``): one Triton request per list,
        or per ``max_batch_size`` rows of a longer one."""
        arrays = {name: np.array([[t.encode("utf-8")] for t in column], dtype=np.object_)
                  for name, column in columns.items()}
        count = len(next(iter(arrays.values())))
        return await _chunked(backend, self.name, count, self.max_batch_size, outputs,
                              lambda part: {n: a[part] for n, a in arrays.items()})

    async def run_ids(self, backend: TritonBackend, rows: Sequence[Sequence[int]],
                      tensor: str) -> np.ndarray:
        """Token-id rows straight to the model the text step feeds; returns the ensemble tensor
        ``tensor`` that model produces (``EMBEDDING``, or the ``logits`` a postprocess reads)."""
        step = self.id_step
        assert step is not None, "check tensor_by_ids() first"
        output = next(m for m, t in step.outputs.items() if t == tensor)

        def arrays(part: slice) -> dict[str, np.ndarray]:
            chunk = rows[part]
            length = max(len(r) for r in chunk)
            ids = np.full((len(chunk), length), self.texts.pad_id, dtype=np.int64)
            mask = np.zeros((len(chunk), length), dtype=np.int64)
            for index, row in enumerate(chunk):
                ids[index, :len(row)] = row
                mask[index, :len(row)] = 1
            made = {"input_ids": ids, "attention_mask": mask,
                    "token_type_ids": np.zeros_like(ids)}
            return {name: made[source] for name, source in self.id_inputs.items()}

        answer = await _chunked(backend, step.model, len(rows), self.max_batch_size, [output],
                                arrays)
        return answer[output]

    @property
    def id_output(self) -> str | None:
        """The one ensemble tensor the model taking token ids produces (None: not one)."""
        produced = list(self.id_step.outputs.values()) if self.id_step is not None else []
        return produced[0] if len(produced) == 1 else None

    def takes_ids(self, tensor: str) -> bool:
        """Whether token ids can reach the model producing ensemble tensor ``tensor``."""
        return self.id_step is not None and tensor in self.id_step.outputs.values()


async def _chunked(backend: TritonBackend, model: str, count: int, batch: int,
                   outputs: Sequence[str], arrays: Callable[[slice], Mapping[str, np.ndarray]]
                   ) -> dict[str, np.ndarray]:
    if count <= batch:
        return await backend.infer(model, arrays(slice(0, count)), outputs)
    room = asyncio.Semaphore(CHUNKS_IN_FLIGHT)

    async def one(part: slice) -> dict[str, np.ndarray]:
        async with room:
            return await backend.infer(model, arrays(part), outputs)

    parts = await asyncio.gather(*(one(slice(i, i + batch)) for i in range(0, count, batch)))
    return {name: np.concatenate([p[name] for p in parts]) for name in outputs}


# --------------------------------------------------------------------------- discovery


async def _version_dir(backend: TritonBackend, repository: Path, name: str) -> Path:
    versions = (await backend.metadata(name)).get("versions") or ["1"]
    return repository / name / str(max(int(v) for v in versions))


async def discover(backend: TritonBackend, repository: Path, kinds: Sequence[Kind]
                   ) -> tuple[dict[str, Pipeline], list[str]]:
    """The pipelines to serve: every ensemble of ``repository`` that Triton has loaded and
    whose inputs and outputs match one of ``kinds``.

    Returns:
        The pipelines by name, and one note per ensemble left out (and why).
    """
    names = sorted(p.parent.name for p in repository.glob("*/config.pbtxt"))
    configs: dict[str, dict[str, Any]] = {}
    notes = []
    for name in names:
        try:
            configs[name] = await backend.config(name)
        except ApiError as exc:
            notes.append(f"{name}: not loaded by Triton ({exc})")
    pipelines = {}
    for name, config in configs.items():
        if config.get("platform") != "ensemble":
            continue
        kind = kind_of(kinds, _names(config["input"]), _names(config["output"]))
        if kind is None:
            continue
        try:
            pipelines[name] = await _pipeline(backend, repository, name, kind, config, configs)
        except (ApiError, KeyError, ValueError, OSError) as exc:
            notes.append(f"{name}: a {kind.name} pipeline the APIs cannot serve: {exc}")
    return pipelines, notes


async def _pipeline(backend: TritonBackend, repository: Path, name: str, kind: Kind,
                    config: Mapping[str, Any], configs: Mapping[str, Any]) -> Pipeline:
    steps = []
    for raw in config.get("ensemble_scheduling", {}).get("step", []):
        model = raw["model_name"]
        if model not in configs:
            raise ValueError(f"its step {model!r} is not loaded")
        steps.append(Step(model, dict(raw.get("input_map", {})), dict(raw.get("output_map", {})),
                          configs[model], await _version_dir(backend, repository, model)))
    text_step = next((s for s in steps if TOKENIZER_PARAMETER in s.parameters
                      and TEXT in s.inputs.values()), None)
    if text_step is None:
        raise ValueError(f"no step takes {TEXT} with a {TOKENIZER_PARAMETER!r} parameter "
                         "(a text_tokenizer model)")
    inputs = _names(config["input"])
    pipeline = Pipeline(name, kind, config, Texts(text_step, inputs))
    # The model fed by the text step alone takes token ids.
    made = {tensor: output for output, tensor in text_step.outputs.items()}
    for step in steps:
        if step is not text_step and step.inputs and set(step.inputs.values()) <= set(made):
            sources = {model_input: made[tensor] for model_input, tensor in step.inputs.items()}
            if set(sources.values()) <= set(TOKEN_INPUTS):
                pipeline.id_step, pipeline.id_inputs = step, sources
            break
    outputs = set(kind.outputs)
    last = next((s for s in reversed(steps) if outputs & set(s.outputs.values())), None)
    if last is not None:
        parameters = last.parameters
        pipeline.activation = parameters.get("activation") or None
        if parameters.get("labels_file"):
            ops = pipeline_ops(text_step.version_dir)
            labels = ops.classification.labels_from_file(last.version_dir
                                                         / parameters["labels_file"])
            pipeline.labels = tuple(b.decode("utf-8") for b in labels)
    return pipeline
