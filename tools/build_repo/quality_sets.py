"""Quality sets by family: the texts a gated (int8, bf16) encoder is judged on, the family of
each text on three axes, and the part held out from every choice.

Axes and families:

- ``length``: ``short`` (at most 8 tokens, special tokens included), ``middle``, ``long``
  (at least 128) and ``truncated`` (longer than the gate's ``max_length`` before truncation),
  counted with the gate's tokenizer;
- ``script``: ``latin``, ``cjk`` (Han, kana, Hangul), ``arabic``, ``cyrillic``, ``devanagari``,
  ``emoji`` (emoji and other symbols), ``other`` (letters of any other script) and ``common``
  (no letters: digits and punctuation), read from the characters;
- ``form``: written in the data (``prose``, ``query``, ``code``, ``numbers``, ``degenerate``;
  a user's own texts are ``own`` unless their file says otherwise).

A file is either JSON Lines (``.jsonl``: one object per line with ``text``, ``form``, and
optionally ``kind`` and ``split``) or plain UTF-8 text, one text per line. At least a third of
every family is held out (``split: held_out``): those texts are judged, never used to choose
anything, and calibration refuses them. A text without a recorded split gets one here,
deterministically (``assign_split``).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.errors import ExportError, SpecError

AXES = ("length", "script", "form")
LENGTHS = ("short", "middle", "long", "truncated")
SCRIPTS = ("latin", "cjk", "arabic", "cyrillic", "devanagari", "emoji", "other", "common")
SHORT_TOKENS = 8
LONG_TOKENS = 128
HELD_OUT, TUNE = "held_out", "tune"
HELD_OUT_SHARE = 1 / 3
OWN_FORM = "own"
UNLABELLED_FORM = "unlabelled"
FORM_PATTERN = r"[a-z][a-z0-9_]*"
FAMILY_PATTERN = rf"(length|script|form):{FORM_PATTERN}"
_FORM = re.compile(FORM_PATTERN)
_FAMILY = re.compile(FAMILY_PATTERN)
_KEYS = {"text", "form", "kind", "split"}
# Unicode character-name prefixes of the scripts with a family of their own.
_SCRIPT_PREFIXES = (
    ("LATIN", "latin"), ("CJK", "cjk"), ("HIRAGANA", "cjk"), ("KATAKANA", "cjk"),
    ("HANGUL", "cjk"), ("IDEOGRAPHIC", "cjk"), ("ARABIC", "arabic"), ("CYRILLIC", "cyrillic"),
    ("DEVANAGARI", "devanagari"),
)
Encoding = tuple[list[int], list[int]]


class QualitySetError(SpecError):
    """A quality-set file is malformed (names the file, line and what was wrong)."""


class HeldOutTextError(ExportError):
    """A held-out quality text was about to be used for calibration."""


def check_family(name: str) -> str:
    """``name`` if it names a family (``axis:value``) that can exist, else ValueError."""
    if not _FAMILY.fullmatch(name):
        raise ValueError(f"{name!r} is not a family: write axis:value with axis length, script "
                         f"or form (e.g. form:degenerate)")
    axis, value = name.split(":")
    known = {"length": LENGTHS, "script": SCRIPTS}.get(axis)
    if known is not None and value not in known:
        raise ValueError(f"{name!r}: the {axis} families are {', '.join(known)}")
    return name


def script_of(text: str) -> str:
    """The script family of ``text``: ``emoji`` if it holds an emoji or other symbol, else the
    script of most of its letters (``other`` outside the named ones), ``common`` without any."""
    letters: Counter[str] = Counter()
    for char in text:
        category = unicodedata.category(char)
        if category == "So" or 0x1F000 <= ord(char) <= 0x1FAFF:
            return "emoji"
        if not category.startswith("L"):
            continue
        name = unicodedata.name(char, "")
        letters[next((s for prefix, s in _SCRIPT_PREFIXES if name.startswith(prefix)), "other")] += 1
    return letters.most_common(1)[0][0] if letters else "common"


def length_of(tokens: int, max_length: int) -> str:
    """The length family of a text of ``tokens`` tokens (before truncation)."""
    if tokens > max_length:
        return "truncated"
    if tokens >= LONG_TOKENS:
        return "long"
    return "short" if tokens <= SHORT_TOKENS else "middle"


@dataclass(frozen=True)
class QualityText:
    """One text of a quality set and where it came from."""

    text: str
    form: str
    source: str  # "<file>:<line>"
    kind: str = ""
    split: str | None = None  # HELD_OUT, TUNE, or None until assign_split


def read_texts(path: Path) -> list[str]:
    """The non-blank lines of a UTF-8 text file, stripped (a calibration file)."""
    return [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def read_quality_file(path: Path, default_form: str, label: str | None = None) -> list[QualityText]:
    """The texts of one file (JSON Lines when it ends in ``.jsonl``, else one text per line;
    blank lines are skipped).

    Raises:
        QualitySetError: a line is not an object with a string ``text`` and a valid ``form``,
            ``split`` is neither ``held_out`` nor ``tune``, a key is unknown, or a text repeats.
    """
    path = Path(path)
    texts: list[QualityText] = []
    seen: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        where = f"{label or path}:{number}"
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            item = _json_text(line, where, default_form)
        else:
            item = QualityText(line.strip(), default_form, where)
        if item.text in seen:
            raise QualitySetError(f"{where}: the same text as {seen[item.text]}")
        seen[item.text] = where
        texts.append(item)
    return texts


def _json_text(line: str, where: str, default_form: str) -> QualityText:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise QualitySetError(f"{where}: not a JSON object: {exc.msg}") from None
    if not isinstance(data, dict) or not isinstance(data.get("text"), str) or not data["text"].strip():
        raise QualitySetError(f"{where}: needs a non-empty string 'text'")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise QualitySetError(f"{where}: unknown key(s) {unknown} (known: {sorted(_KEYS)})")
    form = data.get("form", default_form)
    if not isinstance(form, str) or not _FORM.fullmatch(form):
        raise QualitySetError(f"{where}: 'form' must match {FORM_PATTERN}, got {form!r}")
    split = data.get("split")
    if split not in (None, HELD_OUT, TUNE):
        raise QualitySetError(f"{where}: 'split' must be {HELD_OUT!r} or {TUNE!r}, got {split!r}")
    kind = data.get("kind", "")
    if not isinstance(kind, str):
        raise QualitySetError(f"{where}: 'kind' must be a string, got {kind!r}")
    return QualityText(data["text"], form, where, kind, split)


def assign_split(texts: Sequence[str], families: Sequence[Sequence[str]],
                 recorded: Sequence[str | None]) -> list[str]:
    """Every text's split: the recorded one where there is one; the others, in the order of
    their sha256, are held out while any of their families has fewer than a third held out.

    Deterministic: the same texts and families give the same split, whatever their order.
    """
    size = Counter(f for fams in families for f in fams)
    held = Counter(f for fams, s in zip(families, recorded) for f in fams if s == HELD_OUT)
    split = list(recorded)
    order = sorted((i for i, s in enumerate(recorded) if s is None),
                   key=lambda i: hashlib.sha256(texts[i].encode()).hexdigest())
    for i in order:
        if any(held[f] < math.ceil(size[f] * HELD_OUT_SHARE) for f in families[i]):
            split[i] = HELD_OUT
            held.update(families[i])
        else:
            split[i] = TUNE
    return split  # type: ignore[return-value]


@dataclass(frozen=True)
class QualitySet:
    """The texts of a gate with their families, splits and token sequences."""

    texts: tuple[QualityText, ...]  # every split assigned
    families: tuple[tuple[str, ...], ...]  # per text, one family per axis
    encodings: tuple[Encoding, ...]  # truncated to the gate's max_length

    def members(self, family: str) -> list[int]:
        """Indices of the texts of ``family``, in file order."""
        return [i for i, fams in enumerate(self.families) if family in fams]

    def family_names(self) -> list[str]:
        """Every family present, axis by axis, in the order of ``LENGTHS``/``SCRIPTS`` (forms
        in order of first appearance)."""
        present = {f for fams in self.families for f in fams}
        order = [f"length:{v}" for v in LENGTHS] + [f"script:{v}" for v in SCRIPTS]
        forms = list(dict.fromkeys(fams[2] for fams in self.families))
        return [f for f in order if f in present] + forms

    @property
    def held_out(self) -> frozenset[str]:
        """The held-out texts."""
        return frozenset(t.text for t in self.texts if t.split == HELD_OUT)

    def held_out_shares(self) -> dict[str, tuple[int, int]]:
        """family -> (held-out texts, texts)."""
        return {f: (sum(self.texts[i].split == HELD_OUT for i in self.members(f)), len(self.members(f)))
                for f in self.family_names()}

    def refuse_held_out(self, texts: Iterable[str], where: str) -> None:
        """Raise unless none of ``texts`` is held out.

        Raises:
            HeldOutTextError: naming the first held-out text and its source.
        """
        held = self.held_out
        for text in texts:
            if text in held:
                source = next(t.source for t in self.texts if t.text == text)
                raise HeldOutTextError(f"{where}the held-out quality text of {source} "
                                       f"({text[:50]!r}) must not be used to calibrate")


def tokenize(texts: Sequence[str], tokenizer_file: Path, max_length: int | None
             ) -> list[Encoding]:
    """``(input_ids, attention_mask)`` of each text, unpadded, truncated to ``max_length``
    (None: not truncated)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    tokenizer.no_padding()
    if max_length is None:
        tokenizer.no_truncation()
    else:
        tokenizer.enable_truncation(max_length)
    return [(e.ids, e.attention_mask) for e in tokenizer.encode_batch(list(texts))]


