"""Locust entry point: the concrete users (one per scenario and protocol) and the gate listeners.

Pick users by class name, e.g. ``locust -f loadtests/locustfile.py --headless -u 8 -t 40s
--host 127.0.0.1:8001 TextEmbeddingGrpcUser``; ``tools loadtest`` does this for you.
"""

# gRPC must be made gevent-cooperative before any channel exists (and after Locust's
# monkey-patching, which happened before this file was imported).
import grpc.experimental.gevent as grpc_gevent

grpc_gevent.init_gevent()

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from loadtests import listeners  # noqa: F401  (registers the gate)
from loadtests.scenarios import SCENARIOS
from loadtests.users import TritonGrpcUser, TritonHttpUser


class TextEmbeddingHttpUser(TritonHttpUser):
    scenario = SCENARIOS["text_embedding"]


class TextEmbeddingGrpcUser(TritonGrpcUser):
    scenario = SCENARIOS["text_embedding"]


class ImageClassificationHttpUser(TritonHttpUser):
    scenario = SCENARIOS["image_classification"]


class ImageClassificationGrpcUser(TritonGrpcUser):
    scenario = SCENARIOS["image_classification"]
