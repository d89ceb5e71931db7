"""The front (HAProxy and its admission controller) before a real tritonserver.

One server on the toy repository plus ``toy_capped`` (a model with a 300 ms P99 objective in its
config, as ``tools build-repo`` renders it from the SLO file), behind the front, for the module:
inference through the front is tritonserver's own answer; what the front refuses (oversized
bodies and messages, chunked and compressed bodies, a bad Inference-Header-Content-Length, a JSON
shape that aborts Triton 2.51) never reaches tritonserver and leaves it serving; over a model's
cap requests are refused, well-formed, after the hold. tests/test_front_admission.py has the
algorithm and the controller on a clock of their own; tests/test_reliability_http_framing.py the
framing corpus.
"""

from __future__ import annotations

import concurrent.futures
import json
import shutil
import socket
import time
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from server_helpers import slow_bodies
from tools.front import admission
from tools.front.plan import Limits
from tools.serve.server import EmbeddedServer

pytestmark = pytest.mark.server

LIMITS = Limits(max_body_bytes=1 << 20, max_grpc_message_bytes=1 << 20, request_timeout_s=5,
                server_timeout_s=2)
CAPPED = """name: "toy_capped"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
        { name: "DELAY_MS" data_type: TYPE_FP32 dims: [ 1 ] optional: true } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
dynamic_batching { max_queue_delay_microseconds: 1000 }
parameters { key: "admission_p99_ms" value { string_value: "300" } }
"""
SLOW_MS = 300.0  # per batch of up to 8 on two instances: each request takes the whole objective


@pytest.fixture(scope="module")
def fronted(toy_repository: Path, tmp_path_factory: pytest.TempPathFactory):
    """The toy repository plus ``toy_capped``, served behind the front, for the whole module."""
    repo = tmp_path_factory.mktemp("front") / "repo"
    shutil.copytree(toy_repository, repo, ignore=shutil.ignore_patterns("__pycache__", "README.md"))
    shutil.copytree(repo / "toy_double", repo / "toy_capped")
    (repo / "toy_capped" / "config.pbtxt").write_text(CAPPED)
    server = EmbeddedServer(repo, front=LIMITS, log_path=repo.parent / "tritonserver.log",
                            exit_timeout_s=5)
    server.start(timeout_s=120)
    try:
        yield server
    finally:
        server.stop()


def _double(model: str = "toy_double", delay_ms: float | None = None, shape=(1, 4)) -> dict:
    body = {"inputs": [{"name": "INPUT0", "shape": list(shape), "datatype": "FP32",
                        "data": [1, 2, 3, 4]}]}
    if delay_ms is not None:
        body["inputs"].append({"name": "DELAY_MS", "shape": [1, 1], "datatype": "FP32",
                               "data": [delay_ms]})
    return body


def _exchange(url: str, head: str, body: bytes = b"", timeout_s: float = 10) -> tuple[int, dict, bytes]:
    """One raw HTTP/1.1 request; (status, headers, body) of the answer."""
    host, _, port = url.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(head.encode("latin-1") + body)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        raw_head, _, rest = data.partition(b"\r\n\r\n")
        lines = raw_head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
        length = int(headers.get("content-length", 0))
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
    return int(lines[0].split()[1]), headers, rest[:length]


