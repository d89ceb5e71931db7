"""What ``tools bench`` measures for each pipeline of a built repository, read from its configs.

Any model or pipeline of the repository can be served and swept: its requests are derived from
its inputs (texts for string inputs, the shipped photos for an ``IMAGE`` input). The in-process
limit is derived where it can be: text pipelines of two steps (tokenizer -> encoder); other
pipelines say why not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tools import paths
from tools.bench.inprocess import EncoderSetup, model_config, pipeline_models, read_setup
from tools.errors import UserInputError
from tools.load import Request

IMAGES_DIR = paths.IMAGES_DIR
_IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png"}
_STRING = "TYPE_STRING"


@dataclass(frozen=True)
class Target:
    """One pipeline (or model) of the repository, as the bench will measure it.

    Attributes:
        name: The pipeline or model.
        requests: One prepared request per text or image (empty: cannot be swept).
        payload: What the requests carry (``texts``, ``images``), or why there are none.
        setup: The text pipeline's tokenizer and encoder for the in-process limit, or None.
        limit_na: Why there is no in-process limit ("" when there is one).
        steps: The models that serve it (an ensemble's steps, else the model itself).
    """

    name: str
    requests: tuple[Request, ...]
    payload: str
    setup: EncoderSetup | None
    limit_na: str
    steps: tuple[str, ...]

    @property
    def servable(self) -> bool:
        """True when requests could be prepared for it."""
        return bool(self.requests)


def known_models(repository: Path) -> list[str]:
    """Every model folder of ``repository`` with a ``config.pbtxt``, sorted."""
    if not repository.is_dir():
        return []
    return sorted(p.parent.name for p in repository.glob("*/config.pbtxt"))


def load_images(directory: Path = IMAGES_DIR) -> list[bytes]:
    """The shipped photos' encoded bytes, sorted by name."""
    return [p.read_bytes() for p in sorted(directory.iterdir())
            if p.suffix.lower() in _IMAGE_SUFFIXES]


def _shape(tensor: Mapping[str, Any], batched: bool) -> list[int]:
    dims = [1 if int(d) < 0 else int(d) for d in tensor.get("dims", [])]
    return ([1] if batched else []) + dims


def prepare_requests(name: str, config: Mapping[str, Any], texts: Sequence[str],
                     images: Sequence[bytes]) -> tuple[list[Request], str]:
    """One request per text (string inputs) or per image (an ``IMAGE`` input) for ``name``.

    Several string inputs (a text pair: ``TEXT``, ``TEXT_PAIR``) get consecutive texts.

    Returns:
        The requests and ``texts`` / ``images``; or no requests and why.
    """
    inputs = [t for t in config.get("input", []) if not t.get("optional")]
    outputs = tuple(t["name"] for t in config.get("output", []))
    batched = int(config.get("max_batch_size", 0)) > 0
    other = [t for t in inputs if t.get("data_type") != _STRING]
    if not inputs or other:
        kinds = ", ".join(f"{t['name']} ({t.get('data_type', '?').removeprefix('TYPE_')})"
                          for t in other) or "none"
        return [], (f"no payloads for inputs {kinds}: tools bench sends texts to string inputs "
                    f"and photos to an IMAGE input")
    if any(t["name"].upper().startswith("IMAGE") for t in inputs):
        if len(inputs) > 1:
            return [], "an IMAGE input beside other inputs: no payloads for that"
        values, payload = list(images), "images"
    else:
        values, payload = [t.encode("utf-8") for t in texts], "texts"
    requests = []
    for i in range(len(values)):
        arrays = {t["name"]: np.full(_shape(t, batched), values[(i + k) % len(values)],
                                     dtype=np.object_) for k, t in enumerate(inputs)}
        requests.append(Request(name, arrays, outputs))
    return requests, payload


def _steps(config: Mapping[str, Any], name: str) -> tuple[str, ...]:
    steps = config.get("ensemble_scheduling", {}).get("step", [])
    return tuple(s["model_name"] for s in steps) or (name,)


def _limit_setup(repository: Path, name: str, config: Mapping[str, Any],
                 payload: str) -> tuple[EncoderSetup | None, str]:
    if "ensemble_scheduling" not in config:
        return None, "not an ensemble: the in-process limit is derived for tokenizer -> encoder"
    if payload != "texts":
        return None, "the in-process limit is derived for text pipelines only"
    try:
        pipeline_models(repository, name)
        return read_setup(repository, name), ""
    except UserInputError as exc:
        return None, str(exc)


def resolve(repository: Path, names: Sequence[str], texts: Sequence[str], *,
            explicit: bool) -> tuple[list[Target], list[str]]:
    """The targets of ``names`` in ``repository``, and notes on the ones left out.

    Args:
        repository: The built repository.
        names: Pipelines or models, in the order to measure.
        texts: The texts for string inputs.
        explicit: The user named them: an unknown name is an error (else it is skipped).

    Raises:
        UserInputError: an explicit name is not in the repository (naming the known ones), or
            none of the names can be measured.
    """
    known = known_models(repository)
    missing = [n for n in names if n not in known]
    if missing and explicit:
        raise UserInputError(f"--pipelines: {', '.join(missing)} not in {repository} (known: "
                             f"{', '.join(known) or 'none: build it first with tools build-repo'})")
    notes = [f"pipeline {n} is not in {repository}: skipped" for n in missing]
    images = load_images() if IMAGES_DIR.is_dir() else []
    targets = []
    for name in (n for n in names if n in known):
        config = model_config(repository / name / "config.pbtxt")
        requests, payload = prepare_requests(name, config, texts, images)
        setup, limit_na = _limit_setup(repository, name, config, payload)
        if not requests:
            notes.append(f"pipeline {name}: {payload}: skipped")
            continue
        targets.append(Target(name, tuple(requests), payload, setup, limit_na,
                              _steps(config, name)))
    if not targets:
        raise UserInputError(f"--pipelines {','.join(names)}: none can be measured in "
                             f"{repository} (build it first: tools build-repo --output "
                             f"{repository})")
    return targets, notes


def compute_model(point_models: Mapping[str, Any], pipeline: str) -> str | None:
    """The model of ``pipeline`` that computed most in a window (an ensemble's encoder, say).

    Args:
        point_models: Triton's per-model window (``Point.models``).
        pipeline: The pipeline measured (an ensemble is left out for its steps).
    """
    candidates = {k: m for k, m in point_models.items() if k != pipeline} or dict(point_models)
    timed = {k: (m.compute_ms or 0.0) * m.requests for k, m in candidates.items()}
    return max(timed, key=timed.get) if timed else None
