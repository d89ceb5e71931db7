"""Kubernetes-style probes that tell a busy server from a dead one.

- **liveness**: ``/v2/health/live`` answers 200 within the timeout, and the supervisor's status endpoint (contract 2:
  ``GET :8003/status``) answers and gives up on no model for good. A full queue never fails it:
  restarting an overloaded container only reloads every model and moves its load elsewhere.
- **readiness** (and startup): live, every model of the repository ready, no model the supervisor
  reports outside ``ready`` (a dead stub, recovering, in backoff or down), and each probe
  inference answered. An answer that says the server is busy (HTTP 429/503/408, Triton's "exceeds
  maximum queue size" or a queue timeout, or no answer within the probe's timeout) counts as
  busy, which is ready: the pod keeps its share of traffic. Any other error is a failure.

Standard library only, so the container can exec it every few seconds for little CPU (no
numpy or tritonclient import). ``docker/healthcheck.py --mode liveness|readiness`` runs it.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

BUSY_STATUSES = frozenset({408, 429, 503})
# Triton's own words for a request it refused because the model is saturated.
BUSY_PHRASES = ("exceeds maximum queue size", "request timeout expired", "queue is full",
                "timed out", "too many requests", "server busy")
READY_STATE = "ready"
_REASON_CHARS = 300


class Verdict(Enum):
    """A probe's result; ``BUSY`` passes."""

    OK = "ok"
    BUSY = "busy"
    FAIL = "fail"

    @property
    def passes(self) -> bool:
        """OK and BUSY pass (exit 0); FAIL does not."""
        return self is not Verdict.FAIL


@dataclass(frozen=True)
class ProbeResult:
    """A probe's verdict and why.

    Attributes:
        verdict: OK, BUSY (passes) or FAIL.
        reasons: One line per finding (why it failed, or why it was busy).
    """

    verdict: Verdict
    reasons: tuple[str, ...] = ()


def _short(text: object) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= _REASON_CHARS else line[: _REASON_CHARS - 3] + "..."


def _split(url: str) -> tuple[str, int, str]:
    """host, port and path prefix of ``http://host:port[/path]`` (``http://`` optional)."""
    rest = url.removeprefix("http://")
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.rpartition(":")
    return host or "127.0.0.1", int(port or 80), f"/{path}".rstrip("/")


