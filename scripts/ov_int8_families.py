"""OpenVINO int8 variants judged family by family on the quality set's tune part, and timed
against the shipped int8 and bf16: what was tried for issue 27 (docs/cpu-speed.md, "int8 by
family").

Usage: python scripts/ov_int8_families.py [--repository model_repository] [--only NAME ...]
       [--held-out [--table]] [--accuracy-control ITERATIONS] [--speed [--time NAME=IR ...]]
       [--passes 5] [--keep]

Each candidate is NNCF's static int8 of the exported ``model.onnx`` as the build makes it
(``onnx2ov_int8.quantize_openvino``: transformer preset, calibrated on ``cpu.calibration_texts``
without the held-out quality texts), with the spec's ``cpu`` fields changed: more MatMuls kept
in bf16 (``quantize_exclude``), another SmoothQuant strength (``smooth_quant_alpha``), the tune
part of some families added to calibration (``calibrate_on_tune``). Choices are made on the
``tune`` part only: the script prints every family's worst cosine there; ``--held-out`` adds the
held-out part's, for the record once a choice is made. ``--accuracy-control`` adds NNCF's
accuracy-aware quantization, with the tune part's worst cosine as its metric. ``--speed`` times
the candidates, the repository's ``model.int8.xml`` ("built int8") and bf16 ``model.onnx`` in
interleaved passes on the calibration texts in length-sorted batches (1 thread batch 8,
2 threads batch 32).
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "backends" / "python"))

LAYERS = "/encoder/encoder/layer.?"
ATTENTION_OUT = f"{LAYERS}/attention/output/dense/MatMul"
FFN_UP = f"{LAYERS}/intermediate/dense/MatMul"
PRESET_ALPHA = 0.95  # NNCF 3.4's AdvancedSmoothQuantParameters.matmul default
ACCURACY_CONTROL = "accuracy control on the tune part"


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One change to issue 13's int8 recipe: the spec's ``quantize_exclude``, NNCF's preset
    SmoothQuant strength, calibration on ``cpu.calibration_texts`` alone."""

    keep_bf16: tuple[str, ...] = ()  # patterns kept out of int8 besides the spec's
    alpha: float = PRESET_ALPHA  # SmoothQuant strength of MatMuls (-1: off)
    calibrate_on_tune: tuple[str, ...] = ()  # families whose tune texts join calibration
    # > 0: the spec's kept-out MatMuls get int8 weights, and OpenVINO quantizes their activations
    # at run time per group of this many channels (DYNAMIC_QUANTIZATION_GROUP_SIZE, written into
    # the IR's runtime options, so the served session applies it): 1536, a down-projection's
    # whole input, is one scale per token
    dynamic_group: int = 0


CANDIDATES = {
    "issue 13 recipe": Candidate(),
    **{f"{name} in bf16": Candidate(keep_bf16=(f"{LAYERS}/attention/self/{node}",))
       for name, node in (("query", "query/MatMul"), ("key", "key/MatMul"), ("QK", "MatMul"),
                          ("value", "value/MatMul"), ("AV", "MatMul_1"))},
    "attention output in bf16": Candidate(keep_bf16=(ATTENTION_OUT,)),
    "ffn up in bf16": Candidate(keep_bf16=(FFN_UP,)),
    "attention output and ffn up in bf16": Candidate(keep_bf16=(ATTENTION_OUT, FFN_UP)),
    "smoothquant 0.25": Candidate(alpha=0.25),
    "smoothquant 0.4": Candidate(alpha=0.4),
    "smoothquant 0.5": Candidate(alpha=0.5),
    "smoothquant 0.75": Candidate(alpha=0.75),
    "smoothquant off": Candidate(alpha=-1),
    "calibrated on tune degenerate": Candidate(calibrate_on_tune=("form:degenerate",)),
    "smoothquant 0.5, calibrated on tune degenerate": Candidate(
        alpha=0.5, calibrate_on_tune=("form:degenerate",)),
    "smoothquant 0.5, attention output in bf16": Candidate(keep_bf16=(ATTENTION_OUT,), alpha=0.5),
    "down-projections dynamic int8, per token": Candidate(dynamic_group=1536),
    "smoothquant 0.5, calibrated on tune degenerate, down-projections dynamic int8 per token":
        Candidate(alpha=0.5, calibrate_on_tune=("form:degenerate",), dynamic_group=1536),
}


