"""`trtbisect run`, `compare` and `check` as library calls: load, reference, layer-wise
comparison, prior, search, verify, write. The CLI only parses, calls and formats."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from . import __version__
from .backends.ort import Emulator, Reference, VariantReferences, run_seconds
from .context import (
    Context,
    JudgeOptions,
    Options,
    OutputOptions,
    SearchOptions,
    prepare,
    reference_problems,
    run_fingerprint,
)
from .diagnosis.diagnose import (
    group_culprits,
)
from .errors import EXIT_REFERENCE_INVALID, EXIT_REFERENCE_UNSTABLE, TrtBisectError
from .graph import Graph
from .judge import degenerate, semantics, subset
from .judge.compare import OutputError, TensorStats
from .judge.criteria import Judgement, Verdict
from .judge.precision import Precision
from .judge.precision import precision as low_precision
from .judge.verdict import TensorRT
from .outputs.outdir import OutputDir
from .reports.report import write_report
from .reports.write import write_outputs
from .result import RunResult
from .rewrites.driver import REWRITE_WEIGHT_LIMIT
from .search import cost
from .search.journal import Journal
from .search.minimal import Progress
from .search.prior import ConstantStats, build_prior, constant_stats
from .stages import assembly, coverage
from .stages.evaluator import Evaluator
from .stages.layerwise import cached_layerwise, layerwise, layerwise_batches, summarize_layerwise
from .stages.search import SearchStage, prefetch_nodes
from .stages.written import (
    CheckResult,
    Judged,
    judge_mixed,
    worst_of,
    write_and_judge,
)

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- evaluation


def _shape_probe(ctx: Context, judge: JudgeOptions, graph: Graph | None = None) -> cost.Probe:
    """Shapes that shape inference leaves open, as one FP32 inference of the first sample
    produces them (a batch of tensors at a time), on `graph` (default: the judged one)."""
    def probe(names: Sequence[str]) -> dict[str, tuple[int, ...]]:
        ref, out = Reference(graph or ctx.judged, judge.threads), {}
        for k in range(0, len(names), 512):
            out.update({t: tuple(a.shape) for t, a in
                        ref.run_tensors(ctx.samples[0], names[k:k + 512]).items()})
        ref.close()
        return out
    return probe


# ---------------------------------------------------------------- run


def run(model_path: str | Path, opts: Options, out_dir: Path | None = None,
        progress: Progress | None = None, on_stage: Callable[[str], None] | None = None,
        on_layerwise: Callable[[int, int], None] | None = None) -> RunResult:
    """The whole job: find the minimal FP32 set and write every rendering of it to `out_dir`."""
    children: list[VariantReferences] = []  # what runs beside the stages: ended on every way out
    try:
        return _run(model_path, opts, out_dir, progress, on_stage, on_layerwise, children)
    finally:
        for child in children:
            child.close()


def _run(model_path: str | Path, opts: Options, out_dir: Path | None,
         progress: Progress | None, on_stage: Callable[[str], None] | None,
         on_layerwise: Callable[[int, int], None] | None,
         children: list[VariantReferences]) -> RunResult:
    """`run`'s body (the whole Options: it hands each stage its groups); `children`: what it
    starts beside the stages, for `run` to end."""
    started = time.perf_counter()
    marks: list[tuple[str, float]] = []  # each stage and when it began: result.stages

    def stage(msg: str) -> None:
        marks.append((msg, time.perf_counter()))
        (on_stage or log.info)(msg)
    ctx, cache = _load(model_path, opts, out_dir, stage)
    loaded = time.perf_counter() - started  # what a worker's start repeats (stages/batch.py)
    layers = cache if opts.output.resume else None  # where the layer-wise pass is reused
    base, record = _records(model_path, ctx, opts.judge)
    unjudgeable = _unjudgeable(ctx, record, base, opts.judge.threads)
    if unjudgeable is not None:
        return _finish(unjudgeable, ctx, out_dir, started, opts.output.report, marks)
    # the samples the written plan is validated on, never searched (judge/validation.py)
    ctx.hold_out(opts.sample.validation_share, opts.sample.seed, opts.judge.threads)
    # what the certificate and the validation compute of FP32 is the same for every plan: on
    # a big graph a child computes it from now on, beside the stages (backends/ort.py)
    held = ctx.validation
    others = held.samples if held is not None and held.references is None else None
    early = VariantReferences.start(ctx.graph, ctx.every_sample, opts.judge.threads, others)
    ctx.variant_references = early
    children.append(early)
    if held is not None and others is not None and held.reference is not None:
        held.reference = _early_first(early, held.reference)
    stats: dict[str, TensorStats] = {}
    fingerprint = _fingerprint(ctx, opts.judge, opts.search)
    # range facts of every weight, as the judge converts them: one pass over the weights
    constants = constant_stats(ctx.judged, ctx.rules.weight_rule, ctx.rules.precision)
    if opts.judge.strict:  # the watch list needs to know which tensors FP32 keeps finite
        stage("layer-wise comparison, FP32 vs FP16")
        stats = cached_layerwise(ctx, opts.judge, opts.search, layers, fingerprint, on_layerwise)
    journal = _journal(out_dir, opts.output, fingerprint)
    ev = Evaluator(ctx, opts.judge, stats, journal)
    stage("all-FP16 evaluation")
    half = _all_fp16(ctx, opts.judge, opts.search, ev, stats, constants, out_dir,
                     subset.wanted(len(ctx.every_sample), opts.sample.search_samples,
                                   opts.judge.criteria.pass_rate))
    if half.narrow and not half.passed:  # judge/subset.py: search on the worst, certify on all
        ctx.narrow(subset.choose(half.before, opts.sample.search_samples))
        stage(f"the search judges on {len(ctx.samples)} of {len(ctx.every_sample)} samples "
              "(where all-FP16 fails worst); the plan is certified on all of them")
    # FP16 passing needs no layer-wise pass
    if (not half.passed or opts.output.report) and not stats:
        stage("layer-wise comparison, FP32 vs FP16")
        ev.close()  # memory: reopened for the search, on the active set
        stats = cached_layerwise(ctx, opts.judge, opts.search, layers, fingerprint, on_layerwise,
                                 half.fp16_first, half.batches)
    half.fp16_first = []  # memory: the FP16 side is only statistics now
    outcome = None
    if opts.search.rewrite and not half.passed:
        stage("trying FP16-safe rewrites")
        outcome, ctx, constants, ev = _rewrite(ctx, opts.judge, stats, constants, half, base,
                                               ev, journal)
    st = SearchStage.of(ctx, opts, stats, constants, lambda pg: _shape_probe(ctx, opts.judge, pg),
                        before=half.before, record=record, base=base,
                        half_seconds=half.seconds, worker_start_seconds=loaded + half.building,
                        stage=stage, progress=progress, cache=cache,
                        outcome=outcome, journal=journal)
    search, summary = st.search(ev, opts.judge, opts.search, half.passed, True)
    searched = st.judge(search, ev, summary)
    written = st.written(searched, ev, out_dir, half.first) if search.found else None
    aimed = st.aim(searched, written, ev, out_dir, lambda c: cached_layerwise(
        c, opts.judge, opts.search, layers, fingerprint, on_layerwise))
    if journal is not None:  # the aimed searches journal theirs too
        journal.close()
    aimed.ev.close()  # the workers, if the written plan's judge did not stop them already
    settled = assembly.settle(aimed, ctx, opts.judge)
    explained = assembly.explain_run(aimed.searched, settled, ctx, opts, aimed.ev, constants,
                                     st.units, st.unit_of, stage, on_layerwise)
    return _finish(assembly.assemble(aimed, settled, explained, record, base), ctx, out_dir,
                   started, opts.output.report, marks)


def _early_first(early: VariantReferences,
                 reference: Callable[[Sequence[Any]], list[dict[str, np.ndarray]]]
                 ) -> Callable[[Sequence[Any]], list[dict[str, np.ndarray]]]:
    """The validation samples' references: the early child's, else made as before."""
    def made(samples: Sequence[Any]) -> list[dict[str, np.ndarray]]:
        got = early.of_others(samples)
        return got if got is not None else reference(samples)
    return made


def _load(model_path: str | Path, opts: Options, out_dir: Path | None,
          stage: Callable[[str], None]) -> tuple[Context, Path | None]:
    """The model with its samples and FP32 reference, and the output folder's cache; what
    the folder or the memory cannot take is refused first, not after the search. (The whole
    options: `prepare` takes them, and the checks read every group.)"""
    if opts.output.report:
        from .reports.report import require_matplotlib
        require_matplotlib()  # fail before the search, not after it
    stage("loading the model and running the FP32 reference")
    if out_dir is not None:  # refuse now, not after the search, what the folder cannot take
        given = opts.sample
        OutputDir(out_dir).preflight(Path(model_path).stem, [model_path, *given.inputs],
                                     0 if (given.inputs or given.data_loader) else given.samples,
                                     opts.output.report, opts.search.rewrite)
    cache = OutputDir(out_dir).cache() if out_dir is not None else None
    ctx = prepare(model_path, opts, cache=cache if opts.output.resume else None, spool=cache)
    assert ctx.prepared is not None
    if opts.search.stability >= 2:  # refused now, not after the search, if it cannot be held
        from .stages.stability import guard_memory
        guard_memory(ctx.every_sample, ctx.every_reference, opts.search.stability)
    return ctx, cache


def _records(model_path: str | Path, ctx: Context, judge: JudgeOptions
             ) -> tuple[dict[str, Any], dict]:
    """What every verdict records of the model (`base`) and of the judge (`record`); the
    nodes TensorRT's ONNX parser is known to refuse are warned of before any search."""
    g = ctx.judged
    assert ctx.prepared is not None
    base: dict[str, Any] = dict(model_path=str(model_path), model_sha256=ctx.sha256,
                model_data_sha256=ctx.data_sha256, candidates=len(g.candidates()),
                nodes=len(g.names), samples=len(ctx.every_sample), tolerance=judge.tolerance,
                strict=judge.strict, criteria=judge.criteria)
    low = ctx.rules.precision
    record: dict = {"semantics": semantics.record(ctx.prepared, judge.tf32, judge.accumulate, low),
              "precision": low,
              "coverage": coverage.record(g)}
    if ctx.graph.repairs:  # what trtbisect's copy changed (repair.py, docs/input_models.md)
        record["model_copy"] = list(ctx.graph.repairs)
    for c in coverage.trt_unsupported(g):  # before any search: the engine may not build at all
        log.warning("TensorRT's ONNX parser: %s x%d (%s): %s; %s", c.label, len(c.nodes),
                    ", ".join(c.nodes[:3]) + (", ..." if len(c.nodes) > 3 else ""), c.why, c.fix)
    return base, record


