"""The TensorRT search's verdict on one plan: its engine's outputs under the run's criteria.

One rule for the search in the run's process (backends/trt.py `run_trt_search`) and on its GPU
workers (parallel/trt_pool.py `TrtJudge`), so a plan gets the same verdict wherever it is
built. It is the emulator's rule (parallel/judge.py `take`, without --strict's watched
tensors): each sample judged by `Criteria.judge`, the plan passing when `Criteria.verdict`
says so, and no sample run once the plan cannot pass any more (`Criteria.hopeless`), since on
TensorRT every sample is an engine execution. Knows no runtime: `infer` runs the plan.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from .compare import Tolerance, compare_outputs
from .criteria import Criteria, Judgement

Arrays = Mapping[str, np.ndarray]


def engine_passes(infer: Callable[[Arrays], Arrays], samples: Sequence[Arrays],
                  refs: Sequence[Arrays], criteria: Criteria | None, tolerance: Tolerance) -> bool:
    """Does the plan `infer` runs pass on `samples`, judged against their FP32 outputs `refs`?

    `criteria` None or default: every output of every sample within `tolerance`, stopping at
    the first that is not (what the TensorRT search always did). A user's `--check` hook that
    raises or returns garbage raises its one-line HookError (exit 2), as on the emulator.
    """
    if criteria is None or criteria.default:
        return all(e.passed for ref, sample in zip(refs, samples)
                   for e in compare_outputs(ref, infer(sample), tolerance).values())
    judged: list[Judgement] = []
    for ref, sample in zip(refs, samples):
        judged.append(criteria.judge(ref, infer(sample), sample, tolerance))
        if criteria.hopeless(judged, len(refs)):
            return False
    return criteria.verdict(judged).passed
