"""Numeric comparison of a candidate run against the FP32 reference (numpy only).

The tolerance defaults live here and nowhere else.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .precision import Precision

FP16_MAX = 65504.0
FP16_TINY = 2.0**-24  # smallest positive subnormal
DEFAULT_RTOL = 1e-2
DEFAULT_ATOL = 0.0


@dataclass(frozen=True)
class Tolerance:
    """Per-output criterion: finite where FP32 is finite and max|d| <= rtol*max|ref| + atol."""

    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL
    per_output: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    # per output, a cap on the bound: where a search aims inside the user's bound by the
    # spread of what the tools compute (stages/spread.py); never set by the user
    ceiling: Mapping[str, float] = field(default_factory=dict)

    def for_output(self, name: str) -> tuple[float, float]:
        return self.per_output.get(name, (self.rtol, self.atol))

    def ceiling_for(self, name: str) -> float:
        return self.ceiling.get(name, math.inf)

    def to_json(self) -> dict:
        d = {"rtol": self.rtol, "atol": self.atol,
             "per_output": {k: list(v) for k, v in self.per_output.items()}}
        if self.ceiling:  # an aimed search's: the user's own tolerance has none
            d["ceiling"] = {k: _json_float(v) for k, v in self.ceiling.items()}
        return d


def validate_tolerance(tol: Tolerance, output_names: Sequence[str]) -> None:
    """Refuse what would be silently ignored or meaningless: a per-output tolerance naming no
    graph output, a negative or NaN bound."""
    from ..errors import TrtBisectError

    bounds = [("--rtol", tol.rtol), ("--atol", tol.atol)] + [
        (f"--output-tol {name}", v) for name, pair in tol.per_output.items() for v in pair]
    for what, value in bounds:
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise TrtBisectError(f"{what}: {value} is not a finite, non-negative number")
    unknown = [name for name in tol.per_output if name not in output_names]
    if unknown:
        raise TrtBisectError(f"--output-tol {unknown[0]!r} names no output of the model; its "
                             f"outputs: {', '.join(output_names)}")


@dataclass(frozen=True)
class OutputError:
    """How far one output of a candidate run is from the reference.

    The numbers are always those of the default criterion (`bound`: rtol*max|ref| + atol);
    `passed` is the output's verdict under the run's criteria, and `scores` the results of
    the criteria other than the default (judge/criteria.py), empty under the default."""

    max_abs: float
    bound: float
    rel: float  # max|d| / max|ref|
    mean_abs: float
    p99_abs: float
    cosine: float
    nonfinite: int  # candidate non-finite where the reference is finite
    passed: bool
    scores: tuple = ()  # judge.criteria.Score, one per criterion judging this output
    # over several samples (`worst`): the user's number of the sample whose max|d| this is,
    # and of the sample whose bound is the smallest (the one the renderings write)
    sample: int | None = None
    bound_sample: int | None = None

    def to_json(self) -> dict:
        d = {k: _json_float(v) for k, v in vars(self).items()
             if k != "scores" and not (k in ("sample", "bound_sample") and v is None)}
        if self.scores:
            d["scores"] = [s.to_json() for s in self.scores]
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any], scores: tuple = ()) -> OutputError:
        """Back from its `to_json` (a non-finite number written as text is a float again);
        `scores`: its "scores" read back (criteria.error_from_json, which knows them)."""
        def f(k: str) -> float:
            return from_json_float(d[k])
        return cls(f("max_abs"), f("bound"), f("rel"), f("mean_abs"), f("p99_abs"), f("cosine"),
                   d["nonfinite"], d["passed"], scores, d.get("sample"), d.get("bound_sample"))

    def max_text(self, fmt: Callable[[float], str] = lambda x: f"{x:.3g}") -> str:
        """The default criterion's numbers as every place says them: "max|d| 0.0055 on
        sample 2 (bound 0.0643 of sample 0)" over several samples (`worst`), "max|d| 0.0055
        (bound 0.0643)" for one."""
        if self.sample is None:
            return f"max|d| {fmt(self.max_abs)} (bound {fmt(self.bound)})"
        of = "" if self.bound_sample is None else f" of sample {self.bound_sample}"
        return f"max|d| {fmt(self.max_abs)} on sample {self.sample} (bound {fmt(self.bound)}{of})"

    @property
    def scores_text(self) -> str:
        """The criteria's results as the tables say them ("cosine:0.5: 0 (need >= 0.5)");
        empty under the default criterion."""
        return "; ".join(s.text() for s in self.scores)

    @property
    def severity(self) -> float:
        """How badly it misses (above 1: fails): under the default criterion the relative
        error, else the worst of its criteria's (judge/criteria.py `Score.severity`)."""
        if not self.scores:
            return self.rel
        return max(s.severity for s in self.scores)


