"""The process layer (tools/process.py) on real child processes: groups, readiness, drain, kill.

Children are small Python or shell programs; every one is stopped at teardown.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tools import process


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen]]:
    """Popens a test starts; each one's group is stopped afterwards, whatever happened."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        process.stop(proc, grace_s=0.5)


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def _wait_for(path: Path, timeout_s: float = 20) -> str:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text().endswith("\n")):
        assert time.monotonic() < deadline, f"{path} was not written"
        time.sleep(0.05)
    return path.read_text()


def test_start_runs_the_command_in_its_own_group_with_its_environment_and_log(tmp_path, started):
    log = tmp_path / "logs" / "child.log"
    code = """
        import os, sys
        print(os.environ["GREETING"], os.getpgid(0) == os.getpid(), flush=True)
        print("err", file=sys.stderr)
    """

    proc = process.start(_python(code), env={**os.environ, "GREETING": "hello"}, log_path=log)
    started.append(proc)

    assert proc.wait(timeout=20) == 0
    assert log.read_text().split() == ["hello", "True", "err"]


def test_start_moves_an_earlier_run_s_log_aside_instead_of_truncating_it(tmp_path, started):
    log = tmp_path / "server.log"
    for run in range(1, 4):
        proc = process.start(_python(f"print('run {run}: Signal (11) received.')"), log_path=log)
        started.append(proc)
        assert proc.wait(timeout=20) == 0

    assert log.read_text() == "run 3: Signal (11) received.\n"
    assert process.previous_log(log).read_text() == "run 2: Signal (11) received.\n"
    assert process.previous_log(log, 2).read_text() == "run 1: Signal (11) received.\n"


def test_rotate_log_keeps_a_bounded_number_of_runs_and_skips_an_empty_log(tmp_path):
    log = tmp_path / "server.log"
    assert process.rotate_log(log) is None  # nothing there yet
    log.touch()
    assert process.rotate_log(log) is None and log.exists()  # nothing worth keeping
    for run in range(5):
        log.write_text(f"run {run}\n")
        assert process.rotate_log(log, keep=3) == process.previous_log(log)

    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == ["server.log.1", "server.log.2", "server.log.3"]
    assert [process.previous_log(log, g).read_text() for g in (1, 2, 3)] == [
        "run 4\n", "run 3\n", "run 2\n"]


def test_wait_ready_reports_ready_as_soon_as_the_callable_says_so(tmp_path, started):
    flag = tmp_path / "ready"
    proc = process.start(_python(f"""
        import pathlib, time
        pathlib.Path({str(flag)!r}).touch()
        time.sleep(30)
    """))
    started.append(proc)

    outcome = process.wait_ready(proc, flag.exists, timeout_s=20, interval_s=0.05)

    assert outcome is process.Readiness.READY
    assert proc.poll() is None


def test_wait_ready_reports_an_early_exit_without_waiting_for_the_timeout(started):
    proc = process.start(_python("raise SystemExit(3)"))
    started.append(proc)
    begin = time.monotonic()

    outcome = process.wait_ready(proc, lambda: False, timeout_s=60, interval_s=0.05)

    assert outcome is process.Readiness.EXITED
    assert proc.returncode == 3
    assert time.monotonic() - begin < 30


def test_wait_ready_times_out_when_the_child_never_becomes_ready(started):
    proc = process.start(["sleep", "30"])
    started.append(proc)

    outcome = process.wait_ready(proc, lambda: False, timeout_s=0.5, interval_s=0.05)

    assert outcome is process.Readiness.TIMED_OUT
    assert proc.poll() is None


def test_stop_lets_a_child_that_handles_sigterm_finish_its_work(tmp_path, started):
    ready, done = tmp_path / "ready", tmp_path / "done"
    proc = process.start(_python(f"""
        import pathlib, signal, sys, time
        def drain(*_):
            time.sleep(0.5)  # the in-flight work
            pathlib.Path({str(done)!r}).write_text("drained\\n")
            sys.exit(0)
        signal.signal(signal.SIGTERM, drain)
        pathlib.Path({str(ready)!r}).write_text("up\\n")
        time.sleep(60)
    """))
    started.append(proc)
    _wait_for(ready)

    survivors = process.stop(proc, grace_s=20)

    assert survivors == []
    assert proc.returncode == 0
    assert done.read_text() == "drained\n"


def test_stop_kills_a_child_that_ignores_sigterm_once_the_grace_period_is_over(tmp_path, started):
    ready = tmp_path / "ready"
    proc = process.start(_python(f"""
        import pathlib, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        pathlib.Path({str(ready)!r}).write_text("up\\n")
        time.sleep(60)
    """))
    started.append(proc)
    _wait_for(ready)
    begin = time.monotonic()

    survivors = process.stop(proc, grace_s=0.5)

    assert survivors == []
    assert proc.returncode == -signal.SIGKILL
    assert time.monotonic() - begin >= 0.5


