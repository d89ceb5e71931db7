"""The recipes of ``tools add``: read a model folder, factory or ONNX file, and write spec entries.

Each recipe returns the entry texts per spec section; nothing here writes files.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from tools import paths
from tools.errors import ModelSourceError, UserInputError

RECIPES = ("hf-text-embedding", "hf-sequence-classification", "image-classification", "onnx")
TEXT_BATCH, IMAGE_BATCH, ONNX_BATCH = 32, 16, 16
QUEUE = ("dynamic_batching:\n"
         "      max_queue_delay_microseconds: {delay}\n"
         "      default_queue_policy: {{max_queue_size: 128, default_timeout_microseconds: 1000000}}")
# ONNX element types the spec has a dtype for (onnx.TensorProto numbering).
_ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 9: "bool",
                10: "float16", 11: "float64"}


@dataclass
class Entries:
    """What a recipe adds: entry texts per section, the names they define, a summary per entry."""

    blocks: dict[str, list[str]] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)

    def add(self, section: str, name: str, body: str, what: str) -> None:
        """One entry: ``body`` is its YAML under ``name:`` (4-space indented lines)."""
        self.blocks.setdefault(section, []).append(f"  {name}:\n{body.rstrip()}\n")
        self.names.append(name)
        self.summary.append(f"{section}.{name}: {what}")


def spec_path_text(path: Path, spec_dir: Path) -> str:
    """A path as the spec writes it: relative to the spec's folder when inside it, quoted."""
    path = path.resolve()
    try:
        path = path.relative_to(spec_dir.resolve())
    except ValueError:
        pass
    return json.dumps(str(path))


def _check_name(name: str) -> None:
    if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
        raise UserInputError(f"--name {name!r}: must be an identifier (letters, digits, '_')")


def _instances(cores: int, threads: bool) -> str:
    inner = f"count: 1, intra_op_threads: {min(2, cores)}" if threads else "count: 1"
    return f"    instances: {{cpu: {{{inner}}}}}"


def _tokenizer_entry(entries: Entries, name: str, folder, spec_dir: Path, max_length: int) -> None:
    tokenizer = spec_path_text(folder.tokenizer_file, spec_dir)
    entries.add("python_models", name, f"""\
    backend: text_tokenizer
    max_batch_size: {TEXT_BATCH}
    inputs:
      - {{name: TEXT, dtype: string, shape: [batch, 1]}}
    outputs:
      - {{name: input_ids, dtype: int64, shape: [batch, sequence]}}
      - {{name: attention_mask, dtype: int64, shape: [batch, sequence]}}
    # max_length: tokens per text, special tokens included (from the folder's files)
    parameters: {{tokenizer_file: tokenizer.json, max_length: {max_length}}}
    files: {{tokenizer.json: {tokenizer}}}
    {QUEUE.format(delay=500)}
{_instances(1, False)}
""", f"text_tokenizer with {folder.tokenizer_file}, max_length {max_length}")