def _post(url: str, body: bytes, extra: str = "", model: str = "toy_double") -> tuple[int, dict, bytes]:
    head = (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {url}\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n")
    return _exchange(url, head, body)


def _infer_ok(url: str) -> np.ndarray:
    status, _, body = _post(url, json.dumps(_double()).encode())
    assert status == 200, body
    return np.array(json.loads(body)["outputs"][0]["data"], dtype=np.float32)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _rss(server: EmbeddedServer) -> int:
    return psutil.Process(server.pid).memory_info().rss


def test_inference_through_the_front_is_tritonservers_own_answer_over_http_and_grpc(fronted):
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    for module, public, own in ((httpclient, fronted.http_url, fronted.triton_http_url),
                                (grpcclient, fronted.grpc_url, fronted.triton_grpc_url)):
        answers = []
        for url in (public, own):
            client = module.InferenceServerClient(url)
            tensor = module.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(x)
            answers.append(client.infer("toy_double", [tensor]).as_numpy("OUTPUT0"))
            assert client.is_model_ready("toy_capped")
            assert client.get_model_metadata("toy_capped")
        assert np.array_equal(answers[0], answers[1]) and np.array_equal(answers[0], 2 * x)
    assert fronted.http_url != fronted.triton_http_url and fronted.front.running


def test_an_oversized_body_is_refused_413_before_tritonserver_reads_it(fronted):
    before = _rss(fronted)
    huge = 64 << 20
    head = (f"POST /v2/models/toy_double/infer HTTP/1.1\r\nHost: x\r\nContent-Type: "
            f"application/json\r\nContent-Length: {huge}\r\n\r\n")
    status, _, body = _exchange(fronted.http_url, head, b"{" * 1000)
    assert status == 413 and json.loads(body)["error"] == f"request body over {1 << 20} bytes"
    assert _rss(fronted) - before < 16 << 20, "tritonserver never saw the body"
    assert np.array_equal(_infer_ok(fronted.http_url), [2, 4, 6, 8])


def test_a_200_mb_grpc_request_is_refused_with_resource_exhausted_and_memory_stays_flat(fronted):
    before = _rss(fronted)
    client = grpcclient.InferenceServerClient(fronted.grpc_url)
    big = np.zeros((1, 50_000_000), dtype=np.float32)  # 200 MB
    tensor = grpcclient.InferInput("INPUT0", list(big.shape), "FP32")
    tensor.set_data_from_numpy(big)
    with pytest.raises(InferenceServerException) as refused:
        client.infer("toy_double", [tensor], client_timeout=60)
    assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED", refused.value
    assert "over the front's limit of 1048576 bytes" in refused.value.message()
    assert _rss(fronted) - before < 16 << 20, "tritonserver never saw the message"
    haproxy = [p for p in psutil.Process(fronted.front._proc.pid).children(recursive=True)]
    assert haproxy and max(p.memory_info().rss for p in haproxy) < 200 << 20, "nor held it"
    small = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    small.set_data_from_numpy(np.ones((1, 4), np.float32))
    assert np.array_equal(client.infer("toy_double", [small]).as_numpy("OUTPUT0"), 2 * np.ones((1, 4)))


def test_chunked_compressed_and_a_bad_inference_header_length_are_refused_alone(fronted):
    body = json.dumps(_double()).encode()
    chunked = (f"POST /v2/models/toy_double/infer HTTP/1.1\r\nHost: x\r\n"
               f"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
               f"{len(body):x}\r\n").encode() + body + b"\r\n0\r\n\r\n"
    status, _, answer = _exchange(fronted.http_url, chunked.decode("latin-1"))
    assert status == 411 and "chunked" in json.loads(answer)["error"]
    status, _, answer = _post(fronted.http_url, body, "Content-Encoding: gzip\r\n")
    assert status == 415 and "uncompressed" in json.loads(answer)["error"]
    for value in ("99999999999", "12x", str(len(body) + 1)):
        status, _, answer = _post(fronted.http_url, body, f"Inference-Header-Content-Length: {value}\r\n")
        assert status == 400 and "Inference-Header-Content-Length" in json.loads(answer)["error"], value
    status, _, _ = _post(fronted.http_url, body, f"Inference-Header-Content-Length: {len(body)}\r\n")
    assert status == 200
    compressed = grpcclient.InferenceServerClient(fronted.grpc_url)
    tensor = grpcclient.InferInput("INPUT0", [1, 4000], "FP32")  # compresses well: gRPC does
    tensor.set_data_from_numpy(np.ones((1, 4000), np.float32))
    with pytest.raises(InferenceServerException) as refused:
        compressed.infer("toy_double", [tensor], compression_algorithm="gzip")
    assert refused.value.status() == "StatusCode.UNIMPLEMENTED", refused.value
    assert np.array_equal(_infer_ok(fronted.http_url), [2, 4, 6, 8])


def test_a_json_shape_that_aborts_triton_251_is_refused_and_the_server_keeps_serving(fronted):
    pid = fronted.pid
    replies = [_post(fronted.http_url, json.dumps(_double(shape=shape)).encode())
               for shape in ([1, 2 ** 40], [2 ** 31, 2 ** 31], [1, 1, 2 ** 40], [1, 4])]
    assert [status for status, _, _ in replies] == [400, 400, 400, 200], replies
    assert "shape [1,1099511627776] has 1099511627776 elements, more than the request body's" \
        in json.loads(replies[0][2])["error"]
    # an input with a huge shape behind a normal one, and the binary-tensor form's JSON header
    two = _double()
    two["inputs"].append({"name": "DELAY_MS", "shape": [2 ** 20, 2 ** 20], "datatype": "FP32",
                          "data": [1]})
    assert _post(fronted.http_url, json.dumps(two).encode())[0] == 400
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2 ** 40], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 16}}]}).encode()
    status, _, _ = _post(fronted.http_url, header + bytes(16),
                         f"Inference-Header-Content-Length: {len(header)}\r\n")
    assert status == 400
    assert fronted.poll() is None and fronted.pid == pid
    assert np.array_equal(_infer_ok(fronted.http_url), [2, 4, 6, 8])


