"""Why a culprit fails: its cause class, the numbers that prove it, and the fixes.

A list of node names is not an answer. The layer-wise comparison (FP32 vs all-FP16 per stored
tensor) and the range facts of every constant already hold the evidence; this module reads it
for each group of culprits that are connected through data flow, and says, in the words a
deployment engineer uses, what goes wrong and what to do about it.

Cause classes (named so in precision.json), tried in this order because an earlier one
explains the later symptoms (an overflowed value is also a non-finite origin):

* ``constant_out_of_range``: a culprit reads an initializer or Constant beyond +-65504;
* ``overflow``: a culprit reads or writes an activation beyond +-65504 in FP32;
* ``underflow``: values or an epsilon flush to zero in FP16 (then 0/0, x/0, log 0);
* ``non_finite_origin``: the first tensor that is NaN/inf in FP16 while FP32 is finite, with
  no value out of range (Sqrt of a negative rounding residue, a division by a rounded zero);
* ``precision_loss``: nothing leaves the range, the error grows along the chain.

Pure: numpy and onnx only, no runtime.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from .compare import FP16_MAX, FP16_TINY, TensorStats
from .graph import Graph, with_node_names
from .suspects import ConstantStats

CAUSES = ("constant_out_of_range", "overflow", "underflow", "non_finite_origin", "precision_loss")
FP16_MIN_NORMAL = 2.0**-14
# Nodes that only move data: culprits joined through them are one group, and a constant read
# through them is still that constant.
LAYOUT_OPS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity",
                        "Cast", "CastLike", "Expand", "Slice", "Gather", "Concat", "Split",
                        "Tile"})
REDUCE_OPS = frozenset({"ReduceSum", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceProd",
                        "ReduceLogSumExp", "GlobalAveragePool", "GlobalLpPool", "CumSum",
                        "AveragePool", "LpPool"})
SPECTRAL_OPS = frozenset({"DFT", "STFT", "MelWeightMatrix"})
# Between the Q.K^T MatMul and the Softmax: the scale, the mask and the plumbing.
ATTENTION_PATH_OPS = LAYOUT_OPS | {"Div", "Mul", "Add", "Sub", "Where"}
DOMAIN_OPS = {"Sqrt": "Max(x, 0)", "Log": "Max(x, eps)", "Div": "denominator + eps",
              "Reciprocal": "x + eps", "Pow": "Max(x, eps)"}

Evidence = dict[str, "float | int | str | None"]


@dataclass(frozen=True)
class Fix:
    """One way out; `kind` is stable (tests, reports), `text` is for people."""

    kind: str
    text: str

    def to_json(self) -> dict:
        return {"kind": self.kind, "text": self.text}


@dataclass
class CulpritGroup:
    """Culprits connected through data flow, with one diagnosis for all of them."""

    nodes: list[str]
    cause: str
    pattern: str | None
    evidence: Evidence
    summary: str
    fixes: list[Fix]
    applied_fix: str | None
    scope: str | None = None
    why: dict[str, str] = field(default_factory=dict)  # per node, for Culprit.why

    def to_json(self) -> dict:
        return {"nodes": self.nodes, "scope": self.scope, "cause": self.cause,
                "pattern": self.pattern,
                "evidence": {k: _jnum(v) for k, v in self.evidence.items()},
                "summary": self.summary, "fixes": [f.to_json() for f in self.fixes],
                "applied_fix": self.applied_fix}

    @classmethod
    def from_json(cls, d: Mapping) -> "CulpritGroup":
        """Back from precision.json (per-node `why` lives in `culprits`, not here)."""
        return cls(list(d["nodes"]), d["cause"], d.get("pattern"), dict(d["evidence"]),
                   d["summary"], [Fix(f["kind"], f["text"]) for f in d["fixes"]],
                   d.get("applied_fix"), d.get("scope"))


def _jnum(v: object) -> object:
    """JSON has no inf/NaN; and 6 significant digits are plenty for evidence."""
    if isinstance(v, float):
        return float(f"{v:.6g}") if math.isfinite(v) else str(v)
    return v


def num(x: float | int | None) -> str:
    """3 significant digits, exponent without padding: 5.54e6, 965, 0.00034."""
    if x is None:
        return "?"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    s = f"{x:.3g}"
    if "e" in s:
        mant, exp = s.split("e")
        s = f"{mant}e{int(exp)}"
    return s


class Facts:
    """The graph with its layer-wise and constant statistics, and the walks diagnosis needs."""

    def __init__(self, g: Graph, stats: Mapping[str, TensorStats],
                 constants: Mapping[str, ConstantStats]) -> None:
        self.g, self.stats, self.constants = g, stats, constants
        self._arrays: dict[str, np.ndarray | None] = {}

    def op(self, node: str) -> str:
        return self.g.node(node).op_type

    def producer(self, tensor: str) -> str | None:
        i = self.g.producer.get(tensor)
        return None if i is None else self.g.names[i]

    def consumers(self, tensor: str) -> list[str]:
        return [self.g.names[i] for i in self.g.consumers.get(tensor, [])]

    def successors(self, node: str) -> list[str]:
        return [c for t in self.g.node(node).output for c in self.consumers(t)]

    def absmax(self, tensor: str) -> float:
        s = self.stats.get(tensor)
        if s is not None:
            return s.fp32_absmax
        hit = self.constant_at(tensor)
        return hit[1].absmax if hit is not None else 0.0

    def in_absmax(self, node: str) -> float:
        return max((self.absmax(t) for t in self.g.float_inputs(node)), default=0.0)

    def out_absmax(self, node: str) -> float:
        return max((self.absmax(t) for t in self.g.float_outputs(node)), default=0.0)

    def constant_source(self, tensor: str) -> str | None:
        """The initializer or Constant a tensor is, possibly through layout ops."""
        for _ in range(8):
            if tensor in self.constants or tensor in self.g.initializers:
                return tensor
            p = self.producer(tensor)
            if p is None or self.op(p) not in LAYOUT_OPS or not self.g.node(p).input:
                return None
            tensor = self.g.node(p).input[0]
        return None

    def constant_at(self, tensor: str) -> tuple[str, ConstantStats] | None:
        """The constant a tensor reads (through layout ops) with its range facts."""
        src = self.constant_source(tensor)
        c = self.constants.get(src) if src is not None else None
        return (src, c) if src is not None and c is not None else None

    def constant_array(self, name: str) -> np.ndarray | None:
        if name not in self._arrays:
            self._arrays[name] = _constant_array(self.g, name)
        return self._arrays[name]

    def constant_label(self, name: str) -> str:
        """An initializer by its name, a Constant output by its node's name (what Netron shows)."""
        p = self.producer(name)
        return p if p is not None and self.op(p) == "Constant" else name

    def scalar(self, tensor: str) -> float | None:
        src = self.constant_source(tensor)
        arr = self.constant_array(src) if src else None
        return float(arr.reshape(-1)[0]) if arr is not None and arr.size == 1 else None


