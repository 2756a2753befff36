"""The one judge of a written file: a plan's mixed model is written, judged as `trtbisect check`
judges it, and that verdict is the run's.

The search's own numbers for a plan must be the file's, bit for bit (`same_numbers`); a file
that fails is never reported `fixed`. `judge_mixed` is `check`'s judge of any mixed-precision
ONNX.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..backends.ort import MixedModel, Rounded
from ..base import child
from ..base.limits import EvalTimeout
from ..context import Context, JudgeOptions
from ..errors import EXIT_NO_PLAN, EXIT_OK, EXIT_PARTIAL, TrtBisectError
from ..graph import Graph
from ..judge.compare import OutputError
from ..judge.criteria import Judgement, Verdict, json_number, timed_out, worst_of
from ..judge.loadable import WrittenCheck, require_loadable, require_written_valid
from ..judge.mixed import Written, mixed_model
from ..judge.precision import of_type
from ..judge.validation import Validation, unvalidated
from ..judge.validation import judged as judged_validation
from ..judge.verdict import VerdictName, decide
from ..outputs.outdir import OutputDir
from ..result import Margin, OneJudge, OpCount
from ..search.minimal import Noisy
from . import coverage
from .evaluator import Evaluator
from .spread import Certificate, certify

log = logging.getLogger(__name__)


@dataclass
class Judged:
    """A plan's mixed model, written (staged under --out) and judged as `check` judges it."""

    ctx: Context
    plan: frozenset[str]
    checked: CheckResult
    staged: list[str]
    # the staged file's load in ONNX Runtime, still under way in a child process
    # (judge/loadable.py): `judge_written_plan` requires it once the certificate is measured
    loading: WrittenCheck | None = field(default=None, repr=False)


def write_and_judge(ctx: Context, judge: JudgeOptions, plan: frozenset[str],
                     out_dir: Path | None, expose: Sequence[str] = ()) -> Judged:
    """A plan's file written and judged. A plan's file (not the all-FP16 one) must load in
    ONNX Runtime: that load starts in a child process as soon as the file is written and
    runs beside the judge (`WrittenCheck`); a staged file's is handed on in `Judged.loading`
    for the caller to require (or close), a temporary one's is required here."""
    Rounded.release(ctx.judged)  # memory: the judge holds the file's weights, not the search's
    written = write_plan(ctx, plan)
    # staged beside --out (same file system): write_outputs moves these very files into place
    staging = OutputDir(out_dir).staging() if out_dir is not None else None  # emptied
    with tempfile.TemporaryDirectory() as tmp:
        path = (staging or Path(tmp)) / f"{ctx.path.stem}.mixed.onnx"
        files = written.save(path, validate=False)  # judge_mixed checks it, as `check` does
        weights = written.weight_bytes()
        del written  # saved: the file is the model from here on
        # the all-FP16 file is kept only when it passes: ONNX Runtime loads it only then
        loading = WrittenCheck(path, weights, ctx.input_check,
                               in_child=child.worth_a_child(len(ctx.judged.names))) \
            if plan else None
        try:
            with loading.guard() if loading is not None else nullcontext():
                checked = judge_mixed(path, ctx, judge, expose, ours=True, load=bool(plan),
                                      written=loading)
            if not plan and checked.passed:
                require_written_valid(path, weights, ctx.input_check)
            if loading is not None and staging is None:  # the file goes with `tmp`
                loading.require()
        except BaseException:
            if loading is not None:
                loading.close()
            raise
    return Judged(ctx, plan, checked, [str(f) for f in files] if staging is not None else [],
                  loading if staging is not None else None)


@dataclass(frozen=True)
class WrittenFindings:
    """What the written plan's judge found (`judge_written_plan`): the file's verdict and
    numbers, the search's own numbers against them, its validation and its certificate.
    The run's result is assembled from it (stages/assembly.assemble); nothing here is a verdict."""
    passed: bool  # the file passes its own judge (the finding `file_passed`)
    checked: dict[str, OutputError]  # the file's errors (mixed_check, and errors_after)
    after: Verdict | None  # the criteria's verdict of the file (JudgedRecord.after)
    emulated: Written | None  # what Polygraphy's check runs: the judge's graph
    one_judge: OneJudge
    validation: Validation | None
    staged: list[str]  # the judged files waiting in --out/.staging
    # the written file is all-FP16 and passes: its numbers over every sample given (held-out
    # ones too) are the table's "before", as the certificate's margin is measured on them
    errors_before: dict[str, OutputError] | None
    # the file leaves the search's claim of a minimal plan standing (not over the budget,
    # not failing)
    keeps_minimal: bool
    # the certificate as measured (stages/spread.py); None: a file that fails (nothing to
    # certify). Why no nearer plan was searched the aimed rounds say in their own record
    # (stages/search.Aimed.certificate)
    cert: Certificate | None

    @property
    def mixed_model_passed(self) -> bool:
        return all(e.passed for e in self.checked.values())


