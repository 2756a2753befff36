"""TensorRT builders on several GPUs (#23): `--backend trt --workers N` with several visible.

The TensorRT search (`search/refine.emulator_then_trt`) proposes batches of plans as every search
does (search.py's `Batch`); here each plan of a batch is built and run on its own GPU, by a
worker process that sees only that GPU (`CUDA_VISIBLE_DEVICES=<it>`, set in the worker before
TensorRT is imported) and holds one `TrtBackend`. The FP32 reference outputs are the parent's,
computed once and sent to every worker, so each plan is judged against the same numbers as the
sequential search judges it, on every sample, by the run's criteria (`TrtSpec.judge`, the
run's `JudgeSettings`: the criterion flags, parsed again in the worker, where a `--check` hook
is imported again, as the emulator's workers do; judge/engine.py is the one rule). Results
are taken in the search's order (search.Oracle), so the plan, the trace and the builds of
taken plans are the sequential search's; engines built for plans the search never took are
counted apart (`speculative_builds`).

The workers are `pool.LocalPool`'s (spawned; a worker that dies is replaced, on the same GPU,
and its plan built again; a plan that kills `journal.MAX_ATTEMPTS` workers is judged failed).
Engines go to the run's engine cache, whose key names the GPU model, not its index, so the
parent finds the final plan's engine a worker built.

Tested only against the fake TensorRT of tests/fixtures/trt/ (tests/parallel/test_trt_pool.py), with
simulated `CUDA_VISIBLE_DEVICES`; never run on TensorRT or a GPU.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, cast

import numpy as np

from ..errors import TrtBisectError
from ..judge.settings import JudgeSettings, criteria_digest
from .pool import LocalPool, Task, TaskResult, _Worker, serve

log = logging.getLogger(__name__)

Feeds = Mapping[str, np.ndarray]


def visible_gpus(env: Mapping[str, str] | None = None,
                 smi: Callable[[], str | None] | None = None) -> tuple[list[str], str]:
    """The GPUs this process may use, as `CUDA_VISIBLE_DEVICES` entries, and where that came
    from; read without importing TensorRT, CUDA or torch. `CUDA_VISIBLE_DEVICES` when set
    (CUDA ignores everything from its first invalid entry on: an empty or negative one), else
    the lines of `nvidia-smi -L`, else one device (CUDA's device 0)."""
    env = os.environ if env is None else env
    if "CUDA_VISIBLE_DEVICES" in env:
        out = []
        for entry in (e.strip() for e in env["CUDA_VISIBLE_DEVICES"].split(",")):
            if not entry or entry.startswith("-"):
                break
            out.append(entry)
        return out, f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}"
    listing = (smi or _nvidia_smi)()
    if listing is not None:
        gpus = [line for line in listing.splitlines() if line.startswith("GPU ")]
        if gpus:
            return [str(i) for i in range(len(gpus))], "nvidia-smi -L"
    return ["0"], "no CUDA_VISIBLE_DEVICES and no nvidia-smi: one device assumed"


def _nvidia_smi() -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        return subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30,
                              check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def choose_gpus(workers: int | None, env: Mapping[str, str] | None = None,
                smi: Callable[[], str | None] | None = None) -> tuple[list[str], str]:
    """The GPUs the TensorRT search builds on (`--workers` caps them) and the sentence saying
    so. One GPU (or none asked): the search builds in this process."""
    gpus, source = visible_gpus(env, smi)
    chosen = gpus[:max(1, workers or 1)]
    if not gpus:
        return [], f"TensorRT builders: no GPU visible ({source})"
    if len(chosen) <= 1:
        return chosen, (f"TensorRT builders: 1 GPU, in this process ({len(gpus)} visible, "
                        f"from {source}; --workers {workers or 1})")
    return chosen, (f"TensorRT builders: {len(chosen)} GPUs ({', '.join(chosen)}; "
                    f"{len(gpus)} visible, from {source}; --workers {workers})")


