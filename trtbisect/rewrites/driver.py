"""FP16-safe graph rewrites, tried before any FP32 fallback (issue #13).

Every FP32 node costs engine speed; most diagnosed patterns (an out-of-range mask fill, a
decomposed norm, unscaled attention logits, a large sum) have a rewrite that keeps them in FP16.
A rewrite (see the rules beside it in trtbisect/rewrites/) matches a pattern and checks its preconditions on the
graph, or says why it does not apply (a Refusal). The driver then:

1. measures the rewrite's FP32 drift: rewritten FP32 model vs original FP32 model on every
   sample (onnxruntime CPU); above `drift_rtol` of an output's range it is refused, with the
   number;
2. asks the caller's judge, which runs the all-FP16 plan exactly like any plan, and keeps the
   rewrite when the judge passes it or when it improves the all-FP16 error (fewer failing
   outputs, fewer non-finite values, or at least 10% less excess error over the bound);
3. stops as soon as the all-FP16 rewritten model passes; the caller searches FP32 nodes for
   whatever is left.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from ..backends.ort import Reference
from ..graph import Graph
from ..judge.compare import OutputError, Tolerance
from .core import View
from .rules import REWRITES, Match, Refusal, Rewrite, RewriteRefused

log = logging.getLogger(__name__)

DEFAULT_DRIFT_RTOL = 1e-4  # FP32 drift allowed per output, as a fraction of max|reference|
IMPROVEMENT = 0.9  # a kept non-passing rewrite must cut the excess error to <= 90%
REWRITE_WEIGHT_LIMIT = 1 << 30  # rewrites work on one in-memory proto: models up to this size

Judge = Callable[[onnx.ModelProto], "tuple[bool, Mapping[str, OutputError]]"]
Sample = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Drift:
    """How far the rewritten FP32 model is from the original FP32 model (worst output)."""

    max_abs: float
    rel: float  # max_abs / max|reference| of that output
    output: str | None

    def to_json(self) -> dict:
        return {"max_abs": _num(self.max_abs), "rel": _num(self.rel), "output": self.output}

    @classmethod
    def from_json(cls, d: Mapping) -> Drift:
        return cls(_float(d["max_abs"]), _float(d["rel"]), d["output"])


@dataclass(frozen=True)
class Applied:
    """A rewrite kept in the model: what, where, why, and what it cost in FP32."""

    rewrite: str
    where: tuple[str, ...]
    why: str
    drift: Drift
    advice: str
    error_before: float  # all-FP16 worst relative output error before / after
    error_after: float

    def to_json(self) -> dict:
        return {"rewrite": self.rewrite, "where": list(self.where), "why": self.why,
                "fp32_drift": self.drift.to_json(), "advice": self.advice,
                "fp16_rel_error_before": _num(self.error_before),
                "fp16_rel_error_after": _num(self.error_after)}

    @classmethod
    def from_json(cls, d: Mapping) -> Applied:
        return cls(d["rewrite"], tuple(d["where"]), d["why"], Drift.from_json(d["fp32_drift"]),
                   d["advice"], _float(d["fp16_rel_error_before"]),
                   _float(d["fp16_rel_error_after"]))


@dataclass(frozen=True)
class RewritesRecord:
    """What `run --rewrite` did (precision.json's "rewrites"; `RewriteOutcome.record`): the
    rewrites kept, those refused and why, whether all-FP16 then passes, the judgements."""

    applied: list[Applied]
    refused: list[Refusal]
    all_fp16_passes: bool
    judgements: int

    def to_json(self) -> dict:
        return {"applied": [a.to_json() for a in self.applied],
                "refused": [r.to_json() for r in self.refused],
                "all_fp16_passes": self.all_fp16_passes, "judgements": self.judgements}

    @classmethod
    def from_json(cls, d: Mapping) -> RewritesRecord:
        return cls([Applied.from_json(a) for a in d["applied"]],
                   [Refusal(r["rewrite"], tuple(r["where"]), r["reason"]) for r in d["refused"]],
                   d["all_fp16_passes"], d["judgements"])


@dataclass
class RewriteOutcome:
    """The rewritten model (the input itself when nothing was kept) and the record of why."""

    model: onnx.ModelProto
    applied: list[Applied] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    passed: bool = False  # the rewritten model passes the judge in all-FP16
    errors: Mapping[str, OutputError] = field(default_factory=dict)
    judgements: int = 0

    def to_json(self) -> dict:
        """The `"rewrites"` entry of precision.json."""
        return {"applied": [a.to_json() for a in self.applied],
                "refused": [r.to_json() for r in self.refusals],
                "all_fp16_passes": self.passed, "judgements": self.judgements}

    def record(self) -> RewritesRecord:
        """The frozen record a result keeps: its `to_json` is this outcome's, and its numbers
        are those precision.json holds (6 significant digits)."""
        return RewritesRecord.from_json(self.to_json())


def _num(x: float) -> float | str:
    return float(f"{x:.6g}") if math.isfinite(x) else str(x)


def _float(x: float | str) -> float:
    """A number as `_num` wrote it (a non-finite one as a string) back as a float."""
    return float(x)


# ---------------------------------------------------------------- FP32 drift

def reference_outputs(model: onnx.ModelProto, samples: Sequence[Sample]) -> list[dict[str, np.ndarray]]:
    ref = Reference(Graph(model))
    return [ref.run(s) for s in samples]


def measure_drift(references: Sequence[Mapping[str, np.ndarray]], model: onnx.ModelProto,
                  samples: Sequence[Sample]) -> Drift:
    """The rewritten FP32 model against the original's FP32 outputs, worst over samples."""
    worst = Drift(0.0, 0.0, None)
    for ref, got in zip(references, reference_outputs(model, samples)):
        for name, r in ref.items():
            d = _output_drift(np.asarray(r, np.float64), np.asarray(got[name], np.float64), name)
            if d.rel > worst.rel or (d.rel == worst.rel and d.max_abs > worst.max_abs):
                worst = d
    return worst


def _output_drift(ref: np.ndarray, got: np.ndarray, name: str) -> Drift:
    if ref.shape != got.shape:
        return Drift(math.inf, math.inf, name)
    finite = np.isfinite(ref)
    if not np.array_equal(finite, np.isfinite(got)) or not np.array_equal(ref[~finite], got[~finite]):
        return Drift(math.inf, math.inf, name)
    diff = float(np.max(np.abs(got[finite] - ref[finite]), initial=0.0))
    scale = float(np.max(np.abs(ref[finite]), initial=0.0))
    return Drift(diff, diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf), name)