def _json_float(v):
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def from_json_float(v: float | int | str) -> float:
    """A number as `_json_float` (or criteria's `_num`) wrote it: "inf", "-inf" and "nan" are
    floats again (NaN as math.nan, the one NaN the judge itself writes)."""
    if isinstance(v, str):
        x = float(v)
        return math.nan if math.isnan(x) else x
    return v


def round_fp16(x: np.ndarray) -> np.ndarray:
    """What an FP16 store does to a float32 array (RNE, overflow to inf)."""
    with np.errstate(over="ignore"):
        return x.astype(np.float16).astype(np.float32)


@dataclass(frozen=True)
class _Diff:
    """What every comparison starts from, in a few passes over the data: the flattened
    arrays and their float64 copies, their finiteness, |ref|, max|ref| over its finite values,
    and |got - ref| in float64 where ref is finite (a non-finite difference counts as inf).
    The masks for non-finite values are applied only where there are any."""

    ref: np.ndarray
    got: np.ndarray
    ref64: np.ndarray
    got64: np.ndarray
    finite_ref: np.ndarray
    finite_got: np.ndarray
    all_ref: bool  # every value finite
    all_got: bool
    ref_mag: np.ndarray
    ref_max: float
    diff: np.ndarray

    @classmethod
    def of(cls, ref: np.ndarray, got: np.ndarray) -> _Diff:
        ref, got = np.asarray(ref), np.asarray(got)
        if ref.shape != got.shape:
            raise ValueError(f"shape mismatch {got.shape} vs reference {ref.shape}")
        ref, got = ref.ravel(), got.ravel()
        finite_ref, finite_got = np.isfinite(ref), np.isfinite(got)
        all_ref, all_got = bool(finite_ref.all()), bool(finite_got.all())
        ref_mag = np.abs(ref)
        ref_max = float(ref_mag.max(initial=0.0) if all_ref
                        else ref_mag.max(initial=0.0, where=finite_ref))
        ref64, got64 = ref.astype(np.float64), got.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(got64 - ref64)
        if not (all_ref and all_got):  # a difference of finite floats is finite in float64
            diff[~np.isfinite(diff)] = np.inf
            if not all_ref:
                diff = diff[finite_ref]
        return cls(ref, got, ref64, got64, finite_ref, finite_got, all_ref, all_got, ref_mag,
                   ref_max, diff)

    @property
    def max_abs(self) -> float:
        return float(self.diff.max(initial=0.0))

    @property
    def mean_abs(self) -> float:
        return float(self.diff.mean()) if self.diff.size else 0.0

    def rel(self, max_abs: float) -> float:
        if self.ref_max > 0:
            return max_abs / self.ref_max
        return 0.0 if max_abs == 0 else float("inf")

    def cosine(self) -> float:
        """Over the positions where both are finite; NaN (no agreement to measure) where the
        candidate is non-finite and FP32 is not: an all-inf output is not `cosine 1.0`, as
        its finite positions alone (none) would say."""
        if self.all_ref and self.all_got:
            return _cosine64(self.ref64, self.got64)
        if not self.all_got and bool(np.any(self.finite_ref & ~self.finite_got)):
            return math.nan
        both = self.finite_ref & self.finite_got
        return _cosine64(self.ref64[both], self.got64[both])


def compare_output(ref: np.ndarray, got: np.ndarray, rtol: float, atol: float,
                   ceiling: float = math.inf) -> OutputError:
    """`got` against `ref`. An output whose shape depends on the data (Unique, NonZero) may
    come out of another shape: that is itself a difference, an infinite error that fails."""
    if np.shape(ref) != np.shape(got):
        return shape_changed(ref, rtol, atol, ceiling)
    d = _Diff.of(ref, got)
    bad = 0 if d.all_got else int(np.count_nonzero(d.finite_ref & ~d.finite_got))
    bound = min(rtol * d.ref_max + atol, ceiling)
    max_abs = d.max_abs
    with np.errstate(invalid="ignore"):
        p99 = float(np.percentile(d.diff, 99)) if d.diff.size else 0.0
    passed = bad == 0 and max_abs <= bound
    return OutputError(max_abs, bound, d.rel(max_abs), d.mean_abs, p99, d.cosine(), bad, passed)