def _encoder_body(recipe: str, output: str, width: int, max_length: int, cores: int,
                  tolerance: str) -> str:
    opt = max(2, min(32, max_length // 2))
    return f"""\
    recipe: {recipe}
    max_batch_size: {TEXT_BATCH}
    inputs:
      - {{name: input_ids, dtype: int64, shape: [batch, sequence], pad_value: 0}}
      - {{name: attention_mask, dtype: int64, shape: [batch, sequence], pad_value: 0}}
    outputs:
      - {{name: {output}, dtype: float32, shape: [batch, {width}]}}
    axes:
      sequence: {{min: 2, opt: {opt}, max: {max_length}}}
    tolerance: {tolerance}
    {QUEUE.format(delay=2000)}
{_instances(cores, True)}
    gpu: {{backend: onnxruntime}}
"""


def hf_text_embedding(folder_path: Path, name: str, spec_dir: Path, cores: int,
                      pooling: str | None = None, normalize: bool | None = None) -> Entries:
    """Encoder (pooling and normalisation in the graph), tokenizer and pipeline ``name``.

    Pooling and normalisation come from the folder's sentence-transformers modules when it has
    them (an option that disagrees is refused); otherwise from the options (mean, normalised).
    """
    from tools.models.hf_folder import check_transformers_support, read_folder

    _check_name(name)
    folder = read_folder(folder_path, "hf-text-embedding")
    head = folder.sentence_transformers_head()
    if head is not None:
        for option, value, found in (("--pooling", pooling, head[0]),
                                     ("--normalize", normalize, head[1])):
            if value is not None and value != found:
                raise UserInputError(
                    f"{option} {value}: {folder.path / 'modules.json'} says {found}; the recipe "
                    "reproduces the folder's sentence-transformers model"
                )
        pooling, normalize = head
    pooling = pooling or "mean"
    normalize = True if normalize is None else normalize
    check_transformers_support(folder)
    width, max_length = folder.hidden_size, folder.max_length()
    recipe = (f"{{kind: hf-text-embedding, path: {spec_path_text(folder.path, spec_dir)}, "
              f"pooling: {pooling}, normalize: {str(normalize).lower()}}}")
    entries = Entries()
    entries.add("models", f"{name}_encoder",
                _encoder_body(recipe, "embedding", width, max_length, cores,
                              "{atol: 1.0e-4, rtol: 0.0}"),
                f"{folder.config['model_type']} encoder, {pooling} pooling, "
                f"{'L2-normalised' if normalize else 'not normalised'}, embedding [{width}]")
    _tokenizer_entry(entries, f"{name}_tokenizer", folder, spec_dir, max_length)
    entries.add("pipelines", name, f"""\
    max_batch_size: {TEXT_BATCH}
    inputs:
      - {{name: TEXT, dtype: string, shape: [batch, 1]}}
    outputs:
      - {{name: EMBEDDING, dtype: float32, shape: [batch, {width}]}}
    steps:
      - model: {name}_tokenizer
        inputs: {{TEXT: TEXT}}
        outputs: {{input_ids: token_ids, attention_mask: token_mask}}
      - model: {name}_encoder
        inputs: {{input_ids: token_ids, attention_mask: token_mask}}
        outputs: {{embedding: EMBEDDING}}
""", f"TEXT -> EMBEDDING [{width}]")
    return entries


def hf_sequence_classification(folder_path: Path, name: str, spec_dir: Path, cores: int) -> Entries:
    """Classifier (logits), tokenizer, postprocess (softmax, labels) and pipeline ``name``."""
    from tools.models.hf_folder import check_transformers_support, read_folder

    _check_name(name)
    folder = read_folder(folder_path, "hf-sequence-classification")
    check_transformers_support(folder)
    labels, max_length = folder.labels(), folder.max_length()
    count = len(labels)
    recipe = f"{{kind: hf-sequence-classification, path: {spec_path_text(folder.path, spec_dir)}}}"
    entries = Entries()
    entries.add("models", f"{name}_classifier",
                _encoder_body(recipe, "logits", count, max_length, cores,
                              "{atol: 1.0e-4, rtol: 1.0e-3}"),
                f"{folder.config['model_type']} classifier, logits [{count}]")
    _tokenizer_entry(entries, f"{name}_tokenizer", folder, spec_dir, max_length)
    config = spec_path_text(folder.path / "config.json", spec_dir)
    entries.add("python_models", f"{name}_postprocess", f"""\
    backend: text_classification_postprocess
    max_batch_size: {TEXT_BATCH}
    inputs:
      - {{name: logits, dtype: float32, shape: [batch, {count}]}}
    outputs:
      - {{name: label, dtype: string, shape: [batch, 1]}}
      - {{name: score, dtype: float32, shape: [batch, 1]}}
      - {{name: probabilities, dtype: float32, shape: [batch, {count}]}}
    # labels_file: a config.json (its id2label) or a text file with one label per line
    parameters: {{labels_file: config.json}}
    files: {{config.json: {config}}}
    {QUEUE.format(delay=500)}
{_instances(1, False)}
""", f"softmax and labels {labels[:4]}{' ...' if count > 4 else ''}")
    entries.add("pipelines", name, f"""\
    max_batch_size: {TEXT_BATCH}
    inputs:
      - {{name: TEXT, dtype: string, shape: [batch, 1]}}
    outputs:
      - {{name: LABEL, dtype: string, shape: [batch, 1]}}
      - {{name: SCORE, dtype: float32, shape: [batch, 1]}}
      - {{name: PROBABILITIES, dtype: float32, shape: [batch, {count}]}}
    steps:
      - model: {name}_tokenizer
        inputs: {{TEXT: TEXT}}
        outputs: {{input_ids: token_ids, attention_mask: token_mask}}
      - model: {name}_classifier
        inputs: {{input_ids: token_ids, attention_mask: token_mask}}
        outputs: {{logits: logits}}
      - model: {name}_postprocess
        inputs: {{logits: logits}}
        outputs: {{label: LABEL, score: SCORE, probabilities: PROBABILITIES}}
""", f"TEXT -> LABEL, SCORE, PROBABILITIES [{count}]")
    return entries


@dataclass(frozen=True)
class Preprocessing:
    """The image preprocessing as data: geometry, normalisation and channel order."""

    image_size: int = 224
    resize_shorter: int = 256
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    channel_order: str = "RGB"

    def parameters(self) -> str:
        """The ``image_preprocess`` parameters as a YAML flow mapping."""
        parts = [f"image_size: {self.image_size}", f"resize_shorter: {self.resize_shorter}",
                 "max_pixels: 16777216"]
        if self.mean is not None:
            parts += [f'mean: "{",".join(map(str, self.mean))}"',
                      f'std: "{",".join(map(str, self.std))}"']
        parts.append(f"channel_order: {self.channel_order}")
        return "{" + ", ".join(parts) + "}"


def image_classification(factory: str, name: str, spec_dir: Path, cores: int, labels: Path,
                         preprocessing: Preprocessing) -> Entries:
    """Classifier from ``factory``, preprocess (declared as data), top-k postprocess, pipeline.

    The factory is called once to check that it returns a model whose logits have one column
    per label.
    """
    _check_name(name)
    count = _labels_in(labels)
    _check_factory(factory, preprocessing.image_size, count)
    size, k = preprocessing.image_size, min(5, count)
    entries = Entries()
    entries.add("models", f"{name}_classifier", f"""\
    recipe: {{kind: image-classification, factory: {factory}}}
    max_batch_size: {IMAGE_BATCH}
    inputs:
      - {{name: pixel_values, dtype: float32, shape: [batch, 3, {size}, {size}]}}
    outputs:
      - {{name: logits, dtype: float32, shape: [batch, {count}]}}
    tolerance: {{atol: 1.0e-3, rtol: 1.0e-3}}
    {QUEUE.format(delay=2000)}
{_instances(cores, True)}
    gpu: {{backend: onnxruntime}}
""", f"{factory}, pixel_values [3, {size}, {size}] -> logits [{count}]")
    entries.add("python_models", f"{name}_preprocess", f"""\
    backend: image_preprocess
    max_batch_size: {IMAGE_BATCH}
    inputs:
      - {{name: IMAGE, dtype: string, shape: [batch, 1]}}
    outputs:
      - {{name: pixel_values, dtype: float32, shape: [batch, 3, {size}, {size}]}}
    # resize the shorter side, centre-crop image_size; mean/std on [0, 1] pixels (absent:
    # (x - 127.5) / 127.5); channel_order RGB or BGR
    parameters: {preprocessing.parameters()}
    {QUEUE.format(delay=500)}
{_instances(1, False)}
""", f"decode, resize {preprocessing.resize_shorter}, crop {size}")
    entries.add("python_models", f"{name}_postprocess", f"""\
    backend: image_postprocess
    max_batch_size: {IMAGE_BATCH}
    inputs:
      - {{name: logits, dtype: float32, shape: [batch, {count}]}}
    outputs:
      - {{name: class_index, dtype: int64, shape: [batch, {k}]}}
      - {{name: score, dtype: float32, shape: [batch, {k}]}}
      - {{name: label, dtype: string, shape: [batch, {k}]}}
    parameters: {{top_k: {k}, labels_file: labels.txt}}
    files: {{labels.txt: {spec_path_text(labels, spec_dir)}}}
    {QUEUE.format(delay=500)}
{_instances(1, False)}
""", f"softmax, top {k} of {count} labels from {labels}")
    entries.add("pipelines", name, f"""\
    max_batch_size: {IMAGE_BATCH}
    inputs:
      - {{name: IMAGE, dtype: string, shape: [batch, 1]}}
    outputs:
      - {{name: CLASS_INDEX, dtype: int64, shape: [batch, {k}]}}
      - {{name: SCORE, dtype: float32, shape: [batch, {k}]}}
      - {{name: LABEL, dtype: string, shape: [batch, {k}]}}
    steps:
      - model: {name}_preprocess
        inputs: {{IMAGE: IMAGE}}
        outputs: {{pixel_values: pixels}}
      - model: {name}_classifier
        inputs: {{pixel_values: pixels}}
        outputs: {{logits: logits}}
      - model: {name}_postprocess
        inputs: {{logits: logits}}
        outputs: {{class_index: CLASS_INDEX, score: SCORE, label: LABEL}}
""", f"IMAGE -> CLASS_INDEX, SCORE, LABEL [{k}]")
    return entries


def _labels_in(path: Path) -> int:
    """The number of labels in a labels file (the ``image_postprocess`` format)."""
    import sys

    sys.path.insert(0, str(paths.BACKENDS))
    try:
        from pipeline_ops.topk import load_labels
    finally:
        sys.path.pop(0)
    if not path.is_file():
        raise ModelSourceError(f"{path}: the labels file does not exist")
    try:
        return len(load_labels(path))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelSourceError(str(exc)) from None


def _check_factory(factory: str, image_size: int, count: int) -> None:
    """The factory returns a model mapping ``[1, 3, size, size]`` to ``[1, count]`` logits."""
    import torch

    from tools.build_repo.spec import resolve_reference

    model = resolve_reference(factory, f"factory {factory!r}: ")()
    if not isinstance(model, torch.nn.Module):
        raise ModelSourceError(f"factory {factory!r} returned {type(model).__name__}, not a "
                               "torch.nn.Module")
    with torch.no_grad():
        try:
            logits = model.eval()(torch.zeros(1, 3, image_size, image_size))
        except Exception as exc:  # the user's model may raise anything
            raise ModelSourceError(
                f"factory {factory!r}: the model fails on pixel_values [1, 3, {image_size}, "
                f"{image_size}]: {type(exc).__name__}: {exc}"
            ) from None
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != (1, count):
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ModelSourceError(
            f"factory {factory!r}: the model returns {shape}, expected logits (1, {count}) "
            "(one column per label in the labels file)"
        )


def _onnx_tensors(path: Path, values, kind: str) -> tuple[list[str], set[str]]:
    """Spec tensor lines of a graph's inputs or outputs, and the named axes they use."""
    lines, axes = [], set()
    for value in values:
        tensor = value.type.tensor_type
        dtype = _ONNX_DTYPES.get(tensor.elem_type)
        if dtype is None:
            raise ModelSourceError(f"{path}: {kind} {value.name!r} has ONNX element type "
                                   f"{tensor.elem_type}, which the spec has no dtype for")
        dims = list(tensor.shape.dim)
        if not dims or (dims[0].HasField("dim_value") and dims[0].dim_value > 0):
            fixed = dims[0].dim_value if dims else "none (a scalar)"
            raise ModelSourceError(
                f"{path}: {kind} {value.name!r} has no dynamic batch axis (axis 0 is {fixed}); "
                "Triton batches requests: export with dynamic_axes {0: 'batch'}"
            )
        shape = ["batch"]
        for i, dim in enumerate(dims[1:], start=1):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                shape.append(str(dim.dim_value))
                continue
            axis = re.sub(r"\W", "_", dim.dim_param) if dim.dim_param else f"{value.name}_{i}"
            axis = axis if re.match(r"^[A-Za-z_]", axis) and axis != "batch" else f"axis_{axis}"
            shape.append(axis)
            if kind == "input":
                axes.add(axis)
        lines.append(f"      - {{name: {value.name}, dtype: {dtype}, shape: [{', '.join(shape)}]}}")
    return lines, axes


def onnx_model(path: Path, name: str, spec_dir: Path, cores: int) -> Entries:
    """Model ``name`` served from the ONNX file; inputs, outputs and axes read from its graph."""
    import onnx

    _check_name(name)
    path = path.resolve()
    if not path.is_file():
        raise ModelSourceError(f"{path}: no such ONNX file")
    try:
        model = onnx.load(str(path), load_external_data=False)
        onnx.checker.check_model(model)
    except Exception as exc:  # protobuf and checker errors have no common type
        raise ModelSourceError(f"{path}: not a valid ONNX model: {exc}") from None
    graph = model.graph
    initializers = {i.name for i in graph.initializer}
    inputs, axes = _onnx_tensors(path, [v for v in graph.input if v.name not in initializers],
                                 "input")
    outputs, _ = _onnx_tensors(path, graph.output, "output")
    # pad_value 0 on every input: the runner pads requests to the longest of a batch
    inputs = [line[:-1] + ", pad_value: 0}" for line in inputs]
    axes_text = ""
    if axes:
        axes_text = ("    # the served range of each dynamic axis: requests longer than max are "
                     "refused\n    axes:\n" + "".join(
                         f"      {a}: {{min: 1, opt: 64, max: 256}}\n" for a in sorted(axes)))
    entries = Entries()
    entries.add("models", name, f"""\
    onnx: {spec_path_text(path, spec_dir)}
    # no PyTorch reference: parity is skipped (name one with source + sample_inputs)
    max_batch_size: {ONNX_BATCH}
    inputs:
{chr(10).join(inputs)}
    outputs:
{chr(10).join(outputs)}
{axes_text}    {QUEUE.format(delay=2000)}
{_instances(cores, True)}
    gpu: {{backend: onnxruntime}}
""", f"{path.name}: {len(inputs)} input(s), {len(outputs)} output(s), opset "
     f"{max((o.version for o in model.opset_import if o.domain in ('', 'ai.onnx')), default='?')}")
    return entries
