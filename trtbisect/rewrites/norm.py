"""fuse_layernorm / fuse_rmsnorm: a decomposed normalisation -> one ONNX normalisation op.

Exporters below opset 17 write LayerNorm as ReduceMean, Sub, Pow, ReduceMean, Add(eps), Sqrt,
Div (then Mul gamma, Add beta); in FP16, (x - mean)^2 overflows once |x - mean| > 256.
TensorRT's own advice is to export at opset >= 17 so the parser builds one INormalizationLayer
(warning "Running layernorm after self-attention in FP16 may cause overflow. Exporting the model
to the latest available ONNX opset (later than opset 17) to use the INormalizationLayer ...",
quoted in https://github.com/pytorch/TensorRT/issues/2730; TensorRT 8.6 release notes, quoted in
https://github.com/NVIDIA/TensorRT/issues/3657: "target the latest ONNX opset that contains the
corresponding function ops, for example: opset 17 for LayerNormalization"). The fused op keeps
its statistics in FP32 (stash_type=1), which is also how the emulator runs it.

RMSNorm (x / sqrt(mean(x^2) + eps), x * rsqrt(...) as Hugging Face and nn.RMSNorm export it,
x * (1 / sqrt(...)), or w * x / sqrt(...); core.norm_tail) -> RMSNormalization exists only from opset 23 (onnx >= 1.18;
onnxruntime runs it on CPU). Raising an opset is allowed only through onnx.version_converter
followed by the full ONNX checker: a model with an op the converter cannot carry is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import version_converter

from .core import (
    Editor,
    Match,
    Ranges,
    Refusal,
    Rewrite,
    RewriteRefused,
    View,
    norm_tail,
    normalized_axes,
    opset_of,
    square_of,
)

LN, RMS = "fuse_layernorm", "fuse_rmsnorm"


@dataclass
class Chain:
    """The matched tail square -> ReduceMean -> Add(eps) -> Sqrt -> Div(num, .) [-> Mul/Add]."""

    where: list[str]
    drop: list[str]  # output tensors of the nodes that go
    out: str  # the tensor the fused op must produce
    k: int  # number of trailing axes normalised
    eps: float
    gamma: np.ndarray | None
    beta: np.ndarray | None


def find_layernorm(model: onnx.ModelProto, ranges: Ranges | None = None) -> list[Match | Refusal]:
    view = View.of(model)
    found: list[Match | Refusal] = []
    for node in view.nodes:
        d = square_of(view, node)
        sub = view.prod(d) if d else None
        mean = view.prod(sub.input[1]) if sub is not None and sub.op_type == "Sub" else None
        if sub is None or mean is None or mean.op_type != "ReduceMean" \
                or mean.input[0] != sub.input[0]:
            continue
        found.append(_layernorm(view, mean, sub, node))
    return found


def _layernorm(view: View, mean: onnx.NodeProto, sub: onnx.NodeProto,
               sq: onnx.NodeProto) -> Match | Refusal:
    x, d = sub.input[0], sub.output[0]
    head = [view.name(mean), view.name(sub)]
    if view.only_user(mean.output[0]) is not sub:
        return Refusal(LN, tuple(head), f"the mean {mean.output[0]} is also used elsewhere")
    chain = _chain(view, LN, sq, d, head, mean_axes=view.reduce_axes(mean), beta=True)
    if isinstance(chain, Refusal):
        return chain
    extra = [n for n in view.user_names(d) if n not in chain.where]
    if extra or d in view.graph_outputs:
        return Refusal(LN, tuple(chain.where), f"x - mean ({d}) is also used by "
                       f"{', '.join(extra) or 'a graph output'}; fusing would drop that value")
    chain.drop += [mean.output[0], d]
    return Match(LN, tuple(chain.where),
                 f"decomposed LayerNorm over the last {chain.k} axes, eps={chain.eps:g} -> "
                 "LayerNormalization (statistics in FP32)",
                 {"x": x, "chain": chain, "opset": 17})


def find_rmsnorm(model: onnx.ModelProto, ranges: Ranges | None = None) -> list[Match | Refusal]:
    view = View.of(model)
    found: list[Match | Refusal] = []
    for node in view.nodes:
        x = square_of(view, node)
        if x is None or _is_centred(view, x):
            continue
        chain = _chain(view, RMS, node, x, [], mean_axes=None, beta=False)
        if isinstance(chain, Refusal):
            found.append(chain)
            continue
        found.append(Match(RMS, tuple(chain.where),
                           f"decomposed RMSNorm over the last {chain.k} axes, eps={chain.eps:g}"
                           " -> RMSNormalization (opset 23, statistics in FP32)",
                           {"x": x, "chain": chain, "opset": 23}))
    return found


def _is_centred(view: View, x: str) -> bool:
    sub = view.prod(x)
    mean = view.prod(sub.input[1]) if sub is not None and sub.op_type == "Sub" else None
    return mean is not None and mean.op_type == "ReduceMean"


def _chain(view: View, rule: str, sq: onnx.NodeProto, num: str, head: list[str],
           mean_axes: list[int] | None, beta: bool) -> Chain | Refusal:
    """Walk square -> ReduceMean -> Add(eps) -> Sqrt -> Div(num, .), refusing with a reason."""
    where = [*head, view.name(sq)]

    def refuse(reason: str) -> Refusal:
        return Refusal(rule, tuple(where), reason)

    var = view.only_user(sq.output[0])
    if var is None or var.op_type != "ReduceMean":
        return refuse("the square is not averaged by a single ReduceMean")
    where.append(view.name(var))
    k = _trailing(view, num, view.reduce_axes(var), mean_axes)
    if isinstance(k, str):
        return refuse(k)
    if view.attr(var, "keepdims", 1) != 1:
        return refuse("the variance ReduceMean drops the reduced axes (keepdims=0)")
    add = view.only_user(var.output[0])
    if add is not None and add.op_type == "Sqrt":
        after = view.only_user(add.output[0])
        if after is not None and after.op_type == "Add":
            return refuse("eps is added after Sqrt (sqrt(var) + eps); the fused op adds it to "
                          "the variance, so the result would change")
        return refuse("no eps is added to the variance before Sqrt")
    if add is None or add.op_type != "Add":
        return refuse("the variance does not feed a single Add(eps)")
    where.append(view.name(add))
    eps_t = add.input[1] if add.input[0] == var.output[0] else add.input[0]
    eps = view.const(eps_t)
    if eps is None or eps.dtype.kind != "f":
        return refuse(f"eps {eps_t} is not a float constant")
    if eps.size != 1:
        return refuse(f"eps {eps_t} is not a scalar (shape {list(eps.shape)})")
    sqrt = view.only_user(add.output[0])
    if sqrt is None or sqrt.op_type != "Sqrt":
        return refuse("variance + eps is not followed by a single Sqrt")
    tail = norm_tail(view, sqrt, num)
    if isinstance(tail, str):
        return refuse(tail)
    where += [view.name(sqrt), *(view.name(n) for n in tail.nodes)]
    drop = [sq.output[0], var.output[0], add.output[0], sqrt.output[0],
            *(n.output[0] for n in tail.nodes)]
    bare = Chain(where, drop, tail.out, k, float(eps.reshape(-1)[0]), None, None)
    chain = _affine(view, bare, num, rule, beta)
    shape = view.shape(num)
    if isinstance(chain, Chain) and tail.weight is not None:  # w * x / sqrt(...): w is gamma
        w = _fit(view.const(tail.weight), shape[-k:] if shape is not None else None)
        if w is None:
            return refuse(f"the weight {tail.weight} applied before the division does not fit "
                          "the normalised shape")
        chain.gamma = chain.gamma * w
    return chain


def _trailing(view: View, x: str, axes: list[int] | None, mean_axes: list[int] | None) -> int | str:
    """How many trailing axes the ReduceMean(s) normalise, or why they do not fit."""
    rank = view.rank(x)
    got = normalized_axes(axes, rank) if axes is not None else None
    if got is None:
        return "the reduced axes are not known (non-constant axes or unknown rank)"
    if mean_axes is not None and normalized_axes(mean_axes, rank) != got:
        return (f"the mean reduces axes {mean_axes} but the variance reduces {axes}; "
                "LayerNormalization needs both over the same axes")
    k = len(got)
    want = list(range(rank - k, rank)) if rank is not None else list(range(-k, 0))
    if got != want or k == 0:
        return (f"reduces axes {axes} of a rank-{rank} input; the fused op normalises "
                "trailing axes only")
    return k


def _affine(view: View, chain: Chain, x: str, rule: str, beta: bool) -> Chain | Refusal:
    """Absorb a following Mul(gamma) and Add(beta) by constants of the normalised shape."""
    shape = view.shape(x)
    norm = shape[-chain.k:] if shape is not None else None
    if norm is None or any(not d for d in norm):
        return Refusal(rule, tuple(chain.where), "the normalised shape is not static")
    for op in ("Mul", "Add") if beta else ("Mul",):
        nxt = view.only_user(chain.out)
        if nxt is None or nxt.op_type != op:
            continue
        other = nxt.input[1] if nxt.input[0] == chain.out else nxt.input[0]
        value = _fit(view.const(other), norm)
        if value is None:
            continue
        if op == "Mul":
            chain.gamma = value
        else:
            chain.beta = value
        chain.where.append(view.name(nxt))
        chain.drop.append(nxt.output[0])
        chain.out = nxt.output[0]
    if chain.gamma is None:
        chain.gamma = np.ones([int(d or 0) for d in norm], np.float32)
    return chain


def _fit(value: np.ndarray | None, shape: Sequence[int | None] | None) -> np.ndarray | None:
    """The constant broadcast to the normalised shape, or None when it does not fit (or the
    shape is not known)."""
    if value is None or value.dtype != np.float32 or shape is None or None in shape:
        return None
    norm = [int(d) for d in shape if d is not None]
    while value.ndim > len(norm) and value.shape[0] == 1:
        value = value.reshape(value.shape[1:])
    try:
        if np.broadcast_shapes(value.shape, tuple(norm)) != tuple(norm):
            return None
    except ValueError:
        return None
    return np.ascontiguousarray(np.broadcast_to(value, norm), dtype=np.float32)


def raise_opset(model: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """The model at `target` through onnx.version_converter, checked; or RewriteRefused."""
    current = opset_of(model)
    if current >= target:
        return model
    try:
        converted = version_converter.convert_version(model, target)
        onnx.checker.check_model(converted, full_check=True)
    except Exception as exc:  # the converter raises several types; all mean "cannot"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise RewriteRefused(f"needs opset {target}, and converting this opset-{current} model "
                             f"failed: {first}") from exc
    if ([(v.name, v.type) for v in converted.graph.input] != [(v.name, v.type) for v in model.graph.input]
            or [v.name for v in converted.graph.output] != [v.name for v in model.graph.output]):
        raise RewriteRefused(f"converting to opset {target} changed the graph inputs/outputs")
    return converted


def _apply(model: onnx.ModelProto, match: Match, op: str) -> onnx.ModelProto:
    chain: Chain = match.params["chain"]
    ed = Editor(raise_opset(model, match.params["opset"]))
    missing = [t for t in chain.drop if t not in ed.view.producer]
    if missing:
        raise RewriteRefused(f"the opset conversion rewrote the chain ({missing[0]} is gone)")
    scope = chain.where[-1].rsplit("/", 1)[0] if "/" in chain.where[-1] else chain.where[-1]
    assert chain.gamma is not None  # _affine always sets it
    inputs = [match.params["x"], ed.constant(f"{scope}.{op}.scale", chain.gamma)]
    if chain.beta is not None:
        inputs.append(ed.constant(f"{scope}.{op}.bias", chain.beta))
    ed.drop(*chain.drop)
    ed.add(chain.out, op, inputs, [chain.out], f"{scope}/{op}", axis=-chain.k,
           epsilon=chain.eps, stash_type=1)
    return ed.finish()


def apply_layernorm(model: onnx.ModelProto, match: Match) -> onnx.ModelProto:
    return _apply(model, match, "LayerNormalization")


def apply_rmsnorm(model: onnx.ModelProto, match: Match) -> onnx.ModelProto:
    return _apply(model, match, "RMSNormalization")


LAYERNORM = Rewrite(
    name=LN, find=find_layernorm, apply=apply_layernorm,
    summary="fuse a decomposed LayerNorm into one LayerNormalization (opset 17)",
    exact="FP32 rounding only (same formula, one kernel)",
    advice="export with torch.onnx.export(..., opset_version=17) or later so nn.LayerNorm (or "
           "F.layer_norm) becomes one LayerNormalization; replace a hand-written "
           "(x - mean) / sqrt(var + eps) with nn.LayerNorm",
    patterns=("layernorm_decomposed",),
)

RMSNORM = Rewrite(
    name=RMS, find=find_rmsnorm, apply=apply_rmsnorm,
    summary="fuse a decomposed RMSNorm into one RMSNormalization (opset 23)",
    exact="FP32 rounding only (same formula, one kernel)",
    advice="use torch.nn.RMSNorm and export at opset 23, or keep the square in range by "
           "scaling x before squaring (see scale_before_square)",
    patterns=("rmsnorm_decomposed",),
)
