"""A local Hugging Face model folder as the recipes read it: config, weights, tokenizer, limits.

Reads JSON files only (no torch), so ``tools add`` checks a folder quickly; every problem names
the folder and the file that is missing or unsupported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.errors import ModelSourceError

KINDS = ("hf-text-embedding", "hf-sequence-classification")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
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
        """The fast tokenizer (``tokenizer.json``) the ``text_tokenizer`` model loads."""
        return self.path / "tokenizer.json"

    def weights_files(self) -> list[Path]:
        """``config.json``, the weight files (shards included) and the tokenizer, in a fixed order."""
        files = [self.path / "config.json"]
        for index in WEIGHT_INDEXES:
            if (self.path / index).is_file():
                shards = _read_json(self.path / index).get("weight_map", {}).values()
                files += [self.path / index] + [self.path / s for s in sorted(set(shards))]
                return files + [self.tokenizer_file]
        weights = next(self.path / n for n in WEIGHT_FILES if (self.path / n).is_file())
        return files + [weights, self.tokenizer_file]

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
                f"{self.path / 'config.json'}: no 'id2label' or 'num_labels': not a sequence "
                "classifier"
            )
        return [str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(count)]

    def max_length(self) -> int:
        """Tokens per text, special tokens included, as the folder's own files say.

        sentence-transformers' ``max_seq_length``, else the tokenizer's ``model_max_length``,
        else the positions the model has; never more than the positions the model has.
        """
        positions = self.config.get("max_position_embeddings")
        if isinstance(positions, int) and self.config.get("model_type") in _POSITION_OFFSET_2:
            positions -= 2
        candidates = []
        st_config = self.path / "sentence_bert_config.json"
        if st_config.is_file():
            candidates.append(_read_json(st_config).get("max_seq_length"))
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
        kind: ``hf-text-embedding`` or ``hf-sequence-classification``.

    Raises:
        ModelSourceError: not a folder, or ``config.json``, the weights or ``tokenizer.json``
            missing, or (sequence classification) a config that is not a classifier's.
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
    if not (path / "tokenizer.json").is_file():
        raise ModelSourceError(
            f"{path}: no tokenizer.json (the fast tokenizer the text_tokenizer model loads); "
            "save it with tokenizer.save_pretrained or tokenizers' Tokenizer.save"
        )
    folder = HfFolder(path, kind, config)
    if kind == "hf-sequence-classification":
        architectures = config.get("architectures") or []
        if architectures and not any(a.endswith("ForSequenceClassification") for a in architectures):
            raise ModelSourceError(
                f"{config_file}: architectures {architectures} hold no *ForSequenceClassification "
                "model: not a sequence classifier (use hf-text-embedding for an encoder)"
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
        if folder.kind == "hf-sequence-classification"
        else (auto.MODEL_MAPPING, "base model")
    )
    if type(config) not in mapping:
        raise ModelSourceError(
            f"{config_file}: transformers {transformers.__version__} has no {what} for "
            f"model_type {config.model_type!r}: unsupported architecture"
        )
