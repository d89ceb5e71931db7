"""The one edge where the project's errors reach people: a click command class for every stage.

``UserInputError`` becomes a usage error with the subcommand's own usage line (exit 2), any other
``ToolkitError`` a one-line failure (exit 1).
"""

from __future__ import annotations

import click

from tools.errors import ToolkitError, UserInputError


def _translated(invoke, ctx: click.Context):
    try:
        return invoke(ctx)
    except UserInputError as exc:
        raise click.UsageError(str(exc), ctx) from exc
    except ToolkitError as exc:
        raise click.ClickException(str(exc)) from exc


class ToolCommand(click.Command):
    """A stage's subcommand (``@click.command(cls=ToolCommand)``)."""

    def invoke(self, ctx: click.Context):
        return _translated(super().invoke, ctx)


class ToolGroup(click.Group):
    """A stage with subcommands of its own (``tools deploy k8s``); they are ``ToolCommand``s."""

    command_class = ToolCommand

    def invoke(self, ctx: click.Context):
        return _translated(super().invoke, ctx)