def tensor_ranges(model: onnx.ModelProto, samples: Sequence[Sample]) -> dict[str, float]:
    """FP32 max|value| of every float tensor over the samples (one run per sample)."""
    graph = Graph(model)
    names = list(dict.fromkeys(t for n in model.graph.node for t in n.output if graph.is_float(t)))
    ref = Reference(graph)
    out: dict[str, float] = {}
    for sample in samples:
        values = {**{k: np.asarray(v) for k, v in sample.items()},
                  **ref.run_tensors(sample, names)}
        for name, v in values.items():
            if v.dtype.kind == "f" and v.size:
                finite = np.abs(v[np.isfinite(v)])
                out[name] = max(out.get(name, 0.0), float(finite.max(initial=0.0)))
    return out


class _LazyRanges:
    """Tensor ranges of one model, computed on first use (most rules never ask)."""

    def __init__(self, model: onnx.ModelProto, samples: Sequence[Sample],
                 given: Mapping[str, float] | None) -> None:
        self.model, self.samples, self.given = model, samples, given or {}
        self._ranges: dict[str, float] | None = None

    def __call__(self, tensor: str) -> float | None:
        if tensor in self.given:
            return self.given[tensor]
        if self._ranges is None:
            self._ranges = tensor_ranges(self.model, self.samples)
        return self._ranges.get(tensor)


# ---------------------------------------------------------------- the driver

