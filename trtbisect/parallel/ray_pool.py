"""The workers as Ray actors (`--ray [ADDRESS]`): the same judge and tasks as `pool.LocalPool`.

Each actor builds the run's judge once (`judge.SampleJudge`) from the `JudgeSpec`, the model's
bytes and the samples, both from Ray's object store (`ray.put` once per run, read by every
actor): a node needs no copy of the user's files. A model beyond `INLINE_BYTES`, or one with
external weights, travels as its path instead, which every node must read (a shared file
system); the actor checks its sha256 against the run's before judging. An actor that dies
(its process or its node) is replaced and its task run again, as `LocalPool` does: a task
that kills `MAX_ATTEMPTS` actors is reported crashed. Results are keyed by task, so none is
lost or counted twice. Ray's own actor restarts are off: retries are counted here.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import TrtBisectError, require
from ..search.journal import MAX_ATTEMPTS
from .data import ObjectData
from .judge import JudgeSpec, SampleJudge
from .pool import Stats, Task, TaskResult, _maybe_die, peak_rss

log = logging.getLogger(__name__)

RAY_HINT = "--ray needs Ray: pip install 'trtbisect[ray]'"
INLINE_BYTES = 512 << 20  # larger models go to the actors as a path every node reads


def require_ray() -> ModuleType:
    """Ray, or a one-line install hint (exit 2) before the run does any work."""
    return require("ray", RAY_HINT)


class RayWorker:
    """One actor: the run's judge, judging one task at a time."""

    def __init__(self, spec: JudgeSpec, model: Any, data: Any) -> None:
        self._folder = None
        if model is not None:  # the model's bytes from the object store: a private copy
            self._folder = tempfile.mkdtemp(prefix="trtbisect-actor-")
            path = Path(self._folder) / Path(spec.model).name
            path.write_bytes(model)
            from dataclasses import replace
            spec = replace(spec, model=str(path))
        self.error: str | None = None
        try:
            self.judge: SampleJudge | None = SampleJudge(spec)
        except TrtBisectError as exc:  # told back with the first task (exit 2)
            self.judge, self.error = None, f"a Ray actor could not build the judge: {exc}"
        self.data = data

    def ready(self) -> int:
        return peak_rss()

    def run(self, task: Task) -> tuple[TaskResult, int]:
        _maybe_die()  # the test hook of pool.py: kill exactly one actor mid-task
        if self.judge is None:
            return TaskResult([], False, self.error), peak_rss()
        try:
            results, complete = self.judge.chunk(frozenset(task.plan),
                                                 self.data.pairs(task.indices), task.total,
                                                 task.stop_early)
            return TaskResult(results, complete), peak_rss()
        except TrtBisectError as exc:
            return TaskResult([], False, str(exc)), peak_rss()

    def close(self) -> None:
        if self.judge is not None:
            self.judge.close()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)


def connect(ray: ModuleType, address: str, cpus: int) -> bool:
    """Join the cluster at `address` ("local": start one with `cpus` CPUs). True when this run
    started Ray (and shuts it down)."""
    if ray.is_initialized():
        return False
    check_address(address)
    try:
        if address == "local":
            ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.WARNING, configure_logging=False)
        else:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING,
                     configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TrtBisectError(f"--ray {address}: no Ray cluster could be joined ({first}); "
                             "start one with `ray start --head`, or give --ray without an "
                             "address for a local one") from None
    return True


CONNECT_SECONDS = 10.0  # a cluster's head that does not answer a TCP connect in this is down


def check_address(address: str) -> None:
    """Fail in seconds, not minutes, on a `host:port` nobody answers at (ray.init retries a
    dead GCS address for minutes)."""
    import socket

    bare = address.split("://", 1)[-1]
    host, sep, port = bare.rpartition(":")
    if address in ("local", "auto") or not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as exc:
        raise TrtBisectError(f"--ray {address}: no Ray cluster answers there "
                             f"({exc.strerror or exc}); start one with `ray start --head`, or "
                             "give --ray without an address for a local one") from None


