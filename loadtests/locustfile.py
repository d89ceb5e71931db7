"""Locust entry point: one user per protocol for any pipeline or model of the spec, and the gate.

``locust -f loadtests/locustfile.py --headless -u 8 -t 40s --host 127.0.0.1:8001
--scenario text_embedding ScenarioGrpcUser``; ``tools loadtest`` does this for you. The load of
``--scenario`` is derived from the spec's typed inputs (``tools/load/scenario.py``).
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
from loadtests.users import ApiUser, TritonGrpcUser, TritonHttpUser


class ScenarioHttpUser(TritonHttpUser):
    """``--scenario`` over tritonclient HTTP."""


class ScenarioGrpcUser(TritonGrpcUser):
    """``--scenario`` over tritonclient gRPC."""


class ScenarioOpenaiUser(ApiUser):
    """``--scenario`` through the gateway's OpenAI route (``tools loadtest --api openai``)."""

    api = "openai"


class ScenarioTeiUser(ApiUser):
    """``--scenario`` through the gateway's TEI route (``tools loadtest --api tei``)."""

    api = "tei"


# The shipped pipelines under the class names docker-compose.yml's LOCUST_USER_CLASS uses; the
# same users as above, with a default for runs that give no --scenario.
class TextEmbeddingHttpUser(ScenarioHttpUser):
    default_scenario = "text_embedding"


class TextEmbeddingGrpcUser(ScenarioGrpcUser):
    default_scenario = "text_embedding"


class ImageClassificationHttpUser(ScenarioHttpUser):
    default_scenario = "image_classification"


class ImageClassificationGrpcUser(ScenarioGrpcUser):
    default_scenario = "image_classification"