def _journal(out_dir: Path | None, output: OutputOptions, fingerprint: dict) -> Journal | None:
    """The run's journal of verdicts (none without an output folder; emptied by --no-resume)."""
    if out_dir is None:
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    journal_path = out_dir / "journal.jsonl"
    if not output.resume and journal_path.exists():
        journal_path.unlink()
    return Journal(journal_path, fingerprint)


@dataclass
class _AllFp16:
    """The all-FP16 verdict, and what its judge leaves for the stages after it."""

    passed: bool
    before: Sequence[Judgement]  # per sample judged
    narrow: bool  # the search judges on a subset of the samples (judge/subset.py)
    seconds: float  # the inference alone: what an evaluation costs once its session exists
    first: Judged | None = None  # the all-FP16 file's passing verdict: the answer as it is
    # per sample: the first layer-wise batch, FP16 (the written file's judge exposed it)
    fp16_first: list[dict[str, np.ndarray]] = field(default_factory=list)
    batches: list[list[str]] | None = None  # the layer-wise batches, once known
    building: float = 0.0  # the rest of the stage's wall time: mostly building its session


def _all_fp16(ctx: Context, judge: JudgeOptions, search: SearchOptions, ev: Evaluator,
              stats: Mapping[str, TensorStats], constants: Mapping[str, ConstantStats],
              out_dir: Path | None, narrow: bool) -> _AllFp16:
    """All-FP16 judged: on the emulator, or as its written file (which, when it passes, is
    the answer as it is); the evaluator learns the verdict. `narrow`: the search will judge
    on a subset of the samples (judge/subset.py)."""
    g, low = ctx.judged, ctx.rules.precision
    # what an evaluation costs once its session exists (the default --workers' estimate):
    # the inference alone; the all-FP16 stage's wall time is mostly building a session
    half_began, wall_began = run_seconds(), time.perf_counter()
    first: Judged | None = None
    fp16_first: list[dict[str, np.ndarray]] = []
    batches: list[list[str]] | None = None
    if judge.strict or ctx.graph.weights.total_bytes() > FILE_FIRST_WEIGHT_BYTES:
        # the non-finite watch runs on the emulator; and big weights: writing them in FP16
        # for a verdict that may fail costs more than the emulator session it saves
        if stats and not search.rewrite:  # the prior is known: one session, the search's
            early = build_prior(g, stats, constants, low)
            ev.emulator.ensure(prefetch_nodes(g, early.seeds, early.ranking))
        all_half, before, _ = ev.measure(frozenset())
    else:  # the all-FP16 file, written and judged: if it passes, it is the answer as it is
        # its judge also returns the FP16 side of the layer-wise pass's first batch, which a
        # failing verdict needs next (the same graph: it saves a session and an inference)
        batches = None if narrow else layerwise_batches(ctx, search)  # narrow: for the subset
        first = write_and_judge(ctx, judge, frozenset(), out_dir,
                                expose=batches[0] if batches else ())
        all_half, before = first.checked.passed, first.checked.judgements
        ev.runs += len(ctx.samples)
        fp16_first = first.checked.tensors
        first.checked.tensors = []
        if not all_half:
            first = None  # memory: the search writes and judges its own plan
    ran = run_seconds() - half_began
    half = _AllFp16(all_half, before, narrow, ran, first, fp16_first, batches,
                    max(0.0, time.perf_counter() - wall_began - ran))
    ev.judged_outside(frozenset(), all_half, before)
    return half


