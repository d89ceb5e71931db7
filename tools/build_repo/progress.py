"""Progress of `tools build-repo`: one line per model showing its current stage, then a summary.

With ``enabled=False`` nothing is drawn while building; the summary table is printed either way.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

if TYPE_CHECKING:
    from tools.build_repo.results import BuildResult



STATUS_COLOURS = {"built": "green", "repackaged": "cyan", "skipped": "dim", "failed": "red"}


class BuildProgress:
    """Live display per model and stage; ``summary`` prints the final table."""

    def __init__(self, enabled: bool = True, console: Console | None = None) -> None:
        if console is None:
            console = Console(stderr=True)
            if not console.is_terminal:
                console = Console(stderr=True, width=140)  # logs and CI: do not wrap the table
        self.console = console
        self.enabled = enabled
        self._progress: Progress | None = None
        self._tasks: dict[str, int] = {}
        self._started: dict[str, float] = {}

    def __enter__(self) -> BuildProgress:
        if self.enabled:
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("[bold]{task.fields[model]:<22}"),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=False,
            )
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def start_model(self, model: str) -> None:
        """A model starts building."""
        self._started[model] = time.perf_counter()
        if self._progress is not None:
            self._tasks[model] = self._progress.add_task("starting", total=None, model=model)

    def stage(self, model: str, stage: str, done: list[str]) -> None:
        """``stage`` of ``model`` begins; ``done`` are the finished stages with their times."""
        if self._progress is not None and model in self._tasks:
            trail = escape(" ".join(done))
            self._progress.update(self._tasks[model], description=f"{trail} [cyan]{escape(stage)}…")

    def finish_model(self, model: str, status: str, detail: str) -> None:
        """A model is built, skipped or failed."""
        if self._progress is not None:
            if model not in self._tasks:
                self._tasks[model] = self._progress.add_task("", total=1, model=model)
            colour = STATUS_COLOURS.get(str(status), "white")
            # Notes carry paths, pip hints ('triton-forge[gpu]') and error text: never markup.
            self._progress.update(
                self._tasks[model], description=f"[{colour}]{status}[/] {escape(detail)}", total=1,
                completed=1,
            )

    def summary(self, result: BuildResult) -> None:
        """Print the summary table: status, time per stage, parity and notes per model."""
        table = Table(title=escape(f"build-repo: {result.output} ({result.target})"),
                      title_justify="left")
        for column in ("model", "status", "seconds", "stages", "parity max abs", "note"):
            table.add_column(column, overflow="fold")
        for m in result.models:
            stages = " ".join(f"{k} {v:.1f}s" for k, v in m.timings.items())
            parity = " ".join(f"{rt} {v:.1e}" for rt, v in m.parity_max_abs.items())
            colour = STATUS_COLOURS.get(str(m.status), "white")
            table.add_row(
                escape(m.name), f"[{colour}]{m.status}[/]", f"{m.seconds:.1f}", escape(stages),
                parity, escape(m.note),
            )
        self.console.print(table)
        from tools.build_repo.quality import print_quality  # numpy: only once there is a report

        print_quality(self.console, [m.quality for m in result.models if m.quality is not None])
        self.console.print(f"total {result.seconds:.1f}s")