def find_all(model: onnx.ModelProto, ranges: Callable[[str], float | None] | None = None,
             rewrites: Sequence[Rewrite] = REWRITES) -> tuple[list[Match], list[Refusal]]:
    """Every match and near miss of every rewrite, matches in the rewrites' order."""
    matches: list[Match] = []
    refusals: list[Refusal] = []
    with View.shared(model):
        for rw in rewrites:
            for item in rw.find(model, ranges):
                if isinstance(item, Match):
                    matches.append(item)
                else:
                    refusals.append(item)
    return matches, refusals


NOT_ENOUGH = "all-FP16 error did not improve enough"


def try_rewrites(model: onnx.ModelProto, samples: Sequence[Sample], judge: Judge,
                 groups: Iterable[Any] | None = None, rewrites: Sequence[Rewrite] = REWRITES,
                 drift_rtol: float = DEFAULT_DRIFT_RTOL,
                 ranges: Mapping[str, float] | None = None,
                 references: Sequence[Mapping[str, np.ndarray]] | None = None,
                 initial: tuple[bool, dict[str, OutputError]] | None = None) -> RewriteOutcome:
    """Apply the rewrites that make the all-FP16 model pass (or get closer), one at a time.

    `judge(model) -> (passed, errors per output)` must judge the all-FP16 plan of the model
    exactly like the search judges a plan (same emulator, criterion and samples, compared with
    the ORIGINAL model's FP32 reference). `groups`: diagnose.py culprit groups (dicts or
    CulpritGroup); matches touching them, or whose rewrite addresses their pattern, go first.
    `ranges`: known FP32 max|value| per tensor (e.g. layer-wise stats), else computed.
    `references`: the model's FP32 outputs per sample, and `initial`: `judge(model)`, when the
    caller has them already (else computed).
    """
    if references is None:
        references = reference_outputs(model, samples)
    passed, errors = judge(model) if initial is None else initial
    out = RewriteOutcome(model, passed=passed, errors=errors, judgements=int(initial is None))
    by_name = {rw.name: rw for rw in rewrites}
    tried: set[tuple[str, tuple[str, ...]]] = set()
    refused: dict[tuple[str, tuple[str, ...], str], Refusal] = {}
    groups = list(groups or [])
    while not out.passed:
        matches, near = find_all(out.model, _LazyRanges(out.model, samples, ranges), rewrites)
        for r in near:
            refused.setdefault((r.rewrite, r.where, r.reason), r)
        todo = [m for m in sorted(matches, key=lambda m: _priority(m, rewrites, groups))
                if (m.rewrite, m.where) not in tried]
        if not any(_try(out, m, by_name[m.rewrite], samples, judge, references, drift_rtol,
                        tried, refused) for m in todo):
            break
        # a kept rewrite can make one that did not help alone the one that is still needed
        # (deep models with several overflowing norms): those are tried again
        tried -= {(r, w) for r, w, why in refused if why.startswith(NOT_ENOUGH)}
    kept = {(a.rewrite, a.where) for a in out.applied}
    out.refusals = [r for r in refused.values() if (r.rewrite, r.where) not in kept]
    return out


def _try(out: RewriteOutcome, match: Match, rw: Rewrite, samples: Sequence[Sample],
         judge: Judge, references: Sequence[Mapping[str, np.ndarray]], drift_rtol: float,
         tried: set, refused: dict) -> bool:
    """Try one match; on success update `out` and return True, else record why not."""
    tried.add((match.rewrite, match.where))

    def refuse(reason: str) -> bool:
        refused[(match.rewrite, match.where, reason)] = Refusal(match.rewrite, match.where, reason)
        log.info("rewrite %s at %s refused: %s", match.rewrite, ", ".join(match.where), reason)
        return False

    try:
        candidate = rw.apply(out.model, match)
    except RewriteRefused as exc:
        return refuse(str(exc))
    except onnx.checker.ValidationError as exc:
        return refuse(f"the rewritten model is not valid ONNX: {str(exc).splitlines()[0]}")
    if not same_interface(out.model, candidate):
        return refuse("the rewrite would change the graph's input or output names or types")
    drift = measure_drift(references, candidate, samples)
    if not drift.rel <= drift_rtol:
        return refuse(f"FP32 drift {drift.rel:.3g} of {drift.output}'s range (max abs "
                      f"{drift.max_abs:.3g}) exceeds the tolerance {drift_rtol:g}")
    passed, errors = judge(candidate)
    out.judgements += 1
    before, after = worst_rel(out.errors), worst_rel(errors)
    if not (passed or _better(_score(errors), _score(out.errors))):
        return refuse(f"{NOT_ENOUGH} (worst rel {before:.3g} -> "
                      f"{after:.3g}, {_failing(errors)} output(s) failing)")
    out.applied.append(Applied(match.rewrite, match.where, match.why, drift, rw.advice,
                               before, after))
    out.model, out.passed, out.errors = candidate, passed, errors
    log.info("rewrite %s at %s kept (FP32 drift %.3g, all-FP16 error %.3g -> %.3g)",
             match.rewrite, ", ".join(match.where), drift.rel, before, after)
    return True