def _constant_array(g: Graph, name: str) -> np.ndarray | None:
    if name in g.initializers:
        return g.array(name)
    i = g.producer.get(name)
    if i is None:
        return None
    for a in g.model.graph.node[i].attribute:
        if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
            return numpy_helper.to_array(a.t)
        if a.name == "value_float":
            return np.array(a.f, np.float32)
    return None


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
            elif name not in seen and g.model.graph.node[i].op_type in LAYOUT_OPS:
                seen.add(name)
                frontier.extend(g.model.graph.node[i].output)
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
                    "value": value, "fp16_value": "-inf" if value < 0 else "inf",
                    "limit": FP16_MAX, "values_out_of_range": c.overflow,
                    "input_index": list(f.g.node(n).input).index(t),
                    "output_nonfinite_fp16": out.fp16_nonfinite if out else 0,
                    "output_size": out.size if out else 0}
    return None


def _extreme(arr: np.ndarray | None) -> float:
    if arr is None or arr.size == 0:
        return float("nan")
    flat = arr.astype(np.float64).reshape(-1)
    flat = flat[np.isfinite(flat)]
    return float(flat[np.argmax(np.abs(flat))]) if flat.size else float("nan")


def _worst_output(f: Facts, node: str) -> TensorStats | None:
    outs = [f.stats[t] for t in f.g.float_outputs(node) if t in f.stats]
    return max(outs, key=lambda s: (s.fp16_nonfinite, s.fp32_absmax), default=None)


