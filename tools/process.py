"""Start, wait for and stop the child processes this project runs (tritonserver, Locust, servers).

One layer over psutil: own process groups, readiness, drain-then-kill, Python-backend stubs.
"""

from __future__ import annotations

import enum
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

STUB_NAME = "triton_python_backend_stub"  # the Python backend's per-instance executable
SHM_PREFIX = "triton_python_backend_shm_region_"
SHM_DIR = Path("/dev/shm")
KILL_WAIT_S = 5.0  # how long SIGKILLed processes get to disappear
LOG_GENERATIONS = 5  # earlier runs' logs kept beside a log that is started anew


class Readiness(enum.Enum):
    """How waiting for a started process ended."""

    READY = "ready"
    EXITED = "exited"
    TIMED_OUT = "timed out"


def start(
    command: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    log_path: Path | None = None,
    append: bool = False,
    new_session: bool = True,
    **popen: Any,
) -> subprocess.Popen:
    """Start ``command``, by default leading a new session (and so its own process group).

    Args:
        command: The argv.
        env: The child's whole environment; defaults to this process's.
        log_path: File (created, parents too) that takes the child's stdout and stderr. A
            log that already holds output is never truncated: it is moved aside first
            (``rotate_log``), so the end of a previous run (e.g. why a server crashed) stays
            readable in ``previous_log(log_path)``.
        append: Add to ``log_path`` rather than start it anew (a helper sharing a server's log).
        new_session: False keeps the child in this process's group (a supervisor that must
            pass signals through); ``stop`` then signals the child and its descendants only.
        **popen: More ``subprocess.Popen`` arguments (``stdout``, ``stderr``, ``text``, ...).

    Returns:
        The running child.

    Raises:
        OSError: the command cannot be executed.
    """
    popen.setdefault("stdin", subprocess.DEVNULL)
    kwargs = {"env": dict(env) if env is not None else None, "start_new_session": new_session}
    if log_path is None:
        return subprocess.Popen(list(command), **kwargs, **popen)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if not append:
        rotate_log(log_path)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(command), stdout=log, stderr=subprocess.STDOUT, **kwargs, **popen
        )


def previous_log(log_path: Path, generation: int = 1) -> Path:
    """Where ``rotate_log`` keeps the log of the run ``generation`` runs before the current one
    (``server.log`` -> ``server.log.1``, ``server.log.2``, ...)."""
    return log_path.with_name(f"{log_path.name}.{generation}")


def rotate_log(log_path: Path, keep: int = LOG_GENERATIONS) -> Path | None:
    """Move a log that holds output aside (``previous_log``), shifting older ones by one and
    dropping what is beyond ``keep``; returns where it went, or None when there was nothing to
    keep (no file, or an empty one)."""
    try:
        if log_path.stat().st_size == 0:
            return None
    except FileNotFoundError:
        return None
    previous_log(log_path, keep).unlink(missing_ok=True)
    for generation in range(keep - 1, 0, -1):
        older = previous_log(log_path, generation)
        if older.exists():
            older.replace(previous_log(log_path, generation + 1))
    kept = previous_log(log_path)
    log_path.replace(kept)
    return kept


def wait_ready(
    proc: subprocess.Popen,
    ready: Callable[[], bool],
    timeout_s: float,
    *,
    interval_s: float = 0.2,
) -> Readiness:
    """Poll ``ready()`` until it is true, the child exits, or ``timeout_s`` passes.

    The exit is checked before each poll, so a child that dies while starting is reported as
    ``EXITED`` at once rather than after the timeout.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            return Readiness.EXITED
        if ready():
            return Readiness.READY
        if time.monotonic() > deadline:
            return Readiness.TIMED_OUT
        time.sleep(interval_s)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def is_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        return _alive(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return False


def command_line(pid: int) -> list[str]:
    """The argv of a process (empty when it is gone, a zombie, or not readable)."""
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of process group ``pgid``."""
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and _alive(proc):
                members.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def descendants(pid: int) -> list[psutil.Process]:
    """Live children of ``pid``, recursively (empty when ``pid`` is gone)."""
    try:
        return [p for p in psutil.Process(pid).children(recursive=True) if _alive(p)]
    except psutil.NoSuchProcess:
        return []


def family(pid: int) -> list[psutil.Process]:
    """The process group ``pid`` leads plus every descendant of ``pid``, even one that left the
    group (``setsid``); ``pid`` itself excluded."""
    found = {p.pid: p for p in group_members(pid)}
    found.update((p.pid, p) for p in descendants(pid))
    found.pop(pid, None)
    return list(found.values())


def _stub_argvs(pid: int) -> dict[int, list[str]]:
    """pid -> argv of each Python-backend stub in the family of ``pid``, oldest first.

    A stub's argv: stub, model.py, shm region, shm sizes, parent pid, ..., instance, "DEFAULT".
    """
    found = []
    for proc in family(pid):
        argv = command_line(proc.pid)
        if argv and argv[0].endswith(STUB_NAME) and len(argv) >= 3:
            try:
                started = proc.create_time()
            except psutil.Error:
                continue
            found.append((started, proc.pid, argv))
    return {stub: argv for _, stub, argv in sorted(found)}


