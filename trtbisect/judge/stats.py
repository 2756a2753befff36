"""Polygraphy's error statistics: `--check-error-stat max|mean|median|quantile|elemwise` and
`--error-quantile Q`, per output, meaning exactly what they mean in Polygraphy 0.53.6.

Computed the way Polygraphy computes them, operation for operation, so that the statistics are
its numbers and the verdicts its verdicts (tests/judge/test_criteria_polygraphy.py runs Polygraphy's
own comparator on the same arrays). From polygraphy/comparator/compare.py
(`SimpleCompareFunc._check_outputs_match`, `SimpleThreshold.passed`, `_simple_stat_failed`)
and polygraphy/comparator/util.py (`cast_up`, `compute_*`), with output0 = the candidate
(FP16 plan) and output1 = the FP32 reference, as `polygraphy run --trt --onnxrt` and
`--load-outputs` order them:

- absdiff = |cast_up(candidate) - cast_up(reference)| (XOR for two bool outputs), in the
  outputs' own type (float32 for float32 outputs);
- reldiff = absdiff / |reference|, a reference value of 0 replaced by 2.220446049250313e-16:
  relative to each reference element, not to the output's range as trtbisect's default is;
- max = np.amax, median = np.median (0 for an empty output), mean = np.mean in float32,
  quantile = np.quantile (inf for an empty output);
- a statistic fails when its absdiff statistic exceeds atol AND its reldiff statistic exceeds
  rtol (a NaN statistic exceeds any tolerance);
- elemwise fails when some element has absdiff > atol (or NaN) AND reldiff > rtol (or NaN).

Polygraphy's default statistic is `elemwise` and its default tolerances 1e-5; here a
statistic applies only to the outputs the flag names (or every output for an unprefixed
value), with the run's --rtol/--atol/--output-tol.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .criteria import Entry, register

STATISTICS = ("max", "mean", "median", "quantile", "elemwise")  # Polygraphy 0.53's, in its order
DEFAULT_QUANTILE = 0.99  # SimpleCompareFunc._DEFAULT_QUANTILE
EPSILON = 2.220446049250313e-16  # added to zero reference values before dividing


def _cast_up(a: np.ndarray) -> np.ndarray:
    """polygraphy.comparator.util.cast_up."""
    if a.dtype == np.float16:
        return a.astype(np.float32)
    if a.dtype in (np.int8, np.uint8, np.int16, np.uint16):
        return a.astype(np.int32)
    if a.dtype == np.uint32:
        return a.astype(np.int64)
    return a


def diffs(ref: np.ndarray, got: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(absdiff, reldiff) as Polygraphy computes them (candidate first, reference second)."""
    out0, out1 = np.asarray(got), np.asarray(ref)
    with np.errstate(all="ignore"):
        if out0.dtype == np.bool_ and out1.dtype == np.bool_:
            absdiff = np.logical_xor(out0, out1)
        else:
            absdiff = np.array(np.abs(np.array(_cast_up(out0) - _cast_up(out1))))
        out1_eps = _cast_up(out1).copy()
        if np.issubdtype(out1_eps.dtype, np.floating):
            out1_eps[out1_eps == 0] += EPSILON
        reldiff = absdiff / np.array(np.abs(out1_eps))
    return absdiff, np.asarray(reldiff)


def statistic(stat: str, x: np.ndarray, q: float = DEFAULT_QUANTILE) -> float:
    """One of Polygraphy's statistics of an absdiff or reldiff array, as a Python float."""
    with np.errstate(all="ignore"):
        if stat in ("max", "elemwise"):
            return 0.0 if x.size == 0 else float(np.amax(_cast_up(x)).item())
        if stat == "mean":  # nan for an empty output, as np.mean says (with a warning)
            return math.nan if x.size == 0 else float(np.mean(x, dtype=np.float32))
        if stat == "median":
            return 0.0 if x.size == 0 else float(np.median(_cast_up(x)))
        if stat == "quantile":
            return math.inf if x.size == 0 else float(np.quantile(x, q))
    raise ValueError(f"unknown statistic {stat!r}")


def _exceeds(value: float, tol: float) -> bool:
    """polygraphy.comparator.compare._simple_stat_failed."""
    return math.isnan(value) or value > tol


def score(stat: str, q: float, ref: np.ndarray, got: np.ndarray, rtol: float, atol: float
          ) -> tuple[float, float, bool, tuple]:
    """(absdiff statistic, atol, passed, detail: reldiff statistic, rtol[, quantile, mismatches])."""
    absdiff, reldiff = diffs(ref, got)
    a, r = statistic(stat, absdiff, q), statistic(stat, reldiff, q)
    detail: list[tuple[str, float]] = [("rel", r), ("rtol", rtol)]
    if stat == "quantile":
        detail.append(("quantile", q))
    if stat == "elemwise":
        with np.errstate(invalid="ignore"):
            bad = ((np.greater(absdiff, atol) | np.isnan(absdiff))
                   & (np.greater(reldiff, rtol) | np.isnan(reldiff)))
        mismatches = int(np.count_nonzero(bad))
        detail.append(("mismatches", float(mismatches)))
        return a, atol, mismatches == 0, tuple(detail)
    return a, atol, not (_exceeds(a, atol) and _exceeds(r, rtol)), tuple(detail)


def _parse_stat(name: str):
    def parse(args: Sequence[str]) -> tuple:
        if len(args) > (1 if name == "quantile" else 0):
            raise ValueError(f"{name} takes no arguments here (the quantile: --error-quantile)")
        return (name, DEFAULT_QUANTILE)
    return parse


def _entry(name: str) -> Entry:
    return Entry(
        name, "stat", name,
        {"max": "max|d| <= atol or max(|d|/|ref|) <= rtol (Polygraphy's max)",
         "mean": "mean|d| <= atol or mean(|d|/|ref|) <= rtol (Polygraphy's mean)",
         "median": "median|d| <= atol or median(|d|/|ref|) <= rtol (Polygraphy's median)",
         "quantile": "the --error-quantile Q of |d| <= atol or of |d|/|ref| <= rtol",
         "elemwise": "every element: |d| <= atol or |d|/|ref| <= rtol (Polygraphy's default)",
         }[name],
        _parse_stat(name),
        lambda args, ref, got, rtol, atol: score(args[0], args[1], ref, got, rtol, atol),
        polygraphy=lambda args: {"check_error_stat": args[0],
                                 **({"error_quantile": repr(float(args[1]))}
                                    if args[0] == "quantile" else {})},
    )


STAT_ENTRIES = {name: register(_entry(name)) for name in STATISTICS}
