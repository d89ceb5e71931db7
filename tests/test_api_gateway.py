"""The OpenAI and TEI routes in front of a real tritonserver, on pipelines ``tools add`` makes
from all-MiniLM-L6-v2's real weights: the shipped MiniLM folder as an embedder, a cross-encoder
and a 3-label classifier (MiniLM with seeded heads, as the add tests make them).

The official ``openai`` client and huggingface_hub's ``InferenceClient`` call the gateway; the
answers are compared with sentence-transformers and transformers. Refused requests get a 4xx in
their API's own shape, and the next request succeeds. ``tools loadtest --api`` and ``tools bench
--api-cost`` run through it.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.add_helpers import minilm_classifier_folder
from tests.conftest import ServerFactory
from tests.waits import wait_until
from tests.whole_path_models import minilm_path
from tools import paths
from tools.add.command import add_model
from tools.api.server import ApiServer

pytestmark = [pytest.mark.torch, pytest.mark.server, pytest.mark.timeout(1800)]

# 40 texts: short and long (past the 256 tokens the pipeline keeps), non-Latin scripts, emoji,
# repeated words, numbers and punctuation.
TEXTS = [
    "A man is eating food.", "The cat sits outside on the warm stones.",
    "How do I bake bread without yeast?", "The quick brown fox jumps over the lazy dog!",
    "Le chat est assis sur le tapis.", "Der schnelle braune Fuchs springt über den faulen Hund.",
    "Быстрая коричневая лиса прыгает через ленивую собаку.", "猫がマットの上に座っている。",
    "我喜欢在周末去公园散步。", "القطة تجلس على السجادة", "बिल्ली चटाई पर बैठी है।",
    "고양이가 매트 위에 앉아 있다.", "Η γάτα κάθεται στο χαλί.", "חתול יושב על השטיח",
    "🙂", "I love pizza 🍕🍕🍕 and tacos 🌮!", "🚀 launch at 09:30 — T-minus 10, 9, 8…",
    "buffalo " * 8, "the the the the the the the the the the", "ok",
    "Réservez votre séjour à l'hôtel « Le Château » dès aujourd'hui !",
    "E = mc^2, ∑ x_i / n, √2 ≈ 1.414", "https://example.com/a/b?c=d&e=f#g",
    "COVID-19 vaccines were approved in December 2020.", "lorem ipsum dolor sit amet " * 80,
    "A sentence with\ttabs and\nnewlines inside it.", "What's the time? It's 5 o'clock.",
    "Transformers map token sequences to contextual vectors.",
    "Stock markets fell sharply on Monday as investors worried about rates.",
    "The recipe calls for two cups of flour and one egg.", "Mixed 中文 and English words",
    "ÀÉÎÕÜ àéîõü ßç", "  leading and trailing spaces  ", "UPPER CASE TEXT ONLY",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z", "1234567890 " * 30,
    "Emoji only: 😀😃😄😁😆😅😂🤣", "Sentence number thirty-eight.",
    "The last but one text of the list.", "And the fortieth, the last one.",
]
PAIRS_QUERY = "How do I bake bread without yeast?"
DOCUMENTS = ["Mix flour, water and baking soda, then bake it.",
             "Stock markets fell sharply on Monday.", "Bread needs an oven and some patience.",
             "Yeast makes dough rise.", "The cat sits outside on the warm stones."]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    """Three pipelines added with ``tools add``, built, served by tritonserver, and the gateway
    in front of tritonserver's own HTTP port."""
    from tools.build_repo.pipeline import build_repository

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = tmp_path_factory.mktemp("api_gateway")
    spec = root / "repository.yaml"
    add_model("hf-text-embedding", str(minilm_path()), "embedder", spec)
    add_model("hf-cross-encoder", str(minilm_classifier_folder(root / "reranker", 1, seed=3)),
              "reranker", spec)
    add_model("hf-sequence-classification",
              str(minilm_classifier_folder(root / "clf3", 3, seed=0)), "clf3", spec)
    build_repository(spec, root / "repo", progress=False)
    factory = ServerFactory(root)
    try:
        server = factory(root / "repo", timeout_s=300)
        with ApiServer(server.triton_http_url, root / "repo", log_path=root / "api.log") as api:
            yield {"root": root, "spec": spec, "server": server, "api": api,
                   "base": f"http://{api.url}"}
    finally:
        factory.stop_all()


