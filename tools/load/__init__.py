"""One load engine: how requests are paced (closed or open loop) x how they are sent (senders).

    from tools.load import ClosedLoop, Request, TritonGrpc, run
    point = run(requests, TritonGrpc("127.0.0.1:8001"), ClosedLoop(8), warmup_s=2, duration_s=10)

``Request`` is the prepared payload every sender takes; ``Point`` the one result of a run, its
figures from ``tools.stats``; meters (``TritonStats``, ``Cores``, ``LoadAverage``) watch the
window. A new protocol is one ``Sender`` class, a new pacing one ``Pacing`` class.
"""

from tools.load.engine import Background, run, run_async, run_loop
from tools.load.meters import Cores, LoadAverage, Meter, TritonStats
from tools.load.pacing import ClosedLoop, OpenLoop, Pacing
from tools.load.point import Point
from tools.load.request import Request, text_requests, triton_dtype
from tools.load.senders import (CLIENT_TIMEOUT, RawHttp, SendError, Sender, TritonGrpc,
                                TritonHttp, sender_for)

__all__ = [
    "Background", "CLIENT_TIMEOUT", "ClosedLoop", "Cores", "LoadAverage", "Meter", "OpenLoop",
    "Pacing", "Point", "RawHttp", "Request", "SendError", "Sender", "TritonGrpc", "TritonHttp",
    "TritonStats", "run", "run_async", "run_loop", "sender_for", "text_requests", "triton_dtype",
]
