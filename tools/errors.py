"""The project's one error hierarchy.

The CLI turns ``UserInputError`` into a usage error (exit 2) and every other ``ToolkitError``
into a one-line failure (exit 1). Messages name the file, the model and the field.
"""

from __future__ import annotations


class ToolkitError(Exception):
    """Base class of every error this project raises on purpose."""


class UserInputError(ToolkitError):
    """Bad input from the person: a spec, an option, a request file."""


class SpecError(UserInputError):
    """The repository spec is invalid. The message names file, model and field."""


class ConfigError(ToolkitError):
    """A model configuration could not be rendered (e.g. a field ModelConfig does not have)."""


class EnsembleError(ConfigError):
    """An ensemble is inconsistent. The message names pipeline, step and tensor."""


class ExportError(ToolkitError):
    """Exporting a PyTorch model to ONNX failed."""


class ParityError(ToolkitError):
    """An exported artifact's outputs differ from the reference beyond tolerance."""


class TensorRTError(ToolkitError):
    """Building or validating a TensorRT plan failed, or a plan does not match the server."""


class ServerError(ToolkitError):
    """The Triton server could not be started, or failed while running."""


class InferenceError(ToolkitError):
    """A request to the server failed."""


class LoadTestError(ToolkitError):
    """A load test could not run, or missed its service-level objectives."""


class BuildError(ToolkitError):
    """The repository build could not complete (lock held, swap failed, a stage crashed)."""


class ModelSourceError(UserInputError):
    """A model folder or file given to a recipe is not a model of that kind, or lacks a file."""
