"""The `trtbisect torch` search: FP32 vs reduced precision, module by module, and the
smallest set of submodules to keep FP32."""

from __future__ import annotations

import copy
import logging
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..judge.compare import OutputError, Tolerance, worst
from ..judge.criteria import Criteria
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
                                samples=len(tm.samples), tolerance=tol)
    problems = [f"output {k!r} of sample {i} has {int((~np.isfinite(v)).sum())} non-finite value(s)"
                for i, r in enumerate(refs) for k, v in r.items()
                if v.dtype.kind == "f" and not np.isfinite(v).all()]
    if problems:
        result = TorchResult("reference_invalid", fp32_modules=[], candidates=0, evaluations=0,
                             inferences=0, errors_before={}, errors_after={},
                             reference_problems=problems, **base)
        return _finish(result, out_dir, started)
    stage(f"layer-wise comparison, FP32 vs {p.mode} {p.dtype}")
    stats = layerwise(runner, tm)
    cands = candidates(stats)
    seeds, ranking = prior(stats, cands, p.mode)

    crit = opts.criteria
    if refs:
        crit.validate(list(refs[0]))
        crit.check_fit(refs[0])

    def measure(plan: frozenset[str], stop_early: bool = False):
        judged = []
        for sample, a, ref in zip(tm.samples, args, refs):
            judged.append(crit.judge(ref, runner.run(plan, a), sample, tol))
            if stop_early and crit.hopeless(judged, len(args)):
                return False, [j.errors for j in judged]
        return crit.verdict(judged).passed, [j.errors for j in judged]

    _, before = measure(frozenset())
    result = TorchResult("not_searched", fp32_modules=[], candidates=len(cands), evaluations=0,
                         inferences=0, errors_before=worst(before), errors_after=worst(before),
                         stats=stats, summary=summarize(stats, tol.rtol), seeds=seeds, **base)
    if opts.search:
        stage(f"searching {len(cands)} candidate modules ({len(seeds)} suspects)")
        search = find_minimal_fp32(cands, lambda plan: measure(plan, stop_early=True)[0],
                                   seeds, ranking, opts.max_evaluations, progress)
        _judge(result, search, measure)
        if result.verdict == "fixed":
            result.snippet_check = _check_snippet(tm, p, tol, result.fp32_modules, refs, crit)
    result.inferences = runner.runs
    result.culprits = explain(runner, stats, result.fp32_modules)
    return _finish(result, out_dir, started)


def _judge(result: TorchResult, search: SearchResult, measure) -> None:
    result.search, result.evaluations = search, search.evaluations
    if not search.found:
        result.verdict = "no_plan"
    elif not search.fp32:
        result.verdict, result.one_minimal = "fp16_ok", True
    else:
        passed, errors = measure(frozenset(search.fp32))  # the final check, run afresh
        result.evaluations += 1
        result.verdict = "fixed" if passed else "no_plan"
        result.errors_after = worst(errors)
        result.fp32_modules = list(search.fp32) if passed else []
        result.one_minimal = passed and search.one_minimal


def _check_snippet(tm: TorchModel, p: Precision, tol: Tolerance, fp32: list[str],
                   refs: list[dict[str, np.ndarray]], crit: Criteria | None = None
                   ) -> dict[str, OutputError]:
    """Apply the plan the way the user will (apply_plan on a fresh copy) and judge it."""
    crit = crit or Criteria()
    model = apply_plan(copy.deepcopy(tm.module).float().eval().to(p.device), fp32, p.mode,
                       p.torch_dtype)
    judged = []
    for sample, ref in zip(tm.samples, refs):
        with reduced(p):
            out = model(*reduced_args(p, tm.args(sample, p.device)))
        judged.append(crit.judge(ref, to_numpy(flatten_outputs(out)), sample, tol))
    verdict = crit.verdict(judged)
    if not verdict.passed:
        log.warning("the plan applied with apply_plan does not meet the tolerance; please report")
    return verdict.errors