def request(url: str, path: str, timeout_s: float, body: Mapping[str, Any] | None = None,
            ) -> tuple[int, bytes]:
    """One HTTP request: status and body. Raises ``OSError`` (``TimeoutError`` too)."""
    host, port, prefix = _split(url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request("POST" if data is not None else "GET", prefix + path, body=data,
                     headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _message(body: bytes) -> str:
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        return body.decode("utf-8", "replace")
    return str(data.get("error", "")) if isinstance(data, dict) else str(data)


def is_busy(status: int, message: str) -> bool:
    """An answer that means "saturated, try later", not "broken"."""
    lowered = message.lower()
    return status in BUSY_STATUSES or any(phrase in lowered for phrase in BUSY_PHRASES)


def supervisor_status(status_url: str, timeout_s: float) -> tuple[dict[str, Any] | None, str | None]:
    """The supervisor's ``/status`` models (contract 2), or why it could not be read.

    Returns:
        ``(models, None)``; ``(None, None)`` when nothing listens there (no supervisor with a
        status endpoint: the stub watch is skipped); ``(None, problem)`` when it answered badly
        or not in time (a hung supervisor).
    """
    try:
        code, body = request(status_url, "", timeout_s)
    except ConnectionRefusedError:
        return None, None
    except OSError as exc:
        return None, f"supervisor status {status_url} did not answer: {_short(exc)}"
    if code != 200:
        return None, f"supervisor status {status_url}: HTTP {code}"
    try:
        models = json.loads(body)["models"]
        if not isinstance(models, dict):
            raise TypeError("'models' is not an object")
    except (ValueError, KeyError, TypeError) as exc:
        return None, f"supervisor status {status_url}: not the status JSON ({_short(exc)})"
    return models, None


def _given_up(info: Mapping[str, Any]) -> bool:
    """Down with no retry planned: the supervisor will not bring it back by itself."""
    return info.get("state") == "down" and info.get("next_retry_s") is None


def _not_ready(info: Mapping[str, Any]) -> bool:
    return info.get("state") != READY_STATE or bool(info.get("dead_stubs"))


def liveness(url: str, status_url: str | None, timeout_s: float = 5.0) -> ProbeResult:
    """Live, and the supervisor alive and not given up on a model. Queues are not looked at."""
    try:
        code, _ = request(url, "/v2/health/live", timeout_s)
    except OSError as exc:
        # Not even the cheapest endpoint within the timeout: refused, or an HTTP front end that
        # hangs. The kubelet needs failureThreshold of these in a row to restart.
        return ProbeResult(Verdict.FAIL, (f"server at {url}: /v2/health/live: {_short(exc)}",))
    if code in BUSY_STATUSES:
        return ProbeResult(Verdict.BUSY, (f"/v2/health/live: HTTP {code}",))
    if code != 200:
        return ProbeResult(Verdict.FAIL, (f"server at {url} is not live (HTTP {code})",))
    if status_url:
        models, problem = supervisor_status(status_url, timeout_s)
        if problem:
            return ProbeResult(Verdict.FAIL, (problem,))
        gone = sorted(name for name, info in (models or {}).items() if _given_up(info))
        if gone:
            return ProbeResult(Verdict.FAIL, tuple(
                f"model '{name}' is down and the supervisor plans no retry" for name in gone))
    return ProbeResult(Verdict.OK)


def _infer(url: str, model: str, body: Mapping[str, Any], timeout_s: float) -> ProbeResult:
    try:
        code, answer = request(url, f"/v2/models/{model}/infer", timeout_s, body)
    except TimeoutError:
        return ProbeResult(Verdict.BUSY, (f"model '{model}': no answer within {timeout_s:g} s",))
    except OSError as exc:
        return ProbeResult(Verdict.FAIL, (f"model '{model}': probe inference failed: {_short(exc)}",))
    message = _message(answer)
    if code == 200:
        try:
            outputs = json.loads(answer).get("outputs")
        except ValueError:
            outputs = None
        if outputs:
            return ProbeResult(Verdict.OK)
        return ProbeResult(Verdict.FAIL, (f"model '{model}' answered its probe without outputs",))
    if is_busy(code, message):
        return ProbeResult(Verdict.BUSY, (f"model '{model}' busy: HTTP {code} {_short(message)}",))
    return ProbeResult(Verdict.FAIL, (f"model '{model}' failed its probe inference: HTTP {code} "
                                      f"{_short(message)}",))


def readiness(url: str, models: Iterable[str], probes: Mapping[str, Mapping[str, Any]],
              status_url: str | None, timeout_s: float = 5.0,
              budget_s: float | None = None) -> ProbeResult:
    """Every model ready, none reported outside ``ready`` by the supervisor, probes answered
    or busy.

    Args:
        url: Triton's HTTP endpoint.
        models: The models that must be ready (the repository's folders).
        probes: Model -> KServe v2 JSON request to send it.
        status_url: The supervisor's status endpoint, or None.
        timeout_s: Per request.
        budget_s: The whole probe (default ``2 * timeout_s``): the checks left when it is spent
            are skipped and the verdict is busy, so the command ends before the kubelet's
            ``timeoutSeconds`` counts a failure.
    """
    deadline = time.monotonic() + (2 * timeout_s if budget_s is None else budget_s)

    def left() -> float:
        return deadline - time.monotonic()

    live = liveness(url, None, timeout_s)
    if not live.verdict.passes:
        return live
    problems: list[str] = []
    busy: list[str] = list(live.reasons) if live.verdict is Verdict.BUSY else []
    if status_url:
        reported, problem = supervisor_status(status_url, timeout_s)
        if problem:
            problems.append(problem)
        for name, info in sorted((reported or {}).items()):
            if _not_ready(info):
                stubs = info.get("dead_stubs") or []
                detail = f", dead stubs {stubs}" if stubs else ""
                problems.append(f"model '{name}' is {info.get('state')} (supervisor{detail})")
    for model in models:
        if left() < 0.1:
            busy.append("probe budget spent before every model was checked")
            break
        try:
            code, answer = request(url, f"/v2/models/{model}/ready", min(timeout_s, left()))
        except TimeoutError:
            busy.append(f"model '{model}': readiness did not answer within {timeout_s:g} s")
            continue
        except OSError as exc:
            problems.append(f"model '{model}' did not answer: {_short(exc)}")
            continue
        if code in BUSY_STATUSES:
            busy.append(f"model '{model}': readiness HTTP {code}")
        elif code != 200:
            problems.append(f"model '{model}' not ready (HTTP {code}) {_short(_message(answer))}".rstrip())
    if problems:
        return ProbeResult(Verdict.FAIL, tuple(problems))
    for model, body in probes.items():
        if left() < 0.1:
            busy.append(f"probe budget spent before model '{model}' was probed")
            break
        result = _infer(url, model, body, min(timeout_s, left()))
        if result.verdict is Verdict.FAIL:
            problems.extend(result.reasons)
        elif result.verdict is Verdict.BUSY:
            busy.extend(result.reasons)
    if problems:
        return ProbeResult(Verdict.FAIL, tuple(problems))
    return ProbeResult(Verdict.BUSY if busy else Verdict.OK, tuple(busy))


def repository_models(repository: Path) -> list[str]:
    """Every model folder of a repository (a folder holding config.pbtxt)."""
    return sorted(p.parent.name for p in Path(repository).glob("*/config.pbtxt"))
