"""The tail ratio the queue alone would give: no other process on the cores (docs/performance.md, tail ratio).

Each text's own time is measured in this process as one served encoder instance computes it (the
served tokenizer + encoder with the instance's intra-op threads, one request at a time, the
fastest of 3), then replayed through FCFS instances (one, and as many as the server runs) fed one
text every 1/r s in the shipped order, r being half of what those instances could serve: the P99
of that over the P99 of the texts alone is the tail ratio of a machine whose cores ran nothing
but the encoders. What `tools bench` measures above it is contention and noise.

usage: python benchmarks/tail_floor.py [PIPELINE ...]   (default: the three text pipelines;
       run from the project root with the built model_repository, nothing else running)
"""
from __future__ import annotations

import dataclasses
import heapq
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.bench.inprocess import InProcessEncoder  # noqa: E402
from tools.bench.targets import resolve  # noqa: E402
from tools.build_repo.spec import load_spec  # noqa: E402
from tools.stats import percentile  # noqa: E402


def own_times(encoder: InProcessEncoder, texts: tuple[str, ...]) -> np.ndarray:
    """Seconds each text takes alone (the fastest of 3, after 20 warm-up texts)."""
    for text in texts[:20]:
        encoder.encode([text])
    times = np.zeros(len(texts))
    for i, text in enumerate(texts):
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            encoder.encode([text])
            best = min(best, time.perf_counter() - start)
        times[i] = best
    return times


def replay(times: np.ndarray, instances: int, rate: float) -> np.ndarray:
    """Latencies of ``times`` sent one every 1/``rate`` s, in order, to FCFS instances."""
    free = [0.0] * instances
    latencies = np.zeros(len(times))
    for i, own in enumerate(times):
        arrive = i / rate
        start = max(arrive, heapq.heappop(free))
        heapq.heappush(free, start + own)
        latencies[i] = start + own - arrive
    return latencies


def main(names: list[str]) -> None:
    targets, _ = resolve(ROOT / "model_repository", load_spec(ROOT / "repository.yaml"),
                         names or ["text_embedding", "text_embedding_int8", "text_embedding_bf16"],
                         explicit=True)
    for target in targets:
        served = target.setup
        one_instance = dataclasses.replace(  # limit_threads = one instance's intra-op threads
            served, encoder_config={**served.encoder_config, "instance_group": [{"count": 1}]})
        times = own_times(InProcessEncoder(one_instance), target.texts)
        p99_alone = percentile(sorted(times), 99)
        for instances in sorted({1, served.instances}):
            rate = instances / times.mean() / 2
            latencies = replay(times, instances, rate)
            waits = latencies - times
            print(f"{target.name}: {instances} instance(s), mean {times.mean() * 1e3:.2f} ms, "
                  f"P99 alone {p99_alone * 1e3:.1f} ms; at r={rate:.0f}/s P99 "
                  f"{percentile(sorted(latencies), 99) * 1e3:.1f} ms -> ratio "
                  f"{percentile(sorted(latencies), 99) / p99_alone:.2f} (waited: "
                  f"{np.mean(waits > 1e-6) * 100:.0f} % of texts, at most {waits.max() * 1e3:.1f} ms)",
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
