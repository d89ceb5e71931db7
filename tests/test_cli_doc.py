"""docs/cli.md's tables are what the click commands generate (``scripts/generate_docs.py``)."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import pytest

from tools.cli_doc import CLI_DOC, TABLES, commands, generated, visible_options
from tools.command import renamed_options
from tools.spec_schema import REGENERATE, fill_blocks

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / CLI_DOC


def test_the_committed_page_is_what_the_commands_generate():
    want = generated(ROOT)[DOC]
    have = DOC.read_text(encoding="utf-8")
    diff = "".join(difflib.unified_diff(have.splitlines(True), want.splitlines(True),
                                        f"{CLI_DOC} (committed)", f"{CLI_DOC} (generated)", n=1))
    assert have == want, f"{CLI_DOC} is stale; run `{REGENERATE}`:\n{diff}"


def test_every_command_and_every_visible_option_is_on_the_page():
    text = DOC.read_text(encoding="utf-8")
    for path, command in commands():
        section = text.split(f"### `tools {path}`\n", 1)[1].split("\n### ", 1)[0]
        for opts, _ in visible_options(path, command):
            assert f"| `{opts.replace('|', chr(92) + '|')}` |" in section, (path, opts)
        for old, new in renamed_options(command).items():
            assert f"| `tools {path}` | `{old}` | `{new}` |" in text


def test_a_block_without_a_table_or_a_table_without_a_block_is_an_error():
    with pytest.raises(ValueError, match=r"docs/cli.md: unknown generated block 'nope'"):
        fill_blocks("<!-- BEGIN GENERATED: nope -->\n<!-- END GENERATED -->\n", TABLES, CLI_DOC)
    with pytest.raises(ValueError, match=re.escape("docs/cli.md: no generated block for "
                                                   "['options', 'renamed']")):
        fill_blocks("<!-- BEGIN GENERATED: shared -->\n<!-- END GENERATED -->\n", TABLES,
                    CLI_DOC)