def judge_written_plan(proposed: VerdictName, rewritten: bool, search_noise: Noisy | None,
                        ctx: Context, judge: JudgeOptions, ev: Evaluator,
                        plan: frozenset[str], out_dir: Path | None,
                        judged: Judged | None = None,
                        noise: Mapping[str, float] | None = None) -> WrittenFindings:
    """One judge: write the plan's mixed model, judge the file as `check` does, report that.

    The search's own numbers for the plan must be the file's, bit for bit; a file that fails
    makes the verdict `no_plan`, never `fixed` (verdict.decide, from `passed`). `proposed`:
    the search's verdict; `rewritten`: --rewrite changed the model; `search_noise`: the
    search stopped on its own noise. `judged`: the file already written and judged for this
    plan (the all-FP16 verdict is the file's own: no search number to compare).
    """
    if judged is not None and judged.plan == plan and judged.ctx is ctx:
        searched = judged.checked.judgements
    else:
        searched = ev.last_errors if plan == ev.last_plan else ev.measure(plan, full=True)[1]
        ev.close()  # memory: the judge below holds the file's weights, not the search's
        judged = write_and_judge(ctx, judge, plan, out_dir)
    loading, judged.loading = judged.loading, None
    args = (proposed, rewritten, search_noise, ctx, judge, judged, searched, plan, noise)
    if loading is None:
        return _judge_written_plan(*args)
    # the file's load in ONNX Runtime runs beside the certificate; its answer comes first
    with loading:  # closed whatever happens: no child outlives the judge
        with loading.guard():
            found = _judge_written_plan(*args)
        loading.require()
    return found


def _judge_written_plan(proposed: VerdictName, rewritten: bool, search_noise: Noisy | None,
                        ctx: Context, judge: JudgeOptions, judged: Judged,
                        searched: Sequence[Judgement], plan: frozenset[str],
                        noise: Mapping[str, float] | None) -> WrittenFindings:
    checked = judged.checked
    searched_worst = worst_of(searched)
    same = len(searched) == len(checked.judgements) and all(
        same_numbers(a, b) for a, b in zip(searched, checked.judgements))
    if not same:
        log.error("the search measured other numbers than `check` of the written file: "
                  "trusting the file (please report this)")
    if proposed != "over_budget" and not checked.passed:  # over the budget: the file decides
        log.error("the written mixed model fails the tolerance: no plan is reported")
    # the file is all-FP16 (what the search proposed as it is) and passes
    as_given = decide(proposed, file_passed=checked.passed) == "fp16_ok"
    return WrittenFindings(
        checked.passed, checked.errors,
        checked.verdict,
        checked.emulated, OneJudge(same, {k: v.to_json() for k, v in searched_worst.items()}),
        checked.validation, judged.staged,
        checked.errors if as_given and not plan and not rewritten else None,
        proposed != "over_budget" and checked.passed,
        certify_written(ctx, judge, checked, noise, search_noise))


def certify_written(ctx: Context, judge: JudgeOptions, checked: CheckResult,
                    noise: Mapping[str, float] | None = None,
                    search_noise: Noisy | None = None) -> Certificate | None:
    """The written plan's certificate (stages/spread.py): whether it passes by more than the
    spread of what the tools may compute; None for a file that fails (nothing to certify).
    `search_noise`: the search stopped on its own noise (`fragile` at once)."""
    if not checked.passed or checked.emulated is None:
        return None
    cert = certify(ctx, judge, checked.emulated, checked.judgements, noise,
                   given=checked.given or None)
    if search_noise is not None:
        cert = cert.stopped_on(search_noise)  # the search stopped: `fragile` at once
    return cert


