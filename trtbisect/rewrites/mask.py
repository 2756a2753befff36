"""clamp_mask_constant: an attention-mask fill beyond FP16's range -> a finite FP16-safe value.

HF exports build the additive mask as `(1 - mask) * torch.finfo(float32).min` (-3.4e38). In
FP16 the constant rounds to -inf and `0 * -inf` is NaN for every kept key. Any fill far enough
below the logits gives the same Softmax: exp(fill - max) underflows to exactly 0 in FP32 when
fill is more than ~104 below the row's maximum, and in FP16 when more than ~17 below.

Why -1e4 rather than -65504: both are exact in FP16, but -65504 has no headroom. A padding
mask plus a causal mask (-131008), or the fill plus a negative logit, rounds to -inf in FP16,
and a fully masked row of -inf gives NaN. -1e4 keeps a 6.5x margin and is the value the
original BERT code used, while staying ~1e4 below any logit FP16 can hold.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import onnx
from onnx import numpy_helper

from .core import FP16_MAX, LAYOUT_OPS, Editor, Match, Ranges, Refusal, Rewrite, View

NAME = "clamp_mask_constant"
MASK_FILL = -1.0e4
MASK_PATH_OPS = LAYOUT_OPS | {"Mul", "Where", "Sub", "Add", "Neg"}
MAX_HOPS = 8


def find(model: onnx.ModelProto, ranges: Ranges | None = None) -> list[Match | Refusal]:
    view = View.of(model)
    found: list[Match | Refusal] = []
    for tensor, source in _out_of_range_constants(view):
        found.append(_judge_constant(view, tensor, source))
    return found


def _out_of_range_constants(view: View) -> list[tuple[str, str | None]]:
    """(tensor, Constant/ConstantOfShape node name or None) for float constants beyond FP16."""
    out: list[tuple[str, str | None]] = []
    for name, init in view.inits.items():
        if _beyond(numpy_helper.to_array(init)):
            out.append((name, None))
    for i, node in enumerate(view.nodes):
        if node.op_type in ("Constant", "ConstantOfShape") and _beyond(_node_value(node)):
            out.append((node.output[0], view.names[i]))
    return out


def _node_value(node: onnx.NodeProto | None) -> np.ndarray | None:
    if node is None:
        return None
    for a in node.attribute:
        if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
            return numpy_helper.to_array(a.t)
        if a.name == "value_float":
            return np.array(a.f, np.float32)
        if a.name == "value_floats":
            return np.array(list(a.floats), np.float32)
    return None


def _beyond(arr: np.ndarray | None) -> bool:
    if arr is None or arr.dtype.kind != "f" or arr.size == 0:
        return False
    finite = arr[np.isfinite(arr)]
    return bool(finite.size) and float(np.max(np.abs(finite))) > FP16_MAX


def _judge_constant(view: View, tensor: str, source: str | None) -> Match | Refusal:
    users = view.user_names(tensor)
    where = tuple(([source] if source else []) + users)
    off_path = [u for u, node in zip(users, view.users(tensor)) if _softmax_after(view, node) is None]
    if not users:
        return Refusal(NAME, where, f"{tensor} has no consumer")
    if len(off_path) == len(users):
        return Refusal(NAME, where, f"{tensor} is beyond FP16's range but does not feed an "
                       f"additive mask before a Softmax (none within {MAX_HOPS} steps through "
                       "Mul/Where/Sub/Add and layout ops)")
    if off_path or tensor in view.graph_outputs:
        return Refusal(NAME, where, f"{tensor} is also used outside the mask path "
                       f"(by {', '.join(off_path) or 'a graph output'}); clamping it would "
                       "change that use")
    risky = _large_factor(view, tensor)
    if risky:
        return Refusal(NAME, where, risky)
    softmax = _softmax_after(view, view.users(tensor)[0])
    value = _extreme(view, tensor)
    return Match(NAME, where, f"mask fill {value:.4g} -> {MASK_FILL:g} (FP16 rounds it to "
                 f"-inf, and 0 * -inf = NaN) before {softmax}",
                 {"tensor": tensor, "source": source})


def _extreme(view: View, tensor: str) -> float:
    arr = view.const(tensor)
    if arr is None:
        arr = _node_value(view.prod(tensor))
    if arr is None:
        raise ValueError(f"{tensor!r} holds no constant: the match is stale")
    finite = arr[np.isfinite(arr)]
    return float(finite[np.argmax(np.abs(finite))])


def _softmax_after(view: View, start: onnx.NodeProto) -> str | None:
    """The Softmax reached from `start` through mask-path ops, or None."""
    seen = {id(start)}
    queue = deque([(start, 0)])
    while queue:
        node, hops = queue.popleft()
        if node.op_type in ("Softmax", "LogSoftmax"):
            return view.name(node)
        if node.op_type not in MASK_PATH_OPS or hops >= MAX_HOPS:
            continue
        for t in node.output:
            for u in view.users(t):
                if id(u) not in seen:
                    seen.add(id(u))
                    queue.append((u, hops + 1))
    return None


def _large_factor(view: View, tensor: str) -> str | None:
    """Refuse when a Mul scales the fill by a known factor beyond 1: the product could
    overflow FP16 again. A factor computed from data is left to the judge (every sample)."""
    for node in view.users(tensor):
        if node.op_type != "Mul":
            continue
        other = node.input[1] if node.input[0] == tensor else node.input[0]
        value = view.static(other)
        if value is not None and value.size and float(np.max(np.abs(value))) > 1.0:
            big = float(np.max(np.abs(value)))
            return (f"{view.name(node)} multiplies the fill by up to {big:.4g}: "
                    f"{big:.4g} x {MASK_FILL:g} can leave FP16's range; not a 0/1 mask")
    return None


def apply(model: onnx.ModelProto, match: Match) -> onnx.ModelProto:
    ed = Editor(model)
    tensor, source = match.params["tensor"], match.params["source"]
    if source is None:
        init = next(t for t in ed.model.graph.initializer if t.name == tensor)
        init.CopyFrom(numpy_helper.from_array(_clamped(numpy_helper.to_array(init)), tensor))
    else:
        node = ed.model.graph.node[ed.view.producer[tensor]]
        for a in node.attribute:
            if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                a.t.CopyFrom(numpy_helper.from_array(_clamped(numpy_helper.to_array(a.t)),
                                                     a.t.name))
            elif a.name == "value_float":
                a.f = float(_clamped(np.array(a.f, np.float32)))
            elif a.name == "value_floats":
                a.floats[:] = _clamped(np.array(list(a.floats), np.float32)).tolist()
    return ed.finish()


def _clamped(arr: np.ndarray) -> np.ndarray:
    """Out-of-range values -> the FP16-safe fill (sign kept); in-range values untouched."""
    out = np.where(arr < -FP16_MAX, MASK_FILL, np.where(arr > FP16_MAX, -MASK_FILL, arr))
    return out.astype(arr.dtype)


REWRITE = Rewrite(
    name=NAME, find=find, apply=apply,
    summary="clamp an attention-mask fill beyond FP16's range (e.g. -3.4e38) to -1e4",
    exact="exact while every row keeps one unmasked key and logits stay within ~9e3 of each "
          "other (exp of the gap underflows to 0 either way); measured on the samples",
    advice="build the mask with -1e4 or torch.finfo(torch.float16).min instead of "
           "torch.finfo(torch.float32).min (e.g. in BertModel.get_extended_attention_mask / "
           "ModuleUtilsMixin: pass dtype=torch.float16 or override the fill)",
    patterns=("attention_mask",),
)
