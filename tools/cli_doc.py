"""docs/cli.md's tables, generated from the click commands themselves so they cannot drift.

One table of every command's options (as ``--help`` shows them), one of the options several
commands share, one of the old spellings still accepted (``tools.command.ToolOption.old_names``).
``scripts/generate_docs.py`` writes them; ``tests/test_cli_doc.py`` fails when they are stale.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click

from tools import paths

CLI_DOC = "docs/cli.md"


def commands() -> Iterator[tuple[str, click.Command]]:
    """``(name, command)`` of every subcommand of ``tools``, a group's own ones after it
    (``deploy k8s``), in ``tools --help`` order."""
    from tools.cli import cli

    ctx = click.Context(cli, info_name="tools")
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        if isinstance(command, click.Group):
            for sub in sorted(command.commands):
                yield f"{name} {sub}", command.commands[sub]
        else:
            yield name, command


def _cell(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().replace("|", "\\|")


def visible_options(name: str, command: click.Command) -> list[tuple[str, str]]:
    """``(option, help)`` as ``tools NAME --help`` shows them, ``--help`` left out."""
    ctx = click.Context(command, info_name=f"tools {name}")
    rows = []
    for param in command.get_params(ctx):
        if not isinstance(param, click.Option) or set(param.opts) & set(ctx.help_option_names):
            continue
        record = param.get_help_record(ctx)
        if record is not None:
            rows.append(record)
    return rows


def _option_names(command: click.Command) -> set[str]:
    return {"/".join((*p.opts, *p.secondary_opts)) for p in command.params
            if isinstance(p, click.Option) and not p.hidden}


def options_tables() -> str:
    """One section per command: a table of its options and what each does."""
    parts = []
    for name, command in commands():
        summary = _cell(command.get_short_help_str(limit=300))
        rows = "".join(f"| `{_cell(opts)}` | {_cell(text)} |\n"
                       for opts, text in visible_options(name, command))
        table = ("| option | what it does |\n|---|---|\n" + rows) if rows else "No options.\n"
        parts.append(f"### `tools {name}`\n\n{summary}\n\n{table}")
    return "\n".join(parts)


def shared_table() -> str:
    """The options of several commands: each is one concept, spelt the same in all of them."""
    users: dict[str, list[str]] = {}
    for name, command in commands():
        for opt in _option_names(command):
            users.setdefault(opt, []).append(name)
    rows = "".join(f"| `{opt}` | {', '.join(f'`{n}`' for n in names)} |\n"
                   for opt, names in sorted(users.items()) if len(names) > 1)
    return "| option | commands |\n|---|---|\n" + rows


def renamed_table() -> str:
    """Every old spelling still accepted, and the option it now is."""
    from tools.command import renamed_options

    rows = "".join(f"| `tools {name}` | `{old}` | `{new}` |\n" for name, command in commands()
                   for old, new in sorted(renamed_options(command).items()))
    return "| command | old spelling | now |\n|---|---|---|\n" + rows


TABLES = {"options": options_tables, "shared": shared_table, "renamed": renamed_table}


def generated(root: Path = paths.CHECKOUT) -> dict[Path, str]:
    """docs/cli.md under ``root`` with its tables as the commands give them now.

    Raises:
        ValueError: a block names no table, or a table has no block.
    """
    from tools.spec_schema import fill_blocks

    path = root / CLI_DOC
    return {path: fill_blocks(path.read_text(encoding="utf-8"), TABLES, CLI_DOC)}