def stub_processes(pid: int) -> dict[str, int]:
    """Python-backend stubs in the family of ``pid``: model instance name -> pid (the newest
    stub of that name, when an older one is still running: ``stale_stubs``).

    Args:
        pid: A tritonserver, or a process whose group or descendants hold one.
    """
    return {argv[-2]: stub for stub, argv in _stub_argvs(pid).items()}


def stale_stubs(pid: int) -> dict[int, str]:
    """Stubs that a newer stub of the same model instance has replaced: pid -> instance name.

    Triton 2.51 reloads a model by starting new instances and unloading the old ones once their
    requests are done; when one stub of a model with several instances was killed under traffic,
    the old model is never unloaded and its surviving stubs run on beside the new ones, each
    holding its memory (an encoder's: 200-450 MB).
    """
    stubs = _stub_argvs(pid)  # one look at the processes, oldest first
    newest = {argv[-2]: stub for stub, argv in stubs.items()}
    return {stub: argv[-2] for stub, argv in stubs.items() if newest[argv[-2]] != stub}


def stub_shm_regions(pid: int) -> set[str]:
    """The shared-memory regions (names in /dev/shm) of the Python-backend stubs of ``pid``."""
    return {argv[2] for argv in _stub_argvs(pid).values() if argv[2].startswith(SHM_PREFIX)}


def remove_shm_regions(names: Iterable[str]) -> list[str]:
    """Unlink the named Python-backend regions still in /dev/shm; returns those removed.

    Triton unlinks a region when it unloads the model instance; one whose stub or server was
    killed stays behind, holding memory until the machine restarts.
    """
    removed = []
    for name in sorted(names):
        if not name.startswith(SHM_PREFIX) or "/" in name:
            continue
        try:
            (SHM_DIR / name).unlink()
            removed.append(name)
        except FileNotFoundError:
            pass
    return removed


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except (ProcessLookupError, PermissionError):
        return False


def _signal(pid: int, sig: int, *, group: bool) -> None:
    try:
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait(target: subprocess.Popen | psutil.Process | None, timeout_s: float) -> None:
    """Wait up to ``timeout_s`` for the leader to exit, reaping it when it is our child."""
    try:
        if target is not None:
            target.wait(timeout=timeout_s)
    except (subprocess.TimeoutExpired, psutil.TimeoutExpired, psutil.NoSuchProcess):
        pass


def stop(
    target: subprocess.Popen | int,
    grace_s: float,
    *,
    group: bool = True,
    first_signal: tuple[int, float] | None = None,
    kill_wait_s: float = KILL_WAIT_S,
) -> list[int]:
    """Drain, then kill: SIGTERM, ``grace_s`` for the leader to exit, SIGKILL for what is left.

    Every process of the leader's group and every descendant of the leader (also one that left
    the group) is remembered before the first signal and again before SIGKILL, so stragglers
    reparented to init when the leader exits are still found and killed.

    Args:
        target: The leader: our child, or the pid of a process we did not start (a pid file).
        grace_s: How long the leader gets to exit after SIGTERM.
        group: Signal the leader's whole process group (when it leads one); False signals the
            leader alone and SIGKILLs its descendants (a child sharing our group).
        first_signal: ``(signal, wait_s)`` sent before SIGTERM, e.g. SIGUSR1 for a stack dump.
        kill_wait_s: How long SIGKILLed processes get to disappear.

    Returns:
        Pids that survived SIGKILL (empty when everything is gone).
    """
    pid = target.pid if isinstance(target, subprocess.Popen) else int(target)
    leader: psutil.Process | None = None
    if isinstance(target, subprocess.Popen) and target.poll() is not None:
        # reaped: the pid may name another process now, but not while its group has members
        group = group and bool(group_members(pid))
    else:
        try:
            leader = psutil.Process(pid)
        except psutil.NoSuchProcess:
            pass
        group = group and _leads_group(pid)
    waited = target if isinstance(target, subprocess.Popen) else leader

    def relatives() -> dict[int, psutil.Process]:
        found = {p.pid: p for p in group_members(pid)} if group else {}
        try:  # the leader object, not its pid: once it is gone, the pid may be reused
            children = leader.children(recursive=True) if leader is not None else []
        except psutil.NoSuchProcess:
            children = []
        found.update((p.pid, p) for p in children if _alive(p))
        return found

    known = relatives()
    for sig, wait_s in [*([first_signal] if first_signal else []), (signal.SIGTERM, grace_s)]:
        if group or (leader is not None and _alive(leader)):
            _signal(pid, sig, group=group)
        _wait(waited, wait_s)
    known.update(relatives())

    if group:
        _signal(pid, signal.SIGKILL, group=True)
    remaining = [p for p in [*known.values(), *([leader] if leader else [])] if _alive(p)]
    for proc in remaining:
        try:
            proc.kill()  # psutil checks that the pid still names the same process
        except psutil.NoSuchProcess:
            pass
    _wait(waited, kill_wait_s)
    _, alive = psutil.wait_procs(remaining, timeout=kill_wait_s)
    return sorted(p.pid for p in alive if _alive(p))


def kill(pgid: int) -> None:
    """SIGKILL process group ``pgid`` at once, without waiting (a last-resort finalizer)."""
    _signal(pgid, signal.SIGKILL, group=True)


def kill_one(pid: int) -> None:
    """SIGKILL the one process ``pid`` (not its group), without waiting; gone: nothing."""
    _signal(pid, signal.SIGKILL, group=False)