def _post(served, path: str, body: object | bytes) -> tuple[int, object]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(served["base"] + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _get(served, path: str) -> tuple[int, object]:
    try:
        with urllib.request.urlopen(served["base"] + path, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _openai(served):
    from openai import OpenAI

    return OpenAI(base_url=served["base"] + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def minilm():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_path()), device="cpu")


def _largest_difference(served_vectors, reference) -> float:
    return float(np.abs(np.asarray(served_vectors, dtype=np.float32) - reference).max())


def _vector(embedding) -> np.ndarray:
    """A float list, or the base64 string the client hands back when base64 was asked for."""
    if isinstance(embedding, str):
        return np.frombuffer(base64.b64decode(embedding), dtype="<f4")
    return np.asarray(embedding, dtype=np.float32)


def test_openai_client_embeds_a_string_like_sentence_transformers(served, minilm):
    client = _openai(served)
    reference = minilm.encode(["A man is eating food."])
    # no encoding_format: the client asks for base64 and decodes it itself
    for encoding in ({}, {"encoding_format": "float"}, {"encoding_format": "base64"}):
        answer = client.embeddings.create(model="embedder", input="A man is eating food.",
                                          **encoding)
        assert [d.index for d in answer.data] == [0]
        assert answer.model == "embedder"
        assert _largest_difference([_vector(answer.data[0].embedding)], reference) <= 1e-4


def test_openai_client_embeds_forty_varied_texts_like_sentence_transformers(served, minilm):
    client = _openai(served)
    reference = minilm.encode(TEXTS)
    for encoding in ({}, {"encoding_format": "float"}, {"encoding_format": "base64"}):
        answer = client.embeddings.create(model="embedder", input=TEXTS, **encoding)
        assert [d.index for d in answer.data] == list(range(len(TEXTS)))
        difference = _largest_difference([_vector(d.embedding) for d in answer.data], reference)
        print(f"openai client {encoding or 'base64 (default)'}: max abs {difference:.2e}")
        assert difference <= 1e-4


def test_tei_client_feature_extraction_matches_sentence_transformers(served, minilm,
                                                                     monkeypatch):
    import huggingface_hub.constants
    from huggingface_hub import InferenceClient

    # The module sets HF_HUB_OFFLINE for the model folders; the client must reach the gateway.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    client = InferenceClient(model=served["base"] + "/embed")
    single = client.feature_extraction("A man is eating food.")
    assert single.shape == (1, 384)
    assert _largest_difference(single, minilm.encode(["A man is eating food."])) <= 1e-4
    halves = [client.feature_extraction(TEXTS[:20]), client.feature_extraction(TEXTS[20:])]
    difference = _largest_difference(np.concatenate(halves), minilm.encode(TEXTS))
    print(f"TEI client feature_extraction: max abs {difference:.2e}")
    assert difference <= 1e-4


def test_usage_counts_the_tokens_the_pipelines_tokenizer_keeps(served):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(minilm_path() / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    expected = sum(min(len(e.ids), 256) for e in tokenizer.encode_batch(TEXTS))
    answer = _openai(served).embeddings.create(model="embedder", input=TEXTS)
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == expected


def test_token_id_lists_embed_like_the_texts_they_encode(served, minilm):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(minilm_path() / "tokenizer.json"))
    tokenizer.no_padding()
    ids = [e.ids for e in tokenizer.encode_batch(TEXTS[:5])]
    answer = _openai(served).embeddings.create(model="embedder", input=ids)
    assert _largest_difference([d.embedding for d in answer.data],
                               minilm.encode(TEXTS[:5])) <= 1e-4
    assert answer.usage.prompt_tokens == sum(map(len, ids))
    one = _openai(served).embeddings.create(model="embedder", input=ids[0])
    assert _largest_difference([one.data[0].embedding], minilm.encode(TEXTS[:1])) <= 1e-4


def _cross_encoder(served, **kwargs):
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(served["root"] / "reranker"), device="cpu", **kwargs)


