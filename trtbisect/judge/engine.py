"""The TensorRT search's verdict on one plan: its engine's outputs under the run's criteria.

One rule for the search in the run's process (backends/trt.py `run_trt_search`) and on its GPU
workers (parallel/trt_pool.py `TrtJudge`), so a plan gets the same verdict wherever it is
built. It is the emulator's rule (parallel/judge.py `take`, without --strict's watched
tensors): each sample judged by `Criteria.judge`, the plan passing when `Criteria.verdict`
says so, and no sample run once the plan cannot pass any more (`Criteria.hopeless`), since on
TensorRT every sample is an engine execution. Knows no runtime: `infer` runs the plan. The
torch run (torch/driver.py) judges its module plans by the same rule (`judge_samples`). An
execution that runs past --eval-timeout fails its sample, as on the emulator (base/limits.py):
an engine whose Loop never ends is no better than one that overflows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ..base.limits import EvalTimeout
from .compare import Tolerance, compare_outputs
from .criteria import Criteria, Judgement, timed_out

Arrays = Mapping[str, np.ndarray]


def engine_passes(infer: Callable[[Arrays], Arrays], samples: Sequence[Arrays],
                  refs: Sequence[Arrays], criteria: Criteria | None, tolerance: Tolerance) -> bool:
    """Does the plan `infer` runs pass on `samples`, judged against their FP32 outputs `refs`?

    `criteria` None or default: every output of every sample within `tolerance`, stopping at
    the first that is not (what the TensorRT search always did). A user's `--check` hook that
    raises or returns garbage raises its one-line HookError (exit 2), as on the emulator.
    """
    if criteria is None or criteria.default:
        for ref, sample in zip(refs, samples):
            try:
                outs = infer(sample)
            except EvalTimeout:
                return False
            if not all(e.passed for e in compare_outputs(ref, outs, tolerance).values()):
                return False
        return True
    return judge_samples(lambda i: infer(samples[i]), samples, refs, criteria, tolerance)[0]


def judge_samples(infer: Callable[[int], Arrays], samples: Sequence[Arrays],
                  refs: Sequence[Arrays], criteria: Criteria, tolerance: Tolerance,
                  stop_early: bool = True) -> tuple[bool, list[Judgement]]:
    """(passes, each sample's judgement) of the plan whose outputs on sample i are
    `infer(i)`; with `stop_early`, no sample is run once the plan cannot pass (the
    judgements then stop there too). The rule of engine_passes, also the torch run's."""
    judged: list[Judgement] = []
    for i, (ref, sample) in enumerate(zip(refs, samples)):
        try:
            outs = infer(i)
        except EvalTimeout as exc:
            judged.append(timed_out(ref, exc.seconds))
        else:
            judged.append(criteria.judge(ref, outs, sample, tolerance))
        if stop_early and criteria.hopeless(judged, len(refs)):
            return False, judged
    return criteria.verdict(judged).passed, judged