@dataclass(frozen=True)
class TrtSpec:
    """What a worker needs to build the run's `TrtBackend` on its GPU."""

    model: bytes  # the named model (TrtBackend.model), serialized
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    # the tolerance and the criteria as flags with their fingerprint (no flags: the default);
    # a --check file changed since the parent read it is refused
    judge: JudgeSettings
    cache_dir: str
    typing: str
    device: str = ""  # this worker's CUDA_VISIBLE_DEVICES
    # runs in the worker before TensorRT is imported; tests install the fake TensorRT with it
    setup: Callable[[], None] | None = None


@dataclass(frozen=True)
class TrtData:
    """The samples and the parent's FP32 reference outputs, one pair per sample."""

    samples: tuple[Feeds, ...]
    refs: tuple[Feeds, ...]

    def pairs(self, indices: Sequence[int]) -> list[tuple[Feeds, Feeds]]:
        return [(self.samples[i], self.refs[i]) for i in indices]


@dataclass(frozen=True)
class Verdict:
    """One plan judged by a worker: pass or fail, and what its engine cost there."""

    passed: bool
    builds: int
    cache_hits: int
    device: str  # the worker's CUDA_VISIBLE_DEVICES
    pid: int


class TrtJudge:
    """A worker's judge (built by `pool.serve`): one TrtBackend on the worker's one GPU."""

    def __init__(self, spec: TrtSpec) -> None:
        os.environ["CUDA_VISIBLE_DEVICES"] = spec.device  # before TensorRT is imported
        if spec.setup is not None:
            spec.setup()
        import onnx

        from ..backends.trt import TrtBackend
        settings = spec.judge
        self.tolerance = settings.tolerance
        self.criteria = settings.criteria() if settings.criteria_flags else None
        if self.criteria is not None and (criteria_digest(self.criteria)
                                          != settings.criteria_fingerprint):
            raise TrtBisectError("a --check file changed during the run")
        self.backend = TrtBackend(onnx.load_from_string(spec.model), shapes=dict(spec.shapes),
                                  tolerance=settings.tolerance, cache_dir=spec.cache_dir,
                                  typing=spec.typing, eval_timeout=settings.eval_timeout)
        self.device = spec.device

    def chunk(self, plan: frozenset[str], pairs: Sequence[tuple[Feeds, Feeds]], total: int,
              stop_early: bool) -> tuple[list[Verdict], bool]:
        """The sequential search's check (stages/trt.run_trt_search's `trt_check`): the plan's
        engine on every sample under the run's criteria, stopping once it cannot pass."""
        from ..judge.engine import engine_passes
        builds, hits = self.backend.builds, self.backend.cache_hits
        samples, refs = [s for s, _ in pairs], [r for _, r in pairs]
        passed = engine_passes(lambda s: self.backend.run(plan, s), samples, refs,
                               self.criteria, self.tolerance)
        return [Verdict(passed, self.backend.builds - builds, self.backend.cache_hits - hits,
                        os.environ.get("CUDA_VISIBLE_DEVICES", ""), os.getpid())], True

    def close(self) -> None:
        self.backend.close()


class GpuPool(LocalPool):
    """`LocalPool` with one worker per GPU: slot k's worker sees only `devices[k]`."""

    def __init__(self, spec: TrtSpec, data: TrtData, devices: Sequence[str]) -> None:
        self.devices, self._trt_spec = list(devices), spec
        super().__init__(spec, data, len(self.devices), factory=TrtJudge)  # type: ignore[arg-type]

    def map(self, tasks: Sequence[Task]) -> list[TaskResult]:
        """`LocalPool.map` once every worker is up: a round of K plans then goes to K GPUs
        (a TensorRT build takes minutes, a worker's start seconds)."""
        while not all(w.ready for w in self._workers):
            waiting = [w for w in self._workers if not w.ready]
            ready = set(wait([w.conn for w in waiting] + [w.process.sentinel for w in waiting]))
            for w in waiting:
                msg = None
                if w.conn in ready or w.conn.poll():
                    try:
                        msg = w.conn.recv()
                    except (EOFError, OSError):
                        msg = None
                if msg is not None:
                    self._receive(w, msg, {})
                elif w.process.sentinel in ready or not w.process.is_alive():
                    self._died(w, deque(), {}, {}, tasks)  # counted as a failed start
        return super().map(tasks)

    def _start(self, slot: int) -> _Worker:
        spec = dataclasses.replace(self._trt_spec, device=self.devices[slot])
        parent, child = self._ctx.Pipe()
        process = self._ctx.Process(target=serve, name=f"trtbisect-gpu-{slot}",
                                    args=(child, TrtJudge, spec, self._data), daemon=True)
        process.start()
        child.close()
        return _Worker(process, parent, slot)


