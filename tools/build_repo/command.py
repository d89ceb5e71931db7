"""`tools build-repo`: parse the options, then call the orchestrator (or the drift check).

``pipeline.build_repository`` is the API; ``drift.check_repository`` backs ``--check``.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from tools.command import ToolCommand, option, spec_option
from tools.build_repo.drift import check_repository
from tools.build_repo.pipeline import build_repository
from tools.build_repo.spec import TARGETS
from tools.errors import ConfigError


@click.command("build-repo", cls=ToolCommand)
@spec_option()
@option("--repository", type=click.Path(file_okay=False, path_type=Path),
        default=Path("model_repository"), show_default=True, old_names=("--output",),
        help="The model repository to write (--check: to compare).")
@click.option("--target", type=click.Choice(TARGETS), default=None,
              help="cpu (embedded server) or gpu (NGC image); default: the spec's target.")
@click.option("--only", multiple=True, metavar="NAME", help="Build only this model (repeatable).")
@click.option("--force", is_flag=True, help="Rebuild models even when nothing changed.")
@click.option("--check", is_flag=True,
              help="Only compare committed config.pbtxt files with the spec; exit 1 on drift.")
@click.option("--no-progress", is_flag=True, help="No live progress display.")
@click.option("--allow-missing-gpu", is_flag=True, envvar="TRITON_FORGE_ALLOW_MISSING_GPU",
              help="gpu target without a visible GPU: build anyway, TensorRT plans recorded as "
                   "skipped (by default the build fails, naming the models). Also "
                   "TRITON_FORGE_ALLOW_MISSING_GPU=1.")
def build_repo(spec_path: Path, repository: Path, target: str | None, only: tuple[str, ...],
               force: bool, check: bool, no_progress: bool, allow_missing_gpu: bool) -> None:
    """Export, check and write the Triton model repository from the spec."""
    if check:
        drift = check_repository(spec_path, repository, target)
        if drift:
            click.echo("\n".join(drift))
            raise ConfigError(
                f"{len(drift)} config(s) in {repository} differ from {spec_path}; run "
                f"`tools build-repo` and commit the config.pbtxt files"
            )
        click.echo(f"{repository}: every config.pbtxt matches {spec_path}")
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    build_repository(spec_path, repository, target, list(only) or None, force, not no_progress,
                     allow_missing_gpu=allow_missing_gpu)
