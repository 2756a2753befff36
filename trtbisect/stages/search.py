"""The run's search stage: the minimal FP32 set over TensorRT's units, found on the emulator's
judge, and what the search found (`Searched`, `Aimed`: records the run's result is assembled
from, stages/assembly.assemble).

The first search and each search aimed inside the certificate's bound (stages/spread.py) share
one `SearchStage`: the prior, the units and the pricing; each brings its own evaluator and
options. `pipeline.run` builds it once the all-FP16 verdict, the layer-wise statistics and the
rewrites are known; search.py stays pure (it is handed the check as a function).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..context import Context, JudgeOptions, Options, SearchOptions
from ..graph import Graph
from ..judge import semantics, subset
from ..judge.compare import OutputError, TensorStats, Tolerance
from ..judge.criteria import Judgement, worst_of
from ..judge.mixed import Written, graph_model
from ..judge.verdict import Findings, VerdictName
from ..result import (
    AimedSearch,
    CertificateRecord,
    CriteriaRecord,
    JudgedRecord,
    WorkersRecord,
    search_verdict,
)
from ..rewrites.driver import RewriteOutcome, RewritesRecord
from ..search import cost
from ..search.cost import CostRecord
from ..search.journal import Journal
from ..search.minimal import Progress, SearchResult, find_minimal_fp32
from ..search.noise import watching
from ..search.prior import ConstantStats, Prior, build_prior
from . import batch as parallel_batch
from .evaluator import Evaluator
from .spread import AIM_FLOOR, AIM_ROUNDS, AIM_SHARE, SPREAD_SHARE, Certificate, aimed
from .written import Judged, WrittenFindings, judge_written_plan

Layerwise = Callable[[Context], dict[str, TensorStats]]  # the layer-wise pass, as the run caches it


@dataclass
class SearchStage:
    """What every search of a run shares. `stats` and `prior` change once, when FP16 passed
    at first and an aimed search needs the layer-wise pass after all (`aim`)."""

    ctx: Context
    # the run's own, whole: its budget and records, the sample subset's size, and each aimed
    # round's options derived from them (a search's own: `search(ev, judge, search_opts)`)
    opts: Options
    stats: dict[str, TensorStats]
    constants: Mapping[str, ConstantStats]
    prior: Prior
    units: dict[str, tuple[str, ...]]
    unit_of: dict[str, str]
    pricing: cost.PlanPricing
    before: Sequence[Judgement]  # all-FP16, per sample searched
    record: dict  # what every verdict records of the judge (semantics, precision, coverage)
    base: dict  # ... and of the model
    half_seconds: float  # an all-FP16 inference (the default --workers' estimate)
    # what starting a worker repeats: loading the model, building a judge's session
    worker_start_seconds: float
    stage: Callable[[str], None]
    progress: Progress | None = None
    cache: Path | None = None  # the output folder's cache, where workers spool samples
    outcome: RewriteOutcome | None = None  # --rewrite's, when it ran
    journal: Journal | None = None  # the run's: an aimed search journals its verdicts there too

    @classmethod
    def of(cls, ctx: Context, opts: Options, stats: dict[str, TensorStats],
           constants: Mapping[str, ConstantStats], probe: Callable[[Graph], cost.Probe],
           **rest) -> SearchStage:
        """The stage over `ctx`'s judged graph: its prior, units and prices (`probe`: the
        shapes that shape inference leaves open, for the pricing). `opts`: the run's, whole:
        the stage keeps them (see `opts` above)."""
        g, low = ctx.judged, ctx.rules.precision
        assert ctx.prepared is not None  # prepare(search=True) made it
        prior = build_prior(g, stats, constants, low)
        units = semantics.units(ctx.prepared, g.candidates())
        unit_of = {n: u for u, nodes in units.items() for n in nodes}
        pricing = cost.engine_pricing(ctx.graph, g, ctx.prepared, units, ctx.samples[0],
                                      opts.search.gpu, opts.judge.tf32, probe)
        return cls(ctx, opts, stats, constants, prior, units, unit_of, pricing, **rest)

    @property
    def rewritten(self) -> bool:
        return self.outcome is not None and bool(self.outcome.applied)

    @property
    def rewrite_judgements(self) -> int:
        """Each rewrite was judged like a plan: the evaluations they count."""
        return self.outcome.judgements if self.outcome is not None else 0

    def as_units(self, nodes: Sequence[str]) -> list[str]:
        return list(dict.fromkeys(self.unit_of[n] for n in nodes if n in self.unit_of))

    def as_nodes(self, chosen: Iterable[str]) -> frozenset[str]:
        return frozenset(n for u in chosen for n in self.units[u])

    def search(self, ev: Evaluator, judge: JudgeOptions, search_opts: SearchOptions,
               all_half: bool, pool: bool, start: Sequence[str] = ()
               ) -> tuple[SearchResult, WorkersRecord | None]:
        """One search judged by `ev` under `judge` and run as `search_opts` say (the run's
        options, or aimed inside the bound: stages/spread.py); `pool`: on worker processes
        when they pay off. `start`: units to try first, before the prior's seeds (an aimed
        search: the previous plan)."""
        ctx, g, prior, units = self.ctx, self.ctx.judged, self.prior, self.units
        workers = None
        if not all_half:
            prefetch = prefetch_nodes(g, prior.seeds, prior.ranking,
                                      _neighbours(units, self.unit_of, self.pricing.adjacent))
            if pool:
                workers = parallel_batch.start_workers(
                    ev, ctx, judge, search_opts, prefetch,
                    self.half_seconds * len(ctx.samples) / len(ctx.every_sample),
                    _likely_evaluations(len(prior.seeds), len(units)), self.cache, self.stage,
                    rewritten=self.rewritten, start_seconds=self.worker_start_seconds)
            if workers is None:
                ev.emulator.ensure(prefetch)
        self.stage(f"searching {len(units)} candidate units of {len(g.candidates())} nodes "
                   f"({len(prior.seeds)} suspects)")
        as_nodes = self.as_nodes
        check = (workers.for_units(as_nodes) if workers is not None
                 else lambda us: ev.check(as_nodes(us)))
        score = lambda us: ev.scores.get(as_nodes(us))  # noqa: E731
        search = _certified_search(
            ctx, search_opts.max_evaluations, self.opts.sample.search_samples, ev, self.stage,
            as_nodes,
            lambda budget: find_minimal_fp32(list(units), check,
                                             [*start, *self.as_units(prior.seeds)],
                                             self.as_units(prior.ranking), budget,
                                             _counting_nodes(self.progress, as_nodes),
                                             **cost.search_args(
                                                 self.pricing, search_opts.objective,
                                                 search_opts.budget, score),
                                             watch=watching(
                                                 lambda us: ev.pressures.get(as_nodes(us)),
                                                 SPREAD_SHARE)))
        summary = parallel_batch.summary(workers, search, ev)
        cost.score_trials(search, self.pricing, score,
                          lambda us: ev.why.get(as_nodes(us), "failed"))
        over = cost.within_budget(search, self.pricing, self.opts.search.budget)
        return (over if over is not None else search), summary

    def judge(self, search: SearchResult, ev: Evaluator, summary: WorkersRecord | None,
              spent: tuple[int, int] = (0, 0)) -> Searched:
        """The search's plan as its findings (not yet judged as a file). `spent`:
        evaluations and inferences of earlier searches of this run."""
        ctx, judged, opts = self.ctx, self.rewrite_judgements, self.opts
        plan = self.as_nodes(search.fp32)
        found = list(search.fp32) if search.found else []
        return Searched(
            search_verdict(search, bool(plan) or self.rewritten),
            fp32_nodes=[n for n in ctx.judged.names if n in plan] if search.found else [],
            evaluations=search.evaluations + judged + spent[0],
            inferences=ev.runs + judged * len(ctx.samples) + spent[1],
            errors_before=worst_of(self.before, _numbers(ctx, self.before)),
            one_minimal=search.one_minimal and search.found, search=search,
            stats=self.stats, prior_seeds=self.prior.seeds,
            # what precision.json says of the search: its layers, its price, the criterion,
            # the all-FP16 verdict, the samples it judged and the workers it ran on
            fp32_layers=found, workers=summary,
            cost=self.pricing.record(found, opts.search.objective, opts.search.budget,
                                     ctx.rules.precision.name),
            criteria_record=CriteriaRecord(opts.judge.criteria.to_json(),
                                           opts.judge.criteria.describe()),
            # search_samples: the user's numbers (held-out ones not among them)
            judged=JudgedRecord.of(
                opts.judge.criteria.verdict(self.before),
                None if ctx.subset is None else [ctx.kept[i] if ctx.kept else i
                                                 for i in ctx.subset]),
            rewrites=self.outcome.record() if self.outcome is not None else None,
            rewritten_model=graph_model(ctx.graph) if self.rewritten else None)

    def written(self, searched: Searched, ev: Evaluator, out_dir: Path | None,
                judged: Judged | None = None,
                noise: Mapping[str, float] | None = None) -> WrittenFindings:
        """The searched plan's file written and judged (stages/written.py), with what the
        search says of it: its proposal, the rewrites, the search's own noise."""
        self.stage("judging the written plan")
        return judge_written_plan(searched.proposed, searched.rewritten_model is not None,
                                  searched.search.noisy, self.ctx, self.opts.judge, ev,
                                  self.as_nodes(searched.search.fp32), out_dir, judged, noise)

    def aim(self, searched: Searched, written: WrittenFindings | None, ev: Evaluator,
            out_dir: Path | None, layerwise: Layerwise) -> Aimed:
        """While the written plan passes by less than the spread of what the tools compute,
        search again inside the bound (stages/spread.py), up to AIM_ROUNDS times; a nearer plan
        replaces the findings once its written file passes. Each round's verdicts are journaled
        under its own bound (`aimed_scope`): a resumed run replays them, and never as a verdict
        under another bound. Returns the findings settled on and the evaluator still open."""
        # the aimed rounds together get a share of what the first search took, never more
        aiming = _Aiming(searched, written, ev, self.opts.judge,
                         aim_allowance(searched.evaluations))
        for aim_round in range(1, AIM_ROUNDS + 1):
            if not self._aim_round(aiming, aim_round, out_dir, layerwise):
                break
        else:  # every round ran: none left for a plan still without the margin
            if aiming.cert is not None and not aiming.cert.certified and not aiming.decided:
                aiming.decided = (f"after {AIM_ROUNDS} aimed rounds no plan passes by more "
                                  "than the spread")
        cert = aiming.cert
        return Aimed(aiming.searched, aiming.written, aiming.aims,
                     None if cert is None else replace(
                         cert.record(), aim_rounds=len(aiming.aims), decided=aiming.decided),
                     aiming.ev)

    def _aim_at(self, aiming: _Aiming) -> tuple[Tolerance | None, int]:
        """The tolerance the next aimed round searches under and the evaluations it may take;
        None when no round is due (certified, or no passing plan) or when the certificate
        decides `fragile` at once (`aiming.decided` says why: the spread is as large as the
        effect, no bound to aim inside, the allowance spent)."""
        cert = aiming.cert
        # the allowance pays for the validation too: of the files written so far (the first
        # plan's and each round's that passed; held-out samples: the all-FP16 file's as well,
        # every file of the run's is judged on them) and of the plan this round would write
        held = self.ctx.validation
        validated = 1 + sum(1 for a in aiming.aims if a.found) + (
            held is not None and held.kind == "held_out")
        left = aiming.allowance - sum(a.evaluations for a in aiming.aims) - math.ceil(
            validation_evaluations(self.ctx) * (validated + 1))
        if cert is None or cert.certified or aiming.verdict not in ("fixed", "fp16_ok"):
            return None, left
        hopeless = cert.hopeless()
        if hopeless:  # the noise is as large as the effect: decide, don't chase
            aiming.decided = hopeless
            self.stage(f"fragile at once: {hopeless}")
            return None, left
        tol = cert.aim(aiming.judge.tolerance)
        if tol is None:
            aiming.decided = ("no output's bound can be aimed inside: what fails is a "
                              "variation's verdict under a criterion with no bound")
            return None, left
        if left <= 0:
            aiming.decided = (f"the aimed searches used their allowance of {aiming.allowance} "
                              "evaluations (the validation of each written plan counted) "
                              "without a plan clear of the spread")
            return None, left
        return tol, left

    def _aim_round(self, aiming: _Aiming, aim_round: int, out_dir: Path | None,
                   layerwise: Layerwise) -> bool:
        """One aimed round and its decisions: before its search (`_aim_at`: none due, or
        `fragile` at once) and after it (no plan; the nearer plan's file fails; the spread grew
        with it), each said in `aiming.decided`. Updates `aiming` (a nearer plan whose file passes
        replaces the findings); returns whether another round may follow."""
        opts, ctx, searched, cert = self.opts, self.ctx, aiming.searched, aiming.cert
        tol, left = self._aim_at(aiming)
        if tol is None or cert is None:
            return False
        most = opts.search.max_evaluations
        judge = aiming.judge = aimed(opts.judge, tol)
        search_opts = replace(opts.search,
                              max_evaluations=left if most is None else min(left, most))
        self.stage(f"the plan passes by less than the spread of what the tools compute on "
                   f"{'; '.join(cert.uncertified)}: searching again inside the bound")
        if not self.stats:  # FP16 passed at first: the prior needs the layer-wise pass now
            aiming.ev.close()  # its session's memory back before the layer-wise pass
            self.stats = layerwise(ctx)
            self.prior = build_prior(ctx.judged, self.stats, self.constants,
                                     ctx.rules.precision)
        judged = self.rewrite_judgements
        spent = (searched.evaluations - judged,
                 searched.inferences - judged * len(ctx.samples))
        ev = aiming.ev = aiming.ev.retarget(judge, self.stats, aimed_scope(judge))
        # what the last round learned: its plan first (grown from, not searched anew);
        # plans that failed a looser bound fail this one too (Evaluator.retarget)
        again, summary = self.search(ev, judge, search_opts, False, False,
                                     start=list(searched.fp32_layers))
        carried = {p for p, ok in ev.known.items() if not ok}
        aiming.aims.append(AimedSearch(
            aim_round, tol.to_json()["ceiling"], again.found, len(again.fp32), again.evaluations,
            # of which known to fail from the looser bound: judged by nothing
            known_failing=sum(self.as_nodes(t.fp32) in carried for t in again.trials)))
        if not again.found:
            aiming.decided = (f"the aimed search used its allowance of {left} evaluations "
                              "without a plan" if again.stopped_early else
                              "no plan passes inside the aimed bound")
            aiming.searched = _count_unkept(searched, again, ev)
            return False
        if aiming.written is not None and aiming.written.staged:
            # the next judge empties the staging folder: rewritten on writing
            aiming.written = replace(aiming.written, staged=[])
        nearer = self.judge(again, ev, summary, spent)
        nearer_written = self.written(nearer, ev, out_dir, noise=cert.noise)  # FP32's: once
        if not nearer_written.mixed_model_passed:
            aiming.searched = _count_unkept(searched, again, ev)
            aiming.decided = "the aimed plan's written file fails its own judge"
            return False
        nearer_cert = nearer_written.cert
        growing = nearer_cert is not None and cert.spread_grew(nearer_cert)
        aiming.searched, aiming.written = nearer, nearer_written
        aiming.decided = None if nearer_cert is None else nearer_cert.decided
        if growing and nearer_cert is not None and not nearer_cert.certified:  # chasing noise
            aiming.decided = ("the spread grew with the aimed plan: each nearer plan moves "
                              "what the tools compute as much as it gains")
            return False
        return True


