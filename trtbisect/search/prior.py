"""The search prior: which nodes the layer-wise comparison already points at.

Seeds are nodes that read or write a value outside the FP16 range in the FP32 run (an overflow
chain runs from the node that first exceeds 65504 to the first node that brings values back;
every one of them rounds that value to inf in FP16; likewise a tensor that FP16 mostly flushes
to zero), plus nodes that read an initializer or Constant that FP16 cannot hold. The ranking orders every candidate from most to least
suspicious, so that a search that has to grow beyond the seeds grows in the right direction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from onnx import numpy_helper

from ..base.spill import release_pages
from ..graph import Graph
from ..judge.compare import TensorStats
from ..judge.precision import FP16, Precision
from ..judge.semantics import round_weight


@dataclass(frozen=True)
class ConstantStats:
    """Range facts of an initializer or Constant output, as a weight becomes FP16 under `rule`
    (semantics.round_weight: "inf" casts, "clamp" is TensorRT's conversion)."""

    name: str
    absmax: float
    overflow: int  # finite values beyond FP16's range (inf: they become inf; clamp: +-65504)
    flushed: int  # nonzero values the conversion turns into zero (none under clamp)
    rel_err: float  # max relative rounding error
    size: int = 0  # elements
    rule: str = "inf"
    raised: int = 0  # nonzero values below 2^-24 that the clamp raises to +-2^-24 (not zero)

    @property
    def too_small(self) -> int:
        """Nonzero values FP16 cannot hold: flushed to zero (inf rule) or raised (clamp)."""
        return self.flushed + self.raised


def constant_stats(graph: Graph, weight_rule: str = "inf",
                   precision: Precision = FP16) -> dict[str, ConstantStats]:
    """Range facts of every float constant of `graph`, converted to the low precision (FP16
    unless given) the way the judge converts weights (`weight_rule`), so diagnosis never says
    "inf" where TensorRT clamps."""
    out: dict[str, ConstantStats] = {}
    arrays = {name: graph.array(name) for name in graph.initializers}
    for node in graph.model.graph.node:
        if node.op_type == "Constant" and node.output and graph.is_float(node.output[0]):
            for a in node.attribute:
                if a.name == "value":
                    arrays[node.output[0]] = numpy_helper.to_array(a.t)
    for name, arr in arrays.items():
        if arr.dtype != np.float32:
            continue
        r = round_weight(arr, weight_rule, precision)
        finite = np.isfinite(arr)
        absmax = float(np.max(np.abs(arr[finite]), initial=0.0))
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            rel = np.abs(r.astype(np.float64) - arr) / max(absmax, 1e-30)
            beyond = np.isinf(r) if weight_rule == "inf" else np.abs(arr) > precision.max
        out[name] = ConstantStats(
            name, absmax,
            overflow=int(np.count_nonzero(finite & beyond)),
            flushed=int(np.count_nonzero((arr != 0) & (r == 0))),
            rel_err=float(np.nan_to_num(rel, nan=0.0, posinf=math.inf).max(initial=0.0)),
            size=int(arr.size), rule=weight_rule,
            raised=int(np.count_nonzero((arr != 0) & (np.abs(arr) < precision.tiny) & (r != 0))),
        )
        release_pages([arr])  # a memory-mapped weight: read once, not held
    return out


@dataclass(frozen=True)
class Prior:
    seeds: list[str]
    ranking: list[str]
    scores: dict[str, float]


SMALL_CONSTANT = 16  # elements: scalars, epsilons, per-head scales
FLUSH_SHARE = 100  # a weight tensor is suspect when 1 in this many of its values flushes


def out_of_range(stats: TensorStats | ConstantStats | None, precision: Precision = FP16) -> bool:
    """Beyond the low precision's range above (anything rounds to inf) or below (most of it
    flushes to 0)."""
    if stats is None:
        return False
    if stats.overflow > 0:
        return True
    if isinstance(stats, TensorStats):
        return stats.fp32_absmax > precision.max or 2 * stats.flushed >= max(stats.size, 1)
    # a constant: an epsilon or scale that flushes, or a tensor of which a real share does (a
    # few tiny values in a big weight matrix flush harmlessly in every FP16 model)
    small = stats.too_small  # flushed to zero, or raised to 2^-24 by TensorRT's conversion
    return small > 0 and (stats.size <= SMALL_CONSTANT or small * FLUSH_SHARE >= stats.size)


def too_small_to_ignore(stats: ConstantStats) -> bool:
    """A constant diagnosis blames for underflow: an epsilon-sized constant with a value FP16
    cannot hold, or a tensor most of whose values it cannot (a weight tensor with a few tiny
    values loses nothing that matters next to its own FP16 rounding; the prior, wider, still
    tries its readers early)."""
    return stats.too_small > 0 and (stats.size <= SMALL_CONSTANT
                                    or 2 * stats.too_small >= stats.size)


def build_prior(graph: Graph, stats: Mapping[str, TensorStats],
                constants: Mapping[str, ConstantStats], precision: Precision = FP16) -> Prior:
    cands = graph.candidates()
    scores: dict[str, float] = {}
    seeds: list[str] = []
    for name in cands:
        ins, outs = graph.float_inputs(name), graph.float_outputs(name)
        touched = [stats.get(t) or constants.get(t) for t in [*ins, *outs]]
        range_hit = any(out_of_range(s, precision) for s in touched)
        if range_hit:
            seeds.append(name)
        scores[name] = _score(ins, outs, stats, constants, range_hit)
    ranking = sorted(cands, key=lambda n: -scores[n])
    return Prior(seeds, ranking, scores)


def _rel(s: TensorStats | ConstantStats | None) -> float:
    if s is None:
        return 0.0
    if isinstance(s, TensorStats) and s.new_nonfinite:
        return math.inf
    return s.rel_err


def _score(ins: list[str], outs: list[str], stats: Mapping[str, TensorStats],
           constants: Mapping[str, ConstantStats], range_hit: bool) -> float:
    """Higher is more suspicious: range violations, then non-finite origins, then error jumps."""
    in_stats = [stats.get(t) or constants.get(t) for t in ins]
    out_stats = [stats.get(t) for t in outs]
    in_err = max((_rel(s) for s in in_stats), default=0.0)
    out_err = max((_rel(s) for s in out_stats), default=0.0)
    score = 0.0
    if range_hit:
        score += 1e6
    if math.isinf(out_err) and not math.isinf(in_err):
        score += 1e5  # first non-finite tensor on its path
    if any(s is not None and (s.too_small if isinstance(s, ConstantStats) else s.flushed) > 0
           for s in [*in_stats, *out_stats]):
        score += 1e4  # values or constants that FP16 flushes to zero (or TensorRT raises)
    if math.isfinite(out_err):
        score += min(out_err / max(in_err, 1e-3), 1e3)
    return score