def _rewrite(ctx: Context, judge: JudgeOptions, stats: Mapping[str, TensorStats],
             constants: Mapping[str, ConstantStats], half: _AllFp16, base: dict,
             ev: Evaluator, journal: Journal | None):
    """--rewrite: verified FP16-safe rewrites before any FP32 fallback. Where one is applied
    the run goes on with the rewritten model: its context, weights' ranges and evaluator (and
    `half` and `base` say so). Returns the outcome, the context, the ranges, the evaluator."""
    g, low = ctx.judged, ctx.rules.precision
    suspects = build_prior(ctx.graph, stats, constants if g is ctx.graph else
                           constant_stats(ctx.graph, ctx.rules.weight_rule, low), low).seeds
    outcome, judged_ctx = _try_rewrites(ctx, judge, stats, suspects,
                                        (half.passed, worst_of(half.before)))
    if outcome is not None and outcome.applied:
        ctx = judged_ctx or _rewritten_context(ctx, outcome.model, judge)
        g = ctx.judged
        constants = constant_stats(g, ctx.rules.weight_rule, low)  # the rewritten weights
        base.update(candidates=len(g.candidates()), nodes=len(g.names))
        ev = Evaluator(ctx, judge, stats, journal)
        half.passed = outcome.passed
        ev.known[frozenset()] = half.passed
    return outcome, ctx, constants, ev