@dataclass(frozen=True)
class Searched:
    """What a search found (`SearchStage.judge`), before its plan's file is judged: the
    search's proposal for the verdict (result.search_verdict), the plan in nodes, its counts
    and what precision.json records of the search. The run's result is assembled from it
    (stages/assembly.assemble)."""

    proposed: VerdictName
    fp32_nodes: list[str]
    evaluations: int
    inferences: int
    errors_before: dict[str, OutputError]  # all-FP16's worst, over the samples searched
    one_minimal: bool
    search: SearchResult
    stats: dict[str, TensorStats]
    prior_seeds: list[str]
    fp32_layers: list[str]  # the search's units
    workers: WorkersRecord | None  # stages/batch.summary
    cost: CostRecord
    criteria_record: CriteriaRecord
    judged: JudgedRecord  # all-FP16's verdict by the criteria and the samples searched
    rewrites: RewritesRecord | None  # --rewrite's, when it ran
    rewritten_model: Written | None = field(default=None, repr=False)  # a rewrite applied


@dataclass(frozen=True)
class Aimed:
    """What the aimed rounds settled on (`SearchStage.aim`): the search and its written file
    kept (the first ones, or a nearer plan's), each round, the kept file's certificate as the
    run records it (the rounds before it and why no further one ran, `decided`), and the
    evaluator still open."""

    searched: Searched
    written: WrittenFindings | None
    aims: list[AimedSearch]
    certificate: CertificateRecord | None  # None: no file judged, or one that fails
    ev: Evaluator

    @property
    def cert(self) -> Certificate | None:
        """The kept file's certificate as measured (stages/spread.py)."""
        return self.written.cert if self.written is not None else None


