"""The task-quality gate of an int8 or bf16 encoder: embeddings of real texts against the fp32
model.

Every text's cosine to its fp32 embedding, and top-k nearest-neighbour agreement over the set;
both figures are recorded, and a variant that misses either is not written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tools.build_repo.parity import Runner
from tools.build_repo.spec import ModelSpec, QualitySetSpec
from tools.errors import ParityError


class QualityError(ParityError):
    """An optimised model's outputs are not good enough for the task (names the figure)."""


@dataclass(frozen=True)
class QualityReport:
    """The gate's figures."""

    texts: int
    min_cosine: float
    mean_cosine: float
    neighbour_agreement: float
    worst: tuple[tuple[float, str], ...]  # (cosine, text) of the worst texts

    def to_dict(self) -> dict[str, object]:
        """The manifest form."""
        return {"texts": self.texts, "min_cosine": round(self.min_cosine, 6),
                "mean_cosine": round(self.mean_cosine, 6),
                "neighbour_agreement": round(self.neighbour_agreement, 6),
                "worst": [{"cosine": round(c, 6), "text": t[:120]} for c, t in self.worst]}


def read_texts(path: Path) -> list[str]:
    """The non-blank lines of a UTF-8 text file."""
    return [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def tokenize(texts: list[str], tokenizer_file: Path, max_length: int) -> list[tuple[list[int], list[int]]]:
    """``(input_ids, attention_mask)`` of each text, unpadded, truncated to ``max_length``."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length)
    return [(e.ids, e.attention_mask) for e in tokenizer.encode_batch(texts)]


def embed(runner: Runner, encodings: list[tuple[list[int], list[int]]], batch: int = 16) -> np.ndarray:
    """Embeddings of token sequences, run in length-sorted batches padded to their longest."""
    order = sorted(range(len(encodings)), key=lambda i: len(encodings[i][0]))
    out: list[np.ndarray | None] = [None] * len(encodings)
    for start in range(0, len(order), batch):
        chunk = order[start:start + batch]
        length = max(len(encodings[i][0]) for i in chunk)
        ids = np.zeros((len(chunk), length), np.int64)
        mask = np.zeros_like(ids)
        for row, i in enumerate(chunk):
            n = len(encodings[i][0])
            ids[row, :n], mask[row, :n] = encodings[i][0], encodings[i][1]
        (values,) = runner({"input_ids": ids, "attention_mask": mask}).values()
        for row, i in enumerate(chunk):
            out[i] = values[row]
    return np.stack(out).astype(np.float64)


def neighbour_agreement(reference: np.ndarray, candidate: np.ndarray, k: int) -> float:
    """Mean over rows of |top-k(candidate) ∩ top-k(reference)| / k by cosine, self excluded."""
    def top(values: np.ndarray) -> np.ndarray:
        unit = values / np.linalg.norm(values, axis=1, keepdims=True)
        similarity = unit @ unit.T
        np.fill_diagonal(similarity, -np.inf)
        return np.argsort(-similarity, axis=1, kind="stable")[:, :k]

    k = min(k, len(reference) - 1)
    ours, theirs = top(candidate), top(reference)
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(ours, theirs)]))


def check_embedding_quality(
    spec: ModelSpec, quality: QualitySetSpec, texts: list[str], tokenizer_file: Path,
    reference: Runner, candidate: Runner,
) -> QualityReport:
    """Compare ``candidate`` with ``reference`` (fp32) on ``texts``.

    Raises:
        QualityError: naming every figure that missed its bound, and the worst texts.
    """
    if len(texts) < 2:
        raise QualityError(f"model {spec.name!r}: field 'cpu.quality.texts' holds {len(texts)} "
                           f"text(s); the gate needs at least 2")
    encodings = tokenize(texts, tokenizer_file, quality.max_length)
    ref, cand = embed(reference, encodings), embed(candidate, encodings)
    cosine = (ref * cand).sum(1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(cand, axis=1))
    worst = tuple((float(cosine[i]), texts[i]) for i in np.argsort(cosine, kind="stable")[:3])
    report = QualityReport(len(texts), float(cosine.min()), float(cosine.mean()),
                           neighbour_agreement(ref, cand, quality.neighbours), worst)
    failed = []
    if report.min_cosine < quality.min_cosine:
        below = int((cosine < quality.min_cosine).sum())
        failed.append(f"min cosine {report.min_cosine:.4f} < {quality.min_cosine} on {below} of "
                      f"{len(texts)} texts (worst: {worst[0][1][:60]!r})")
    if report.neighbour_agreement < quality.min_neighbour_agreement:
        failed.append(f"top-{quality.neighbours} neighbour agreement "
                      f"{report.neighbour_agreement:.4f} < {quality.min_neighbour_agreement}")
    if failed:
        raise QualityError(f"model {spec.name!r}: the {spec.cpu.gated_variant} quality gate failed: "
                           + "; ".join(failed) + f" (mean cosine {report.mean_cosine:.4f})")
    return report
