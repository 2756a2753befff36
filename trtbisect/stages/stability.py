"""How close a verdict is to flipping: the noise floor of the error, and plans inside it.

On a GPU, FP16 kernels may accumulate in a different order from one build (or run) to the
next, so the same plan can pass today and fail tomorrow. A plan whose margin to the tolerance
is smaller than that noise is not a plan one can ship.

The CPU emulator is deterministic, so repeating a run measures nothing but that (we check it
bit for bit and say so). What we can measure is the spread of the error when the inputs move
by about one FP16 rounding step: each float input is multiplied by (1 + jitter * N(0, 1)),
jitter = 2^-11 (FP16's unit roundoff) by default, and the FP32 reference is recomputed on the
same jittered input. Perturbations at rounding level are what a different accumulation order
does to the values a layer sees, so this spread is a proxy for the kernel noise floor, not a
measurement of it. Across the user's samples, the spread is reported separately.

The error of one output in one run is `ratio = max|fp16 - fp32| / bound` (the tolerance
bound, rtol * max|ref| + atol): the run passes when ratio <= 1 and nothing is non-finite.
A plan is flagged
  * `flips` when it passes on some runs and fails on others;
  * `fragile` when its margin to the tolerance (1 - ratio on the samples the search judged)
    is smaller than the noise (max - min of the ratio over the jittered copies of a sample).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..judge.compare import OutputError, Tolerance, compare_outputs
from ..judge.criteria import Judgement, Score
from ..result import StabilityRecord

Sample = dict[str, np.ndarray]
Run = Callable[[Sample], Mapping[str, np.ndarray]]
FP16_UNIT_ROUNDOFF = 2.0**-11


def ratio(e: OutputError | Score) -> float:
    """Error as a fraction of the tolerance bound; inf when non-finite or the bound is 0.
    Under another criterion than the default (judge/criteria.py), and for a `--check` hook's
    score, its severity: the same scale, 1 at the bound."""
    if isinstance(e, Score) or e.scores:
        return e.severity
    if e.nonfinite:
        return math.inf
    if e.bound > 0:
        return e.max_abs / e.bound
    return 0.0 if e.max_abs == 0 else math.inf


def jittered(sample: Sample, copies: int, rel: float, seed: int) -> list[Sample]:
    """`copies` versions of a sample with every float input moved by ~rel (ints untouched)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(copies):
        out.append({k: (v * (1 + rel * rng.standard_normal(v.shape))).astype(v.dtype)
                    if np.issubdtype(v.dtype, np.floating) else v for k, v in sample.items()})
    return out


@dataclass
class OutputSpread:
    """One output of one plan: its ratio on each sample (row) and jittered copy (column)."""

    output: str
    ratios: list[list[float]]  # [sample][copy]; copy 0 is the sample itself

    @property
    def judged(self) -> float:
        """What the search saw: the worst ratio over the unjittered samples."""
        return max(row[0] for row in self.ratios)

    @property
    def noise(self) -> float:
        return max(_range(row) for row in self.ratios)

    @property
    def sample_spread(self) -> float:
        return _range([row[0] for row in self.ratios])

    @property
    def margin(self) -> float:
        return 1.0 - self.judged

    @property
    def flips(self) -> bool:
        verdicts = {r <= 1.0 for row in self.ratios for r in row}
        return len(verdicts) == 2

    @property
    def fragile(self) -> bool:
        return self.flips or (math.isfinite(self.margin) and abs(self.margin) < self.noise)

    def to_json(self) -> dict:
        flat = [r for row in self.ratios for r in row]
        return {"judged_ratio": _j(self.judged), "min_ratio": _j(min(flat)),
                "max_ratio": _j(max(flat)), "noise": _j(self.noise),
                "sample_spread": _j(self.sample_spread), "margin": _j(self.margin),
                "flips": self.flips, "fragile": self.fragile}


