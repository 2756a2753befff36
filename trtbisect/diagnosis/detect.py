"""Why a culprit fails, as data: its cause class, its pattern and the numbers that prove it.

The layer-wise comparison (FP32 vs all-FP16 per stored tensor) and the range facts of every
constant already hold the evidence; this module reads it for each group of culprits that are
connected through data flow. It returns names and numbers only; wording.py turns them into
sentences and fixes, diagnose.py puts the two together.

Cause classes (named so in precision.json), tried in this order because an earlier one
explains the later symptoms (an overflowed value is also a non-finite origin):

* ``constant_out_of_range``: a culprit reads an initializer or Constant beyond +-65504;
* ``overflow``: a culprit reads or writes an activation beyond +-65504 in FP32;
* ``underflow``: values or an epsilon flush to zero in FP16 (then 0/0, x/0, log 0);
* ``non_finite_origin``: the first tensor that is NaN/inf in FP16 while FP32 is finite, with
  no value out of range (Sqrt of a negative rounding residue, a division by a rounded zero);
* ``precision_loss``: nothing leaves the range, the error grows along the chain.

The limits are those of the run's low precision (`Facts.p`, judge/precision.py): FP16's above;
under BF16 the range is FP32's (+-3.39e38, subnormals down to 2^-133), so range causes all but
vanish and precision loss, with BF16's spacing (7 fraction bits) in its evidence, is what is
left. Evidence keys that name the precision carry its name (`fp16_spacing`, `bf16_spacing`).

Pure: numpy and onnx only, no runtime.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from ..graph import Graph
from ..judge.compare import TensorStats
from ..judge.precision import FP16, Precision
from ..search.prior import too_small_to_ignore
from .facts import LAYOUT_OPS, Evidence, Facts

CAUSES = ("constant_out_of_range", "overflow", "underflow", "non_finite_origin", "precision_loss")
FP16_MIN_NORMAL = 2.0**-14
REDUCE_OPS = frozenset({"ReduceSum", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceProd",
                        "ReduceLogSumExp", "GlobalAveragePool", "GlobalLpPool", "CumSum",
                        "AveragePool", "LpPool"})
SPECTRAL_OPS = frozenset({"DFT", "STFT", "MelWeightMatrix"})
# Between the Q.K^T MatMul and the Softmax: the scale, the mask and the plumbing.
ATTENTION_PATH_OPS = LAYOUT_OPS | {"Div", "Mul", "Add", "Sub", "Where"}


# ---------------------------------------------------------------- grouping

def group_culprits(g: Graph, nodes: Sequence[str]) -> list[list[str]]:
    """Culprits joined by data flow (directly or through layout ops), in graph order."""
    culprits = set(nodes)
    parent = {n: n for n in culprits}

    def find(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for n in culprits:
        for m in _reached_culprits(g, n, culprits):
            parent[find(m)] = find(n)
    groups: dict[str, list[str]] = {}
    for n in sorted(culprits, key=g.index.__getitem__):
        groups.setdefault(find(n), []).append(n)
    return sorted(groups.values(), key=lambda grp: g.index[grp[0]])


def _reached_culprits(g: Graph, start: str, culprits: set[str]) -> set[str]:
    found, frontier, seen = set(), list(g.node(start).output), set()
    while frontier:
        t = frontier.pop()
        for i in g.consumers.get(t, []):
            name = g.names[i]
            if name in culprits:
                found.add(name)
            elif name not in seen and g.nodes[i].op_type in LAYOUT_OPS:
                seen.add(name)
                frontier.extend(g.nodes[i].output)
    return found


def scope_of(nodes: Sequence[str], modules: Mapping[str, str | None] | None = None) -> str | None:
    """The module the group lives in: a shared torch module, else the shared name prefix."""
    mods = {(modules or {}).get(n) for n in nodes}
    if len(mods) == 1 and None not in mods:
        return mods.pop()
    parts = [n.strip("/").split("/")[:-1] for n in nodes]
    common: list[str] = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    return "/".join(common) or None


# ---------------------------------------------------------------- classification

def detect(f: Facts, group: Sequence[str]) -> tuple[str, str | None, Evidence]:
    """Cause, pattern and evidence of one group (a cancellation adds where it cancels)."""
    cause, ev = classify(f, group)
    pattern = detect_pattern(f, group, cause, ev)
    if pattern == "cancellation":
        node = cancellation_node(f, group)
        ev.update(cancel_node=node, cancel_from=f.in_absmax(node),  # type: ignore[arg-type]
                  cancel_to=f.out_absmax(node))  # type: ignore[arg-type]
    return cause, pattern, ev


def classify(f: Facts, group: Sequence[str]) -> tuple[str, Evidence]:
    """The first cause class whose evidence is present, with its numbers."""
    for probe in (_constant_evidence, _overflow_evidence, _underflow_evidence,
                  _nonfinite_evidence):
        ev = probe(f, group)
        if ev is not None:
            return ev.pop("cause"), ev  # type: ignore[return-value]
    return "precision_loss", _precision_evidence(f, group)


def _constant_evidence(f: Facts, group: Sequence[str]) -> Evidence | None:
    for n in group:
        for t in f.g.float_inputs(n):
            hit = f.constant_at(t)
            if hit is None or not hit[1].overflow:
                continue
            src, c = hit
            value = _extreme(f.constant_array(src))
            out = _worst_output(f, n)
            return {"cause": "constant_out_of_range", "node": n, "op": f.op(n),
                    "constant": f.constant_label(src),
                    "value": value, f.p.key("value"): _converted(value, c.rule, f.p),
                    "weight_rule": c.rule,
                    "limit": f.p.max, "values_out_of_range": c.overflow,
                    "input_index": list(f.g.node(n).input).index(t),
                    f"output_nonfinite_{f.p.name}": out.fp16_nonfinite if out else 0,
                    "output_size": out.size if out else 0}
    return None


def _converted(value: float, rule: str, p: Precision = FP16) -> str:
    """What an out-of-range constant becomes in the low precision: inf under a cast, the
    range's edge under TensorRT's weight conversion (rules weights_clamp_v10 and
    weights_clamp_bf16)."""
    if rule == "clamp":
        return f"-{p.max_text}" if value < 0 else p.max_text
    return "-inf" if value < 0 else "inf"


def _extreme(arr: np.ndarray | None) -> float:
    if arr is None or arr.size == 0:
        return float("nan")
    flat = arr.astype(np.float64).reshape(-1)
    flat = flat[np.isfinite(flat)]
    return float(flat[np.argmax(np.abs(flat))]) if flat.size else float("nan")


def _worst_output(f: Facts, node: str) -> TensorStats | None:
    outs = [f.stats[t] for t in f.g.float_outputs(node) if t in f.stats]
    return max(outs, key=lambda s: (s.fp16_nonfinite, s.fp32_absmax), default=None)


def _beyond(s: TensorStats | None, p: Precision = FP16) -> bool:
    return s is not None and (s.fp32_absmax > p.max or s.overflow > 0)


def _overflow_evidence(f: Facts, group: Sequence[str]) -> Evidence | None:
    written = [f.stats[t] for n in group for t in f.g.float_outputs(n)
               if _beyond(f.stats.get(t), f.p)]
    read = [f.stats[t] for n in group for t in f.g.float_inputs(n) if _beyond(f.stats.get(t), f.p)]
    if not written and not read:
        return None
    origin = _origin(f, written) if written else read[0]
    peak = max([*written, *read], key=lambda s: s.fp32_absmax)
    node = origin.producer if written and origin.producer else next(
        n for n in group if origin.name in f.g.float_inputs(n))
    back = [f.stats[t] for t in f.g.float_outputs(group[-1]) if t in f.stats]
    top = f.p.max
    return {"cause": "overflow", "node": node, "op": f.op(node), "tensor": origin.name,
            "fp32_absmax": origin.fp32_absmax, "input_absmax": f.in_absmax(node),
            "peak": peak.fp32_absmax, "peak_tensor": peak.name, "limit": top,
            "factor": origin.fp32_absmax / top, "peak_factor": peak.fp32_absmax / top,
            "values_out_of_range": origin.overflow,
            "size": origin.size, "written_by_group": bool(written),
            "back_in_range": back[0].fp32_absmax if back and not _beyond(back[0], f.p) else None}


def _origin(f: Facts, beyond: list[TensorStats]) -> TensorStats:
    """The first out-of-range tensor whose producer read only in-range values."""
    for s in beyond:
        if s.producer and f.in_absmax(s.producer) <= f.p.max:
            return s
    return beyond[0]


def _underflow_evidence(f: Facts, group: Sequence[str]) -> Evidence | None:
    eps = _flushed_constant(f, group)
    flushed = _most_flushed(f, group)
    frac = flushed.flushed / max(flushed.size, 1) if flushed else 0.0
    if eps is None and frac < 0.1:
        return None
    ev: Evidence = {"cause": "underflow", "limit": f.p.tiny, "min_normal": f.p.min_normal}
    if flushed is not None and flushed.flushed:
        ev.update(tensor=flushed.name, node=flushed.producer,
                  op=f.op(flushed.producer) if flushed.producer else None,
                  fp32_absmax=flushed.fp32_absmax, flushed=flushed.flushed,
                  size=flushed.size, fraction=frac)
    if eps is not None:
        ev.update({"constant": eps[0], "constant_value": eps[1], "constant_reader": eps[2],
                   f"constant_{f.p.name}": eps[3], "constant_size": eps[4]})
        ev.setdefault("node", eps[2])
        ev.setdefault("op", f.op(eps[2]))
    ev.update(_consequence(f, group))
    return ev


def _flushed_constant(f: Facts, group: Sequence[str]
                      ) -> tuple[str, float, str, float, int] | None:
    """(label, smallest nonzero value, reader, what FP16 makes of it: 0, or 2^-24 where
    TensorRT's conversion raises it, elements) of the first constant too small for FP16."""
    for n in group:
        for t in f.g.float_inputs(n):
            hit = f.constant_at(t)
            if hit is not None and too_small_to_ignore(hit[1]):
                value = smallest_nonzero(f.constant_array(hit[0]))
                return (f.constant_label(hit[0]), value, n,
                        _tiny_becomes(value, hit[1].rule, f.p), hit[1].size)
    return None


def _tiny_becomes(value: float, rule: str, p: Precision = FP16) -> float:
    """A nonzero constant below the smallest subnormal becomes 0 (a cast) or +-that subnormal
    (FP16: 2^-24; the clamp of TensorRT's weight conversion, rule weights_clamp_v10)."""
    return float(np.copysign(p.tiny, value)) if rule == "clamp" else 0.0


def smallest_nonzero(arr: np.ndarray | None) -> float:
    if arr is None:
        return float("nan")
    a = np.abs(arr.astype(np.float64).reshape(-1))
    a = a[(a > 0) & np.isfinite(a)]
    return float(a.min()) if a.size else 0.0


def _most_flushed(f: Facts, group: Sequence[str]) -> TensorStats | None:
    seen = [f.stats[t] for n in group for t in [*f.g.float_outputs(n), *f.g.float_inputs(n)]
            if t in f.stats]
    return max(seen, key=lambda s: (s.flushed / max(s.size, 1), s.flushed), default=None)


def _consequence(f: Facts, group: Sequence[str]) -> Evidence:
    """The first tensor at or after the group that turns non-finite in FP16: 0/0, x/0, log 0."""
    frontier = list(dict.fromkeys([*group, *[s for n in group for s in f.successors(n)]]))
    for node in sorted(set(frontier), key=f.g.index.__getitem__):
        out = _worst_output(f, node)
        if out is not None and out.new_nonfinite:
            return {"consequence_node": node, "consequence_op": f.op(node),
                    "consequence_nonfinite": out.fp16_nonfinite - out.fp32_nonfinite}
    return {}


def _nonfinite_evidence(f: Facts, group: Sequence[str]) -> Evidence | None:
    """The first NaN/inf origin in the group or just after it (FP16 group outputs feed it)."""
    near = [*group, *[s for n in group for s in f.successors(n)]]
    for n in sorted(set(near), key=f.g.index.__getitem__):
        out = _worst_output(f, n)
        inputs = [f.stats[t] for t in f.g.float_inputs(n) if t in f.stats]
        if out is not None and out.new_nonfinite and not any(s.new_nonfinite for s in inputs):
            return {"cause": "non_finite_origin", "node": n, "op": f.op(n), "tensor": out.name,
                    "nonfinite": out.fp16_nonfinite - out.fp32_nonfinite, "size": out.size,
                    "fp32_absmax": out.fp32_absmax, "input_absmax": f.in_absmax(n),
                    "input_rel_err": max((s.rel_err for s in inputs), default=0.0),
                    "in_group": n in group}
    return None


def _precision_evidence(f: Facts, group: Sequence[str]) -> Evidence:
    def jump(n: str) -> tuple[float, float, float]:
        out = max((f.stats[t].rel_err for t in f.g.float_outputs(n) if t in f.stats), default=0.0)
        inp = max((f.stats[t].rel_err for t in f.g.float_inputs(n) if t in f.stats), default=0.0)
        return out / max(inp, 1e-4), out, inp

    node = max(group, key=lambda n: jump(n)[:2])
    ratio, out_err, in_err = jump(node)
    big = max(group, key=f.out_absmax)
    magnitude = f.out_absmax(big)
    entry = max((f.absmax(t) for t in f.g.float_inputs(group[0])), default=0.0)
    return {"node": node, "op": f.op(node), "rel_err": out_err, "input_rel_err": in_err,
            "amplification": ratio, "chain_length": len(group), "magnitude": magnitude,
            "magnitude_node": big, f.p.key("spacing"): f.p.spacing(magnitude),
            "result_absmax": f.out_absmax(group[-1]), "input_absmax": entry}


def fp16_spacing(x: float) -> float:
    """Distance between neighbouring FP16 values near |x| (10 fraction bits)."""
    return FP16.spacing(x)


# ---------------------------------------------------------------- patterns

def detect_pattern(f: Facts, group: Sequence[str], cause: str, ev: Evidence) -> str | None:
    """A recognisable structure around the group; independent of the cause where possible."""
    if cause == "constant_out_of_range":
        return _constant_pattern(f, ev)
    norm = _norm_pattern(f, group)
    if norm and cause == "overflow":  # the words name the square itself, wherever it overflows
        sq = _norm_square(f, group)
        if sq is not None:
            ev["squared_absmax"], ev["square_absmax"] = f.in_absmax(sq), f.out_absmax(sq)
    if _spectral(f, group):
        return "power_spectrum"
    if norm:
        return norm
    if attention_matmul(f, group):
        return "attention_logits"
    origin = str(ev.get("op") or "")
    if origin in REDUCE_OPS or any(f.op(n) in REDUCE_OPS and n == ev.get("node") for n in group):
        return "large_reduction"
    if origin == "Exp":
        return "exp"
    if cause in ("precision_loss", "non_finite_origin") and cancellation_node(f, group):
        return "cancellation"
    return "accumulated_error" if cause == "precision_loss" else None


def _constant_pattern(f: Facts, ev: Evidence) -> str | None:
    value, node = ev.get("value"), str(ev.get("node"))
    if f.op(node) == "BatchNormalization" and ev.get("input_index") in (3, 4):
        return "batchnorm_statistics"
    if isinstance(value, float) and value < -f.p.max and reaches(f, node, {"Softmax"}, 6):
        return "attention_mask"
    return None


def reaches(f: Facts, node: str, targets: set[str], hops: int,
             through: frozenset[str] | None = None) -> str | None:
    """A node of a `targets` op within `hops` data-flow steps (only `through` ops between)."""
    frontier = [node]
    for _ in range(hops):
        nxt = []
        for n in frontier:
            for s in f.successors(n):
                if f.op(s) in targets:
                    return s
                if through is None or f.op(s) in through:
                    nxt.append(s)
        frontier = nxt
    return None


def is_square(f: Facts, node: str) -> bool:
    n = f.g.node(node)
    if n.op_type == "Mul" and len(n.input) == 2 and n.input[0] == n.input[1]:
        return True
    return n.op_type == "Pow" and len(n.input) == 2 and f.scalar(n.input[1]) == 2.0


def _norm_pattern(f: Facts, group: Sequence[str]) -> str | None:
    """Square -> ReduceMean -> (+eps) -> Sqrt: LayerNorm when the squared value is x - mean(x)."""
    sq = _norm_square(f, group)
    if sq is None:
        return None
    return "layernorm_decomposed" if _centered(f, sq) else "rmsnorm_decomposed"


def _norm_square(f: Facts, group: Sequence[str]) -> str | None:
    """The square node of a decomposed norm around the group (None: no such norm)."""
    squares = {n for n in group if is_square(f, n)}
    for n in group:  # the group may start after the square (it only carries the variance)
        squares.update(p for t in f.g.node(n).input if (p := f.producer(t)) and is_square(f, p))
    for sq in sorted(squares, key=f.g.index.__getitem__):
        if reaches(f, sq, {"Sqrt", "Rsqrt"}, 3, frozenset({"ReduceMean", "Add"})) and any(
                f.op(s) == "ReduceMean" for s in f.successors(sq)):
            return sq
    return None


def _centered(f: Facts, square: str) -> bool:
    p = f.producer(f.g.node(square).input[0])
    if p is None or f.op(p) != "Sub":
        return False
    mean = f.producer(f.g.node(p).input[1])
    return mean is not None and f.op(mean) == "ReduceMean"


def _spectral(f: Facts, group: Sequence[str]) -> bool:
    """Squares (or sums of squares) of a DFT/STFT output: a power spectrum."""
    for n in group:
        if is_square(f, n) or f.op(n) in ("ReduceSumSquare", "ReduceL2", "Abs"):
            if _upstream(f, n, SPECTRAL_OPS, 4):
                return True
    return False


def _upstream(f: Facts, node: str, targets: frozenset[str], hops: int) -> bool:
    frontier = [node]
    for _ in range(hops):
        frontier = [p for n in frontier for t in f.g.node(n).input if (p := f.producer(t))]
        if any(f.op(p) in targets for p in frontier):
            return True
    return False


def attention_matmul(f: Facts, group: Sequence[str]) -> str | None:
    for n in group:
        if f.op(n) in ("MatMul", "Gemm", "Einsum") and reaches(
                f, n, {"Softmax"}, 4, ATTENTION_PATH_OPS):
            return n
    return None


def cancellation_node(f: Facts, group: Sequence[str]) -> str | None:
    """An Add/Sub whose result is 100x smaller than its operands: FP16 kept only their top bits."""
    for n in group:
        if f.op(n) in ("Add", "Sub") and 0 < f.out_absmax(n) * 100 <= f.in_absmax(n):
            return n
    return None


def attention_scale(f: Facts, group: Sequence[str]) -> tuple[str, float] | None:
    """The Div/Mul by a constant just after the Q.K^T MatMul: (its op, the constant)."""
    scale = reaches(f, attention_matmul(f, group) or group[0], {"Div", "Mul"}, 3, LAYOUT_OPS)
    value = f.scalar(f.g.node(scale).input[1]) if scale else None
    return (f.op(scale), value) if scale and value is not None else None


# ---------------------------------------------------------------- per node

class NodeNumbers(NamedTuple):
    """The ranges and low-precision errors around one node (`fp16_spacing`: the spacing of
    the run's low precision, FP16's or BF16's)."""

    op: str
    input_absmax: float
    output_absmax: float
    input_rel_err: float
    output_rel_err: float
    fp16_spacing: float


def node_numbers(f: Facts, node: str) -> NodeNumbers:
    """The numbers a per-node `why` quotes."""
    outs = f.out_absmax(node)
    err_in = max((f.stats[t].rel_err for t in f.g.float_inputs(node) if t in f.stats), default=0.0)
    err_out = max((f.stats[t].rel_err for t in f.g.float_outputs(node) if t in f.stats), default=0.0)
    return NodeNumbers(f.op(node), f.in_absmax(node), outs, err_in, err_out, f.p.spacing(outs))


def flushed_at(f: Facts, node: str) -> Evidence | None:
    """What this node reads or writes that FP16 flushes to zero: a constant first, else a tensor."""
    for t in f.g.float_inputs(node):
        hit = f.constant_at(t)
        if hit is not None and too_small_to_ignore(hit[1]):
            value = smallest_nonzero(f.constant_array(hit[0]))
            return {"constant": f.constant_label(hit[0]), "value": value,
                    f.p.key("value"): _tiny_becomes(value, hit[1].rule, f.p)}
    for t in [*f.g.float_outputs(node), *f.g.float_inputs(node)]:
        s = f.stats.get(t)
        if s is not None and s.flushed:
            return {"tensor": t, "written": t in f.g.float_outputs(node), "flushed": s.flushed,
                    "size": s.size, "fp32_absmax": s.fp32_absmax}
    return None
