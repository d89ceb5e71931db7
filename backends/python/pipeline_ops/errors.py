"""The two errors of the Python-backend models (this package must import without ``tools``).

``InvalidInput`` rejects one request (INVALID_ARG, the rest of the batch goes on);
``ConfigurationError`` refuses to load a model whose config does not fit it.
"""


class InvalidInput(ValueError):
    """A request's input is unusable. The message names the input and the problem."""


class ConfigurationError(ValueError):
    """The model configuration or a file it names does not fit the model; names the field."""
