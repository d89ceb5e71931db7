"""Ensembles rendered from the spec's pipelines, checked statically before any server sees them.

Checks: every mapped tensor exists on the step model and in the ensemble, dtypes and dims agree
producer -> consumer (-1 matches anything), batching is consistent, nothing dangles or is
produced twice, every ensemble output is produced. Errors name pipeline, step and tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

from tools.build_repo import admission
from tools.build_repo.config import TensorConfig, TritonModelConfig
from tools.build_repo.spec import PipelineSpec, RepoSpec
from tools.errors import EnsembleError


@dataclass(frozen=True)
class _Tensor:
    dtype: str
    dims: tuple[int, ...]
    where: str  # who produces it, for messages


def _dims_agree(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b))


def check_pipeline(pipeline: PipelineSpec, members: dict[str, TritonModelConfig]) -> None:
    """Check one pipeline against the configs of the models it uses.

    Args:
        pipeline: the pipeline spec.
        members: rendered configs of every model in the repository, by name.

    Raises:
        EnsembleError: naming the pipeline, the step and the tensor.
    """
    where = f"pipeline {pipeline.name!r}"
    available: dict[str, _Tensor] = {
        t.name: _Tensor(t.triton_dtype, t.dims, "the ensemble input") for t in pipeline.inputs
    }
    consumed: set[str] = set()
    for index, step in enumerate(pipeline.steps):
        at = f"{where}, step {index} ({step.model!r})"
        model = members.get(step.model)
        if model is None:
            raise EnsembleError(f"{at}: no model {step.model!r} in the repository")
        if pipeline.max_batch_size > model.max_batch_size:
            raise EnsembleError(
                f"{at}: ensemble max_batch_size {pipeline.max_batch_size} exceeds the step model's "
                f"max_batch_size {model.max_batch_size}"
            )
        model_inputs = {t.name: t for t in model.inputs}
        model_outputs = {t.name: t for t in model.outputs}
        for model_tensor, ensemble_tensor in step.inputs.items():
            consumer = model_inputs.get(model_tensor)
            if consumer is None:
                raise EnsembleError(
                    f"{at}: input_map names {model_tensor!r}, which is not an input of "
                    f"{step.model!r} (inputs: {sorted(model_inputs)})"
                )
            producer = available.get(ensemble_tensor)
            if producer is None:
                raise EnsembleError(
                    f"{at}: tensor {ensemble_tensor!r} (for input {model_tensor!r}) is not an "
                    f"ensemble input nor produced by an earlier step"
                )
            _agree(at, ensemble_tensor, producer, consumer)
            consumed.add(ensemble_tensor)
        missing = sorted(set(model_inputs) - set(step.inputs))
        if missing:
            raise EnsembleError(f"{at}: inputs {missing} of {step.model!r} are not mapped")
        for model_tensor, ensemble_tensor in step.outputs.items():
            produced = model_outputs.get(model_tensor)
            if produced is None:
                raise EnsembleError(
                    f"{at}: output_map names {model_tensor!r}, which is not an output of "
                    f"{step.model!r} (outputs: {sorted(model_outputs)})"
                )
            if ensemble_tensor in available:
                raise EnsembleError(
                    f"{at}: tensor {ensemble_tensor!r} is produced twice (also by "
                    f"{available[ensemble_tensor].where})"
                )
            available[ensemble_tensor] = _Tensor(
                produced.data_type, produced.dims, f"step {index} ({step.model!r})"
            )
    for out in pipeline.outputs:
        producer = available.get(out.name)
        if producer is None:
            raise EnsembleError(f"{where}: ensemble output {out.name!r} is produced by no step")
        _agree(f"{where}, output", out.name, producer, TensorConfig(out.name, out.triton_dtype, out.dims))
        consumed.add(out.name)
    dangling = sorted(set(available) - consumed)
    if dangling:
        raise EnsembleError(
            f"{where}: tensors {dangling} are neither consumed by a step nor ensemble outputs"
        )


def _agree(at: str, name: str, producer: _Tensor, consumer: TensorConfig) -> None:
    if producer.dtype != consumer.data_type:
        raise EnsembleError(
            f"{at}: tensor {name!r} is {producer.dtype} from {producer.where} but "
            f"{consumer.name!r} expects {consumer.data_type}"
        )
    if not _dims_agree(producer.dims, consumer.dims):
        raise EnsembleError(
            f"{at}: tensor {name!r} has dims {list(producer.dims)} from {producer.where} but "
            f"{consumer.name!r} expects {list(consumer.dims)}"
        )


def ensemble_config(pipeline: PipelineSpec) -> TritonModelConfig:
    """The ensemble's typed config (call ``check_pipeline`` first)."""
    steps = tuple(
        {
            "model_name": step.model,
            "model_version": -1,
            "input_map": dict(step.inputs),
            "output_map": dict(step.outputs),
        }
        for step in pipeline.steps
    )
    return TritonModelConfig(
        name=pipeline.name,
        platform="ensemble",
        max_batch_size=pipeline.max_batch_size,
        inputs=tuple(TensorConfig(t.name, t.triton_dtype, t.dims) for t in pipeline.inputs),
        outputs=tuple(TensorConfig(t.name, t.triton_dtype, t.dims) for t in pipeline.outputs),
        parameters=tuple(pipeline.parameters.items()),
        ensemble_steps=steps,
    )


def render_all(spec: RepoSpec, target: str) -> dict[str, TritonModelConfig]:
    """Typed configs of every model and pipeline of the spec built for ``target``, pipelines
    checked.

    Raises:
        EnsembleError: a pipeline is inconsistent.
        ConfigError: a config does not fit Triton's ModelConfig.
    """
    from tools.build_repo.config import model_config, python_model_config

    spec = spec.for_target(target)  # models and pipelines whose `targets` leave it out are not built
    configs: dict[str, TritonModelConfig] = {}
    for model in spec.models:
        configs[model.name] = model_config(model, target)
    for model in spec.python_models:
        configs[model.name] = python_model_config(model, target)
    for pipeline in spec.pipelines:
        check_pipeline(pipeline, configs)
        configs[pipeline.name] = ensemble_config(pipeline)
    configs = admission.apply(configs, spec, target)  # the P99 objectives of the SLO file
    for config in configs.values():
        config.to_message()
    return configs
