"""The HTTP guard's native front (``http_front.c``): the common request off the interpreter.

Served, the Python guard spent 130-224 µs of CPU a request on the 2 cores it shares with
tritonserver (docs/guards.md, "Where the HTTP guard's cost goes"), against 52-60 µs for a C hop
that checks nothing. The front is that hop plus the checks of the common request: it takes the
guard's listening socket, serves requests of the strict subset ``http_front.c`` describes (a
text or small tensor request from Triton's clients) and hands every other connection, at a
request boundary and with the bytes read so far, to the Python guard, which answers it as it
always did and keeps it. Admission stays here: completions come in batches, feed one
``LatencyLimit`` per model (the front's requests are a class of their own, as the gRPC guard's
are), and each model's cap is pushed back as its completions arrive.

A front built beforehand is named by ``TRITON_FORGE_HTTP_FRONT`` (the CPU image's, statically
linked by scripts/compose-images.sh, since the image has no compiler); otherwise it is compiled
on first use. If there is neither (no C compiler) the guard serves in Python alone; if the front
exits while serving, the guard takes the listening socket over and says so.
"""

from __future__ import annotations

import asyncio
import math
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tools.native_build import NotCompiled, compiled
from tools.serve.admission import SloAdmission

SOURCE = Path(__file__).with_name("http_front.c")
MESSAGE_BYTES = 1 << 18  # a hand-off carries at most ~86 KiB of what the client sent
# Each model's cap is pushed when its completions arrive (the front reports them every 0.25 s
# while it serves), once its target has been read, and every PUSH_EVERY_S while it is idle (its
# throughput decays). Each report and push wakes this interpreter, and a cold wakeup costs up to
# a millisecond of CPU here (a `time.sleep(0.5)` loop in Python took 3 ms of CPU a second on the
# AMX Xeon of 2026-12-05, one in C none), so this process wakes a few times a second at most.
PUSH_EVERY_S = 5.0
IDLE_S = 1.0  # a model without completions for this long is pushed by the clock
# One completion as http_front.c reports it (its `completion`, native byte order): the model's
# number (the order the front named models in), 1 if answered 200, bytes, admitted, answered.
COMPLETION = struct.Struct("=IIddd")
STOP_WAIT_S = 2.0
PREBUILT_ENV = "TRITON_FORGE_HTTP_FRONT"  # a front compiled beforehand (the CPU image's)


def front_binary() -> Path | None:
    """The front named by ``TRITON_FORGE_HTTP_FRONT``, else the one compiled from ``SOURCE``;
    None (with the reason on stderr) where the named one is not an executable file or none can
    be built."""
    if not sys.platform.startswith("linux"):
        return None
    prebuilt = os.environ.get(PREBUILT_ENV)
    if prebuilt:
        if os.path.isfile(prebuilt) and os.access(prebuilt, os.X_OK):
            return Path(prebuilt)
        print(f"http guard: no native front ({PREBUILT_ENV}={prebuilt} is not an executable "
              f"file); requests are served in Python", file=sys.stderr, flush=True)
        return None
    try:
        return compiled(SOURCE)
    except NotCompiled as exc:
        print(f"http guard: no native front ({exc}); requests are served in Python",
              file=sys.stderr, flush=True)
        return None


def cap_message(model: str, admission: SloAdmission, as_of: float | None = None) -> bytes | None:
    """What the front is told of ``model``'s cap: ``T<model>\\t<p99 ms, 0: none>\\t<cap>\\t<floor>
    \\t<retry s>``, the cap being ``max(floor × mean cost, cap)`` as ``LatencyLimit.cap``, as of
    ``as_of`` (monotonic seconds; None: now); None while its target has not been read (the front
    admits it uncounted, as ``SloAdmission``)."""
    limit = admission.limit_of(model)
    if limit is None:
        if not admission.target_known(model):
            return None
        return f"T{model}\t0\t0\t0\t0".encode()
    absolute, floor = limit.cap_terms(as_of)
    return (f"T{model}\t{limit.p99_s * 1000:.6g}\t{absolute:.1f}\t{floor}\t"
            f"{limit.retry_after_s:.3f}").encode()


