"""The ``tools`` command line: one click group, one subcommand per stage.

Each subcommand lives next to the code it drives and is registered here; the errors of the
project reach the person at this one edge.
"""

from __future__ import annotations

import importlib
import sys

import click

from tools.errors import ToolkitError, UserInputError

# name -> "module:attribute" of a click.Command; imported only when used, so that
# `tools serve` does not pay for importing torch.
_COMMANDS = {
    "build-repo": "tools.build_repo.command:build_repo",
    "serve": "tools.serve.command:serve",
    "infer": "tools.infer:infer",
    "loadtest": "tools.loadtest.command:loadtest",
    "bench": "tools.bench.command:bench",
    "deploy": "tools.deploy.command:deploy",
    "add": "tools.add.command:add",
}

# Shown by `tools --help` without importing each stage.
_SHORT_HELP = {
    "build-repo": "Export, check and write the Triton model repository from the spec.",
    "serve": "Run a real tritonserver on the model repository (embedded by default).",
    "infer": "Send one request to a model or pipeline and print the result.",
    "loadtest": "Run a Locust scenario headless and gate it on exact P99 targets.",
    "bench": "Compare served throughput and latency with the in-process limit.",
    "deploy": "Render Kubernetes manifests (tools deploy k8s) from the spec.",
    "add": "Add a model (Hugging Face folder, vision factory, ONNX file) to the spec.",
}


_LAST_CONTEXT: list[click.Context] = []


def _remember_context(ctx: click.Context) -> None:
    _LAST_CONTEXT[:] = [ctx]


def _innermost_context(fallback: click.Context) -> click.Context:
    return _LAST_CONTEXT[0] if _LAST_CONTEXT else fallback


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        command = getattr(importlib.import_module(module_name), attr)
        if isinstance(command, click.Command) and not getattr(command, "_remembers_context", False):
            command._remembers_context = True  # type: ignore[attr-defined]
            original = command.invoke

            def invoke(sub_ctx: click.Context, _original=original):
                _remember_context(sub_ctx)
                return _original(sub_ctx)

            command.invoke = invoke  # type: ignore[method-assign]
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, _SHORT_HELP[name]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except UserInputError as exc:
            # The subcommand's own context, so the usage line shown is the subcommand's.
            raise click.UsageError(str(exc), _innermost_context(ctx)) from exc
        except ToolkitError as exc:
            raise click.ClickException(str(exc)) from exc


@click.group(cls=_LazyGroup)
@click.version_option(package_name="triton-forge")
def cli() -> None:
    """PyTorch models to a Triton Inference Server repository, checked and proven under load."""


def main() -> None:
    cli(prog_name="tools")


if __name__ == "__main__":
    sys.exit(main())