@dataclass
class _Aiming:
    """What the aimed rounds of a run carry from one to the next (`SearchStage.aim`)."""

    searched: Searched
    written: WrittenFindings | None
    ev: Evaluator
    judge: JudgeOptions  # the last round's judge options (the run's before the first)
    allowance: int  # evaluations all rounds may take together
    aims: list[AimedSearch] = field(default_factory=list)
    # why no (further) aimed round runs for the kept file's certificate (None: not decided;
    # its own words when the search stopped on its noise: stages/written.certify_written)
    decided: str | None = None

    def __post_init__(self) -> None:
        if self.cert is not None:
            self.decided = self.cert.decided

    @property
    def cert(self) -> Certificate | None:
        return self.written.cert if self.written is not None else None

    @property
    def verdict(self) -> VerdictName:
        """What the search's proposal is once its file is judged (judge/verdict.decide)."""
        return Findings(self.searched.proposed, file_passed=None if self.written is None
                        else self.written.passed).verdict()


def _count_unkept(searched: Searched, again: SearchResult, ev: Evaluator) -> Searched:
    """An aimed round whose plan is not kept still cost its evaluations and inferences: the
    run's counts say them (a kept plan's findings count them as `spent`)."""
    return replace(searched, evaluations=searched.evaluations + again.evaluations,
                   inferences=searched.inferences + ev.runs)