def _unjudgeable(ctx: Context, record: dict, base: dict,
                 threads: int | None = None) -> RunResult | None:
    """The verdicts given before any judgement: an FP32 reference that is already broken or
    that two runs do not reproduce (random ops), or a model whose computation FP16 cannot
    change."""
    problems = reference_problems(ctx)
    if problems:
        return RunResult("reference_invalid", fp32_nodes=[], evaluations=0, inferences=0,
                         errors_before={}, errors_after={}, reference_problems=problems,
                         **record, **base)
    from .stages.reproducible import unstable
    moving = unstable(ctx.graph, ctx.every_sample[0], threads)
    if moving:
        return RunResult("reference_unstable", fp32_nodes=[], evaluations=0, inferences=0,
                         errors_before={}, errors_after={}, reference_problems=moving,
                         **record, **base)
    nothing = degenerate.nothing_to_judge(ctx.judged)
    if nothing:  # FP16 cannot change what this model computes: a verdict of its own
        return RunResult(degenerate.NOTHING_TO_JUDGE, fp32_nodes=[], evaluations=0,
                         inferences=0, errors_before={}, errors_after={},
                         nothing_to_judge=nothing, **record, **base)
    return None


# Weights up to this size: the all-FP16 verdict is judged on its written file first (an
# FP16-fine verdict then builds no search graph). Above it the emulator decides first: on a
# 2.5 GB model, writing and judging the all-FP16 file took 35 s, the emulator about 15 s.
FILE_FIRST_WEIGHT_BYTES = 256 << 20