def margins(cert: Certificate) -> dict[str, Margin]:
    """The certificate's `margins` per output and per criterion's score, as precision.json
    has written them beside the certificate."""
    return {
        **{o: Margin(json_number(m.margin), json_number(m.spread), json_number(m.noise_floor),
                     fragile=not m.certified) for o, m in cert.outputs.items()},
        # a criterion's score against its threshold (stages/spread.py)
        **{k: Margin(json_number(m.margin), json_number(m.spread), None,
                     fragile=not m.certified) for k, m in cert.scores.items()}}


def write_plan(ctx: Context, fp32_nodes) -> Written:
    """The plan's mixed model: the judged graph, FP16 weights under the judge's weight rule."""
    return mixed_model(ctx.judged, fp32_nodes, ctx.rules.weight_rule, ctx.rules.precision)


def bits(e: OutputError) -> tuple:
    return (e.max_abs, e.mean_abs, e.nonfinite, e.passed,
            tuple((s.value, s.passed, s.detail) for s in e.scores))


def same_numbers(a: Judgement, b: Judgement) -> bool:
    """One sample judged twice (the search, the written file): the same numbers, bit for bit
    (nan equal to nan: a hook without a score)."""
    def key(j: Judgement) -> str:
        return repr(({o: bits(e) for o, e in j.errors.items()},
                     [(s.value, s.passed, s.detail) for s in j.scores]))
    return key(a) == key(b)


@dataclass
class CheckResult:
    passed: bool
    errors: dict[str, OutputError]
    half_tensors: int
    samples: int
    emulated: Written | None = field(default=None, repr=False)  # the graph the judge ran
    # per sample, the tensors judge_mixed was asked to expose (the layer-wise pass's FP16 side)
    tensors: list[dict[str, np.ndarray]] = field(default_factory=list, repr=False)
    unjudged: list[OpCount] = field(default_factory=list)  # coverage.unjudged of the file
    judgements: list[Judgement] = field(default_factory=list, repr=False)  # per sample
    verdict: Verdict | None = field(default=None, repr=False)
    validation: Validation | None = field(default=None, repr=False)  # the run's own files
    # per sample the user gave, in their order (held-out ones included): what `errors` and
    # the certificate's numbers are over
    given: list[Judgement] = field(default_factory=list, repr=False)

    @property
    def exit_code(self) -> int:
        """0 passes, 4 fails, 5 passes on the judged part only (`unjudged`)."""
        return EXIT_NO_PLAN if not self.passed else EXIT_PARTIAL if self.unjudged else EXIT_OK

    def to_json(self) -> dict:
        d = {"passed": self.passed, "samples": self.samples, "fp16_tensors": self.half_tensors,
             "errors": {k: v.to_json() for k, v in self.errors.items()},
             "unjudged": [c.to_json() for c in self.unjudged]}
        if self.verdict is not None:
            d["judged"] = self.verdict.to_json()
        return d


def _refuse_other_precision(graph: Graph, ctx: Context, path: str | Path) -> None:
    """A file whose own low-precision tensors (beyond the reference's) are all of the other
    type was not written for this --precision: say so rather than judge it under the wrong
    name. (The judge itself rounds every tensor to the type the file gives it.)"""
    own = set(ctx.graph.half_typed.values())
    added = {ty for ty in graph.half_typed.values()} - own
    low = ctx.rules.precision
    if added and low.onnx_type not in added:
        other = ", ".join(sorted(p.name for ty in added if (p := of_type(ty)) is not None))
        raise TrtBisectError(f"{path} holds {other} tensors, not {low.name}: judge it with "
                             f"--precision {other}")