def _beyond(s: TensorStats | None) -> bool:
    return s is not None and (s.fp32_absmax > FP16_MAX or s.overflow > 0)


def _overflow_evidence(f: Facts, group: Sequence[str]) -> Evidence | None:
    written = [f.stats[t] for n in group for t in f.g.float_outputs(n) if _beyond(f.stats.get(t))]
    read = [f.stats[t] for n in group for t in f.g.float_inputs(n) if _beyond(f.stats.get(t))]
    if not written and not read:
        return None
    origin = _origin(f, written) if written else read[0]
    peak = max([*written, *read], key=lambda s: s.fp32_absmax)
    node = origin.producer if written and origin.producer else next(
        n for n in group if origin.name in f.g.float_inputs(n))
    back = [f.stats[t] for t in f.g.float_outputs(group[-1]) if t in f.stats]
    return {"cause": "overflow", "node": node, "op": f.op(node), "tensor": origin.name,
            "fp32_absmax": origin.fp32_absmax, "input_absmax": f.in_absmax(node),
            "peak": peak.fp32_absmax, "peak_tensor": peak.name, "limit": FP16_MAX,
            "factor": origin.fp32_absmax / FP16_MAX, "peak_factor": peak.fp32_absmax / FP16_MAX,
            "values_out_of_range": origin.overflow,
            "size": origin.size, "written_by_group": bool(written),
            "back_in_range": back[0].fp32_absmax if back and not _beyond(back[0]) else None}


def _origin(f: Facts, beyond: list[TensorStats]) -> TensorStats:
    """The first out-of-range tensor whose producer read only in-range values."""
    for s in beyond:
        if s.producer and f.in_absmax(s.producer) <= FP16_MAX:
            return s
    return beyond[0]


def _underflow_evidence(f: Facts, group: Sequence[str]) -> Evidence | None:
    eps = _flushed_constant(f, group)
    flushed = _most_flushed(f, group)
    frac = flushed.flushed / max(flushed.size, 1) if flushed else 0.0
    if eps is None and frac < 0.1:
        return None
    ev: Evidence = {"cause": "underflow", "limit": FP16_TINY, "min_normal": FP16_MIN_NORMAL}
    if flushed is not None and flushed.flushed:
        ev.update(tensor=flushed.name, node=flushed.producer,
                  op=f.op(flushed.producer) if flushed.producer else None,
                  fp32_absmax=flushed.fp32_absmax, flushed=flushed.flushed,
                  size=flushed.size, fraction=frac)
    if eps is not None:
        ev.update(constant=eps[0], constant_value=eps[1], constant_reader=eps[2])
        ev.setdefault("node", eps[2])
        ev.setdefault("op", f.op(eps[2]))
    ev.update(_consequence(f, group))
    return ev


def _flushed_constant(f: Facts, group: Sequence[str]) -> tuple[str, float, str] | None:
    for n in group:
        for t in f.g.float_inputs(n):
            hit = f.constant_at(t)
            if hit is not None and hit[1].flushed:
                return f.constant_label(hit[0]), _smallest_nonzero(f.constant_array(hit[0])), n
    return None


def _smallest_nonzero(arr: np.ndarray | None) -> float:
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
            "magnitude_node": big, "fp16_spacing": fp16_spacing(magnitude),
            "result_absmax": f.out_absmax(group[-1]), "input_absmax": entry}