def _numbers(ctx: Context, judged: Sequence[Judgement]) -> list[int] | None:
    """The user's sample numbers of the search's judgements (None: not the search's)."""
    numbers = ctx.sample_numbers()
    several = len(ctx.given_sample or ()) > 1  # one sample: no number to say
    return numbers if several and len(numbers) == len(judged) else None


def aim_allowance(first: int) -> int:
    """Evaluations all aimed searches of a run and the validation of each plan they write may
    take together: AIM_SHARE of the first search's (rounded down: never more), at least
    AIM_FLOOR (a certificate costs a fraction of the search)."""
    return max(AIM_FLOOR, math.floor(AIM_SHARE * first))


def validation_evaluations(ctx: Context) -> float:
    """What validating one written plan costs, in evaluations (an evaluation judges a plan
    once on each sample the search judges on): its validation samples' inferences."""
    held = ctx.validation
    if held is None or held.kind == "none":
        return 0.0
    return len(held.samples) / max(len(ctx.samples), 1)


def aimed_scope(judge: JudgeOptions) -> str:
    """An aimed search's verdicts in the run's journal: the digest of every judge setting they
    were judged under (the capped tolerance above all), so a round's record is replayed only
    under that very bound, and an earlier round's never under a later, tighter one."""
    return "aim:" + judge.settings.digest()


