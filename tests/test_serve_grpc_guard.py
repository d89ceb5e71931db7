"""The gRPC guard in front of the embedded tritonserver (``tools.serve.grpc_guard``).

No Triton release has a gRPC message-size flag (``grpc_server.cc`` builds its server with
INT32_MAX): unguarded, one 200 MB request took tritonserver 2.51's RSS from 48 to 609 MiB. Here
a real tritonserver on the toy repository runs behind the guard, as ``tools serve`` starts it.
"""

from __future__ import annotations

import queue
import threading
import time

import grpc
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from tools.net import port_in_use
from waits import child_running

pytestmark = pytest.mark.server

LIMIT = 4 << 20
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


def _double_request(data: np.ndarray, delay_ms: float | None = None) -> list:
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    inputs = [tensor]
    if delay_ms is not None:
        delay = grpcclient.InferInput("DELAY_MS", [data.shape[0], 1], "FP32")
        delay.set_data_from_numpy(np.full((data.shape[0], 1), delay_ms, np.float32))
        inputs.append(delay)
    return inputs


@pytest.fixture
def guarded(server_factory, toy_repository):
    return server_factory(toy_repository, grpc_guard=LIMIT)


def _raw_infer(url: str, request: bytes) -> bytes:
    with grpc.insecure_channel(url) as channel:
        return channel.unary_unary(MODEL_INFER)(request, timeout=30)


def test_inference_through_the_guard_is_byte_identical_to_tritonservers_own(guarded):
    assert guarded.grpc_url != guarded.triton_grpc_url
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    request = service_pb2.ModelInferRequest(model_name="toy_double", id="same")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[2, 4])
    request.raw_input_contents.append(data.tobytes())
    raw = request.SerializeToString()
    through, direct = _raw_infer(guarded.grpc_url, raw), _raw_infer(guarded.triton_grpc_url, raw)
    assert through == direct
    answer = service_pb2.ModelInferResponse.FromString(through)
    assert np.frombuffer(answer.raw_output_contents[0], np.float32).tolist() == \
        (2 * data).ravel().tolist()
    with grpcclient.InferenceServerClient(guarded.grpc_url) as client:
        result = client.infer("toy_double", _double_request(data))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * data)


def test_metadata_deadlines_and_errors_pass_through_as_tritonserver_gives_them(guarded):
    with grpcclient.InferenceServerClient(guarded.grpc_url) as client:
        # the admin key travels as metadata; without it tritonserver refuses, through the guard too
        index = client.get_model_repository_index(headers=guarded.admin_headers)
        assert {m.name for m in index.models} >= {"toy_double", "toy_text"}
        with pytest.raises(InferenceServerException) as refused:
            client.get_model_repository_index()
        assert "restricted" in refused.value.message()
        with pytest.raises(InferenceServerException) as late:
            client.infer("toy_double", _double_request(np.ones((1, 4), np.float32), 3000),
                         client_timeout=0.5)
        assert late.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        with pytest.raises(InferenceServerException) as unknown:
            client.infer("no_such_model", _double_request(np.ones((1, 4), np.float32)))
    with grpcclient.InferenceServerClient(guarded.triton_grpc_url) as client:
        with pytest.raises(InferenceServerException) as direct:
            client.infer("no_such_model", _double_request(np.ones((1, 4), np.float32)))
    assert (unknown.value.status(), unknown.value.message()) == \
        (direct.value.status(), direct.value.message())


def test_the_bidirectional_stream_passes_message_by_message(guarded):
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(guarded.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for i in range(5):
            data = np.full((1, 4), i, np.float32)
            client.async_stream_infer("toy_double", _double_request(data), request_id=str(i))
        got = [answers.get(timeout=30) for _ in range(5)]
        client.stop_stream()
    assert [error for _, error in got] == [None] * 5
    assert sorted(float(r.as_numpy("OUTPUT0")[0, 0]) for r, _ in got) == [0, 2, 4, 6, 8]


def _rss_mib(proc: psutil.Process) -> float:
    return proc.memory_info().rss / 2**20


def test_a_200_mb_request_is_refused_with_resource_exhausted_and_memory_stays_flat(guarded):
    port = guarded.grpc_url.rpartition(":")[2]
    guard = child_running("tools.serve.grpc_guard", port)
    triton = psutil.Process(guarded.pid)
    before = {"triton": _rss_mib(triton), "guard": _rss_mib(guard)}
    peak = dict(before)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak["triton"] = max(peak["triton"], _rss_mib(triton))
            peak["guard"] = max(peak["guard"], _rss_mib(guard))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    huge = np.zeros((1, 50_000_000), np.float32)  # 200 MB of tensor data in one ModelInfer
    try:
        with grpcclient.InferenceServerClient(guarded.grpc_url) as client:
            with pytest.raises(InferenceServerException) as refused:
                client.infer("toy_double", _double_request(huge))
            assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
            assert f"vs. {LIMIT}" in refused.value.message()
            # the server keeps serving, on the same connection too
            result = client.infer("toy_double", _double_request(np.ones((1, 4), np.float32)))
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 4), 2.0))
    finally:
        done.set()
        sampler.join()
    print(f"RSS MiB before {before}, peak while refusing {peak}")
    assert peak["triton"] - before["triton"] < 16, "tritonserver never saw the message"
    assert peak["guard"] - before["guard"] < 16, "the guard refused it without reading it whole"
    with grpcclient.InferenceServerClient(guarded.grpc_url) as client:
        result = client.infer("toy_double", _double_request(np.ones((1, LIMIT // 8), np.float32)))
        assert result.as_numpy("OUTPUT0").shape == (1, LIMIT // 8), "under the limit passes"


def test_the_guard_stops_with_the_server_and_frees_its_port(guarded):
    port = int(guarded.grpc_url.rpartition(":")[2])
    assert port_in_use(port)
    guarded.stop()
    assert not port_in_use(port)


def test_a_compressed_message_is_bounded_by_what_it_decodes_to(guarded):
    with grpcclient.InferenceServerClient(guarded.grpc_url) as client:
        small = client.infer("toy_double", _double_request(np.ones((1, 4), np.float32)),
                             compression_algorithm="gzip")
        np.testing.assert_array_equal(small.as_numpy("OUTPUT0"), np.full((1, 4), 2.0))
        zeros = np.zeros((1, LIMIT // 2), np.float32)  # 2x the limit, a few KiB once compressed
        with pytest.raises(InferenceServerException) as refused:
            client.infer("toy_double", _double_request(zeros), compression_algorithm="gzip")
        assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert f"decompressed over {LIMIT}" in refused.value.message()
        again = client.infer("toy_double", _double_request(np.ones((1, 4), np.float32)))
        np.testing.assert_array_equal(again.as_numpy("OUTPUT0"), np.full((1, 4), 2.0))


def test_a_message_over_the_limit_ends_only_its_stream_after_the_answers_before_it(guarded):
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(guarded.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer("toy_double", _double_request(np.ones((1, 4), np.float32)))
        first, error = answers.get(timeout=30)
        assert error is None and first.as_numpy("OUTPUT0").tolist() == [[2.0] * 4]
        client.async_stream_infer("toy_double",
                                  _double_request(np.ones((1, LIMIT // 2), np.float32)))
        _, error = answers.get(timeout=30)
        client.stop_stream()
        assert error is not None and "larger than max" in str(error)
        # the connection's other calls, and its flow-control credit, are intact
        for _ in range(3):
            result = client.infer("toy_double", _double_request(np.ones((1, 1 << 18), np.float32)))
            assert result.as_numpy("OUTPUT0").shape == (1, 1 << 18)
