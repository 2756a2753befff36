"""Search on a few samples, certify on all of them.

With many samples every evaluation of the search costs one inference per sample. The search
therefore judges its plans on a subset first: the samples where all-FP16 fails worst (failing
samples first, then by `Judgement.severity`, ties by index), which are the ones that decide
which nodes must stay FP32. The plan it finds is then judged on every sample; if a sample
outside the subset fails, the failing samples (worst first) join the subset and the search
runs again. A plan that fails on a subset fails on every superset, so each round only adds
constraints, and the final plan is certified on every sample by the judge of the written file.

Only when every sample must pass: under `--pass-rate R < 1` a verdict on some samples says
nothing about the fraction on all of them, so the search judges every sample.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from .criteria import Judgement

SEARCH_SAMPLES = 8  # the default subset size (--search-samples)


def wanted(samples: int, size: int, pass_rate: float) -> bool:
    """Whether the search should judge on a subset of `samples`."""
    return 0 < size < samples and pass_rate >= 1.0


def _order(judged: Sequence[Judgement], among: Sequence[int]) -> list[int]:
    return sorted(among, key=lambda k: (judged[k].passed, -judged[k].severity, k))


def choose(judged: Sequence[Judgement], size: int) -> list[int]:
    """The `size` samples where all-FP16 (`judged`, one per sample) fails worst, in index
    order."""
    return sorted(_order(judged, range(len(judged)))[:size])


def widen(subset: Sequence[int], judged: Sequence[Judgement], size: int) -> list[int]:
    """`subset` plus up to `size` of the samples outside it that the plan (`judged`, one per
    sample) fails on, worst first; `subset` itself when none fails outside it."""
    inside = set(subset)
    missed = [k for k in _order(judged, range(len(judged)))
              if k not in inside and not judged[k].passed]
    return sorted(inside | set(missed[:max(size, 1)]))


def signature(subset: Sequence[int] | None) -> str:
    """A short name of a subset for journal keys ('' for every sample)."""
    if subset is None:
        return ""
    return hashlib.sha256(json.dumps(list(subset)).encode()).hexdigest()[:12]