def _try_rewrites(ctx: Context, judge: JudgeOptions, stats: Mapping[str, TensorStats],
                  suspects: Sequence[str] = (),
                  all_fp16: tuple[bool, dict[str, OutputError]] | None = None):
    """Verified rewrites (rewrites.py), each judged exactly like a plan: all-FP16 on the
    emulator, every sample, against the original model's FP32 reference. `all_fp16`: the
    model's own all-FP16 verdict and errors, when known. Returns the outcome and the context
    of its model (None: it is not one the judge prepared last)."""
    from .rewrites.driver import try_rewrites
    from .rewrites.rules import rewrites_for

    if ctx.graph.weights.total_bytes() > REWRITE_WEIGHT_LIMIT:
        log.warning("--rewrite skipped: the model's weights exceed %d MiB", REWRITE_WEIGHT_LIMIT >> 20)
        return None, None
    last: list[Context] = []  # the last candidate's context: the search's, if it is kept

    def judged(candidate: onnx.ModelProto) -> tuple[bool, dict[str, OutputError]]:
        # under the run's semantics, as the search will judge the rewritten model
        last[:] = [_rewritten_context(ctx, candidate, judge)]
        emu = Emulator(last[0].judged, judge.threads, rules=last[0].rules)
        verdict = judge.criteria.verdict([
            judge.criteria.judge(ref, emu.run(frozenset(), s), s, judge.tolerance)
            for s, ref in zip(ctx.samples, ctx.references)])
        emu.close()
        return verdict.passed, verdict.errors

    ranges = {t: s.fp32_absmax for t, s in stats.items()}
    # matches at the suspects go first, one connected group of them after another
    groups = [{"nodes": grp} for grp in group_culprits(ctx.graph, list(suspects))]
    outcome = try_rewrites(ctx.graph.materialize(), ctx.samples, judged, groups=groups,
                           rewrites=rewrites_for(ctx.rules.precision.narrow_range),
                           ranges=ranges, references=ctx.references, initial=all_fp16)
    kept = next((c for c in last if c.model is outcome.model), None)
    return outcome, kept


def _rewritten_context(ctx: Context, model: onnx.ModelProto, judge: JudgeOptions) -> Context:
    """The same samples and FP32 reference (the original model's: the truth), a new graph,
    prepared for the run's semantics like the original was."""
    graph = Graph(model)
    new = Context(ctx.path, model, graph, ctx.samples, ctx.references, ctx.sha256,
                  sources=ctx.sources, data_sha256=ctx.data_sha256,
                  every_sample=ctx.every_sample, every_reference=ctx.every_reference,
                  subset=ctx.subset, input_check=ctx.input_check,
                  validation=ctx.validation, given_sample=ctx.given_sample,
                  given_reference=ctx.given_reference, kept=ctx.kept)
    new.search, new.prepared = semantics.prepare_graph(graph, judge.semantics, judge.trt_version)
    new.rules = semantics.rules_for(new.prepared, judge.tf32, judge.accumulate,
                                    ctx.rules.precision)
    return new


