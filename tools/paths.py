"""Where the project's own files are: the checkout's layout, written down once.

``tools`` runs from a checkout (``pip install -e .``, as scripts/setup.sh does): the Python
backends, the Locust scenarios and the default spec are read from it, not from the wheel.
"""

from __future__ import annotations

from pathlib import Path

from tools.errors import ToolkitError

CHECKOUT = Path(__file__).resolve().parents[1]
BACKENDS = CHECKOUT / "backends" / "python"
LOADTESTS = CHECKOUT / "loadtests"
LOCUSTFILE = LOADTESTS / "locustfile.py"
SLO_FILE = LOADTESTS / "slo.yaml"
TEXTS_FILE = LOADTESTS / "data" / "texts.txt"
SCHEMAS = CHECKOUT / "schemas"
SPEC_FILE = CHECKOUT / "repository.yaml"
IMAGES_DIR = LOADTESTS / "data" / "images"


def project_file(path: Path, what: str) -> Path:
    """``path`` when it exists.

    Raises:
        ToolkitError: naming the file and why it would be missing (not a checkout install).
    """
    if not Path(path).exists():
        raise ToolkitError(
            f"{path} not found ({what}): tools reads it from a checkout of the project; install "
            f"with `pip install -e .` from the checkout (scripts/setup.sh does)"
        )
    return Path(path)
