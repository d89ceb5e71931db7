"""A local Hugging Face model folder as the recipes read it: config, weights, tokenizer, limits.

Reads JSON files only (no torch), so ``tools add`` checks a folder quickly; every problem names
the folder and the file that is missing or unsupported. The one exception is a folder without
``tokenizer.json``: transformers converts its vocabulary into a fast tokenizer
(:func:`convert_tokenizer`), in memory.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.errors import ModelSourceError

KINDS = ("hf-text-embedding", "hf-sequence-classification", "hf-cross-encoder",
         "hf-token-classification")
# Kinds whose folder holds a *ForSequenceClassification model.
CLASSIFIER_KINDS = ("hf-sequence-classification", "hf-cross-encoder")
TOKEN_CLASSIFIER = "hf-token-classification"  # a *ForTokenClassification model
# How transformers' token-classification pipeline turns tokens into entities (aggregation_strategy).
AGGREGATIONS = ("none", "simple", "first", "average", "max")
# Kinds whose config.json must name labels (id2label or num_labels).
LABELLED_KINDS = (*CLASSIFIER_KINDS, TOKEN_CLASSIFIER)
_ARCHITECTURE_SUFFIX = {"hf-sequence-classification": "ForSequenceClassification",
                        "hf-cross-encoder": "ForSequenceClassification",
                        TOKEN_CLASSIFIER: "ForTokenClassification"}
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
TOKENIZER_JSON = "tokenizer.json"
# Vocabularies transformers turns into a fast tokenizer when a folder has no tokenizer.json
# (WordPiece, BPE, SentencePiece), and the files that configure it.
VOCABULARY_FILES = ("vocab.txt", "vocab.json", "merges.txt", "spiece.model",
                    "sentencepiece.bpe.model", "tokenizer.model")
TOKENIZER_CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")
# config.json problem_type -> what the served output applies to the logits (transformers'
# *ForSequenceClassification: no problem_type means regression for one label, else single-label).
PROBLEM_ACTIVATIONS = {"single_label_classification": "softmax",
                       "multi_label_classification": "sigmoid", "regression": "identity"}
# sentence-transformers' activation_fn paths (CrossEncoder) the cross-encoder graph reproduces.
_ST_ACTIVATIONS = {"torch.nn.modules.activation.Sigmoid": "sigmoid", "torch.nn.Sigmoid": "sigmoid",
                   "torch.nn.modules.linear.Identity": "identity", "torch.nn.Identity": "identity"}
# sentence-transformers module types this recipe reproduces inside the exported graph.
_ST_POOLING = "sentence_transformers.models.Pooling"
_ST_NORMALIZE = "sentence_transformers.models.Normalize"
_ST_TRANSFORMER = "sentence_transformers.models.Transformer"
# Position ids of these architectures start after the padding index: two positions are unusable.
_POSITION_OFFSET_2 = frozenset({"roberta", "xlm-roberta", "camembert", "longformer"})
# A tokenizer_config.json without a real limit stores this sentinel (1e30) or similar.
_NO_LIMIT = 1_000_000


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelSourceError(f"{path}: cannot read it as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ModelSourceError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


@dataclass(frozen=True)
class HfFolder:
    """A checked Hugging Face folder: its ``config.json`` and the files the recipes use."""

    path: Path
    kind: str
    config: dict[str, Any]

    @property
    def tokenizer_file(self) -> Path:
        """The folder's fast tokenizer (``tokenizer.json``); see ``has_tokenizer_json``."""
        return self.path / TOKENIZER_JSON

    @property
    def has_tokenizer_json(self) -> bool:
        """False for a folder whose tokenizer transformers converts (``vocab.txt`` only)."""
        return self.tokenizer_file.is_file()

    def tokenizer_files(self) -> list[Path]:
        """What the served tokenizer is made from: ``tokenizer.json``, or the files transformers
        converts (with ``config.json``, which names the tokenizer class when nothing else does)."""
        if self.has_tokenizer_json:
            return [self.tokenizer_file]
        names = (*VOCABULARY_FILES, *TOKENIZER_CONFIG_FILES, "config.json")
        return [self.path / n for n in names if (self.path / n).is_file()]

    def fast_tokenizer(self):
        """The ``tokenizers.Tokenizer`` the ``text_tokenizer`` model serves for this folder.

        Raises:
            ModelSourceError: transformers cannot convert the folder's vocabulary.
        """
        from tokenizers import Tokenizer

        if self.has_tokenizer_json:
            return Tokenizer.from_file(str(self.tokenizer_file))
        stamp = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in self.tokenizer_files())
        return Tokenizer.from_str(convert_tokenizer(self.path, stamp))

    def weights_files(self) -> list[Path]:
        """``config.json``, the weight files (shards included) and the tokenizer's files, in a
        fixed order."""
        files = [self.path / "config.json"]
        tokenizer = [f for f in self.tokenizer_files() if f not in files]
        for index in WEIGHT_INDEXES:
            if (self.path / index).is_file():
                shards = _read_json(self.path / index).get("weight_map", {}).values()
                files += [self.path / index] + [self.path / s for s in sorted(set(shards))]
                return files + tokenizer
        weights = next(self.path / n for n in WEIGHT_FILES if (self.path / n).is_file())
        return files + [weights, *tokenizer]

    @property
    def hidden_size(self) -> int:
        """Width of the last hidden state (``hidden_size``, ``dim`` or ``d_model``)."""
        for key in ("hidden_size", "dim", "d_model"):
            if isinstance(self.config.get(key), int):
                return self.config[key]
        raise ModelSourceError(
            f"{self.path / 'config.json'}: no 'hidden_size' (nor 'dim'/'d_model'): cannot tell "
            "the embedding width"
        )

    def labels(self) -> list[str]:
        """Class names by index from ``id2label`` (``LABEL_<i>`` where a name is missing)."""
        id2label = self.config.get("id2label") or {}
        count = int(self.config.get("num_labels") or len(id2label) or 0)
        if count < 1:
            raise ModelSourceError(
                f"{self.path / 'config.json'}: no 'id2label' or 'num_labels': not a "
                f"{'token' if self.kind == TOKEN_CLASSIFIER else 'sequence'} classifier"
            )
        return [str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(count)]

    def problem_type(self) -> str:
        """``config.json``'s ``problem_type``, or what transformers' ``*ForSequenceClassification``
        decides without one: ``regression`` for one label, else ``single_label_classification``.

        Raises:
            ModelSourceError: a ``problem_type`` transformers does not know.
        """
        value = self.config.get("problem_type")
        if value is None:
            return "regression" if len(self.labels()) == 1 else "single_label_classification"
        if value not in PROBLEM_ACTIVATIONS:
            raise ModelSourceError(
                f"{self.path / 'config.json'}: problem_type {value!r} is not one of "
                f"{list(PROBLEM_ACTIVATIONS)}"
            )
        return value

    def cross_encoder_activation(self) -> str:
        """What sentence-transformers' ``CrossEncoder`` applies to this folder's logits.

        Its saved ``activation_fn`` (``config_sentence_transformers.json``, else ``config.json``'s
        ``sentence_transformers.activation_fn`` or the older ``sbert_ce_default_activation_function``),
        else ``Sigmoid`` for one label and ``Identity`` otherwise, as ``CrossEncoder`` does.

        Raises:
            ModelSourceError: a saved activation other than Sigmoid or Identity, naming the file.
        """
        st_file = self.path / "config_sentence_transformers.json"
        candidates = [(st_file, _read_json(st_file).get("activation_fn") if st_file.is_file() else None)]
        st_section = self.config.get("sentence_transformers")
        candidates += [
            (self.path / "config.json",
             st_section.get("activation_fn") if isinstance(st_section, dict) else None),
            (self.path / "config.json", self.config.get("sbert_ce_default_activation_function")),
        ]
        for where, path in candidates:
            if path is None:
                continue
            if path not in _ST_ACTIVATIONS:
                raise ModelSourceError(
                    f"{where}: activation_fn {path!r} is not one the hf-cross-encoder recipe "
                    f"reproduces ({sorted(set(_ST_ACTIVATIONS.values()))}); choose one with "
                    "--activation"
                )
            return _ST_ACTIVATIONS[path]
        return "sigmoid" if len(self.labels()) == 1 else "identity"

    def prompts(self) -> tuple[dict[str, str], str | None]:
        """sentence-transformers' ``prompts`` and ``default_prompt_name``
        (``config_sentence_transformers.json``; none when it is absent).

        Raises:
            ModelSourceError: a malformed ``prompts``, or a default that names no prompt.
        """
        path = self.path / "config_sentence_transformers.json"
        data = _read_json(path) if path.is_file() else {}
        prompts = data.get("prompts") or {}
        if not isinstance(prompts, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()
        ):
            raise ModelSourceError(f"{path}: 'prompts' must map names to prompt strings")
        default = data.get("default_prompt_name")
        if default is not None and default not in prompts:
            raise ModelSourceError(
                f"{path}: default_prompt_name {default!r} is not in prompts {sorted(prompts)}"
            )
        return prompts, default

    def pooling_includes_prompt(self) -> bool:
        """False when the folder's sentence-transformers Pooling leaves prompt tokens out of the
        mean (``include_prompt: false``), which the served graph does not reproduce."""
        modules_file = self.path / "modules.json"
        if not modules_file.is_file():
            return True
        for module in json.loads(modules_file.read_text(encoding="utf-8")):
            if module.get("type") == _ST_POOLING:
                config = _read_json(self.path / module.get("path", "") / "config.json")
                return config.get("include_prompt", True) is not False
        return True

    def max_length(self) -> int:
        """Tokens per text, special tokens included, as the folder's own files say.

        sentence-transformers' ``max_seq_length``, else the tokenizer's ``model_max_length``,
        else the positions the model has; never more than the positions the model has.
        """
        st_config = self.path / "sentence_bert_config.json"
        first = [_read_json(st_config).get("max_seq_length")] if st_config.is_file() else []
        return self._limit(first)

    def tokenizer_max_length(self) -> int:
        """Tokens per text as transformers' pipelines truncate them: the tokenizer's
        ``model_max_length``, else the positions the model has; never more than those (without
        a limit, transformers would send a longer text whole and the model would fail on it)."""
        return self._limit([])

    def _limit(self, first: list[Any]) -> int:
        """The first real limit of ``first``, ``model_max_length`` and the model's positions."""
        positions = self.config.get("max_position_embeddings")
        if isinstance(positions, int) and self.config.get("model_type") in _POSITION_OFFSET_2:
            positions -= 2
        candidates = list(first)
        tok_config = self.path / "tokenizer_config.json"
        if tok_config.is_file():
            candidates.append(_read_json(tok_config).get("model_max_length"))
        candidates.append(positions)
        for value in candidates:
            if isinstance(value, (int, float)) and 3 <= value < _NO_LIMIT:
                length = int(value)
                return min(length, positions) if isinstance(positions, int) else length
        raise ModelSourceError(
            f"{self.path}: no sequence limit in sentence_bert_config.json (max_seq_length), "
            "tokenizer_config.json (model_max_length) or config.json (max_position_embeddings)"
        )

    def sentence_transformers_head(self) -> tuple[str, bool] | None:
        """``(pooling, normalize)`` from the folder's sentence-transformers modules, if it has them.

        Raises:
            ModelSourceError: a module this recipe cannot reproduce in the graph (e.g. ``Dense``,
                max pooling), naming ``modules.json``.
        """
        modules_file = self.path / "modules.json"
        if not modules_file.is_file():
            return None
        try:
            modules = json.loads(modules_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelSourceError(f"{modules_file}: cannot read it as JSON: {exc}") from None
        pooling, normalize = "mean", False
        for module in modules:
            kind, where = module.get("type", ""), module.get("path", "")
            if kind == _ST_POOLING:
                pooling = self._pooling_mode(self.path / where / "config.json")
            elif kind == _ST_NORMALIZE:
                normalize = True
            elif kind != _ST_TRANSFORMER:
                raise ModelSourceError(
                    f"{modules_file}: module {kind!r} ({where!r}) is not supported by the "
                    "hf-text-embedding recipe (supported: Transformer, Pooling mean/cls, "
                    "Normalize)"
                )
        return pooling, normalize

    @staticmethod
    def _pooling_mode(path: Path) -> str:
        config = _read_json(path)
        modes = sorted(k.removeprefix("pooling_mode_") for k, v in config.items()
                       if k.startswith("pooling_mode_") and v is True)
        if modes == ["mean_tokens"]:
            return "mean"
        if modes == ["cls_token"]:
            return "cls"
        raise ModelSourceError(
            f"{path}: pooling modes {modes} are not supported (supported: mean_tokens or "
            "cls_token alone)"
        )


def read_folder(path: Path, kind: str) -> HfFolder:
    """Check that ``path`` is a Hugging Face model folder a ``kind`` recipe can build.

    Args:
        path: the folder.
        kind: one of ``KINDS``.

    Raises:
        ModelSourceError: not a folder, or ``config.json``, the weights or a tokenizer
            (``tokenizer.json`` or a vocabulary) missing, or (classifier kinds) a config that is
            not a classifier's.
    """
    path = Path(path).resolve()
    if not path.is_dir():
        raise ModelSourceError(f"{path}: not a folder (a {kind} recipe takes a model folder)")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelSourceError(f"{path}: no config.json: not a Hugging Face model folder")
    config = _read_json(config_file)
    if not isinstance(config.get("model_type"), str):
        raise ModelSourceError(f"{config_file}: no 'model_type': not a transformers model config")
    has_weights = any((path / n).is_file() for n in (*WEIGHT_FILES, *WEIGHT_INDEXES))
    if not has_weights:
        raise ModelSourceError(
            f"{path}: no weights ({' or '.join(WEIGHT_FILES)}); save the model with "
            "save_pretrained"
        )
    if not any((path / n).is_file() for n in (TOKENIZER_JSON, *VOCABULARY_FILES)):
        raise ModelSourceError(
            f"{path}: no tokenizer.json, nor a vocabulary transformers converts into one "
            f"({', '.join(VOCABULARY_FILES)}); save the tokenizer with tokenizer.save_pretrained"
        )
    folder = HfFolder(path, kind, config)
    if kind in LABELLED_KINDS:
        architectures = config.get("architectures") or []
        suffix = _ARCHITECTURE_SUFFIX[kind]
        if architectures and not any(a.endswith(suffix) for a in architectures):
            what = "token" if kind == TOKEN_CLASSIFIER else "sequence"
            raise ModelSourceError(
                f"{config_file}: architectures {architectures} hold no *{suffix} model: not a "
                f"{what} classifier (use hf-text-embedding for an encoder)"
            )
        folder.labels()
    return folder


def check_transformers_support(folder: HfFolder) -> None:
    """transformers can build this folder's model class for the recipe (imports transformers).

    Raises:
        ModelSourceError: transformers does not know the ``model_type``, or has no model of the
            recipe's kind for it, naming ``config.json``.
    """
    import transformers
    from transformers import AutoConfig

    config_file = folder.path / "config.json"
    try:
        config = AutoConfig.from_pretrained(str(folder.path))
    except (ValueError, KeyError, OSError) as exc:
        raise ModelSourceError(
            f"{config_file}: transformers {transformers.__version__} cannot read it: "
            f"{str(exc).splitlines()[0]}"
        ) from None
    from transformers.models.auto import modeling_auto as auto

    mapping, what = (
        (auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING, "sequence-classification model")
        if folder.kind in CLASSIFIER_KINDS
        else (auto.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING, "token-classification model")
        if folder.kind == TOKEN_CLASSIFIER
        else (auto.MODEL_MAPPING, "base model")
    )
    if type(config) not in mapping:
        raise ModelSourceError(
            f"{config_file}: transformers {transformers.__version__} has no {what} for "
            f"model_type {config.model_type!r}: unsupported architecture"
        )
    folder.fast_tokenizer()  # a vocabulary-only folder: the conversion works


def takes_token_types(folder: HfFolder) -> bool:
    """Whether the folder's sequence classifier's ``forward`` takes ``token_type_ids`` (BERT's
    do; DistilBERT's and RoBERTa's do not), so a pair recipe feeds them (imports transformers)."""
    import inspect

    from transformers import AutoConfig
    from transformers.models.auto import modeling_auto as auto

    model_class = auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING[
        type(AutoConfig.from_pretrained(str(folder.path)))]
    return "token_type_ids" in inspect.signature(model_class.forward).parameters


@functools.lru_cache(maxsize=8)
def convert_tokenizer(folder: Path, stamp: tuple) -> str:
    """The folder's tokenizer converted by transformers' fast tokenizer, as ``tokenizer.json`` text.

    ``AutoTokenizer`` reads the tokenizer class and its settings (``do_lower_case``,
    ``strip_accents``, special tokens) from ``tokenizer_config.json`` and
    ``special_tokens_map.json``, or takes the class from ``config.json``'s ``model_type``.

    Args:
        folder: the Hugging Face folder (read only).
        stamp: the tokenizer files' paths, modification times and sizes (the cache key).

    Raises:
        ModelSourceError: transformers cannot make a fast tokenizer of the folder.
    """
    del stamp
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import transformers
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), use_fast=True)
    except Exception as exc:  # tokenizer classes raise many types (ValueError, OSError, ImportError)
        raise ModelSourceError(
            f"{folder}: transformers {transformers.__version__} cannot make a fast tokenizer from "
            f"its files (no tokenizer.json): {type(exc).__name__}: {str(exc).splitlines()[0]}"
        ) from None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not getattr(tokenizer, "is_fast", False) or backend is None:
        raise ModelSourceError(
            f"{folder}: transformers gives {type(tokenizer).__name__}, not a fast tokenizer: save "
            "a tokenizer.json with tokenizer.save_pretrained"
        )
    return backend.to_str()