def quantize(candidate: Candidate, source: Path, destination: Path, model, quality_set,
             calibration_texts: list[str], tokenizer: Path, max_length: int) -> None:
    """NNCF int8 of ``source`` as the build makes it (``onnx2ov_int8``), with the spec's
    ``cpu`` fields changed as ``candidate`` says."""
    from tools.build_repo import onnx2ov_int8, quality_sets

    cpu = dataclasses.replace(
        model.cpu, quantize_exclude=(*model.cpu.quantize_exclude, *candidate.keep_bf16),
        smooth_quant_alpha=candidate.alpha, calibrate_on_tune=candidate.calibrate_on_tune)
    calibration = quality_sets.calibration_set(calibration_texts, quality_set, tokenizer,
                                               max_length, cpu.calibrate_on_tune)
    static = destination.with_name(f"{destination.stem}.static.xml") if candidate.dynamic_group else destination
    result = onnx2ov_int8.quantize_openvino(source, static, dataclasses.replace(model, cpu=cpu),
                                            calibration, quality_set)
    if candidate.dynamic_group:  # a new file: the static IR's weights are memory-mapped
        import nncf
        import openvino

        ir = openvino.Core().read_model(str(static))
        dynamic = [n for n in result.kept_fp32
                   if any(fnmatch.fnmatchcase(n, p) for p in model.cpu.quantize_exclude)]
        others = [n for n in onnx2ov_int8.quantizable_nodes(ir) if n not in dynamic]
        ir = nncf.compress_weights(ir, mode=nncf.CompressWeightsMode.INT8_SYM,
                                   ignored_scope=nncf.IgnoredScope(names=others, validate=False))
        ir.set_rt_info(str(candidate.dynamic_group),
                       ["runtime_options", "DYNAMIC_QUANTIZATION_GROUP_SIZE"])
        openvino.save_model(ir, str(destination), compress_to_fp16=False)


def accuracy_control(source: Path, destination: Path, model, quality_set, reference: np.ndarray,
                     calibration_texts: list[str], tokenizer: Path, max_length: int,
                     max_iterations: int) -> None:
    """NNCF's ``quantize_with_accuracy_control`` from issue 13's recipe: quantizers are reverted
    (their nodes back to bf16), most harmful first, until the metric is within 0.01 of fp32's.
    The metric is the worst cosine to the fp32 embeddings over the tune part (every family's
    min at once); the held-out part is never shown to it."""
    import nncf
    import openvino

    from tools.build_repo import onnx2ov_int8, quality_sets

    tune = sorted((i for i, t in enumerate(quality_set.texts) if t.split == quality_sets.TUNE),
                  key=lambda i: len(quality_set.encodings[i][0]))
    chunks = [tune[k:k + 8] for k in range(0, len(tune), 8)]
    validation = [next(onnx2ov_int8.calibration_batches([quality_set.encodings[i] for i in chunk], 8))
                  for chunk in chunks]

    def validate(compiled, data) -> tuple[float, list[float]]:
        values = []
        for chunk, feed in zip(chunks, data):
            got = compiled(feed)[compiled.outputs[0]]
            values += quality.cosines(reference[chunk], got.astype(np.float64)).tolist()
        return min(values), values

    calibration = quality_sets.calibration_set(calibration_texts, quality_set, tokenizer, max_length)
    ov_model = openvino.Core().read_model(str(source))
    kept = onnx2ov_int8.excluded_nodes(onnx2ov_int8.quantizable_nodes(ov_model),
                                       model.cpu.quantize_exclude, model, source)
    batches = list(onnx2ov_int8.calibration_batches(calibration.encodings))
    quantized = nncf.quantize_with_accuracy_control(
        ov_model, nncf.Dataset(batches), nncf.Dataset(validation), validate, max_drop=0.01,
        drop_type=nncf.DropType.ABSOLUTE, model_type=nncf.ModelType.TRANSFORMER,
        subset_size=len(batches), ignored_scope=nncf.IgnoredScope(names=kept),
        advanced_accuracy_restorer_parameters=nncf.AdvancedAccuracyRestorerParameters(
            max_num_iterations=max_iterations))
    openvino.save_model(quantized, str(destination), compress_to_fp16=False)


