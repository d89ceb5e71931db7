"""Shared fixtures: real tritonservers on free loopback ports, the built repository, GPU skips.

A failing test that used a server gets the tail of that server's log in its report. Every test
is marked with its tier (tests/tier_helpers.py): ``system`` when it says so, ``fast`` without a
heavy marker or fixture (it fails if it starts a real server, Locust or torch), ``integration``
otherwise (it fails if it does what the system tier is for). With ``FORGE_TEST_DURATIONS`` set to
a file, each test's seconds (setup, call and teardown) are appended to it, slowest first.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import shutil
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from tier_helpers import FAST, INTEGRATION, LIGHT_SUBPROCESS, TIERS, TierGuard, names_torch, tier_of
from tools.errors import ServerError
from tools.serve.server import EmbeddedServer, resolve_binary
from waits import STARTED_FILE_ENV

REPO_ROOT = Path(__file__).resolve().parents[1]
TOY_REPOSITORY = Path(__file__).parent / "fixtures" / "toy_repository"
_LOG_TAIL_LINES = 150
T = TypeVar("T")


class ServerFactory:
    """Starts ``EmbeddedServer``s on free ports for one test and stops them all afterwards."""

    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir
        self.servers: list[EmbeddedServer] = []

    def __call__(self, repository: Path, *, timeout_s: float = 120, **kwargs) -> EmbeddedServer:
        """Start a server on ``repository`` (free ports unless given) and return it ready.

        Keyword arguments go to ``EmbeddedServer``; a start that fails still leaves its log for
        the report.
        """
        kwargs.setdefault("log_path", self._log_dir / f"tritonserver-{len(self.servers)}.log")
        kwargs.setdefault("exit_timeout_s", 10)
        server = EmbeddedServer(Path(repository), **kwargs)
        self.servers.append(server)
        return server.start(timeout_s=timeout_s)

    def stop_all(self) -> None:
        """Stop every server this factory started."""
        for server in self.servers:
            server.stop()


def _servers_of(item: pytest.Item) -> list[EmbeddedServer]:
    servers = []
    for value in getattr(item, "funcargs", {}).values():
        if isinstance(value, EmbeddedServer):
            servers.append(value)
        elif isinstance(value, ServerFactory):
            servers.extend(value.servers)
    return servers


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Fail a fast test the tier guard caught, record each phase's outcome on the item and attach
    server logs to a failure report."""
    outcome = yield
    report = outcome.get_result()
    findings = item.stash.get(_FINDINGS, [])
    if report.when == "call" and item.get_closest_marker(FAST) is not None \
            and names_torch(getattr(item, "function", None)):
        findings.append("its code names torch (marker: torch)")
    if findings and report.when in ("setup", "call") and report.passed:
        tier = FAST if item.get_closest_marker(FAST) is not None else INTEGRATION
        report.outcome = "failed"
        report.longrepr = (f"a{'n' if tier == INTEGRATION else ''} {tier} test must not do this "
                           "(give it the marker named):\n  " + "\n  ".join(dict.fromkeys(findings)))
    setattr(item, f"rep_{report.when}", report)
    if report.failed and report.when in ("setup", "call"):
        for server in _servers_of(item):
            path = server.log_path
            if not path.exists():
                continue
            tail = path.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
            report.sections.append((f"tritonserver log {path} (last lines)", "\n".join(tail)))


def _real_tritonserver() -> Path | None:
    try:
        return resolve_binary()
    except Exception:  # noqa: BLE001 - no binary here: nothing can start it by mistake either
        return None


_TIER_GUARD = TierGuard(_real_tritonserver())
_FINDINGS = pytest.StashKey[list]()


def _watched(item: pytest.Item):
    """Run one phase of ``item`` under the tier guard unless it is a system test; keep what it
    found."""
    tier = next((t for t in (FAST, INTEGRATION) if item.get_closest_marker(t) is not None), None)
    if tier is None:
        yield
        return
    light = item.get_closest_marker(LIGHT_SUBPROCESS)
    with _TIER_GUARD.watching(tier, light_subprocess=light is not None) as findings:
        yield
    if light is not None and not (light.args or light.kwargs.get("reason")):
        findings.append(f"{LIGHT_SUBPROCESS} without the reason its child stops before any export")
    item.stash.setdefault(_FINDINGS, []).extend(findings)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    """Fixtures of a fast or integration test (module and session ones too) run under the tier
    guard."""
    yield from _watched(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A fast or integration test's body runs under the tier guard."""
    yield from _watched(item)


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Callable[..., EmbeddedServer]]:
    """Call with a repository path to get a started server; all are stopped at teardown."""
    factory = ServerFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture(scope="session")
