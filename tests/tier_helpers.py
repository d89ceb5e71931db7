"""The fast tier: which tests are in it, and a guard that keeps them honest.

A test is ``fast`` unless it carries a heavy marker or asks for a heavy fixture; nobody lists fast
tests by hand. While a fast test runs, the guard records every process it starts (an audit hook on
``subprocess.Popen``, ``os.posix_spawn`` and ``os.system``) and every use of torch (a torch module made
or called, an ONNX export, or the test's own code naming torch; torch is imported once up front,
so importing a module that imports torch is not use). A fast test that starts
the real tritonserver, Locust, a server/load/export ``tools`` command or uses torch fails, naming
what it did and the marker it needs. A ``tools build-repo``/``add`` child that stops before any
export (a refusal) is allowed where the test says why with ``light_subprocess("reason")``.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

FAST = "fast"
LIGHT_SUBPROCESS = "light_subprocess"
HEAVY_MARKERS = frozenset({"torch", "server", "load", "gpu", "reliability", "install"})
# Fixtures of tests/conftest.py that export models or start servers.
HEAVY_FIXTURES = frozenset({"built_repository", "triton_server", "server_factory"})
# ``tools`` subcommands that start a server, a load or an export ("--help", "--check" and
# "--stop" runs are light and allowed); the ones that export only when they get that far.
HEAVY_COMMANDS = frozenset({"serve", "loadtest", "bench", "tune", "build-repo", "add"})
EXPORTING_COMMANDS = frozenset({"build-repo", "add"})
LIGHT_FLAGS = frozenset({"--help", "-h", "--check", "--stop"})


def is_fast(markers: set[str], fixtures: Sequence[str]) -> bool:
    """A test is fast when it carries no heavy marker and uses no heavy fixture."""
    return not (markers & HEAVY_MARKERS) and not (set(fixtures) & HEAVY_FIXTURES)


def names_torch(function: Callable) -> bool:
    """Whether the code of ``function`` (or of a function defined in it) names ``torch``."""
    code = getattr(function, "__code__", None)
    stack = [code] if code is not None else []
    while stack:
        code = stack.pop()
        if "torch" in code.co_names or "torch" in code.co_varnames:
            return True
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return False


def heavy_command(argv: Sequence[str], tritonserver: Path | None,
                  light_subprocess: bool = False) -> str | None:
    """Why starting ``argv`` does not belong in the fast tier, or ``None`` when it does.

    Args:
        argv: The command line as started.
        tritonserver: The real tritonserver binary (stand-ins written by tests are fine).
        light_subprocess: The test declared that its ``build-repo``/``add`` runs stop before
            any export.
    """
    words = [str(w) for w in argv]
    if not words:
        return None
    light = bool(LIGHT_FLAGS & set(words))
    program = Path(words[0])
    if program.name == "tritonserver" and not light:
        try:
            real = tritonserver is not None and program.resolve() == tritonserver.resolve()
        except OSError:
            real = False
        if real:
            return "starts the real tritonserver (marker: server)"
    if any(Path(w).name == "locust" for w in words) or "locust" in _modules_run(words):
        return "runs Locust (marker: load)"
    command = _tools_subcommand(words)
    if light_subprocess and command in EXPORTING_COMMANDS:
        return None
    if command in HEAVY_COMMANDS and not light:
        return f"runs `tools {command}` in a subprocess (marker: server, load or torch)"
    return None


def _modules_run(words: list[str]) -> list[str]:
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w == "-m"]


def _tools_subcommand(words: list[str]) -> str | None:
    for i, word in enumerate(words[:-1]):
        if Path(word).name == "tools" or (word in ("tools", "tools.cli") and words[i - 1] == "-m"):
            return next((w for w in words[i + 1:] if not w.startswith("-")), None)
    return None


class TierGuard:
    """Records what a fast test started and whether it used torch; installed once per session."""

    def __init__(self, tritonserver: Path | None) -> None:
        # torch is imported once, up front, so its tripwires are in place for every fast test;
        # else which test first imports a module that imports torch would decide the verdict
        # (importing is not using: making, calling or exporting a module is).
        with contextlib.suppress(ImportError):
            import torch  # noqa: F401
        self._tritonserver = tritonserver
        self._findings: list[str] | None = None  # None: not watching
        self._light_subprocess = False
        sys.addaudithook(self._audit)

    def _audit(self, event: str, args: tuple) -> None:
        if self._findings is None:
            return
        if event == "subprocess.Popen":
            argv = args[1]
        elif event == "os.posix_spawn":
            argv = args[1]
        elif event == "os.system":
            argv = shlex.split(os.fsdecode(args[0]))
        else:
            return
        if isinstance(argv, (str, bytes)):
            argv = [os.fsdecode(argv)]
        reason = heavy_command([os.fsdecode(a) if isinstance(a, bytes) else a for a in argv],
                               self._tritonserver, self._light_subprocess)
        if reason:
            self._findings.append(f"{reason}: {' '.join(map(str, argv))[:300]}")

    @contextmanager
    def watching(self, light_subprocess: bool = False) -> Iterator[list[str]]:
        """Watch the code inside; yields the list of findings, filled when the block ends.

        Args:
            light_subprocess: Allow ``tools build-repo``/``add`` children (see the module).
        """
        had_torch = "torch" in sys.modules
        findings: list[str] = []
        self._findings = findings
        self._light_subprocess = light_subprocess
        undo = _trip_torch(findings) if had_torch else (lambda: None)
        try:
            yield findings
        finally:
            self._findings = None
            undo()


def _trip_torch(findings: list[str]) -> Callable[[], None]:
    """Wrap what every model, forward pass and export goes through; return the undo."""
    import torch

    originals = {(torch.nn.Module, "__init__"): torch.nn.Module.__init__,
                 (torch.nn.Module, "__call__"): torch.nn.Module.__call__,
                 (torch.onnx, "export"): torch.onnx.export}

    def tripwire(name, original):
        def wrapper(*args, **kwargs):
            findings.append(f"calls {name} (marker: torch)")
            return original(*args, **kwargs)
        return wrapper

    for (owner, attr), original in originals.items():
        setattr(owner, attr, tripwire(f"torch {owner.__name__}.{attr}", original))

    def undo() -> None:
        for (owner, attr), original in originals.items():
            setattr(owner, attr, original)

    return undo