def family_minima(quality_set, cosine: np.ndarray, split: str) -> dict[str, tuple[float, int]]:
    """family -> (worst cosine, texts below 0.99) over the texts of ``split``."""
    out = {}
    for family in quality_set.family_names():
        chosen = [i for i in quality_set.members(family) if quality_set.texts[i].split == split]
        if chosen:
            values = cosine[chosen]
            out[family] = (float(values.min()), int((values < 0.99).sum()))
    return out


def throughput(paths: dict[str, Path], batches: list[dict], threads: int, passes: int,
               precision: str) -> dict[str, tuple[list[float], list[float]]]:
    """Per model and pass: texts per second of wall time and per second of this process's CPU
    time (the second moves far less when other work shares the cores), the models interleaved
    within every pass."""
    from pipeline_ops.onnx_session import OpenVinoSession

    sessions = {name: OpenVinoSession(path, threads, precision) for name, path in paths.items()}
    for session in sessions.values():  # first runs compile kernels for these shapes
        for feed in batches:
            session.run(None, feed)
    rates: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in sessions}
    rows = sum(len(feed["input_ids"]) for feed in batches)
    for _ in range(passes):
        for name, session in sessions.items():
            wall, cpu = time.perf_counter(), time.process_time()
            for feed in batches:
                session.run(None, feed)
            rates[name][0].append(rows / (time.perf_counter() - wall))
            rates[name][1].append(rows / (time.process_time() - cpu))
    return rates


def main() -> None:
    os.environ.setdefault("NNCF_CI", "1")
    from nncf.common.logging.logger import set_log_level
    from rich.console import Console

    from tools.build_repo import quality, quality_sets
    from tools.build_repo.parity import onnxruntime_runner
    from tools.build_repo.spec import load_spec, resolve_file

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "repository.yaml")
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--model", default="minilm_encoder_int8")
    parser.add_argument("--bf16-model", default="minilm_encoder_bf16")
    parser.add_argument("--only", nargs="*", choices=sorted(CANDIDATES), default=None)
    parser.add_argument("--held-out", action="store_true",
                        help="also print the held-out part (only once the choice is made)")
    parser.add_argument("--table", action="store_true",
                        help="with --held-out: each candidate's per-family gate table")
    parser.add_argument("--accuracy-control", type=int, default=0, metavar="ITERATIONS",
                        help="also NNCF's quantize_with_accuracy_control, at most this many "
                        "quantizers reverted")
    parser.add_argument("--speed", action="store_true")
    parser.add_argument("--time", nargs="*", default=[], metavar="NAME=IR",
                        help="with --speed: more IRs to time (e.g. another build's model.int8.xml)")
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--keep", action="store_true",
                        help="keep the candidates' IRs (by default the scratch folder is removed)")
    args = parser.parse_args()
    set_log_level(logging.ERROR)
    console = Console(width=160)
    spec = load_spec(args.spec)
    model = spec.find(args.model)
    gate = model.cpu.quality
    quality_set, tokenizer = quality.load_gate_set(gate, spec.root, "")
    calibration_texts = quality_sets.read_texts(resolve_file(model.cpu.calibration_texts, spec.root, ""))
    folder = args.repository / args.model / "1"
    source = folder / "model.onnx"
    fp32 = onnxruntime_runner(str(source), spec.cpu_cores)
    reference = quality.embed(fp32, quality_set.encodings)
    scratch = Path(tempfile.mkdtemp(prefix="ov-int8-families-"))
    try:
        run(args, spec, model, quality_set, tokenizer, calibration_texts, folder, source, fp32,
            reference, scratch, console)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)