def _certified_search(ctx: Context, most: int | None, search_samples: int, ev: Evaluator,
                      stage: Callable[[str], None], as_nodes: Callable,
                      search: Callable[[int | None], SearchResult]) -> SearchResult:
    """`search(budget)` on the search's samples, `most` evaluations in all (--max-evals);
    when they are a subset (judge/subset.py, of `search_samples`: --search-samples),
    the plan found is judged on every sample, and the samples it fails join the subset for
    another search, until it passes everywhere. Evaluations and trials add up over rounds."""
    evaluations, trials, rounds, speculative = 0, [], 0, 0
    while True:
        left = None if most is None else max(most - evaluations, 0)
        result = search(left)
        trials += [replace(t, index=t.index + evaluations) for t in result.trials]
        evaluations += result.evaluations
        rounds, speculative = rounds + result.rounds, speculative + result.speculative
        if not result.found or ctx.subset is None:
            break
        passed, judged, _ = ev.measure(as_nodes(result.fp32), full=True)
        evaluations, rounds = evaluations + 1, rounds + 1
        wider = subset.widen(ctx.subset, judged, search_samples)
        if passed or len(wider) == len(ctx.subset):
            break
        stage(f"the plan fails {sum(not j.passed for j in judged)} of {len(judged)} samples: "
              f"searching again on {len(wider)} samples")
        ctx.narrow(wider)
        ev.widened()
    result.evaluations, result.trials = evaluations, trials
    result.rounds, result.speculative = rounds, speculative
    return result


