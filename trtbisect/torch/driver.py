"""The `trtbisect torch` search: FP32 vs reduced precision, module by module, and the
smallest set of submodules to keep FP32."""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..context import nonfinite_references
from ..judge.compare import OutputError, Tolerance, worst
from ..judge.criteria import Criteria, worst_of
from ..judge.engine import judge_samples
from ..judge.verdict import Findings
from ..result import search_verdict
from ..search.minimal import Progress, SearchResult, find_minimal_fp32
from .explain import explain
from .export import TorchModel, flatten_outputs, to_numpy
from .layerwise import layerwise, summarize
from .outputs import _finish
from .precision import Precision, reduced, reduced_args
from .prior import candidates, prior
from .result import TorchOptions, TorchResult
from .runner import TorchRunner
from .snippet import apply_plan

log = logging.getLogger(__name__)


def diagnose(tm: TorchModel, opts: TorchOptions, out_dir: Path | None = None,
             progress: Progress | None = None,
             on_stage: Callable[[str], None] | None = None) -> TorchResult:
    """FP32 vs reduced precision in PyTorch, module by module, and the smallest set of
    submodules to keep FP32 (certified 1-minimal by the same search as `trtbisect run`)."""
    started = time.perf_counter()
    stage = on_stage or (lambda msg: log.info(msg))
    p, tol = opts.precision, opts.tolerance
    stage(f"running {tm.source} in FP32 ({p.describe()})")
    runner = TorchRunner(tm.module, p)
    args = [runner.args(tm, s) for s in tm.samples]
    refs = [runner.reference(a) for a in args]
    base: dict[str, Any] = dict(source=tm.source, precision=p, modules=len(runner.modules) - 1,
                                samples=len(tm.samples), tolerance=tol, criteria=opts.criteria)
    problems = nonfinite_references(refs)
    if problems:
        result = TorchResult("reference_invalid", fp32_nodes=[], candidates=0, evaluations=0,
                             inferences=0, errors_before={}, errors_after={},
                             reference_problems=problems, **base)
        return _finish(result, out_dir, started)
    stage(f"layer-wise comparison, FP32 vs {p.mode} {p.dtype}")
    stats = layerwise(runner, tm)
    cands = candidates(stats)
    suspects = prior(stats, cands, p.mode)

    crit = opts.criteria
    if refs:
        crit.validate(list(refs[0]))
        crit.check_fit(refs[0])

    def measure(plan: frozenset[str], stop_early: bool = False):
        passed, judged = judge_samples(lambda i: runner.run(plan, args[i]), tm.samples, refs,
                                       crit, tol, stop_early)
        return passed, [j.errors for j in judged]

    _, before = measure(frozenset())
    searched = None
    if opts.search:
        stage(f"searching {len(cands)} candidate modules ({len(suspects.seeds)} suspects)")
        search = find_minimal_fp32(cands, lambda plan: measure(plan, stop_early=True)[0],
                                   suspects.seeds, suspects.ranking, opts.max_evaluations,
                                   progress)
        searched = _judge(search, measure)
    # the result, assembled once from what the search and its final check found
    verdict = searched.findings.verdict() if searched is not None else "not_searched"
    fp32 = searched.fp32 if searched is not None else []
    snippet = _check_snippet(tm, p, tol, fp32, refs, crit) if verdict == "fixed" else None
    inferences = runner.runs
    culprits = explain(runner, stats, fp32)
    after = searched.errors_after if searched is not None else None
    result = TorchResult(
        verdict, fp32_nodes=fp32, candidates=len(cands),
        evaluations=searched.evaluations if searched is not None else 0,
        inferences=inferences, errors_before=worst(before),
        errors_after=after if after is not None else worst(before), culprits=culprits,
        one_minimal=searched is not None and searched.one_minimal,
        search=searched.search if searched is not None else None, stats=stats,
        prior_seeds=suspects.seeds,
        verdict_findings=searched.findings if searched is not None else None,
        summary=summarize(stats, tol.rtol), snippet_check=snippet, **base)
    return _finish(result, out_dir, started)


@dataclass(frozen=True)
class _Searched:
    """What the search and the plan's final check found: the result is built from it."""
    search: SearchResult
    findings: Findings  # the search's proposal and the final check (judge/verdict.py)
    evaluations: int
    fp32: list[str]  # the plan, when its final check passes
    errors_after: dict[str, OutputError] | None  # the plan's (None: all-FP16's stand)
    one_minimal: bool


def _judge(search: SearchResult, measure) -> _Searched:
    proposed = search_verdict(search, bool(search.fp32))
    if proposed != "fixed":
        return _Searched(search, Findings(proposed), search.evaluations, [], None,
                         proposed == "fp16_ok")
    passed, errors = measure(frozenset(search.fp32))  # the final check, run afresh
    return _Searched(search, Findings(proposed, file_passed=passed), search.evaluations + 1,
                     list(search.fp32) if passed else [], worst(errors),
                     passed and search.one_minimal)


def _check_snippet(tm: TorchModel, p: Precision, tol: Tolerance, fp32: list[str],
                   refs: list[dict[str, np.ndarray]], crit: Criteria | None = None
                   ) -> dict[str, OutputError]:
    """Apply the plan the way the user will (apply_plan on a fresh copy) and judge it."""
    crit = crit or Criteria()
    model = apply_plan(copy.deepcopy(tm.module).float().eval().to(p.device), fp32, p.mode,
                       p.torch_dtype)

    def infer(i: int) -> dict[str, np.ndarray]:
        with reduced(p):
            out = model(*reduced_args(p, tm.args(tm.samples[i], p.device)))
        return to_numpy(flatten_outputs(out))
    passed, judged = judge_samples(infer, tm.samples, refs, crit, tol, stop_early=False)
    if not passed:
        log.warning("the plan applied with apply_plan does not meet the tolerance; please report")
    return worst_of(judged)
