"""The load-test scenarios: which pipeline, which payloads, and how a response is checked.

Payloads are shipped in ``loadtests/data`` (texts of many lengths and scripts, small JPEG/PNG
photos), so every run on every machine sends the same requests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

DATA_DIR = Path(__file__).resolve().parent / "data"
TEXTS_FILE = DATA_DIR / "texts.txt"
IMAGES_DIR = DATA_DIR / "images"
_IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png"}


@dataclass(frozen=True)
class Payload:
    """One request's inputs: (name, array with the batch axis, Triton datatype) triples."""

    label: str
    inputs: tuple[tuple[str, np.ndarray, str], ...]


def load_texts(path: Path = TEXTS_FILE) -> list[str]:
    """The shipped texts, one per line (UTF-8), empty lines skipped."""
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def load_images(directory: Path = IMAGES_DIR) -> list[tuple[str, bytes]]:
    """The shipped images as (file name, encoded bytes), sorted by name."""
    return [
        (p.name, p.read_bytes())
        for p in sorted(directory.iterdir())
        if p.suffix.lower() in _IMAGE_SUFFIXES
    ]


def _bytes_input(name: str, value: bytes) -> tuple[str, np.ndarray, str]:
    return (name, np.array([[value]], dtype=np.object_), "BYTES")


class Scenario:
    """A pipeline under load: its model, its payloads and a check of each response."""

    name: str = ""
    model: str = ""
    outputs: tuple[str, ...] = ()

    @cached_property
    def payloads(self) -> list[Payload]:
        """Every payload of the scenario (built once per process)."""
        raise NotImplementedError

    def check(self, outputs: Mapping[str, np.ndarray]) -> str | None:
        """Return why a response is wrong, or None when it is as the contract says."""
        raise NotImplementedError


class TextEmbedding(Scenario):
    """``text_embedding``: one text in, one L2-normalised 384-d embedding out."""

    name = "text_embedding"
    model = "text_embedding"
    outputs = ("EMBEDDING",)

    @cached_property
    def payloads(self) -> list[Payload]:
        return [
            Payload(label=f"text-{i}", inputs=(_bytes_input("TEXT", text.encode("utf-8")),))
            for i, text in enumerate(load_texts())
        ]

    def check(self, outputs: Mapping[str, np.ndarray]) -> str | None:
        emb = outputs.get("EMBEDDING")
        if emb is None or emb.shape != (1, 384):
            return f"EMBEDDING has shape {None if emb is None else emb.shape}, expected (1, 384)"
        norm = float(np.linalg.norm(emb))
        if not abs(norm - 1.0) < 1e-3:
            return f"EMBEDDING norm {norm:.4f}, expected 1 (L2-normalised)"
        return None


class ImageClassification(Scenario):
    """``image_classification``: one encoded image in, top-K classes, scores and labels out."""

    name = "image_classification"
    model = "image_classification"
    outputs = ("CLASS_INDEX", "SCORE", "LABEL")

    @cached_property
    def payloads(self) -> list[Payload]:
        return [
            Payload(label=name, inputs=(_bytes_input("IMAGE", data),))
            for name, data in load_images()
        ]

    def check(self, outputs: Mapping[str, np.ndarray]) -> str | None:
        shapes = {name: getattr(outputs.get(name), "shape", None) for name in self.outputs}
        first = shapes["CLASS_INDEX"]
        if first is None or len(first) != 2 or first[0] != 1 or first[1] < 1:
            return f"CLASS_INDEX has shape {first}, expected (1, K)"
        if any(shape != first for shape in shapes.values()):
            return f"outputs disagree on shape: {shapes}"
        return None


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (TextEmbedding(), ImageClassification())}
