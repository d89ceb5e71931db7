"""In-process speed of an encoder's ONNX variants and session settings, side by side, one run.

Usage: python scripts/encoder_variants.py --repository REPO [--model minilm_encoder_int8]
(the fused and int8 rows need model.fused.onnx and model.int8.onnx in the model folder:
`runtime: onnxruntime`, `optimize: int8`; the shipped minilm_encoder_int8 is OpenVINO int8 now,
so on the shipped repository those rows are skipped with a note).
Also times a "quantize every MatMul" graph, to show what the quality gate's exclusions cost,
and ONNX Runtime's memory arena and memory-pattern planner switched off.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def _session(path: Path, spinning: str = "0", level=None, arena: bool = True,
             pattern: bool = True):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
    options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
    options.enable_cpu_mem_arena, options.enable_mem_pattern = arena, pattern
    if level is not None:
        options.graph_optimization_level = level
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _batches(texts_file: Path, tokenizer_file: Path, batch: int) -> list[dict[str, np.ndarray]]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    tokenizer.no_padding()
    tokenizer.enable_truncation(256)
    texts = [t for t in texts_file.read_text(encoding="utf-8").splitlines() if t.strip()]
    encodings = sorted(tokenizer.encode_batch(texts), key=lambda e: len(e.ids))
    feeds = []
    for i in range(0, len(encodings), batch):
        chunk = encodings[i:i + batch]
        ids = np.zeros((len(chunk), max(len(e.ids) for e in chunk)), np.int64)
        mask = np.zeros_like(ids)
        for row, e in enumerate(chunk):
            ids[row, :len(e.ids)], mask[row, :len(e.ids)] = e.ids, 1
        feeds.append({"input_ids": ids, "attention_mask": mask})
    return feeds


def main() -> None:
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = Path(__file__).resolve().parents[1]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, required=True)
    parser.add_argument("--model", default="minilm_encoder_int8")
    parser.add_argument("--texts", type=Path, default=root / "loadtests" / "data" / "texts.txt")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    version = args.repository / args.model / "1"
    tokenizer = args.repository / "text_tokenizer" / "1" / "tokenizer.json"
    feeds = _batches(args.texts, tokenizer, args.batch)
    texts = sum(len(f["input_ids"]) for f in feeds)
    every = Path(tempfile.mkdtemp()) / "model.int8-every-matmul.onnx"
    if (version / "model.fused.onnx").is_file():
        quantize_dynamic(str(version / "model.fused.onnx"), str(every), per_channel=True,
                         weight_type=QuantType.QInt8,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    level = ort.GraphOptimizationLevel
    exported = version / "model.onnx"
    variants = [
        ("fp32 exported, ORT_ENABLE_ALL (served)", exported, {}),
        ("fp32 exported, ORT_ENABLE_BASIC", exported, {"level": level.ORT_ENABLE_BASIC}),
        ("fp32 exported, intra-op spinning on", exported, {"spinning": "1"}),
        ("fp32 exported, memory arena off", exported, {"arena": False}),
        ("fp32 exported, memory-pattern planner off", exported, {"pattern": False}),
        ("fp32, offline fusion", version / "model.fused.onnx", {}),
        ("int8 as built (passes the quality gate)", version / "model.int8.onnx", {}),
        ("int8, every MatMul (no gate)", every, {}),
    ]
    for name, path, _ in variants:
        if not path.is_file():
            print(f"skipped {name!r}: {path} is not in the repository")
    sessions = [(name, _session(path, **settings)) for name, path, settings in variants
                if path.is_file()]
    rates: dict[str, list[float]] = {name: [] for name, _ in sessions}
    for _ in range(args.passes):  # interleaved, so drift hits every variant alike
        for name, session in sessions:
            session.run(None, feeds[0])
            start = time.perf_counter()
            for feed in feeds:
                session.run(None, feed)
            rates[name].append(texts / (time.perf_counter() - start))
    print(f"| variant | texts/s (median of {args.passes}, batches of {args.batch}) |\n|---|---|")
    for name, values in rates.items():
        print(f"| {name} | {statistics.median(values):.0f} |")


if __name__ == "__main__":
    main()
