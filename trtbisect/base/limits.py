"""Bounds on what a user's files and scripts can make a run hold, write or wait for.

A 200-byte .npz can declare a billion empty samples, a data loader can yield forever, a Loop
can run 10^12 trips: each would take the machine's memory, fill the disk under --out, or hang.
Every such quantity has a bound here, a flag to move it, and a one-line refusal that names the
flag (docs/limits.md):

- `--max-samples N`: samples from every source together (a stack's declared length is checked
  before any sample is split off it; a data loader is cut there, refused, never read on);
- `--max-input-bytes SIZE`: the samples' total bytes (default: half of this machine's memory);
- `--max-spool-bytes SIZE`: bytes of samples and references spooled to disk under --out;
- `--eval-timeout SECONDS`: one inference. A plan whose inference runs past it is judged
  failed (it never finishes: TensorRT's would not either); the FP32 reference running past it
  is refused.

Every inference also runs on a helper thread while the calling thread waits (`interruptible`),
so that Ctrl-C and SIGTERM, whose Python handlers run only on the main thread between
bytecodes, are seen within a moment even when the runtime is deep inside a Loop that never
ends; the runtime is then told to stop (ONNX Runtime's `RunOptions.terminate`).
"""

from __future__ import annotations

import os
import queue
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import TrtBisectError

T = TypeVar("T")

MAX_SAMPLES = 100_000  # every evaluation may run each one
SPOOL_BYTES = 64 << 30
EVAL_TIMEOUT = 600.0  # seconds of one inference: a generous default (a big model on a slow CPU)
MAX_TIMEOUT = 365 * 86400.0  # what a wait can be given (threading's bound is far above)
STOP_GRACE = 10.0  # seconds a runtime told to stop may take before it is left behind


@dataclass(frozen=True)
class Limits:
    samples: int = MAX_SAMPLES
    input_bytes: int | None = None  # None: half of this machine's memory (limits.memory_limit)
    spool_bytes: int = SPOOL_BYTES

    @property
    def total_input_bytes(self) -> int:
        return memory_limit() if self.input_bytes is None else self.input_bytes


def memory_limit() -> int:
    """Bytes of input data we allow ourselves: half of this machine's physical memory."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError, AttributeError):
        return 1 << 33


DEFAULT = Limits()


class EvalTimeout(TrtBisectError):
    """One inference ran past --eval-timeout and was stopped."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"an inference ran past --eval-timeout {seconds:g} s and was stopped "
                         "(a Loop that never ends?); give a larger --eval-timeout if it is only "
                         "slow")
        self.seconds = seconds


# ---------------------------------------------------------------- the count and the bytes


def too_many_samples(count: int | None, limits: Limits, where: str) -> TrtBisectError:
    """`count` None: a stream, cut at the bound."""
    many = "more samples than" if count is None else f"{count} samples, more than"
    return TrtBisectError(f"{where} gives {many} --max-samples {limits.samples}; give fewer "
                          "samples or a larger --max-samples")


def check_count(count: int, limits: Limits, where: str) -> None:
    """A source that declares `count` samples (a stack's leading axis), before any is made."""
    if count > limits.samples:
        raise too_many_samples(count, limits, where)


class Meter:
    """Counts what is added against one bound; refuses, naming its flag, past it."""

    def __init__(self, bound: int, flag: str, what: str) -> None:
        self.bound, self.flag, self.what, self.used = bound, flag, what, 0

    def add(self, n: int, where: str = "") -> None:
        if self.used + n > self.bound:
            at = f" at {where}" if where else ""
            raise TrtBisectError(f"{self.what} pass {self.flag} {size_text(self.bound)}{at}; "
                                 f"give less data or a larger {self.flag}")
        self.used += n


def size_text(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.3g} {unit}"
    return f"{n} bytes"


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """`512M`, `2G`, `1.5GiB`, `100000` (bytes; K/M/G/T are powers of 1024)."""
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a size (e.g. 512M, 2G, or bytes)")
    value = float(m.group(1)) * (1 << (10 * " kmgt".index(m.group(2).lower() or " ")))
    return int(value)


# ---------------------------------------------------------------- one inference

_eval_timeout = [EVAL_TIMEOUT]


def set_eval_timeout(seconds: float) -> None:
    """The process's bound on one inference: set by the run (pipeline.prepare) and by each
    worker from its spec, read by the backends."""
    _eval_timeout[0] = float(seconds)


