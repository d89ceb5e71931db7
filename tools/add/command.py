"""``tools add RECIPE PATH --name NAME``: the click command over ``tools.add.recipes``.

Prints what was written; the spec is unchanged on any error.
"""

from __future__ import annotations

from pathlib import Path

import click

from tools.command import ToolCommand
from tools.add import recipes
from tools.add.spec_file import write_spec
from tools.build_repo.spec import load_spec
from tools.errors import UserInputError
from tools.slo import plan_new_scenario, slo_file_for


def _floats(option: str, text: str | None) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise UserInputError(f"{option} {text!r}: expected three comma-separated numbers") from None
    if len(values) != 3:
        raise UserInputError(f"{option} {text!r}: expected three values (one per channel)")
    return values


def add_model(recipe: str, path: str, name: str, spec_path: Path, **options) -> list[str]:
    """Write the recipe's entries for ``path`` into the spec.

    Args:
        recipe: one of ``recipes.RECIPES``.
        path: the model folder, the factory reference (``image-classification``) or the ONNX file.
        name: the pipeline's name (models are named after it).
        spec_path: the spec (created when missing).
        **options: the recipe's options (pooling, normalize, prompt, activation, aggregation,
            labels, preprocessing).

    Returns:
        One line per entry written.

    Raises:
        UserInputError: bad input; the spec is unchanged.
    """
    spec_path = Path(spec_path).resolve()
    spec_dir = spec_path.parent
    cores = load_spec(spec_path).cpu_cores if spec_path.exists() else 2
    activation = options.get("activation")
    if options.get("aggregation") is not None and recipe != "hf-token-classification":
        raise UserInputError(f"--aggregation: only hf-token-classification takes it, not {recipe}")
    allowed = recipes.ACTIVATIONS.get(recipe, ())
    if activation is not None and activation not in allowed:
        raise UserInputError(f"--activation {activation}: {recipe} takes "
                             f"{list(allowed) or 'no --activation'}")
    if recipe == "hf-text-embedding":
        entries = recipes.hf_text_embedding(Path(path), name, spec_dir, cores,
                                            options.get("pooling"), options.get("normalize"),
                                            options.get("prompt"), options.get("prompt_name"))
    elif recipe == "hf-sequence-classification":
        entries = recipes.hf_sequence_classification(Path(path), name, spec_dir, cores, activation)
    elif recipe == "hf-cross-encoder":
        entries = recipes.hf_cross_encoder(Path(path), name, spec_dir, cores, activation)
    elif recipe == "hf-token-classification":
        entries = recipes.hf_token_classification(Path(path), name, spec_dir, cores,
                                                  options.get("aggregation") or "simple")
    elif recipe == "image-classification":
        if options.get("labels") is None:
            raise UserInputError("image-classification needs --labels FILE (one label per line)")
        mean, std = _floats("--mean", options.get("mean")), _floats("--std", options.get("std"))
        if (mean is None) != (std is None):
            raise UserInputError("--mean and --std go together")
        preprocessing = recipes.Preprocessing(
            image_size=options.get("image_size") or 224,
            resize_shorter=options.get("resize_shorter") or 256,
            mean=mean, std=std, channel_order=options.get("channel_order") or "RGB",
        )
        entries = recipes.image_classification(path, name, spec_dir, cores,
                                               Path(options["labels"]).resolve(), preprocessing)
    elif recipe == "onnx":
        entries = recipes.onnx_model(Path(path), name, spec_dir, cores)
    else:
        raise UserInputError(f"unknown recipe {recipe!r} (have {list(recipes.RECIPES)})")
    slo = plan_new_scenario(slo_file_for(spec_path), name)  # checked before anything is written
    write_spec(spec_path, entries.blocks, entries.names)
    return [*entries.summary, slo.write()]


@click.command("add", cls=ToolCommand)
@click.argument("recipe", type=click.Choice(recipes.RECIPES))
@click.argument("path")
@click.option("--name", required=True, help="Pipeline name; its models are named after it.")
@click.option("--spec", "spec_path", type=click.Path(path_type=Path), default=Path("repository.yaml"),
              show_default=True, help="The spec to add to (created when missing).")
@click.option("--pooling", type=click.Choice(["mean", "cls"]), default=None,
              help="hf-text-embedding without sentence-transformers files: pooling (default mean).")
@click.option("--normalize/--no-normalize", default=None,
              help="hf-text-embedding without sentence-transformers files: L2-normalise (default on).")
@click.option("--labels", type=click.Path(path_type=Path), default=None,
              help="image-classification: labels file, one class name per line.")
@click.option("--image-size", type=int, default=None, help="image-classification: crop side (224).")
@click.option("--resize-shorter", type=int, default=None,
              help="image-classification: shorter side before the crop (256).")
@click.option("--mean", default=None,
              help="image-classification: e.g. 0.485,0.456,0.406 (on [0,1]); required unless the "
                   "model carries it (timm pretrained_cfg, a preprocessor_config.json).")
@click.option("--std", default=None, help="image-classification: e.g. 0.229,0.224,0.225.")
@click.option("--channel-order", type=click.Choice(["RGB", "BGR"]), default=None,
              help="image-classification: channel order the model expects (RGB).")
@click.option("--activation", type=click.Choice(["softmax", "sigmoid", "identity"]), default=None,
              help="hf-sequence-classification: softmax|sigmoid|identity (default from "
                   "config.json problem_type); hf-cross-encoder: sigmoid|identity (default as "
                   "sentence-transformers' CrossEncoder: sigmoid for one label).")
@click.option("--aggregation", type=click.Choice(recipes.AGGREGATIONS), default=None,
              help="hf-token-classification: how tokens become entities, as transformers' "
                   "pipeline(aggregation_strategy=...): none (one per token), simple (default), "
                   "first, average or max (a word's tokens agree on one label).")
@click.option("--prompt", default=None,
              help="hf-text-embedding: prepended to every text, e.g. 'query: ' (default: the "
                   "folder's default_prompt_name prompt, if any).")
@click.option("--prompt-name", default=None,
              help="hf-text-embedding: a prompt of the folder's config_sentence_transformers.json.")
def add(recipe: str, path: str, name: str, spec_path: Path, **options) -> None:
    """Add a model from PATH (folder, factory reference or ONNX file) to the spec, as NAME.

    RECIPE: hf-text-embedding DIR, hf-sequence-classification DIR, hf-cross-encoder DIR,
    hf-token-classification DIR, image-classification package.module:factory --labels FILE, or
    onnx FILE. Then run `tools build-repo`.
    """
    for line in add_model(recipe, path, name, spec_path, **options):
        click.echo(f"added {line}")
    click.echo(f"wrote {spec_path}; review the entries, then run: tools build-repo --spec {spec_path}")