def _fingerprint(ctx: Context, judge: JudgeOptions, search: SearchOptions) -> dict:
    """What a journaled verdict depends on: the model, the samples, the version, and every
    setting of the judge (judge/settings.py: one object, so none can be left out)."""
    return run_fingerprint(judge.settings.fingerprint(), ctx.sha256, ctx.every_sample,
                           __version__, model_data=ctx.data_sha256, rewrite=search.rewrite,
                           # what a plan means: since #26 a plan leaves subgraph nodes FP16
                           # unless it names them (a journal of an earlier version judged
                           # them FP32): never replayed across
                           judge="subgraphs")


def _finish(result: RunResult, ctx: Context, out_dir: Path | None, started: float,
            report: bool = False, marks: Sequence[tuple[str, float]] = ()) -> RunResult:
    """Seconds in all and per stage (the files' writing included in neither), then the files:
    the result with them (a new one)."""
    now = time.perf_counter()
    # Each boundary is rounded once, as an offset from the start, so the stages add up to the
    # span they cover (never more than the total) however the milliseconds fall.
    at = [round(t - started, 3) for _, t in marks] + [round(now - started, 3)]
    result = replace(result, seconds=now - started, stages=[
        {"stage": msg, "seconds": round(end - begun, 3)}
        for (msg, _), begun, end in zip(marks, at, at[1:])])
    if out_dir is not None:
        result = write_outputs(result, ctx, out_dir, write_report if report else None)
    return result


def verify_on_tensorrt(result: RunResult, opts: Options, out_dir: Path,
                       say: Callable[[str], None] = log.info) -> RunResult:
    """Build the emulator's plan as TensorRT engines; refine only where TensorRT disagrees.

    The TensorRT report lands in precision.json under "tensorrt"; when TensorRT needs more
    FP32 nodes than the emulator did, its plan becomes the plan. Engines are judged by the
    run's criteria. `--workers N` builds on up to N visible GPUs at once (`say` tells how many).
    Returns the result with TensorRT's findings and the files written again (a new one).
    (The whole options: `prepare` and `TrtSearchOptions.of` take them.)
    """
    from .stages.trt import TrtSearchOptions, run_trt_search

    ctx = prepare(result.model_path, opts)
    report = run_trt_search(ctx.graph.materialize(), ctx.samples, out_dir / "trt",
                            TrtSearchOptions.of(opts), emulator_plan=result.fp32_nodes,
                            seeds=result.prior_seeds, say=say)
    found = report.result.found
    changed = found and set(report.result.fp32) != set(result.fp32_nodes)
    if changed:  # the mixed model and its check described the emulator's plan
        result = replace(result, fp32_nodes=list(report.result.fp32), mixed_model=None,
                         mixed_check=None, staged=[], emulated_mixed=None, tensorrt=report,
                         files={k: v for k, v in result.files.items() if k != "mixed_model"})
    else:
        result = replace(result, tensorrt=report)
    result = result.settled(tensorrt=TensorRT(found=found, changed=changed,
                                              planned=bool(result.fp32_nodes)))
    return write_outputs(result, ctx, out_dir)


def judge_all_fp16(ctx: Context, judge: JudgeOptions) -> Verdict:
    """All-FP16 on the emulator under the run's criteria (`compare` with criterion flags)."""
    ev = Evaluator(ctx, judge, {}, None)
    judged = ev.measure(frozenset())[1]
    ev.close()
    return judge.criteria.verdict(judged)


# ---------------------------------------------------------------- compare


@dataclass(frozen=True)
class Comparison:
    """`trtbisect compare`: FP32 against all-FP16 (or all-BF16) tensor by tensor, no search."""

    precision: Precision
    stats: dict[str, TensorStats] = field(default_factory=dict)  # tensor -> statistics
    summary: dict[str, object] = field(default_factory=dict)  # where things first go wrong
    judged: Verdict | None = None  # the run's criteria on the all-low outputs (criterion flags)
    nothing: str | None = None  # why there is nothing to compare (the rest is then empty)

    def to_json(self) -> dict[str, Any]:
        if self.nothing:
            return {"summary": {"tensors": 0, "nothing_to_judge": self.nothing}, "tensors": []}
        return {"summary": self.summary, "tensors": [s.to_json() for s in self.stats.values()],
                **({"all_fp16": self.judged.to_json()} if self.judged else {})}


