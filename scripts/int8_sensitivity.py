"""Which nodes of an encoder lose quality under int8: quantize one at a time, compare with fp32.

Usage: python scripts/int8_sensitivity.py --repository REPO [--model MODEL]
(MODEL: a `runtime: onnxruntime`, `optimize: int8` model, whose folder holds model.fused.onnx;
the shipped minilm_encoder_int8 is OpenVINO int8 now: scripts/ov_int8_sensitivity.py.)
Prints one table row per quantizable node (worst and mean cosine over the texts); the rows that
fall furthest are the candidates for cpu.quantize_exclude (docs/cpu-speed.md).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    import numpy as np
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from encoder_variants import _batches, _session
    from tools.build_repo.onnx2int8 import quantizable_nodes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, required=True)
    parser.add_argument("--model", default="minilm_encoder_int8")
    parser.add_argument("--texts", type=Path, default=ROOT / "loadtests" / "data" / "texts.txt")
    args = parser.parse_args()
    fused = args.repository / args.model / "1" / "model.fused.onnx"
    feeds = _batches(args.texts, args.repository / "text_tokenizer" / "1" / "tokenizer.json", 16)

    def embed(path: Path) -> np.ndarray:
        session = _session(path)
        out = np.concatenate([session.run(None, feed)[0] for feed in feeds]).astype(np.float64)
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    reference = embed(fused)
    one = Path(tempfile.mkdtemp()) / "one.onnx"
    print("| node | min cosine | mean cosine |\n|---|---|---|")
    for node in quantizable_nodes(fused):
        quantize_dynamic(str(fused), str(one), per_channel=True, weight_type=QuantType.QInt8,
                         nodes_to_quantize=[node],
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        cosine = (embed(one) * reference).sum(1)
        print(f"| `{node}` | {cosine.min():.4f} | {cosine.mean():.5f} |", flush=True)


if __name__ == "__main__":
    main()
