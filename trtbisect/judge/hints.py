"""Point to the criterion that fits: when trtbisect's default criterion (the largest error
against the output's range) is not what the engineer means, say so, name the criteria that
fit, and what each gives where that is already known.

Two shapes of output make the default a poor judge:

- **error in a few elements**: all-FP16's 99th-percentile |d| far below its max|d| (PP-OCRv4
  det: 7e-6 against 1e-2). A handful of pixels decide the verdict; Polygraphy's
  `--check-error-stat quantile --error-quantile 0.99` judges the bulk, and all-FP16's p99 is
  already measured, so whether it passes is known.
- **a probability map**: every FP32 value in [0, 1] (a sigmoid heat map, a segmentation mask)
  or rows that sum to 1 (a softmax over classes). What matters downstream is a thresholded
  region (`--metric iou:THRESHOLD:MIN`) or the top class (`--metric topk:K`), or the user's
  own post-processing (`--check FILE.py:FUNCTION`).

Hints are given only under the default criterion and only for outputs all-FP16 fails.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .compare import OutputError, Tolerance

CONCENTRATION = 100.0  # max|d| at least this many times p99 |d|: the error sits in a few elements


@dataclass(frozen=True)
class Fit:
    """A criterion that fits: its flags, and what it says of all-FP16 where that is known."""
    flags: str
    all_fp16: str

    def to_json(self) -> dict:
        return {"flags": self.flags, "all_fp16": self.all_fp16}

    @classmethod
    def from_json(cls, d: Mapping) -> Fit:
        return cls(d["flags"], d["all_fp16"])


@dataclass(frozen=True)
class Hint:
    """One output the default criterion judges poorly (precision.json's "criterion_hints"):
    why, and the criteria that fit."""
    output: str
    why: list[str]
    criteria: list[Fit]

    def to_json(self) -> dict:
        return {"output": self.output, "why": list(self.why),
                "criteria": [c.to_json() for c in self.criteria]}

    @classmethod
    def from_json(cls, d: Mapping) -> Hint:
        return cls(d["output"], list(d["why"]), [Fit.from_json(c) for c in d["criteria"]])


def criterion_hints(errors: Mapping[str, OutputError], reference: Mapping[str, np.ndarray],
                    tolerance: Tolerance) -> list[Hint]:
    """Per failing output (all-FP16's worst `errors` under the default criterion, one sample's
    FP32 `reference`): what makes the default a poor fit and the criteria that fit."""
    hints = []
    for name, e in errors.items():
        if e.passed or e.scores or e.nonfinite or math.isinf(e.p99_abs):
            continue  # (an infinite p99: the output changed shape, no criterion fits that)
        why: list[str] = []
        fits: list[Fit] = []
        rtol = tolerance.for_output(name)[0]
        if e.p99_abs * CONCENTRATION <= e.max_abs:
            ratio = e.max_abs / e.p99_abs if e.p99_abs > 0 else float("inf")
            passes = e.p99_abs <= e.bound
            why.append(f"the error sits in a few elements: 99% of |d| are at most "
                       f"{e.p99_abs:.3g}, {ratio:.3g}x below max|d| {e.max_abs:.3g}")
            fits.append(Fit(f"--check-error-stat {name}:quantile --error-quantile "
                            f"{name}:0.99 --output-tol {name}:{rtol:g}:{e.bound:.6g}",
                            ("passes" if passes else "fails") +
                            f" (p99 |d| {e.p99_abs:.3g} against {e.bound:.3g})"))
        kind = _probabilities(reference.get(name))
        if kind == "map":
            why.append("every FP32 value is in [0, 1]: a probability or score map")
            fits.append(Fit(f"--metric {name}:iou:0.5:0.9", "one evaluation to tell"))
        elif kind == "softmax":
            why.append("each row sums to 1: class probabilities")
            fits.append(Fit(f"--metric {name}:topk:1", "one evaluation to tell"))
        if why:
            fits.append(Fit("--check FILE.py:FUNCTION", "your own post-processing decides"))
            hints.append(Hint(name, why, fits))
    return hints


def _probabilities(value: np.ndarray | None) -> str | None:
    """'softmax' for rows summing to 1, 'map' for values within [0, 1], else None."""
    if value is None:
        return None
    a = np.asarray(value)
    if not np.issubdtype(a.dtype, np.floating) or a.size < 2 or not np.isfinite(a).all():
        return None
    if float(a.min()) < 0.0 or float(a.max()) > 1.0:
        return None
    if a.ndim >= 1 and a.shape[-1] > 1 and np.allclose(a.sum(axis=-1), 1.0, atol=1e-3):
        return "softmax"
    return "map"


def hint_lines(hints: Sequence[Hint]) -> list[str]:
    """The hints as the console and the reports say them."""
    lines = []
    for h in hints:
        lines.append(f"{h.output}: {'; '.join(h.why)}. Criteria that fit:")
        lines += [f"  {c.flags}  (all-FP16: {c.all_fp16})" for c in h.criteria]
    return lines
