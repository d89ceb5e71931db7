"""``tools api`` (and ``python -m tools.api``): serve the OpenAI and TEI routes with uvicorn in
front of a running Triton.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import click

from tools.api.state import MAX_BODY_BYTES, OPENAI_MAX_INPUTS, TEI_MAX_INPUTS, Limits
from tools.command import ToolCommand, option, url_option
from tools.net import LOOPBACK

DEFAULT_PORT = 8080


def _loop_and_parser() -> tuple[str, str]:
    """uvloop and httptools when installed (about half the CPU a request), else asyncio's loop
    and h11."""
    try:
        import uvloop  # noqa: F401
        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    try:
        import httptools  # noqa: F401
        http = "httptools"
    except ImportError:
        http = "h11"
    return loop, http


def _stop_when_gone(pid: int) -> None:
    """SIGTERM this process (uvicorn's graceful shutdown) once process ``pid`` is gone."""
    import signal
    import threading
    import time

    def watch() -> None:
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os.kill(os.getpid(), signal.SIGTERM)
                return
            except PermissionError:
                pass
            time.sleep(0.5)

    threading.Thread(target=watch, name="watch-pid", daemon=True).start()


def run(url: str, repository: Path, host: str, port: int, limits: Limits,
        tei_models: tuple[str, ...] = (), log_level: str = "warning",
        watch_pid: int | None = None) -> None:
    """Serve the gateway until interrupted (SIGINT/SIGTERM: uvicorn's graceful shutdown), or
    until process ``watch_pid`` is gone."""
    import uvicorn

    from tools.api.app import create_app

    # The tokenizer runs once per request on a few texts: without its thread pool, whose
    # threads spin after each batch on the cores tritonserver needs.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    loop, http = _loop_and_parser()
    app = create_app(url, repository, limits, tei_models)
    if watch_pid is not None:
        _stop_when_gone(watch_pid)
    # One worker: the gateway's work is a few hundred microseconds a request on the cores
    # Triton uses; access logs off (a line per request costs as much again).
    uvicorn.run(app, host=host, port=port, loop=loop, http=http, access_log=False,
                log_level=log_level, lifespan="on", timeout_keep_alive=30, backlog=2048)


@click.command("api", cls=ToolCommand)
@url_option("the Triton server the routes call (tritonserver's own port, or the front).",
            required=True)
@option("--repository", type=click.Path(exists=True, file_okay=False, path_type=Path),
        default=Path("model_repository"), show_default=True,
        help="The model repository that server serves (read-only: the tokenizers' and labels' "
        "files; which ensembles exist).")
@option("--host", default=LOOPBACK, show_default=True, help="Address to listen on.")
@option("--port", type=click.IntRange(1, 65535), default=DEFAULT_PORT, show_default=True,
        help="Port to listen on.")
@option("--tei-model", "tei_models", multiple=True, metavar="NAME",
        help="Pipeline the TEI routes (/embed, /rerank, /predict, /info) use, repeatable, one "
        "per kind [default: per route, the first pipeline by name whose kind it serves].")
@option("--max-body-bytes", type=click.IntRange(min=1), default=MAX_BODY_BYTES,
        show_default=True, help="Largest request body (413 above it).")
@option("--openai-max-inputs", type=click.IntRange(min=1), default=OPENAI_MAX_INPUTS,
        show_default=True, help="Inputs of one /v1/embeddings request (OpenAI's own limit).")
@option("--tei-max-inputs", type=click.IntRange(min=1), default=TEI_MAX_INPUTS,
        show_default=True,
        help="Inputs of one TEI request (TEI's --max-client-batch-size).")
@click.option("--auto-truncate/--no-auto-truncate", default=True, show_default=True,
              help="Cut texts longer than a pipeline's max_length (as sentence-transformers "
              "does) unless a TEI request says truncate: false; off: refuse them (422/400) "
              "unless it says truncate: true.")
@option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
        default="warning", show_default=True, help="Log level (the pipelines found are logged "
        "at warning).")
@option("--watch-pid", type=int, default=None, metavar="PID",
        help="Stop (gracefully) once this process is gone (tools serve passes tritonserver's).")
def api(url: str, repository: Path, host: str, port: int, tei_models: tuple[str, ...],
        max_body_bytes: int, openai_max_inputs: int, tei_max_inputs: int, auto_truncate: bool,
        log_level: str, watch_pid: int | None) -> None:
    """Serve OpenAI's /v1/embeddings and /v1/models and TEI's /embed, /rerank, /predict,
    /info and /health for the pipelines of a running Triton.

    A pipeline's routes follow from its kind, read from its inputs and outputs (docs/api.md):
    an embedder (TEXT -> EMBEDDING) gets /v1/embeddings and /embed, a cross-encoder (TEXT,
    TEXT_PAIR -> SCORE) /rerank, a classifier (TEXT -> LABEL, SCORE, PROBABILITIES) /predict.
    A list of inputs is one Triton request. GET /health answers 200 once Triton and every
    pipeline found are ready.

    \b
    Examples:
      tools api --url 127.0.0.1:8000 --repository model_repository --port 8080
      curl -s 127.0.0.1:8080/v1/embeddings -d '{"model": "text_embedding", "input": "a cat"}'
    """
    limits = Limits(max_body_bytes=max_body_bytes, openai_max_inputs=openai_max_inputs,
                    tei_max_inputs=tei_max_inputs, auto_truncate=auto_truncate)
    run(url, repository, host, port, limits, tei_models, log_level, watch_pid)
