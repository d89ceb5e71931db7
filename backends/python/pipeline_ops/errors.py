"""The two errors of the Python-backend models (this package must import without ``tools``).

``InvalidInput`` rejects one request (INVALID_ARG, the rest of the batch goes on);
``Overloaded`` refuses one request at admission (UNAVAILABLE, HTTP 503: retry later);
``ConfigurationError`` refuses to load a model whose config does not fit it.
"""


class InvalidInput(ValueError):
    """A request's input is unusable. The message names the input and the problem."""


class ConfigurationError(ValueError):
    """The model configuration or a file it names does not fit the model; names the field."""


class Overloaded(RuntimeError):
    """The models after this step already hold all the requests they may queue (UNAVAILABLE)."""
