"""Which TensorRT Python module is installed: the full wheels' ``tensorrt`` or ``tensorrt_bindings``.

Read by the build's TensorRT stage and by the TensorRT guard inside the serving image, so it has
no project dependencies (the images copy it beside ``tools/manifest.py``).
"""

from __future__ import annotations

# The TensorRT Python module: the `tensorrt` package of the full wheels, or `tensorrt_bindings`
# alone (what the builder image installs, over the image's own libnvinfer).
TENSORRT_MODULES = ("tensorrt", "tensorrt_bindings")


def import_tensorrt_module() -> tuple[object | None, str]:
    """The first importable module of ``TENSORRT_MODULES``, or None and what was tried."""
    import importlib

    failures = []  # import errors other than "not installed" (a missing libnvinfer, say)
    for name in TENSORRT_MODULES:
        try:
            return importlib.import_module(name), name
        except ModuleNotFoundError as exc:
            if exc.name != name:
                failures.append(f"{name}: {exc}")
        except ImportError as exc:
            failures.append(f"{name}: {exc}")
    detail = f": {'; '.join(failures)}" if failures else ""
    return None, f"no TensorRT Python module ({' or '.join(TENSORRT_MODULES)}){detail}"
