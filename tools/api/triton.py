"""The gateway's Triton side: tritonclient's asyncio HTTP client over one keep-alive pool.

Tensors go and come as binary data; Triton's failures become the gateway's errors (a request
Triton calls invalid, a full queue, Triton unreachable, anything else).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tools.errors import (
    ApiBackendError,
    ApiInvalidRequest,
    ApiOverloaded,
    ApiUnavailable,
)

# Connections to Triton kept open: one per request in flight (the public front bounds those).
CONNECTIONS = 256
REQUEST_TIMEOUT_S = 60.0
_DTYPES = {np.dtype(np.int64): "INT64", np.dtype(np.float32): "FP32", np.dtype(np.int32): "INT32"}
# Triton's answers that mean "no room now, retry": a full queue (UNAVAILABLE, 503) or the
# tokenizer's admission gate ("overloaded: ..."), and 429 from a front that sheds load.
_OVERLOADED_STATUS = {"429", "503"}
# aiohttp offers gzip by default, and Triton then compresses every answer (its CPU and ours):
# binary tensors on loopback go as they are.
_UNCOMPRESSED = {"Accept-Encoding": "identity"}


def datatype(array: np.ndarray) -> str:
    """The Triton datatype of an array the gateway sends (``BYTES`` for strings)."""
    if array.dtype == np.object_:
        return "BYTES"
    return _DTYPES[array.dtype]


class TritonBackend:
    """One Triton HTTP endpoint, used from the gateway's event loop.

    Args:
        url: ``host:port`` of Triton's HTTP endpoint (KServe v2).
        connections: Keep-alive connections at most.
    """

    def __init__(self, url: str, connections: int = CONNECTIONS) -> None:
        import tritonclient.http.aio as httpclient

        self.url = url
        self._mod = httpclient
        self._client = httpclient.InferenceServerClient(
            url, conn_limit=connections, conn_timeout=REQUEST_TIMEOUT_S)

    async def close(self) -> None:
        """Close the connection pool."""
        await self._client.close()

    async def ready(self) -> bool:
        """Triton answers and says it is ready."""
        try:
            return bool(await self._client.is_server_ready())
        except Exception:  # noqa: BLE001 - not reachable is not ready
            return False

    async def model_ready(self, name: str) -> bool:
        """Triton says ``name`` is loaded and ready."""
        try:
            return bool(await self._client.is_model_ready(name))
        except Exception:  # noqa: BLE001 - not reachable is not ready
            return False

    async def config(self, name: str) -> dict[str, Any]:
        """The model configuration Triton loaded for ``name`` (its model-config API)."""
        return await self._call(self._client.get_model_config(name), name)

    async def metadata(self, name: str) -> dict[str, Any]:
        """The model metadata (its versions, tensors) Triton reports for ``name``."""
        return await self._call(self._client.get_model_metadata(name), name)

    async def infer(self, model: str, inputs: Mapping[str, np.ndarray],
                    outputs: Sequence[str]) -> dict[str, np.ndarray]:
        """One inference request: ``inputs`` by name (batch axis first), ``outputs`` asked for.

        Raises:
            ApiInvalidRequest: Triton refused the request as invalid (HTTP 400), its message kept.
            ApiOverloaded: Triton had no room for it (a full queue, the admission gate).
            ApiUnavailable: Triton could not be reached.
            ApiBackendError: any other failure.
        """
        mod = self._mod
        tensors = []
        for name, array in inputs.items():
            tensor = mod.InferInput(name, list(array.shape), datatype(array))
            tensor.set_data_from_numpy(array, binary_data=True)
            tensors.append(tensor)
        wanted = [mod.InferRequestedOutput(name, binary_data=True) for name in outputs]
        result = await self._call(self._client.infer(model, tensors, outputs=wanted,
                                                     headers=_UNCOMPRESSED), model)
        return {name: result.as_numpy(name) for name in outputs}

    async def _call(self, call: Any, model: str) -> Any:
        import aiohttp
        from tritonclient.utils import InferenceServerException

        try:
            return await call
        except InferenceServerException as exc:
            status, message = str(exc.status() or ""), str(exc.message() or exc)
            if status == "400":
                raise ApiInvalidRequest(f"{model}: {message}") from None
            if status in _OVERLOADED_STATUS or "overloaded" in message:
                raise ApiOverloaded(f"{model} is overloaded, retry later: {message}") from None
            raise ApiBackendError(f"{model}: Triton answered {status or 'an error'}: "
                                  f"{message}") from None
        except asyncio.TimeoutError:
            raise ApiBackendError(f"{model}: no answer from Triton within "
                                  f"{REQUEST_TIMEOUT_S:g} s") from None
        except (OSError, aiohttp.ClientError) as exc:
            raise ApiUnavailable(f"Triton at {self.url} is not reachable: {exc}") from None
