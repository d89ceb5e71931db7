"""The recipes of ``tools add``: read a model folder, factory or ONNX file, and write spec entries.

Each recipe returns the entry texts per spec section; nothing here writes files.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tools import paths
from tools.errors import ModelSourceError, UserInputError
from tools.models.hf_folder import AGGREGATIONS

if TYPE_CHECKING:
    from tools.models.hf_folder import HfFolder

RECIPES = ("hf-text-embedding", "hf-sequence-classification", "hf-cross-encoder",
           "hf-token-classification", "image-classification", "onnx")
TEXT_BATCH, IMAGE_BATCH, ONNX_BATCH = 32, 16, 16
# --activation per recipe (the default comes from the folder).
ACTIVATIONS = {"hf-sequence-classification": ("softmax", "sigmoid", "identity"),
               "hf-cross-encoder": ("sigmoid", "identity")}
# ONNX element types the spec has a dtype for (onnx.TensorProto numbering).
_ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 9: "bool",
                10: "float16", 11: "float64"}
WARMUP_TEXT = "Warm up the tokenizer before the first request."

# The settings of the shipped entries (repository.yaml), measured there: the compute models run
# 2 instances x 1 thread with no queue delay (the `tools tune` winner, README "Tuning"); a text
# encoder has no queue policy (Triton then prefetches its next batch) because its tokenizer's
# queue gate bounds it; the steps around them queue 500 us. tests/test_add_defaults.py compares
# what tools add writes with the shipped entries.
COMPUTE_DELAY_US = 0
STEP_DELAY_US = 500
QUEUE_POLICY = "{max_queue_size: 64, default_timeout_microseconds: 1000000}"
ADMISSION = "admission_max_pending: 64, admission_max_wait_ms: 500"
TOKENIZER_PREFERRED_BATCH = 8
GPU_INSTANCES = "gpu: {count: 2, gpus: [0]}"
SPAN_OUTPUTS = ("offsets", "special_tokens_mask")  # the tokenizer's, for token classification


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


def _same_names(names: list[str]) -> str:
    """A step's ``inputs``/``outputs`` mapping that keeps each tensor's name in the ensemble."""
    return "{" + ", ".join(f"{n}: {n}" for n in names) + "}"


def _tensors(rows: list[tuple[str, str, str]], pad: bool = False) -> str:
    """``inputs:``/``outputs:`` list lines of ``(name, dtype, shape)`` (``pad_value: 0`` on each)."""
    extra = ", pad_value: 0" if pad else ""
    return "\n".join(f"      - {{name: {n}, dtype: {d}, shape: [batch, {shape}]{extra}}}"
                     for n, d, shape in rows)


def compute_settings(cores: int, gated: bool) -> str:
    """``dynamic_batching`` and ``instances`` of a compute model, as the shipped encoders have them.

    Args:
        cores: the spec's ``cpu_cores`` (instances x 1 thread must fit).
        gated: a pipeline's first step gates the model's queue (``admission_models``), so it has
            no queue policy of its own, as ``minilm_encoder``; else a bounded queue, as
            ``efficientnet_lite0``.
    """
    policy = "null" if gated else QUEUE_POLICY
    return f"""\
    dynamic_batching:
      max_queue_delay_microseconds: {COMPUTE_DELAY_US}   # as the shipped encoders: the tools tune winner
      default_queue_policy: {policy}
    instances:
      cpu: {{count: {min(2, cores)}, intra_op_threads: 1}}
      {GPU_INSTANCES}
"""


def _step_settings(cpu_count: int, gpu_count: int, preferred: int | None = None) -> str:
    """``dynamic_batching`` and ``instances`` of a Python step, as the shipped steps have them."""
    batch = f"\n      preferred_batch_size: [{preferred}]" if preferred else ""
    return f"""\
    dynamic_batching:
      max_queue_delay_microseconds: {STEP_DELAY_US}{batch}
      default_queue_policy: {QUEUE_POLICY}
    instances: {{cpu: {{count: {cpu_count}}}, gpu: {{count: {gpu_count}, kind: cpu}}}}
