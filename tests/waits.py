"""Waiting on observable state instead of sleeping a fixed time.

A test that needs the system in some state (requests inside a model, a child running, a file
written) polls for that state with :func:`wait_until`, which fails naming what it waited for;
it never sleeps a guessed time and hopes. The states read here: the requests of the toy model
that a tritonserver has taken or holds (:func:`arrived`, :func:`in_flight`), a model's recorded
inferences (:func:`counts_once_recorded`), and whether the other end of a loopback connection
has read what was sent on it (:func:`read_by_peer`).
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psutil

T = TypeVar("T")

# The toy model (tests/fixtures/toy_repository/toy_double) appends one line per request it
# starts executing to the file this names, when the server's environment sets it.
STARTED_FILE_ENV = "TOY_DOUBLE_STARTED_FILE"


class WaitTimeout(AssertionError):
    """The state waited for did not come in time (an assertion: the test fails, not errors)."""


def wait_until(predicate: Callable[[], T], timeout_s: float, what: str | Callable[[], str],
               interval_s: float = 0.05) -> T:
    """Poll ``predicate`` until it returns something true; return that.

    Args:
        predicate: The observable state, read afresh at every poll.
        timeout_s: How long to wait before failing.
        what: What is waited for, said in the failure (a callable is called then, to describe
            the state as it was at the end).
        interval_s: Pause between polls.

    Raises:
        WaitTimeout: ``predicate`` stayed false for ``timeout_s``; the message names ``what``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = what() if callable(what) else what
            raise WaitTimeout(f"waited {timeout_s:g} s for {detail}")
        time.sleep(interval_s)


def prometheus_value(metrics_url: str, name: str, model: str) -> float:
    """One model's sample of metric ``name`` from tritonserver's ``/metrics`` (0 when absent).

    Args:
        metrics_url: ``host:port`` of the metrics endpoint.
        name: The metric, e.g. ``nv_inference_pending_request_count``.
        model: The ``model`` label.
    """
    with urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=5) as response:
        lines = response.read().decode().splitlines()
    label = f'model="{model}"'
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines
               if line.startswith(name + "{") and label in line)


def model_counts(http_url: str, model: str) -> tuple[int, int]:
    """``(inference_count, execution_count)`` of ``model`` from tritonserver's statistics."""
    with urllib.request.urlopen(f"http://{http_url}/v2/models/{model}/stats", timeout=10) as response:
        (entry,) = json.loads(response.read())["model_stats"]
    return int(entry["inference_count"]), int(entry["execution_count"])


def counts_once_recorded(http_url: str, model: str, before: tuple[int, int], inferences: int,
                         timeout_s: float = 15.0) -> tuple[int, int]:
    """``model``'s counts once ``inferences`` more are recorded than in ``before``.

    Triton records a model's statistics when its ``execute`` call has returned, which can be a
    moment after an ensemble's response (sent from inside that call) reached the client.
    """
    def recorded() -> tuple[int, int] | None:
        counts = model_counts(http_url, model)
        return counts if counts[0] - before[0] >= inferences else None

    return wait_until(recorded, timeout_s, lambda: (
        f"{inferences} inferences of {model} recorded (from {before}: {model_counts(http_url, model)})"))


def started_requests(started_file: Path) -> int:
    """How many requests the toy model has started executing (see ``STARTED_FILE_ENV``)."""
    try:
        return len(started_file.read_text().splitlines())
    except FileNotFoundError:
        return 0


def arrived(metrics_url: str, model: str, started_file: Path) -> int:
    """Requests of the toy ``model`` the server has taken so far: queued now (Triton's pending
    gauge) or started executing (the toy's file), whether answered since or not."""
    pending = prometheus_value(metrics_url, "nv_inference_pending_request_count", model)
    return int(pending) + started_requests(started_file)


def in_flight(metrics_url: str, model: str, started_file: Path) -> int:
    """Requests of the toy ``model`` inside the server now: :func:`arrived` less those answered
    (Triton's success and failure counters)."""
    answered = (prometheus_value(metrics_url, "nv_inference_request_success", model)
                + prometheus_value(metrics_url, "nv_inference_request_failure", model))
    return arrived(metrics_url, model, started_file) - int(answered)


def _tcp_queues() -> dict[tuple[int, int], tuple[int, int]]:
    """``(local port, remote port) -> (send queue, receive queue)`` of every IPv4 TCP socket
    on 127.0.0.1 (Linux ``/proc/net/tcp``; the queues are bytes not yet acknowledged / read)."""
    loopback = "0100007F"
    queues = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, tx_rx = fields[1], fields[2], fields[4]
        if local.startswith(loopback) and remote.startswith(loopback):
            tx, rx = (int(q, 16) for q in tx_rx.split(":"))
            queues[(int(local.split(":")[1], 16), int(remote.split(":")[1], 16))] = (tx, rx)
    return queues


def read_by_peer(sock: socket.socket) -> bool:
    """Whether the process at the other end of the loopback connection ``sock`` has accepted it
    and read every byte sent on it (nothing left in either side's queue)."""
    ours, theirs = sock.getsockname()[1], sock.getpeername()[1]
    queues = _tcp_queues()
    return queues.get((ours, theirs), (1, 0))[0] == 0 and queues.get((theirs, ours)) == (0, 0)


def child_running(*args: str) -> psutil.Process:
    """This process's child whose command line holds every one of ``args`` (children that
    already exited, an earlier test's zombies, are passed over). Raises ``StopIteration``."""
    for child in psutil.Process().children():
        try:
            cmdline = child.cmdline()
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            continue
        if all(arg in cmdline for arg in args):
            return child
    raise StopIteration(f"no running child with {args}")
