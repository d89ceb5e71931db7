"""The one edge of the command line: the click command class of every stage, and its options.

``UserInputError`` becomes a usage error with the subcommand's own usage line (exit 2), any other
``ToolkitError`` a one-line failure (exit 1). Options that mean the same in several commands are
made here, so they are spelt, typed and explained the same everywhere (docs/cli.md); an option's
old spellings (``old_names``) still work, hidden from ``--help``, with a note naming the new one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from tools.errors import ToolkitError, UserInputError
from tools.net import check_host_port


def _translated(invoke, ctx: click.Context):
    try:
        return invoke(ctx)
    except UserInputError as exc:
        raise click.UsageError(str(exc), ctx) from exc
    except ToolkitError as exc:
        raise click.ClickException(str(exc)) from exc


class ToolOption(click.Option):
    """An option that also answers to ``old_names``: earlier spellings, hidden from ``--help``.

    ``ToolCommand`` reads an old name as the option's own (``--users 8`` is ``--concurrency 8``)
    and notes the new spelling on stderr.
    """

    def __init__(self, *args: Any, old_names: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if old_names and (self.is_flag or self.count or self.secondary_opts):
            raise TypeError(f"{self.opts[0]}: old names are for options that take a value")
        self.old_names = tuple(old_names)


def option(*param_decls: str, old_names: Sequence[str] = (), **attrs: Any):
    """``click.option`` for a ``ToolCommand``, with the option's old spellings (``old_names``)."""
    return click.option(*param_decls, cls=ToolOption, old_names=old_names, **attrs)


def renamed_options(command: click.Command) -> dict[str, str]:
    """Old spelling -> the option's name, for every option of ``command``."""
    return {old: p.opts[0] for p in command.params if isinstance(p, ToolOption)
            for old in p.old_names}


class ToolCommand(click.Command):
    """A stage's subcommand (``@click.command(cls=ToolCommand)``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        names = {opt for p in self.params for opt in (*p.opts, *p.secondary_opts)}
        clash = sorted(set(renamed_options(self)) & names)
        if clash:
            raise TypeError(f"{self.name}: old option names {clash} are options of their own")

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, self._renamed(args))

    def _renamed(self, args: list[str]) -> list[str]:
        """``args`` with every old option name replaced by the option's own; a note for each."""
        renamed = renamed_options(self)
        if not renamed:
            return args
        takes_value = {opt for p in self.params if isinstance(p, click.Option)
                       and not (p.is_flag or p.count) for opt in p.opts}
        out: list[str] = []
        index = 0
        while index < len(args):
            token = args[index]
            if token == "--":
                out.extend(args[index:])
                break
            name, equals, value = token.partition("=")
            if name in renamed:
                click.echo(f"note: tools {self.name} {name} is now {renamed[name]} (the old "
                           f"name still works)", err=True)
                name = renamed[name]
                token = name + equals + value
            out.append(token)
            if not equals and name in takes_value and index + 1 < len(args):
                out.append(args[index + 1])  # the option's value, even if it looks like an option
                index += 1
            index += 1
        return out

    def invoke(self, ctx: click.Context):
        return _translated(super().invoke, ctx)


class ToolGroup(click.Group):
    """A stage with subcommands of its own (``tools deploy k8s``); they are ``ToolCommand``s."""

    command_class = ToolCommand

    def invoke(self, ctx: click.Context):
        return _translated(super().invoke, ctx)


# --------------------------------------------------------------------------- shared options


class HostPort(click.ParamType):
    """``host:port`` of a server endpoint, as tritonclient takes it (no scheme, no path)."""

    name = "host:port"

    def __init__(self, example: str) -> None:
        self.example = example

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "HOST:PORT"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None):
        option = param.opts[0] if param is not None and param.opts else "endpoint"
        try:
            return check_host_port(str(value), option, self.example)
        except UserInputError as exc:
            raise click.UsageError(str(exc), ctx) from None


HTTP_EXAMPLE, GRPC_EXAMPLE = "127.0.0.1:8000", "127.0.0.1:8001"


def url_option(help: str, **attrs: Any):
    """``--url``: the HTTP endpoint (``host:port``) of a running server."""
    return option("--url", type=HostPort(HTTP_EXAMPLE), help=f"HTTP endpoint of {help}", **attrs)


def grpc_url_option(help: str, **attrs: Any):
    """``--grpc-url``: the gRPC endpoint (``host:port``) of a running server."""
    return option("--grpc-url", type=HostPort(GRPC_EXAMPLE), help=f"gRPC endpoint of {help}",
                  **attrs)


def spec_option(help: str = "The repository spec.", **attrs: Any):
    """``--spec`` (parameter ``spec_path``): the repository spec file."""
    return option("--spec", "spec_path", type=click.Path(dir_okay=False, path_type=Path),
                  default=Path("repository.yaml"), show_default=True, help=help, **attrs)


def data_option(**attrs: Any):
    """``--data``: payloads instead of the shipped ones, for any scenario of the spec."""
    return option("--data", type=click.Path(exists=True, path_type=Path),
                  show_default="the shipped ones: loadtests/data/texts.txt of this project, its "
                  "photos, generated tensors",
                  help="Send these payloads instead of the shipped ones: texts (one per line; "
                  "tab-separated for text pairs), a folder of images, or JSON lines (one request "
                  "per line, input name -> value).", **attrs)


def protocol_option(choices: Sequence[str], default: str, help: str, **attrs: Any):
    """``--protocol``: the client protocol, ``http`` / ``grpc`` (``both``), always that order."""
    order = [c for c in ("http", "grpc", "both") if c in choices]
    return option("--protocol", type=click.Choice(order), default=default, show_default=True,
                  help=help, **attrs)


def slo_file_option(**attrs: Any):
    """``--slo-file``: the SLO targets and default loads."""
    return option("--slo-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
                  show_default="the spec's: loadtests/slo.yaml or slo.yaml beside it, else "
                  "loadtests/slo.yaml of this project",
                  help="SLO targets and default loads per profile and scenario.", **attrs)


def scenario_names(values: Sequence[str]) -> tuple[str, ...]:
    """Repeated ``--scenario`` values, each possibly comma-separated, without repeats."""
    return tuple(dict.fromkeys(n.strip() for v in values for n in v.split(",") if n.strip()))
