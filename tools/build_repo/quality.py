"""The task-quality gate of an int8 or bf16 encoder: embeddings of a family set of real texts
against the fp32 model, judged family by family.

Every text's cosine to its fp32 embedding; per family (``quality_sets``) the min, the P1 and the
top-k neighbour agreement, for all its texts and for its held-out part. Every text is also run
alone, and every sequence length between the set's shortest and longest text that no text has
is run alone too (``length_sweep``), so a kernel wrong at one length cannot pass. A
variant is refused when any family's min misses its bound (the gate's ``min_cosine``, or a
waiver's stated lower one), when any swept length misses ``min_cosine``, or when the mean
agreement over the set misses ``min_neighbour_agreement``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from tools.build_repo.parity import Runner
from tools.build_repo.results import Stage
from tools.build_repo.quality_sets import (
    HELD_OUT,
    OWN_FORM,
    UNLABELLED_FORM,
    Encoding,
    QualitySet,
    QualitySetError,
    load_quality_set,
)
from tools.build_repo.spec import ModelSpec, QualitySetSpec, QualityWaiverSpec
from tools.errors import ParityError
from tools.stats import percentile

PASS, FAIL, WAIVED, UNNEEDED = "pass", "FAIL", "WAIVED", "waived, not needed"


class QualityError(ParityError):
    """An optimised model's outputs are not good enough for the task (names the family, the
    figure and the worst text). ``report`` holds every figure."""

    def __init__(self, message: str, report: QualityReport) -> None:
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class Worst:
    """The lowest-cosine text of a family: its cosine, its place in the family and the file."""

    cosine: float
    index: int  # 1-based, among the family's texts in file order
    source: str  # "<file>:<line>"
    kind: str
    text: str

    def describe(self, family: str, count: int) -> str:
        """``text 4 of 98 in form:degenerate (file:line, kind): 'the text…'``."""
        where = f"{self.source}, {self.kind}" if self.kind else self.source
        return f"text {self.index} of {count} in {family} ({where}): {self.text[:60]!r}"


@dataclass(frozen=True)
class FamilyFigures:
    """One family's row: figures over the texts it is judged on (a waived family's texts are
    judged in their own row and left out of the others, counted in ``waived_elsewhere``)."""

    family: str
    texts: int
    held_out: int
    waived_elsewhere: int
    min_cosine: float | None
    p1_cosine: float | None
    held_out_min: float | None
    held_out_p1: float | None
    neighbour_agreement: float | None
    bound: float
    status: str
    below: int
    worst: Worst | None
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The manifest form."""
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 6)

        out: dict[str, Any] = {
            "family": self.family, "texts": self.texts, "held_out": self.held_out,
            "min_cosine": r(self.min_cosine), "p1_cosine": r(self.p1_cosine),
            "held_out_min_cosine": r(self.held_out_min), "held_out_p1_cosine": r(self.held_out_p1),
            "neighbour_agreement": r(self.neighbour_agreement), "bound": self.bound,
            "status": self.status, "below_bound": self.below,
        }
        if self.waived_elsewhere:
            out["left_out_as_waived"] = self.waived_elsewhere
        if self.worst is not None:
            out["worst"] = {"cosine": r(self.worst.cosine), "index": self.worst.index,
                            "source": self.worst.source, "kind": self.worst.kind,
                            "text": self.worst.text[:120]}
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True)
class LengthSweep:
    """The lengths the set's texts do not have, each run alone as a prefix of one long text.

    Attributes:
        first, last: The shortest and longest length of the set's texts (the range covered).
        swept: The lengths in that range no text has, run here (the others ran as texts alone).
        min_cosine: The lowest cosine over ``swept`` (None when every length has a text).
        worst_length: The length of ``min_cosine``.
        below: ``(length, cosine)`` of each swept length under the bound.
        source: ``<file>:<line>`` of the text whose prefixes were run.
        bound: The gate's ``min_cosine`` (no waiver applies to a length).
    """

    first: int
    last: int
    swept: int
    min_cosine: float | None
    worst_length: int | None
    below: tuple[tuple[int, float], ...]
    source: str
    bound: float

    def to_dict(self) -> dict[str, Any]:
        """The manifest form."""
        return {"lengths": [self.first, self.last], "swept": self.swept, "bound": self.bound,
                "min_cosine": None if self.min_cosine is None else round(self.min_cosine, 6),
                "worst_length": self.worst_length,
                "below_bound": [[n, round(c, 6)] for n, c in self.below],
                "prefixes_of": self.source}