def compare(model_path: str | Path, opts: Options, say: Callable[[str], None] = log.info,
            on_layer: Callable[[int, int], None] | None = None) -> Comparison:
    """FP32 against all-low-precision on the emulator, tensor by tensor; with criterion flags
    also the all-low outputs judged by them. A broken (exit 3) or unreproducible (exit 8)
    reference is refused. `say` hears the stage, `on_layer` the tensors compared so far."""
    ctx = prepare(model_path, opts)
    problems = reference_problems(ctx)
    if problems:
        raise TrtBisectError(f"the FP32 reference is already broken: {problems[0]}",
                             EXIT_REFERENCE_INVALID)
    require_reproducible(ctx, opts.judge.threads)
    low = ctx.rules.precision
    nothing = degenerate.nothing_to_judge(ctx.judged)
    if nothing:
        return Comparison(low, nothing=nothing)
    say(f"layer-wise comparison, FP32 vs {low.label}")
    stats = layerwise(ctx, opts.judge, opts.search, on_layer)
    summary = {**summarize_layerwise(ctx.graph, stats, low), "precision": low.name}
    judged = None if opts.judge.criteria.default else judge_all_fp16(ctx, opts.judge)
    return Comparison(low, stats, summary, judged)


# ---------------------------------------------------------------- check


def check_mixed(mixed_path: str | Path, reference_path: str | Path, opts: Options) -> CheckResult:
    """Judge any mixed-precision ONNX against the FP32 reference model on the emulator."""
    ctx = prepare(reference_path, opts, search=False)
    # the file's own weights; its layers: judge_mixed
    ctx.rules = semantics.Rules(tf32=opts.judge.tf32, accumulate=opts.judge.accumulate,
                                precision=low_precision(opts.judge.precision))
    problems = reference_problems(ctx)
    if problems:
        raise TrtBisectError(f"the FP32 reference is already broken: {problems[0]}",
                             EXIT_REFERENCE_INVALID)
    require_reproducible(ctx, opts.judge.threads)
    _declares_the_reference_shapes(mixed_path, ctx.every_reference[0])
    try:
        return judge_mixed(mixed_path, ctx, opts.judge)
    except ValueError as exc:  # a file of the user's computing other shapes (declared dynamic)
        if not str(exc).startswith("shape mismatch"):
            raise
        raise TrtBisectError(f"{mixed_path} computes another output shape than the reference "
                             f"({exc}): is it a mixed-precision copy of the reference model?"
                             ) from exc


def require_reproducible(ctx: Context, threads: int | None) -> None:
    """`check` and `compare`: a reference two runs do not reproduce (random ops) is refused,
    exit 8, naming the op (`run` gives it a verdict of its own)."""
    from .stages.reproducible import unstable
    moving = unstable(ctx.graph, ctx.every_sample[0], threads)
    if moving:
        raise TrtBisectError(f"the FP32 reference is not reproducible: {'; '.join(moving)}",
                             EXIT_REFERENCE_UNSTABLE)


def _declares_the_reference_shapes(mixed_path: str | Path, ref: Mapping[str, np.ndarray]) -> None:
    """A file whose output declares another static shape than the reference computes is
    another model: refused in one line, before it is run."""
    from .data.inputs import declared_shape
    from .graph import load_model
    for v in load_model(mixed_path).graph.output:
        dims = declared_shape(v) if v.type.tensor_type.HasField("shape") else None
        if v.name in ref and dims is not None and all(isinstance(d, int) and d > 0 for d in dims) \
                and tuple(dims) != np.shape(ref[v.name]):
            raise TrtBisectError(
                f"{mixed_path}: output {v.name!r} declares shape {list(dims)}, the reference "
                f"computes {list(np.shape(ref[v.name]))}: is it a mixed-precision copy of the "
                "reference model?")


