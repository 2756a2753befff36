"""Task-level metrics (`--metric`): how a deployment engineer judges an output, not by its
single worst element.

- `cosine:MIN` and `snr:DB` are Polygraphy 0.53.6's `--compare cosine_similarity` and
  `--compare snr`, computed as its CosineSimilarityCompareFunc and SnrCompareFunc compute them
  (polygraphy/comparator/compare.py `_compute_metric`, output0 = the candidate, output1 = the
  FP32 reference), so commands.sh can hand them to Polygraphy and the verdicts agree
  (tests/judge/test_criteria_polygraphy.py). Polygraphy's SNR takes the candidate's power as the
  signal: 10*log10(mean(fp16^2) / mean((fp16 - fp32)^2)).
- `topk:K[:AXIS][:RATE]`: the fraction of rows (every position of the other axes) whose top-K
  index set along AXIS (default -1) is the same in both; passes at RATE (default 1.0: every
  row). Ties are broken by index (a stable sort), the same way on both sides; a row where the
  candidate is non-finite and FP32 is not counts as a mismatch.
- `iou:THRESHOLD:MIN`: both maps binarized at value > THRESHOLD (as DB-style text detectors and
  segmentation heads threshold their probability maps); passes when |A & B| / |A | B| >= MIN
  (1 when both are empty). A non-finite candidate value where FP32 is finite fails it.

Polygraphy has no IoU, and its `indices` comparison needs a Top-K post-processing step with
other semantics (order within K, an index tolerance), so `iou` and `topk` are judged only by
`trtbisect check` (commands.sh says so).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .criteria import REGISTRY, Entry, register
from .stats import _cast_up


def _floats(args: Sequence[str], names: Sequence[str], least: int) -> list[float]:
    if not least <= len(args) <= len(names):
        want = ":".join(names[:least]) + "".join(f"[:{n}]" for n in names[least:])
        raise ValueError(f"expected {want}, got {len(args)} argument(s)")
    out = []
    for name, a in zip(names, args):
        x = float(a)
        if not math.isfinite(x):
            raise ValueError(f"{name} must be a finite number, got {a!r}")
        out.append(x)
    return out


# ---------------------------------------------------------------- cosine (Polygraphy's)

# polygraphy.util.array.power converts its exponent to an array (`dispatch(num_arrays=2)`),
# so x**2 of a float32 array is float64 there: the squares and their sums are float64 while
# the dot product stays in the outputs' type.
TWO = np.asarray(2)


def cosine(ref: np.ndarray, got: np.ndarray) -> float:
    """polygraphy CosineSimilarityCompareFunc._compute_metric(candidate, reference)."""
    a1, a2 = np.ravel(_cast_up(np.asarray(got))), np.ravel(_cast_up(np.asarray(ref)))
    with np.errstate(all="ignore"):
        dot = np.sum(np.multiply(a1, a2))
        m1 = np.sqrt(np.sum(np.power(a1, TWO)))
        m2 = np.sqrt(np.sum(np.power(a2, TWO)))
        if m1 == 0 and m2 == 0:
            return 1.0
        if m1 == 0 or m2 == 0:
            return 0.0
        value = float(dot / (m1 * m2))
    if math.isnan(value):
        return value
    return max(-1.0, min(1.0, value))


def _parse_cosine(args: Sequence[str]) -> tuple:
    (least,) = _floats(args, ["MIN"], 1)
    if not -1 <= least <= 1:
        raise ValueError(f"MIN is a cosine similarity in [-1, 1], got {least:g}")
    return (least,)


def _cosine_score(args: tuple, ref, got, rtol, atol) -> tuple:
    value = cosine(ref, got)
    return value, args[0], value >= args[0], ()


COSINE = register(Entry(
    "cosine", "metric", "cosine:MIN",
    "cosine similarity of the output to FP32 >= MIN (Polygraphy's cosine_similarity), e.g. "
    "cosine:0.999",
    _parse_cosine, _cosine_score, higher_is_better=True,
    polygraphy=lambda args: {"compare": "cosine_similarity",
                             "cosine_similarity_threshold": repr(float(args[0]))},
))


# ---------------------------------------------------------------- SNR (Polygraphy's)

def snr(ref: np.ndarray, got: np.ndarray) -> float:
    """polygraphy SnrCompareFunc._compute_metric(candidate, reference), in dB."""
    a1, a2 = _cast_up(np.asarray(got)), _cast_up(np.asarray(ref))
    with np.errstate(all="ignore"):
        signal = np.mean(np.power(a1, TWO))
        noise = np.mean(np.power(np.array(a1 - a2), TWO))
        if noise == 0:
            return math.inf
        if signal == 0:
            return -math.inf
        return float(10 * np.log10(float(signal / noise)))


def _parse_snr(args: Sequence[str]) -> tuple:
    return tuple(_floats(args, ["DB"], 1))


def _snr_score(args: tuple, ref, got, rtol, atol) -> tuple:
    value = snr(ref, got)
    return value, args[0], value >= args[0], ()


SNR = register(Entry(
    "snr", "metric", "snr:DB",
    "signal-to-noise ratio >= DB decibels (Polygraphy's snr), e.g. snr:40",
    _parse_snr, _snr_score, higher_is_better=True, unit="dB",
    fits=lambda args, ref: "SNR of an empty output is undefined" if ref.size == 0 else None,
    polygraphy=lambda args: {"compare": "snr", "snr_threshold": repr(float(args[0]))},
))


# ---------------------------------------------------------------- top-K

def _parse_topk(args: Sequence[str]) -> tuple:
    if not 1 <= len(args) <= 3:
        raise ValueError(f"expected K[:AXIS][:RATE], got {len(args)} argument(s)")
    try:
        k = int(args[0])
        axis = int(args[1]) if len(args) > 1 else -1
    except ValueError:
        raise ValueError("K and AXIS are integers (a rate needs the axis too: "
                         "topk:5:-1:0.9)") from None
    if k < 1:
        raise ValueError(f"K must be at least 1, got {k}")
    rate = float(args[2]) if len(args) > 2 else 1.0
    if not 0 < rate <= 1:
        raise ValueError(f"RATE is a fraction of rows in (0, 1], got {args[2]}")
    return (k, axis, rate)


def _topk_fits(args: tuple, ref: np.ndarray) -> str | None:
    k, axis, _ = args
    if ref.ndim == 0:
        return "top-K needs an axis to rank along; this output is a scalar"
    if not -ref.ndim <= axis < ref.ndim:
        return f"axis {axis} is out of range for {ref.ndim} dimension(s)"
    if ref.shape[axis] < k:
        return f"axis {axis} holds {ref.shape[axis]} value(s), fewer than K = {k}"
    return None


def topk_sets(x: np.ndarray, k: int, axis: int) -> np.ndarray:
    """The sorted indices of the K largest values along `axis` (ties: lower index first),
    one row per position of the other axes."""
    x = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)
    rows = x.reshape(-1, x.shape[-1])
    order = np.argsort(-rows, axis=-1, kind="stable")[:, :k]
    return np.sort(order, axis=-1)


def topk_agreement(ref: np.ndarray, got: np.ndarray, k: int, axis: int) -> tuple[float, int]:
    """(fraction of rows whose top-K sets match, rows)."""
    ref, got = np.asarray(ref), np.asarray(got)
    a, b = topk_sets(ref, k, axis), topk_sets(got, k, axis)
    same = np.all(a == b, axis=-1)
    broken = np.moveaxis(~np.isfinite(got.astype(np.float64)) & np.isfinite(
        ref.astype(np.float64)), axis, -1).reshape(len(same), -1).any(axis=-1)
    same &= ~broken
    return (float(np.count_nonzero(same)) / len(same) if len(same) else 1.0), len(same)


def _topk_score(args: tuple, ref, got, rtol, atol) -> tuple:
    k, axis, rate = args
    why = _topk_fits(args, np.asarray(ref))
    if why:
        from ..errors import TrtBisectError
        raise TrtBisectError(f"--metric topk:{k}:{axis}: {why}")
    value, rows = topk_agreement(ref, got, k, axis)
    return value, rate, value >= rate, (("rows", float(rows)),)


TOPK = register(Entry(
    "topk", "metric", "topk:K[:AXIS][:RATE]",
    "the fraction of rows whose top-K index set along AXIS (default -1) equals FP32's, at "
    "least RATE (default 1: every row), e.g. topk:1 for a classifier's top-1",
    _parse_topk, _topk_score, higher_is_better=True, fits=_topk_fits,
    why_not_polygraphy="Polygraphy's indices comparison (after --postprocess top-K) compares "
                       "ordered indices with an index tolerance, not top-K sets",
))


# ---------------------------------------------------------------- IoU of thresholded maps

def iou(ref: np.ndarray, got: np.ndarray, threshold: float) -> tuple[float, int, int]:
    """(IoU of the maps binarized at > threshold, FP32 pixels, candidate pixels); nan when
    the candidate is non-finite where FP32 is finite."""
    ref, got = np.asarray(ref, dtype=np.float64), np.asarray(got, dtype=np.float64)
    if not np.isfinite(got[np.isfinite(ref)]).all():
        return math.nan, 0, 0
    a, b = ref > threshold, got > threshold
    union = int(np.count_nonzero(a | b))
    inter = int(np.count_nonzero(a & b))
    return (inter / union if union else 1.0), int(np.count_nonzero(a)), int(np.count_nonzero(b))


def _parse_iou(args: Sequence[str]) -> tuple:
    threshold, least = _floats(args, ["THRESHOLD", "MIN"], 2)
    if not 0 <= least <= 1:
        raise ValueError(f"MIN is an IoU in [0, 1], got {least:g}")
    return (threshold, least)


def _iou_score(args: tuple, ref, got, rtol, atol) -> tuple:
    value, n_ref, n_got = iou(ref, got, args[0])
    return value, args[1], value >= args[1], (("threshold", args[0]),
                                              ("fp32_pixels", float(n_ref)),
                                              ("fp16_pixels", float(n_got)))


IOU = register(Entry(
    "iou", "metric", "iou:THRESHOLD:MIN",
    "IoU of the FP32 and FP16 maps binarized at > THRESHOLD, at least MIN (detection and "
    "segmentation maps), e.g. iou:0.3:0.98",
    _parse_iou, _iou_score, higher_is_better=True,
    why_not_polygraphy="Polygraphy has no IoU comparison",
))


def entries() -> dict[str, Entry]:
    """Every criterion's entry by name: the statistics (stats.py) and the metrics (this module)
    register theirs when imported, so a score read back from JSON finds its own
    (criteria.Score.from_json)."""
    return dict(REGISTRY)