"""


def length_buckets(max_length: int) -> str:
    """The gpu tokenizer's lengths: powers of two from 16, then ``max_length`` (the shipped
    ``text_tokenizer`` pads to 16,32,64,128,256 for its 256 tokens)."""
    buckets, size = [], 16
    while size < max_length:
        buckets.append(size)
        size *= 2
    return ",".join(map(str, [*buckets, max_length]))


@dataclass(frozen=True)
class TokenizerStep:
    """What a recipe's tokenizer step is: its folder, limit, inputs and outputs, prompt, gate."""

    folder: HfFolder
    max_length: int
    gates: str  # the model whose queue it gates (admission_models)
    pairs: bool = False
    token_types: bool = False
    prompt: str = ""
    offsets: bool = False  # each token's character span, for token classification

    @property
    def inputs(self) -> list[str]:
        """``TEXT`` (and ``TEXT_PAIR``)."""
        return ["TEXT", "TEXT_PAIR"] if self.pairs else ["TEXT"]

    @property
    def encodes(self) -> list[str]:
        """What the model after it takes: ``input_ids``, ``attention_mask`` (and
        ``token_type_ids``)."""
        return ["input_ids", "attention_mask", *(["token_type_ids"] if self.token_types else [])]

    @property
    def outputs(self) -> list[str]:
        """``encodes`` (and ``offsets``, ``special_tokens_mask``)."""
        return [*self.encodes, *(SPAN_OUTPUTS if self.offsets else ())]


def _tokenizer_entry(entries: Entries, name: str, step: TokenizerStep, spec_dir: Path,
                     cores: int) -> None:
    folder = step.folder
    location = spec_path_text(folder.path, spec_dir)
    if folder.has_tokenizer_json:
        source = f"files: {{tokenizer.json: {spec_path_text(folder.tokenizer_file, spec_dir)}}}"
        what = f"{folder.tokenizer_file}"
    else:  # converted at build time into the version folder, never into the user's folder
        source = ("# tokenizer.json: converted from the folder's vocabulary by transformers at "
                  f"build time\n    recipe: {{kind: hf-tokenizer, path: {location}}}")
        what = f"tokenizer.json converted from {folder.path}'s vocabulary at build time"
    prompt = f"prompt: {json.dumps(step.prompt)}, " if step.prompt else ""
    prompt_note = "\n    # prompt: prepended to every TEXT (sentence-transformers' prompts)" if step.prompt else ""
    inputs = _tensors([(n, "string", "1") for n in step.inputs])
    outputs = _tensors([(n, "int64", "sequence, 2" if n == "offsets" else "sequence")
                        for n in step.outputs])
    warmup = ", ".join(f"{n}: [{json.dumps(WARMUP_TEXT)}]" for n in step.inputs)
    entries.add("python_models", name, f"""\
    backend: text_tokenizer
    max_batch_size: {TEXT_BATCH}
    inputs:
{inputs}
    outputs:
{outputs}
    # max_length: tokens per {'pair' if step.pairs else 'text'}, special tokens included (from the folder's files){prompt_note}
    # admission_*: a batch waits until {step.gates} has room (as the shipped text_tokenizer)
    parameters: {{tokenizer_file: tokenizer.json, max_length: {step.max_length}, {prompt}admission_models: {step.gates}, {ADMISSION}}}
    # gpu: native backends take no ragged batches: pad to these lengths so requests merge
    target_parameters: {{gpu: {{length_buckets: "{length_buckets(step.max_length)}"}}}}
    {source}
{_step_settings(min(2, cores), 2, TOKENIZER_PREFERRED_BATCH)}\
    warmup:
      - {{batch_size: 1, inputs: {{{warmup}}}}}
""", f"text_tokenizer ({'pairs, ' if step.pairs else ''}{what}), max_length {step.max_length}"
     + (f", prompt {step.prompt!r}" if step.prompt else ""))


