"""Outlier-channel split of MiniLM's feed-forward blocks before OpenVINO static int8: tried
for issue 13, not kept (docs/cpu-speed.md, "Outlier-channel split").

Usage: python scripts/ov_int8_outlier_split.py [--repository model_repository] [--channels 2]
       [--alpha 0.75]

A feed-forward block ``down(gelu(up(x) + b1)) + b2`` equals the sum of two blocks over disjoint
sets of hidden units. After GELU, one or two units per MiniLM layer reach 14-25 while the rest
stay below 7, and one int8 scale for the down-projection's input cannot hold both. This script
measures each unit's largest activation on the calibration texts (the load-test texts that are not
held-out quality texts), moves the ``--channels`` largest per layer into a narrow branch
(``<MatMul>_outliers``, kept out of int8), quantizes everything else with NNCF as the build does
(SmoothQuant strength ``--alpha``), and prints: quality on the calibration texts and on the two
parts of the quality set (cosine to ONNX Runtime fp32, top-10 agreement, the degenerate
family's worst text), in-process throughput
against the shipped ``model.int8.xml`` (interleaved passes), and what a first run of a new input
shape costs each of them.
"""

from __future__ import annotations

import argparse
import copy
import fnmatch
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "backends" / "python"))

OUTLIER_SUFFIX = "_outliers"
# Element-wise operators an activation between the two projections may be built of (GELU as
# exported is Div, Erf, Add, Mul, Mul; tanh-GELU, SiLU and ReLU use the others).
ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Erf", "Tanh", "Sigmoid", "Pow", "Relu",
                         "Gelu", "Sqrt", "Neg", "Identity"})


@dataclass
class FeedForward:
    """One feed-forward block of the graph, found from its down-projection."""

    down: object  # onnx NodeProto: MatMul(hidden, W2)
    up: object  # onnx NodeProto: MatMul(x, W1)
    between: list = field(default_factory=list)  # nodes from up's output to down's input, in order
    hidden: int = 0


