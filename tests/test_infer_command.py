"""``tools infer`` against the toy repository over HTTP and gRPC, plus its input building.

The server-backed tests share one embedded server for the module; the input-building tests
need no server.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tools.cli import cli
from tools.errors import UserInputError
from tools.infer import ServedModel, ServedTensor, build_inputs
from tools.serve.server import EmbeddedServer

PROTOCOLS = ["http", "grpc"]


@pytest.fixture(scope="module")
def toy_server(toy_repository, tmp_path_factory):
    log = tmp_path_factory.mktemp("infer-server") / "tritonserver.log"
    with EmbeddedServer(toy_repository, log_path=log, exit_timeout_s=5) as server:
        yield server


def _infer(server: EmbeddedServer, protocol: str, *args: str):
    endpoint = ["--url", server.http_url] if protocol == "http" else ["--grpc-url", server.grpc_url]
    return CliRunner().invoke(cli, ["infer", *args, "--protocol", protocol, *endpoint])


@pytest.mark.server
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_infer_returns_the_models_output_and_latency_when_given_json_input(toy_server, protocol):
    values = [[1.5, -2.0, 3.25], [0.0, 4.0, 8.0]]

    result = _infer(
        toy_server, protocol, "toy_double", "--input", f"INPUT0={json.dumps(values)}", "--json"
    )

    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    np.testing.assert_array_equal(report["outputs"]["OUTPUT0"], 2 * np.array(values))
    assert report["latency_ms"] > 0


@pytest.mark.server
def test_infer_prints_latency_in_ms_and_vector_summary_for_numeric_output(toy_server):
    result = _infer(toy_server, "http", "toy_double", "--input", "INPUT0=[3, 4]")

    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0].startswith("model toy_double: ")
    assert result.output.splitlines()[0].endswith(" ms")
    assert "dims 2, L2 norm 10.0000, values [6.0000, 8.0000]" in result.output


@pytest.mark.server
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_infer_summarises_an_embedding_with_dims_and_norm_when_given_text(toy_server, protocol):
    result = _infer(toy_server, protocol, "toy_text", "--text", "a cat sat on the mat")

    assert result.exit_code == 0, result.output
    config = text_format.Parse(
        (Path(toy_server.model_repository) / "toy_text" / "config.pbtxt").read_text(),
        model_config_pb2.ModelConfig(),
    )
    (embedding,) = [o for o in config.output if o.name == "EMBEDDING"]
    assert f"dims {embedding.dims[0]}, L2 norm 1.0000" in result.output


@pytest.mark.server
def test_infer_sends_one_row_per_text_when_several_texts_given(toy_server):
    result = _infer(toy_server, "grpc", "toy_text", "--text", "first", "--text", "second", "--json")

    assert result.exit_code == 0, result.output
    embedding = np.array(json.loads(result.output)["outputs"]["EMBEDDING"])
    assert embedding.shape[0] == 2
    assert not np.allclose(embedding[0], embedding[1])


@pytest.mark.server
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_infer_shows_a_top_k_table_when_the_model_classifies_an_image(
    toy_server, protocol, tmp_path
):
    image = tmp_path / "photo.bin"
    image.write_bytes(bytes(range(256)) * 3 + b"\x02" * 200)
    labels = (
        (Path(toy_server.model_repository) / "toy_classify" / "1" / "labels.txt")
        .read_text()
        .split()
    )

    table = _infer(toy_server, protocol, "toy_classify", "--image", str(image))
    raw = _infer(toy_server, protocol, "toy_classify", "--image", str(image), "--json")

    assert table.exit_code == 0 and raw.exit_code == 0, table.output + raw.output
    outputs = json.loads(raw.output)["outputs"]
    scores, names = outputs["SCORE"][0], outputs["LABEL"][0]
    assert scores == sorted(scores, reverse=True)
    assert set(names) <= set(labels)
    rows = [line.split() for line in table.output.splitlines() if line.strip()[:1].isdigit()]
    assert [row[2] for row in rows] == names  # rank, class index, label, score
    assert [int(row[1]) for row in rows] == outputs["CLASS_INDEX"][0]


@pytest.mark.server
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_infer_fails_with_the_servers_message_when_the_model_rejects_the_input(
    toy_server, protocol
):
    result = _infer(toy_server, protocol, "toy_text", "--text", "")

    assert result.exit_code == 1
    assert "input 'TEXT': empty text" in result.output
    assert "toy_text" in result.output


@pytest.mark.server
def test_infer_fails_with_the_servers_message_when_the_model_is_unknown(toy_server):
    result = _infer(toy_server, "http", "no_such_model", "--text", "x")

    assert result.exit_code == 1
    assert "unknown model: 'no_such_model'" in result.output


@pytest.mark.server
def test_infer_is_a_usage_error_naming_the_missing_input(toy_server):
    result = _infer(toy_server, "http", "toy_double")

    assert result.exit_code == 2
    assert "needs input INPUT0 (FP32 [-1])" in result.output


def test_infer_fails_naming_the_url_when_no_server_listens():
    result = CliRunner().invoke(
        cli, ["infer", "toy_double", "--input", "INPUT0=[1]", "--url", "127.0.0.1:9"]
    )

    assert result.exit_code == 1
    assert "cannot reach tritonserver at 127.0.0.1:9 (http)" in result.output


def _spec(max_batch_size: int = 8) -> ServedModel:
    return ServedModel(
        "m",
        max_batch_size,
        inputs=(
            ServedTensor("TEXT", "BYTES", (1,)),
            ServedTensor("IMAGE", "BYTES", (1,)),
            ServedTensor("ids", "INT64", (-1,)),
            ServedTensor("flag", "BOOL", (1,), optional=True),
        ),
        outputs=(ServedTensor("out", "FP32", (4,)),),
    )


def test_build_inputs_routes_text_and_image_bytes_to_the_inputs_named_for_them(tmp_path):
    image = tmp_path / "x.png"
    image.write_bytes(b"\x89PNG fake")

    inputs = build_inputs(_spec(), texts=["héllo"], images=[image], raw=["ids=[1, 2, 3]"])

    assert inputs["TEXT"].shape == (1, 1) and inputs["TEXT"][0, 0] == "héllo".encode()
    assert inputs["IMAGE"][0, 0] == image.read_bytes()
    assert inputs["ids"].dtype == np.int64 and inputs["ids"].shape == (1, 3)  # batch axis added
    assert "flag" not in inputs  # optional inputs may be left out


def test_build_inputs_refuses_several_rows_when_the_model_does_not_batch():
    with pytest.raises(UserInputError, match="does not batch"):
        build_inputs(_spec(max_batch_size=0), texts=["a", "b"], raw=["ids=[1]"])


def test_build_inputs_names_the_models_inputs_when_given_an_unknown_one():
    with pytest.raises(UserInputError, match=r"no input 'idz' \(inputs: TEXT, IMAGE, ids, flag\)"):
        build_inputs(_spec(), texts=["a"], raw=["idz=[1]"])


def test_build_inputs_refuses_values_of_the_wrong_type():
    with pytest.raises(UserInputError, match="--input ids: not INT64 values"):
        build_inputs(_spec(), texts=["a"], raw=['ids=["one"]'])


def _run_tools(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """``tools`` as a real process, so interpreter-exit noise (``__del__`` errors) shows too."""
    return subprocess.run(
        [sys.executable, "-m", "tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        cwd=Path(__file__).resolve().parents[1],
    )


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:8000", "give host:port without the http:// scheme"),
        ("127.0.0.1:notaport", "is not host:port with a port from 1 to 65535"),
        ("127.0.0.1:70000", "is not host:port with a port from 1 to 65535"),
        ("127.0.0.1", "is not host:port with a port from 1 to 65535"),
    ],
)
def test_infer_refuses_a_url_that_is_not_host_port_with_one_line_and_exit_code_2(
    protocol, url, expected
):
    result = _run_tools("infer", "x", "--protocol", protocol, "--url", url)

    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.stderr
    assert f"--url {url!r}" in errors[0] and expected in errors[0]
    assert result.stderr.strip().endswith(errors[0])


def test_infer_grpc_gives_up_on_model_metadata_after_timeout_when_the_server_never_answers():
    # A socket that accepts connections but never speaks HTTP/2: without a deadline on the
    # metadata call, gRPC waits out its own 20 s connection attempt.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"127.0.0.1:{silent.getsockname()[1]}"
        start = time.monotonic()
        result = _run_tools("infer", "x", "--protocol", "grpc", "--grpc-url", url, "--timeout", "2")
        seconds = time.monotonic() - start

    assert result.returncode == 1, result.stderr
    assert result.stderr.strip() == f"Error: model 'x' at {url} (grpc): Deadline Exceeded"
    assert seconds < 15, seconds  # 2 s deadline + interpreter start-up, far below 20 s


def _entities(*rows: list[dict]):
    from tools.infer import InferResult

    spec = ServedModel("ner", 8, inputs=(ServedTensor("TEXT", "BYTES", (1,)),),
                       outputs=(ServedTensor("ENTITIES", "BYTES", (1,)),))
    values = np.array([[json.dumps(row).encode()] for row in rows], dtype=object)
    return InferResult(spec, {"ENTITIES": values}, 3.0)


PARIS = {"entity_group": "LOC", "score": 0.98765, "word": "paris", "start": 37, "end": 42}
TOKEN = {"entity": "B-PER", "score": 0.5, "index": 1, "word": "john", "start": 0, "end": 4}


def test_render_prints_a_token_classifiers_entities_as_a_table_per_text():
    from tools.infer import render

    lines = render(_entities([PARIS], [], [TOKEN])).splitlines()

    assert lines[1:] == [
        "ENTITIES BYTES shape [3, 1]",
        "  row 0: 1 entity",
        "    entity_group        score  start    end  word",
        "    LOC                0.9877     37     42  paris",
        "  row 1: 0 entities",
        "  row 2: 1 entity",
        "    entity              score  start    end  index  word",
        "    B-PER              0.5000      0      4      1  john",
    ]


def test_as_json_decodes_entities_into_objects_and_leaves_other_strings_alone():
    from tools.infer import as_json

    assert json.loads(as_json(_entities([PARIS])))["outputs"]["ENTITIES"] == [[[PARIS]]]
    other = _entities([PARIS])
    other.outputs["ENTITIES"] = np.array([[b'{"not": "entities"}']], dtype=object)
    assert json.loads(as_json(other))["outputs"]["ENTITIES"] == [['{"not": "entities"}']]
