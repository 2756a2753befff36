"""The run's evaluator: a plan judged on every sample under the run's criteria, in this
process or on the workers (parallel/), each verdict scored and journaled."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from .. import parallel
from ..backends.ort import Emulator
from ..context import Context, JudgeOptions
from ..errors import TrtBisectError
from ..judge import semantics, subset
from ..judge.compare import TensorStats, Tolerance, pressure
from ..judge.criteria import TIMEOUT, Judgement, json_number, worst_of
from ..search.journal import Journal, plan_key


class Workers(Protocol):
    """What the evaluator asks of its workers (stages/batch.py's `ParallelJudge`, which
    drives this evaluator and so is above it): a plan judged on some samples, and to stop."""

    def measure(self, plan: frozenset[str], indices: Sequence[int], stop_early: bool
                ) -> parallel.Measured: ...

    def close(self) -> None: ...


class Evaluator:
    """Runs a plan on every sample and judges it; journals each judgement."""

    def __init__(self, ctx: Context, judge: JudgeOptions, stats: Mapping[str, TensorStats],
                 journal: Journal | None, groups: Iterable[Iterable[str]] | None = None,
                 scope: str = "") -> None:
        """`judge`: the run's judge options (an aimed search's, stages/search.py). `groups`:
        nodes that plans keep together (default: the search's units). `scope`: what sets
        these verdicts apart in the run's journal from others on the same plans (an aimed
        search's bound, stages/search.py): "" for the run's own settings."""
        self.ctx, self.judge, self.journal, self.scope = ctx, judge, journal, scope
        self.watch = [t for t in ctx.judged.stored_tensors()
                      if t in stats and stats[t].fp32_nonfinite == 0] if judge.strict else []
        if groups is None:
            groups = (semantics.units(ctx.prepared, ctx.judged.candidates()).values()
                      if ctx.prepared is not None else ())
        self.groups = [list(g) for g in groups]
        self._emulator_args: dict[str, Any] = dict(watch=self.watch, rules=ctx.rules,
                                                   groups=self.groups)
        self._emulator: Emulator | None = None
        self.workers: Workers | None = None  # evaluations on worker processes
        self.parallel_note: dict | None = None  # why the run judged in this process
        self.runs = 0  # inferences, for cost accounting
        self.known: dict[frozenset[str], bool] = {}  # judged outside the search (all-FP16)
        self.last_plan: frozenset[str] | None = None
        self.last_errors: list[Judgement] = []  # per sample, for `last_plan`
        self.scores: dict[frozenset[str], float] = {}  # each judged plan's worst severity
        # each judged plan's pressure per output (1 at the bound: `pressure`), and whether
        # every sample was judged (a failure stops early: then a lower bound)
        self.pressures: dict[frozenset[str], tuple[dict[str, float], bool]] = {}
        self.why: dict[frozenset[str], str] = {}  # each failing plan's first failure (`failure`)
        self.failed: set[frozenset[str]] = set()  # plans judged failing (carried by retarget)

    @property
    def emulator(self) -> Emulator:
        """Built on first use: a verdict the written file decides alone never needs it."""
        if self._emulator is None:
            self._emulator = Emulator(self.ctx.judged, self.judge.threads, **self._emulator_args)
        return self._emulator

    def retarget(self, judge: JudgeOptions, stats: Mapping[str, TensorStats], scope: str
                 ) -> Evaluator:
        """This evaluator under other options (an aimed search's bound, stages/search.py): the
        verdicts it holds and its workers (whose judges carry the old bound) go; its session
        stays when what it watches is the same, since no session depends on the bound (one
        session build saved per aimed round: seconds on a 20k-node model)."""
        again = Evaluator(self.ctx, judge, stats, self.journal, self.groups, scope)
        # an aimed bound only tightens (Tolerance.ceiling) and samples only join: what
        # failed still fails (under --pass-rate another sample could make up for it)
        if judge.criteria.pass_rate >= 1:
            again.failed = set(self.failed)
            again.known.update({p: False for p in self.failed})
            again.why.update({p: "carried: failed under a looser bound ("
                              + self.why.get(p, "failed") + ")" for p in self.failed})
        if self.workers is not None:
            self.workers.close()
            self.workers = None
        if again.watch == self.watch and again._emulator_args == self._emulator_args:
            again._emulator, self._emulator = self._emulator, None
        self.close()
        return again

    def close(self) -> None:
        if self._emulator is not None:
            self._emulator.close()
            self._emulator = None
        if self.workers is not None:
            self.workers.close()
            self.workers = None

    def use_workers(self, workers: Workers) -> None:
        """Judge on `workers` from now on (parallel/): this process's session goes."""
        if self._emulator is not None:
            self._emulator.close()
        self.workers = workers

    def sample_indices(self, full: bool = False) -> list[int]:
        """Indices into every sample of those a verdict judges (`full`: all of them)."""
        if full or self.ctx.subset is None:
            return list(range(len(self.ctx.every_sample)))
        return list(self.ctx.subset)

    def measure(self, plan: frozenset[str], stop_early: bool = False, full: bool = False
                ) -> tuple[bool, list[Judgement], list[str]]:
        """The plan judged on the search's samples (`full`: on every sample) under the run's
        criteria (judge/criteria.py); `stop_early`: stop once the plan cannot pass any more.
        One rule for this process and the workers (parallel/judge.py)."""
        crit, judge = self.judge.criteria, self.judge
        full = full or self.ctx.subset is None
        if self.workers is not None:
            m = self.workers.measure(plan, self.sample_indices(full), stop_early)
        else:
            samples = self.ctx.every_sample if full else self.ctx.samples
            references = self.ctx.every_reference if full else self.ctx.references
            assert samples is not None and references is not None
            m = parallel.take((parallel.judge_one(self.emulator, plan, s, r, crit, judge.tolerance,
                                                  judge.strict)
                               for s, r in zip(samples, references)), crit, len(samples),
                              stop_early)
        self.runs += len(m.judged)
        if full and not m.stopped:
            self.last_plan, self.last_errors = plan, m.judged  # every sample: reusable as is
        return m.passed, m.judged, m.nonfinite

    def widened(self) -> None:
        """The search's samples grew (judge/subset.py): what passed on fewer may not now;
        what failed still fails."""
        self.known = {p: ok for p, ok in self.known.items() if not ok}

    def _key(self, plan: frozenset[str]) -> str:
        key = plan_key(plan)
        if self.ctx.subset is not None:  # a verdict on these samples only
            key += "@" + subset.signature(self.ctx.subset)
        if self.scope:  # a verdict under these settings only (an aimed search's bound)
            key += "#" + self.scope
        return key

    def judged_outside(self, plan: frozenset[str], passed: bool,
                       judged: Sequence[Judgement]) -> None:
        """A plan judged outside the search (all-FP16, its written file): its verdict, its
        score and, failing, why (`failure`), as if the search had judged it."""
        self.known[plan] = passed
        self.scores[plan] = _severity(judged)
        self.pressures[plan] = (pressure(j.errors for j in judged), True)
        if not passed:
            numbers = self.ctx.sample_numbers()
            self.why[plan] = failure(judged, [], self.judge.tolerance,
                                     numbers if len(numbers) >= len(judged) else None)

    def known_verdict(self, plan: frozenset[str]) -> bool | None:
        """The verdict `check` gives without judging (known, or in a resumed run's journal);
        nothing written."""
        if plan in self.known:
            return self.known[plan]
        return self.journal.peek(self._key(plan)) if self.journal is not None else None

    def check(self, plan: frozenset[str]) -> bool:
        if plan in self.known:
            return self.known[plan]
        key = self._key(plan)
        if self.journal is not None:
            rec = self.journal.lookup(key)
            if rec is not None:
                severity = rec.get("severity")
                self.scores[plan] = (float(severity) if severity is not None
                                     else _score(rec.get("rel", {})))
                self.pressures[plan] = ({o: float(v) for o, v in
                                         rec.get("pressure", {}).items()},
                                        bool(rec.get("complete", True)))
                if not rec["passed"]:
                    self.failed.add(plan)
                    self.why[plan] = str(rec.get("why") or ("crashed" if rec.get("crashed")
                                                            else "failed (an earlier run's)"))
                return bool(rec["passed"])
            self.journal.start(key)
        try:
            passed, judged, bad = self.measure(plan, stop_early=True)
        except TrtBisectError:  # bad input (a --check hook raised): no verdict to record
            if self.journal is not None:
                self.journal.abandon(key)
            raise
        return self.commit(plan, parallel.Measured(passed, judged, bad))

    def commit(self, plan: frozenset[str], m: parallel.Measured, taken: bool = False) -> bool:
        """A judged plan's verdict, scored and journaled. `taken`: measured by the workers
        and taken by the search now (its inferences count from here)."""
        if taken:
            self.runs += len(m.judged)
            if self.ctx.subset is None and not m.stopped:
                self.last_plan, self.last_errors = plan, m.judged
        self.scores[plan] = _severity(m.judged)
        # complete: every sample the search judges on was judged (a stop skips the rest;
        # whether a stop was flagged differs between this process and the workers)
        self.pressures[plan] = (pressure(j.errors for j in m.judged),
                                len(m.judged) >= len(self.sample_indices()))
        why = None
        if not m.passed:
            self.failed.add(plan)
            numbers = self.ctx.sample_numbers()
            why = self.why[plan] = failure(m.judged, m.nonfinite, self.judge.tolerance,
                                           numbers if len(numbers) >= len(m.judged) else None)
        if self.journal is not None:
            self.journal.record(self._key(plan), m.passed, {
                "rel": {n: json_number(e.rel) for n, e in worst_of(m.judged).items()},
                "severity": json_number(self.scores[plan]),
                "pressure": {o: json_number(v) for o, v in self.pressures[plan][0].items()},
                "complete": self.pressures[plan][1],
                "nonfinite_tensors": m.nonfinite[:10], **({"why": why} if why else {})})
        return m.passed

    def crashed(self, plan: frozenset[str], attempts: int) -> bool:
        """A plan that killed `attempts` workers: judged failed, as the journal judges a plan
        that crashes the process."""
        self.why[plan] = "crashed"
        if self.journal is not None:
            self.journal.record(self._key(plan), False, {"crashed": True, "attempts": attempts})
        return False


FAILURES = {  # a failing plan's reason, by kind (the trade-off plot marks each kind)
    "tensor": "a watched tensor went non-finite (--strict)",
    "timeout": "an inference ran past --eval-timeout",
    "nonfinite": "an output went non-finite",
    "criterion": "a criterion's score missed its threshold",
    "hook": "the --check hook failed a sample",
    "margin": "over the aimed bound (the margin inside the tolerance)",
    "own": "over the output's own --output-tol",
    "bound": "over the tolerance bound",
    "pass-rate": "too few samples passed (--pass-rate)",
    "carried": "failed under a looser bound, so under this one (an aimed search)",
    "crashed": "the plan crashed the process",
    "failed": "failed (no reason recorded)",
}


def failure(judged: Sequence[Judgement], nonfinite: Sequence[str], tol: Tolerance,
            numbers: Sequence[int] | None = None) -> str:
    """Why a plan failed, as `KIND: where` (KIND a key of FAILURES): the first failure in
    sample order, naming the output and the sample (the user's number, `numbers`). The
    trade-off plot's score is the worst relative error over outputs and samples; a plan that
    fails under the line failed by something that score does not show (a tighter aimed or
    per-output bound, a criterion, a non-finite tensor), and this says which."""
    if nonfinite:
        return f"tensor: {nonfinite[0]}"
    for k, j in enumerate(judged):
        if j.passed:
            continue
        n = numbers[k] if numbers is not None else k
        for o, e in j.errors.items():
            if e.passed:
                continue
            if any(s.criterion == TIMEOUT for s in e.scores):
                return f"timeout: sample {n}"
            if e.nonfinite:
                return f"nonfinite: {o} on sample {n}"
            if e.scores:
                miss = next((s for s in e.scores if not s.passed), e.scores[0])
                return f"criterion: {o} {miss.criterion} on sample {n}"
            ceiling = tol.ceiling_for(o)
            if math.isfinite(ceiling) and e.bound >= ceiling:
                return f"margin: {o} on sample {n}"
            if tol.for_output(o) != (tol.rtol, tol.atol):
                return f"own: {o} on sample {n}"
            return f"bound: {o} on sample {n}"
        if any(not s.passed for s in j.scores):
            return f"hook: sample {n}"
    return "pass-rate: " + f"{sum(j.passed for j in judged)} of {len(judged)} samples"


def _score(rel: Mapping[str, object]) -> float:
    """A plan's worst relative error over its outputs (journal values may be "inf"/"nan")."""
    values = [float(v) for v in rel.values()]  # type: ignore[arg-type]
    return max(values) if values else math.nan


def _severity(judged: Iterable[Judgement]) -> float:
    """A judged plan's score for the trade-off plot: its worst severity over samples and
    outputs (under the default criterion: the worst relative error; else 1 at the bound)."""
    errors = worst_of(judged)
    return max((e.severity for e in errors.values()), default=math.nan)