def fp16_spacing(x: float) -> float:
    """Distance between neighbouring FP16 values near |x| (10 fraction bits)."""
    if not math.isfinite(x) or x <= 0:
        return 0.0
    return 2.0 ** (max(math.floor(math.log2(x)), -14) - 10)


# ---------------------------------------------------------------- patterns

def detect_pattern(f: Facts, group: Sequence[str], cause: str, ev: Evidence) -> str | None:
    """A recognisable structure around the group; independent of the cause where possible."""
    if cause == "constant_out_of_range":
        return _constant_pattern(f, ev)
    norm = _norm_pattern(f, group)
    if _spectral(f, group):
        return "power_spectrum"
    if norm:
        return norm
    if _attention_matmul(f, group):
        return "attention_logits"
    origin = str(ev.get("op") or "")
    if origin in REDUCE_OPS or any(f.op(n) in REDUCE_OPS and n == ev.get("node") for n in group):
        return "large_reduction"
    if origin == "Exp":
        return "exp"
    if cause in ("precision_loss", "non_finite_origin") and _cancellation(f, group):
        return "cancellation"
    return "accumulated_error" if cause == "precision_loss" else None


def _constant_pattern(f: Facts, ev: Evidence) -> str | None:
    value, node = ev.get("value"), str(ev.get("node"))
    if f.op(node) == "BatchNormalization" and ev.get("input_index") in (3, 4):
        return "batchnorm_statistics"
    if isinstance(value, float) and value < -FP16_MAX and _reaches(f, node, {"Softmax"}, 6):
        return "attention_mask"
    return None


