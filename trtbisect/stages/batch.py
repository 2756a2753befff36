"""The search's `Batch` over the run's evaluator and a pool of workers.

Workers only compute: each result comes back to the parent, which takes it when the search
does (`consume`), in the search's order, and only then journals it, scores it and counts its
inferences. A plan the search never takes leaves no trace in the journal, the trace or the
counts the run reports (it is counted in `stats` as speculative). A resumed run's journal
answers without evaluating (`known`). Without workers nothing here runs: `--workers 1` is
the in-process evaluator as it always was.

With fewer plans in a round than workers, each plan's samples are split among the idle
workers (`chunks`); `judge.merge` puts them back into the sequential verdict.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..context import Context, JudgeOptions, SearchOptions
from ..errors import TrtBisectError
from ..parallel.data import FolderData
from ..parallel.judge import JudgeSpec, Measured, graph_digest, merge
from ..parallel.pool import LocalPool, Stats, Task, TaskResult
from ..parallel.sizing import plan_workers
from ..result import WorkersRecord
from ..search.minimal import SearchResult
from .evaluator import Evaluator
from .layerwise import estimate_bytes

log = logging.getLogger(__name__)

# The default pool starts only when the search looks this long in one process: a worker
# costs an interpreter, ONNX Runtime's import and a session build before its first verdict
# (about 2-3 s here), and the estimate below counts a session build in an evaluation, so
# it runs high (deep_12: estimated ~15 s, measured 4.4 s; docs/workers.md)
MIN_SEARCH_SECONDS = 30.0


def why_not_workers(search_seconds: float, workers: int, start_seconds: float) -> str | None:
    """Why `workers` workers would not pay for themselves on a search estimated at
    `search_seconds` in one process (words to follow the estimate; "" when it is too short
    for any), or None when they pay. They pay when the search is long enough
    (`MIN_SEARCH_SECONDS`) and the time they save, the share of the search the other workers
    take, is more than one worker's start: each repeats what the run did before its first
    verdict (`start_seconds`: loading the model, building a judge's session; a 20k-node
    transformer: 10-57 s with the machine's load), and they start side by side. Both sides of
    the comparison slow down together on a loaded machine; the fixed threshold alone did not
    (the 20k-node transformer's 0.46 s inference read 0.8 s under load, over the threshold:
    two workers took 25-37 s for a search of 10 s in the run's own process)."""
    if search_seconds < MIN_SEARCH_SECONDS:
        return ""
    saved = search_seconds * (1 - 1 / max(workers, 1))
    if saved <= start_seconds:
        return (f"; {workers} workers would save about {saved:.0f} s and each costs about "
                f"{start_seconds:.0f} s to start")
    return None


@dataclass
class Outcome:
    """A plan evaluated by the workers: measured, or an error met there, or crashed."""

    measured: Measured | None
    error: str | None = None
    crashed: int = 0


def chunks(indices: Sequence[int], parts: int) -> list[tuple[int, ...]]:
    """`indices` in `parts` consecutive runs as even as can be (none empty)."""
    parts = max(1, min(parts, len(indices)))
    size, extra = divmod(len(indices), parts)
    out, start = [], 0
    for k in range(parts):
        end = start + size + (1 if k < extra else 0)
        out.append(tuple(indices[start:end]))
        start = end
    return out


class ParallelJudge:
    """`search.Batch` for the run's `Evaluator` (stages/evaluator.py): plans in units, mapped to
    nodes by `to_nodes`; `measure` also serves the evaluator's own whole-sample verdicts."""

    def __init__(self, ev: Evaluator, pool: Any, data: Any, stats: Stats,
                 to_nodes: Callable[[frozenset[str]], frozenset[str]] = lambda p: p) -> None:
        self.ev, self.pool, self.data, self.stats = ev, pool, data, stats
        self.to_nodes = to_nodes
        self.width = pool.width
        self.model_dir: str | None = None  # the rewritten model saved for the workers

    def for_units(self, to_nodes: Callable[[frozenset[str]], frozenset[str]]) -> ParallelJudge:
        """The same workers, judging plans of search units."""
        return ParallelJudge(self.ev, self.pool, self.data, self.stats, to_nodes)

    # ------------------------------------------------------------ search.Batch

    def known(self, plan: frozenset[str]) -> bool | None:
        return self.ev.known_verdict(self.to_nodes(plan))

    def evaluate(self, plans: Sequence[frozenset[str]]) -> list[Outcome]:
        nodes = [self.to_nodes(p) for p in plans]
        return self._run(nodes, self.ev.sample_indices(full=False), stop_early=True)

    def passed(self, outcome: Outcome) -> bool | None:
        if outcome.error is not None:
            return None
        if outcome.measured is None:
            return False  # crashed
        return outcome.measured.passed

    def consume(self, plan: frozenset[str], outcome: Outcome | None) -> bool:
        nodes = self.to_nodes(plan)
        if outcome is None:  # known: the journal's (or judged before the search)
            return self.ev.check(nodes)
        if outcome.error is not None:
            raise TrtBisectError(outcome.error)
        if outcome.measured is None:
            return self.ev.crashed(nodes, outcome.crashed)
        return self.ev.commit(nodes, outcome.measured, taken=True)

    # ------------------------------------------------------------ the evaluator's verdicts

    def measure(self, plan: frozenset[str], indices: Sequence[int], stop_early: bool) -> Measured:
        """One plan on `indices`, its samples split among the workers."""
        out = self._run([plan], indices, stop_early)[0]
        if out.error is not None:
            raise TrtBisectError(out.error)
        if out.measured is None:
            raise TrtBisectError("the plan crashed every worker that judged it (out of memory?)")
        return out.measured

    def _run(self, plans: Sequence[frozenset[str]], indices: Sequence[int],
             stop_early: bool) -> list[Outcome]:
        parts = max(1, self.width // len(plans)) if len(plans) < self.width else 1
        split = chunks(list(indices), parts)
        tasks = [Task(tuple(sorted(p)), c, len(indices), stop_early) for p in plans for c in split]
        began = time.perf_counter()
        results = self.pool.map(tasks)
        self.stats.seconds_waiting += time.perf_counter() - began
        self.stats.tasks += len(tasks)
        self.stats.inferences += sum(len(r.results) for r in results)
        self.stats.peak_rss, self.stats.replaced = dict(self.pool.peak), self.pool.replaced
        crit = self.ev.judge.criteria
        out = []
        for k in range(len(plans)):
            mine: list[TaskResult] = results[k * len(split):(k + 1) * len(split)]
            error = next((r.error for r in mine if r.error is not None), None)
            crashed = max(r.crashed for r in mine)
            if error is not None:
                out.append(Outcome(None, error))
            elif crashed:
                out.append(Outcome(None, crashed=crashed))
            else:
                out.append(Outcome(merge([(r.results, r.complete) for r in mine], crit,
                                         len(indices), stop_early)))
        return out

    def close(self) -> None:
        self.pool.close()
        self.data.remove()
        if self.model_dir is not None:
            import shutil
            shutil.rmtree(self.model_dir, ignore_errors=True)


def start_workers(ev: Evaluator, ctx: Context, judge: JudgeOptions, search: SearchOptions,
                  prefetch: Sequence[str],
                  seconds_per_evaluation: float | None = None, evaluations: int = 0,
                  cache: Path | None = None, say: Callable[[str], None] = log.info,
                  rewritten: bool = False, start_seconds: float = 0.0
                  ) -> ParallelJudge | None:
    """The run's workers (None: judge in this process). `--workers N` asks N (1: none);
    without it, as many as the cores and memory allow, unless they would not pay for
    themselves (`why_not_workers`: the search's estimate, `seconds_per_evaluation` x
    `evaluations`, against `start_seconds`, what a worker's start repeats). The choice is said
    (`say`) and kept for precision.json."""
    requested = search.workers
    ev.parallel_note = None
    if search.ray is None and requested == 1:
        return None
    weights = ctx.judged.weights.total_bytes()
    plan = plan_workers(requested, judge.threads, weights, _activations(ctx))
    if search.ray is None and plan.workers <= 1:
        why = f"judging in this process: {plan.why}"
        ev.parallel_note = {"workers": 1, "chosen": why}
        say(why)
        return None
    if search.ray is None and requested is None and seconds_per_evaluation is not None:
        short = why_not_workers(seconds_per_evaluation * evaluations, plan.workers,
                                start_seconds)
        if short is not None:
            # the count is the fewest a search of this shape takes (a guess before it runs:
            # PP-OCRv4 det was guessed at 17 s and took 55 s), so the words say what it is
            why = (f"judging in this process: the search looks short for starting workers (its "
                   f"fewest likely {evaluations} evaluations take about "
                   f"{seconds_per_evaluation * evaluations:.0f} s{short}; --workers N to ask)")
            ev.parallel_note = {"workers": 1, "chosen": why}
            say(why)
            return None
    data_parent = cache / "workers" if cache is not None else None
    spec, model_dir = _spec(ev, ctx, judge, prefetch, rewritten, data_parent)
    pool: Any
    data: Any
    if search.ray is not None:
        from ..parallel.ray_pool import RayPool
        pool, data, stats = RayPool.start(spec, ctx, search.ray, requested, plan)
    else:
        data = FolderData.write(ctx.every_sample, ctx.every_reference, data_parent)
        pool = LocalPool(spec, data, plan.workers)
        stats = Stats(plan.workers, "local", judge.threads, plan.why)
    say(f"evaluating in parallel: {stats.why}")
    workers = ParallelJudge(ev, pool, data, stats)
    workers.model_dir = model_dir
    ev.use_workers(workers)
    return workers


def _spec(ev: Evaluator, ctx: Context, judge: JudgeOptions, prefetch: Sequence[str],
          rewritten: bool, parent: Path | None) -> tuple[JudgeSpec, str | None]:
    model, model_dir = str(ctx.path), None
    if rewritten:  # the rewritten model lives in memory only: saved for the workers
        import tempfile

        from ..judge.mixed import graph_model
        if parent is not None:
            parent.mkdir(parents=True, exist_ok=True)
        model_dir = tempfile.mkdtemp(prefix="model-", dir=parent)
        model = str(Path(model_dir) / f"{ctx.path.stem}.rewritten.onnx")
        graph_model(ctx.graph).save(Path(model), held=ctx.input_check)
    from ..graph.repair import input_shapes
    spec = JudgeSpec(
        model=model, judge=judge.settings, watch=tuple(ev.watch),
        groups=tuple(tuple(g) for g in ev.groups), active=tuple(prefetch),
        names=graph_digest(ctx.judged), shapes=input_shapes(ctx.graph.source))
    return spec, model_dir


def _activations(ctx: Context) -> int:
    """Bytes of the largest tensors of one inference (a few are alive at once)."""
    try:
        sizes = sorted(estimate_bytes(ctx.judged, ctx.samples[0]).values(), reverse=True)
    except Exception:  # shape inference may fail on exotic models: the inputs' size then
        return sum(a.nbytes for a in ctx.samples[0].values())
    return sum(sizes[:2])


def summary(judge: ParallelJudge | None, search: SearchResult, ev: Evaluator | None = None
            ) -> WorkersRecord | None:
    """precision.json's `workers`: rounds against evaluations, the speculation, the pool (or
    why the default judged in this process)."""
    if judge is None:
        note = getattr(ev, "parallel_note", None)
        return WorkersRecord.from_json(note) if note is not None else None
    out = judge.stats.to_json()
    out.update(rounds=search.rounds, evaluations=search.evaluations,
               speculative=search.speculative)
    return WorkersRecord.from_json(out)

