"""The README and docs/ tell the truth about the checkout: its commands exist, its links resolve.

The README is a user's guide: short (counted in words and bytes, not lines, so a long line
cannot hide a diary) and free of lab notes (no dates, UTC times, run letters or machine names).
The two set-up commands of its Quick start are files that do what the README says (one runs the
main job on the embedded server, one the tests, the one CI runs); every ``tools ...`` line in a
code block of the README, CONTRIBUTING.md, CHANGELOG.md, docs/ and loadtests/README.md names a
real command and only options that command shows in ``--help`` (so no old spelling is taught);
every relative link resolves. No server, no torch.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tools.cli_doc import commands
from tools.command import renamed_options

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
WHOLE_PATH = "## From your model to a P99-gated deployment"
# ``tools NAME [SUB]`` at the start of a command: first, after a path, ``(`` (``$(``), ``&&`` or
# ``VAR=x``; in scripts also ``$TOOLS`` (quickstart.sh's name for .venv/bin/tools).
_TOOLS = re.compile(r"(?:^|/|\(|&& |=\S+ )tools ([a-z][a-z0-9-]*(?: [a-z][a-z0-9_-]*)?)(.*)$")
_ASSIGNED = re.compile(r"\b\w+=[^\s(]*tools\b")  # TOOLS=.venv/bin/tools: a name, not a command
PAGES = [README, ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", ROOT / "loadtests" / "README.md",
         *sorted((ROOT / "docs").glob("*.md"))]
MAX_WORDS = 1500
MAX_BYTES = 10 * 1024
# What a lab notebook leaves in a page: a date, a time of day in UTC, a run named by its letter
# ("run K", "runs K-N"), the machine it ran on.
LAB_NOTES = {
    "a date": re.compile(r"\b\d{4}-\d{2}-\d{2}\b"),
    "a UTC time": re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?\s*UTC\b"),
    "a run letter": re.compile(r"\b[Rr]uns? [A-Z](?:\s*[-–]\s*[A-Z])?\b(?![\w'])"),
    "a machine name": re.compile(r"\b(?:Zen ?\d|EPYC|Xeon|AMX)\b"),
}
SCRIPTS = [ROOT / ".ci" / "run", *sorted((ROOT / "scripts").glob("*.sh"))]


def _code_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.M | re.S)


def _quick_start_commands() -> list[str]:
    section = README.read_text(encoding="utf-8").split("## Quick start\n", 1)[1].split("\n## ")[0]
    (block,) = _code_blocks(section)
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_the_two_quick_start_commands_are_the_scripts_that_do_what_the_readme_says():
    assert _quick_start_commands() == ["bash scripts/quickstart.sh", "bash scripts/test.sh"]
    quickstart = (ROOT / "scripts" / "quickstart.sh").read_text(encoding="utf-8")
    for step in ("scripts/setup.sh", "build-repo", "serve --background", "infer", "loadtest",
                 "serve --stop"):
        assert step in quickstart, step
    test = (ROOT / "scripts" / "test.sh").read_text(encoding="utf-8")
    for step in ("scripts/setup.sh", "build-repo --check", "generate_docs.py --check", "pytest"):
        assert step in test, step
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_the_commands_at_a_glance_are_every_command_there_is():
    section = README.read_text(encoding="utf-8").split("## Commands at a glance\n", 1)[1]
    rows = re.findall(r"^\| `tools ([a-z-]+(?: [a-z0-9]+)?)", section.split("\n## ")[0], re.M)
    listed = {row if row in dict(commands()) else row.split()[0] for row in rows}
    assert listed == {name for name, _ in commands()}


def test_the_readme_is_short_and_leaves_the_whole_path_section_to_its_author():
    text = README.read_text(encoding="utf-8")
    words, size = len(text.split()), len(text.encode("utf-8"))
    assert words <= MAX_WORDS, f"README.md: {words} words, more than {MAX_WORDS}"
    assert size <= MAX_BYTES, f"README.md: {size} bytes, more than {MAX_BYTES}"
    assert text.count(WHOLE_PATH + "\n") == 1
    assert text.count("\n## ") >= 5


def test_the_readme_holds_no_lab_notes():
    """Dated runs, their times, letters and machines belong in docs/performance.md, not here."""
    text = README.read_text(encoding="utf-8")
    found = [f"{what}: {match.group(0)!r}" for what, pattern in LAB_NOTES.items()
             for match in pattern.finditer(text)]
    assert not found, "README.md holds lab notes:\n" + "\n".join(found)


def test_the_lab_note_patterns_catch_what_they_are_for():
    notes = {"a date": "on 2026-12-05", "a UTC time": "at 12:05 UTC", "a run letter": "Run O",
             "a machine name": "an AMD Zen 4"}
    for what, sample in notes.items():
        assert LAB_NOTES[what].search(sample), what
    for clean in ("it runs a short load", "runs Locust", "the fast and integration tiers",
                  "P99 <= 800 ms", "8000-8002"):
        assert not any(p.search(clean) for p in LAB_NOTES.values()), clean


def _tools_lines(path: Path) -> list[list[str]]:
    """Each ``tools ...`` command line in the code blocks of ``path`` (``tools`` first, after a
    path, an environment assignment or ``&&``), as its words, joined across ``\\``
    continuations; comments and what follows ``&&``/``|``/``;`` left out."""
    text = path.read_text(encoding="utf-8")
    blocks = _code_blocks(text) if path.suffix == ".md" else [text.replace("$TOOLS", "tools")]
    found = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = _ASSIGNED.sub("", line.split(" #", 1)[0]).strip()
            match = _TOOLS.search(line)
            if match is None or line.startswith("#"):
                continue
            rest = re.split(r"&&|\|\||[|;]", match.group(2))[0]
            try:
                words = shlex.split(rest)
            except ValueError:
                words = rest.split()
            found.append([*match.group(1).split(), *words])
    return found


def test_every_tools_command_in_the_docs_and_scripts_is_real_and_spelt_as_help_shows_it():
    known = dict(commands())
    problems = []
    for page in [*PAGES, *SCRIPTS]:
        for words in _tools_lines(page):
            name = " ".join(words[:2]) if " ".join(words[:2]) in known else words[0]
            if name not in known:
                problems.append(f"{page.name}: tools {' '.join(words[:2])}: no such command")
                continue
            command = known[name]
            shown = {opt for p in command.params if not getattr(p, "hidden", False)
                     for opt in (*p.opts, *p.secondary_opts)} | {"--help"}
            old = renamed_options(command)
            for word in words[len(name.split()):]:
                option = word.split("=", 1)[0]
                if option.startswith("--") and option not in shown:
                    now = f" (now {old[option]})" if option in old else ""
                    problems.append(f"{page.name}: tools {name} {option}{now}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page):
    text = page.read_text(encoding="utf-8")
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (page.parent / target.split("#", 1)[0]).exists():
            missing.append(target)
    assert not missing, f"{page.relative_to(ROOT)}: links to nothing: {missing}"