def toy_repository() -> Path:
    """The hand-written Python-backend repository (toy_double, toy_text, toy_classify)."""
    return TOY_REPOSITORY


@pytest.fixture(scope="session")
def toy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """One embedded tritonserver on the toy repository for the session, for tests that only
    read from it (answers, probes, metrics, loads); a test that kills, stops or restarts a
    server, or needs ``toy_started``, starts its own with ``server_factory``."""
    log_path = tmp_path_factory.mktemp("toy-server") / "tritonserver.log"
    with EmbeddedServer(TOY_REPOSITORY, log_path=log_path, exit_timeout_s=5) as server:
        yield server


@pytest.fixture
def toy_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file toy_double appends a line to per request it starts executing, in servers
    started after this fixture (tests/waits.py ``in_flight``)."""
    path = tmp_path / "toy-double-started"
    monkeypatch.setenv(STARTED_FILE_ENV, str(path))
    return path


SHARED_ENV = "FORGE_TEST_SHARED"  # a folder the runs of one `scripts/test.sh` share


def _shared_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where session builds are kept for every pytest process of one run: ``FORGE_TEST_SHARED``
    (scripts/test.sh sets it for all its tiers), else the folder pytest-xdist's workers share,
    else this session's own temporary folder."""
    if os.environ.get(SHARED_ENV):
        return Path(os.environ[SHARED_ENV])
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], T]) -> T:
    """``build(folder)`` run once per run however many pytest processes ask (a file lock; the
    others wait), its result pickled beside it for them."""
    from filelock import FileLock

    root = _shared_folder(tmp_path_factory)
    folder, done = root / name, root / f"{name}.pickle"
    with FileLock(str(root / f"{name}.lock")):
        if done.is_file():
            return pickle.loads(done.read_bytes())
        shutil.rmtree(folder, ignore_errors=True)  # a build that failed half-way
        folder.mkdir(parents=True)
        value = build(folder)
        done.write_bytes(pickle.dumps(value))
        return value


@pytest.fixture(scope="session")
def built_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's spec (repository.yaml) built for the CPU target, once per run."""
    def build(folder: Path) -> Path:
        from tools.build_repo.pipeline import build_repository  # heavy (torch): only when needed

        build_repository(spec_path=REPO_ROOT / "repository.yaml", output=folder / "model_repository",
                         target="cpu", progress=False)
        return folder / "model_repository"

    return _built_once(tmp_path_factory, "built", build)


@pytest.fixture(scope="session")
def added_models(tmp_path_factory: pytest.TempPathFactory):
    """One spec with a model of every ``tools add`` recipe, built once per run and served by one
    tritonserver per pytest process (tests/add_helpers.py ``added_models`` lists them)."""
    from tests.add_helpers import added_models as build, importable  # heavy (torch): only when needed

    added = _built_once(tmp_path_factory, "added", build)
    importable(added.root)
    factory = ServerFactory(tmp_path_factory.mktemp("added-server"))
    try:
        try:
            added.server = factory(added.repository, timeout_s=600)
        except ServerError as exc:
            # Triton 2.51's Python backend can abort while ~50 stubs start on busy shared cores
            # (boost::interprocess::lock_exception; triton-inference-server/server#8882): once
            # more, said in the warnings summary.
            if "lock_exception" not in str(exc):
                raise
            warnings.warn(f"the added models' server started again after: {exc}", stacklevel=1)
            added.server = factory(added.repository, timeout_s=600)
        yield added
    finally:
        factory.stop_all()


@pytest.fixture(scope="session")
def _session_triton_server(
    built_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EmbeddedServer]:
    log_path = tmp_path_factory.mktemp("triton-log") / "tritonserver.log"
    server = EmbeddedServer(built_repository, log_path=log_path, exit_timeout_s=10)
    server.start(timeout_s=300)
    try:
        yield server
    finally:
        code = server.poll()
        if code is not None:  # died during the last test that used it
            _record_death(server, code, "the end of the session")
        server.stop()


_SERVER_DEATHS: list[str] = []  # what the terminal summary says of each session-server death
_LAST_USER: list[str | None] = [None]  # the last test that used the session's server
_CRASH_LINES = 30  # the crash's own lines kept: "Signal (N) received." and its stack frames


