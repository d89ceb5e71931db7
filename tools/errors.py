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


class ApiError(ToolkitError):
    """A request to the OpenAI/TEI gateway (``tools/api``) that it refuses or cannot serve.

    Each API answers it in its own error shape and status code (``tools/api/openai_routes.py``,
    ``tools/api/tei_routes.py``); ``param`` names the request field at fault, when one is.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ApiInvalidRequest(ApiError):
    """A body the API does not accept: not JSON, a wrong type, a missing field, a limit passed."""


class ApiEmptyInput(ApiInvalidRequest):
    """A request with nothing to compute (an empty list of inputs)."""


class ApiBodyTooLarge(ApiInvalidRequest):
    """A request body above the gateway's size limit (HTTP 413)."""


class ApiModelNotFound(ApiInvalidRequest):
    """The request names no served pipeline of the kind its route serves."""


class ApiOverloaded(ApiError):
    """Triton refused the request for lack of room (a full queue, the admission gate): retry."""


class ApiBackendError(ApiError):
    """Triton failed the request for another reason than the request itself."""


class ApiUnavailable(ApiError):
    """The gateway cannot serve yet: Triton is not ready, or the pipelines are not discovered."""