class NativeFront:
    """The front process, its control channel, and the admission it feeds.

    Args:
        listener: The guard's listening socket (the front accepts on it).
        upstream_port: tritonserver's HTTP port on 127.0.0.1.
        read_timeout_s: The guard's ``GuardLimits.read_timeout_s``.
        adopt: Called with each handed-off socket and the bytes read from it so far.
        on_exit: Called once if the front exits while serving (the guard takes the port over).
        admission: Admission by latency target for the front's requests (None: admit all).
        binary: The compiled front.
    """

    def __init__(self, listener: socket.socket, upstream_port: int, read_timeout_s: float,
                 adopt: Callable[[socket.socket, bytes], None], on_exit: Callable[[], None],
                 admission: SloAdmission | None, binary: Path) -> None:
        self.adopt, self.on_exit = adopt, on_exit
        self.admission = admission
        self.closing = False
        self.models: list[str] = []  # in the order the front named them (their numbers)
        self.last_report: dict[str, float] = {}  # per model: its latest completion reported
        self.handed_off = 0
        self.loop = asyncio.get_running_loop()
        self.control, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(
                [str(binary), "--listen-fd", str(listener.fileno()),
                 "--control-fd", str(child_end.fileno()), "--upstream-port", str(upstream_port),
                 "--read-timeout-s", repr(read_timeout_s)],
                pass_fds=(listener.fileno(), child_end.fileno()))
        finally:
            child_end.close()
        self.control.setblocking(False)
        self.loop.add_reader(self.control.fileno(), self._readable)
        self._ticker = self.loop.create_task(self._tick())

    def _readable(self) -> None:
        while True:
            try:
                data, ancillary, _, _ = self.control.recvmsg(
                    MESSAGE_BYTES, socket.CMSG_SPACE(4 * 4))
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, ancillary = b"", []
            if not data:  # the front is gone
                self.loop.remove_reader(self.control.fileno())
                if not self.closing:
                    self.closing = True
                    self.process.wait()
                    print(f"http guard: the native front exited ({self.process.returncode}); "
                          f"the Python guard serves the port now", file=sys.stderr, flush=True)
                    self.on_exit()
                return
            fds = [fd for level, kind, raw in ancillary
                   if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
                   for fd in memoryview(raw).cast("i")]
            kind, body = data[:1], data[1:]
            if kind == b"H" and fds:
                self.handed_off += 1
                self.adopt(socket.socket(fileno=fds[0]), bytes(body))
                fds = fds[1:]
            elif kind == b"M":
                model = body.decode("latin-1")
                self.models.append(model)
                self.loop.create_task(self._first_push(model))
            elif kind == b"R":
                self._push(self._completions(body))
            for fd in fds:  # none expected
                os.close(fd)

    def _completions(self, body: bytes) -> set[str]:
        """Feed a report of completions to the models' limits; the models it named."""
        named: set[str] = set()
        if self.admission is None:
            return named
        for number, ok, cost, started, finished in COMPLETION.iter_unpack(body):
            model = self.models[number]
            named.add(model)
            self.last_report[model] = max(finished, self.last_report.get(model, 0.0))
            limit = self.admission.limits.get(model)
            if limit is not None:
                limit.observe(finished, finished - started, ok == 1, cost)
        return named

    def _push(self, models: set[str], by_clock: bool = False) -> None:
        """Send the front the caps of ``models`` (those with a target read), as of their latest
        completion reported (``by_clock``: as of now): a completion reported later still falls
        in the tick it happened in."""
        if self.admission is None:
            return
        for model in models:
            message = cap_message(model, self.admission,
                                  None if by_clock else self.last_report.get(model))
            if message is None:
                continue
            try:
                self.control.send(message)
            except (BlockingIOError, InterruptedError):
                pass  # sent again with the next report or push
            except OSError:
                return

    async def _first_push(self, model: str) -> None:
        """Push a model's cap as soon as its target has been read (until then the front admits
        its requests uncounted, as ``SloAdmission`` does)."""
        if self.admission is None:
            return
        self.admission.limit_of(model)  # starts reading its config
        for _ in range(250):
            if self.admission.target_known(model):
                self._push({model})
                return
            await asyncio.sleep(0.02)

    async def _tick(self) -> None:
        """Every ``PUSH_EVERY_S``, push the caps of the models idle for ``IDLE_S`` by the clock
        (their throughput decays; a target read again after ``CONFIG_TTL_S`` comes with it)."""
        while not self.closing:
            await asyncio.sleep(PUSH_EVERY_S)
            now = time.monotonic()  # the clock of the front's reports (CLOCK_MONOTONIC)
            self._push({m for m in self.models if now - self.last_report.get(m, 0.0) > IDLE_S},
                       by_clock=True)

    async def close(self) -> None:
        """Stop the front: its control channel closes, so it exits (killed after a while)."""
        if not self.closing:
            print(f"http guard: the native front handed {self.handed_off} connections to the "
                  f"Python guard", file=sys.stderr, flush=True)
        self.closing = True
        self._ticker.cancel()
        try:
            self.loop.remove_reader(self.control.fileno())
        except (ValueError, OSError):
            pass
        self.control.close()
        for _ in range(math.ceil(STOP_WAIT_S / 0.05)):
            if self.process.poll() is not None:
                return
            await asyncio.sleep(0.05)
        self.process.kill()
        self.process.wait()

