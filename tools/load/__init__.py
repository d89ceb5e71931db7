"""One load engine: how requests are paced (closed or open loop) x how they are sent (senders).

``Request`` is the prepared payload every sender takes (``tools.load.request``).
"""

from tools.load.request import Request, text_requests, triton_dtype

__all__ = ["Request", "text_requests", "triton_dtype"]
