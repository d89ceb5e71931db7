"""The gpu target's tokenizer pads to length buckets, so mixed-length requests batch together.

Triton's TensorRT and ONNX Runtime backends take no ragged batches: the dynamic batcher merges
only requests of equal shape. Masked mean pooling makes the extra padding harmless (parity), and
through a real server mixed-length requests then share encoder executions.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from tools.build_repo.config import parse_config, render
from tools.build_repo.ensemble import render_all
from tools.build_repo.spec import load_spec
from waits import counts_once_recorded, model_counts

ROOT = Path(__file__).resolve().parents[1]
# Lengths 5..120 tokens: without buckets almost every request has its own shape.
TEXTS = [" ".join(["word"] * n) for n in (3, 9, 14, 21, 27, 33, 40, 47, 55, 62, 70, 78, 90, 100, 110, 118)]
# 16 lengths (34..64 tokens with [CLS] and [SEP]) that all fall into the bucket of 64. Triton's
# batcher forms a batch from the head of its queue and stops at the first request of another
# shape, so requests must share a padded shape to share an execution.
ONE_BUCKET = [" ".join(["word"] * n) for n in range(32, 63, 2)]


def _gpu_buckets() -> tuple[int, ...]:
    spec = load_spec(ROOT / "repository.yaml")
    params = dict(render_all(spec, "gpu")["text_tokenizer"].parameters)
    return tuple(int(b) for b in params["length_buckets"].split(","))


def test_gpu_tokenizer_buckets_cover_the_encoders_whole_sequence_range():
    spec = load_spec(ROOT / "repository.yaml")
    buckets = _gpu_buckets()
    axis = spec.find("minilm_encoder").axis("sequence")
    assert max(buckets) == axis.max, "every text up to the encoder's limit has a bucket"
    assert list(buckets) == sorted(set(buckets))
    cpu = dict(render_all(spec, "cpu")["text_tokenizer"].parameters)
    assert "length_buckets" not in cpu, "the cpu runner batches ragged requests without padding"


@pytest.mark.torch
def test_padding_to_a_bucket_leaves_the_embedding_unchanged(built_repository):
    import onnxruntime as ort

    from pipeline_ops import text

    tokenizer = text.load_tokenizer(built_repository / "text_tokenizer" / "1" / "tokenizer.json", 256)
    session = ort.InferenceSession(str(built_repository / "minilm_encoder" / "1" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    requests = [{"TEXT": np.array([[t.encode()]], dtype=object)} for t in TEXTS]
    plain = text.tokenize_requests(tokenizer, requests)
    bucketed = text.tokenize_requests(tokenizer, requests, buckets=_gpu_buckets())

    worst = 0.0
    for a, b in zip(plain, bucketed):
        assert b["input_ids"].shape[1] in _gpu_buckets() and b["input_ids"].shape[1] >= a["input_ids"].shape[1]
        ea = session.run(None, a)[0]
        eb = session.run(None, b)[0]
        worst = max(worst, float(np.abs(ea - eb).max()))
    assert worst <= 1e-5, f"bucket padding changed an embedding by {worst}"


def _gpu_like_repository(built: Path, out: Path, buckets: tuple[int, ...] | None) -> Path:
    """The built cpu repository with the encoder batching like the gpu backends (no ragged
    batches) and, when given, the gpu target's tokenizer buckets."""
    shutil.copytree(built, out)
    encoder = out / "minilm_encoder" / "config.pbtxt"
    message = parse_config(encoder.read_text(), encoder)
    for tensor in message.input:
        tensor.allow_ragged_batch = False
    # One execution per length can queue a request for seconds on a busy 2-core machine.
    message.dynamic_batching.default_queue_policy.default_timeout_microseconds = 60_000_000
    encoder.write_text(render(message))
    tokenizer = out / "text_tokenizer" / "config.pbtxt"
    message = parse_config(tokenizer.read_text(), tokenizer)
    if buckets:
        message.parameters["length_buckets"].string_value = ",".join(map(str, buckets))
    tokenizer.write_text(render(message))
    return out


def _executions_for_concurrent_requests(server) -> tuple[int, int]:
    import tritonclient.http as http

    before = model_counts(server.http_url, "minilm_encoder")
    barrier = threading.Barrier(len(ONE_BUCKET))
    errors = []

    def send(text: str) -> None:
        client = http.InferenceServerClient(server.http_url, connection_timeout=30, network_timeout=30)
        item = http.InferInput("TEXT", [1, 1], "BYTES")
        item.set_data_from_numpy(np.array([[text.encode()]], dtype=object))
        barrier.wait(timeout=30)
        try:
            client.infer("text_embedding", [item])
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(str(exc))
        finally:
            client.close()

    threads = [threading.Thread(target=send, args=(t,)) for t in ONE_BUCKET]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a request took over 60 s"
    assert not errors, errors
    after = counts_once_recorded(server.http_url, "minilm_encoder", before, len(ONE_BUCKET))
    return after[0] - before[0], after[1] - before[1]


@pytest.mark.torch
@pytest.mark.server
@pytest.mark.timeout(300)
def test_mixed_length_requests_share_encoder_executions_only_with_buckets(
    built_repository, server_factory, tmp_path
):
    buckets = _gpu_buckets()
    without = server_factory(_gpu_like_repository(built_repository, tmp_path / "plain", None))
    inferences, executions_plain = _executions_for_concurrent_requests(without)
    without.stop()
    with_buckets = server_factory(_gpu_like_repository(built_repository, tmp_path / "buckets", buckets))
    inferences_b, executions_buckets = _executions_for_concurrent_requests(with_buckets)

    assert inferences == inferences_b == len(ONE_BUCKET)
    assert 64 in buckets
    # Without buckets each of the 16 lengths is its own shape: nothing can be merged.
    assert executions_plain >= len(ONE_BUCKET) - 2, executions_plain
    # With them all 16 are [1, 64] and share executions: at most 5 in the runs before, 6 in one CI
    # run (two encoder instances and no queue delay split a burst unevenly); half keeps the two
    # cases apart on a loaded machine.
    assert executions_buckets <= len(ONE_BUCKET) // 2, (executions_buckets, executions_plain)
