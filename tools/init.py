"""``tools init DIR``: a starter ``repository.yaml`` and ``slo.yaml`` in an empty folder.

Both files carry a ``yaml-language-server`` schema line pointing at copies of the installed JSON
Schemas written beside them (``schemas/``), so editors validate and complete them as typed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import click

from tools import paths
from tools.command import ToolCommand
from tools.errors import UserInputError
from tools.spec_schema import REPOSITORY_SCHEMA, SLO_SCHEMA

SPEC_FILE = "repository.yaml"
SLO_FILE = "slo.yaml"
_LISTED = 5  # existing entries named in the refusal

SPEC_TEXT = """\
# yaml-language-server: $schema={schema}
# The repository spec: what `tools build-repo` turns into a Triton model repository.
# Add models with `tools add RECIPE PATH --name NAME` run in this folder (`tools add --help`);
# paths in this file are relative to it.
target: cpu
cpu_cores: {cores}   # instances x intra-op threads of each model must fit
models: {{}}
python_models: {{}}
pipelines: {{}}
"""

SLO_TEXT = """\
# yaml-language-server: $schema={schema}
# Service-level objectives for `tools loadtest --slo-file slo.yaml`: per profile and scenario (a
# pipeline of repository.yaml), the load the targets hold at and, per protocol, the exact P99,
# the error ratio and the throughput that must hold, e.g.
#   my_pipeline:
#     load: {{users: 8, duration_s: 30, warmup_s: 5}}
#     http: {{p99_ms: 600, max_error_ratio: 0.0, min_throughput_rps: 30}}
#     grpc: {{p99_ms: 600, max_error_ratio: 0.0, min_throughput_rps: 30}}
profiles:
  cpu:
    description: this machine, embedded tritonserver
    scenarios: {{}}
"""


def host_cores() -> int:
    """The cores this process may run on (the affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _refuse_unless_empty(folder: Path) -> None:
    if folder.exists() and not folder.is_dir():
        raise UserInputError(f"{folder} is a file: tools init writes into a new or empty folder")
    existing = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    if existing:
        named = ", ".join(existing[:_LISTED])
        more = f" and {len(existing) - _LISTED} more" if len(existing) > _LISTED else ""
        raise UserInputError(
            f"{folder} is not empty (has {named}{more}): tools init writes only into a new or "
            f"empty folder, so nothing of yours is overwritten"
        )


def init_project(folder: Path) -> list[Path]:
    """Write the starter spec, SLO file and their schemas into ``folder`` (created if missing).

    Returns:
        The files written.

    Raises:
        UserInputError: ``folder`` is a file or not empty (its entries named); nothing written.
        ToolkitError: an installed schema is missing.
    """
    folder = Path(folder)
    _refuse_unless_empty(folder)
    schemas = {name: paths.project_file(paths.ROOT / name, "the JSON Schema tools init copies")
               for name in (REPOSITORY_SCHEMA, SLO_SCHEMA)}
    texts = {
        SPEC_FILE: SPEC_TEXT.format(schema=REPOSITORY_SCHEMA, cores=host_cores()),
        SLO_FILE: SLO_TEXT.format(schema=SLO_SCHEMA),
    }
    written = []
    for name, source in schemas.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, folder / name)
        written.append(folder / name)
    for name, text in texts.items():
        (folder / name).write_text(text, encoding="utf-8")
        written.append(folder / name)
    return written


@click.command("init", cls=ToolCommand)
@click.argument("folder", type=click.Path(path_type=Path))
def init(folder: Path) -> None:
    """Write a starter repository.yaml and slo.yaml into FOLDER (new or empty), ready for tools add.

    Beside them go schemas/repository.schema.json and schemas/slo.schema.json, copies of the
    installed schemas that the files' first lines point editors at. A folder that is not empty
    is refused (exit 2), naming what it holds.

    \b
    Then, in FOLDER:
      tools add hf-text-embedding ./my-model --name my_pipeline
      tools build-repo
      tools serve --background --pid-file server.pid
      tools infer my_pipeline --text "a first request"
      tools loadtest --url 127.0.0.1:8000 --grpc-url 127.0.0.1:8001 \\
          --scenario my_pipeline --slo-file slo.yaml
      tools serve --stop --pid-file server.pid
    """
    written = init_project(folder)
    click.echo("wrote " + ", ".join(str(p) for p in written))
    click.echo(f"next: cd {folder} && tools add RECIPE PATH --name NAME (see tools add --help)")