def judge_mixed(mixed_path: str | Path, ctx: Context, judge: JudgeOptions,
                expose: Sequence[str] = (), ours: bool = False, load: bool = True,
                written: WrittenCheck | None = None) -> CheckResult:
    """The one judge of a written file: its float16 tensors rounded where produced.
    `expose`: tensors of the file to return too, per sample (`CheckResult.tensors`).

    The file itself must load in ONNX Runtime (judge/loadable.py): the judge runs a graph
    derived from it, which would forgive what no runtime does. `ours`: a file this run wrote,
    which must pass the checker's full check as well (a failure is trtbisect's bug);
    `load=False`: its load in ONNX Runtime is left to the caller (`require_written_valid`);
    `written`: the caller's check of the file, begun (judge/loadable.py `WrittenCheck`) and
    required by the caller."""
    graph = Graph.from_path(mixed_path)
    if ours:
        if written is None:
            require_written_valid(mixed_path, graph.weights.total_bytes(), ctx.input_check,
                                  load)
    else:
        warning = require_loadable(mixed_path, graph.weights.total_bytes())
        if warning:  # its own words: what loaded, and what was judged
            log.warning("%s", warning)
    names = ctx.graph.output_names()
    missing = set(names) - set(graph.output_names())
    if missing:
        raise TrtBisectError(f"{mixed_path} lacks the reference's output(s) "
                             f"{', '.join(sorted(missing))}")
    fed = {v.name for v in graph.inputs()}
    lacking = fed - {v.name for v in ctx.graph.inputs()}
    if lacking:
        raise TrtBisectError(f"{mixed_path} has input(s) {', '.join(sorted(lacking))} that the "
                             "reference model does not have")
    _refuse_other_precision(graph, ctx, mixed_path)
    wanted = [t for t in expose if t in graph.producer]
    mixed = MixedModel(graph, judge.threads, ctx.rules, fused=judge.semantics == "trt",
                       expose=wanted)
    judged: list[Judgement] = []
    tensors: list[dict[str, np.ndarray]] = []
    for sample, ref in zip(ctx.every_sample, ctx.every_reference):  # certified on every one
        try:
            outs, exposed = mixed.run_tensors(sample)
        except EvalTimeout as exc:  # a Loop that never ends: the file fails on the sample
            judged.append(timed_out(ref, exc.seconds))
            tensors = []  # the exposed tensors are all or nothing
            expose = ()
            continue
        if not ours:  # a user's file of another rank is another model (check refuses it);
            _same_ranks(ref, outs, names)  # a data-dependent shape (Unique) moves its dims
        judged.append(judge.criteria.judge(ref, {k: outs[k] for k in names}, sample,
                                           judge.tolerance))
        if expose:
            tensors.append({t: exposed[t] for t in wanted})
    verdict = judge.criteria.verdict(judged)
    # the run's own file: judged on the samples the search never saw, by this very judge
    # (judge/validation.py): held-out ones always (the file is reported on every sample the
    # user gave, as `check` of it on their data says), perturbed copies once it passes
    held = ctx.validation if ours else None
    checked = (validate(mixed, ctx, judge) if held is not None and (
        held.kind == "held_out" or verdict.passed)
        else unvalidated("validation turned off (--validation-share 0)")
        if ours and verdict.passed else None)
    reported, given = verdict, judged
    if held is not None and held.kind == "held_out" and checked is not None:
        searched, unseen = iter(judged), dict(zip(held.indices, checked.judgements))
        given = [unseen[i] if i in unseen else next(searched)
                 for i in range(len(held.indices) + len(judged))]
        reported = judge.criteria.verdict(given)
        checked = replace(checked, overall=reported.passed)
    return CheckResult(verdict.passed, reported.errors, len(graph.half_typed), len(judged),
                       Written(mixed.proto, mixed.arrays, loaded=True), tensors,
                       coverage.unjudged(graph), judged, reported,
                       checked, given)


def validate(mixed: MixedModel, ctx: Context, judge: JudgeOptions) -> Validation:
    """The written file's judge run on the run's validation samples (judge/validation.py);
    a run without any says the plan is unvalidated."""
    names = ctx.graph.output_names()

    def run(pairs):
        out = []
        for sample, ref in pairs:
            try:
                outs, _ = mixed.run_tensors(sample)
            except EvalTimeout as exc:
                out.append(timed_out(ref, exc.seconds))
                continue
            out.append(judge.criteria.judge(ref, {k: outs[k] for k in names}, sample,
                                            judge.tolerance))
        return out
    return judged_validation(ctx.validation, run, judge.criteria.verdict)


def _same_ranks(ref: Mapping[str, np.ndarray], outs: Mapping[str, np.ndarray],
                names: Sequence[str]) -> None:
    """A file whose output has another rank than the reference's computes another tensor:
    the ValueError `check` turns into its one-line refusal. Within one rank, a moved shape is
    a difference the criteria fail (infinitely), never an error."""
    for k in names:
        if np.ndim(ref[k]) != np.ndim(outs[k]):
            raise ValueError(f"shape mismatch {np.shape(outs[k])} vs reference "
                             f"{np.shape(ref[k])}")