def _encoder_body(recipe: str, inputs: list[str], output: str, width: int, max_length: int,
                  cores: int, tolerance: str) -> str:
    opt = max(2, min(32, max_length // 2))
    return f"""\
    recipe: {recipe}
    max_batch_size: {TEXT_BATCH}
    inputs:
{_tensors([(n, "int64", "sequence") for n in inputs], pad=True)}
    outputs:
      - {{name: {output}, dtype: float32, shape: [batch, {width}]}}
    axes:
      sequence: {{min: 2, opt: {opt}, max: {max_length}}}
    tolerance: {tolerance}
{compute_settings(cores, gated=True)}\
    gpu: {{backend: onnxruntime}}
"""


# What the served outputs mean, per activation (written above a pipeline's outputs).
OUTPUT_MEANINGS = {
    "softmax": "LABEL: the most probable label; SCORE: its probability; PROBABILITIES: softmax "
               "over the labels (sum 1)",
    "sigmoid": "PROBABILITIES: each label's own probability (sigmoid, multi-label: threshold "
               "them); LABEL/SCORE: the most probable one",
    "identity": "SCORE: the model's raw outputs (no activation)",
    "cross-sigmoid": "SCORE: sigmoid of the pair's logits, as CrossEncoder.predict",
    "cross-identity": "SCORE: the pair's raw logits, as CrossEncoder.predict(activation_fn=Identity())",
}


def _text_pipeline(entries: Entries, name: str, step: TokenizerStep, steps: str,
                   outputs: list[tuple[str, str, str]], what: str, meaning: str = "",
                   parameters: str = "") -> None:
    note = f"    # {meaning}\n" if meaning else ""
    entries.add("pipelines", name, f"""\
    max_batch_size: {TEXT_BATCH}
{parameters}    inputs:
{_tensors([(n, "string", "1") for n in step.inputs])}
{note}    outputs:
{_tensors(outputs)}
    steps:
      - model: {name}_tokenizer
        inputs: {_same_names(step.inputs)}
        outputs: {_same_names(step.outputs)}
{steps}""", what)


def hf_text_embedding(folder_path: Path, name: str, spec_dir: Path, cores: int,
                      pooling: str | None = None, normalize: bool | None = None,
                      prompt: str | None = None, prompt_name: str | None = None) -> Entries:
    """Encoder (pooling and normalisation in the graph), tokenizer and pipeline ``name``.

    Pooling and normalisation come from the folder's sentence-transformers modules when it has
    them (an option that disagrees is refused); otherwise from the options (mean, normalised).
    The prompt prepended to every text is ``prompt``, else the folder's prompt ``prompt_name``,
    else its ``default_prompt_name``'s (sentence-transformers' ``encode`` does the same).
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
    prompt = _prompt(folder, prompt, prompt_name)
    check_transformers_support(folder)
    width, max_length = folder.hidden_size, folder.max_length()
    recipe = (f"{{kind: hf-text-embedding, path: {spec_path_text(folder.path, spec_dir)}, "
              f"pooling: {pooling}, normalize: {str(normalize).lower()}}}")
    step = TokenizerStep(folder, max_length, f"{name}_encoder", prompt=prompt)
    entries = Entries()
    entries.add("models", f"{name}_encoder",
                _encoder_body(recipe, step.encodes, "embedding", width, max_length, cores,
                              "{atol: 1.0e-4, rtol: 0.0}"),
                f"{folder.config['model_type']} encoder, {pooling} pooling, "
                f"{'L2-normalised' if normalize else 'not normalised'}, embedding [{width}]")
    _tokenizer_entry(entries, f"{name}_tokenizer", step, spec_dir, cores)
    _text_pipeline(entries, name, step, f"""\
      - model: {name}_encoder
        inputs: {_same_names(step.outputs)}
        outputs: {{embedding: EMBEDDING}}
""", [("EMBEDDING", "float32", str(width))], f"TEXT -> EMBEDDING [{width}]")
    return entries


def _prompt(folder: HfFolder, prompt: str | None, prompt_name: str | None) -> str:
    """The prompt the recipe prepends, as sentence-transformers' ``encode`` resolves it."""
    prompts, default = folder.prompts()
    where = folder.path / "config_sentence_transformers.json"
    if prompt is not None and prompt_name is not None:
        raise UserInputError("--prompt and --prompt-name: give one of them")
    if prompt_name is not None:
        if prompt_name not in prompts:
            raise UserInputError(f"--prompt-name {prompt_name!r}: {where} has prompts "
                                 f"{sorted(prompts) or 'none'}")
        prompt = prompts[prompt_name]
    elif prompt is None:
        prompt = prompts.get(default, "") if default else ""
    if prompt and not folder.pooling_includes_prompt():
        raise ModelSourceError(
            f"{folder.path}: its Pooling module leaves prompt tokens out (include_prompt: false), "
            "which the served graph does not reproduce; serve it without a prompt (--prompt '')"
        )
    return prompt


def hf_sequence_classification(folder_path: Path, name: str, spec_dir: Path, cores: int,
                               activation: str | None = None) -> Entries:
    """Classifier (logits), tokenizer, the activation its ``problem_type`` calls for, pipeline.

    ``single_label_classification``: softmax (``PROBABILITIES`` sum to 1, ``SCORE`` is the best
    label's); ``multi_label_classification``: sigmoid per label (each independent);
    ``regression``: the raw outputs as ``SCORE``, no labels. ``activation`` overrides it.
    """
    from tools.models.hf_folder import PROBLEM_ACTIVATIONS, check_transformers_support, read_folder

    _check_name(name)
    folder = read_folder(folder_path, "hf-sequence-classification")
    check_transformers_support(folder)
    labels, max_length = folder.labels(), folder.max_length()
    problem = folder.problem_type()
    activation = activation or PROBLEM_ACTIVATIONS[problem]
    count = len(labels)
    recipe = f"{{kind: hf-sequence-classification, path: {spec_path_text(folder.path, spec_dir)}}}"
    step = TokenizerStep(folder, max_length, f"{name}_classifier")
    entries = Entries()
    entries.add("models", f"{name}_classifier",
                _encoder_body(recipe, step.encodes, "logits", count, max_length, cores,
                              "{atol: 1.0e-4, rtol: 1.0e-3}"),
                f"{folder.config['model_type']} classifier ({problem}), logits [{count}]")
    _tokenizer_entry(entries, f"{name}_tokenizer", step, spec_dir, cores)
    classify = f"""\
      - model: {name}_classifier
        inputs: {_same_names(step.encodes)}
        outputs: {{logits: {'SCORE' if activation == 'identity' else 'logits'}}}
"""
    if activation == "identity":
        _text_pipeline(entries, name, step, classify, [("SCORE", "float32", str(count))],
                       f"TEXT -> SCORE [{count}] (the model's outputs as they are: {problem})",
                       f"{OUTPUT_MEANINGS['identity']} ({problem})")
        return entries
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
    # labels_file: a config.json (its id2label) or a text file with one label per line;
    # activation: softmax (single-label) or sigmoid (multi-label), from problem_type {problem}
    parameters: {{labels_file: config.json, activation: {activation}}}
    files: {{config.json: {config}}}
{_step_settings(1, 1)}""", f"{activation} and labels {labels[:4]}{' ...' if count > 4 else ''}")
    _text_pipeline(entries, name, step, classify + f"""\
      - model: {name}_postprocess
        inputs: {{logits: logits}}
        outputs: {{label: LABEL, score: SCORE, probabilities: PROBABILITIES}}
""", [("LABEL", "string", "1"), ("SCORE", "float32", "1"),
      ("PROBABILITIES", "float32", str(count))],
        f"TEXT -> LABEL, SCORE, PROBABILITIES [{count}] ({activation}: {problem})",
        OUTPUT_MEANINGS[activation])
    return entries


def hf_cross_encoder(folder_path: Path, name: str, spec_dir: Path, cores: int,
                     activation: str | None = None) -> Entries:
    """A cross-encoder (``*ForSequenceClassification`` scoring text pairs), its pair tokenizer
    and pipeline ``name``: ``TEXT``, ``TEXT_PAIR`` -> ``SCORE``.

    The score is sentence-transformers' ``CrossEncoder.predict`` for the folder: its saved
    activation, else sigmoid for one label and identity otherwise; ``activation`` overrides it.
    """
    from tools.models.hf_folder import check_transformers_support, read_folder, takes_token_types

    _check_name(name)
    folder = read_folder(folder_path, "hf-cross-encoder")
    check_transformers_support(folder)
    count, max_length = len(folder.labels()), folder.max_length()
    activation = activation or folder.cross_encoder_activation()
    step = TokenizerStep(folder, max_length, f"{name}_cross_encoder", pairs=True,
                         token_types=takes_token_types(folder))
    recipe = (f"{{kind: hf-cross-encoder, path: {spec_path_text(folder.path, spec_dir)}, "
              f"activation: {activation}}}")
    entries = Entries()
    entries.add("models", f"{name}_cross_encoder",
                _encoder_body(recipe, step.encodes, "score", count, max_length, cores,
                              "{atol: 1.0e-4, rtol: 1.0e-3}"),
                f"{folder.config['model_type']} cross-encoder, {activation}, score [{count}]"
                + (", token_type_ids" if step.token_types else ""))
    _tokenizer_entry(entries, f"{name}_tokenizer", step, spec_dir, cores)
    _text_pipeline(entries, name, step, f"""\
      - model: {name}_cross_encoder
        inputs: {_same_names(step.encodes)}
        outputs: {{score: SCORE}}
""", [("SCORE", "float32", str(count))], f"TEXT, TEXT_PAIR -> SCORE [{count}] ({activation})",
        OUTPUT_MEANINGS[f"cross-{activation}"])
    return entries


def hf_token_classification(folder_path: Path, name: str, spec_dir: Path, cores: int,
                            aggregation: str = "simple") -> Entries:
    """A token classifier (per-token logits), a tokenizer that keeps each token's character
    span, and a postprocess that aggregates the tokens into entities as transformers'
    ``pipeline("token-classification", aggregation_strategy=aggregation)`` does: pipeline
    ``name``: ``TEXT`` -> ``ENTITIES`` (one JSON array per text).

    Texts are truncated where that pipeline truncates them (the tokenizer's
    ``model_max_length``, at most the model's positions).
    """
    from tools.models.hf_folder import check_transformers_support, read_folder

    _check_name(name)
    if aggregation not in AGGREGATIONS:
        raise UserInputError(f"--aggregation {aggregation}: one of {list(AGGREGATIONS)}")
    folder = read_folder(folder_path, "hf-token-classification")
    check_transformers_support(folder)
    labels, max_length = folder.labels(), folder.tokenizer_max_length()
    count = len(labels)
    step = TokenizerStep(folder, max_length, f"{name}_classifier", offsets=True)
    recipe = f"{{kind: hf-token-classification, path: {spec_path_text(folder.path, spec_dir)}}}"
    entries = Entries()
    entries.add("models", f"{name}_classifier",
                _encoder_body(recipe, step.encodes, "logits", f"sequence, {count}", max_length,
                              cores, "{atol: 1.0e-4, rtol: 1.0e-3}"),
                f"{folder.config['model_type']} token classifier, logits [sequence, {count}]")
    _tokenizer_entry(entries, f"{name}_tokenizer", step, spec_dir, cores)
    config = spec_path_text(folder.path / "config.json", spec_dir)
    if folder.has_tokenizer_json:
        files = (f"files: {{config.json: {config}, tokenizer.json: "
                 f"{spec_path_text(folder.tokenizer_file, spec_dir)}}}")
    else:
        files = (f"files: {{config.json: {config}}}\n    recipe: {{kind: hf-tokenizer, path: "
                 f"{spec_path_text(folder.path, spec_dir)}}}")
    inputs = [("TEXT", "string", "1"), ("input_ids", "int64", "sequence"),
              ("logits", "float32", f"sequence, {count}"), ("offsets", "int64", "sequence, 2"),
              ("special_tokens_mask", "int64", "sequence")]
    entries.add("python_models", f"{name}_postprocess", f"""\
    backend: token_classification_postprocess
    max_batch_size: {TEXT_BATCH}
    inputs:
{_tensors(inputs)}
    outputs:
      - {{name: entities, dtype: string, shape: [batch, 1]}}
    # aggregation_strategy: none, simple, first, average or max, as transformers'
    # pipeline("token-classification", aggregation_strategy=...); labels_file: config.json's
    # id2label; tokenizer_file: the token strings and how words are decoded; ignore_labels:
    # labels left out of the answer (JSON list)
    parameters: {{aggregation_strategy: {aggregation}, labels_file: config.json, tokenizer_file: tokenizer.json, ignore_labels: '["O"]'}}
    {files}
{_step_settings(1, 1)}""", f"{aggregation} aggregation of {count} labels {labels[:4]}"
                           f"{' ...' if count > 4 else ''}")
    fields = ("{entity, score, index, word, start, end} per token" if aggregation == "none"
              else "{entity_group, score, word, start, end} per entity")
    meaning = f"ENTITIES: per text, a UTF-8 JSON array of {fields}"
    _text_pipeline(entries, name, step, f"""\
      - model: {name}_classifier
        inputs: {_same_names(step.encodes)}
        outputs: {{logits: logits}}
      - model: {name}_postprocess
        inputs: {_same_names([n for n, _, _ in inputs])}
        outputs: {{entities: ENTITIES}}
""", [("ENTITIES", "string", "1")], f"TEXT -> ENTITIES ({aggregation} aggregation of "
        f"{count} labels, offsets in characters)",
        meaning + "; start/end: character offsets into the text (end exclusive)",
        "    # task: what the pipeline answers (a gateway picks its route by it)\n"
        "    parameters: {task: token-classification}\n")
    return entries


@dataclass(frozen=True)
class Preprocessing:
    """The image preprocessing as data: geometry, normalisation and channel order.

    ``mean``/``std`` None: read from the model's own config (:func:`normalisation_of`).
    """

    image_size: int = 224
    resize_shorter: int = 256
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    channel_order: str = "RGB"

    def parameters(self) -> str:
        """The ``image_preprocess`` parameters as a YAML flow mapping."""
        parts = [f"image_size: {self.image_size}", f"resize_shorter: {self.resize_shorter}",
                 "max_pixels: 16777216",
                 f'mean: "{",".join(map(str, self.mean))}"',
                 f'std: "{",".join(map(str, self.std))}"',
                 f"channel_order: {self.channel_order}"]
        return "{" + ", ".join(parts) + "}"


MEAN_STD_FLAGS = ("image-classification needs the normalisation the model was trained with: "
                  "--mean and --std on [0, 1] pixels (ImageNet's: --mean 0.485,0.456,0.406 "
                  "--std 0.229,0.224,0.225)")


def normalisation_of(model, factory: str) -> tuple[tuple[float, ...], tuple[float, ...], str]:
    """``(mean, std, where)`` from the model's own config, as its library preprocesses for it.

    timm's ``pretrained_cfg`` (``mean``/``std``) on the module; for a transformers model, the
    ``preprocessor_config.json`` (``image_mean``/``image_std``, on pixels rescaled to [0, 1])
    beside the folder it was loaded from (``config._name_or_path``).

    Raises:
        UserInputError: neither exists, naming the flags (never a silent default).
        ModelSourceError: a preprocessor config this preprocessing cannot reproduce.
    """
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None)
    if isinstance(cfg, dict) and cfg.get("mean") is not None and cfg.get("std") is not None:
        return _channels(cfg["mean"]), _channels(cfg["std"]), "timm pretrained_cfg"
    folder = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    path = Path(folder) / "preprocessor_config.json" if folder else None
    if path is not None and path.is_file():
        config = json.loads(path.read_text(encoding="utf-8"))
        rescale = config.get("rescale_factor", 1 / 255)
        if config.get("do_rescale", True) is False or abs(rescale * 255 - 1) > 1e-6:
            raise ModelSourceError(
                f"{path}: do_rescale {config.get('do_rescale', True)}, rescale_factor {rescale}: "
                "the preprocessing normalises pixels scaled to [0, 1]; give --mean and --std"
            )
        if config.get("do_normalize", True) is False:
            return (0.0, 0.0, 0.0), (1.0, 1.0, 1.0), str(path)
        if config.get("image_mean") is None or config.get("image_std") is None:
            raise UserInputError(f"{MEAN_STD_FLAGS}; {path} has no image_mean/image_std")
        return _channels(config["image_mean"]), _channels(config["image_std"]), str(path)
    raise UserInputError(
        f"{MEAN_STD_FLAGS}; factory {factory!r}'s model carries no timm pretrained_cfg nor a "
        "transformers preprocessor_config.json to read them from"
    )


def _channels(values) -> tuple[float, ...]:
    values = tuple(float(v) for v in values)
    return values * 3 if len(values) == 1 else values


def image_classification(factory: str, name: str, spec_dir: Path, cores: int, labels: Path,
                         preprocessing: Preprocessing) -> Entries:
    """Classifier from ``factory``, preprocess (declared as data), top-k postprocess, pipeline.

    The factory is called once to check that it returns a model whose logits have one column
    per label, and, without ``--mean``/``--std``, to read them from the model's config.
    """
    import dataclasses

    _check_name(name)
    count = _labels_in(labels)
    model = _check_factory(factory, preprocessing.image_size, count)
    normalised = f"mean/std {preprocessing.mean}/{preprocessing.std}"
    if preprocessing.mean is None:
        mean, std, where = normalisation_of(model, factory)
        preprocessing = dataclasses.replace(preprocessing, mean=mean, std=std)
        normalised = f"mean/std {mean}/{std} from {where}"
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
{compute_settings(cores, gated=False)}\
    gpu: {{backend: onnxruntime}}
""", f"{factory}, pixel_values [3, {size}, {size}] -> logits [{count}]")
    entries.add("python_models", f"{name}_preprocess", f"""\
    backend: image_preprocess
    max_batch_size: {IMAGE_BATCH}
    inputs:
      - {{name: IMAGE, dtype: string, shape: [batch, 1]}}
    outputs:
      - {{name: pixel_values, dtype: float32, shape: [batch, 3, {size}, {size}]}}
    # resize the shorter side, centre-crop image_size; mean/std on [0, 1] pixels; channel_order
    # RGB or BGR
    parameters: {preprocessing.parameters()}
{_step_settings(1, 2)}""", f"decode, resize {preprocessing.resize_shorter}, crop {size}, {normalised}")
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
{_step_settings(1, 1)}""", f"softmax, top {k} of {count} labels from {labels}")
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


def _check_factory(factory: str, image_size: int, count: int):
    """The factory's model, mapping ``[1, 3, size, size]`` to ``[1, count]`` logits.

    Returns:
        The model the factory returned (its config may hold the normalisation).
    """
    import torch

    from tools.build_repo.spec import resolve_reference
    from tools.models.vision import Logits

    model = resolve_reference(factory, f"factory {factory!r}: ")()
    if not isinstance(model, torch.nn.Module):
        raise ModelSourceError(f"factory {factory!r} returned {type(model).__name__}, not a "
                               "torch.nn.Module")
    with torch.no_grad():
        try:
            logits = Logits(model).eval()(torch.zeros(1, 3, image_size, image_size))
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
    return model


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
{axes_text}{compute_settings(cores, gated=False)}\
    gpu: {{backend: onnxruntime}}
""", f"{path.name}: {len(inputs)} input(s), {len(outputs)} output(s), opset "
     f"{max((o.version for o in model.opset_import if o.domain in ('', 'ai.onnx')), default='?')}")
    return entries
