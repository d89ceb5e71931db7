"""The OpenAI/TEI gateway without a Triton behind it: kinds from tensors, request reading,
each API's error shapes and statuses, the bodies load tests send, and a real gateway process
whose Triton is not there yet.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tools.api import compute, openai_routes, tei_routes
from tools.api.client import api_request, problem, route_for
from tools.api.kinds import KINDS, front_paths, kind_of_tensors, paths
from tools.api.route import Api
from tools.api.server import ApiServer, command
from tools.api.state import Limits
from tools.errors import (
    ApiBackendError,
    ApiBodyTooLarge,
    ApiEmptyInput,
    ApiInvalidRequest,
    ApiModelNotFound,
    ApiOverloaded,
    ApiUnavailable,
    ServerError,
    UserInputError,
)
from tools.load.request import Request
from tools.net import accepts, free_ports

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_the_shipped_pipelines_get_their_kind_from_their_tensors():
    from tools.build_repo.spec import load_spec

    spec = load_spec(REPO_ROOT / "repository.yaml")
    kinds = {p.name: kind_of_tensors([t.name for t in p.inputs], [t.name for t in p.outputs])
             for p in spec.pipelines}
    assert {n: k.name if k else None for n, k in kinds.items()} == {
        "text_embedding": "embedding", "text_embedding_int8": "embedding",
        "text_embedding_bf16": "embedding", "image_classification": None}


@pytest.mark.parametrize("inputs, outputs, kind", [
    (["TEXT"], ["EMBEDDING"], "embedding"),
    (["TEXT_PAIR", "TEXT"], ["SCORE"], "reranker"),
    (["TEXT"], ["LABEL", "SCORE", "PROBABILITIES"], "classifier"),
    (["TEXT"], ["SCORE"], None),  # a regression head: no labels, no route
    (["TEXT", "TEXT_PAIR"], ["EMBEDDING"], None),
    (["IMAGE"], ["CLASS_INDEX", "SCORE", "LABEL"], None),
])
def test_a_kind_needs_its_inputs_exactly_and_its_outputs_at_least(inputs, outputs, kind):
    found = kind_of_tensors(inputs, outputs)
    assert (found.name if found else None) == kind


def test_each_path_belongs_to_one_api_and_each_kind_names_its_tei_type():
    apis = {}
    for kind in KINDS:
        assert kind.tei_type in ("embedding", "reranker", "classifier")
        for route in kind.routes:
            assert apis.setdefault(route.path, route.api) is route.api
    assert paths() == ["/v1/embeddings", "/embed", "/rerank", "/predict"]
    assert front_paths() == ("/v1/", "/embed", "/rerank", "/predict", "/info", "/health")
    assert {p: str(a) for p, a in apis.items()}["/v1/embeddings"] == "openai"


@pytest.mark.parametrize("value, texts, ids, single", [
    ("a cat", ["a cat"], None, True),
    (["a", "b"], ["a", "b"], None, False),
    ([101, 2023, 102], None, [[101, 2023, 102]], True),
    ([[101, 102], [101, 7, 102]], None, [[101, 102], [101, 7, 102]], False),
])
def test_inputs_are_a_string_strings_token_ids_or_lists_of_them(value, texts, ids, single):
    inputs = compute.read_inputs(value, "input", 2048)
    assert (inputs.texts, inputs.ids, inputs.single) == (texts, ids, single)


@pytest.mark.parametrize("value, error, words", [
    ([], ApiEmptyInput, "cannot be empty"),
    (compute.MISSING, ApiInvalidRequest, "is required"),
    (5, ApiInvalidRequest, "got int"),
    (["a", 1], ApiInvalidRequest, "not a mix"),
    ([True, 2], ApiInvalidRequest, "not a mix"),
    (["x"] * 10_000, ApiInvalidRequest, "10000 inputs, more than the 2048"),
])
def test_bad_inputs_are_refused_naming_the_field(value, error, words):
    with pytest.raises(error, match=words) as caught:
        compute.read_inputs(value, "input", 2048)
    assert caught.value.param == "input"


@pytest.mark.parametrize("exc, status, kind, code", [
    (ApiEmptyInput("empty", "input"), 400, "invalid_request_error", None),
    (ApiInvalidRequest("bad", "input"), 400, "invalid_request_error", None),
    (ApiModelNotFound("nope", "model"), 404, "invalid_request_error", "model_not_found"),
    (ApiBodyTooLarge("big"), 413, "invalid_request_error", "request_too_large"),
    (ApiOverloaded("busy"), 503, "server_error", "overloaded"),
    (ApiUnavailable("down"), 503, "server_error", "unavailable"),
    (ApiBackendError("broke"), 500, "server_error", None),
])
def test_openai_errors_have_openais_shape_and_status(exc, status, kind, code):
    got_status, body = openai_routes.error(exc)
    assert got_status == status
    assert body == {"error": {"message": str(exc), "type": kind, "param": exc.param,
                              "code": code}}


@pytest.mark.parametrize("exc, status, kind", [
    (ApiEmptyInput("empty"), 400, "Empty"),
    (ApiInvalidRequest("bad"), 422, "Validation"),
    (ApiBodyTooLarge("big"), 413, "Validation"),
    (ApiModelNotFound("not a reranker"), 424, "Backend"),
    (ApiOverloaded("busy"), 429, "Overloaded"),
    (ApiUnavailable("down"), 503, "Unhealthy"),
    (ApiBackendError("broke"), 424, "Backend"),
])
def test_tei_errors_have_teis_shape_and_status(exc, status, kind):
    assert tei_routes.error(exc) == (status, {"error": str(exc), "error_type": kind})


def _text_request(model: str, **columns: list[str]) -> Request:
    return Request(model, {n: np.array([[t.encode()] for t in ts], dtype=object)
                           for n, ts in columns.items()})


@pytest.mark.parametrize("api, inputs, outputs, path, body", [
    ("openai", ["TEXT"], ["EMBEDDING"], "/v1/embeddings",
     {"model": "m", "input": ["a cat", "ça"], "encoding_format": "base64"}),
    ("tei", ["TEXT"], ["EMBEDDING"], "/embed", {"inputs": ["a cat", "ça"]}),
    ("tei", ["TEXT"], ["LABEL", "SCORE", "PROBABILITIES"], "/predict",
     {"inputs": [["a cat"], ["ça"]]}),
])
def test_a_scenarios_request_goes_through_the_route_with_the_same_texts(api, inputs, outputs,
                                                                        path, body):
    route = route_for("m", inputs, outputs, api)
    sent = api_request(route, _text_request("m", TEXT=["a cat", "ça"]))
    assert (sent.http_path, json.loads(sent.http_body())) == (path, body)


def test_a_rerank_request_scores_the_texts_against_its_one_query():
    route = route_for("r", ["TEXT", "TEXT_PAIR"], ["SCORE"], "tei")
    one = _text_request("r", TEXT=["q", "q"], TEXT_PAIR=["a", "b"])
    assert json.loads(api_request(route, one).http_body()) == {"query": "q", "texts": ["a", "b"]}
    with pytest.raises(ValueError, match="one query"):
        api_request(route, _text_request("r", TEXT=["q", "other"], TEXT_PAIR=["a", "b"]))


def test_an_answer_must_hold_a_row_per_row_sent():
    route = route_for("m", ["TEXT"], ["EMBEDDING"], Api.OPENAI)
    request = _text_request("m", TEXT=["a", "b"])
    two = json.dumps({"data": [{"embedding": "x"}, {"embedding": "y"}]}).encode()
    assert problem(route, request, two) is None
    assert problem(route, request, b'{"data": []}') == "0 rows answered for 2 sent"
    assert "shape" in problem(route, request, b"[1]")


def test_a_kind_an_api_does_not_serve_is_refused_naming_the_api_that_does():
    with pytest.raises(UserInputError, match="use --api tei"):
        route_for("r", ["TEXT", "TEXT_PAIR"], ["SCORE"], "openai")
    with pytest.raises(UserInputError, match="of no kind"):
        route_for("i", ["IMAGE"], ["LABEL"], "tei")


def test_the_command_line_names_only_the_limits_that_differ():
    argv = command("127.0.0.1:8000", Path("repo"), "0.0.0.0", 8080,
                   Limits(tei_max_inputs=64, auto_truncate=False), ("embedder",), python="py")
    assert argv == ["py", "-m", "tools.api", "--url", "127.0.0.1:8000", "--repository", "repo",
                    "--host", "0.0.0.0", "--port", "8080", "--tei-max-inputs", "64",
                    "--no-auto-truncate", "--tei-model", "embedder"]


def _call(url: str, body: bytes | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture
def gateway_without_triton(tmp_path: Path):
    """A real gateway process whose Triton (a free port nobody listens on) is not there."""
    triton = f"127.0.0.1:{free_ports(1)[0]}"
    (tmp_path / "repo").mkdir()
    server = ApiServer(triton, tmp_path / "repo", log_path=tmp_path / "api.log",
                       limits=Limits(max_body_bytes=1000))
    server.start(timeout_s=60, until=lambda: accepts(server.port))
    try:
        yield f"http://{server.url}"
    finally:
        server.stop()


def _gateway_answers(server: ApiServer) -> bool:
    """Its /health answers (503 without Triton): the gateway itself, not a socket that only
    accepts."""
    try:
        urllib.request.urlopen(server.health_url, timeout=0.5).close()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def test_a_free_port_another_process_took_first_is_chosen_again(tmp_path: Path):
    (tmp_path / "repo").mkdir()
    server = ApiServer(f"127.0.0.1:{free_ports(1)[0]}", tmp_path / "repo",
                       log_path=tmp_path / "api.log")
    taken = server.port
    with socket.socket() as holder:  # another process binds the chosen port first
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        server.start(timeout_s=60, until=lambda: _gateway_answers(server))
        try:
            assert server.port != taken
            assert _call(server.health_url)[0] == 503
        finally:
            server.stop()


def test_a_port_given_and_taken_is_refused_not_moved(tmp_path: Path):
    (tmp_path / "repo").mkdir()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        server = ApiServer(f"127.0.0.1:{free_ports(1)[0]}", tmp_path / "repo", port=taken,
                           log_path=tmp_path / "api.log")
        with pytest.raises(ServerError, match="address already in use"):
            server.start(timeout_s=60, until=lambda: _gateway_answers(server))
    assert server.port == taken


def test_a_gateway_waiting_for_triton_answers_503_in_each_apis_shape(gateway_without_triton):
    base = gateway_without_triton
    status, body = _call(base + "/health")
    assert (status, body["error_type"]) == (503, "Unhealthy")
    status, body = _call(base + "/v1/embeddings", b'{"model": "m", "input": "a"}')
    assert (status, body["error"]["type"], body["error"]["code"]) == (503, "server_error",
                                                                     "unavailable")
    status, body = _call(base + "/embed", b'{"inputs": "a"}')
    assert (status, body["error_type"]) == (503, "Unhealthy")
    assert _call(base + "/v1/models")[0] == 503


def test_bodies_that_are_not_json_or_too_large_get_4xx_in_each_apis_shape(gateway_without_triton):
    base = gateway_without_triton
    status, body = _call(base + "/v1/embeddings", b"{not json")
    assert (status, body["error"]["type"]) == (400, "invalid_request_error")
    status, body = _call(base + "/rerank", b"[1, 2]")
    assert (status, body["error_type"]) == (422, "Validation")
    status, body = _call(base + "/embed", b'{"inputs": "' + b"x" * 2000 + b'"}')
    assert (status, body["error_type"]) == (413, "Validation")
    status, body = _call(base + "/v1/nothing", b"{}")
    assert (status, body["error"]["type"]) == (404, "invalid_request_error")