def test_stop_kills_the_group_and_a_straggler_that_left_it_when_the_leader_exits_first(
    tmp_path, started
):
    pids = tmp_path / "pids"
    # The leader dies at SIGTERM at once; its children ignore SIGTERM, one of them in its own
    # session: only the snapshot taken before the signal still knows it after the leader is gone.
    proc = process.start(_python(f"""
        import pathlib, subprocess, sys, time
        ignore = "import signal as s, time; s.signal(s.SIGTERM, s.SIG_IGN); time.sleep(60)"
        inside = subprocess.Popen([sys.executable, "-c", ignore])
        outside = subprocess.Popen([sys.executable, "-c", ignore], start_new_session=True)
        pathlib.Path({str(pids)!r}).write_text(f"{{inside.pid}} {{outside.pid}}\\n")
        time.sleep(60)
    """))
    started.append(proc)
    inside, outside = (int(p) for p in _wait_for(pids).split())
    assert os.getpgid(inside) == proc.pid and os.getpgid(outside) != proc.pid

    survivors = process.stop(proc, grace_s=5)

    assert survivors == []
    assert [pid for pid in (proc.pid, inside, outside) if process.is_alive(pid)] == []


def test_stop_without_group_signals_only_the_child_and_kills_its_descendants(tmp_path, started):
    pids = tmp_path / "pids"
    proc = process.start(
        _python(f"""
            import pathlib, signal, subprocess, time
            child = subprocess.Popen(["sleep", "60"])
            pathlib.Path({str(pids)!r}).write_text(f"{{child.pid}}\\n")
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(60)
        """),
        new_session=False,
    )
    started.append(proc)
    (grandchild,) = (int(p) for p in _wait_for(pids).split())
    assert os.getpgid(proc.pid) == os.getpgid(0)  # shares the test's group

    survivors = process.stop(proc, grace_s=0.5, group=False)

    assert survivors == []
    assert not process.is_alive(proc.pid) and not process.is_alive(grandchild)
    assert process.is_alive(os.getpid())


def test_stop_also_stops_a_process_we_did_not_start_named_by_its_pid(tmp_path):
    # A grandchild in its own session stands for a server started by an earlier `tools serve`.
    out = subprocess.run(
        _python("""
            import subprocess
            quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
            sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True, **quiet)
            print(sleeper.pid)
        """),
        capture_output=True, text=True, timeout=20, check=True,
    )
    pid = int(out.stdout)
    try:
        survivors = process.stop(pid, grace_s=5)

        assert survivors == []
        assert not process.is_alive(pid)
    finally:
        process.kill(pid)


def test_stub_processes_names_the_model_instance_each_python_stub_serves(tmp_path, started):
    stub = f"/opt/backends/python/{process.STUB_NAME}"
    # argv as Triton gives it: stub, model.py, shm region, ..., instance name, "DEFAULT"
    fake = "exec -a {stub} {python} -c 'import time; time.sleep(60)' model.py shm 1 {name} DEFAULT"
    script = " & ".join(
        fake.format(stub=stub, python=sys.executable, name=name)
        for name in ("toy_a_0_0", "toy_b_0_0")
    )
    proc = process.start(["bash", "-c", f"{script} & sleep 60 & wait"])
    started.append(proc)
    deadline = time.monotonic() + 20
    # both stubs and the plain `sleep` (not a stub) must have been forked before we look
    while len(process.stub_processes(proc.pid)) < 2 or len(process.family(proc.pid)) < 3:
        assert time.monotonic() < deadline, process.family(proc.pid)
        time.sleep(0.05)

    stubs = process.stub_processes(proc.pid)

    assert sorted(stubs) == ["toy_a_0_0", "toy_b_0_0"]
    assert all(process.command_line(pid)[0] == stub for pid in stubs.values())
    assert set(stubs.values()) < {p.pid for p in process.family(proc.pid)}


def test_a_gone_process_has_no_command_line_and_is_not_alive(started):
    proc = process.start(["true"])
    started.append(proc)
    proc.wait(timeout=20)

    assert process.command_line(proc.pid) == []
    assert not process.is_alive(proc.pid)
    assert process.stub_processes(proc.pid) == {}


def test_kill_ends_the_whole_group_at_once(tmp_path, started):
    proc = process.start(["bash", "-c", "sleep 60 & sleep 60 & wait"])
    started.append(proc)
    deadline = time.monotonic() + 20
    while len(process.group_members(proc.pid)) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    members = process.group_members(proc.pid)

    process.kill(proc.pid)

    assert proc.wait(timeout=20) == -signal.SIGKILL
    _, alive = psutil.wait_procs(members, timeout=5)
    assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []


def test_a_load_run_counts_the_front_with_its_children_and_no_one_else_s_front(tmp_path, started):
    """``overload.roles`` (the bench's tail and the overload runs count CPU by it): the front of
    the server is found by its module and ``--watch-pid``, and the processes it started (HAProxy)
    count as the front too."""
    from tools.serve.overload import roles

    server = process.start(_python("import time; time.sleep(60)"))
    started.append(server)
    spawn_haproxy = """
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open(sys.argv[-1], "w").write(f"{child.pid}\\n")
        time.sleep(60)
    """
    front = process.start([*_python(spawn_haproxy), "tools.front", "--watch-pid",
                           str(server.pid), str(tmp_path / "front")])
    other = process.start([*_python(spawn_haproxy), "tools.front", "--watch-pid", "1",
                           str(tmp_path / "other")])
    started += [front, other]
    haproxy = int(_wait_for(tmp_path / "front"))
    _wait_for(tmp_path / "other")

    found = roles(server.pid, [])
    assert sorted(found["front"]) == sorted([front.pid, haproxy]), "not the other server's front"
    assert found["tritonserver"] == [server.pid] and found["load generator"] == [os.getpid()]
