"""The test tiers: which tests are in which, and a guard that keeps them honest.

Three tiers split the suite, and nobody lists their tests by hand. A test is ``system`` when it
says so (a marker: the wheel install, the README's whole path, soaks, tune budgets, pods),
``fast`` unless it carries a heavy marker or asks for a heavy fixture, and ``integration``
otherwise. While a fast test runs, the guard records every process it starts (an audit hook on
``subprocess.Popen``, ``os.posix_spawn`` and ``os.system``) and every use of torch (a torch module
made or called, an ONNX export, or the test's own code naming torch; torch is imported once up
front, so importing a module that imports torch is not use). A fast test that starts the real
tritonserver, Locust, a server/load/export ``tools`` command or uses torch fails, naming what it
did and the marker it needs. A ``tools build-repo``/``add`` child that stops before any export (a
refusal) is allowed where the test says why with ``light_subprocess("reason")``. An integration
test that installs packages, makes a virtual environment, plays containers, runs a soak or a tune
budget over a minute fails the same way, naming the ``system`` marker.
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

FAST, INTEGRATION, SYSTEM = "fast", "integration", "system"
TIERS = (FAST, INTEGRATION, SYSTEM)
LIGHT_SUBPROCESS = "light_subprocess"
HEAVY_MARKERS = frozenset({"torch", "server", "load", "gpu", "reliability", "install"})
# Markers that put a test in the system tier (``install``: the wheel in a fresh venv).
SYSTEM_MARKERS = frozenset({SYSTEM, "install"})
# The longest ``tools tune --budget-minutes`` an integration test may run (one short trial).
INTEGRATION_TUNE_MINUTES = 1.0
# Fixtures of tests/conftest.py that export models or start servers.
HEAVY_FIXTURES = frozenset({"built_repository", "triton_server", "server_factory", "toy_server",
                            "added_models"})
# ``tools`` subcommands that start a server, a load or an export ("--help", "--check" and
# "--stop" runs are light and allowed); the ones that export only when they get that far.
HEAVY_COMMANDS = frozenset({"serve", "loadtest", "bench", "tune", "build-repo", "add"})
EXPORTING_COMMANDS = frozenset({"build-repo", "add"})
LIGHT_FLAGS = frozenset({"--help", "-h", "--check", "--stop"})


def is_fast(markers: set[str], fixtures: Sequence[str]) -> bool:
    """A test is fast when it carries no heavy marker and uses no heavy fixture."""
    return not (markers & HEAVY_MARKERS) and not (set(fixtures) & HEAVY_FIXTURES)


def tier_of(markers: set[str], fixtures: Sequence[str]) -> str:
    """The tier of a test: ``system`` when marked so, else ``fast`` or ``integration``."""
    if markers & SYSTEM_MARKERS:
        return SYSTEM
    return FAST if is_fast(markers, fixtures) else INTEGRATION


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


def system_command(argv: Sequence[str]) -> str | None:
    """Why starting ``argv`` belongs in the system tier, or ``None`` when an integration test
    may start it."""
    words = [str(w) for w in argv]
    if not words or LIGHT_FLAGS & set(words):
        return None
    program, modules = Path(words[0]).name, _modules_run(words)
    if (program.startswith("pip") or "pip" in modules) and "install" in words:
        return "installs packages with pip (marker: system)"
    if "venv" in modules or program == "virtualenv":
        return "makes a virtual environment (marker: system)"
    if program == "podman" and {"play", "run", "build", "import"} & set(words[1:3]):
        return "runs containers with podman (marker: system)"
    if any(Path(w).name == "chaos_soak.py" for w in words):
        return "runs the chaos soak (marker: system)"
    if _tools_subcommand(words) == "tune" and "--budget-minutes" in words[:-1]:
        budget = words[words.index("--budget-minutes") + 1]
        with contextlib.suppress(ValueError):
            if float(budget) > INTEGRATION_TUNE_MINUTES:
                return (f"runs `tools tune` with a {budget}-minute budget, over the "
                        f"{INTEGRATION_TUNE_MINUTES:g} an integration test may spend (marker: system)")
    return None


def _modules_run(words: list[str]) -> list[str]:
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w == "-m"]


def _tools_subcommand(words: list[str]) -> str | None:
    for i, word in enumerate(words[:-1]):
        if Path(word).name == "tools" or (word in ("tools", "tools.cli") and words[i - 1] == "-m"):
            return next((w for w in words[i + 1:] if not w.startswith("-")), None)
    return None


class TierGuard:
    """Records what a fast test started and whether it used torch, and what an integration test
    started; installed once per session."""

    def __init__(self, tritonserver: Path | None) -> None:
        # torch is imported once, up front, so its tripwires are in place for every fast test;
        # else which test first imports a module that imports torch would decide the verdict
        # (importing is not using: making, calling or exporting a module is).
        with contextlib.suppress(ImportError):
            import torch  # noqa: F401
        self._tritonserver = tritonserver
        self._findings: list[str] | None = None  # None: not watching
        self._tier = FAST
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
        argv = [os.fsdecode(a) if isinstance(a, bytes) else a for a in argv]
        if self._tier == FAST:
            reason = heavy_command(argv, self._tritonserver, self._light_subprocess)
        else:
            reason = system_command(argv)
        if reason:
            self._findings.append(f"{reason}: {' '.join(map(str, argv))[:300]}")

    @contextmanager
    def watching(self, tier: str = FAST, light_subprocess: bool = False) -> Iterator[list[str]]:
        """Watch the code inside; yields the list of findings, filled when the block ends.

        Args:
            tier: The tier of the test: ``fast`` (no server, load or torch) or ``integration``
                (nothing of the system tier).
            light_subprocess: Allow ``tools build-repo``/``add`` children (see the module).
        """
        had_torch = "torch" in sys.modules
        findings: list[str] = []
        self._findings = findings
        self._tier = tier
        self._light_subprocess = light_subprocess
        undo = _trip_torch(findings) if had_torch and tier == FAST else (lambda: None)
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
