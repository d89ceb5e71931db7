"""C sources of this toolkit compiled on first use: the C open loop (``tools/load/open_loop.c``),
the load generator of ``tools bench`` and the overload runs.

Each is compiled with the machine's C compiler (``cc``, else ``gcc``) into a cache keyed by the
source's hash (``$XDG_CACHE_HOME/triton-forge``), so an edited source is compiled again and a
concurrent first use finds either no binary or a whole one. No C source of this toolkit parses
requests: the front that takes traffic is HAProxy (``tools/front``).

Where no compiler will be at run time, the binary can be made beforehand, statically linked,
with the same flags: ``python -m tools.native_build SOURCE --static --output PATH``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path


class NotCompiled(Exception):
    """A C source could not be compiled here; the message says why (no compiler, or its words)."""


def cache_dir() -> Path:
    """Where compiled sources are kept (``$XDG_CACHE_HOME/triton-forge``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "triton-forge"


def compiler() -> str | None:
    """The C compiler on PATH (``cc``, else ``gcc``), or None."""
    return shutil.which("cc") or shutil.which("gcc")


def compiled(source: Path) -> Path:
    """The binary of ``source`` (linked with ``-lm``), compiled now if the source changed since.

    Raises:
        NotCompiled: no C compiler on PATH, or the source did not compile.
    """
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    target = cache_dir() / f"{source.stem}-{digest}"
    if target.is_file() and os.access(target, os.X_OK):
        return target
    compile_to(source, target)
    return target


def compile_to(source: Path, target: Path, static: bool = False) -> None:
    """Compile ``source`` into ``target`` (``cc -O2 ... -lm``; ``static``: linked statically, to
    run on a system without this one's libraries), replacing it whole or not at all.

    Raises:
        NotCompiled: no C compiler on PATH, or the source did not compile.
    """
    cc = compiler()
    if cc is None:
        raise NotCompiled(f"{source.name} needs a C compiler (cc or gcc) on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    done = subprocess.run([cc, "-O2", *(["-static"] if static else []), "-o", str(partial),
                           str(source), "-lm"], capture_output=True, text=True)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise NotCompiled(f"{source.name} did not compile with {cc}:\n{done.stderr.strip()}")
    partial.replace(target)  # atomic: a concurrent run finds either none or a whole binary


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.native_build SOURCE --output PATH [--static]``: compile one source
    beforehand (exit 1, saying why, where it cannot be)."""
    parser = argparse.ArgumentParser(prog="python -m tools.native_build", description=main.__doc__)
    parser.add_argument("source", type=Path)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--static", action="store_true", help="link statically")
    args = parser.parse_args(argv)
    try:
        compile_to(args.source, args.output, static=args.static)
    except NotCompiled as exc:
        print(f"native_build: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