def _reaches(f: Facts, node: str, targets: set[str], hops: int,
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
    squares = {n for n in group if is_square(f, n)}
    for n in group:  # the group may start after the square (it only carries the variance)
        squares.update(p for t in f.g.node(n).input if (p := f.producer(t)) and is_square(f, p))
    for sq in sorted(squares, key=f.g.index.__getitem__):
        if _reaches(f, sq, {"Sqrt", "Rsqrt"}, 3, frozenset({"ReduceMean", "Add"})) and any(
                f.op(s) == "ReduceMean" for s in f.successors(sq)):
            return "layernorm_decomposed" if _centered(f, sq) else "rmsnorm_decomposed"
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


def _attention_matmul(f: Facts, group: Sequence[str]) -> str | None:
    for n in group:
        if f.op(n) in ("MatMul", "Gemm", "Einsum") and _reaches(
                f, n, {"Softmax"}, 4, ATTENTION_PATH_OPS):
            return n
    return None


def _cancellation(f: Facts, group: Sequence[str]) -> str | None:
    """An Add/Sub whose result is 100x smaller than its operands: FP16 kept only their top bits."""
    for n in group:
        if f.op(n) in ("Add", "Sub") and 0 < f.out_absmax(n) * 100 <= f.in_absmax(n):
            return n
    return None


# ---------------------------------------------------------------- fixes and words

def fixes_for(f: Facts, group: Sequence[str], cause: str, pattern: str | None,
              ev: Evidence) -> list[Fix]:
    """Keeping FP32 first (what the plan does), then the model changes that make it needless."""
    keep = Fix("keep_fp32", f"keep {_nodes(len(group))} in FP32: {', '.join(group)}")
    return [keep, *_model_fixes(f, group, cause, pattern, ev)]


def _model_fixes(f: Facts, group: Sequence[str], cause: str, pattern: str | None,
                 ev: Evidence) -> list[Fix]:
    by_pattern = {
        "layernorm_decomposed": _layernorm_fix(f.g.opset),
        "rmsnorm_decomposed": Fix("prescale_norm", f"{'multiply' if cause == 'underflow' else 'divide'}"
                                  " x by a power of two before squaring (RMSNorm is scale "
                                  "invariant apart from eps), or fuse it into RMSNormalization "
                                  "(opset 23) where the runtime keeps its statistics in FP32"),
        "attention_logits": _attention_fix(f, group),
        "attention_mask": Fix("clamp_mask_fill", "clamp the mask fill to -1e4 or "
                              "torch.finfo(torch.float16).min (-65504) instead of "
                              f"{num(_f(ev.get('value')))}, so FP16 holds it"),
        "batchnorm_statistics": Fix("fold_batchnorm", "fold BatchNormalization into the "
                                    "preceding Conv in FP32 before the FP16 build"),
        "large_reduction": Fix("mean_before_sum", "divide by the element count before summing "
                               "(ReduceMean, or scale the input by 1/N), so the sum stays in range"),
        "power_spectrum": Fix("normalize_spectrum", "normalise the frames (divide by n_fft or "
                              "the window sum) before squaring, so |X|^2 stays below 65504"),
        "exp": Fix("subtract_max_before_exp", "subtract the running max before Exp (as Softmax "
                   "does), or use a fused Softmax/LogSoftmax/Softplus"),
        "cancellation": Fix("reorder_arithmetic", "avoid cancelling large terms in FP16: "
                            "compute a variance as mean((x - mean)^2), not mean(x^2) - mean^2, "
                            "and fold constant offsets that are added and removed"),
    }
    fixes = [by_pattern[pattern]] if pattern in by_pattern else []
    fixes += _cause_fixes(f, cause, ev)
    return fixes


def _nodes(n: int) -> str:
    return "this node" if n == 1 else f"these {n} nodes"


def pct(x: float | None) -> str:
    """A relative error as a percentage of the output's range."""
    if x is None or not math.isfinite(x):
        return str(x)
    return f"{num(100 * x)}%"


def _f(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) else None


def _layernorm_fix(opset: int) -> Fix:
    if opset < 17:
        return Fix("reexport_opset17", f"re-export at opset >= 17 (this model is opset {opset}) "
                   "so LayerNormalization is one op whose statistics TensorRT keeps in FP32")
    return Fix("fuse_layernorm", "fuse the chain into one LayerNormalization op (opset >= 17) "
               "so TensorRT keeps its statistics in FP32")


def _attention_fix(f: Facts, group: Sequence[str]) -> Fix:
    mm = _attention_matmul(f, group) or group[0]
    scale = _reaches(f, mm, {"Div", "Mul"}, 3, LAYOUT_OPS)
    what = f"the {f.op(scale)} by {num(f.scalar(f.g.node(scale).input[1]))}" if scale and \
        f.scalar(f.g.node(scale).input[1]) is not None else "the 1/sqrt(d) scale"
    return Fix("scale_before_matmul", f"move {what} before the MatMul (scale Q, or Q and K by "
               "d^-1/4) so the logits never exceed 65504")


def _cause_fixes(f: Facts, cause: str, ev: Evidence) -> list[Fix]:
    if cause == "underflow":
        out = [Fix("rescale_input", "rescale the values so they stay above FP16's smallest "
                   f"normal {num(FP16_MIN_NORMAL)} (subnormals end at {num(FP16_TINY)})")]
        if ev.get("constant") is not None:
            out.insert(0, Fix("raise_eps", f"raise eps {ev.get('constant')} = "
                              f"{num(_f(ev.get('constant_value')))} to at least 1e-5"))
        return out
    if cause == "non_finite_origin" and str(ev.get("op")) in DOMAIN_OPS:
        guard = DOMAIN_OPS[str(ev["op"])]
        return [Fix("guard_domain", f"guard the argument of {ev['op']} ({guard}) so FP16 "
                    "rounding cannot leave its domain")]
    if cause == "constant_out_of_range":
        return [Fix("clip_constant", f"clip {ev.get('constant')} into FP16's range "
                    "(|x| <= 65504) before export, if the model tolerates it")]
    if cause == "precision_loss":
        return [Fix("loosen_tolerance", f"if an error of {pct(_f(ev.get('rel_err')))} is "
                    "acceptable, raise --rtol: the plan would need fewer FP32 nodes")]
    return []


def summarize(f: Facts, group: Sequence[str], cause: str, pattern: str | None, ev: Evidence,
              fixes: Sequence[Fix], scope: str | None) -> str:
    """One sentence: where, what, the numbers, what to do."""
    where = f"{scope}: " if scope else ""
    what = _what(f, cause, pattern, ev)
    alt = next((fx.text for fx in fixes if fx.kind != "keep_fp32"), None)
    todo = f"keep {_nodes(len(group))} in FP32" + (f", or {alt}" if alt else "")
    return f"{where}{what}; {todo}."


def _what(f: Facts, cause: str, pattern: str | None, ev: Evidence) -> str:
    g = lambda k: num(_f(ev.get(k)))  # noqa: E731 - a formatter, local to the sentence
    if cause == "constant_out_of_range":
        nan = ev.get("output_nonfinite_fp16") or 0
        tail = f"; {nan} of {ev.get('output_size')} values turn NaN/inf" if nan else ""
        zero = " (0 * -inf = NaN)" if ev.get("op") == "Mul" and nan else ""
        return (f"{ev['op']} {ev['node']} reads constant {ev['constant']} = {g('value')}, which "
                f"FP16 rounds to {ev['fp16_value']}{zero}{tail}")
    if cause == "overflow":
        return _overflow_words(pattern, ev, g)
    if cause == "underflow":
        return _underflow_words(ev, g)
    if cause == "non_finite_origin":
        fed = "" if ev.get("in_group") else ", fed by these nodes' FP16 outputs"
        return (f"{ev['op']} {ev['node']} is where FP16 first turns NaN/inf ({ev['nonfinite']} "
                f"of {ev['size']} values) while FP32 stays finite (max {g('fp32_absmax')}){fed}, "
                "with no value out of FP16's range")
    spacing = (f"; values reach {g('magnitude')} where FP16 spacing is {g('fp16_spacing')}, "
               f"then cancel to {g('result_absmax')}" if pattern == "cancellation" else "")
    return (f"no value leaves FP16's range, but the FP16 error grows from "
            f"{pct(_f(ev.get('input_rel_err')))} to {pct(_f(ev.get('rel_err')))} of the "
            f"output's range over {ev['chain_length']} node(s){spacing}")


def _overflow_words(pattern: str | None, ev: Evidence, g) -> str:
    over = f"overflows FP16 (max 65504, {num(_f(ev.get('factor')))}x over)"
    peak_over = f"overflows FP16 (max 65504, {num(_f(ev.get('peak_factor')))}x over)"
    if pattern == "layernorm_decomposed":
        return f"the decomposed LayerNorm squares values of {g('input_absmax')}: " \
               f"(x - mean)^2 = {g('fp32_absmax')} {over}"
    if pattern == "rmsnorm_decomposed":
        return f"the decomposed RMSNorm squares values of {g('input_absmax')}: " \
               f"x^2 = {g('fp32_absmax')} {over}"
    if pattern == "attention_logits":
        back = f", scaled back to {g('back_in_range')}" if ev.get("back_in_range") else ""
        return f"attention logits Q.K^T reach {g('peak')} before the scale{back}; that {peak_over}"
    if pattern == "power_spectrum":
        return f"the power spectrum squares DFT values of {g('input_absmax')}: |X|^2 = " \
               f"{g('fp32_absmax')} {over}"
    if pattern == "exp":
        return f"Exp {ev['node']} of inputs up to {g('input_absmax')} gives {g('fp32_absmax')}, " \
               f"which {over}"
    if pattern == "large_reduction":
        return f"{ev['op']} {ev['node']} sums values of up to {g('input_absmax')} into " \
               f"{g('fp32_absmax')}, which {over}"
    if not ev.get("written_by_group"):
        return f"{ev['op']} {ev['node']} reads {ev['tensor']} of {g('fp32_absmax')}, which {over}"
    return f"{ev['op']} {ev['node']} writes {g('fp32_absmax')} from inputs of at most " \
           f"{g('input_absmax')}, which {over}"


def _underflow_words(ev: Evidence, g) -> str:
    parts = []
    if ev.get("flushed"):
        parts.append(f"{ev['flushed']} of {ev['size']} values of {ev['tensor']} (max "
                     f"{g('fp32_absmax')}) flush to zero in FP16 (smallest subnormal 6e-8)")
    if ev.get("constant"):
        parts.append(f"eps {ev['constant']} = {g('constant_value')} flushes to zero too"
                     if parts else f"constant {ev['constant']} = {g('constant_value')} flushes "
                     "to zero in FP16")
    if ev.get("consequence_op"):
        op = str(ev["consequence_op"])
        how = {"Div": "divides by zero (x/0 = inf, 0/0 = NaN)", "Log": "takes log(0) = -inf",
               "Reciprocal": "takes 1/0 = inf"}.get(op, "turns non-finite")
        parts.append(f"then {op} {ev['consequence_node']} {how} in "
                     f"{ev['consequence_nonfinite']} values")
    return "; ".join(parts)


# ---------------------------------------------------------------- per node

def node_why(f: Facts, node: str, cause: str, ev: Evidence) -> str:
    """What this one node does wrong, in numbers."""
    op = f.op(node)
    ins = max((f.absmax(t) for t in f.g.float_inputs(node)), default=0.0)
    outs = f.out_absmax(node)
    if cause == "constant_out_of_range" and node == ev.get("node"):
        return (f"{op} reads constant {ev['constant']} = {num(_f(ev.get('value')))}, which FP16 "
                f"rounds to {ev['fp16_value']}")
    if ins > FP16_MAX or outs > FP16_MAX:
        return _range_role(op, ins, outs)
    if cause == "underflow":
        flushed = _flushed_here(f, node)
        if flushed:
            return flushed
    if cause == "non_finite_origin" and node == ev.get("node"):
        return f"{op}: first NaN/inf in FP16 ({ev['nonfinite']} of {ev['size']} values), FP32 finite"
    err_in = max((f.stats[t].rel_err for t in f.g.float_inputs(node) if t in f.stats), default=0.0)
    err_out = max((f.stats[t].rel_err for t in f.g.float_outputs(node) if t in f.stats), default=0.0)
    return (f"{op}: FP16 error {pct(err_in)} -> {pct(err_out)} of the range "
            f"(values up to {num(outs)}, FP16 spacing {num(fp16_spacing(outs))})")


def _range_role(op: str, ins: float, outs: float) -> str:
    if ins <= FP16_MAX:
        return f"{op} writes {num(outs)} ({num(outs / FP16_MAX)}x FP16's 65504) from inputs " \
               f"of at most {num(ins)}"
    if outs > FP16_MAX:
        return f"{op} reads {num(ins)} and writes {num(outs)}, both beyond 65504"
    return f"{op} reads {num(ins)} (> 65504) and brings it back to {num(outs)}"


def _flushed_here(f: Facts, node: str) -> str | None:
    for t in f.g.float_inputs(node):
        hit = f.constant_at(t)
        if hit is not None and hit[1].flushed:
            return f"{f.op(node)} reads constant {f.constant_label(hit[0])} = " \
                   f"{num(_smallest_nonzero(f.constant_array(hit[0])))}, which FP16 flushes to zero"
    for t in [*f.g.float_outputs(node), *f.g.float_inputs(node)]:
        s = f.stats.get(t)
        if s is not None and s.flushed:
            verb = "writes" if t in f.g.float_outputs(node) else "reads"
            return f"{f.op(node)} {verb} {t}: {s.flushed} of {s.size} values (max " \
                   f"{num(s.fp32_absmax)}) flush to zero in FP16"
    return None


# ---------------------------------------------------------------- entry points

def diagnose(g: Graph, nodes: Sequence[str], stats: Mapping[str, TensorStats],
             constants: Mapping[str, ConstantStats], applied: bool = True,
             modules: Mapping[str, str | None] | None = None) -> list[CulpritGroup]:
    """One diagnosis per connected group of `nodes`; `applied`: the plan keeps them FP32."""
    f = Facts(g, stats, constants)
    return [_diagnose_group(f, grp, applied, modules) for grp in group_culprits(g, nodes)]


def _diagnose_group(f: Facts, group: list[str], applied: bool,
                    modules: Mapping[str, str | None] | None) -> CulpritGroup:
    cause, ev = classify(f, group)
    pattern = detect_pattern(f, group, cause, ev)
    if pattern == "cancellation":
        node = _cancellation(f, group)
        ev.update(cancel_node=node, cancel_from=f.in_absmax(node),  # type: ignore[arg-type]
                  cancel_to=f.out_absmax(node))  # type: ignore[arg-type]
    fixes = fixes_for(f, group, cause, pattern, ev)
    scope = scope_of(group, modules)
    return CulpritGroup(
        nodes=group, cause=cause, pattern=pattern, evidence=ev,
        summary=summarize(f, group, cause, pattern, ev, fixes, scope), fixes=fixes,
        applied_fix="keep_fp32" if applied else None, scope=scope,
        why={n: node_why(f, n, cause, ev) for n in group})


def attach(result, g: Graph, constants: Mapping[str, ConstantStats]) -> list[CulpritGroup]:
    """Diagnose a pipeline RunResult in place: `extra["culprit_groups"]` and each Culprit.why.

    With a plan, its nodes are diagnosed and the plan applied "keep_fp32". With no plan, the
    layer-wise suspects (the prior's seeds) are, and no fix is marked applied.
    """
    nodes = result.fp32_nodes or (result.prior_seeds if result.verdict == "no_plan" else [])
    modules = {c.node: c.module for c in result.culprits}
    groups = diagnose(g, nodes, result.stats, constants, applied=result.verdict == "fixed",
                      modules=modules)
    whys = {n: w for grp in groups for n, w in grp.why.items()}
    for c in result.culprits:
        c.why = whys.get(c.node, c.why)
    result.extra["culprit_groups"] = [grp.to_json() for grp in groups]
    return groups


def annotate(model: onnx.ModelProto, groups: Sequence[Mapping], whys: Mapping[str, str],
             meta: Mapping[str, str] | None = None) -> onnx.ModelProto:
    """A named copy whose culprit nodes carry their diagnosis, so Netron shows it.

    `groups` are culprit groups as in precision.json. The diagnosis goes into each node's
    doc_string (Netron shows it with the node's properties) and, where the IR version has
    them (>= 10), node metadata_props; the model gets a summary in its metadata_props.
    """
    out = with_node_names(model)
    by_name = {n.name: n for n in out.graph.node}
    for k, grp in enumerate(groups):
        for name in grp["nodes"]:
            node = by_name.get(name)
            if node is None:
                continue
            node.doc_string = _node_doc(grp, whys.get(name, ""), k)
            if out.ir_version >= 10:
                _set_props(node.metadata_props, {
                    "trtbisect.precision": "fp32", "trtbisect.cause": grp["cause"],
                    "trtbisect.pattern": grp.get("pattern") or "",
                    "trtbisect.group": str(k + 1)})
    _set_props(out.metadata_props, dict(meta or {}))
    return out


def _node_doc(grp: Mapping, why: str, k: int) -> str:
    pattern = f", {grp['pattern']}" if grp.get("pattern") else ""
    head = "keep FP32" if grp.get("applied_fix") else "suspect"
    return f"trtbisect: {head} ({grp['cause']}{pattern}, group {k + 1}). {why}. {grp['summary']}"


def _set_props(props, values: Mapping[str, str]) -> None:
    existing = {p.key: p for p in props}
    for key, value in values.items():
        if key in existing:
            existing[key].value = value
        else:
            props.add(key=key, value=value)