def families_of(items: Sequence[QualityText], tokenizer_file: Path, max_length: int
                ) -> list[tuple[str, str, str]]:
    """The (length, script, form) families of each text."""
    full = tokenize([t.text for t in items], tokenizer_file, None)
    return [(f"length:{length_of(len(ids), max_length)}", f"script:{script_of(t.text)}",
             f"form:{t.form}") for t, (ids, _) in zip(items, full)]


def load_quality_set(files: Sequence[tuple[Path, str]], tokenizer_file: Path,
                     max_length: int, root: Path | None = None) -> QualitySet:
    """Read ``(path, default form)`` files into one quality set, assigning the splits that are
    not recorded. Sources name the files relative to ``root`` when they lie below it.

    Raises:
        QualitySetError: a file is malformed, or a text appears in two of them.
    """
    items: list[QualityText] = []
    seen: dict[str, str] = {}
    for path, form in files:
        label = str(Path(path).relative_to(root)) if root and Path(path).is_relative_to(root) else None
        for item in read_quality_file(path, form, label):
            if item.text in seen:
                raise QualitySetError(f"{item.source}: the same text as {seen[item.text]}")
            seen[item.text] = item.source
            items.append(item)
    families = families_of(items, tokenizer_file, max_length)
    split = assign_split([t.text for t in items], families, [t.split for t in items])
    texts = tuple(QualityText(t.text, t.form, t.source, t.kind, s) for t, s in zip(items, split))
    encodings = tokenize([t.text for t in texts], tokenizer_file, max_length)
    return QualitySet(texts, tuple(families), tuple(encodings))


