"""Tests of ``tools bench``: the table's ratio, the plot, the in-process encoder computing what the
server computes, and one short real run against the embedded server.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tools.bench.command import DEFAULT_TEXTS, format_table, half_load_tails, save_plot
from tools.bench.inprocess import InProcessEncoder, LimitResult, read_setup
from tools.bench.served import ServedResult
from tools.cli import cli


def _limit(batch: int, throughput: float, variant: str = "in-process, pad to longest"):
    return LimitResult(variant=variant, batch_size=batch, texts=100, seconds=1.0,
                       throughput=throughput, p50_ms=1.0, p99_ms=2.0)


def _served(protocol: str, concurrency: int, throughput: float) -> ServedResult:
    return ServedResult(protocol=protocol, concurrency=concurrency, requests=100, errors=0,
                        seconds=1.0, throughput=throughput, p50_ms=10.0, p99_ms=20.0,
                        encoder_mean_batch=4.0, encoder_queue_ms=1.0, encoder_compute_ms=5.0)


def test_format_table_gives_served_over_best_limit_ratio():
    limits = [_limit(1, 100.0), _limit(8, 200.0), _limit(32, 150.0)]
    table = format_table(limits, [_served("grpc", 8, 170.0), _served("http", 8, 90.0)])
    grpc_row = next(line for line in table.splitlines() if "grpc" in line)
    http_row = next(line for line in table.splitlines() if "http" in line)
    assert grpc_row.split()[-1] == "0.85"  # 170 / 200
    assert http_row.split()[-1] == "0.45"  # 90 / 200
    assert "limit = in-process, pad to longest, batch 8: 200.0 texts/s" in table


def test_half_load_tail_is_the_open_loop_p99_over_the_unloaded_p50_with_a_verdict():
    limits = [_limit(8, 200.0)]
    unloaded = dataclasses.replace(_served("grpc", 1, 50.0), p50_ms=8.0)
    half = dataclasses.replace(_served("grpc", 0, 75.0), p99_ms=30.0, offered_rps=75.0)
    http_half = dataclasses.replace(_served("http", 0, 60.0), p99_ms=16.0, offered_rps=60.0)
    served = [unloaded, _served("grpc", 8, 150.0), half, http_half]
    tails = half_load_tails(served)
    assert tails[0]["ratio"] == pytest.approx(30.0 / 8.0) and tails[0]["unloaded_p50_ms"] == 8.0
    assert tails[1]["ratio"] is None  # no http c=1 point
    table = format_table(limits, served)
    assert "r=75" in table  # the open-loop row is labelled by its rate
    assert ("tail at half load, text_embedding grpc: P99 30.0 ms at r=75/s = 3.8 x the unloaded "
            "P50 8.0 ms (target <= 2.5 x: not met)") in table
    assert "tail at half load, text_embedding http: no c=1 point" in table


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
        # then an open loop at half of the best served point of each protocol
        for tail in report["pipelines"][pipeline]["half_load"]:
            own = [s for s in closed if s["pipeline"] == pipeline and s["protocol"] == tail["protocol"]]
            assert tail["offered_rps"] == pytest.approx(max(s["throughput"] for s in own) / 2)
            assert tail["ratio"] == pytest.approx(tail["p99_ms"] / tail["unloaded_p50_ms"])
        assert {t["protocol"] for t in report["pipelines"][pipeline]["half_load"]} == {"grpc", "http"}
    assert report["best_ratio"] == report["pipelines"]["text_embedding"]["best_ratio"]
    assert report["pipelines"]["text_embedding_int8"]["onnx_file"] == "model.int8.xml"
    assert report["pipelines"]["text_embedding_int8"]["runtime"] == "openvino bf16"
    assert report["pipelines"]["text_embedding_bf16"]["runtime"] == "openvino bf16"
    assert report["pipelines"]["text_embedding"]["runtime"] == "onnxruntime"
    assert report["served"][0]["encoder_mean_batch"] == pytest.approx(1.0, abs=0.05)
    assert (out / "bench.png").stat().st_size > 10_000
    assert "best served / limit" in result.output


def test_format_table_puts_each_pipeline_against_its_own_limit_and_compares_them():
    fp32 = [_limit(1, 100.0), _limit(8, 200.0)]
    int8 = [dataclasses.replace(_limit(1, 180.0), pipeline="text_embedding_int8"),
            dataclasses.replace(_limit(8, 400.0), pipeline="text_embedding_int8")]
    served = [_served("grpc", 32, 180.0),
              dataclasses.replace(_served("grpc", 32, 380.0), pipeline="text_embedding_int8")]

    table = format_table(fp32 + int8, served)

    rows = table.splitlines()
    assert next(r for r in rows if r.startswith("served text_embedding grpc")).split()[-1] == "0.90"
    assert next(r for r in rows if r.startswith("served text_embedding_int8 grpc")).split()[-1] == "0.95"
    assert "* text_embedding_int8: limit = in-process, pad to longest, batch 8: 400.0 texts/s." in table
    assert "best served text_embedding_int8: 380.0 texts/s (grpc c=32) = 2.11 x text_embedding" in table


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
