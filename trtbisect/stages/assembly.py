"""After the search: what the written plan's findings decide (`settle`), why each node of
the plan and what else the run was asked to say of it (`explain_run`), and the run's result
built once from every stage's record (`assemble`), its verdict decided there over all the
findings (judge/verdict.decide). pipeline.run calls them in that order."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from ..backends.ort import Reference
from ..context import Context, JudgeOptions, Options
from ..diagnosis import advice
from ..diagnosis.diagnose import (
    Culprit,
    CulpritGroup,
    diagnose_plan,
    explain,
    note_fused,
    note_semantics,
    noted_culprits,
    relax_for,
)
from ..judge import semantics
from ..judge.compare import OutputError, TensorStats
from ..judge.hints import Hint, criterion_hints
from ..judge.verdict import Findings, VerdictName
from ..result import RunResult, StabilityRecord
from ..search.prior import ConstantStats
from . import coverage
from .evaluator import Evaluator
from .layerwise import layerwise
from .search import Aimed, Searched
from .strict import Strict, absorbed_nodes, compare_with_strict, semantics_notes
from .written import margins

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settled:
    """What the written plan's findings decide (`settle`), before the graph's coverage: the
    diagnosis and what follows it read the verdict so far."""

    findings: Findings  # the search's proposal, the written file, its certificate, validation
    verdict: VerdictName  # what they decide (judge/verdict.decide)
    errors_before: dict[str, OutputError]  # all-FP16's, as the run reports them
    one_minimal: bool  # the plan is still called one-minimal
    criterion_hints: list[Hint] | None  # criteria that may fit better (judge/hints.py)


def settle(aimed: Aimed, ctx: Context, judge: JudgeOptions) -> Settled:
    """The verdict the written plan's certificate allows (stages/spread.py: `fragile` where
    no plan has the margin) and its validation, said; and the criteria that may fit better
    (judge/hints.py)."""
    searched, written, cert = aimed.searched, aimed.written, aimed.cert
    validation = written.validation if written is not None else None
    judged = Findings(searched.proposed,
                      file_passed=None if written is None else written.passed)
    findings = replace(judged, certified=None if cert is None else cert.certified,
                       validated=validation.passed if validation else None)
    was, verdict = judged.verdict(), findings.verdict()
    if verdict == "fragile" and was != verdict:
        assert cert is not None
        if cert.search_noise is not None:
            log.warning("the criterion cannot tell plans apart near its bound on %s (fragile): "
                        "the best passing plan so far is written, but not called fixed",
                        cert.search_noise.output)
        else:
            log.warning("the plan passes by less than the spread of what the tools compute on "
                        "%s (fragile): it is written, but not called fixed",
                        "; ".join(cert.uncertified))
    elif verdict == "unvalidated" and was != verdict:
        log.warning("the plan passes the samples it was searched on but fails %s "
                    "(unvalidated): it is written, but not called fixed",
                    validation.described if validation else None)
    before = searched.errors_before
    if written is not None and written.errors_before is not None:
        before = written.errors_before
    hints = None
    if judge.criteria.default and verdict not in ("fp16_ok", "reference_invalid"):
        # the default criterion may not be what the user means
        hints = criterion_hints(before, ctx.every_reference[0], judge.tolerance) or None
    return Settled(findings, verdict, before, searched.one_minimal and verdict == was and (
        written is None or written.keeps_minimal), hints)


def assemble(aimed: Aimed, settled: Settled, explained: Explained, record: dict,
              base: dict) -> RunResult:
    """The run's result, built once from what each stage found: the search (`aimed.searched`,
    the first one's or an aimed round's), its written file and certificate, the verdict so
    far (`settled`), the diagnosis and what follows it (`explained`). The verdict is decided
    here over all the findings (judge/verdict.decide), the graph's coverage last: never "FP16
    is fine" for a graph not wholly judged (`partial`)."""
    searched, written, cert, strict = aimed.searched, aimed.written, aimed.cert, explained.strict
    unjudged = record["coverage"].unjudged
    findings = replace(settled.findings, covered=not unjudged)
    verdict = findings.verdict()
    judged = searched.judged
    if written is not None and written.after is not None:
        judged = judged.with_after(written.after)
    return RunResult(
        verdict, fp32_nodes=searched.fp32_nodes, evaluations=searched.evaluations,
        inferences=searched.inferences, errors_before=settled.errors_before,
        errors_after=searched.errors_before if written is None else written.checked,
        culprits=explained.culprits, one_minimal=settled.one_minimal, search=searched.search,
        stats=searched.stats, prior_seeds=searched.prior_seeds, verdict_findings=findings,
        mixed_check=None if written is None else written.checked,
        rewritten_model=searched.rewritten_model,
        staged=[] if written is None else list(written.staged),
        emulated_mixed=None if written is None else written.emulated,
        layerwise_plan=explained.layerwise_plan, fp32_layers=searched.fp32_layers,
        workers=searched.workers, cost=searched.cost, criteria_record=searched.criteria_record,
        judged=judged, rewrites=searched.rewrites,
        one_judge=None if written is None else written.one_judge,
        certificate=aimed.certificate,
        # None: no file judged; {} and False: a file that fails (nothing to certify)
        margins=None if written is None else {} if cert is None else margins(cert),
        fragile=None if written is None else cert is not None and not cert.certified,
        aimed_searches=aimed.aims or None,
        validation=None if written is None else written.validation,
        criterion_hints=settled.criterion_hints, culprit_groups=explained.groups,
        errors_before_strict=None if strict is None else strict.errors_before,
        strict_only_culprits=None if strict is None else strict.only_culprits,
        stability=explained.stability,
        partial=coverage.partial_of(settled.verdict, verdict, unjudged), **record, **base)


