"""Assemble the backend directory the embedded tritonserver loads the Python backend from, and
the environment its stubs run in.

The nvidia-pytriton wheel ships the Python backend and one stub per Python version; we link the
ones matching the running interpreter into a project cache folder, never into site-packages.
"""

from __future__ import annotations

import importlib.util
import os
import site
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path

from tools.errors import ServerError, UserInputError
from tools.process import STUB_NAME

BACKEND_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")
CACHE_ENV = "TRITON_FORGE_CACHE_DIR"


def pytriton_server_dir() -> Path:
    """Return the wheel's ``pytriton/tritonserver`` folder (binary, backends, stubs).

    Raises:
        ServerError: nvidia-pytriton is not installed.
    """
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ServerError("nvidia-pytriton is not installed: pip install nvidia-pytriton==0.7.0")
    root = Path(next(iter(spec.submodule_search_locations))) / "tritonserver"
    if not (root / "bin" / "tritonserver").is_file():
        raise ServerError(f"the nvidia-pytriton wheel has no tritonserver binary at {root / 'bin'}")
    return root


def default_binary() -> Path:
    """The tritonserver binary shipped in the nvidia-pytriton wheel."""
    return pytriton_server_dir() / "bin" / "tritonserver"


def _site_packages() -> list[Path]:
    dirs = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    dirs.update(site.getsitepackages())
    if site.ENABLE_USER_SITE and site.getusersitepackages():
        dirs.add(site.getusersitepackages())
    return [Path(d).resolve() for d in dirs]


def _inside_site_packages(path: Path) -> bool:
    resolved = path.resolve()
    return any(resolved == sp or sp in resolved.parents for sp in _site_packages())


def default_cache_root() -> Path:
    """The project's cache folder: ``$TRITON_FORGE_CACHE_DIR``, else ``<project root or cwd>/.cache``.

    The project root is the checkout holding ``pyproject.toml`` when this package is installed
    editable; an installed copy lives in site-packages, so the current directory is used instead.
    """
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and not _inside_site_packages(checkout):
        return checkout / ".cache"
    return Path.cwd() / ".cache"


def libpython_dir() -> Path:
    """The running interpreter's ``sysconfig`` LIBDIR, checked to hold ``libpython3.X.so.1.0``.

    The stub loads ``libpython3.X.so.1.0`` dynamically; the one in LIBDIR matches this
    interpreter's standard library (a system copy of another patch release breaks
    ``multiprocessing`` inside model code), so LIBDIR must come first on ``LD_LIBRARY_PATH``.

    Raises:
        ServerError: the shared library is not in LIBDIR.
    """
    name = f"libpython{sys.version_info.major}.{sys.version_info.minor}.so.1.0"
    libdir = sysconfig.get_config_var("LIBDIR")
    if not libdir or not (Path(libdir) / name).exists():
        raise ServerError(
            f"{name} not found in sysconfig LIBDIR ({libdir or 'unset'}) of {sys.executable}: "
            "the Python-backend stub needs a Python built with --enable-shared"
        )
    return Path(libdir)


def _link(target: Path, link: Path) -> None:
    """Point ``link`` at ``target`` atomically, replacing a stale link or file."""
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return
    tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, link)


def python_backend_dir(
    cache_root: Path | None = None, *, python_version: tuple[int, int] | None = None
) -> Path:
    """Assemble (idempotently) and return the folder to pass as ``--backend-directory``.

    The folder, ``<cache_root>/triton-backends/py3.X/``, holds ``python/`` with symlinks to the
    wheel's ``libtriton_python.so`` and ``triton_python_backend_utils.py`` and to the stub built
    for Python 3.X (symlinks keep the wheel's RPATH working: the loader resolves ``$ORIGIN``
    through them).

    Args:
        cache_root: Cache folder; defaults to :func:`default_cache_root`.
        python_version: (major, minor) of the stub; defaults to the running interpreter.

    Returns:
        The backend directory.

    Raises:
        ServerError: no stub for this Python version in the wheel.
        UserInputError: the cache folder lies inside site-packages.
    """
    major, minor = python_version or sys.version_info[:2]
    version = f"{major}.{minor}"
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    if _inside_site_packages(root):
        raise UserInputError(
            f"backend cache folder {root} is inside site-packages; set {CACHE_ENV} to a project folder"
        )
    wheel = pytriton_server_dir()
    stubs = wheel / "python_backend_stubs"
    stub = stubs / version / STUB_NAME
    if not stub.is_file():
        available = sorted(
            (p.name for p in stubs.iterdir() if (p / STUB_NAME).is_file()),
            key=lambda v: tuple(int(x) for x in v.split(".")),
        )
        raise ServerError(
            f"nvidia-pytriton has no Python-backend stub for Python {version} (looked in {stubs}); "
            f"supported: {', '.join(available) or 'none'}"
        )
    backend_dir = root / "triton-backends" / f"py{version}"
    python_dir = backend_dir / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for name in BACKEND_FILES:
        _link(wheel / "backends" / "python" / name, python_dir / name)
    _link(stub, python_dir / STUB_NAME)
    return backend_dir


def installed_backends(binary: Path) -> Path | None:
    """``../backends`` of an installed server such as the NGC image's ``/opt/tritonserver``
    (its Python backend brings its own stub); None for the wheel's binary."""
    home = binary.resolve().parent.parent
    own = home / "backends"
    if home != pytriton_server_dir().resolve() and (own / "python").is_dir():
        return own
    return None


def backend_directory(binary: Path) -> Path:
    """The ``--backend-directory`` for ``binary``: an installed server's own, else the project
    cache one (``python_backend_dir``)."""
    return installed_backends(binary) or python_backend_dir()


def stub_environment(
    base: Mapping[str, str] | None = None, *, libpython: bool = True
) -> dict[str, str]:
    """An environment for a server whose Python-backend stubs run this interpreter's packages.

    Args:
        base: The environment to extend; defaults to this process's.
        libpython: Also put this interpreter's LIBDIR first on ``LD_LIBRARY_PATH`` (the wheel's
            stub loads ``libpython3.X.so.1.0``; an installed server's own stub does not).

    Returns:
        ``base`` with this virtual environment's ``bin`` first on ``PATH`` (the stub imports
        packages through the interpreter found there).

    Raises:
        ServerError: ``libpython`` and this interpreter's library is not in its LIBDIR.
    """
    env = dict(os.environ if base is None else base)
    env["PATH"] = os.pathsep.join(
        p for p in (str(Path(sys.executable).parent), env.get("PATH", "")) if p
    )
    if libpython:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(libpython_dir()), env.get("LD_LIBRARY_PATH", "")) if p
        )
    return env
