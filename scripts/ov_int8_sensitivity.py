"""What each node kept out of OpenVINO int8 would cost if quantized: one at a time, on the
calibration texts (never a held-out quality text).

Usage: python scripts/ov_int8_sensitivity.py [--spec repository.yaml] [--model minilm_encoder_int8]
For each node the spec's ``cpu.quantize_exclude`` keeps out, quantizes the model as the build
does but with that node in int8 too, and prints the worst and mean cosine to the fp32 ONNX
Runtime embeddings and the top-10 agreement over the calibration texts (docs/cpu-speed.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    import openvino

    from tools.build_repo import onnx2ov_int8, quality, quality_sets
    from tools.build_repo.onnx2int8 import excluded_nodes
    from tools.build_repo.parity import onnxruntime_runner, openvino_runner
    from tools.build_repo.spec import load_spec, resolve_file

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "repository.yaml")
    parser.add_argument("--model", default="minilm_encoder_int8")
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository",
                        help="built repository: its model.onnx of the model is quantized")
    args = parser.parse_args()
    spec = load_spec(args.spec)
    model = spec.find(args.model)
    gate = model.cpu.quality
    quality_set, tokenizer = quality.load_gate_set(gate, spec.root, "")
    calibration = quality_sets.calibration_set(
        quality_sets.read_texts(resolve_file(model.cpu.calibration_texts, spec.root, "")),
        quality_set, tokenizer, gate.max_length)
    texts, encodings = calibration.texts, calibration.encodings
    source = args.repository / args.model / "1" / "model.onnx"
    reference = quality.embed(onnxruntime_runner(str(source), spec.cpu_cores), encodings)
    nodes = onnx2ov_int8.quantizable_nodes(openvino.Core().read_model(str(source)))
    kept = excluded_nodes(nodes, model.cpu.quantize_exclude, model, source)
    print(f"{len(texts)} calibration texts; {len(kept)} nodes kept out of int8 by the spec")
    print("| also in int8 | min cosine | mean cosine | below 0.99 | top-10 agreement |")
    print("|---|---|---|---|---|")
    for node in [None, *kept]:
        others = tuple(n for n in kept if n != node)
        variant = dataclasses.replace(model, cpu=dataclasses.replace(model.cpu, quantize_exclude=others))
        path = Path(tempfile.mkdtemp()) / "model.int8.xml"
        onnx2ov_int8.quantize_openvino(source, path, variant, calibration, quality_set)
        runner, _ = openvino_runner(str(path), spec.cpu_cores, model.cpu.precision, spec.backends)
        candidate = quality.embed(runner, encodings)
        cosine = quality.cosines(reference, candidate)
        agreement = quality.neighbour_agreement(reference, candidate, gate.neighbours)
        print(f"| {node or '(none: as built)'} | {cosine.min():.4f} | {cosine.mean():.5f} | "
              f"{int((cosine < 0.99).sum())} | {agreement:.3f} |", flush=True)


if __name__ == "__main__":
    main()
