"""Moved: the manifest is ``tools/manifest.py``, the file helpers are ``tools/files.py``.

Kept for this wave's parallel branches, which still import the old path; remove after the merge.
"""

from tools.files import sha256_file, sha256_tree, write_atomically  # noqa: F401
from tools.manifest import (  # noqa: F401
    MANIFEST_NAME,
    Manifest,
    ManifestError,
    ModelEntry,
    TensorRTRecord,
    artifacts_of,
    artifacts_present,
    fingerprint,
    load_manifest,
    matching_artifacts,
    module_file,
    tool_versions,
)