def test_slow_clients_holding_connections_do_not_stop_others_being_served(fronted):
    slow = slow_bodies(fronted.http_url, 64, 100_000)
    try:
        answers = [_infer_ok(fronted.http_url) for _ in range(20)]
        # the front waits for a slow body at most request_timeout_s, then answers 408
        slow[0].settimeout(LIMITS.request_timeout_s + 5)
        status = slow[0].recv(64)
    finally:
        for sock in slow:
            sock.close()
    assert all(np.array_equal(a, [2, 4, 6, 8]) for a in answers)
    assert status.startswith(b"HTTP/1.1 408"), status


def _overload_http(url: str, users: int, seconds: float) -> list[tuple[int, dict, bytes, float]]:
    body = json.dumps(_double("toy_capped", SLOW_MS)).encode()

    def user(_):
        replies, end = [], time.monotonic() + seconds
        while time.monotonic() < end:
            start = time.monotonic()
            status, headers, answer = _post(url, body, model="toy_capped")
            replies.append((status, headers, answer, time.monotonic() - start))
        return replies

    with concurrent.futures.ThreadPoolExecutor(users) as pool:
        return [r for replies in pool.map(user, range(users)) for r in replies]


def test_over_its_cap_a_model_is_refused_over_http_after_the_hold_with_retry_after(fronted):
    # Every request takes the whole 300 ms objective: the controller brings the cap down from
    # the cold-start one, and 48 users get refusals, each held, then 503 with the hint.
    replies = _overload_http(fronted.http_url, users=48, seconds=6)
    caps = {b: c.requests for b, c in fronted.front.runtime().caps().items()}
    refused = [r for r in replies if r[0] != 200]
    accepted = [r for r in replies if r[0] == 200]
    assert caps["h_toy_capped"] < admission.INITIAL_IN_FLIGHT, caps
    assert refused and accepted, (len(refused), len(accepted))
    assert {r[0] for r in refused} == {503}, {r[0] for r in refused}
    for status, headers, answer, seconds in refused:
        assert headers["retry-after"] == "1" and headers["content-type"] == "application/json"
        assert json.loads(answer)["error"] == ("model 'toy_capped' is over its latency target (P99 "
                                               "objective 300 ms); retry later")
        assert LIMITS.refusal_hold_s - 0.02 <= seconds < LIMITS.refusal_hold_s + 2.0, seconds
    assert all(np.array_equal(json.loads(a)["outputs"][0]["data"], [2, 4, 6, 8])
               for _, _, a, _ in accepted)
    assert np.array_equal(_infer_ok(fronted.http_url), [2, 4, 6, 8]), "other models serve on"


def test_over_its_cap_a_model_is_refused_over_grpc_with_unavailable_and_retry_pushback(fronted):
    request = service_pb2.ModelInferRequest(model_name="toy_capped")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    request.inputs.add(name="DELAY_MS", datatype="FP32", shape=[1, 1])
    request.raw_input_contents.extend([np.arange(4, dtype=np.float32).tobytes(),
                                       np.array([SLOW_MS], np.float32).tobytes()])
    raw = request.SerializeToString()
    with grpc.insecure_channel(fronted.grpc_url) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")

        def user(_):
            results, end = [], time.monotonic() + 6
            while time.monotonic() < end:
                start = time.monotonic()
                try:
                    results.append((infer.with_call(raw, timeout=30)[1].code(), {}, "",
                                    time.monotonic() - start))
                except grpc.RpcError as exc:
                    results.append((exc.code(), dict(exc.trailing_metadata() or ()),
                                    exc.details(), time.monotonic() - start))
            return results

        with concurrent.futures.ThreadPoolExecutor(48) as pool:
            results = [r for found in pool.map(user, range(48)) for r in found]
        other = channel.unary_unary("/inference.GRPCInferenceService/ModelMetadata")(
            service_pb2.ModelMetadataRequest(name="toy_capped").SerializeToString(), timeout=10)
    refused = [r for r in results if r[0] != grpc.StatusCode.OK]
    assert refused and len(refused) < len(results), len(results)
    assert {r[0] for r in refused} == {grpc.StatusCode.UNAVAILABLE}, refused[:3]
    assert all("model 'toy_capped' is over its latency target" in r[2] for r in refused)
    assert all(int(r[1]["grpc-retry-pushback-ms"]) == 200 for r in refused), refused[0]
    assert all(LIMITS.refusal_hold_s - 0.02 <= r[3] < LIMITS.refusal_hold_s + 2.0 for r in refused)
    assert fronted.front.runtime().caps()["g_toy_capped"].requests < admission.INITIAL_IN_FLIGHT
    # a request to the same model that is not an inference passes
    assert service_pb2.ModelMetadataResponse.FromString(other).name == "toy_capped"


