"""Local worker processes: each builds the run's judge once and judges tasks (a plan on a
chunk of samples) sent down its pipe.

Why not `concurrent.futures.ProcessPoolExecutor`: when one of its processes dies the whole
pool breaks and every pending future fails, without saying which task killed it. Here each
worker runs one task at a time on its own pipe, so a death is pinned on its task: the worker
is replaced and the task run again on another; a task that kills `MAX_ATTEMPTS` workers is
reported crashed, which the journal records as a failed plan (journal.py's rule for a plan
that crashes the process). Results are keyed by task, so none is lost or counted twice.
Processes are spawned (never forked: a fork would copy the parent's ONNX Runtime threads and
memory), ignore Ctrl-C (the parent stops them), and exit when the parent's end of the pipe
closes, the parent killed included.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import resource
import signal
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from ..errors import TrtBisectError
from ..search.journal import MAX_ATTEMPTS
from .judge import JudgeSpec, Result, SampleJudge

log = logging.getLogger(__name__)

START_FAILURES = 3  # workers that die while starting, per slot, before the run gives up
# Test hook: a path; the first worker to take a task once this file does not exist creates it
# and dies there (exit 9), so a test kills exactly one worker mid-evaluation, at no time chosen
# by a clock (tests/parallel/test_workers.py). Never set in normal use.
DIE_ONCE_ENV = "TRTBISECT_TEST_WORKER_DIES_ONCE"


@dataclass
class Stats:
    """What the parallel evaluation cost, beside what the search took."""

    workers: int
    kind: str
    threads: int | None
    why: str
    inferences: int = 0  # every sample judged by a worker, taken or not
    tasks: int = 0
    seconds_waiting: float = 0.0
    peak_rss: dict[int, int] = field(default_factory=dict)
    replaced: int = 0

    def to_json(self) -> dict:
        return {"workers": self.workers, "backend": self.kind, "threads": self.threads,
                "chosen": self.why, "inferences_run": self.inferences, "tasks": self.tasks,
                "seconds_waiting": round(self.seconds_waiting, 3), "replaced": self.replaced,
                "peak_rss_mib": [round(v / (1 << 20), 1) for _, v in sorted(self.peak_rss.items())]}


@dataclass(frozen=True)
class Task:
    """Judge `plan` on the samples `indices` (in order) of `total` the plan is judged on."""

    plan: tuple[str, ...]
    indices: tuple[int, ...]
    total: int
    stop_early: bool


@dataclass
class TaskResult:
    results: list[Result]
    complete: bool  # the chunk ran to its end (else it stopped early)
    error: str | None = None  # bad input met in the worker (a --check hook that raised)
    crashed: int = 0  # workers that died running it; MAX_ATTEMPTS: the plan crashes them


def peak_rss() -> int:
    """This process's peak resident memory, bytes: the kernel's high-water mark of its own
    memory (VmHWM). Not getrusage's ru_maxrss: Linux carries that across exec, so a spawned
    worker would report at least the parent's size at the fork."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def serve(conn: Connection, factory: Callable[[JudgeSpec], Any], spec: JudgeSpec,
          data: Any) -> None:
    """A worker's life: build the judge, then judge tasks until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    try:
        judge = factory(spec)
    except TrtBisectError as exc:
        conn.send(("failed", str(exc)))
        return
    except Exception:
        conn.send(("failed", traceback.format_exc()))
        return
    conn.send(("ready", peak_rss()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if msg is None:
            break
        tid, task = msg
        _maybe_die()
        try:
            results, complete = judge.chunk(frozenset(task.plan), data.pairs(task.indices),
                                            task.total, task.stop_early)
            reply: tuple = (tid, TaskResult(results, complete), peak_rss())
        except TrtBisectError as exc:
            reply = (tid, TaskResult([], False, str(exc)), peak_rss())
        except Exception:
            reply = (tid, traceback.format_exc(), peak_rss())
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            return
    judge.close()


def _maybe_die() -> None:
    path = os.environ.get(DIE_ONCE_ENV)
    if not path:
        return
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    os._exit(9)


class _Worker:
    def __init__(self, process: mp.process.BaseProcess, conn: Connection, slot: int) -> None:
        self.process, self.conn, self.slot = process, conn, slot
        self.ready = False
        self.task: int | None = None


class LocalPool:
    """`width` worker processes on this machine; `map` runs tasks and returns their results
    in task order."""

    kind = "local"

    def __init__(self, spec: JudgeSpec, data: Any, width: int,
                 factory: Callable[[JudgeSpec], Any] = SampleJudge) -> None:
        self._ctx = mp.get_context("spawn")
        self._spec, self._data, self._factory = spec, data, factory
        self.width = max(1, width)
        self.peak: dict[int, int] = {}  # slot -> the peak RSS of its workers, bytes
        self.replaced = 0  # workers that died and were replaced
        self._starts_failed = 0
        self._workers = [self._start(slot) for slot in range(self.width)]
        self._finalizer = weakref.finalize(self, _stop_all, self._workers)  # replaced in place

    def _start(self, slot: int) -> _Worker:
        parent, child = self._ctx.Pipe()
        process = self._ctx.Process(target=serve, name=f"trtbisect-worker-{slot}",
                                    args=(child, self._factory, self._spec, self._data),
                                    daemon=True)
        process.start()
        child.close()
        return _Worker(process, parent, slot)

    def map(self, tasks: Sequence[Task]) -> list[TaskResult]:
        pending = deque(range(len(tasks)))
        done: dict[int, TaskResult] = {}
        attempts: dict[int, int] = {}
        while len(done) < len(tasks):
            for w in self._workers:
                if w.ready and w.task is None and pending:
                    w.task = pending.popleft()
                    w.conn.send((w.task, tasks[w.task]))
            signals = [w.conn for w in self._workers] + [w.process.sentinel for w in self._workers]
            ready = set(wait(signals))
            for w in list(self._workers):
                if w.conn in ready or w.conn.poll():
                    try:
                        msg = w.conn.recv()
                    except (EOFError, OSError):
                        msg = None
                    if msg is not None:
                        self._receive(w, msg, done)
                        continue
                if w.process.sentinel in ready or not w.process.is_alive():
                    self._died(w, pending, done, attempts, tasks)
        return [done[i] for i in range(len(tasks))]

    def _receive(self, w: _Worker, msg: tuple, done: dict[int, TaskResult]) -> None:
        if msg[0] == "ready":
            w.ready = True
            self.peak[w.slot] = max(self.peak.get(w.slot, 0), msg[1])
            return
        if msg[0] == "failed":
            self.close()
            raise TrtBisectError(f"a worker could not build the judge: {msg[1].strip()}")
        tid, result, rss = msg
        self.peak[w.slot] = max(self.peak.get(w.slot, 0), rss)
        w.task = None
        if isinstance(result, str):  # a bug in the worker: its traceback
            self.close()
            raise RuntimeError(f"a worker failed:\n{result}")
        done[tid] = result

    def _died(self, w: _Worker, pending: deque, done: dict[int, TaskResult],
              attempts: dict[int, int], tasks: Sequence[Task]) -> None:
        w.process.join(timeout=1)
        code = w.process.exitcode
        tid, w.task = w.task, None
        if tid is None and not w.ready:
            self._starts_failed += 1
            if self._starts_failed > START_FAILURES * self.width:
                self.close()
                raise TrtBisectError(f"workers keep dying while they build the judge (exit "
                                     f"{code}); too little memory? try fewer --workers")
        if tid is not None:
            attempts[tid] = attempts.get(tid, 0) + 1
            if attempts[tid] >= MAX_ATTEMPTS:
                log.warning("a plan killed %d workers (exit %s); judging it failed",
                            attempts[tid], code)
                done[tid] = TaskResult([], False, crashed=attempts[tid])
            else:
                log.warning("worker %d died (exit %s) judging a plan; running it again on a "
                            "new worker", w.slot, code)
                pending.appendleft(tid)
        self.replaced += 1
        self._workers[self._workers.index(w)] = self._start(w.slot)

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> LocalPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InlinePool:
    """The pool's interface in this process: rounds `width` wide, as `width` workers would run
    them, each task judged here one after another. What a search on `width` devices would
    cost is measured with it in rounds (scripts/bench_workers.py simulates 8 GPUs)."""

    kind = "inline"

    def __init__(self, spec: JudgeSpec, data: Any, width: int,
                 factory: Callable[[JudgeSpec], Any] = SampleJudge) -> None:
        self.width = max(1, width)
        self.peak: dict[int, int] = {}
        self.replaced = 0
        self._judge, self._data = factory(spec), data

    def map(self, tasks: Sequence[Task]) -> list[TaskResult]:
        out = []
        for task in tasks:
            results, complete = self._judge.chunk(frozenset(task.plan),
                                                  self._data.pairs(task.indices), task.total,
                                                  task.stop_early)
            out.append(TaskResult(results, complete))
        self.peak[0] = peak_rss()
        return out

    def close(self) -> None:
        self._judge.close()


def _stop_all(workers: list[_Worker]) -> None:
    for w in workers:
        try:
            w.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
    for w in workers:
        w.process.join(timeout=5)
        if w.process.is_alive():
            w.process.kill()
            w.process.join(timeout=5)
        w.conn.close()


def pids(pool: LocalPool) -> list[int]:
    """The workers' process ids (tests)."""
    return [w.process.pid for w in pool._workers if w.process.pid is not None]


