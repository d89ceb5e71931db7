"""Tests of ``tools bench``: the tables' ratios and tail target, the plot, the in-process encoder
computing what the server computes, requests for any pipeline, and short real runs against a
server (the built repository, and the toy repository as a user's own models).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tools.bench.command import DEFAULT_TEXTS
from tools.bench.inprocess import InProcessEncoder, LimitResult, read_setup
from tools.bench.report import (format_table, format_variants, save_plot, tail_ratios,
                                variant_rows)
from tools.bench.targets import prepare_requests, resolve
from tools.cli import cli
from tools.load import Point
from tools.loadtest.triton_stats import ModelWindow

TOY = Path(__file__).parent / "fixtures" / "toy_repository"


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
            "c=1 20.0 ms (target <= 1.5 x: pass)") in table
    assert "tail at half load, text_embedding http: P99 16.0 ms at r=60/s = 1.60 x" in table
    assert "(target <= 1.5 x: FAIL)" in table
    assert "tail at half load, image_classification grpc: no c=1 point" in table


def test_the_variants_side_by_side_give_each_protocol_over_its_limit_and_over_the_first():
    limits = [_limit(8, 200.0), dataclasses.replace(_limit(8, 400.0), pipeline="int8")]
    served = [_served("grpc", 8, 180.0), _served("http", 8, 150.0),
              _served("http-unguarded", 8, 160.0),
              _served("grpc", 8, 360.0, pipeline="int8"), _served("http", 8, 270.0, pipeline="int8")]
    rows = variant_rows(limits, served)
    by = {(r["pipeline"], r["protocol"]): r for r in rows}
    assert by[("int8", "grpc")]["over_base"] == pytest.approx(2.0)
    assert by[("int8", "http")]["over_base"] == pytest.approx(1.8)
    assert by[("int8", "http")]["served_over_limit"] == pytest.approx(270 / 400)
    text = format_variants(rows, {"http_guard": True})
    assert "HTTP through the guard, as tools serve puts it" in text
    assert ("HTTP guard, text_embedding: best through it 150.0 req/s, around it 160.0 req/s = "
            "0.938") in text


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
        "bench", "--repository", str(triton_server.model_repository),
        "--url", triton_server.http_url, "--grpc-url", triton_server.grpc_url,
        "--texts", str(texts), "--batch-sizes", "1,4", "--concurrency", "1,4",
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
        assert {t["protocol"] for t in report["pipelines"][pipeline]["tail"]} == {"grpc", "http"}
    assert {(v["pipeline"], v["protocol"]) for v in report["variants"]} == {
        (p, proto) for p in pipelines for proto in ("grpc", "http")}
    assert report["conditions"]["http_guard"] is None  # a given server: not known
    assert report["best_ratio"] == report["pipelines"]["text_embedding"]["best_ratio"]
    assert report["pipelines"]["text_embedding_int8"]["onnx_file"] == "model.int8.xml"
    assert report["pipelines"]["text_embedding_int8"]["runtime"] == "openvino bf16"
    assert report["pipelines"]["text_embedding_bf16"]["runtime"] == "openvino bf16"
    assert report["pipelines"]["text_embedding"]["runtime"] == "onnxruntime"
    assert report["served"][0]["encoder_mean_batch"] == pytest.approx(1.0, abs=0.05)
    assert report["served"][0]["compute_model"] == "minilm_encoder"
    assert (out / "bench.png").stat().st_size > 10_000
    assert "best served / limit" in result.output
    assert "side by side (HTTP as the given server serves it" in result.output


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


def _config(inputs, outputs=("OUT",), max_batch_size=8):
    return {"max_batch_size": max_batch_size,
            "input": [{"name": n, "data_type": t, "dims": ["1"]} for n, t in inputs],
            "output": [{"name": n} for n in outputs]}


def test_requests_are_derived_from_any_pipelines_inputs():
    texts, images = ["one", "two", "three"], [b"\x89PNG-a", b"\xff\xd8-b"]
    single, payload = prepare_requests("enc", _config([("TEXT", "TYPE_STRING")]), texts, images)
    assert payload == "texts" and len(single) == 3
    assert single[1].inputs["TEXT"].tolist() == [[b"two"]] and single[1].outputs == ("OUT",)
    pairs, _ = prepare_requests("rerank", _config([("TEXT", "TYPE_STRING"),
                                                    ("TEXT_PAIR", "TYPE_STRING")]), texts, images)
    assert (pairs[2].inputs["TEXT"].tolist(), pairs[2].inputs["TEXT_PAIR"].tolist()) == (
        [[b"three"]], [[b"one"]])  # a text and the next one
    photos, payload = prepare_requests("img", _config([("IMAGE", "TYPE_STRING")]), texts, images)
    assert payload == "images" and [r.inputs["IMAGE"][0, 0] for r in photos] == images
    unbatched, _ = prepare_requests("u", _config([("TEXT", "TYPE_STRING")], max_batch_size=0),
                                    texts, images)
    assert unbatched[0].inputs["TEXT"].shape == (1,)
    none, why = prepare_requests("raw", _config([("input_ids", "TYPE_INT64")]), texts, images)
    assert none == [] and "no payloads for inputs input_ids (INT64)" in why


def test_a_pipeline_without_a_tokenizer_and_encoder_says_why_it_has_no_in_process_limit():
    targets, notes = resolve(TOY, ["toy_text", "toy_classify", "toy_double"], ["a cat"],
                             explicit=True)
    assert [t.name for t in targets] == ["toy_text", "toy_classify"]
    assert [t.payload for t in targets] == ["texts", "images"]
    assert all(t.setup is None and "not an ensemble" in t.limit_na for t in targets)
    assert notes == ["pipeline toy_double: no payloads for inputs INPUT0 (FP32): tools bench "
                     "sends texts to string inputs and photos to an IMAGE input: skipped"]


def test_an_unknown_pipeline_exits_2_naming_the_known_ones(tmp_path):
    result = CliRunner().invoke(cli, ["bench", "--repository", str(TOY), "--pipelines",
                                      "toy_text,nope", "--output", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "--pipelines: nope not in" in result.output
    assert "(known: toy_classify, toy_double, toy_text)" in result.output


@pytest.mark.server
@pytest.mark.timeout(600)
def test_bench_sweeps_a_users_own_models_through_the_http_guard(tmp_path):
    out = tmp_path / "bench"
    result = CliRunner().invoke(cli, [
        "bench", "--repository", str(TOY), "--pipelines", "toy_text,toy_classify",
        "--concurrency", "1,2", "--duration", "1", "--warmup", "0", "--guard-cost",
        "--output", str(out),
    ])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "bench.json").read_text())
    assert report["conditions"]["http_guard"] is True and report["conditions"]["server"] == "embedded"
    assert {(s["pipeline"], s["protocol"]) for s in report["served"]} == {
        (p, proto) for p in ("toy_text", "toy_classify")
        for proto in ("grpc", "http", "http-unguarded")}
    assert all(s["errors"] == 0 and s["requests"] > 0 for s in report["served"])
    for name in ("toy_text", "toy_classify"):
        figures = report["pipelines"][name]
        assert figures["limit"] is None and "not an ensemble" in figures["limit_na"]
        assert {t["protocol"] for t in figures["tail"]} == {"grpc", "http", "http-unguarded"}
    assert report["pipelines"]["toy_classify"]["payload"] == "images"
    assert "toy_text: best served" in result.output and "in-process limit n/a" in result.output
    assert "HTTP guard, toy_classify: best through it" in result.output
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