def _toy_capped_body(delay_ms: float, elements: int) -> bytes:
    return json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [1, elements], "datatype": "FP32", "data": [1] * elements},
        {"name": "DELAY_MS", "shape": [1, 1], "datatype": "FP32", "data": [delay_ms]}]}).encode()


def _wait_in_flight(runtime, expected: tuple[int, int], seconds: float) -> tuple[int, int]:
    deadline = time.monotonic() + seconds
    while (found := runtime.in_flight()["h_toy_capped"]) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def test_the_front_counts_bytes_in_flight_until_answered_and_forgets_what_it_answered_itself(fronted):
    # Admission weighs requests by their bytes (front.lua). Three requests of two sizes are
    # counted while tritonserver works on them; their clients leave, but tritonserver still
    # works, so they stay counted until it answers.
    runtime = fronted.front.runtime()
    host, _, port = fronted.http_url.rpartition(":")
    bodies = [_toy_capped_body(1000.0, n) for n in (4, 4, 400)]
    clients = []
    for body in bodies:
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(f"POST /v2/models/toy_capped/infer HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     f"application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        clients.append(sock)
    try:
        counted = _wait_in_flight(runtime, (sum(map(len, bodies)), 3), 5)
        assert counted == (sum(map(len, bodies)), 3), counted
    finally:
        for sock in clients:
            sock.close()
    assert _wait_in_flight(runtime, (0, 0), 10) == (0, 0), "released at tritonserver's answers"
    # An answer the front gives itself (504 past LIMITS.server_timeout_s) passes no response
    # rule: the sweep forgets the request once tritonserver's connection is gone.
    sent = time.monotonic()
    status, _, _ = _post(fronted.http_url, _toy_capped_body(3000.0 * LIMITS.server_timeout_s, 4),
                         model="toy_capped")
    assert status == 504
    assert _wait_in_flight(runtime, (0, 0), 3) == (0, 0), "forgotten within SETTLE_S + a sweep"
    assert time.monotonic() - sent < 3 * LIMITS.server_timeout_s, "before tritonserver answered"
    assert np.array_equal(_infer_ok(fronted.http_url), [2, 4, 6, 8])


def test_the_front_stops_with_its_server_and_frees_its_ports(server_factory, toy_repository):
    server = server_factory(toy_repository, front=Limits())
    ports = [int(url.rpartition(":")[2]) for url in (server.http_url, server.grpc_url)]
    run_dir, runner = server.front.run_dir, server.front._proc.pid
    assert run_dir.is_dir() and (run_dir / "haproxy.cfg").is_file()
    server.stop()
    assert _gone(runner)
    assert not run_dir.exists()
    for port in ports:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))


def test_a_free_port_taken_while_tritonserver_loads_is_chosen_again(
    server_factory, toy_repository, monkeypatch
):
    # The front's and the gateway's free ports are chosen before tritonserver loads the models;
    # another process can bind one meanwhile (two test workers did). Here the test takes the
    # gateway's port just before the gateway starts.
    from tools.serve import server as server_module

    held: list[socket.socket] = []

    class TakenOnce(server_module.ApiServer):
        def start(self, *args, **kwargs):
            if not held:
                sock = socket.socket()
                sock.bind(("127.0.0.1", self.port))
                sock.listen()
                held.append(sock)
            return super().start(*args, **kwargs)

    monkeypatch.setattr(server_module, "ApiServer", TakenOnce)
    try:
        server = server_factory(toy_repository, front=Limits(), gateway=True)
        assert held, "the gateway was started"
        assert server.gateway.port != held[0].getsockname()[1]
        assert server.gateway.ready()
        assert np.array_equal(_infer_ok(server.http_url), [2, 4, 6, 8])
    finally:
        for sock in held:
            sock.close()


def test_a_detached_servers_front_ends_with_tritonserver(tmp_path, toy_repository):
    from tools import process

    server = EmbeddedServer(toy_repository, front=Limits(), log_path=tmp_path / "t.log",
                            exit_timeout_s=5)
    server.start(timeout_s=120)
    runner, run_dir = server.front._proc.pid, server.front.run_dir
    pid = server.detach()
    assert not _gone(runner)
    process.stop(pid, 15)
    deadline = time.monotonic() + 20
    while not _gone(runner) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(runner) and not run_dir.exists()