def shape_changed(ref: np.ndarray, rtol: float, atol: float,
                  ceiling: float = math.inf) -> OutputError:
    """The error of an output computed in another shape than the reference's: infinite, and
    failing under every criterion (no element of one corresponds to an element of the other)."""
    r = np.asarray(ref, np.float64).ravel()
    finite = r[np.isfinite(r)]
    bound = min(rtol * float(np.abs(finite).max(initial=0.0)) + atol, ceiling)
    return OutputError(math.inf, bound, math.inf, math.inf, math.inf, math.nan, 0, False)


def _cosine64(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two finite float64 vectors (1 when both are zero)."""
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return float(np.dot(a, b) / (na * nb))


def compare_outputs(
    ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], tol: Tolerance
) -> dict[str, OutputError]:
    result = {}
    for name, r in ref.items():
        rtol, atol = tol.for_output(name)
        result[name] = compare_output(r, got[name], rtol, atol, tol.ceiling_for(name))
    return result


def pressure(errors: Iterable[Mapping[str, OutputError]]) -> dict[str, float]:
    """Per output, its worst pressure over the samples' errors: max|d| over its bound under
    the default criterion, else its criteria's severity; 1 at the bound either way, a NaN or
    an infinite error infinite (the search's own noise is measured in it: search/noise.py)."""
    out: dict[str, float] = {}
    for per_output in errors:
        for o, e in per_output.items():
            if e.scores:
                p = e.severity
            elif e.bound > 0:
                p = e.max_abs / e.bound
            else:
                p = 0.0 if e.max_abs == 0 else math.inf
            out[o] = max(out.get(o, -math.inf), p if p == p else math.inf)  # NaN: worst
    return out


def worst(errors: Iterable[Mapping[str, OutputError]],
          numbers: Sequence[int] | None = None) -> dict[str, OutputError]:
    """Per output, one record over several samples, the one every place shows (the console's
    table, `check`, precision.json, the report, the certificate, the renderings):

    - under the default criterion: the largest max|d| over the samples (`sample`: whose),
      against the smallest bound over them (`bound_sample`: whose), the bound the renderings
      write, since Polygraphy takes one --atol per output for every sample; `passed` is the
      judge's (every sample within its own bound), rel, mean, p99 and non-finite count the
      largest, cosine the smallest;
    - under other criteria: the worst sample's record (failures first, then the largest
      severity), with its `sample`.

    `numbers`: the user's number of each sample (default 0, 1, ...)."""
    per: dict[str, list[tuple[int, OutputError]]] = {}
    for k, sample in enumerate(errors):
        n = numbers[k] if numbers is not None else k
        for name, e in sample.items():
            per.setdefault(name, []).append((n, e))
    out: dict[str, OutputError] = {}
    for name, es in per.items():
        if len(es) == 1:  # one sample: its number said only when it is one of several
            out[name] = es[0][1] if numbers is None else replace(es[0][1], sample=es[0][0])
        elif any(e.scores for _, e in es):
            n, e = min(es, key=lambda p: (p[1].passed, -p[1].severity))
            out[name] = replace(e, sample=n)
        else:
            out[name] = _over_samples(es)
    return out


def _over_samples(es: Sequence[tuple[int, OutputError]]) -> OutputError:
    """Default-criterion records of one output over samples (`worst`)."""
    def big(v: float) -> float:  # nan counts as the largest (it fails)
        return math.inf if v != v else v
    n_max, top = max(es, key=lambda p: big(p[1].max_abs))  # the first of equals
    bounds = [(n, e.bound) for n, e in es if e.bound == e.bound]
    n_bound, bound = min(bounds, key=lambda p: p[1]) if bounds else (n_max, math.nan)
    cosines = [e.cosine for _, e in es]
    return OutputError(
        top.max_abs, bound, max((big(e.rel) for _, e in es)),
        max(big(e.mean_abs) for _, e in es), max(big(e.p99_abs) for _, e in es),
        math.nan if any(c != c for c in cosines) else min(cosines),
        max(e.nonfinite for _, e in es), all(e.passed for _, e in es), (), n_max, n_bound)


@dataclass
class TensorStats:
    """Statistics of one intermediate tensor, FP32 vs all-FP16; no tensor data is kept."""

    name: str
    producer: str | None
    fp32_absmax: float
    fp16_absmax: float
    max_abs_err: float
    rel_err: float
    mean_abs_err: float
    cosine: float
    fp32_nonfinite: int
    fp16_nonfinite: int
    overflow: int  # finite FP32 values whose FP16 rounding is inf
    flushed: int  # nonzero FP32 values whose FP16 rounding is zero
    size: int

    @property
    def new_nonfinite(self) -> bool:
        return self.fp16_nonfinite > self.fp32_nonfinite

    def to_json(self) -> dict:
        return {k: _json_float(v) for k, v in vars(self).items()}  # flat: no asdict deep copy

    @classmethod
    def from_json(cls, d: dict) -> TensorStats:
        text = ("name", "producer")  # every other string is a non-finite number ("inf", "nan")
        fields: dict[str, Any] = {k: (float(v) if isinstance(v, str) and k not in text else v)
                                  for k, v in d.items()}
        return cls(**fields)


FP16_OVERFLOW = 65520.0  # the smallest magnitude an FP16 store rounds to inf (RNE)
FP16_FLUSH = 2.0**-25  # the largest magnitude an FP16 store rounds to zero (RNE)


def tensor_stats(name: str, producer: str | None, ref: np.ndarray, got: np.ndarray,
                 precision: Precision | None = None) -> TensorStats:
    """The numbers of `compare_output` with zero tolerance, and what a store in the low
    precision (FP16 unless given) does to the reference (the layer-wise pass runs this on
    every stored tensor: no percentile). `overflow` and `flushed` count against that
    precision's range; the `fp16_*` fields hold the low-precision side whichever it is."""
    ref, got = np.asarray(ref, dtype=np.float32), np.asarray(got, dtype=np.float32)
    if ref.shape != got.shape:  # a data-dependent shape moved: an infinite difference
        r = ref.ravel()
        finite = np.isfinite(r)
        return TensorStats(name, producer, float(np.abs(r[finite]).max(initial=0.0)),
                           float(np.abs(got[np.isfinite(got)]).max(initial=0.0)), math.inf,
                           math.inf, math.inf, math.nan, int(r.size - finite.sum()),
                           int(got.size - np.isfinite(got).sum()), 0, 0, int(r.size))
    d = _Diff.of(ref, got)
    got_mag = np.abs(d.got)
    max_abs = d.max_abs
    overflow_at, flush_at = ((FP16_OVERFLOW, FP16_FLUSH) if precision is None
                             else (precision.overflow_at, precision.flush_at))
    big = d.ref_mag >= overflow_at
    return TensorStats(
        name=name,
        producer=producer,
        fp32_absmax=d.ref_max,
        fp16_absmax=float(got_mag.max(initial=0.0) if d.all_got
                          else got_mag.max(initial=0.0, where=d.finite_got)),
        max_abs_err=max_abs,
        rel_err=d.rel(max_abs),
        mean_abs_err=d.mean_abs,
        cosine=d.cosine(),
        fp32_nonfinite=0 if d.all_ref else int(d.ref.size - np.count_nonzero(d.finite_ref)),
        fp16_nonfinite=0 if d.all_got else int(d.got.size - np.count_nonzero(d.finite_got)),
        overflow=int(np.count_nonzero(big if d.all_ref else d.finite_ref & big)),
        flushed=int(np.count_nonzero((d.ref_mag > 0) & (d.ref_mag <= flush_at))),
        size=int(d.ref.size),
    )


def merge_stats(a: TensorStats, b: TensorStats) -> TensorStats:
    """Combine the statistics of one tensor over two samples (worst case of each field)."""
    return TensorStats(
        name=a.name, producer=a.producer,
        fp32_absmax=max(a.fp32_absmax, b.fp32_absmax),
        fp16_absmax=max(a.fp16_absmax, b.fp16_absmax),
        max_abs_err=max(a.max_abs_err, b.max_abs_err),
        rel_err=max(a.rel_err, b.rel_err),
        mean_abs_err=max(a.mean_abs_err, b.mean_abs_err),
        cosine=(math.nan if math.isnan(a.cosine) or math.isnan(b.cosine)
                else min(a.cosine, b.cosine)),
        fp32_nonfinite=max(a.fp32_nonfinite, b.fp32_nonfinite),
        fp16_nonfinite=max(a.fp16_nonfinite, b.fp16_nonfinite),
        overflow=max(a.overflow, b.overflow),
        flushed=max(a.flushed, b.flushed),
        size=a.size,
    )
