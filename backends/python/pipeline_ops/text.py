"""Text preprocessing for the ``text_tokenizer`` model: validate UTF-8 ``TEXT`` requests (and
``TEXT_PAIR`` for pair models such as cross-encoders) and tokenize every valid request of one
``execute`` call with a single ``encode_batch`` call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from .batching import pad_stack, run_batched
from .errors import ConfigurationError, InvalidInput

TEXT_INPUT = "TEXT"
PAIR_INPUT = "TEXT_PAIR"  # the second text of each row, for models that score pairs
TOKEN_TYPES = "token_type_ids"  # which text of a pair each token is from (BERT's segment ids)
# Each token's character span [start, end) in the text, and 1 for special tokens (token
# classification reads both to give entities character offsets; padding is [0, 0] and 1).
OFFSETS = "offsets"
SPECIAL_TOKENS = "special_tokens_mask"
OUTPUTS = ("input_ids", "attention_mask")
PAD_VALUES = {SPECIAL_TOKENS: 1}  # every other output pads with 0 (input_ids: the pad id)
# Texts are truncated to max_length tokens, but tokenizing still reads the whole text: 1 MB took
# ~1 s here. 256 tokens of ordinary text are 1-2 KB (at most ~26 KB: 100-character words), so
# texts above this many UTF-8 bytes are rejected rather than tokenized only to be cut.
DEFAULT_MAX_TEXT_BYTES = 64 * 1024


def load_tokenizer(path: str | Path, max_length: int) -> Tokenizer:
    """Load a fast tokenizer from ``tokenizer.json`` with explicit truncation and no padding.

    Texts longer than ``max_length`` tokens (special tokens ``[CLS]``/``[SEP]`` included) are
    truncated to their first ``max_length`` tokens; the request still succeeds. This mirrors
    sentence-transformers, which truncates at the model's ``max_seq_length``. Pairs are cut
    ``longest_first`` (a token off the longer text at a time), as transformers' tokenizers and
    sentence-transformers' ``CrossEncoder`` do. Padding settings
    stored in the file (all-MiniLM-L6-v2's pads every text to 128) are switched off: padding is
    decided per request by :func:`tokenize_requests`.

    Args:
        path: the ``tokenizer.json`` file.
        max_length: maximum number of tokens per text, special tokens included (> 2).

    Returns:
        The configured ``tokenizers.Tokenizer``.

    Raises:
        ValueError: ``max_length`` is too small to hold the special tokens and one token.
        FileNotFoundError: ``path`` does not exist.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file {path} does not exist")
    return configure_tokenizer(Tokenizer.from_file(str(path)), max_length)


def configure_tokenizer(tokenizer: Tokenizer, max_length: int) -> Tokenizer:
    """Set the served truncation (``max_length``, ``longest_first``) and no padding on
    ``tokenizer``, as :func:`load_tokenizer` does (the build's checks use it on a tokenizer made
    in memory).

    Raises:
        ValueError: ``max_length`` is too small to hold the special tokens and one token.
    """
    if max_length < 3:
        raise ValueError(f"max_length must be at least 3 tokens, got {max_length}")
    tokenizer.enable_truncation(max_length=max_length, strategy="longest_first")
    tokenizer.no_padding()
    return tokenizer


def decode_texts(
    array: Any, name: str = TEXT_INPUT, max_bytes: int = DEFAULT_MAX_TEXT_BYTES
) -> list[str]:
    """Validate one request's ``TEXT`` tensor and decode it to Python strings.

    Args:
        array: the request's tensor: a NumPy array of ``bytes`` (Triton's ``TYPE_STRING``) with
            shape ``[rows, 1]``.
        name: the input's name, used in error messages.
        max_bytes: the largest accepted text, in UTF-8 bytes.

    Returns:
        One string per row.

    Raises:
        InvalidInput: wrong type, dtype or rank, an empty batch, invalid UTF-8, an empty or
            whitespace-only text, a text above ``max_bytes``. The message names the input, the
            row and the problem.
    """
    if not isinstance(array, np.ndarray):
        raise InvalidInput(
            f"input '{name}' must be a tensor of strings, got {type(array).__name__}"
        )
    if array.dtype != object and array.dtype.kind != "S":
        raise InvalidInput(
            f"input '{name}' must have datatype BYTES (TYPE_STRING), got {array.dtype}"
        )
    if array.ndim != 2 or array.shape[1] != 1:
        raise InvalidInput(f"input '{name}' must have shape [batch, 1], got {list(array.shape)}")
    if array.shape[0] == 0:
        raise InvalidInput(
            f"input '{name}' holds an empty batch (shape [0, 1]); send at least one text"
        )
    texts = []
    for row, value in enumerate(array[:, 0]):
        if isinstance(value, str):
            value = value.encode("utf-8")
        if not isinstance(value, (bytes, np.bytes_)):
            raise InvalidInput(
                f"input '{name}' row {row} must be bytes, got {type(value).__name__}"
            )
        if len(value) > max_bytes:
            raise InvalidInput(
                f"input '{name}' row {row} is {len(value)} bytes, above the limit of {max_bytes} "
                f"bytes (texts are truncated to the tokenizer's max_length tokens anyway)"
            )
        try:
            text = bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(
                f"input '{name}' row {row} is not valid UTF-8 "
                f"(byte 0x{bytes(value)[exc.start]:02x} at offset {exc.start})"
            ) from None
        if not text:
            raise InvalidInput(f"input '{name}' row {row} is an empty string")
        if not text.strip():
            raise InvalidInput(f"input '{name}' row {row} holds only whitespace")
        texts.append(text)
    return texts


def bucket_length(length: int, buckets: Sequence[int]) -> int:
    """Smallest bucket that holds ``length``, or ``length`` itself when none does."""
    for bucket in sorted(buckets):
        if bucket >= length:
            return bucket
    return length


def pad_token_id(tokenizer: Tokenizer) -> int:
    """The id written into padded ``input_ids`` positions: ``[PAD]``'s, or 0 without one."""
    return tokenizer.token_to_id("[PAD]") or 0


def _padded(rows: Sequence[Sequence[Any]], pad_value: int, buckets: Sequence[int],
            inner: tuple[int, ...] = ()) -> np.ndarray:
    """INT64 ``[rows, length, *inner]``: ``length`` is the longest row, rounded up to a bucket if
    any (``inner`` (2,) for rows of offset pairs)."""
    arrays = [np.asarray(r, dtype=np.int64).reshape(1, len(r), *inner) for r in rows]
    length = bucket_length(max(len(r) for r in rows), buckets)
    return pad_stack(arrays, pad_value, (length, *inner))


def tokenize_requests(
    tokenizer: Tokenizer,
    requests: Sequence[Mapping[str, Any]],
    pad_id: int = 0,
    buckets: Sequence[int] = (),
    max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES,
    *,
    pairs: bool = False,
    token_types: bool = False,
    offsets: bool = False,
    prompt: str = "",
) -> list[dict[str, np.ndarray] | Exception]:
    """Tokenize the ``TEXT`` input (and ``TEXT_PAIR``) of every request of one ``execute`` call.

    All valid requests are encoded together with one ``encode_batch`` call. Each request's rows
    are padded to the longest row of that request (or to the smallest bucket holding it), so
    requests keep their own sequence length and the encoder (ragged batching) pads once per
    execution. Texts longer than the tokenizer's truncation length are truncated; texts above
    ``max_text_bytes`` are rejected.

    Args:
        tokenizer: from :func:`load_tokenizer`.
        requests: per request, its input tensors by name; ``TEXT`` (and ``TEXT_PAIR``) is read.
        pad_id: the id written into padded ``input_ids`` positions (their mask is 0).
        buckets: optional fixed lengths to pad to instead of each request's longest row.
        max_text_bytes: the largest accepted text, in UTF-8 bytes.
        pairs: each row is the pair (``TEXT``, ``TEXT_PAIR``), tokenized as one sequence.
        token_types: also return ``token_type_ids`` (0 for the first text, 1 for the second).
        offsets: also return ``offsets`` (INT64 ``[rows, length, 2]``: each token's character
            span in the text, ``[0, 0]`` for special tokens and padding) and
            ``special_tokens_mask`` (1 for special tokens and padding), as transformers'
            ``return_offsets_mapping`` and ``return_special_tokens_mask`` give them.
        prompt: prepended to every ``TEXT`` before tokenizing (sentence-transformers' prompts,
            e.g. ``"query: "``); the byte limit applies to the text as sent.

    Returns:
        Per request, in order: ``{"input_ids", "attention_mask"[, "token_type_ids"]}`` INT64
        ``[rows, length]``, or the exception that failed it (``InvalidInput`` for a bad request).
    """
    names = [TEXT_INPUT, PAIR_INPUT] if pairs else [TEXT_INPUT]

    def prepare(inputs: Mapping[str, Any]) -> dict[str, list]:
        columns = []
        for name in names:
            if name not in inputs or inputs[name] is None:
                raise InvalidInput(f"input '{name}' is missing")
            columns.append(decode_texts(inputs[name], name, max_bytes=max_text_bytes))
        if pairs and len(columns[0]) != len(columns[1]):
            raise InvalidInput(f"input '{PAIR_INPUT}' has {len(columns[1])} rows and "
                               f"'{TEXT_INPUT}' {len(columns[0])}: one pair per row")
        firsts = [prompt + text for text in columns[0]]
        return {"texts": list(zip(firsts, columns[1])) if pairs else firsts}

    def compute(prepared: list[Mapping[str, Any]]) -> dict[str, list[list[int]]]:
        texts = [text for item in prepared for text in item["texts"]]
        encodings = tokenizer.encode_batch(texts, add_special_tokens=True)
        columns = {
            "input_ids": [e.ids for e in encodings],
            "attention_mask": [e.attention_mask for e in encodings],
        }
        if token_types:
            columns[TOKEN_TYPES] = [e.type_ids for e in encodings]
        if offsets:
            columns[OFFSETS] = [e.offsets for e in encodings]
            columns[SPECIAL_TOKENS] = [e.special_tokens_mask for e in encodings]
        return columns

    results = run_batched(requests, prepare, compute)
    out: list[dict[str, np.ndarray] | Exception] = []
    for result in results:
        if isinstance(result, Exception):
            out.append(result)
            continue
        out.append({
            name: _padded(rows, pad_id if name == "input_ids" else PAD_VALUES.get(name, 0),
                          buckets, (2,) if name == OFFSETS else ())
            for name, rows in result.items()
        })
    return out


@dataclass(frozen=True)
class TokenizerSettings:
    """What the ``text_tokenizer`` model reads from its config: ``parameters``, and from its
    inputs and outputs whether it tokenizes pairs and emits ``token_type_ids`` (and
    ``offsets`` with ``special_tokens_mask``)."""

    tokenizer_file: Path
    max_length: int = 256
    max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES
    # Optional fixed-shape padding. Empty: each request is padded to its own longest text and
    # the encoder's ragged batching merges requests (docs/padding.md measures both).
    buckets: tuple[int, ...] = ()
    prompt: str = ""
    pairs: bool = False
    token_types: bool = False
    offsets: bool = False

    @classmethod
    def from_parameters(
        cls, params: Mapping[str, str], version_dir: Path, model: str,
        inputs: Sequence[str] = (TEXT_INPUT,), outputs: Sequence[str] = OUTPUTS,
    ) -> TokenizerSettings:
        """Parse ``tokenizer_file`` (relative to ``version_dir``), ``max_length``,
        ``max_text_bytes``, ``length_buckets`` (comma-separated) and ``prompt``; ``inputs`` and
        ``outputs`` are the config's tensor names (``TEXT_PAIR`` in: pairs; ``token_type_ids``
        out: segment ids; ``offsets`` and ``special_tokens_mask`` out: character spans).

        Raises:
            ConfigurationError: a value is malformed, the tokenizer file is missing, or only one
                of ``offsets`` and ``special_tokens_mask`` is declared.
        """

        def integer(key: str, default: int) -> int:
            try:
                return int(params.get(key) or default)
            except ValueError:
                raise ConfigurationError(
                    f"model '{model}': parameter '{key}' must be an integer, got {params[key]!r}"
                ) from None

        raw_buckets = params.get("length_buckets", "").strip()
        try:
            buckets = tuple(int(b) for b in raw_buckets.split(",")) if raw_buckets else ()
        except ValueError:
            raise ConfigurationError(
                f"model '{model}': parameter 'length_buckets' must be comma-separated "
                f"integers, got {raw_buckets!r}"
            ) from None
        tokenizer_file = Path(version_dir) / (params.get("tokenizer_file") or "tokenizer.json")
        if not tokenizer_file.is_file():
            raise ConfigurationError(
                f"model '{model}': parameter 'tokenizer_file' names {tokenizer_file}, "
                "which does not exist"
            )
        spans = [name for name in (OFFSETS, SPECIAL_TOKENS) if name in outputs]
        if len(spans) == 1:
            raise ConfigurationError(
                f"model '{model}': outputs '{OFFSETS}' and '{SPECIAL_TOKENS}' go together "
                f"(the config declares only {spans[0]!r})"
            )
        return cls(
            tokenizer_file=tokenizer_file,
            max_length=integer("max_length", 256),
            max_text_bytes=integer("max_text_bytes", DEFAULT_MAX_TEXT_BYTES),
            buckets=buckets,
            prompt=params.get("prompt", ""),
            pairs=PAIR_INPUT in inputs,
            token_types=TOKEN_TYPES in outputs,
            offsets=bool(spans),
        )
