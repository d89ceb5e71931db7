"""Admission settings rendered from the SLO file: each model's P99 objective, in its config.

The SLO file (``loadtests/slo.yaml`` beside the spec, else ``slo.yaml``; the one ``tools add``
writes to and ``tools loadtest`` gates on) is the one source of the P99 targets. Its profile named
after the build target gives each pipeline an objective (the tighter of its HTTP and gRPC P99);
a model gets its own entry's, else the tightest of the pipelines it is a step of (nested
pipelines included). What that renders, for every model and pipeline with an objective:

- the parameter ``admission_p99_ms``, which the front before tritonserver reads to admit each
  model's requests by latency (``tools/front/``), for direct calls to a model as for its
  pipelines;
- on the gpu target the queues bound the delay too, behind the front: a queue policy's timeout
  is capped at the objective (a request that waited that long in one queue has missed it; Triton
  refuses it there, before any backend work), and a model without a queue policy gets one
  (rejected once queued longer than the objective, no size bound). On the cpu target the spec's
  timeouts stay as they are: a backstop for a burst the front lets through (ten requests at once
  to the image pipeline would otherwise lose the last ones at a 250 ms cap), and a model with no
  queue policy keeps Triton's batch prefetch.

Because the configs are rendered from it, ``tools build-repo --check`` fails when the SLO file
and a committed repository disagree.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from tools.build_repo.config import TritonModelConfig
from tools.build_repo.spec import DynamicBatchingSpec, QueuePolicySpec, RepoSpec
from tools.slo import PROTOCOLS, NoScenarioSLO, load_slo, slo_file_for

P99_PARAMETER = "admission_p99_ms"  # tools/front/ reads it (its controller runs alone in images)


def objectives(spec: RepoSpec, target: str, slo_file: Path | None = None) -> dict[str, float]:
    """The P99 objective in ms of each model and pipeline of ``spec`` that has one.

    Args:
        spec: The spec, already for ``target``.
        target: The build target, which names the SLO file's profile.
        slo_file: The SLO file; by default the spec's (``slo_file_for``). A missing file gives
            no objectives.

    Raises:
        UserInputError: the SLO file is malformed (naming the file and field).
    """
    path = Path(slo_file) if slo_file is not None else slo_file_for(spec.path)
    if not path.is_file():
        return {}
    own: dict[str, float] = {}
    for name in spec.names():
        try:
            slo = load_slo(path, target, name)
        except NoScenarioSLO:
            continue
        own[name] = min(slo.targets[p].p99_ms for p in PROTOCOLS)
    found = dict(own)
    changed = True
    while changed:  # each pass only lowers or adds values: it ends
        changed = False
        for pipeline in spec.pipelines:
            steps = [step.model for step in pipeline.steps]
            if pipeline.name not in found:
                inherited = [found[m] for m in steps if m in found]
                if not inherited:
                    continue
                found[pipeline.name] = min(inherited)
                changed = True
            for model in steps:
                if model not in own and found.get(model, math.inf) > found[pipeline.name]:
                    found[model] = found[pipeline.name]
                    changed = True
    return found


def with_admission(config: TritonModelConfig, p99_ms: float, target: str) -> TritonModelConfig:
    """``config`` with the admission settings of the objective ``p99_ms`` (module docstring)."""
    parameters = tuple({**dict(config.parameters), P99_PARAMETER: f"{p99_ms:g}"}.items())
    batching = config.dynamic_batching
    if batching is not None and config.platform != "ensemble" and target == "gpu":
        timeout_us = max(1, round(p99_ms * 1000))
        policy = batching.queue_policy
        if policy is not None and policy.default_timeout_microseconds > timeout_us:
            policy = dataclasses.replace(policy, default_timeout_microseconds=timeout_us)
        elif policy is None:
            policy = QueuePolicySpec(max_queue_size=0, default_timeout_microseconds=timeout_us)
        if policy is not batching.queue_policy:
            batching = DynamicBatchingSpec(  # by alias: dataclasses.replace cannot
                max_queue_delay_microseconds=batching.max_queue_delay_microseconds,
                preferred_batch_size=batching.preferred_batch_size, default_queue_policy=policy)
    return dataclasses.replace(config, parameters=parameters, dynamic_batching=batching)


def apply(configs: dict[str, TritonModelConfig], spec: RepoSpec,
          target: str) -> dict[str, TritonModelConfig]:
    """Every config of ``configs`` with the admission settings of its objective, if any."""
    found = objectives(spec, target)
    return {name: with_admission(c, found[name], target) if name in found else c
            for name, c in configs.items()}