@dataclass(frozen=True)
class Calibration:
    """Texts a static quantizer may measure activation ranges on: none of them held out."""

    texts: tuple[str, ...]
    encodings: tuple[Encoding, ...]
    left_out: int  # texts of the calibration file left out because they are held out
    tune_added: int = 0  # tune texts of the quality set added (``cpu.calibrate_on_tune``)


def calibration_set(candidates: Sequence[str], quality: QualitySet, tokenizer_file: Path,
                    max_length: int, tune_families: Sequence[str] = ()) -> Calibration:
    """``candidates`` without the held-out quality texts, then the ``tune`` texts of
    ``tune_families`` not already there, tokenized as the gate does.

    Raises:
        QualitySetError: a family of ``tune_families`` has no text in the quality set.
    """
    missing = [f for f in tune_families if not quality.members(f)]
    if missing:
        raise QualitySetError(f"field 'cpu.calibrate_on_tune': {missing} has no text in the "
                              f"quality set (families: {', '.join(quality.family_names())})")
    held = quality.held_out
    kept = [t for t in candidates if t not in held]
    present = set(kept)
    added = [t for t in dict.fromkeys(quality.texts[i].text for f in tune_families
                                      for i in quality.members(f)
                                      if quality.texts[i].split == TUNE) if t not in present]
    texts = kept + added
    return Calibration(tuple(texts), tuple(tokenize(texts, tokenizer_file, max_length)),
                       len(candidates) - len(kept), len(added))
