"""Rewrites that move a scale so an intermediate value stays inside FP16's range.

- prescale_attention: MatMul(Q, K^T) / c  ->  MatMul(Q * (1/c), K^T). The logits never exist
  unscaled; exact when c is a power of two (sqrt(d) for d = 4^n), else FP32 rounding.
- reducesum_to_mean: ReduceSum(x) * (1/N) -> ReduceMean(x); ReduceSum(x) * c -> ReduceSum(x * c)
  when c is not 1/N (c < 1). The sum is never formed at full size.
- scale_before_square: mean(x^2) -> s^2 * mean((x/s)^2), s a power of two chosen from the
  samples so (x/s)^2 sits near 1..64; inside a norm (x / sqrt(mean(x^2) + eps)) the scale
  cancels exactly: (x/s) / sqrt(mean((x/s)^2) + eps/s^2). Powers of two make the scaling exact.
- raise_epsilon: an eps below FP16's smallest normal (2^-14) -> 2^-14; only kept when the FP32
  drift and the judge both allow it.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from .core import (
    FP16_MAX,
    FP16_MIN_NORMAL,
    LAYOUT_OPS,
    Editor,
    Match,
    Ranges,
    Refusal,
    Rewrite,
    View,
    norm_tail,
    normalized_axes,
    square_of,
)

ATTENTION_PATH = LAYOUT_OPS | {"Add", "Where", "Sub"}


def _scale_factor(view: View, node: onnx.NodeProto, value: str) -> tuple[float | None, str | None]:
    """(f, None) when node computes value * f with a scalar constant f; (None, reason) else."""
    other = node.input[1] if node.input[0] == value else node.input[0]
    c = view.scalar(other)
    if node.op_type == "Div" and node.input[1] == value:
        return None, f"{view.name(node)} divides by the value, not the value by a constant"
    if c is None:
        return None, f"{view.name(node)} scales by {other}, which is not a scalar constant"
    if c == 0.0:
        return None, f"{view.name(node)} scales by 0"
    return (1.0 / c if node.op_type == "Div" else c), None


# ---------------------------------------------------------------- prescale_attention

PRESCALE = "prescale_attention"


def find_prescale(model: onnx.ModelProto, ranges: Ranges | None = None) -> list[Match | Refusal]:
    view = View.of(model)
    found: list[Match | Refusal] = []
    for i, mm in enumerate(view.nodes):
        if mm.op_type != "MatMul":
            continue
        users = view.users(mm.output[0])
        scale = next((u for u in users if u.op_type in ("Div", "Mul")), None)
        if scale is None or not _reaches_softmax(view, scale):
            continue
        where = (view.names[i], view.name(scale))
        f, why = _scale_factor(view, scale, mm.output[0])
        if f is None:
            found.append(Refusal(PRESCALE, where, why or ""))
        elif len(users) > 1 or mm.output[0] in view.graph_outputs:
            found.append(Refusal(PRESCALE, where, f"the unscaled logits {mm.output[0]} are also "
                                 "used elsewhere"))
        else:
            found.append(Match(PRESCALE, where, f"scale {f:.6g} moved from after {where[0]} onto "
                               "its first input, so the unscaled logits are never stored",
                               {"mm": mm.output[0], "out": scale.output[0], "factor": f}))
    return found


def _reaches_softmax(view: View, node: onnx.NodeProto, hops: int = 4) -> bool:
    frontier = [node]
    for _ in range(hops):
        frontier = [u for n in frontier for u in view.users(n.output[0])]
        if any(u.op_type == "Softmax" for u in frontier):
            return True
        frontier = [u for u in frontier if u.op_type in ATTENTION_PATH]
    return False


def apply_prescale(model: onnx.ModelProto, match: Match) -> onnx.ModelProto:
    ed = Editor(model)
    mm_t, out = match.params["mm"], match.params["out"]
    mm = ed.view.made(mm_t)
    name = ed.view.name(mm)
    factor = ed.constant(f"{name}.prescale", float(match.params["factor"]))
    q = ed.fresh(f"{mm.input[0]}/prescaled")
    ed.add(mm.input[0] or None, "Mul", [mm.input[0], factor], [q], f"{name}/prescale")
    ed.drop(mm_t, out)
    ed.add(out, "MatMul", [q, mm.input[1]], [out], name)
    return ed.finish()


# ---------------------------------------------------------------- reducesum_to_mean

REDUCESUM = "reducesum_to_mean"


def find_reducesum(model: onnx.ModelProto, ranges: Ranges | None = None) -> list[Match | Refusal]:
    view = View.of(model)
    found: list[Match | Refusal] = []
    for i, rs in enumerate(view.nodes):
        nxt = view.only_user(rs.output[0]) if rs.op_type == "ReduceSum" else None
        if nxt is None or nxt.op_type not in ("Mul", "Div"):
            continue
        where = (view.names[i], view.name(nxt))
        f, why = _scale_factor(view, nxt, rs.output[0])
        axes = view.reduce_axes(rs)
        if f is None:
            found.append(Refusal(REDUCESUM, where, why or ""))
        elif axes is None:
            found.append(Refusal(REDUCESUM, where, "the ReduceSum axes are not constant"))
        elif view.attr(rs, "noop_with_empty_axes", 0) and not axes:
            found.append(Refusal(REDUCESUM, where, "the ReduceSum is a no-op (empty axes)"))
        else:
            found.append(_reducesum_match(view, rs, nxt, where, f, axes))
    return found


def _reducesum_match(view: View, rs: onnx.NodeProto, nxt: onnx.NodeProto,
                     where: tuple[str, ...], f: float, axes: list[int]) -> Match | Refusal:
    shape = view.shape(rs.input[0])
    norm = normalized_axes(axes, len(shape)) if shape is not None else None
    count = math.prod(shape[a] or 0 for a in norm) if norm is not None and shape is not None else 0
    params = {"sum": rs.output[0], "out": nxt.output[0], "factor": f, "axes": axes}
    if count and abs(f * count - 1.0) <= 1e-6:
        return Match(REDUCESUM, where, f"sum over {count} elements times 1/{count} -> ReduceMean",
                     {**params, "mean": True})
    if abs(f) >= 1.0:
        return Refusal(REDUCESUM, where, f"the sum is scaled by {f:.4g} (>= 1, not 1/N of "
                       f"{count or 'an unknown count'}); scaling first would not keep it in range")
    return Match(REDUCESUM, where, f"factor {f:.4g} (not 1/N for N={count or 'unknown'}) moved "
                 "before the sum", {**params, "mean": False})


def apply_reducesum(model: onnx.ModelProto, match: Match) -> onnx.ModelProto:
    ed = Editor(model)
    p = match.params
    rs = ed.view.made(p["sum"])
    name, keepdims = ed.view.name(rs), ed.view.attr(rs, "keepdims", 1)
    ed.drop(p["sum"], p["out"])
    if p["mean"]:
        if ed.view.opset >= 18:
            axes = ed.constant(f"{name}.axes", np.array(p["axes"], np.int64))
            ed.add(p["out"], "ReduceMean", [rs.input[0], axes], [p["out"]], f"{name}/mean",
                   keepdims=keepdims)
        else:
            ed.add(p["out"], "ReduceMean", [rs.input[0]], [p["out"]], f"{name}/mean",
                   axes=p["axes"], keepdims=keepdims)
    else:
        factor = ed.constant(f"{name}.prescale", float(p["factor"]))
        scaled = ed.fresh(f"{rs.input[0]}/prescaled")
        ed.add(rs.input[0], "Mul", [rs.input[0], factor], [scaled], f"{name}/prescale")
        ed.add(p["out"], "ReduceSum", [scaled, *rs.input[1:]], [p["out"]], name,
               **{a.name: onnx.helper.get_attribute_value(a) for a in rs.attribute})
    return ed.finish()


# ---------------------------------------------------------------- scale_before_square

SQUARE = "scale_before_square"
SAFE_SQUARE = (2.0**-10, 2.0**13)  # squares of max|x| outside this band get a scale


def find_square(model: onnx.ModelProto, ranges: Ranges | None = None) -> list[Match | Refusal]:
    view = View.of(model)
    found: list[Match | Refusal] = []
    for i, sq in enumerate(view.nodes):
        x = square_of(view, sq)
        mean = view.only_user(sq.output[0]) if x else None
        if x is None or mean is None or mean.op_type != "ReduceMean":
            continue
        where = (view.names[i], view.name(mean))
        if ranges is None:
            found.append(Refusal(SQUARE, where, "choosing the scale needs samples"))
            continue
        amax = ranges(x)
        if amax is None or not np.isfinite(amax) or amax == 0.0:
            found.append(Refusal(SQUARE, where, f"no finite FP32 range of {x} on the samples"))
            continue
        if SAFE_SQUARE[0] <= amax * amax <= SAFE_SQUARE[1]:
            continue  # the square already sits well inside FP16's range
        norm = _norm_tail(view, mean, x)
        s, why = _choose_scale(amax, norm)
        if why:
            found.append(Refusal(SQUARE, where, why))
            continue
        form = "inside a norm (scale cancels)" if norm else "multiplied back after the mean"
        found.append(Match(SQUARE, (*where, *(norm or {}).get("where", ())),
                           f"max|{x}| = {amax:.3g}, square {amax * amax:.3g}: x scaled by "
                           f"2^{int(math.log2(1 / s))} before squaring, {form}",
                           {"x": x, "sq": sq.output[0], "mean": mean.output[0], "s": s,
                            "norm": norm}))
    return found


def _choose_scale(amax: float, norm: dict | None) -> tuple[float, str | None]:
    """s = 2^e with max|x/s| in [4, 8) (squares <= 64), every constant it needs FP16-normal."""
    e = min(max(math.floor(math.log2(amax)) - 2, -15), 14)  # 1/s in [2^-14, 2^15]
    s = 2.0**e
    if norm is not None and norm["eps"] / (s * s) > FP16_MAX:
        return s, f"eps / s^2 = {norm['eps'] / (s * s):.3g} would not fit FP16"
    if norm is None and not FP16_MIN_NORMAL <= s * s <= FP16_MAX:
        return s, (f"the mean of squares itself is out of FP16's range (max|x|^2 = "
                   f"{amax * amax:.3g}); multiplying back by s^2 = 2^{2 * e} cannot help")
    return s, None


def _norm_tail(view: View, mean: onnx.NodeProto, x: str) -> dict | None:
    """ReduceMean -> Add(eps) -> Sqrt -> x / sqrt (in any form core.norm_tail knows: a Div,
    x * rsqrt, x * (1 / sqrt), w * x / sqrt): where the scale cancels exactly."""
    add = view.only_user(mean.output[0])
    if add is None or add.op_type != "Add":
        return None
    eps_t = add.input[1] if add.input[0] == mean.output[0] else add.input[0]
    eps = view.scalar(eps_t)
    sqrt = view.only_user(add.output[0])
    if eps is None or sqrt is None or sqrt.op_type != "Sqrt":
        return None
    tail = norm_tail(view, sqrt, x)
    if isinstance(tail, str):
        return None
    return {"add": add.output[0], "eps_input": eps_t, "eps": eps,
            "div": tail.numerator.output[0],  # the node that reads x: it reads x/s instead
            "where": (view.name(add), view.name(sqrt), *(view.name(n) for n in tail.nodes))}


def apply_square(model: onnx.ModelProto, match: Match) -> onnx.ModelProto:
    ed = Editor(model)
    p = match.params
    x, s, norm = p["x"], p["s"], p["norm"]
    base = ed.view.name(ed.view.made(p["sq"]))
    xs = ed.fresh(f"{x}/scaled")
    ed.add(x, "Mul", [x, ed.constant(f"{base}.inv_scale", float(1.0 / s))], [xs], f"{base}/scale")
    ed.replace_input(p["sq"], x, xs)
    if norm:
        eps = ed.constant(f"{base}.eps_scaled", float(norm["eps"] / (s * s)))
        ed.replace_input(norm["add"], norm["eps_input"], eps)
        ed.replace_input(norm["div"], x, xs)
    else:
        raw = ed.fresh(f"{p['mean']}/scaled")
        mean = ed.model.graph.node[ed.node_at(p["mean"])]
        mean.output[0] = raw
        ed.add(p["mean"], "Mul", [raw, ed.constant(f"{base}.scale_sq", float(s * s))],
               [p["mean"]], f"{base}/unscale")
    return ed.finish()


# ---------------------------------------------------------------- raise_epsilon

EPS = "raise_epsilon"
EPS_USERS = frozenset({"Sqrt", "Reciprocal", "Div", "Log", "Pow"})


def find_eps(model: onnx.ModelProto, ranges: Ranges | None = None) -> list[Match | Refusal]:
    view = View.of(model)
    found: list[Match | Refusal] = []
    for i, add in enumerate(view.nodes):
        if add.op_type != "Add" or not any(u.op_type in EPS_USERS for u in view.users(add.output[0])):
            continue
        for k, t in enumerate(add.input[:2]):
            eps = view.scalar(t)
            if eps is not None and 0.0 < eps < FP16_MIN_NORMAL:
                fp16 = float(np.float16(eps))
                found.append(Match(EPS, (view.names[i],),
                                   f"eps {eps:.3g} is {'0' if fp16 == 0 else f'subnormal {fp16:.3g}'}"
                                   f" in FP16 -> {FP16_MIN_NORMAL:.4g}",
                                   {"add": add.output[0], "input": k}))
    return found


def apply_eps(model: onnx.ModelProto, match: Match) -> onnx.ModelProto:
    ed = Editor(model)
    add = ed.model.graph.node[ed.node_at(match.params["add"])]
    add.input[match.params["input"]] = ed.constant(f"{ed.view.name(add)}.eps_fp16",
                                                   float(FP16_MIN_NORMAL))
    return ed.finish()


PRESCALE_ATTENTION = Rewrite(
    name=PRESCALE, find=find_prescale, apply=apply_prescale,
    summary="move the 1/sqrt(d) attention scale onto Q before the QK^T MatMul",
    exact="exact for a power-of-two scale, else FP32 rounding",
    advice="scale q by head_dim**-0.5 before q @ k.transpose(-2, -1) (or use "
           "F.scaled_dot_product_attention, whose export scales q and k by d^-1/4)",
    patterns=("attention_logits",),
)
REDUCESUM_TO_MEAN = Rewrite(
    name=REDUCESUM, find=find_reducesum, apply=apply_reducesum,
    summary="ReduceSum then divide by the count -> ReduceMean (or scale before the sum)",
    exact="FP32 rounding only",
    advice="use x.mean(dim) (or F.adaptive_avg_pool2d) instead of x.sum(dim) / n",
    patterns=("large_reduction",),
)
SCALE_BEFORE_SQUARE = Rewrite(
    name=SQUARE, find=find_square, apply=apply_square,
    summary="divide x by a power of two before squaring it for a mean, undo it after",
    exact="exact up to FP32 rounding (power-of-two scale; eps rescaled inside a norm); the "
          "scale is chosen from the samples' range",
    advice="normalise or rescale the activation before x.pow(2).mean(...) (e.g. compute the "
           "RMS of x / x.abs().amax().detach()), or use nn.RMSNorm / nn.LayerNorm exported at "
           "an opset that has the fused op",
    patterns=("rmsnorm_decomposed", "layernorm_decomposed"),
)
RAISE_EPSILON = Rewrite(
    name=EPS, find=find_eps, apply=apply_eps,
    summary="raise an eps that FP16 flushes or makes subnormal to 2^-14 (6.1e-5)",
    exact="changes the result where the variance is comparable to eps; kept only within the "
          "drift tolerance",
    advice="use eps >= 1e-5 in the norm layers (e.g. nn.LayerNorm(d, eps=1e-5), "
           "config.layer_norm_eps) when the model tolerates it",
    patterns=("rmsnorm_decomposed", "layernorm_decomposed"),
)
