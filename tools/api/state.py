"""What the gateway holds while it runs: Triton, the pipelines found, the limits, and the rule
that picks the pipeline of a request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tools.api.pipelines import Pipeline
from tools.api.triton import TritonBackend
from tools.errors import ApiModelNotFound, ApiUnavailable

MAX_BODY_BYTES = 16 * 1024 * 1024  # as the front's body limit and Triton's --http-max-input-size
OPENAI_MAX_INPUTS = 2048  # OpenAI's own limit on the inputs of one request
TEI_MAX_INPUTS = 32  # TEI's default --max-client-batch-size


@dataclass(frozen=True)
class Limits:
    """What one request may hold; above a limit the API answers 4xx in its own error shape.

    Attributes:
        max_body_bytes: Request body size (413 above it).
        openai_max_inputs: Inputs of one ``/v1/embeddings`` request.
        tei_max_inputs: Inputs (texts) of one TEI request (TEI's ``max_client_batch_size``).
        auto_truncate: Texts longer than a pipeline's ``max_length`` are cut (as
            sentence-transformers does) unless a TEI request says ``truncate: false``; when
            off, they are refused unless it says ``truncate: true``.
    """

    max_body_bytes: int = MAX_BODY_BYTES
    openai_max_inputs: int = OPENAI_MAX_INPUTS
    tei_max_inputs: int = TEI_MAX_INPUTS
    auto_truncate: bool = True


@dataclass
class Gateway:
    """The state every request reads.

    Attributes:
        backend: Triton.
        repository: The model repository Triton serves (its files: tokenizers, labels).
        limits: Per-request limits.
        tei_models: Pipelines the TEI routes use, preferred over the default rule.
        pipelines: The pipelines served, by name (None until discovered).
        notes: Ensembles left out at discovery, and why.
    """

    backend: TritonBackend
    repository: Path
    limits: Limits = field(default_factory=Limits)
    tei_models: Sequence[str] = ()
    pipelines: dict[str, Pipeline] | None = None
    notes: list[str] = field(default_factory=list)

    def serving(self) -> Mapping[str, Pipeline]:
        """The pipelines found.

        Raises:
            ApiUnavailable: discovery has not finished (Triton is not ready yet).
        """
        if self.pipelines is None:
            raise ApiUnavailable(f"the gateway is starting: Triton at {self.backend.url} is not "
                                 "ready yet or its pipelines are being read")
        return self.pipelines

    def of_path(self, path: str) -> list[Pipeline]:
        """The pipelines whose kind serves ``path``, by name."""
        return [p for _, p in sorted(self.serving().items()) if p.kind.route(path) is not None]

    def named(self, path: str, name: object, param: str = "model") -> Pipeline:
        """The pipeline ``name`` when its kind serves ``path`` (the OpenAI routes' ``model``).

        Raises:
            ApiModelNotFound: no such pipeline, or one of another kind (the message lists those
                ``path`` serves).
        """
        fitting = self.of_path(path)
        known = ", ".join(p.name for p in fitting) or "none is served"
        found = self.serving().get(name) if isinstance(name, str) else None
        if found is None:
            raise ApiModelNotFound(f"the model {name!r} does not exist; {path} serves: {known}",
                                   param)
        if found not in fitting:
            raise ApiModelNotFound(f"the model {name!r} is a {found.kind.name} pipeline, which "
                                   f"{path} does not serve; it serves: {known}", param)
        return found

    def default(self, path: str) -> Pipeline:
        """The pipeline of a route whose requests name none (TEI's): the first of
        ``tei_models`` whose kind serves ``path``, else the first such pipeline by name.

        Raises:
            ApiModelNotFound: no pipeline served has a kind that serves ``path``.
        """
        fitting = self.of_path(path)
        if not fitting:
            kinds = sorted({p.kind.name for p in self.serving().values()}) or ["none"]
            raise ApiModelNotFound(f"no served pipeline is of a kind {path} serves (served "
                                   f"kinds: {', '.join(kinds)})")
        chosen = {p.name: p for p in fitting}
        return next((chosen[n] for n in self.tei_models if n in chosen), fitting[0])