class RayPool:
    """`width` actors; `map` runs tasks and returns their results in task order."""

    kind = "ray"

    def __init__(self, ray: ModuleType, spec: JudgeSpec, model: Any, data: Any, width: int,
                 threads: int, started: bool) -> None:
        self._ray, self._spec, self._model, self._data = ray, spec, model, data
        self._threads, self._started = threads, started
        self.width = max(1, width)
        self.peak: dict[int, int] = {}
        self.replaced = 0
        self._remote = ray.remote(num_cpus=threads, max_restarts=0,
                                  max_task_retries=0)(RayWorker)
        self._actors = [self._start() for _ in range(self.width)]

    @classmethod
    def start(cls, spec: JudgeSpec, ctx: Any, address: str, requested: int | None,
              plan: Any) -> tuple[RayPool, ObjectData, Any]:
        ray = require_ray()
        threads = max(1, spec.judge.threads or 1)
        started = connect(ray, address, max(plan.cores, requested or 0))
        cpus = int(ray.cluster_resources().get("CPU", 1))
        fit = max(1, cpus // threads)  # more actors than CPUs would wait for CPUs forever
        width = fit if requested is None else min(requested, fit)
        why = f"{width} Ray actor{'s' if width != 1 else ''}"
        if requested is not None and width == requested:
            why += " as asked"
        else:
            why += (f": the cluster's {cpus} CPU{'s' if cpus != 1 else ''} at {threads} "
                    f"thread{'s' if threads != 1 else ''} each"
                    + (f" ({requested} asked)" if requested is not None else ""))
        model_ref, spec = _model_for_actors(ray, spec, ctx)
        data = ObjectData.put(ctx.every_sample, ctx.every_reference)
        pool = cls(ray, spec, model_ref, data, width, threads, started)
        return pool, data, Stats(width, "ray", spec.judge.threads, why)

    def _start(self) -> Any:
        return self._remote.remote(self._spec, self._model, self._data)

    def _replace(self, slot: int, why: str) -> None:
        self.replaced += 1
        log.warning("Ray actor %d died (%s); starting another", slot, why)
        self._actors[slot] = self._start()

    def map(self, tasks: Sequence[Task]) -> list[TaskResult]:
        ray = self._ray
        pending = deque(range(len(tasks)))
        done: dict[int, TaskResult] = {}
        attempts: dict[int, int] = {}
        running: dict[Any, tuple[int, int]] = {}  # future -> (slot, task)
        busy: set[int] = set()
        while len(done) < len(tasks):
            for slot in range(self.width):
                if slot not in busy and pending:
                    tid = pending.popleft()
                    running[self._actors[slot].run.remote(tasks[tid])] = (slot, tid)
                    busy.add(slot)
            ready, _ = ray.wait(list(running), num_returns=1)
            for future in ready:
                slot, tid = running.pop(future)
                busy.discard(slot)
                try:
                    result, rss = ray.get(future)
                except ray.exceptions.RayActorError as exc:
                    attempts[tid] = attempts.get(tid, 0) + 1
                    if attempts[tid] >= MAX_ATTEMPTS:
                        log.warning("a plan killed %d Ray actors; judging it failed",
                                    attempts[tid])
                        done[tid] = TaskResult([], False, crashed=attempts[tid])
                    else:
                        pending.appendleft(tid)
                    self._replace(slot, type(exc).__name__)
                    continue
                except ray.exceptions.RayTaskError as exc:  # a bug in the actor
                    self.close()
                    raise RuntimeError(f"a Ray actor failed:\n{exc}") from None
                self.peak[slot] = max(self.peak.get(slot, 0), rss)
                done[tid] = result
        return [done[i] for i in range(len(tasks))]

    def close(self) -> None:
        ray = self._ray
        actors, self._actors = self._actors, []
        for actor in actors:
            try:
                ray.kill(actor)
            except Exception:  # already dead: nothing to stop
                pass
        if self._started and ray.is_initialized():
            ray.shutdown()
            self._started = False


def _model_for_actors(ray: ModuleType, spec: JudgeSpec, ctx: Any) -> tuple[Any, JudgeSpec]:
    """The model's bytes in the object store, or (too large, external weights) its path and
    sha256, which an actor checks."""
    from dataclasses import replace

    from ..graph import model_hash

    path = Path(spec.model)
    size = path.stat().st_size
    if getattr(ctx, "data_sha256", None) is None and size <= INLINE_BYTES:
        return ray.put(path.read_bytes()), spec
    log.info("the model reaches the Ray actors as %s (every node must read it)", path)
    return None, replace(spec, model=str(path.resolve()), model_sha256=model_hash(os.fspath(path)))