def test_rerank_ranks_texts_like_cross_encoder_predict(served):
    status, ranks = _post(served, "/rerank", {"query": PAIRS_QUERY, "texts": DOCUMENTS,
                                              "return_text": True})
    assert status == 200
    reference = _cross_encoder(served).predict([(PAIRS_QUERY, d) for d in DOCUMENTS])
    assert [r["index"] for r in ranks] == list(np.argsort(-reference, kind="stable"))
    assert all(r["text"] == DOCUMENTS[r["index"]] for r in ranks)
    scores = np.array([r["score"] for r in sorted(ranks, key=lambda r: r["index"])])
    difference = float(np.abs(scores - reference).max())
    print(f"/rerank vs CrossEncoder.predict: max abs {difference:.2e}")
    assert difference <= 1e-4
    assert [r["score"] for r in ranks] == sorted(scores, reverse=True)


def test_rerank_raw_scores_are_the_cross_encoders_logits(served):
    import torch

    status, ranks = _post(served, "/rerank", {"query": PAIRS_QUERY, "texts": DOCUMENTS,
                                              "raw_scores": True})
    assert status == 200 and all("text" not in r for r in ranks)
    logits = _cross_encoder(served, activation_fn=torch.nn.Identity()).predict(
        [(PAIRS_QUERY, d) for d in DOCUMENTS])
    scores = np.array([r["score"] for r in sorted(ranks, key=lambda r: r["index"])])
    assert float(np.abs(scores - logits).max()) <= 1e-3  # float32 sigmoid, inverted


def _transformers_logits(served, texts):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = str(served["root"] / "clf3")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        batch = tokenizer(texts, return_tensors="pt", padding=True, truncation=True,
                          max_length=128)
        return model(**batch).logits.numpy()


def test_predict_scores_every_label_like_transformers_softmax(served):
    texts = TEXTS[:6]
    logits = _transformers_logits(served, texts)
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    status, single = _post(served, "/predict", {"inputs": texts[0]})
    assert status == 200
    assert [p["label"] for p in single] == [f"label_{i}" for i in np.argsort(-probabilities[0])]
    status, batch = _post(served, "/predict", {"inputs": [[t] for t in texts]})
    assert status == 200 and len(batch) == len(texts)
    served_scores = np.array([[next(p["score"] for p in row if p["label"] == f"label_{i}")
                               for i in range(3)] for row in batch])
    difference = float(np.abs(served_scores - probabilities).max())
    print(f"/predict vs transformers softmax: max abs {difference:.2e}")
    assert difference <= 1e-4
    status, raw = _post(served, "/predict", {"inputs": [[t] for t in texts], "raw_scores": True})
    raw_scores = np.array([[next(p["score"] for p in row if p["label"] == f"label_{i}")
                            for i in range(3)] for row in raw])
    assert status == 200 and float(np.abs(raw_scores - logits).max()) <= 1e-4


