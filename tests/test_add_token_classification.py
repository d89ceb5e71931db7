"""``tools add hf-token-classification``: TEXT -> ENTITIES, as transformers'
``pipeline("token-classification", aggregation_strategy=...)`` finds them.

The classifier is ``BertForTokenClassification`` on all-MiniLM-L6-v2's real weights with a seeded
head and B-/I- labels (PER, LOC, ORG, MISC), saved as a folder by the test and added once with
``tools add`` (``simple``). The other four strategies share its tokenizer and classifier: each
gets the postprocess and pipeline the recipe writes for it (``--aggregation``), as a user adds a
strategy by editing the spec. One build, one server; every strategy is compared with the
transformers pipeline over HTTP and gRPC on the build's parity texts (names and places, CJK,
Arabic, Cyrillic, Devanagari, emoji, punctuation runs, one character, a text over the length
limit). Then the load test gates it with the SLO ``tools add`` wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tests.add_helpers import (
    PROTOCOLS,
    infer_inputs,
    minilm_token_classifier_folder,
    text_batch,
)
from tests.conftest import ServerFactory
from tests.waits import counts_once_recorded, model_counts
from tools import paths
from tools.add import recipes
from tools.add.command import add_model
from tools.build_repo.entity_parity import AGGREGATIONS, PARITY_TEXTS

pytestmark = [pytest.mark.torch, pytest.mark.server, pytest.mark.timeout(1500)]
MAX_LENGTH = 128  # the folder's model_max_length: the last parity text is cut there
OTHER_STRATEGIES = [s for s in AGGREGATIONS if s != "simple"]


def _pipeline(strategy: str) -> str:
    return "ner" if strategy == "simple" else f"ner_{strategy}"


def _add_strategy(spec: Path, folder: Path, strategy: str) -> None:
    """The postprocess and pipeline the recipe writes for ``strategy``, on ``ner``'s tokenizer
    and classifier."""
    from tools.add.spec_file import write_spec

    name = _pipeline(strategy)
    written = recipes.hf_token_classification(folder, name, spec.parent, 2, strategy)
    blocks = {"python_models": [b for b in written.blocks["python_models"]
                                if b.startswith(f"  {name}_postprocess:")],
              "pipelines": [b.replace(f"{name}_tokenizer", "ner_tokenizer")
                            .replace(f"{name}_classifier", "ner_classifier")
                            for b in written.blocks["pipelines"]]}
    write_spec(spec, blocks, [f"{name}_postprocess", name])


@pytest.fixture(scope="module")
def ner(tmp_path_factory: pytest.TempPathFactory):
    """The classifier added with ``tools add``, four more strategies beside it, built, served."""
    from tools.build_repo.pipeline import build_repository

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = tmp_path_factory.mktemp("add_token_classification")
    folder = minilm_token_classifier_folder(root / "ner-folder", max_length=MAX_LENGTH)
    spec = root / "repository.yaml"
    add_model("hf-token-classification", str(folder), "ner", spec)
    for strategy in OTHER_STRATEGIES:
        _add_strategy(spec, folder, strategy)
    result = build_repository(spec, root / "repo", progress=False)
    factory = ServerFactory(root)
    try:
        yield {"root": root, "spec": spec, "folder": folder, "result": result,
               "server": factory(root / "repo", timeout_s=300)}
    finally:
        factory.stop_all()


@lru_cache(maxsize=1)
def _reference_pipeline(folder: str):
    from transformers import AutoModelForTokenClassification, AutoTokenizer, pipeline

    model = AutoModelForTokenClassification.from_pretrained(folder).eval()
    return pipeline("token-classification", model=model,
                    tokenizer=AutoTokenizer.from_pretrained(folder), device="cpu")


@lru_cache(maxsize=None)
def _reference(folder: str, strategy: str, texts: tuple[str, ...]) -> list[list[dict]]:
    """``pipeline(...)(texts, aggregation_strategy=strategy)`` with plain scores."""
    found = _reference_pipeline(folder)(list(texts), aggregation_strategy=strategy)
    return [[{k: float(v) if k == "score" else v for k, v in e.items()} for e in text]
            for text in found]


def _served(server, protocol: str, strategy: str, texts: list[str]) -> list[list[dict]]:
    answer = infer_inputs(server, protocol, _pipeline(strategy), {"TEXT": text_batch(texts)},
                          ["ENTITIES"])["ENTITIES"]
    assert answer.shape == (len(texts), 1)
    return [json.loads(value.decode("utf-8")) for value in answer[:, 0]]


def _without_scores(found: list[list[dict]]) -> list[list[dict]]:
    return [[{k: v for k, v in e.items() if k != "score"} for e in text] for text in found]


def _max_score_difference(served: list[list[dict]], reference: list[list[dict]]) -> float:
    return max((abs(a["score"] - b["score"]) for x, y in zip(served, reference)
                for a, b in zip(x, y)), default=0.0)


def test_the_recipe_writes_offsets_a_postprocess_and_a_task_the_server_reports(ner):
    import tritonclient.http as http

    from tools.build_repo.spec import load_spec

    spec = load_spec(ner["spec"])
    assert [t.name for t in spec.find("ner_tokenizer").outputs] == [
        "input_ids", "attention_mask", "offsets", "special_tokens_mask"]
    assert dict(spec.find("ner_tokenizer").parameters)["max_length"] == str(MAX_LENGTH)
    assert [(t.name, t.shape) for t in spec.find("ner_classifier").outputs] == [
        ("logits", ("batch", "sequence", 9))]
    for strategy in AGGREGATIONS:
        postprocess = dict(spec.find(f"{_pipeline(strategy)}_postprocess").parameters)
        assert postprocess["aggregation_strategy"] == strategy
    assert [(t.name, t.dtype) for t in spec.find("ner").outputs] == [("ENTITIES", "string")]
    client = http.InferenceServerClient(ner["server"].http_url)
    try:
        config = client.get_model_config("ner")  # what a gateway reads to pick its route
    finally:
        client.close()
    assert config["parameters"]["task"] == {"string_value": "token-classification"}


def test_the_build_checked_every_strategys_entities_against_transformers(ner):
    result = ner["result"]["ner_classifier"]
    figures = result.parity["entities"]
    assert [f["strategy"] for f in figures] == list(AGGREGATIONS)
    assert all(f["ok"] and f["texts"] == len(PARITY_TEXTS) for f in figures)
    assert max(f["max_abs"] for f in figures) <= 1e-4
    assert result.parity_max_abs["onnxruntime"] <= 1e-4
    manifest = json.loads((ner["root"] / "repo" / "build_manifest.json").read_text())
    assert manifest["models"]["ner_classifier"]["stages"]["parity_entities"]["status"] == "done"


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("strategy", AGGREGATIONS)
def test_served_entities_equal_the_transformers_pipeline(ner, protocol, strategy):
    texts = list(PARITY_TEXTS)
    served = _served(ner["server"], protocol, strategy, texts)
    reference = _reference(str(ner["folder"]), strategy, tuple(texts))
    difference = _max_score_difference(served, reference)
    print(f"{strategy} over {protocol}: {sum(map(len, reference))} entities in {len(texts)} "
          f"texts, max score difference {difference:.2e}")
    assert _without_scores(served) == _without_scores(reference)
    assert difference <= 1e-4
    for text, entities in zip(texts, served):  # the offsets index the text as sent
        assert all(0 <= e["start"] < e["end"] <= len(text) for e in entities)


def test_the_strategies_give_different_answers_on_these_texts(ner):
    counts = {s: sum(map(len, _reference(str(ner["folder"]), s, PARITY_TEXTS)))
              for s in AGGREGATIONS}
    assert counts["none"] > counts["simple"] > counts["first"]  # tokens merge, then words
    first, average, maximum = (_reference(str(ner["folder"]), s, PARITY_TEXTS)
                               for s in ("first", "average", "max"))
    assert first != average and first != maximum


def test_a_text_over_the_length_limit_is_cut_where_transformers_cuts_it(ner):
    text = "Angela Merkel met Emmanuel Macron in Paris. " * 100
    (served,) = _served(ner["server"], "grpc", "simple", [text])
    (reference,) = _reference(str(ner["folder"]), "simple", (text,))
    assert _without_scores([served]) == _without_scores([reference])
    assert served and max(e["end"] for e in served) < len(text) // 4  # 128 tokens, not 1000


def test_concurrent_requests_are_batched_and_each_gets_its_own_texts_entities(ner):
    texts = list(PARITY_TEXTS)
    requests = [texts[i:i + 1 + i % 3] for i in range(len(texts))] * 2
    reference = dict(zip(texts, _reference(str(ner["folder"]), "simple", PARITY_TEXTS)))
    before = model_counts(ner["server"].http_url, "ner_postprocess")

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda t: _served(ner["server"], "grpc", "simple", t), requests))

    for batch, answer in zip(requests, answers):
        assert _without_scores(answer) == _without_scores([reference[t] for t in batch])
    texts_sent = sum(map(len, requests))
    after = counts_once_recorded(ner["server"].http_url, "ner_postprocess", before, texts_sent)
    inferences, executions = after[0] - before[0], after[1] - before[1]
    print(f"ner_postprocess: {inferences} texts in {executions} executions")
    assert inferences == texts_sent
    assert executions < len(requests)  # requests of different lengths shared executions


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_bad_request_fails_alone_with_a_clear_error_while_others_are_answered(ner, protocol):
    from tritonclient.utils import InferenceServerException

    bad = {"empty": ([""], "input 'TEXT' row 0 is an empty string"),
           "over the limit": (["x" * 70_000], "is 70000 bytes, above the limit of 65536 bytes"),
           "whitespace": ([" \n"], "row 0 holds only whitespace")}
    good = ["John Smith lives in New York.", "A"]
    reference = _reference(str(ner["folder"]), "simple", tuple(good))

    def send(texts):
        try:
            return _served(ner["server"], protocol, "simple", texts)
        except InferenceServerException as exc:
            return exc

    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(send, [good, *(t for t, _ in bad.values()), good]))
    assert _without_scores(answers[0]) == _without_scores(reference) == _without_scores(answers[-1])
    for (what, (_, message)), answer in zip(bad.items(), answers[1:-1]):
        assert isinstance(answer, InferenceServerException), what
        assert message in answer.message(), (what, answer.message())


def test_a_text_of_the_wrong_type_is_refused_naming_the_input(ner):
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="TEXT"):
        infer_inputs(ner["server"], "http", "ner", {"TEXT": np.array([[1.5]], np.float32)},
                     ["ENTITIES"])


def test_tools_infer_prints_the_entities_as_a_table(ner):
    from tools.cli import cli

    text = "Angela Merkel met Emmanuel Macron in Paris."
    result = CliRunner().invoke(cli, ["infer", "ner", "--text", text,
                                      "--url", ner["server"].http_url])
    assert result.exit_code == 0, result.output
    (reference,) = _reference(str(ner["folder"]), "simple", (text,))
    lines = result.output.splitlines()
    assert f"  row 0: {len(reference)} entities" in lines
    assert lines[lines.index(f"  row 0: {len(reference)} entities") + 1].split() == [
        "entity_group", "score", "start", "end", "word"]
    for entity in reference:
        row = (f"{entity['entity_group']:<16} {entity['score']:>8.4f} {entity['start']:>6} "
               f"{entity['end']:>6}  {entity['word']}")
        assert f"    {row}" in lines


@pytest.mark.load
def test_loadtest_passes_the_gate_tools_add_wrote(ner, tmp_path):
    server = ner["server"]
    result = subprocess.run(
        [sys.executable, "-m", "tools.cli", "loadtest", "--spec", str(ner["spec"]),
         "--url", server.http_url, "--grpc-url", server.grpc_url, "--output", str(tmp_path),
         "--scenario", "ner", "--warmup", "1", "--duration", "3", "--timeout", "120"],
        capture_output=True, text=True, timeout=600, cwd=paths.CHECKOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    for protocol in PROTOCOLS:
        summary = json.loads((tmp_path / f"ner-{protocol}" / "summary.json").read_text())
        (gated,) = summary["results"]
        assert gated["targets_from"] == str(ner["root"] / "slo.yaml")
        assert gated["summary"]["ok"] > 0 and gated["summary"]["errors"] == 0
        (inputs,) = summary["load"]["ner"]["inputs"]
        assert "backend text_tokenizer of ner_tokenizer" in inputs
        assert f"SLO PASS ner/{protocol}" in result.stdout


@pytest.mark.system  # a two-minute tune budget; tune on recorded trials: test_tune_recorded.py
@pytest.mark.load
@pytest.mark.timeout(900)
def test_tune_finishes_with_a_winner(ner, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "tools.cli", "tune", "--spec", str(ner["spec"]), "--repository",
         str(ner["root"] / "repo"), "--output", str(tmp_path), "--protocol", "grpc",
         "--scenario", "ner", "--budget-minutes", "2", "--concurrency", "2,4",
         "--warmup", "1", "--duration", "3"],
        capture_output=True, text=True, timeout=720, cwd=paths.CHECKOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((tmp_path / "ner" / "results.json").read_text())
    tuned = {m for t in data["trials"] for m in t["settings"]}
    assert tuned == {"ner_tokenizer", "ner_classifier", "ner_postprocess"}
    assert data["best"] is not None and "winner: trial" in result.stdout


def test_tei_predict_answers_the_entities_through_the_gateway(ner, tmp_path):
    import urllib.request

    from tools.api.server import ApiServer

    server = ner["server"]
    texts = list(PARITY_TEXTS)
    with ApiServer(server.http_url, ner["root"] / "repo", log_path=tmp_path / "api.log") as api:
        def post(body: dict):
            request = urllib.request.Request(f"http://{api.url}/predict",
                                             data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=60) as answer:
                return json.loads(answer.read())

        batch = post({"inputs": [[t] for t in texts]})
        single = post({"inputs": texts[0]})
        with urllib.request.urlopen(f"http://{api.url}/info", timeout=10) as answer:
            info = json.loads(answer.read())
    # /predict's rule picks the first token-classification pipeline by name: ner (simple)
    reference = _reference(str(ner["folder"]), "simple", tuple(texts))
    assert _without_scores(batch) == _without_scores(reference)
    assert _max_score_difference(batch, reference) <= 1e-4
    assert single == batch[0]
    kinds = {p["name"]: p["kind"] for p in info["pipelines"]}
    assert {kinds[_pipeline(s)] for s in AGGREGATIONS} == {"token-classification"}