def _counting_nodes(progress: Progress | None,
                    as_nodes: Callable[[Sequence[str]], frozenset[str]]) -> Progress | None:
    """The search's progress with each trial's plan in nodes, as the verdict counts them (a
    search unit is a whole TensorRT layer, often several nodes)."""
    if progress is None:
        return None
    return lambda trial, remaining: progress(
        replace(trial, fp32=tuple(sorted(as_nodes(trial.fp32)))), remaining)


def _likely_evaluations(suspects: int, units: int) -> int:
    """About what a search costs (the default --workers asks whether workers pay off): a
    removal per suspect and a bisection or two along the ranking."""
    return 4 + 2 * suspects + 2 * math.ceil(math.log2(units + 1))


PREFETCH_WEIGHT_BYTES = 1 << 20  # a switchable node holds its weights twice (FP16 and FP32)


def prefetch_nodes(g: Graph, seeds: Sequence[str], ranking: Sequence[str],
                   neighbours: Callable[[str], Iterable[str]] = lambda n: ()) -> list[str]:
    """The first active set: the seeds and the top of the ranking, and the nodes next to them
    (the swap certificate tries a neighbouring unit in a unit's place: without them, each swap
    rebuilt the session, 11 s a time on a 20k-node model), bar nodes with big weights
    (switching one keeps both its FP16 and FP32 weights, and materialises the chosen one on
    every run); a plan that needs such a node rebuilds the session around it."""
    def light(n: str) -> bool:
        return all(g.weights.nbytes(t) <= PREFETCH_WEIGHT_BYTES for t in g.node(n).input
                   if t in g.initializers)
    top = [n for n in ranking[:max(16, 2 * len(seeds))] if n in seeds or light(n)]
    near = [m for n in top for m in neighbours(n) if light(m)]
    return list(dict.fromkeys([*top, *near]))


def _neighbours(units: Mapping[str, Sequence[str]], unit_of: Mapping[str, str],
                adjacent: Mapping[str, Sequence[str]]) -> Callable[[str], list[str]]:
    """Node -> the nodes of the units adjacent to its unit (cost.py's swap neighbourhood)."""
    def near(n: str) -> list[str]:
        u = unit_of.get(n)
        return [m for v in adjacent.get(u, ()) for m in units[v]] if u is not None else []
    return near