def find_feed_forwards(graph, patterns: Sequence[str]) -> list[FeedForward]:
    """The feed-forward blocks whose down-projection MatMul matches one of ``patterns``.

    Walks back from each down MatMul's activation input through element-wise nodes to the
    up-projection MatMul. Every weight and bias must be an initializer.

    Raises:
        SystemExit: a pattern matches no MatMul, or a matched MatMul is not the end of a
            ``MatMul -> element-wise -> MatMul`` block with constant weights.
    """
    inits = {i.name: i for i in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    matmuls = [n for n in graph.node if n.op_type == "MatMul"]
    # Nodes are told apart by name (protobuf's Python wrappers have no stable identity)
    position = {n.name: i for i, n in enumerate(graph.node)}
    if "" in position or len(position) != len(graph.node):
        raise SystemExit("the graph's nodes need unique, non-empty names")
    blocks = []
    for pattern in patterns:
        matched = [n for n in matmuls if fnmatch.fnmatchcase(n.name, pattern)]
        if not matched:
            raise SystemExit(f"{pattern!r} matches no MatMul of the exported graph")
        for down in matched:
            blocks.append(_block_of(down, producer, inits, position))
    return blocks


def _block_of(down, producer, inits, position) -> FeedForward:
    if len(down.input) != 2 or down.input[1] not in inits:
        raise SystemExit(f"{down.name!r} has no constant weight to split")
    between, seen, stack, up = [], set(), [down.input[0]], None
    while stack:
        tensor = stack.pop()
        node = producer.get(tensor)
        if node is None or node.name in seen:
            continue
        seen.add(node.name)
        if node.op_type == "MatMul":
            if up is not None and node.name != up.name or node.input[1] not in inits:
                raise SystemExit(f"{down.name!r} is not fed by one "
                                  f"up-projection MatMul with a constant weight")
            up = node
            continue
        if node.op_type == "Constant":
            continue
        if node.op_type not in ELEMENTWISE:
            raise SystemExit(f"between the projections of {down.name!r} is a "
                              f"{node.op_type} node ({node.name!r}); only element-wise "
                              f"activations can be split")
        between.append(node)
        stack.extend(node.input)
    if up is None:
        raise SystemExit(f"no up-projection MatMul feeds {down.name!r}")
    hidden = int(inits[up.input[1]].dims[-1])
    if int(inits[down.input[1]].dims[0]) != hidden:
        raise SystemExit(f"{up.name!r} has {hidden} outputs but {down.name!r} "
                          f"takes {inits[down.input[1]].dims[0]}")
    between.sort(key=lambda n: position[n.name])
    return FeedForward(down=down, up=up, between=between, hidden=hidden)


def activation_peaks(model, blocks: Sequence[FeedForward], feeds: Sequence[dict]) -> list[np.ndarray]:
    """Each block's largest |activation| per hidden unit over the unpadded positions of
    ``feeds`` (ONNX Runtime, the graph with the activations as extra outputs)."""
    import onnx
    import onnxruntime as ort

    probe = copy.deepcopy(model)
    names = [b.down.input[0] for b in blocks]
    for name in names:
        probe.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    peaks = [np.zeros(b.hidden, np.float32) for b in blocks]
    for feed in feeds:
        mask = feed["attention_mask"].astype(bool)
        for i, act in enumerate(session.run(names, feed)):
            peaks[i] = np.maximum(peaks[i], np.abs(act[mask]).max(axis=0))
    return peaks


def split_block(graph, block: FeedForward, outliers: np.ndarray) -> None:
    """Rewrite ``block`` in ``graph`` in place into a main branch (all hidden units but
    ``outliers``) and an outlier branch (``<name>_outliers``), summed where the block's output
    was used."""
    from onnx import helper, numpy_helper

    if any(out.name == block.down.output[0] for out in graph.output):  # before any rewrite
        raise SystemExit(f"the output of {block.down.name!r} is a graph output")
    inits = {i.name: i for i in graph.initializer}
    keep = np.setdiff1d(np.arange(block.hidden), outliers)
    suffix = OUTLIER_SUFFIX
    # Weights and hidden-sized biases: the main branch keeps its names, the outliers get copies.
    sliced = {block.up.input[1]: -1, block.down.input[1]: 0}
    for node in block.between:
        for name in node.input:
            if name in inits and inits[name].dims and inits[name].dims[-1] == block.hidden:
                sliced[name] = -1
    for name, axis in sliced.items():
        value = numpy_helper.to_array(inits[name])
        inits[name].CopyFrom(numpy_helper.from_array(np.take(value, keep, axis=axis), name))
        graph.initializer.append(numpy_helper.from_array(np.take(value, outliers, axis=axis),
                                                         name + suffix))
    renamed = {name: name + suffix for name in sliced}
    clones = []
    for node in [block.up, *block.between, block.down]:
        clone = copy.deepcopy(node)
        clone.name = node.name + suffix
        inputs = [renamed.get(name, name) for name in node.input]
        del clone.input[:]
        clone.input.extend(inputs)
        del clone.output[:]
        for out in node.output:
            renamed[out] = out + suffix
            clone.output.append(out + suffix)
        clones.append(clone)
    main_out = block.down.output[0]
    total = main_out + "_with" + suffix
    clones.append(helper.make_node("Add", [main_out, main_out + suffix], [total],
                                   name=block.down.name + "_add" + suffix))
    for node in graph.node:
        if node.name != block.down.name:
            for i, name in enumerate(node.input):
                if name == main_out:
                    node.input[i] = total
    nodes = list(graph.node)
    at = next(i for i, n in enumerate(nodes) if n.name == block.down.name) + 1
    del graph.node[:]
    graph.node.extend(nodes[:at] + clones + nodes[at:])


def split_graph(source: Path, destination: Path, patterns, channels: int, feeds) -> dict:
    """Write ``source`` with its matched blocks split to ``destination``; the outlier units
    chosen on ``feeds``. Returns {down MatMul: (units, their peaks, the largest other peak)}."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(source))
    blocks = find_feed_forwards(model.graph, patterns)
    chosen = {}
    for block, peak in zip(blocks, activation_peaks(model, blocks, feeds)):
        units = np.sort(np.argsort(peak)[::-1][:channels])
        chosen[block.down.name] = (units.tolist(), [round(float(p), 1) for p in peak[units]],
                                   round(float(np.delete(peak, units).max()), 1))
        split_block(model.graph, block, units)
    onnx.checker.check_model(model)
    onnx.save(model, str(destination))
    check = feeds[-1]
    before = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, check)
    after = ort.InferenceSession(str(destination), providers=["CPUExecutionProvider"]).run(None, check)
    print(f"split graph vs {source.name}: max abs diff "
          f"{max(float(np.abs(a - b).max()) for a, b in zip(before, after)):.1e}")
    return chosen


def main() -> None:
    os.environ.setdefault("NNCF_CI", "1")
    import logging

    import nncf
    import openvino
    from nncf.common.logging.logger import set_log_level
    from pipeline_ops.onnx_session import OpenVinoSession

    from tools.build_repo import onnx2ov_int8, quality, quality_sets
    from tools.build_repo.parity import onnxruntime_runner
    from tools.build_repo.spec import load_spec, resolve_file

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "repository.yaml")
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--model", default="minilm_encoder_int8")
    parser.add_argument("--channels", type=int, default=2)
    parser.add_argument("--alpha", type=float, default=0.75)
    args = parser.parse_args()
    set_log_level(logging.ERROR)
    spec = load_spec(args.spec)
    model = spec.find(args.model)
    gate = model.cpu.quality
    quality_set, tokenizer = quality.load_gate_set(gate, spec.root, "")
    calibration = quality_sets.calibration_set(quality_sets.read_texts(resolve_file(
        model.cpu.calibration_texts, spec.root, "")), quality_set, tokenizer, gate.max_length)
    folder = args.repository / args.model / "1"
    source, shipped = folder / "model.onnx", folder / "model.int8.xml"
    fp32 = onnxruntime_runner(str(source), 1)
    parts = {"calibration": (list(calibration.encodings), None)}
    for split in (quality_sets.TUNE, quality_sets.HELD_OUT):
        chosen = [i for i, t in enumerate(quality_set.texts) if t.split == split]
        degenerate = [k for k, i in enumerate(chosen) if quality_set.texts[i].form == "degenerate"]
        parts[f"quality {split}"] = ([quality_set.encodings[i] for i in chosen], degenerate)
    references = {name: (encodings, quality.embed(fp32, encodings), degenerate)
                  for name, (encodings, degenerate) in parts.items()}
    feeds = list(onnx2ov_int8.calibration_batches(calibration.encodings))

    scratch = Path(tempfile.mkdtemp(prefix="outlier-split-"))
    chosen = split_graph(source, scratch / "split.onnx",
                         ["/encoder/encoder/layer.?/output/dense/MatMul"], args.channels, feeds)
    for name, (units, peaks, rest) in chosen.items():
        print(f"{name}: units {units} peak {peaks}, the other units at most {rest}")
    split_model = openvino.Core().read_model(str(scratch / "split.onnx"))
    kept = [n for n in onnx2ov_int8.quantizable_nodes(split_model) if n.endswith(OUTLIER_SUFFIX)]
    quantized = nncf.quantize(
        split_model, nncf.Dataset(feeds), model_type=nncf.ModelType.TRANSFORMER,
        subset_size=len(feeds), ignored_scope=nncf.IgnoredScope(names=kept),
        advanced_parameters=nncf.AdvancedQuantizationParameters(
            smooth_quant_alphas=nncf.AdvancedSmoothQuantParameters(matmul=args.alpha)))
    candidate = scratch / "model.int8.xml"
    openvino.save_model(quantized, str(candidate), compress_to_fp16=False)

    variants = {"shipped": shipped, "split": candidate}
    print("\n| variant | set | min cosine | mean cosine | below 0.99 | top-10 agreement | "
          "degenerate min |")
    print("|---|---|---|---|---|---|---|")
    for name, path in variants.items():
        session = OpenVinoSession(path, 1, model.cpu.precision)
        runner = lambda feed, s=session: dict(zip(["embedding"], s.run(None, feed)))
        for set_name, (encodings, reference, degenerate) in references.items():
            got = quality.embed(runner, encodings)
            cosine = quality.cosines(reference, got)
            agreement = quality.neighbour_agreement(reference, got, gate.neighbours)
            worst = f"{cosine[degenerate].min():.4f}" if degenerate else "—"
            print(f"| {name} | {set_name} | {cosine.min():.4f} | {cosine.mean():.5f} | "
                  f"{int((cosine < 0.99).sum())} | {agreement:.3f} | {worst} |")

    print("\nin-process texts/s, calibration texts in length-sorted batches, best of 3 "
          "interleaved passes:")
    for threads, batch in ((1, 8), (2, 32)):
        sessions = {n: OpenVinoSession(p, threads, model.cpu.precision) for n, p in variants.items()}
        batches = list(onnx2ov_int8.calibration_batches(calibration.encodings, batch))
        best = dict.fromkeys(sessions, 0.0)
        for _ in range(3):
            for name, session in sessions.items():
                session.run(None, batches[0])
                start, rows = time.perf_counter(), 0
                for feed in batches:
                    session.run(None, feed)
                    rows += len(feed["input_ids"])
                best[name] = max(best[name], rows / (time.perf_counter() - start))
        print(f"  {threads} thread(s), batch {batch}: "
              + ", ".join(f"{n} {v:.1f}" for n, v in best.items()))

    print("\nfirst run of a new input shape vs the same shape again (60 shapes, 1 thread):")
    rng = np.random.default_rng(0)
    shapes = list(zip(rng.integers(1, 9, 60).tolist(), rng.integers(5, 120, 60).tolist()))
    for name, path in variants.items():
        session = OpenVinoSession(path, 1, model.cpu.precision)
        session.run(None, {"input_ids": np.ones((2, 16), np.int64),
                           "attention_mask": np.ones((2, 16), np.int64)})
        first, again = [], []
        for rows, length in shapes:
            feed = {"input_ids": np.ones((rows, length), np.int64),
                    "attention_mask": np.ones((rows, length), np.int64)}
            for times in (first, again):
                start = time.perf_counter()
                session.run(None, feed)
                times.append((time.perf_counter() - start) * 1000)
        print(f"  {name}: new shape {np.median(first):.1f} ms, again {np.median(again):.1f} ms "
              f"(median)")


if __name__ == "__main__":
    main()
