"""What the load engine sends: one prepared inference request, built once before a run.

A request is data, not code: its inputs as NumPy arrays by name (the batch axis first; string
tensors as object arrays of ``bytes``), the outputs to ask for, and, for the raw HTTP sender, the
ready body (and path) when the bytes themselves are under test. Every sender takes the same
``Request``; scenarios from any pipeline of the spec produce them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

# numpy kind/dtype -> Triton datatype (the KServe v2 names); object arrays carry BYTES.
_TRITON_DTYPES = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "UINT8", np.dtype(np.uint16): "UINT16",
    np.dtype(np.uint32): "UINT32", np.dtype(np.uint64): "UINT64",
    np.dtype(np.int8): "INT8", np.dtype(np.int16): "INT16",
    np.dtype(np.int32): "INT32", np.dtype(np.int64): "INT64",
    np.dtype(np.float16): "FP16", np.dtype(np.float32): "FP32", np.dtype(np.float64): "FP64",
}


def triton_dtype(array: np.ndarray) -> str:
    """The Triton datatype of ``array`` (``BYTES`` for an object or bytes array).

    Raises:
        ValueError: a dtype Triton has no datatype for.
    """
    if array.dtype == np.object_ or array.dtype.kind == "S":
        return "BYTES"
    try:
        return _TRITON_DTYPES[array.dtype]
    except KeyError:
        raise ValueError(f"no Triton datatype for numpy dtype {array.dtype}") from None


@dataclass(frozen=True, eq=False)
class Request:
    """One inference request, prepared before the load.

    Attributes:
        model: The model (or ensemble) it goes to.
        inputs: Input name -> array, batch axis first (``[1, 1]`` for one text); string tensors
            as object arrays of ``bytes``. Read-only after construction.
        outputs: Output names to ask for (binary where the protocol allows); empty: the
            server's default (every output).
        body: Raw HTTP sender only: the exact request body to send (KServe v2 JSON or any
            bytes under test). None: the KServe v2 JSON of ``inputs``.
        path: Raw HTTP sender only: the request path; None: ``/v2/models/<model>/infer``.
    """

    model: str
    inputs: Mapping[str, np.ndarray] = field(default_factory=dict)
    outputs: tuple[str, ...] = ()
    body: bytes | None = None
    path: str | None = None

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("a request needs a model name")
        if not self.inputs and self.body is None:
            raise ValueError(f"request to {self.model!r}: give inputs or a raw body")
        for name, array in self.inputs.items():
            if not isinstance(array, np.ndarray) or array.ndim < 1:
                raise ValueError(f"request to {self.model!r}: input {name!r} must be a numpy "
                                 f"array with the batch axis first")
            triton_dtype(array)
        object.__setattr__(self, "inputs", MappingProxyType(dict(self.inputs)))
        object.__setattr__(self, "outputs", tuple(self.outputs))

    @classmethod
    def json(cls, model: str, body: Mapping[str, Any] | bytes, path: str | None = None) -> Request:
        """A raw-HTTP request whose body is ``body`` (a KServe v2 JSON document, or bytes)."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return cls(model, body=data, path=path)

    @property
    def http_path(self) -> str:
        """The HTTP path of the request."""
        return self.path or f"/v2/models/{self.model}/infer"

    def http_body(self) -> bytes:
        """``body``, or the KServe v2 JSON of ``inputs`` (and ``outputs``)."""
        if self.body is not None:
            return self.body
        doc: dict[str, Any] = {"inputs": [_json_tensor(n, a) for n, a in self.inputs.items()]}
        if self.outputs:
            doc["outputs"] = [{"name": name} for name in self.outputs]
        return json.dumps(doc).encode()


def _json_tensor(name: str, array: np.ndarray) -> dict[str, Any]:
    dtype = triton_dtype(array)
    if dtype == "BYTES":
        try:
            data: list[Any] = [v.decode("utf-8") if isinstance(v, bytes) else str(v)
                               for v in array.reshape(-1)]
        except UnicodeDecodeError:
            raise ValueError(f"input {name!r} holds bytes that are not UTF-8: KServe JSON cannot "
                             f"carry them (send binary tensors: the grpc or http sender)") from None
    else:
        data = array.reshape(-1).tolist()
    return {"name": name, "shape": list(array.shape), "datatype": dtype, "data": data}


def text_requests(model: str, texts: Iterable[str], *, input_name: str = "TEXT",
                  outputs: tuple[str, ...] = ()) -> list[Request]:
    """One request per text: ``input_name`` as a ``[1, 1]`` BYTES tensor (UTF-8)."""
    return [Request(model, {input_name: np.array([[t.encode("utf-8")]], dtype=np.object_)},
                    outputs) for t in texts]