def _triton_requests(served, model: str) -> tuple[int, int]:
    """(requests, inferences) Triton has answered for ``model`` so far."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(served["server"].triton_http_url)
    try:
        (stats,) = client.get_inference_statistics(model)["model_stats"]
    finally:
        client.close()
    return int(stats["inference_stats"]["success"]["count"]), int(stats["inference_count"])


@pytest.mark.parametrize("count, requests", [(8, 1), (40, 2)])
def test_a_list_is_one_triton_request_of_its_size_or_full_batches(served, count, requests):
    before = _triton_requests(served, "embedder")
    status, _ = _post(served, "/v1/embeddings", {"model": "embedder", "input": TEXTS[:count]})
    # Triton records an ensemble's statistics once its last step's request is released, which
    # can be a moment after the answer left.
    def recorded():
        now = _triton_requests(served, "embedder")
        return now if now[1] - before[1] >= count else None

    after = wait_until(recorded, 15, f"{count} inferences of embedder recorded")
    assert status == 200
    assert (after[0] - before[0], after[1] - before[1]) == (requests, count)


# (path, body, status, where the error is in the API's shape)
REFUSED = [
    ("/v1/embeddings", {"model": "embedder", "input": []}, 400, "openai"),
    ("/v1/embeddings", {"model": "embedder", "input": ""}, 400, "openai"),
    ("/v1/embeddings", {"model": "text-embedding-3-small", "input": "a"}, 404, "openai"),
    ("/v1/embeddings", {"model": "reranker", "input": "a"}, 404, "openai"),
    ("/v1/embeddings", {"model": "embedder", "input": {"text": "a"}}, 400, "openai"),
    ("/v1/embeddings", {"model": "embedder", "input": ["a", 3]}, 400, "openai"),
    ("/v1/embeddings", {"model": "embedder", "input": ["a"] * 10_000}, 400, "openai"),
    ("/v1/embeddings", {"model": "embedder", "input": [[101, 99999, 102]]}, 400, "openai"),
    ("/v1/embeddings", {"model": "embedder", "input": "a", "encoding_format": "int8"}, 400,
     "openai"),
    ("/v1/embeddings", b"{'model': 'embedder'", 400, "openai"),
    ("/embed", {"inputs": []}, 400, "tei"),
    ("/embed", {"inputs": 3}, 422, "tei"),
    ("/embed", {"inputs": ["a"] * 10_000}, 422, "tei"),
    ("/embed", {"inputs": "   "}, 422, "tei"),
    ("/embed", {"inputs": "a", "normalize": "yes"}, 422, "tei"),
    ("/embed", b"not json", 422, "tei"),
    ("/embed", {"inputs": "x" * 70_000}, 422, "tei"),
    ("/embed", {"inputs": "lorem ipsum " * 200, "truncate": False}, 422, "tei"),
    ("/rerank", {"query": "q", "texts": []}, 400, "tei"),
    ("/rerank", {"query": "q", "texts": "a"}, 422, "tei"),
    ("/rerank", {"texts": ["a"]}, 422, "tei"),
    ("/predict", {"inputs": ["a pair", "of texts"]}, 422, "tei"),
    ("/predict", {"inputs": [[1]]}, 422, "tei"),
]


@pytest.mark.parametrize("path, body, status, api", REFUSED,
                         ids=[f"{p}-{i}" for i, (p, *_) in enumerate(REFUSED)])
def test_a_refused_request_gets_4xx_in_its_apis_shape_and_the_next_succeeds(served, path, body,
                                                                           status, api):
    got, answer = _post(served, path, body)
    assert got == status, answer
    if api == "openai":
        assert set(answer["error"]) == {"message", "type", "param", "code"}
        assert answer["error"]["type"] == "invalid_request_error" and answer["error"]["message"]
    else:
        assert set(answer) == {"error", "error_type"}
        assert answer["error_type"] == ("Empty" if status == 400 else "Validation")
    ok = {"/v1/embeddings": {"model": "embedder", "input": "a"}, "/embed": {"inputs": "a"},
          "/rerank": {"query": "q", "texts": ["a"]}, "/predict": {"inputs": "a"}}[path]
    assert _post(served, path, ok)[0] == 200


def test_truncate_true_cuts_a_long_text_as_sentence_transformers_does(served, minilm):
    text = "lorem ipsum dolor sit amet " * 80
    status, vectors = _post(served, "/embed", {"inputs": text, "truncate": True})
    assert status == 200
    assert _largest_difference(vectors, minilm.encode([text])) <= 1e-4


def test_models_info_and_health_describe_what_is_served(served):
    status, models = _get(served, "/v1/models")
    assert status == 200 and [m["id"] for m in models["data"]] == ["embedder"]
    assert models["data"][0]["object"] == "model"
    assert _get(served, "/v1/models/embedder")[1]["id"] == "embedder"
    assert _get(served, "/v1/models/clf3")[0] == 404
    status, info = _get(served, "/info")
    assert status == 200
    assert (info["model_id"], info["max_input_length"], info["max_client_batch_size"]) == (
        "embedder", 256, 32)
    assert {p["name"]: (p["kind"], p["routes"]) for p in info["pipelines"]} == {
        "clf3": ("classifier", ["/predict"]), "embedder": ("embedding", ["/v1/embeddings", "/embed"]),
        "reranker": ("reranker", ["/rerank"])}
    assert served["api"].ready()


@pytest.mark.load
@pytest.mark.parametrize("api, scenario", [("openai", "embedder"), ("tei", "reranker"),
                                           ("tei", "clf3")])
def test_loadtest_through_an_api_passes_the_gate_of_its_slo(served, tmp_path, api, scenario):
    server = served["server"]
    result = subprocess.run(
        [sys.executable, "-m", "tools.cli", "loadtest", "--spec", str(served["spec"]),
         "--url", server.triton_http_url, "--api-url", served["api"].url, "--api", api,
         "--scenario", scenario, "--concurrency", "2", "--warmup", "1", "--duration", "3",
         "--timeout", "120", "--output", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=paths.CHECKOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / f"{scenario}-{api}" / "summary.json").read_text())
    (gated,) = summary["results"]
    assert gated["violations"] == [] and gated["summary"]["errors"] == 0
    assert gated["summary"]["requests"] > 0
    assert f"through the {api} API" in result.stderr


@pytest.mark.system  # a measurement (25 s); the routes' answers and gates are the integration tier's
@pytest.mark.load
def test_bench_reports_the_gateways_cost_next_to_direct_http(served, tmp_path):
    server = served["server"]
    result = subprocess.run(
        [sys.executable, "-m", "tools.cli", "bench", "--spec", str(served["spec"]),
         "--repository", str(served["root"] / "repo"), "--url", server.triton_http_url,
         "--grpc-url", server.grpc_url, "--scenario", "embedder", "--protocol", "http",
         "--concurrency", "2", "--no-half-load", "--api-cost", "--api-rounds", "2",
         "--warmup", "1", "--duration", "2", "--batch-sizes", "1", "--min-seconds", "0.5",
         "--output", str(tmp_path)],
        capture_output=True, text=True, timeout=900, cwd=paths.CHECKOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    (cost,) = json.loads((tmp_path / "bench.json").read_text())["api_cost"]
    assert (cost["pipeline"], cost["path"], cost["concurrency"]) == ("embedder",
                                                                     "/v1/embeddings", 2)
    assert len(cost["ratios"]) == 2 and all(r > 0 for r in cost["ratios"])
    assert all(p["errors"] == 0 for p in cost["direct"] + cost["through"])
    assert all(us > 0 for us in cost["gateway_cpu_us_per_request"])
    assert "API gateway cost embedder c=2" in result.stdout


def test_the_front_serves_the_apis_and_kserve_v2_on_one_public_port(served, tmp_path):
    """HAProxy (``tools/front``) in front of tritonserver and the gateway, as ``tools serve``
    will run them: the API paths go to the gateway, ``/v2/`` to tritonserver."""
    from tools.api.kinds import front_paths
    from tools.front.plan import FrontPlan
    from tools.front.process import FrontProcess, find_haproxy
    from tools.net import free_ports

    haproxy = find_haproxy()
    if haproxy is None:
        pytest.skip("haproxy is not installed (apt-get install haproxy)")
    server, api = served["server"], served["api"]
    http_port, grpc_port = free_ports(2)
    front = FrontProcess(
        FrontPlan.from_repository(served["root"] / "repo", gateway_paths=front_paths()), haproxy,
        http_port=http_port, grpc_port=grpc_port,
        triton_http_port=int(server.triton_http_url.rpartition(":")[2]),
        triton_grpc_port=int(server.triton_grpc_url.rpartition(":")[2]), watch_pid=server.pid,
        gateway_port=api.port)
    front.start(tmp_path / "front.log")
    try:
        public = {**served, "base": f"http://127.0.0.1:{http_port}"}
        status, answer = _post(public, "/v1/embeddings", {"model": "embedder", "input": ["a", "b"]})
        assert status == 200 and len(answer["data"]) == 2
        assert _post(public, "/rerank", {"query": "q", "texts": ["a"]})[0] == 200
        assert _get(public, "/health")[0] == 200
        assert _get(public, "/v1/models")[1]["data"][0]["id"] == "embedder"
        with urllib.request.urlopen(f"{public['base']}/v2/models/embedder/ready",
                                    timeout=30) as response:
            assert response.status == 200  # tritonserver's own API, untouched
        status, refused = _post(public, "/embed", {"inputs": []})
        assert (status, refused["error_type"]) == (400, "Empty")
    finally:
        front.stop()