def _range(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    if len(finite) != len(values):
        return 0.0 if not finite else math.inf
    return max(finite) - min(finite)


def _j(x: float) -> float | str:
    return float(f"{x:.6g}") if math.isfinite(x) else str(x)


@dataclass
class PlanStability:
    name: str
    fp32_nodes: int
    outputs: dict[str, OutputSpread] = field(default_factory=dict)

    @property
    def flips(self) -> bool:
        return any(o.flips for o in self.outputs.values())

    @property
    def fragile(self) -> bool:
        return any(o.fragile for o in self.outputs.values())

    def to_json(self) -> dict:
        return {"plan": self.name, "fp32_nodes": self.fp32_nodes, "flips": self.flips,
                "fragile": self.fragile,
                "outputs": {k: v.to_json() for k, v in self.outputs.items()}}


@dataclass
class Stability:
    runs: int  # jittered copies per sample, the sample itself included
    samples: int
    jitter: float
    deterministic: bool  # the same plan on the same input, twice: bit-identical
    plans: list[PlanStability]

    @property
    def flags(self) -> list[str]:
        out = [] if self.deterministic else ["nondeterministic: a rerun gave different outputs"]
        for p in self.plans:
            for name, o in p.outputs.items():
                if o.flips:
                    out.append(f"{p.name}: {name} passes on some runs and fails on others")
                elif o.fragile:
                    out.append(f"{p.name}: {name} margin {o.margin:.3g} of the tolerance is "
                               f"within the noise {o.noise:.3g}")
        return out

    def to_json(self) -> dict:
        return {"runs": self.runs, "samples": self.samples, "jitter": self.jitter,
                "deterministic": self.deterministic, "flags": self.flags,
                "plans": [p.to_json() for p in self.plans],
                "method": "error ratio (max|d| / tolerance bound) over each sample and "
                          f"{self.runs - 1} copies jittered by {self.jitter:.3g} relative"}

    def record(self) -> StabilityRecord:
        """The frozen record a result keeps (result.StabilityRecord): its `to_json` is this
        measurement's, byte for byte."""
        return StabilityRecord.from_json(self.to_json())


def guard_memory(samples: Sequence[Sample], references: Sequence[Mapping[str, np.ndarray]],
                 runs: int) -> None:
    """Refuse up front what `measure_stability` could not hold: it keeps every jittered copy
    of every sample, and their reference outputs, at once."""
    from ..base.limits import memory_limit
    from ..errors import TrtBisectError

    held = runs * (sum(a.nbytes for s in samples for a in s.values())
                   + sum(np.asarray(a).nbytes for r in references for a in r.values()))
    if held > memory_limit():
        raise TrtBisectError(f"--stability {runs} would hold {held / 2**30:.3g} GiB of jittered "
                             "samples and their outputs, more than half of this machine's memory; "
                             "give a smaller N or fewer samples")


def measure_stability(reference: Run, candidate: Callable[[frozenset[str], Sample], Mapping],
                      plans: Mapping[str, frozenset[str]], samples: Sequence[Sample],
                      tol: Tolerance, runs: int, jitter: float = FP16_UNIT_ROUNDOFF,
                      seed: int = 0,
                      judge: Callable[[Mapping, Mapping, Sample], Judgement] | None = None
                      ) -> Stability:
    """Run every plan on each sample and `runs - 1` jittered copies; the spread is the noise.
    `judge(ref, got, sample)`: the run's criteria (default: the tolerance's), per output and
    per `--check` hook (a row of its own: `--check`, `--check #2`, ...)."""
    judge = judge or (lambda ref, got, sample: Judgement(compare_outputs(ref, got, tol)))
    variants = [[s, *jittered(s, max(runs - 1, 0), jitter, seed + k)]
                for k, s in enumerate(samples)]
    refs = [[dict(reference(v)) for v in row] for row in variants]
    result = []
    for name, plan in plans.items():
        spreads: dict[str, list[list[float]]] = {}
        for row, ref_row in zip(variants, refs):
            errs = [_rows(judge(r, candidate(plan, v), v)) for v, r in zip(row, ref_row)]
            for out in errs[0]:
                spreads.setdefault(out, []).append([ratio(e[out]) for e in errs])
        result.append(PlanStability(name, len(plan),
                                    {k: OutputSpread(k, v) for k, v in spreads.items()}))
    first = next(iter(plans.values()), frozenset())
    return Stability(runs, len(samples), jitter, _repeatable(candidate, first, samples[0]), result)


def _rows(j: Judgement) -> dict[str, OutputError | Score]:
    """What the stability table shows of one judgement: each output, then each hook."""
    hooks = {("--check" if len(j.scores) == 1 else f"--check #{k + 1}"): s
             for k, s in enumerate(j.scores)}
    return {**j.errors, **hooks}


def _repeatable(candidate: Callable[[frozenset[str], Sample], Mapping], plan: frozenset[str],
                sample: Sample) -> bool:
    a, b = candidate(plan, sample), candidate(plan, sample)
    return all(np.array_equal(np.asarray(a[k]), np.asarray(b[k]), equal_nan=True) for k in a)