def _priority(match: Match, rewrites: Sequence[Rewrite], groups: Sequence[Any]) -> tuple:
    order = next(i for i, rw in enumerate(rewrites) if rw.name == match.rewrite)
    patterns = next(rw.patterns for rw in rewrites if rw.name == match.rewrite)
    for k, grp in enumerate(groups):
        nodes = set(_field(grp, "nodes") or [])
        if nodes & set(match.where):
            return (0, k, order)
        if _field(grp, "pattern") in patterns:
            return (1, k, order)
    return (2, 0, order)


def _field(grp: Any, name: str) -> Any:
    return grp.get(name) if isinstance(grp, Mapping) else getattr(grp, name, None)


def _failing(errors: Mapping[str, OutputError]) -> int:
    return sum(1 for e in errors.values() if not e.passed)


def worst_rel(errors: Mapping[str, OutputError]) -> float:
    return max((math.inf if e.nonfinite else e.rel for e in errors.values()), default=0.0)


def _score(errors: Mapping[str, OutputError]) -> tuple[int, int, float]:
    """(failing outputs, their non-finite values, their summed excess over the bound)."""
    failed = [e for e in errors.values() if not e.passed]
    excess = sum(min(e.max_abs / e.bound, 1e30) if e.bound > 0 else 1e30 for e in failed)
    return len(failed), sum(e.nonfinite for e in failed), excess


def _better(new: tuple[int, int, float], old: tuple[int, int, float]) -> bool:
    if new[:2] != old[:2]:
        return new[:2] < old[:2]
    return new[2] <= IMPROVEMENT * old[2]


def same_interface(a: onnx.ModelProto, b: onnx.ModelProto) -> bool:
    """Same graph input and output names and element types, in the same order."""
    def sig(values: Iterable[onnx.ValueInfoProto]) -> list[tuple[str, int]]:
        return [(v.name, v.type.tensor_type.elem_type) for v in values]
    inits = {t.name for t in a.graph.initializer}
    return (sig(v for v in a.graph.input if v.name not in inits)
            == sig(v for v in b.graph.input if v.name not in inits)
            and sig(a.graph.output) == sig(b.graph.output))


# ---------------------------------------------------------------- a judge for tests and scripts

def emulator_judge(model: onnx.ModelProto, samples: Sequence[Sample],
                   tolerance: Tolerance | None = None) -> Judge:
    """Judge the all-FP16 plan on the CPU emulator against `model`'s FP32 reference.

    The pipeline supplies its own judge (journaled, strict mode); this one is for tests and
    scripts and uses the same emulator and criterion.
    """
    from ..backends.ort import Emulator
    from ..judge.compare import compare_outputs, worst

    tol = tolerance or Tolerance()
    references = reference_outputs(model, samples)

    def judge(candidate: onnx.ModelProto) -> tuple[bool, dict[str, OutputError]]:
        emulator = Emulator(Graph(candidate))
        errs = worst([compare_outputs(r, emulator.run(frozenset(), s), tol)
                      for r, s in zip(references, samples)])
        return all(e.passed for e in errs.values()), errs

    return judge