@dataclass(frozen=True)
class QualityReport:
    """The gate's figures: over the whole set, and per family."""

    model: str
    variant: str  # int8 or bf16
    texts: int
    held_out: int
    min_cosine: float
    p1_cosine: float
    mean_cosine: float
    held_out_min: float | None
    neighbour_agreement: float
    min_neighbour_agreement: float
    neighbours: int
    families: tuple[FamilyFigures, ...]
    worst: tuple[tuple[float, str], ...]  # (cosine, text) of the worst texts
    source: str = ""  # the model's ``source``: variants of one model share it
    runs_as: str | None = None  # the precision the CPU ran (OpenVINO), when known
    lengths: LengthSweep | None = None  # the lengths no text has, run alone

    @property
    def failed(self) -> list[FamilyFigures]:
        """The families that miss their bound."""
        return [f for f in self.families if f.status == FAIL]

    @property
    def waived(self) -> list[FamilyFigures]:
        """The families judged against a waiver's bound."""
        return [f for f in self.families if f.status in (WAIVED, UNNEEDED)]

    def to_dict(self) -> dict[str, object]:
        """The manifest form."""
        return {"texts": self.texts, "held_out": self.held_out,
                "min_cosine": round(self.min_cosine, 6), "p1_cosine": round(self.p1_cosine, 6),
                "mean_cosine": round(self.mean_cosine, 6),
                "held_out_min_cosine": (None if self.held_out_min is None
                                        else round(self.held_out_min, 6)),
                "neighbour_agreement": round(self.neighbour_agreement, 6),
                "worst": [{"cosine": round(c, 6), "text": t[:120]} for c, t in self.worst],
                "families": [f.to_dict() for f in self.families],
                "length_sweep": None if self.lengths is None else self.lengths.to_dict(),
                "waivers": [{"family": f.family, "min_cosine": f.bound, "reason": f.reason}
                            for f in self.waived]}


def embed(runner: Runner, encodings: Sequence[Encoding], batch: int = 16) -> np.ndarray:
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


