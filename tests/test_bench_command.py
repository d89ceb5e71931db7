"""Tests of ``tools bench``: the tables' ratios and tail target, the plot, the in-process encoder
computing what the server computes, each pipeline's requests taken from its scenario
(``tools.load.scenario``, as ``tools loadtest`` sends them), and short real runs against a server
(the built repository, and pipelines a user adds with ``tools add``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tests.add_helpers import WORDS, save_tokenizer
from tests.scenario_helpers import ids_onnx, linear_onnx, start_spec
from tools.add.command import add_model
from tools.bench.command import DEFAULT_TEXTS
from tools.bench.inprocess import InProcessEncoder, LimitResult, read_setup
from tools.bench.report import (format_table, format_variants, front_costs, save_plot,
                                tail_ratios, variant_rows)
from tools.bench.targets import default_names, payload_of, resolve
from tools.build_repo.spec import load_spec
from tools.cli import cli
from tools.errors import UserInputError
from tools.load import Point
from tools.load.scenario import UnknownScenario, build_scenario
from tools.load.triton_stats import ModelWindow

ROOT = Path(__file__).resolve().parents[1]
VOCABULARY = len(WORDS) + 7  # save_tokenizer's WordPiece vocabulary


def _limit(batch: int, throughput: float, variant: str = "in-process, pad to longest"):
    return LimitResult(variant=variant, batch_size=batch, texts=100, seconds=1.0,
                       throughput=throughput, p50_ms=1.0, p99_ms=2.0)


def _window(model: str, mean_batch: float, queue_ms: float, compute_ms: float) -> ModelWindow:
    return ModelWindow(model, 100, 0, 100, int(100 / mean_batch), mean_batch, queue_ms,
                       compute_ms, None, compute_ms, None, compute_ms + queue_ms)


def _served(protocol: str, concurrency: int, throughput: float, *, p99: float = 20.0,
            rate: float | None = None, pipeline: str = "text_embedding") -> Point:
    models = {pipeline: _window(pipeline, 1.0, 0.0, 0.0),
              "text_tokenizer": _window("text_tokenizer", 1.0, 0.5, 1.0),
              "minilm_encoder": _window("minilm_encoder", 4.0, 1.0, 5.0)}
    return Point(pipeline, protocol, concurrency, rate, 100, 0, 1.0, throughput, 10.0, p99,
                 meters={"triton": models})


def test_format_table_gives_served_over_best_limit_ratio_and_the_encoders_batch():
    limits = [_limit(1, 100.0), _limit(8, 200.0), _limit(32, 150.0)]
    table = format_table(limits, [_served("grpc", 8, 170.0), _served("http", 8, 90.0)])
    grpc_row = next(line for line in table.splitlines() if "grpc" in line)
    http_row = next(line for line in table.splitlines() if "http" in line)
    assert grpc_row.split()[-1] == "0.85"  # 170 / 200
    assert http_row.split()[-1] == "0.45"  # 90 / 200
    assert grpc_row.split()[-3:-1] == ["4.00", "1.0"]  # minilm_encoder computed most: its batch
    assert "limit = in-process, pad to longest, batch 8: 200.0 texts/s" in table


def test_the_tail_ratio_is_the_half_load_p99_over_the_p99_at_concurrency_1_with_a_verdict():
    limits = [_limit(8, 200.0)]
    served = [_served("grpc", 1, 50.0, p99=20.0), _served("grpc", 8, 150.0),
              _served("grpc", 0, 75.0, p99=28.0, rate=75.0),
              _served("http", 1, 40.0, p99=10.0), _served("http", 0, 60.0, p99=16.0, rate=60.0),
              _served("grpc", 0, 30.0, p99=16.0, rate=30.0, pipeline="image_classification")]
    tails = tail_ratios(served)
    assert [(t["protocol"], t["ratio"], t["passed"]) for t in tails[:2]] == [
        ("grpc", pytest.approx(1.4), True), ("http", pytest.approx(1.6), False)]
    assert tails[0]["p99_c1_ms"] == 20.0 and tails[0]["target"] == 1.5
    assert tails[2]["ratio"] is None and tails[2]["passed"] is None  # no c=1 point
    table = format_table(limits, served)
    assert "r=75" in table  # the open-loop row is labelled by its rate
    assert ("tail at half load, text_embedding grpc: P99 28.0 ms at r=75/s = 1.40 x the P99 at "
            "c=1 20.0 ms (target <= 1.5 x: pass; both over the same 100 requests)") in table
    assert tails[0]["same_requests"] is True
    assert "tail at half load, text_embedding http: P99 16.0 ms at r=60/s = 1.60 x" in table
    assert "(target <= 1.5 x: FAIL; both over the same 100 requests)" in table
    assert "tail at half load, image_classification grpc: no c=1 point" in table
    # a c=1 point that counted other requests (cut short, or --tail-cycles 0) is said so
    served[3] = dataclasses.replace(served[3], requests=80)
    assert tail_ratios(served)[1]["same_requests"] is False
    assert ("over 100 and 80 requests, not the same ones: --tail-cycles 1 sends both every one"
            in format_table(limits, served))


def test_the_variants_side_by_side_give_each_protocol_over_its_limit_and_over_the_first():
    limits = [_limit(8, 200.0), dataclasses.replace(_limit(8, 400.0), pipeline="int8")]
    served = [_served("grpc", 8, 180.0), _served("http", 8, 150.0),
              _served("http-direct", 8, 160.0),
              _served("grpc", 8, 360.0, pipeline="int8"), _served("http", 8, 270.0, pipeline="int8")]
    rows = variant_rows(limits, served)
    by = {(r["pipeline"], r["protocol"]): r for r in rows}
    assert by[("int8", "grpc")]["over_base"] == pytest.approx(2.0)
    assert by[("int8", "http")]["over_base"] == pytest.approx(1.8)
    assert by[("int8", "http")]["served_over_limit"] == pytest.approx(270 / 400)
    text = format_variants(rows, {"front": True}, front_costs(served))
    assert "side by side (through the front, as tools serve puts it;" in text
    assert ("the front, HTTP, text_embedding: at c=8 through it 150.0 req/s, around it 160.0 req/s = "
            "0.938; best through 150.0, best around 160.0 = 0.938") in text
    assert not any(r["protocol"] == "http-direct" for r in rows if r["pipeline"] == "int8")


def test_front_cost_compares_the_arms_where_neither_was_refused_not_best_against_best():
    # Through the front, c=32 is refused by the admission (its latency target): 18.6 req/s of
    # goodput. Around it, c=32 queues past the target and gets 50.2. Best over best (44.5 /
    # 50.2) would charge the admission's refusals to the front; at c=8 both carry the same load.
    refused = dataclasses.replace(_served("http", 32, 18.6), errors=11229)
    served = [_served("http", 1, 22.9), _served("http", 8, 44.5), refused,
              _served("http-direct", 1, 23.2), _served("http-direct", 8, 47.8),
              _served("http-direct", 32, 50.2),
              _served("grpc", 8, 49.0), _served("grpc-direct", 8, 50.0)]
    costs = {c["protocol"]: c for c in front_costs(served)}
    assert costs["http"]["concurrency"] == 8
    assert costs["http"]["ratio"] == pytest.approx(44.5 / 47.8)
    assert costs["http"]["best_ratio"] == pytest.approx(44.5 / 50.2)
    assert costs["grpc"]["ratio"] == pytest.approx(0.98)
    lines = format_variants(variant_rows([_limit(8, 60.0)], served), {"front": True},
                            front_costs(served)).splitlines()
    assert any(line.startswith("the front, gRPC, text_embedding: at c=8 through it 49.0 req/s")
               for line in lines)
    # every point of one arm refused: no like-for-like level, said so
    only_refused = [refused, _served("http-direct", 32, 50.2)]
    cost = front_costs(only_refused)[0]
    assert cost["ratio"] is None and cost["concurrency"] is None
    assert "no concurrency without errors in both arms" in format_variants(
        variant_rows([_limit(8, 60.0)], only_refused), {"front": True}, [cost])


def test_save_plot_writes_a_png(tmp_path: Path):
    path = tmp_path / "bench.png"
    save_plot([_limit(1, 100.0), _limit(8, 200.0)],
              [_served("grpc", 1, 50.0), _served("grpc", 8, 150.0), _served("http", 8, 140.0)],
              path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class _RecordingSession:
    def __init__(self, inner):
        self.inner, self.shapes = inner, []

    def run(self, names, feed):
        self.shapes.append(feed["input_ids"].shape)
        return self.inner.run(names, feed)


@pytest.mark.torch
@pytest.mark.timeout(600)
def test_in_process_encoder_runs_the_served_onnx_runner_with_its_config_and_chunks(
    built_repository,
):
    from pipeline_ops.onnx_session import RunnerConfig

    setup = read_setup(built_repository)
    encoder = InProcessEncoder(setup)
    # the served config with every served instance's threads in the one in-process session
    served = RunnerConfig.from_model_config(setup.limit_config())
    assert served.intra_op_threads == setup.instances * setup.intra_op_threads == 2
    assert type(encoder.chunked_runner).__name__ == "OnnxRunner"
    assert encoder.chunked_runner.config == served and served.max_dims["input_ids"] == (256,)
    assert encoder.padded_runner.config == dataclasses.replace(served, run_overhead=0)
    assert encoder.can_chunk

    session = _RecordingSession(encoder.chunked_runner.session)
    encoder.chunked_runner.session = encoder.padded_runner.session = session
    texts = ["short one"] * 4 + [" ".join(["a much longer text"] * 20)] * 4
    padded = encoder.encode(texts)
    assert session.shapes == [(8, 82)]  # one run padded to the longest text
    chunked = encoder.encode(texts, chunked=True)
    assert sorted(session.shapes[1:]) == [(4, 4), (4, 82)]  # the served length chunks
    np.testing.assert_allclose(chunked, padded, atol=1e-5)


@pytest.mark.torch
@pytest.mark.server
@pytest.mark.timeout(600)
def test_in_process_encoder_matches_served_embeddings_when_texts_vary_in_length(triton_server):
    import tritonclient.http as httpclient

    texts = [t for t in DEFAULT_TEXTS.read_text(encoding="utf-8").splitlines() if t][:24]
    encoder = InProcessEncoder(read_setup(triton_server.model_repository))
    padded = encoder.encode(texts)
    chunked = encoder.encode(texts, chunked=True)
    client = httpclient.InferenceServerClient(triton_server.http_url)
    try:
        served = []
        for text in texts:
            item = httpclient.InferInput("TEXT", [1, 1], "BYTES")
            item.set_data_from_numpy(np.array([[text.encode()]], dtype=np.object_))
            served.append(client.infer("text_embedding", [item]).as_numpy("EMBEDDING")[0])
    finally:
        client.close()
    np.testing.assert_allclose(padded, np.stack(served), atol=1e-4)
    np.testing.assert_allclose(chunked, padded, atol=1e-4)


# The system tier: the whole sweep (three pipelines, two protocols, tails; 50 s); the integration
# tier runs the command on the pipelines tools add makes, through the front (below).
@pytest.mark.system
@pytest.mark.torch
@pytest.mark.server
@pytest.mark.load
@pytest.mark.timeout(600)
def test_bench_writes_table_json_and_plot_when_run_against_a_server(triton_server, tmp_path):
    texts = tmp_path / "texts.txt"
    lines = [t for t in DEFAULT_TEXTS.read_text(encoding="utf-8").splitlines() if t][:40]
    texts.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "bench"
    result = CliRunner().invoke(cli, [
        "bench", "--spec", str(ROOT / "repository.yaml"),
        "--repository", str(triton_server.model_repository),
        "--url", triton_server.http_url, "--grpc-url", triton_server.grpc_url,
        "--data", str(texts), "--batch-sizes", "1,4", "--concurrency", "1,4",
        "--duration", "2", "--warmup", "0.5", "--min-seconds", "0", "--output", str(out),
    ])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "bench.json").read_text())
    assert {(r["variant"].split(",")[1].strip(), r["batch_size"]) for r in report["in_process"]} >= {
        ("pad to longest", 1), ("pad to longest", 4)}
    pipelines = ("text_embedding", "text_embedding_int8", "text_embedding_bf16")
    closed = [s for s in report["served"] if s["offered_rps"] is None]
    assert {(s["pipeline"], s["protocol"], s["concurrency"]) for s in closed} == {
        (p, proto, c) for p in pipelines for proto in ("grpc", "http") for c in (1, 4)}
    assert all(s["errors"] == 0 and s["requests"] > 0 for s in report["served"])
    for pipeline in pipelines:  # each against its own in-process limit
        best = max(r["throughput"] for r in report["in_process"] if r["pipeline"] == pipeline)
        top = max(s["throughput"] for s in closed if s["pipeline"] == pipeline)
        assert report["pipelines"][pipeline]["best_ratio"] == pytest.approx(top / best)
        # then an open loop at half of the best served point of each protocol, against c=1
        for tail in report["pipelines"][pipeline]["tail"]:
            own = [s for s in closed if s["pipeline"] == pipeline and s["protocol"] == tail["protocol"]]
            assert tail["offered_rps"] == pytest.approx(max(s["throughput"] for s in own) / 2)
            single = next(s for s in own if s["concurrency"] == 1)
            assert tail["ratio"] == pytest.approx(tail["p99_ms"] / single["p99_ms"])
            assert tail["passed"] == (tail["ratio"] <= 1.5)
            # --tail-cycles 1 (the default): both points sent each of the 40 texts once
            assert tail["same_requests"] and tail["requests"] == single["requests"] == 40
        assert {t["protocol"] for t in report["pipelines"][pipeline]["tail"]} == {"grpc", "http"}
    assert {(v["pipeline"], v["protocol"]) for v in report["variants"]} == {
        (p, proto) for p in pipelines for proto in ("grpc", "http")}
    assert report["conditions"]["front"] is None  # a given server: not known
    assert report["best_ratio"] == report["pipelines"]["text_embedding"]["best_ratio"]
    assert report["pipelines"]["text_embedding_int8"]["onnx_file"] == "model.int8.xml"
    assert report["pipelines"]["text_embedding_int8"]["runtime"] == "openvino fp32"  # int8, fp32 leftovers
    assert report["pipelines"]["text_embedding_bf16"]["runtime"] == "openvino bf16"
    assert report["pipelines"]["text_embedding"]["runtime"] == "onnxruntime"
    assert report["served"][0]["encoder_mean_batch"] == pytest.approx(1.0, abs=0.05)
    assert report["served"][0]["compute_model"] == "minilm_encoder"
    assert (out / "bench.png").stat().st_size > 10_000
    assert "best served / limit" in result.output
    assert "side by side (as the given server serves it;" in result.output


def test_format_table_puts_each_pipeline_against_its_own_limit_and_compares_them():
    fp32 = [_limit(1, 100.0), _limit(8, 200.0)]
    int8 = [dataclasses.replace(_limit(1, 180.0), pipeline="text_embedding_int8"),
            dataclasses.replace(_limit(8, 400.0), pipeline="text_embedding_int8")]
    served = [_served("grpc", 32, 180.0),
              _served("grpc", 32, 380.0, pipeline="text_embedding_int8")]

    table = format_table(fp32 + int8, served)

    rows = table.splitlines()
    assert next(r for r in rows if r.startswith("served text_embedding grpc")).split()[-1] == "0.90"
    assert next(r for r in rows if r.startswith("served text_embedding_int8 grpc")).split()[-1] == "0.95"
    assert "* text_embedding_int8: limit = in-process, pad to longest, batch 8: 400.0 texts/s." in table
    assert "best served text_embedding_int8: 380.0 req/s (grpc c=32) = 2.11 x text_embedding" in table


@pytest.mark.parametrize("groups, threads, expected", [([{"count": 2}], "1", 2),
                                                       ([{"count": 1}], "2", 2),
                                                       ([], "2", 2),
                                                       ([{"count": 2}, {"count": 1}], "1", 3)])
def test_the_in_process_limit_gets_the_cores_of_every_served_instance(groups, threads, expected):
    from tools.bench.inprocess import EncoderSetup

    config = {"name": "enc", "instance_group": groups,
              "parameters": {"intra_op_threads": {"string_value": threads}}}
    setup = EncoderSetup({}, Path("."), config, Path("."))

    assert setup.limit_threads == expected
    assert setup.limit_config()["parameters"]["intra_op_threads"] == {"string_value": str(expected)}
    assert config["parameters"]["intra_op_threads"] == {"string_value": threads}, "a copy is changed"


@pytest.fixture(scope="module")
def onnx_added(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two raw ONNX models added with ``tools add onnx`` and built (no torch, no server), and
    one more added to the spec after the build."""
    from tools.build_repo.pipeline import build_repository

    root = tmp_path_factory.mktemp("bench_onnx")
    spec = start_spec(root)
    save_tokenizer(root / "ids")  # beside token_sum.onnx: its ids stay in this vocabulary
    add_model("onnx", str(ids_onnx(root / "ids" / "token_sum.onnx", VOCABULARY)), "token_sum",
              spec)
    add_model("onnx", str(linear_onnx(root / "scorer" / "scorer.onnx")), "scorer", spec)
    build_repository(spec, root / "repo", progress=False)
    add_model("onnx", str(linear_onnx(root / "later" / "later.onnx")), "later", spec)
    return {"root": root, "spec": spec, "repository": root / "repo"}