def run(args, spec, model, quality_set, tokenizer, calibration_texts, folder, source, fp32,
        reference, scratch, console) -> None:
    """Quantize, judge and (``--speed``) time the candidates, IRs written under ``scratch``."""
    from tools.build_repo import onnx2ov_int8, quality, quality_sets
    from tools.build_repo.parity import openvino_runner

    gate = model.cpu.quality
    splits = [quality_sets.TUNE] + ([quality_sets.HELD_OUT] if args.held_out else [])
    families = quality_set.family_names()
    print(f"{len(quality_set.texts)} quality texts, {len(quality_set.held_out)} held out; "
          f"IRs in {scratch}")
    print("| candidate | part | worst family | its min | texts < 0.99 | degenerate min | "
          "prose min | families < 0.99 | quantize s |")
    print("|---|---|---|---|---|---|---|---|---|")
    paths = {}
    names = list(CANDIDATES) if args.only is None else list(args.only)
    if args.accuracy_control:
        names.append(ACCURACY_CONTROL)
    for name in names:
        path = scratch / f"{name.replace(' ', '_')}.xml"
        started = time.perf_counter()
        if name == ACCURACY_CONTROL:
            accuracy_control(source, path, model, quality_set, reference, calibration_texts,
                             tokenizer, gate.max_length, args.accuracy_control)
        else:
            quantize(CANDIDATES[name], source, path, model, quality_set, calibration_texts,
                     tokenizer, gate.max_length)
        seconds = time.perf_counter() - started
        paths[name] = path
        runner, _ = openvino_runner(str(path), spec.cpu_cores, model.cpu.precision, spec.backends)
        cosine = quality.cosines(reference, quality.embed(runner, quality_set.encodings))
        for split in splits:
            minima = family_minima(quality_set, cosine, split)
            worst = min(families, key=lambda f: minima.get(f, (2.0, 0))[0])
            below = sum(cosine[i] < 0.99 for i, t in enumerate(quality_set.texts) if t.split == split)
            print(f"| {name} | {split} | {worst} | {minima[worst][0]:.4f} | {below} | "
                  f"{minima['form:degenerate'][0]:.4f} | {minima['form:prose'][0]:.4f} | "
                  f"{sum(v < 0.99 for v, _ in minima.values())} | {seconds:.0f} |", flush=True)
        if args.table and args.held_out:
            try:
                report = quality.check_embedding_quality(model, gate, quality_set, fp32, runner)
            except quality.QualityError as exc:
                report = exc.report
            console.print(quality.quality_table(replace(report, model=name)))
    if not args.speed:
        return
    calibration = quality_sets.calibration_set(calibration_texts, quality_set, tokenizer, gate.max_length)
    timed = {"built int8": folder / "model.int8.xml",
             "bf16": args.repository / args.bf16_model / "1" / "model.onnx", **paths,
             **{name: Path(path) for name, path in (item.split("=", 1) for item in args.time)}}
    print(f"\nin-process texts/s, {len(calibration.texts)} calibration texts, length-sorted, "
          f"median of {args.passes} interleaved passes (each pass: every model once); "
          f"load average at start {os.getloadavg()[0]:.1f}")
    for threads, batch in ((1, 8), (2, 32)):
        rates = throughput(timed, list(onnx2ov_int8.calibration_batches(calibration.encodings, batch)),
                           threads, args.passes, model.cpu.precision)
        for kind, label in ((0, "texts/s"), (1, "texts per CPU-second")):
            base = statistics.median(rates["built int8"][kind])
            print(f"  {threads} thread(s), batch {batch}, {label}: " + ", ".join(
                f"{name} {statistics.median(v[kind]):.1f} ({statistics.median(v[kind]) / base:.2f}x)"
                for name, v in rates.items()), flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