def cosines(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two embedding matrices."""
    return (reference * candidate).sum(1) / (np.linalg.norm(reference, axis=1)
                                             * np.linalg.norm(candidate, axis=1))


def neighbour_agreements(reference: np.ndarray, candidate: np.ndarray, k: int) -> np.ndarray:
    """Per row: |top-k(candidate) ∩ top-k(reference)| / k by cosine, self excluded."""
    def top(values: np.ndarray) -> np.ndarray:
        unit = values / np.linalg.norm(values, axis=1, keepdims=True)
        similarity = unit @ unit.T
        np.fill_diagonal(similarity, -np.inf)
        return np.argsort(-similarity, axis=1, kind="stable")[:, :k]

    k = min(k, len(reference) - 1)
    ours, theirs = top(candidate), top(reference)
    return np.array([len(set(a) & set(b)) / k for a, b in zip(ours, theirs)])


def neighbour_agreement(reference: np.ndarray, candidate: np.ndarray, k: int) -> float:
    """Mean over rows of ``neighbour_agreements``."""
    return float(np.mean(neighbour_agreements(reference, candidate, k)))


def length_sweep(quality: QualitySet, cosine: np.ndarray, reference: Runner, candidate: Runner,
                 bound: float) -> LengthSweep:
    """Run alone each length between the set's shortest and longest text that no text has.

    The sequence of length ``n`` is the first ``n - 1`` tokens of one longest text and its last
    token (the end token a tokenizer appends): natural tokens, the request shape a user's text
    of ``n`` tokens would have. The longest text chosen is the one the candidate matched best,
    so a low cosine points at the length, not at hard content.
    """
    lengths = [len(ids) for ids, _ in quality.encodings]
    first, last = min(lengths), max(lengths)
    longest = [i for i, n in enumerate(lengths) if n == last]
    base = max(longest, key=lambda i: (cosine[i], -i))
    ids, mask = quality.encodings[base]
    missing = sorted(set(range(first, last + 1)) - set(lengths))
    swept = [(list(ids[:n - 1]) + list(ids[-1:]), list(mask[:n])) for n in missing]
    values = (cosines(embed(reference, swept, batch=1), embed(candidate, swept, batch=1))
              if swept else np.zeros(0))
    worst = int(np.argmin(values)) if len(values) else None
    return LengthSweep(
        first, last, len(missing), None if worst is None else float(values[worst]),
        None if worst is None else missing[worst],
        tuple((n, float(c)) for n, c in zip(missing, values) if c < bound),
        quality.texts[base].source, bound)


def load_gate_set(gate: QualitySetSpec, root: Path, where: str) -> tuple[QualitySet, Path]:
    """The quality set of ``gate`` (its ``texts`` and ``own_texts``) and its tokenizer file.

    Raises:
        SpecError: a file does not resolve; ``QualitySetError`` when one is malformed.
    """
    from tools.build_repo.spec import resolve_file

    tokenizer = resolve_file(gate.tokenizer, root, f"{where}field 'cpu.quality.tokenizer': ")
    files = [(resolve_file(gate.texts, root, f"{where}field 'cpu.quality.texts': "), UNLABELLED_FORM)]
    if gate.own_texts is not None:
        files.append((resolve_file(gate.own_texts, root, f"{where}field 'cpu.quality.own_texts': "),
                      OWN_FORM))
    return load_quality_set(files, tokenizer, gate.max_length, root), tokenizer


def _low(values: np.ndarray) -> tuple[float | None, float | None]:
    if not len(values):
        return None, None
    return float(values.min()), percentile(sorted(values.tolist()), 1.0)


def family_figures(quality: QualitySet, cosine: np.ndarray, agreement: np.ndarray,
                   bound: float, waivers: Sequence[QualityWaiverSpec]) -> tuple[FamilyFigures, ...]:
    """Every family's row (see ``FamilyFigures``).

    Raises:
        QualitySetError: a waiver names a family the set has no text of.
    """
    names = quality.family_names()
    waived = {w.family: w for w in waivers}
    missing = sorted(set(waived) - set(names))
    if missing:
        raise QualitySetError(f"field 'cpu.quality.waivers': {missing} has no text in the quality "
                              f"set (families: {', '.join(names)})")
    in_waived = np.array([any(f in waived for f in fams) for fams in quality.families], bool)
    held = np.array([t.split == HELD_OUT for t in quality.texts], bool)
    rows = []
    for family in names:
        members = np.array(quality.members(family), int)
        waiver = waived.get(family)
        judged = members if waiver else members[~in_waived[members]]
        limit = waiver.min_cosine if waiver else bound
        values = cosine[judged]
        low, p1 = _low(values)
        held_low, held_p1 = _low(cosine[judged[held[judged]]])
        below = int((values < limit).sum())
        if waiver:
            status = FAIL if below else (UNNEEDED if low is None or low >= bound else WAIVED)
        else:
            status = FAIL if below else PASS
        worst = None
        if len(judged):
            i = int(judged[np.argmin(values)])
            text = quality.texts[i]
            worst = Worst(float(cosine[i]), int(np.flatnonzero(members == i)[0]) + 1, text.source,
                          text.kind, text.text)
        rows.append(FamilyFigures(
            family, len(judged), int(held[judged].sum()), len(members) - len(judged), low, p1,
            held_low, held_p1, float(agreement[judged].mean()) if len(judged) else None, limit,
            status, below, worst, waiver.reason if waiver else ""))
    return tuple(rows)


def check_embedding_quality(spec: ModelSpec, gate: QualitySetSpec, quality: QualitySet,
                            reference: Runner, candidate: Runner) -> QualityReport:
    """Compare ``candidate`` with ``reference`` (fp32) on every text of ``quality``, in
    length-sorted batches and each text alone (the worse cosine counts).

    Raises:
        QualityError: naming every family that missed its bound (with its worst text, its
            index in the family and its line), and the agreement if it missed.
    """
    texts = [t.text for t in quality.texts]
    if len(texts) < 2:
        raise QualityError(f"model {spec.name!r}: field 'cpu.quality.texts' holds {len(texts)} "
                           f"text(s); the gate needs at least 2", _empty_report(spec, gate, len(texts)))
    ref, cand = embed(reference, quality.encodings), embed(candidate, quality.encodings)
    # Each text also alone, at its own length, as a request of one runs it: a runtime's kernel
    # can fail at one shape only (OpenVINO 2026.4, int8 with bf16 leftovers on an AMX Xeon:
    # every sequence of exactly 32 tokens at cosine 0.62-0.86), which batches padded to their
    # longest text passed by. A text's cosine is the worse of the two.
    alone = embed(candidate, quality.encodings, batch=1)
    cosine = np.minimum(cosines(ref, cand), cosines(ref, alone))
    lengths = length_sweep(quality, cosine, reference, candidate, gate.min_cosine)
    agreement = neighbour_agreements(ref, cand, gate.neighbours)
    held = np.array([t.split == HELD_OUT for t in quality.texts], bool)
    families = family_figures(quality, cosine, agreement, gate.min_cosine, gate.waivers)
    worst = tuple((float(cosine[i]), texts[i]) for i in np.argsort(cosine, kind="stable")[:3])
    report = QualityReport(
        spec.name, spec.cpu.gated_variant or "", len(texts), int(held.sum()), float(cosine.min()),
        percentile(sorted(cosine.tolist()), 1.0), float(cosine.mean()),
        float(cosine[held].min()) if held.any() else None, float(agreement.mean()),
        gate.min_neighbour_agreement, gate.neighbours, families, worst, lengths=lengths)
    failed = [f"{f.family} min cosine {f.min_cosine:.5f} < {f.bound} on {f.below} of {f.texts} "
              f"texts (worst: {f.worst.describe(f.family, f.texts + f.waived_elsewhere)})"
              for f in report.failed]
    if lengths.below:
        shown = ", ".join(f"{n} tokens at {c:.5f}" for n, c in lengths.below[:5])
        more = f" and {len(lengths.below) - 5} more" if len(lengths.below) > 5 else ""
        failed.append(f"run alone, {len(lengths.below)} of the {lengths.swept} lengths no text "
                      f"has missed {gate.min_cosine}: {shown}{more} (prefixes of {lengths.source})")
    if report.neighbour_agreement < gate.min_neighbour_agreement:
        failed.append(f"top-{gate.neighbours} neighbour agreement "
                      f"{report.neighbour_agreement:.4f} < {gate.min_neighbour_agreement}")
    if failed:
        raise QualityError(f"model {spec.name!r}: the {report.variant} quality gate failed: "
                           + "; ".join(failed) + f" (mean cosine {report.mean_cosine:.5f})", report)
    return report


def _empty_report(spec: ModelSpec, gate: QualitySetSpec, texts: int) -> QualityReport:
    nan = float("nan")
    return QualityReport(spec.name, spec.cpu.gated_variant or "", texts, 0, nan, nan, nan, None,
                         nan, gate.min_neighbour_agreement, gate.neighbours, (), ())


def run_gate(stages: Any, spec: ModelSpec, gate: QualitySetSpec, quality: QualitySet,
             reference: Runner, candidate: Runner, runs_as: str | None = None) -> QualityReport:
    """The ``quality`` stage of a build: the gate, its report kept on the model's result (for
    the build table) whether it passes or not. ``runs_as``: the precision the CPU ran."""
    def keep(report: QualityReport) -> QualityReport:
        stages.result.quality = replace(report, source=spec.source or spec.name, runs_as=runs_as)
        return stages.result.quality

    try:
        report = stages.run(Stage.QUALITY, check_embedding_quality, spec, gate, quality, reference,
                            candidate)
    except QualityError as exc:
        exc.report = keep(exc.report)
        raise
    return keep(report)


def summary_note(report: QualityReport) -> str:
    """The build table's note of a gated model."""
    note = (f"{report.variant}: min cosine {report.min_cosine:.5f} over {len(report.families)} "
            f"families, top-{report.neighbours} agreement {report.neighbour_agreement:.3f}")
    if report.waived:
        note += "; WAIVED: " + ", ".join(f"{f.family} ≥ {f.bound}" for f in report.waived)
    return note


