"""Where a model comes from: a factory module (``source``), a recipe, or an ONNX file; and the
files a Python model's recipe makes (a converted ``tokenizer.json``).

The builders ask this module for a model's callables, the references hashed into its build key
and the files its weights are read from; the recipe's own settings (folder, pooling,
normalisation, activation, factory) come from the spec entry. ``tools/models/`` holds the
factories.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.build_repo.spec import ModelSpec, PythonModelSpec, resolve_reference
from tools.files import sha256_file
from tools.manifest import ModelEntry

if TYPE_CHECKING:
    from tools.models.hf_folder import HfFolder

Factory = Callable[[], Any]
SampleInputs = Callable[[int, dict[str, int]], dict]

# The functions a recipe's model is built by (None: the recipe's `factory`); their modules are
# hashed into the build key.
RECIPE_FUNCTIONS: dict[str, tuple[str | None, str]] = {
    "hf-text-embedding": ("tools.models.hf:build_model", "tools.models.hf:sample_inputs"),
    "hf-sequence-classification": ("tools.models.hf:build_model", "tools.models.hf:sample_inputs"),
    "hf-cross-encoder": ("tools.models.hf:build_model", "tools.models.hf:sample_inputs"),
    "hf-token-classification": ("tools.models.hf:build_model", "tools.models.hf:sample_inputs"),
    "image-classification": (None, "tools.models.vision:sample_inputs"),
}
# The module that makes a Python model recipe's files (hashed into its build key).
PYTHON_RECIPE_MODULE = "tools.models.hf_folder:convert_tokenizer"


def references(model: ModelSpec) -> tuple[str, str]:
    """The ``build_model`` and ``sample_inputs`` references the model is built and sampled by.

    A recipe's are its functions; an ONNX model's are its PyTorch reference (empty when it names
    none).
    """
    recipe = model.recipe
    if recipe is None:
        return model.source or "", model.sample_inputs or ""
    factory, sample = RECIPE_FUNCTIONS[recipe.kind]
    return factory or recipe.factory or "", sample


def folder_of(root: Path, model: ModelSpec | PythonModelSpec) -> Path:
    """The recipe's model folder, resolved against the spec's folder."""
    assert model.recipe is not None and model.recipe.path is not None
    path = Path(model.recipe.path)
    return path if path.is_absolute() else root / path


def model_callables(root: Path, model: ModelSpec, where: str = "") -> tuple[Factory, SampleInputs]:
    """``build_model()`` and ``sample_inputs(batch_size, axes)`` of a model, recipe or not.

    Args:
        root: the spec's folder (a recipe's relative ``path`` is resolved against it).
        model: the spec entry.
        where: prefix of error messages (spec file and model).

    Raises:
        SpecError: a reference does not resolve.
        ModelSourceError: the recipe's folder is not a model of its kind.
    """
    recipe = model.recipe
    if recipe is None:
        return resolve_reference(model.source, where), resolve_reference(model.sample_inputs, where)
    if recipe.kind.startswith("hf-"):
        from tools.models import hf
        from tools.models.hf_folder import read_folder

        folder = read_folder(folder_of(root, model), recipe.kind)
        return (functools.partial(hf.build_model, folder, recipe),
                functools.partial(hf.sample_inputs, folder, recipe))
    from tools.models import vision

    return (functools.partial(vision.build_model, resolve_reference(recipe.factory, where)),
            functools.partial(vision.sample_inputs, model.inputs))


def recipe_folder(root: Path, model: ModelSpec) -> HfFolder:
    """The checked Hugging Face folder of an ``hf-*`` recipe's model.

    Raises:
        ModelSourceError: the folder is not a model of the recipe's kind.
    """
    from tools.models.hf_folder import read_folder

    return read_folder(folder_of(root, model), model.recipe.kind)


def recipe_files(root: Path, model: ModelSpec) -> list[Path]:
    """The files a recipe's model is built from (hashed into its build key); none for a factory."""
    if model.recipe is None or not model.recipe.kind.startswith("hf-"):
        return []
    return recipe_folder(root, model).weights_files()


def recipe_weights(
    root: Path, model: ModelSpec, previous: ModelEntry | None
) -> tuple[dict[str, str], dict[str, list[int]]]:
    """sha256 of a recipe's files, and their ``[size, mtime_ns]`` for the next run.

    A file whose size and modification time are unchanged keeps the hash recorded last time,
    so a no-op rebuild does not rehash hundreds of megabytes of weights.
    """
    old_hashes = previous.inputs.get("weights", {}) if previous else {}
    old_stats = previous.weights_stat if previous else {}
    hashes, stats = {}, {}
    for path in recipe_files(root, model):
        key, stat = str(path), path.stat()
        stats[key] = [stat.st_size, stat.st_mtime_ns]
        same = key in old_hashes and old_stats.get(key) == stats[key]
        hashes[key] = old_hashes[key] if same else sha256_file(path)
    return hashes, stats


def python_recipe_inputs(root: Path, model: PythonModelSpec) -> dict[str, object] | None:
    """What a Python model recipe's files depend on (part of its build key), or None without one:
    sha256 of the folder's tokenizer files, the converting module and the library versions."""
    if model.recipe is None:
        return None
    import tokenizers
    import transformers

    from tools.manifest import module_file
    from tools.models.hf_folder import HfFolder, read_folder

    folder: HfFolder = read_folder(folder_of(root, model), "hf-text-embedding")
    return {
        "kind": model.recipe.kind,
        "files": {str(p): sha256_file(p) for p in folder.tokenizer_files()},
        "module": sha256_file(module_file(PYTHON_RECIPE_MODULE)),
        "versions": {"transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__},
    }


def write_python_recipe_files(root: Path, model: PythonModelSpec, version_dir: Path) -> None:
    """Write a Python model recipe's files into its version folder (never into the user's folder):
    ``hf-tokenizer`` writes the folder's fast tokenizer as ``tokenizer.json``."""
    if model.recipe is None:
        return
    from tools.build_repo.spec.settings import PYTHON_RECIPE_FILES
    from tools.models.hf_folder import read_folder

    folder = read_folder(folder_of(root, model), "hf-text-embedding")
    folder.fast_tokenizer().save(str(version_dir / PYTHON_RECIPE_FILES[model.recipe.kind]))