@dataclass
class TrtBatch:
    """`search.Batch` over the GPU workers for the TensorRT search: plans in, verdicts taken in
    the search's order. `builds`/`cache_hits` count the taken plans only."""

    pool: Any
    width: int
    samples: int = 1  # every plan is judged on all of them, as the sequential search does
    builds: int = 0
    cache_hits: int = 0
    evaluated: int = 0
    rounds: int = 0  # batches built at once: the critical path, in build times
    taken: int = 0
    replaced: int = 0
    devices_seen: list[tuple[str, int]] = field(default_factory=list)  # (device, pid) per plan built
    _spent: int = 0  # builds of every plan evaluated, taken or not

    def known(self, plan: frozenset[str]) -> bool | None:
        return None  # the TensorRT search keeps no journal: its Oracle memoizes

    def evaluate(self, plans: Sequence[frozenset[str]]) -> list[TaskResult]:
        every = tuple(range(self.samples))
        results = self.pool.map([Task(tuple(sorted(p)), every, self.samples, True)
                                 for p in plans])
        self.evaluated += len(plans)
        self.rounds += 1
        verdicts = [v for v in map(_verdict, results) if v is not None]
        self._spent += sum(v.builds for v in verdicts)
        self.devices_seen += [(v.device, v.pid) for v in verdicts]
        self.replaced = self.pool.replaced
        return results

    def passed(self, outcome: TaskResult) -> bool | None:
        if outcome.error is not None:
            return None
        verdict = _verdict(outcome)
        return verdict is not None and verdict.passed

    def consume(self, plan: frozenset[str], outcome: TaskResult) -> bool:
        if outcome.error is not None:
            raise TrtBisectError(outcome.error)
        self.taken += 1
        verdict = _verdict(outcome)
        if verdict is None:  # it killed MAX_ATTEMPTS workers: failed, as a crash is
            log.warning("a plan of %d FP32 nodes crashed the TensorRT workers; judged failed",
                        len(plan))
            return False
        self.builds += verdict.builds
        self.cache_hits += verdict.cache_hits
        return verdict.passed

    def summary(self, note: dict | None) -> dict:
        """precision.json's `tensorrt.parallel`: `note` (the GPUs, why) with what they did."""
        return {**(note or {}), "rounds": self.rounds, "evaluated": self.evaluated,
                "speculative": self.evaluated - self.taken,
                "speculative_builds": self._spent - self.builds, "replaced": self.replaced,
                "builders": [{"gpu": d, "pid": p, "plans": n} for (d, p), n
                             in sorted(Counter(self.devices_seen).items())]}

    def close(self) -> None:
        self.pool.close()


def _verdict(result: TaskResult) -> Verdict | None:
    """The worker's verdict (`TrtJudge.chunk` returns one), None for a plan that crashed."""
    return cast(Verdict, result.results[0]) if result.results else None


def start(backend: Any, samples: Sequence[Feeds], refs: Sequence[Feeds],
          devices: Sequence[str], judge: JudgeSettings,
          setup: Callable[[], None] | None = None) -> TrtBatch:
    """Workers on `devices` judging plans of `backend`'s model on `samples` against `refs`,
    by `judge`'s tolerance and criteria (no criteria flags: the default criterion)."""
    spec = TrtSpec(backend.model.SerializeToString(), tuple(sorted(backend.shapes.items())),
                   judge, str(Path(backend.cache_dir)), "strong" if backend.strong else "weak",
                   setup=setup)
    pool = GpuPool(spec, TrtData(tuple(samples), tuple(refs)), devices)
    return TrtBatch(pool, len(devices), len(samples))