@dataclass(frozen=True)
class Explained:
    """What `explain_run` found: why each node, the culprit groups, what per-node rounding says
    beside TensorRT's, and what the report and --stability asked for."""

    culprits: list[Culprit]
    groups: list[CulpritGroup]
    strict: Strict | None  # stages/strict.compare_with_strict, where it ran
    layerwise_plan: dict[str, TensorStats] | None  # the plan's layer-wise pass (the report's)
    stability: StabilityRecord | None


def explain_run(searched: Searched, settled: Settled, ctx: Context, opts: Options,
             ev: Evaluator, constants: Mapping[str, ConstantStats],
             units: Mapping[str, Sequence[str]], unit_of: Mapping[str, str],
             stage: Callable[[str], None],
             on_layerwise: Callable[[int, int], None] | None) -> Explained:
    """After the written plan's verdict (`settled`): why each node, the culprit groups, what
    per-node rounding says beside TensorRT's, and what the report and --stability ask for.
    (The whole options: it reads every group, the samples' seed for --stability's jitter.)"""
    g, low, stats = ctx.judged, ctx.rules.precision, searched.stats
    assert ctx.prepared is not None  # prepare(search=True) made it
    nodes, verdict = searched.fp32_nodes, settled.verdict
    plan = frozenset(nodes)
    culprits = explain(g, nodes, stats, constants, semantics.fused_layer_names(ctx.prepared),
                       low)
    named = nodes or (searched.prior_seeds if verdict == "no_plan" else [])
    culprits, groups = diagnose_plan(g, named, culprits, stats, constants, verdict == "fixed",
                                     relax_for(opts.judge.criteria, settled.errors_before,
                                               opts.judge.tolerance, low), low)
    culprits = note_fused(culprits, units, unit_of)
    # does --rewrite do the fixes it names?
    groups = advice.advise(groups, searched.rewrites, ctx, stats)
    # compare with per-node rounding where it can differ: culprits, or nodes TensorRT folds
    strict, notes, new_group = None, {}, False
    if opts.judge.semantics == "trt" and (nodes or opts.output.report or absorbed_nodes(ctx)):
        stage("all-FP16 under strict per-node rounding, for comparison")
        strict = compare_with_strict(plan, verdict, ctx, opts.judge)
        notes, new_group = strict.notes, True
    elif verdict != "reference_invalid":
        notes, new_group = semantics_notes(nodes, g), False
    groups = note_semantics(groups, notes, new_group)
    culprits = noted_culprits(culprits, notes)
    layerwise_plan = None
    if opts.output.report and verdict == "fixed" and nodes:
        stage("layer-wise comparison with the plan applied (for the report)")
        layerwise_plan = layerwise(ctx, opts.judge, opts.search, on_layerwise, plan)
    stability = None
    if verdict in ("fixed", "fp16_ok") and opts.search.stability >= 2:
        stage(f"stability: {opts.search.stability} runs per sample")
        stability = stability_of(ctx, opts.judge, ev, plan, opts.search.stability,
                                 opts.sample.seed).record()
    return Explained(culprits, groups, strict, layerwise_plan, stability)


def stability_of(ctx: Context, judge: JudgeOptions, ev: Evaluator, plan: frozenset[str],
                 runs: int, seed: int):
    """The noise floor of the error around the final and the all-FP16 plan (stability.py):
    `runs` jittered copies per sample (--stability), drawn from `seed` + 1."""
    from .stability import measure_stability

    plans = {"plan": plan, "all_fp16": frozenset()} if plan else {"all_fp16": frozenset()}
    ref = Reference(ctx.graph, judge.threads)
    try:
        return measure_stability(ref.run, ev.emulator.run, plans, ctx.samples, judge.tolerance,
                                 runs, seed=seed + 1, judge=lambda r, g, s: judge.criteria.judge(
                                     r, g, s, judge.tolerance))
    finally:
        ref.close()  # its session: the FP32 copy of the model's weights