def eval_timeout() -> float:
    return _eval_timeout[0]


class _Helper:
    """A daemon thread that runs calls for one calling thread (a daemon: one left behind in a
    runtime that ignores the stop cannot hold the process at exit)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="trtbisect-inference", daemon=True).start()

    def _serve(self) -> None:
        while True:
            fn, box, done = self.jobs.get()
            try:
                box.append((True, fn()))
            except BaseException as exc:  # handed to the caller as is
                box.append((False, exc))
            finally:
                del fn
                done.set()


_local = threading.local()


def _helper() -> _Helper:
    h = getattr(_local, "helper", None)
    if h is None or h.pid != os.getpid():  # none yet, or inherited through a fork
        h = _local.helper = _Helper()
    return h


def interruptible(fn: Callable[[], T], seconds: float | None, stop: Callable[[], Any],
                  grace: float = STOP_GRACE) -> T:
    """`fn()` on a helper thread while this one waits: a signal's handler runs (Ctrl-C raises
    KeyboardInterrupt, SIGTERM the CLI's Terminated) and `seconds` bounds the wait. Either way
    `stop()` tells the runtime to end the call, which is given `grace` seconds to do so (0: a
    runtime that cannot be stopped, such as a TensorRT engine's execution, is left behind at
    once); then the interruption is raised, or EvalTimeout."""
    if seconds is not None and not 0 < seconds <= MAX_TIMEOUT:  # a library caller's inf
        seconds = None
    helper = _helper()
    box: list = []
    done = threading.Event()
    helper.jobs.put((fn, box, done))
    try:
        finished = done.wait(seconds)
    except BaseException:
        _stop(stop, done, grace)
        raise
    if not finished:
        _stop(stop, done, grace)
        raise EvalTimeout(seconds if seconds is not None else 0.0)
    ok, value = box[0]
    if ok:
        return value
    raise value


def _stop(stop: Callable[[], Any], done: threading.Event, grace: float = STOP_GRACE) -> None:
    stop()
    if not done.wait(grace):  # the runtime ignored it: leave that thread behind
        _local.helper = None


# ---------------------------------------------------------------- the flags


def limit_options(f: Callable) -> Callable:
    """--max-samples, --max-input-bytes, --max-spool-bytes, --eval-timeout (every command that
    reads samples and runs a model)."""
    import click

    from .flags import Number, apply_flags

    class Size(click.ParamType):
        name = "size"

        def convert(self, value, param, ctx) -> int:
            if isinstance(value, int):
                return value
            try:
                return parse_size(value)
            except ValueError as exc:
                self.fail(str(exc), param, ctx)

    seconds = Number("seconds", lambda x: 0 < x <= MAX_TIMEOUT,  # NaN fails too
                     f"a number of seconds above 0 and at most {MAX_TIMEOUT:.0f} (a year)",
                     "a number of seconds")

    opts = [
        click.option("--max-samples", "max_samples", type=click.IntRange(min=1),
                     default=MAX_SAMPLES, show_default=True, metavar="N",
                     help="Refuse inputs (files, folders, a data loader) holding more samples "
                          "than this; a data loader is not read past it."),
        click.option("--max-input-bytes", "max_input_bytes", type=Size(), default=None,
                     metavar="SIZE",
                     help="Refuse samples whose total size passes this, e.g. 8G. Default: half "
                          "of this machine's memory."),
        click.option("--max-spool-bytes", "max_spool_bytes", type=Size(), default=SPOOL_BYTES,
                     metavar="SIZE", show_default="64G",
                     help="Bytes of samples and FP32 outputs that do not fit in memory and "
                          "are spooled under --out; past it the run is refused."),
        click.option("--eval-timeout", "eval_timeout", type=seconds,
                     default=EVAL_TIMEOUT, show_default=True, metavar="SECONDS",
                     help="Longest one inference may run (a Loop that never ends): a plan past "
                          "it is judged failed, an FP32 reference past it is refused."),
    ]
    return apply_flags(f, opts)


def pop_limits(kw: dict) -> Limits:
    """The bounds on samples of `limit_options`' values in `kw` (removed from it); the
    --eval-timeout is the judge's (context.JudgeOptions) and stays in `kw`."""
    return Limits(kw.pop("max_samples"), kw.pop("max_input_bytes"), kw.pop("max_spool_bytes"))
