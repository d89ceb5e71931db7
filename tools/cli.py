"""The ``tools`` command line: one click group, one subcommand per stage.

Each subcommand lives next to the code it drives and is registered here; the errors of the
project reach the person through ``tools.command.ToolCommand``, the one edge.
"""

from __future__ import annotations

import importlib
import sys

import click

from tools.errors import ToolkitError, UserInputError

# name -> "module:attribute" of a click.Command; imported only when used, so that
# `tools serve` does not pay for importing torch.
_COMMANDS = {
    "api": "tools.api.command:api",
    "build-repo": "tools.build_repo.command:build_repo",
    "serve": "tools.serve.command:serve",
    "infer": "tools.infer:infer",
    "loadtest": "tools.loadtest.command:loadtest",
    "bench": "tools.bench.command:bench",
    "deploy": "tools.deploy.command:deploy",
    "add": "tools.add.command:add",
    "tune": "tools.tune.command:tune",
    "init": "tools.init:init",
}

# Shown by `tools --help` without importing each stage.
_SHORT_HELP = {
    "api": "Serve OpenAI's /v1/embeddings and TEI's /embed, /rerank, /predict in front of Triton.",
    "build-repo": "Export, check and write the Triton model repository from the spec.",
    "serve": "Run a real tritonserver on the model repository (embedded by default).",
    "infer": "Send one request to a model or pipeline and print the result.",
    "loadtest": "Run a Locust scenario headless and gate it on exact P99 targets.",
    "bench": "Compare served throughput and latency with the in-process limit.",
    "deploy": "Package the repository as an OCI artifact (tools deploy package), render Kubernetes manifests (tools deploy k8s).",
    "add": "Add a model (Hugging Face folder, vision factory, ONNX file) to the spec.",
    "tune": "Search instances, threads and batching for the most throughput within P99 target.",
    "init": "Write a starter repository.yaml and slo.yaml into an empty folder.",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        return getattr(importlib.import_module(module_name), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, _SHORT_HELP[name]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context):
        # Subcommands translate their own errors (tools.command.ToolCommand); this catches what
        # is raised before one runs.
        try:
            return super().invoke(ctx)
        except UserInputError as exc:
            raise click.UsageError(str(exc), ctx) from exc
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
