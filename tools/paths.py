"""Where the project's own files are: the Python backends, the Locust users, the schemas.

In a checkout (``pip install -e .``, as scripts/setup.sh does) they are read from its top-level
folders; an installed wheel carries the same folders, layout kept, as package data under
``tools/_project/`` (copied there at build time by ``tools/_wheel_data.py``).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from tools.errors import ToolkitError

PACKAGED = "_project"  # tools/_wheel_data.PACKAGED: that module is loaded by setuptools alone
CHECKOUT = Path(__file__).resolve().parents[1]
# A checkout (or an unpacked sdist) holds pyproject.toml beside tools/; site-packages never does.
IN_CHECKOUT = (CHECKOUT / "pyproject.toml").is_file()
ROOT = CHECKOUT if IN_CHECKOUT else Path(str(resources.files("tools") / PACKAGED))
BACKENDS = ROOT / "backends" / "python"
LOADTESTS = ROOT / "loadtests"
LOCUSTFILE = LOADTESTS / "locustfile.py"
SLO_FILE = LOADTESTS / "slo.yaml"
TEXTS_FILE = LOADTESTS / "data" / "texts.txt"
SCHEMAS = ROOT / "schemas"
IMAGES_DIR = LOADTESTS / "data" / "images"
SPEC_FILE = Path("repository.yaml")  # as every command's --spec: the one where you run it


def project_file(path: Path, what: str) -> Path:
    """``path`` when it exists.

    Raises:
        ToolkitError: naming the file, what it is for and where it should have come from.
    """
    if not Path(path).exists():
        where = (f"the checkout {CHECKOUT} lacks it (restore it from git)" if IN_CHECKOUT else
                 f"the installed triton-forge lacks it under {ROOT}: reinstall from a wheel "
                 f"built from the project (its build step copies backends/, loadtests/ and "
                 f"schemas/ into tools/{PACKAGED}/)")
        raise ToolkitError(f"{path} not found ({what}): {where}")
    return Path(path)