def _crash_of(log: str) -> str:
    """The end of a dead server's log from its last ``Signal (`` line (else its last lines)."""
    lines = log.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Signal (")]
    start = starts[-1] if starts else max(0, len(lines) - 10)
    return "\n".join(lines[start:start + _CRASH_LINES])


@pytest.fixture
def triton_server(_session_triton_server: EmbeddedServer,
                  request: pytest.FixtureRequest) -> Iterator[EmbeddedServer]:
    """An embedded tritonserver on the built repository, on free ports, shared by the session.

    A server that died during an earlier test (CI once saw tritonserver 2.51 crash in the
    Python backend under 60 users; the 79 tests after it failed on a refused connection) is
    started again on the same ports, its log rotated (``tritonserver.log.1`` keeps the crash):
    the test it died in fails, the others run, and the end of the run names the test and
    shows the crash's stack (the part of a CI log that is printed).
    """
    server = _session_triton_server
    code = server.poll()
    if code is not None:
        _record_death(server, code, f"started again for {request.node.nodeid}")
        server.stop()
        server.start(timeout_s=300)
    _LAST_USER[0] = request.node.nodeid
    yield server


def _record_death(server: EmbeddedServer, code: int, then: str) -> None:
    log = server.log_path.read_text(errors="replace") if server.log_path.exists() else ""
    _SERVER_DEATHS.append(
        f"the session's tritonserver exited with {code} during or after "
        f"{_LAST_USER[0] or 'its start'}; {then} (its log: {server.log_path}, rotated to .1 "
        f"when started again):\n{_crash_of(log)}")


def pytest_terminal_summary(terminalreporter) -> None:
    """Each death of the session's tritonserver, with its crash, at the very end of the run."""
    for death in _SERVER_DEATHS:
        terminalreporter.write_sep("=", "tritonserver died", red=True)
        terminalreporter.write_line(death)


def _gpu_missing() -> list[str]:
    missing = []
    if shutil.which("nvidia-smi") is None:
        missing.append("nvidia-smi not found")
    if importlib.util.find_spec("tensorrt") is None:
        missing.append("tensorrt not importable")
    return missing


class _WorkerOrder:
    """Registered in pytest-xdist's workers: orders what ``-m`` left (``_worker_order``)."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        _worker_order(items)


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        config.pluginmanager.register(_WorkerOrder(), "forge-worker-order")


def _worker_order(items: list[pytest.Item]) -> None:
    """Order modules for ``pytest -n 2 --dist loadfile --no-loadscope-reorder`` (scripts/test.sh):
    a module that builds the ``tools add`` models and one that builds the project's spec first,
    so the two workers build them side by side (later users wait on that build's lock); then the
    other users of those builds, the added models' first (they are ready sooner); then the rest,
    modules with more tests first. The same order in every worker, as pytest-xdist requires."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)

    def users(fixture: str) -> list[str]:
        return sorted((m for m, its in modules.items()
                       if any(fixture in getattr(i, "fixturenames", ()) for i in its)),
                      key=lambda m: -len(modules[m]))

    added, spec = users("added_models"), users("built_repository")
    order = [*added[:1], *spec[:1], *added[1:], *spec[1:],
             *sorted(modules, key=lambda m: -len(modules[m]))]
    items[:] = [item for m in dict.fromkeys(order) for item in modules[m]]


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test's tier; skip tests marked ``gpu`` on machines without a GPU and TensorRT."""
    for item in items:
        markers = {m.name for m in item.iter_markers()}
        fixtures = getattr(item, "fixturenames", ())
        item.add_marker(tier_of(markers, fixtures))
    missing = _gpu_missing()
    if not missing:
        return
    skip = pytest.mark.skip(reason=f"no NVIDIA GPU ({' / '.join(missing)})")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def compare():
    """``benchmarks/compare_servers.py`` imported as a module (it is a script, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "compare_servers", REPO_ROOT / "benchmarks" / "compare_servers.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_DURATIONS: defaultdict[str, float] = defaultdict(float)
_TIER_OF: dict[str, str] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add up each test's setup, call and teardown seconds (for ``FORGE_TEST_DURATIONS``); under
    pytest-xdist the controller gets every worker's reports, so it alone writes them."""
    _DURATIONS[report.nodeid] += report.duration
    _TIER_OF[report.nodeid] = next((t for t in TIERS if t in report.keywords), "?")


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Append every test's seconds, slowest first, to the ``FORGE_TEST_DURATIONS`` file."""
    path = os.environ.get("FORGE_TEST_DURATIONS")
    if not path or not _DURATIONS or hasattr(session.config, "workerinput"):
        return
    with open(path, "a", encoding="utf-8") as out:
        for nodeid, seconds in sorted(_DURATIONS.items(), key=lambda kv: -kv[1]):
            out.write(f"{seconds:9.2f} s  {_TIER_OF.get(nodeid, '?'):<11}  {nodeid}\n")