def test_each_target_sends_the_requests_of_its_scenario_from_the_spec(onnx_added, tmp_path):
    spec = load_spec(onnx_added["spec"])
    targets, notes = resolve(onnx_added["repository"], spec, ["token_sum", "scorer"],
                             explicit=True)
    assert notes == [] and [t.name for t in targets] == ["token_sum", "scorer"]
    for target in targets:
        scenario = build_scenario(spec, target.name)
        assert target.scenario.digest == scenario.digest  # the very load tools loadtest sends
        assert target.payload == "tensors" and target.texts == ()
        assert target.setup is None and "not an ensemble" in target.limit_na
    ids = targets[0].requests[0].inputs["input_ids"]
    assert ids.dtype == np.int64 and 0 <= ids.min() and ids.max() < VOCABULARY

    data = tmp_path / "features.jsonl"
    data.write_text("".join(json.dumps({"features": [float(i)] * 6}) + "\n" for i in range(3)))
    (target,), _ = resolve(onnx_added["repository"], spec, ["scorer"], data, explicit=True)
    assert target.scenario.labels == ("line-1", "line-2", "line-3")
    assert target.requests[2].inputs["features"].tolist() == [[2.0] * 6]


def test_a_pipeline_the_repository_lacks_is_an_error_when_named_and_skipped_by_default(
    onnx_added,
):
    spec = load_spec(onnx_added["spec"])
    with pytest.raises(UserInputError, match=r"--scenario later: not in .*repo \(built: "
                                             r"scorer, token_sum; build it first: tools "
                                             r"build-repo --spec .* --repository .*\)"):
        resolve(onnx_added["repository"], spec, ["scorer", "later"], explicit=True)
    targets, notes = resolve(onnx_added["repository"], spec, ["scorer", "later", "absent"],
                             explicit=False)
    assert [t.name for t in targets] == ["scorer"]
    assert notes == [f"pipeline later is not in {onnx_added['repository']}: skipped",
                     f"pipeline absent is not in {onnx_added['spec']}: skipped"]
    with pytest.raises(UnknownScenario, match=r"--scenario absent: not a pipeline or model of "
                                              r".* \(known: token_sum, scorer, later\)"):
        resolve(onnx_added["repository"], spec, ["absent"], explicit=True)