def _figure(value: float | None) -> str:
    return "—" if value is None else f"{value:.5f}"


def quality_table(report: QualityReport):
    """The per-family table of one gated model (a ``rich`` Table)."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(f"quality gate: {report.model} ({report.variant} vs fp32), "
                               f"{report.texts} texts, {report.held_out} held out"),
                  title_justify="left")
    for column in ("family", "texts (held out)", "min", "P1", "held-out min", "held-out P1",
                   f"top-{report.neighbours}", "bound", "status"):
        table.add_column(column, overflow="fold")
    colours = {PASS: "green", FAIL: "red", WAIVED: "yellow", UNNEEDED: "yellow"}
    for f in report.families:
        count = f"{f.texts} ({f.held_out})"
        if f.waived_elsewhere:
            count += f" +{f.waived_elsewhere} waived"
        status = f"[{colours[f.status]}]{f.status}[/]"
        if f.status == FAIL and f.worst is not None:
            status += escape(f": worst is text {f.worst.index} ({f.worst.source})")
        elif f.reason:
            status += escape(f": {f.reason}")
        table.add_row(escape(f.family), count, _figure(f.min_cosine), _figure(f.p1_cosine),
                      _figure(f.held_out_min), _figure(f.held_out_p1),
                      _figure(f.neighbour_agreement), f"{f.bound}", status)
    sweep = report.lengths
    if sweep is not None and sweep.swept:
        status = (f"[{colours[FAIL]}]{FAIL}[/]" + escape(f": {len(sweep.below)} lengths, worst "
                                                        f"{sweep.worst_length} tokens")
                  if sweep.below else f"[{colours[PASS]}]{PASS}[/]")
        table.add_row(escape(f"lengths {sweep.first}-{sweep.last} no text has, alone"),
                      f"{sweep.swept}", _figure(sweep.min_cosine), "", "", "", "",
                      f"{sweep.bound}", status)
    table.add_row("all", f"{report.texts} ({report.held_out})", _figure(report.min_cosine),
                  _figure(report.p1_cosine), _figure(report.held_out_min), "",
                  _figure(report.neighbour_agreement),
                  f"top-{report.neighbours} ≥ {report.min_neighbour_agreement}", "")
    return table


def recommendations(reports: Sequence[QualityReport]) -> list[str]:
    """Lines that point users from a waived variant to a variant of the same model (the same
    ``source``) that passes every family unwaived; a bf16 one only where the CPU runs bf16."""
    lines = []
    for report in reports:
        if not report.waived or report.failed:
            continue
        clean = [r for r in reports
                 if r.source == report.source and r is not report and not r.waived
                 and not r.failed and (r.variant != "bf16" or r.runs_as == "bf16")]
        waived = ", ".join(f"{f.family} ≥ {f.bound}" for f in report.waived)
        line = f"{report.model} passes its gate only with waivers ({waived})"
        if clean:
            line += (f"; {', '.join(r.model for r in clean)} passes every family and is the "
                     f"recommended fast variant on this CPU")
        lines.append(line)
    return lines


def print_quality(console: Any, reports: Sequence[QualityReport]) -> None:
    """The per-family table of each gated model built, then the recommendations."""
    for report in reports:
        console.print(quality_table(report))
    for line in recommendations(reports):
        console.print(f"note: {line}", markup=False, soft_wrap=True)
