"""Read tritonserver's log: why it failed to start, and which models are still loading (or, from
the repository index, not ready).

Every cause comes out as one line naming the port, the model and Triton's own reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tools.serve.trt_guard import explain_engine_failure


def _unquote(message: str) -> str:
    try:
        return json.loads(f'"{message}"')
    except ValueError:
        return message


def one_line(reason: str) -> str:
    """First line of a Triton reason, plus the first Python frame if it carries a traceback."""
    lines = [line.strip() for line in reason.strip().splitlines() if line.strip()]
    if not lines:
        return reason.strip()
    text = lines[0]
    if "At:" in lines:
        frames = lines[lines.index("At:") + 1 :]
        if frames:
            text += f" (at {frames[0]})"
    return text


_LOG_LINE = re.compile(r'^([IWE])\d{4} [\d:.]+\s+\d+ [^\]]+\] "(.*)"\s*$')
_PORT_IN_USE = re.compile(r"failed to start (\w+) service: .*Socket '([^']+)' already in use")
_MODEL_FAILED = re.compile(r"^failed to load '([^']+)' version (\d+): (.*)", re.DOTALL)
_POLL_FAILED = re.compile(r"^Poll failed for model directory '([^']+)': (.*)", re.DOTALL)
_PROTO_ERROR = re.compile(r"Error parsing text-format inference\.ModelConfig: (.*)$")
_CREATING = re.compile(r"^error: creating server: (.*)$")
_UNRECOGNIZED = re.compile(r"(unrecognized option '[^']+')")
_BAD_OPTION = re.compile(r'^Bad option: "([^"]+)"')
_LOADING = re.compile(r"^loading: (.+):(\d+)$")
_LOADED = re.compile(r"^(?:successfully loaded|failed to load) '([^']+)'")
_BENIGN = ("CudaDriverHelper has not been initialized.",)


def failure_causes(log_text: str) -> list[str]:
    """The causes a tritonserver log gives for failing to start, one line each.

    Recognises ports already in use, models that failed to load (with Triton's reason, e.g. the
    exception raised in ``initialize``) and configs that do not parse; falls back on the
    server's last error line.
    """
    causes: list[str] = []
    errors: list[str] = []
    creating = None
    proto_error = None
    bad_option = None
    for raw in log_text.splitlines():
        if bad_option is not None and raw.strip():
            causes.append(f"bad option {bad_option}: {raw.strip()}")
            bad_option = None
            continue
        if m := _BAD_OPTION.match(raw):
            bad_option = m.group(1)
            continue
        if m := _UNRECOGNIZED.search(raw):
            causes.append(m.group(1))
            continue
        if m := _PROTO_ERROR.search(raw):
            proto_error = m.group(1).strip()
            continue
        if m := _CREATING.match(raw.strip()):
            creating = m.group(1).strip()
            continue
        m = _LOG_LINE.match(raw)
        if not m:
            continue
        level, message = m.group(1), _unquote(m.group(2))
        if m2 := _PORT_IN_USE.search(message):
            service, address = m2.groups()
            port = address.rsplit(":", 1)[-1]
            causes.append(
                f"port {port} ({service}) is already in use on {address.rsplit(':', 1)[0]}"
            )
        elif m2 := _MODEL_FAILED.match(message):
            model, version, reason = m2.groups()
            hint = explain_engine_failure(reason)
            causes.append(f"model '{model}' version {version} failed to load: {one_line(reason)}"
                          + (f"; {hint}" if hint else ""))
        elif m2 := _POLL_FAILED.match(message):
            model, reason = m2.groups()
            detail = f" ({proto_error})" if proto_error else ""
            causes.append(f"model '{model}': {one_line(reason)}{detail}")
            proto_error = None
        elif level == "E" and message not in _BENIGN:
            errors.append(one_line(message))
    if not causes and errors:
        causes.append(errors[-1])
    if not causes and creating:
        causes.append(creating)
    return list(dict.fromkeys(causes))


def loading_models(log_text: str) -> list[str]:
    """Models the log shows as started loading but neither loaded nor failed yet."""
    pending: dict[str, None] = {}
    for raw in log_text.splitlines():
        m = _LOG_LINE.match(raw)
        if not m:
            continue
        message = _unquote(m.group(2))
        if m2 := _LOADING.match(message):
            pending[m2.group(1)] = None
        elif m2 := _LOADED.match(message):
            pending.pop(m2.group(1), None)
    return list(pending)


def log_tail(path: Path, lines: int = 1) -> str:
    """The last ``lines`` lines of a log file joined with " | " (empty when unreadable)."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


_CAUSE_PORT = re.compile(r"^port (\d+) .* already in use")


def ports_in_use(causes: list[str]) -> set[int]:
    """The ports that ``failure_causes`` reported as already in use."""
    return {int(m.group(1)) for cause in causes if (m := _CAUSE_PORT.match(cause))}


def pending_models(index: Sequence[Mapping[str, Any]] | None, log_text: str) -> str:
    """Why a server is not ready yet, for a timeout message: its models not ready (from the
    repository ``index``) or, when it does not answer (``index`` None), those the log shows
    still loading (tritonserver opens its endpoints only after loading every model)."""
    if index is None:
        loading = loading_models(log_text)
        if loading:
            return "still loading " + ", ".join(f"'{name}'" for name in loading)
        return "the server does not answer"
    pending = [
        f"'{e['name']}' {e.get('state', 'UNKNOWN')}"
        + (f" ({one_line(e['reason'])})" if e.get("reason") else "")
        for e in index
        if e.get("state") != "READY"
    ]
    return "models not ready: " + ", ".join(pending) if pending else "server not ready"