def test_without_a_scenario_the_shipped_variants_are_measured_else_every_pipeline_of_the_spec(
    onnx_added,
):
    assert default_names(load_spec(ROOT / "repository.yaml")) == (
        "text_embedding", "text_embedding_int8", "text_embedding_bf16")
    assert default_names(load_spec(onnx_added["spec"])) == ()  # no pipeline: tools add onnx
    # adds a model; naming it is what measures it


def test_the_shipped_pipelines_are_sent_texts_and_photos():
    spec = load_spec(ROOT / "repository.yaml")
    assert payload_of(build_scenario(spec, "text_embedding")) == "texts"
    assert payload_of(build_scenario(spec, "image_classification")) == "images"


@pytest.mark.parametrize("spelling", ["--scenario", "--pipelines"])
def test_an_unknown_scenario_exits_2_naming_the_known_ones(onnx_added, tmp_path, spelling):
    result = CliRunner().invoke(cli, ["bench", "--spec", str(onnx_added["spec"]), "--repository",
                                      str(onnx_added["repository"]), spelling, "scorer,nope",
                                      "--output", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "--scenario nope: not a pipeline or model of" in result.output
    assert "(known: token_sum, scorer, later)" in result.output


def test_data_that_does_not_fit_a_scenario_exits_2_naming_the_line_and_input(onnx_added,
                                                                              tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps({"features": [1.0, 2.0]}) + "\n")
    result = CliRunner().invoke(cli, ["bench", "--spec", str(onnx_added["spec"]), "--repository",
                                      str(onnx_added["repository"]), "--scenario", "scorer",
                                      "--data", str(data), "--output", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert f"{data}:1: input 'features': dim 1 is 2, expected 6" in result.output


@pytest.mark.torch
@pytest.mark.server
@pytest.mark.timeout(900)
def test_bench_sweeps_pipelines_a_user_adds_through_the_front(tmp_path):
    from tests.add_helpers import tiny_bert_folder
    from tools.build_repo.pipeline import build_repository

    spec = start_spec(tmp_path / "project")
    add_model("hf-text-embedding", str(tiny_bert_folder(tmp_path / "project" / "embedder")),
              "cls_embedder", spec, pooling="cls", normalize=False)
    add_model("onnx", str(linear_onnx(tmp_path / "project" / "scorer.onnx")), "scorer", spec)
    build_repository(spec, tmp_path / "repo", progress=False)
    out = tmp_path / "bench"
    result = CliRunner().invoke(cli, [
        "bench", "--spec", str(spec), "--repository", str(tmp_path / "repo"),
        "--scenario", "cls_embedder", "--scenario", "scorer", "--concurrency", "1,2",
        "--duration", "1", "--warmup", "0", "--batch-sizes", "1,4", "--min-seconds", "0",
        "--front-cost", "--output", str(out),
    ])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "bench.json").read_text())
    assert report["conditions"]["front"] is True and report["conditions"]["server"] == "embedded"
    protocols = ("grpc", "grpc-direct", "http", "http-direct")
    assert {(s["pipeline"], s["protocol"]) for s in report["served"]} == {
        (p, proto) for p in ("cls_embedder", "scorer") for proto in protocols}
    assert all(s["errors"] == 0 and s["requests"] > 0 for s in report["served"])
    for name in ("cls_embedder", "scorer"):
        figures = report["pipelines"][name]
        assert figures["requests"] == len(build_scenario(load_spec(spec), name).requests)
        assert {t["protocol"] for t in figures["tail"]} == set(protocols)
        # the tail ratio's two points sent each of the added pipeline's requests once
        assert all(t["same_requests"] and t["requests"] == figures["requests"]
                   for t in figures["tail"])
        # how busy the cores were at both points, by role: the user's own stubs among them
        # (CPU time comes in 10 ms ticks: a role that ran less in a short pass can read 0)
        busy_points = [b for t in figures["tail"] for b in (t["cores_busy"], t["cores_busy_c1"])]
        assert any(role.startswith(f"stubs {name}") for b in busy_points for role in b)
        for tail in figures["tail"]:
            for busy in (tail["cores_busy"], tail["cores_busy_c1"]):
                assert busy["load generator"] > 0
                assert busy["total"] == pytest.approx(
                    sum(v for k, v in busy.items() if k != "total"), abs=0.01)
                assert 0 < busy["total"] <= tail["cpus"] + 0.1
    embedder, scorer = report["pipelines"]["cls_embedder"], report["pipelines"]["scorer"]
    assert embedder["payload"] == "texts" and embedder["requests"] == report["texts"]
    assert "consumed by backend text_tokenizer of cls_embedder_tokenizer" in embedder["load"][0]
    # an added text pipeline (tokenizer -> encoder) gets its in-process limit, on the texts sent
    assert embedder["limit"] is not None and embedder["limit"]["texts"] == report["texts"]
    assert scorer["payload"] == "tensors" and scorer["limit"] is None
    assert "not an ensemble" in scorer["limit_na"]
    assert "generated float32 [batch, 6]: standard normal" in scorer["load"][0]
    assert "scorer: best served" in result.output and "in-process limit n/a" in result.output
    assert re.search(r"tail at half load, scorer grpc: .*; cores busy [0-9.]+ of \d+ at half load "
                     r"\(tritonserver and stubs [0-9.]+, front [0-9.]+, load generator [0-9.]+\), "
                     r"[0-9.]+ at c=1", result.output)
    assert re.search(r"the front, HTTP, scorer: at c=[12] through it", result.output)
    assert re.search(r"the front, gRPC, scorer: at c=[12] through it", result.output)
    assert {(c["pipeline"], c["protocol"]) for c in report["front_cost"]} == {
        (p, proto) for p in ("cls_embedder", "scorer") for proto in ("grpc", "http")}
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _pass(latencies_ms: list[float], *, rate: float | None, failed: int = 0,
          encoder_compute_ms: float = 5.0) -> Point:
    """One pass of a tail point: each request 0.1 s after the last, measured from 0."""
    from tools.stats import Record, Window

    records = [Record(0.1 * i, v, True) for i, v in enumerate(latencies_ms)]
    records += [Record(0.1 * (len(records) + i), 1.0, False, "HTTP 503") for i in range(failed)]
    window = Window(0.0, 0.1 * len(records) + 1.0)
    meters = {"triton": {"minilm_encoder": ModelWindow(
        "minilm_encoder", len(latencies_ms), 0, len(latencies_ms), len(latencies_ms), 1.0,
        1.0, encoder_compute_ms, None, encoder_compute_ms, None, encoder_compute_ms + 1.0,
        {1: len(latencies_ms)})}}
    return Point.from_records(records, window, model="text_embedding", protocol="grpc",
                              concurrency=0 if rate else 1, offered_rps=rate, meters=meters)


def test_passes_of_one_point_pool_their_requests_latencies_and_triton_windows():
    from tools.load.point import pooled

    first = _pass([10.0] * 98 + [50.0, 70.0], rate=None, encoder_compute_ms=4.0)
    second = _pass([20.0] * 98 + [60.0, 90.0], rate=None, failed=2, encoder_compute_ms=8.0)

    both = pooled([first, second])

    assert (both.requests, both.errors) == (200, 2)
    assert both.seconds == pytest.approx(first.seconds + second.seconds)
    assert both.throughput == pytest.approx(200 / (first.seconds + second.seconds))
    # nearest rank over the 200 pooled latencies (98 x 10, 98 x 20, 50, 60, 70, 90 ms):
    # P99 is rank 198, P50 rank 100; alone, each pass's P99 is its rank 99 (50 and 60 ms)
    assert both.p99_ms == 60.0 and both.p50_ms == 20.0
    assert first.p99_ms == 50.0 and second.p99_ms == 60.0
    assert both.first_error == "HTTP 503"
    encoder = both.models["minilm_encoder"]
    assert (encoder.requests, encoder.executions, encoder.batch_executions) == (200, 200, {1: 200})
    assert encoder.compute_ms == pytest.approx(6.0) and encoder.mean_batch == 1.0
    assert [(p["requests"], p["p99_ms"]) for p in both.to_dict()["passes"]] == [(100, 50.0),
                                                                                (100, 60.0)]
    assert pooled([first]) is first and "passes" not in first.to_dict()
    with pytest.raises(ValueError, match="share model, protocol and pacing"):
        pooled([first, _pass([10.0], rate=5.0)])


def test_cores_busy_is_the_mean_of_the_passes_by_role_and_shows_in_the_tail_line():
    from tools.bench.report import _tail_line, cores_busy
    from tools.load.point import pooled

    def metered(point: Point, cores: dict[str, float]) -> Point:
        return dataclasses.replace(point, meters={**point.meters, "cores": cores})

    halves = [metered(_pass([10.0] * 5, rate=4.0), {"tritonserver": 0.2, "stubs enc": 1.0,
                                                    "front": 0.1, "load generator": 0.1,
                                                    "stubs idle": 0.0}),
              metered(_pass([20.0] * 5, rate=4.0), {"tritonserver": 0.4, "stubs enc": 1.2,
                                                    "front": 0.1, "load generator": 0.3,
                                                    "stubs idle": 0.0})]
    single = metered(_pass([8.0] * 10, rate=None), {"tritonserver": 0.1, "stubs enc": 0.8,
                                                    "load generator": 0.1})
    half = pooled(halves)
    busy = cores_busy(half)
    assert busy == pytest.approx({"tritonserver": 0.3, "stubs enc": 1.1, "front": 0.1,
                                  "load generator": 0.2, "total": 1.7})  # "stubs idle" left out
    assert cores_busy(single) == pytest.approx({"tritonserver": 0.1, "stubs enc": 0.8,
                                                "load generator": 0.1, "total": 1.0})
    assert cores_busy(_pass([1.0], rate=None)) is None  # not metered: a server given by URL
    (tail,) = tail_ratios([single, half])
    assert tail["cores_busy"] == busy and tail["cores_busy_c1"] == cores_busy(single)
    line = _tail_line({**tail, "cpus": 2})
    assert line.endswith("; cores busy 1.70 of 2 at half load (tritonserver and stubs 1.40, "
                         "front 0.10, load generator 0.20), 1.00 at c=1"), line
    unmetered = tail_ratios([_pass([8.0] * 10, rate=None), pooled([_pass([9.0] * 5, rate=4.0)])])
    assert "cores busy" not in _tail_line(unmetered[0])


def test_the_tail_pair_alternates_pass_by_pass_and_is_pooled(monkeypatch, tmp_path):
    """c=1 and half load measured back to back, alternating (c=1, half, half, c=1, ...), the
    rate from the best of every level (c=1's first pass included), each pass every request once."""
    from tools.bench import sweep

    calls: list[tuple[str, float | None, int]] = []
    metered: list[list[str]] = []
    throughput = {8: 80.0, 1: 30.0}

    def fake_measure(requests, sender, url, stats_url, *, concurrency=0, rate=None, label=None,
                     cycles=0, meters=(), **timing):
        calls.append(("half" if rate else f"c={concurrency}", rate, cycles))
        metered.append([meter.name for meter in meters])
        point = _pass([10.0 + len(calls)] * 20, rate=rate)
        point = dataclasses.replace(point, concurrency=concurrency, protocol=label)
        if not rate:
            point = dataclasses.replace(point, throughput=throughput[concurrency])
        return point

    monkeypatch.setattr(sweep, "measure", fake_measure)
    plan = sweep.BenchPlan(repository=tmp_path, spec_path=tmp_path, data=None,
                           pipelines=("text_embedding",), explicit=True, batch_sizes=(1,),
                           levels=(1, 8), protocols=("grpc",), duration_s=1.0, warmup_s=0.1,
                           min_seconds=0.0, half_load=True, output=tmp_path, tail_cycles=3)
    run = sweep.BenchRun(plan, [])
    target = dataclasses.make_dataclass("T", ["name", "requests"])("text_embedding", ())

    sweep._sweep(run, target, {"grpc": "127.0.0.1:1", "stats": "127.0.0.1:2"}, lambda _: None,
                 {"load generator": [os.getpid()]})

    assert [c[0] for c in calls] == ["c=8", "c=1", "half", "half", "c=1", "c=1", "half"]
    assert metered == [[]] + [["cores"]] * 6  # each tail pass watches the cores, c=8 does not
    assert {c[1] for c in calls if c[0] == "half"} == {40.0}  # half of c=8's 80 req/s
    assert [c[2] for c in calls] == [0, 1, 1, 1, 1, 1, 1]  # each tail pass: every request once
    single, eight, half = run.served
    assert (single.concurrency, eight.concurrency, half.offered_rps) == (1, 8, 40.0)
    assert single.requests == half.requests == 60  # three passes of 20 each
    assert single.p99_ms == 16.0  # the slowest c=1 pass (the 6th call) is in the pool
    (tail,) = tail_ratios(run.served)
    # each round's two passes side by side: calls 2/3, 5/4 and 6/7 (latency 10 + call number)
    assert tail["p99_c1_passes_ms"] == [12.0, 15.0, 16.0]
    assert tail["p99_passes_ms"] == [13.0, 14.0, 17.0]
    assert tail["pass_ratios"] == pytest.approx([13 / 12, 14 / 15, 17 / 16])
    assert tail["ratio"] == pytest.approx(17 / 16)
