"""The fixes diagnosis names, applied and judged where trtbisect can apply them itself: the
layer stays quantized with the fix, the plan's other units stay as the plan has them, and the
run's judge decides. A verified fix is a cheaper plan than un-quantizing the layer.

* `weight_channel_range` (a float weight behind Q -> DQ with one scale): per-channel scales,
  each output channel's largest magnitude over the format's largest (the max calibration
  TensorRT and ModelOpt use for weights);
* `saturation`, `oversized_scale` (an activation whose scale is not its own): the scale from
  the tensor's own largest magnitude on the samples (max calibration);
* `activation_outlier` into a MatMul whose other input is a weight: SmoothQuant's migration
  (Xiao et al., 2023, alpha 0.5): the activation's channel c divided by
  s_c = sqrt(max|x_c| / max|W_c|), the weight's row c multiplied by it (the product is
  unchanged), both quantized again from their new ranges (the weight per output channel).

Nothing is applied to the written plan: a verified fix is reported with its measured error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .diagnose import Finding, _array
from .qdq import DQ, FP8_MAX, Edge, Layer, Q, _initializers, _names

TOP = {"int8": 127.0, **FP8_MAX}  # symmetric formats (zero point 0): the fixes' scales


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _fresh(model: onnx.ModelProto, base: str) -> str:
    taken = {t.name for t in model.graph.initializer} | {
        t for n in model.graph.node for t in [*n.input, *n.output]}
    name = base
    while name in taken:
        name += "_"
    return name


def _rescale(model: onnx.ModelProto, e: Edge, scale: np.ndarray, axis: int | None) -> None:
    """Give the edge's Q and DQ a scale (and zero point) of their own: `scale`, per `axis`."""
    nodes = dict(zip(_names(model), model.graph.node))
    inits = _initializers(model)
    q, dq = nodes[e.q], nodes[e.dq]  # type: ignore[index]
    s_type = inits[dq.input[1]].data_type
    s_name = _fresh(model, f"{e.source}_fixed_scale")
    model.graph.initializer.append(numpy_helper.from_array(
        scale.astype(helper.tensor_dtype_to_np_dtype(s_type)), s_name))
    zp_name = None
    if len(dq.input) > 2 and dq.input[2]:
        zp = inits[dq.input[2]]
        zp_name = _fresh(model, f"{e.source}_fixed_zero_point")
        model.graph.initializer.append(helper.make_tensor(
            zp_name, zp.data_type, list(scale.shape), [0] * int(scale.size)))
    for node in (q, dq):
        node.input[1] = s_name
        if zp_name is not None and len(node.input) > 2:
            node.input[2] = zp_name
        for a in [a for a in node.attribute if a.name == "axis"]:
            node.attribute.remove(a)
        if axis is not None:
            node.attribute.append(helper.make_attribute("axis", axis))


def _own_scale(model: onnx.ModelProto, e: Edge, values: Sequence[np.ndarray]
               ) -> onnx.ModelProto | None:
    if e.weight or e.q is None or not values or e.format not in TOP:
        return None
    amax = max(float(np.max(np.abs(v))) for v in values)
    if amax <= 0:
        return None
    out = _copy(model)
    _rescale(out, e, np.array(amax / TOP[e.format], np.float32), None)
    return out


def _weight_axis(layer: Layer, e: Edge, w: np.ndarray) -> int | None:
    if layer.op == "MatMul":
        return w.ndim - 1
    if layer.op in ("Conv",):
        return 0
    if layer.op == "Gemm" and e.slot == 1:
        return 1  # transB=0 (checked by the caller's weight shape: [in, out])
    return None


def _per_channel(model: onnx.ModelProto, layer: Layer, e: Edge) -> onnx.ModelProto | None:
    if not e.weight or e.q is None or e.per_channel or e.format not in TOP:
        return None
    w = _array(_initializers(model)[e.source])
    axis = _weight_axis(layer, e, w)
    if axis is None:
        return None
    amax = np.moveaxis(np.abs(w), axis, 0).reshape(w.shape[axis], -1).max(axis=1)
    out = _copy(model)
    _rescale(out, e, np.maximum(amax, 1e-30).astype(np.float32) / TOP[e.format], axis)
    return out


def _smooth(model: onnx.ModelProto, layer: Layer, values: Mapping[str, Sequence[np.ndarray]],
            weights: Mapping[str, np.ndarray]) -> onnx.ModelProto | None:
    """SmoothQuant's migration for a MatMul reading a quantized activation and a weight."""
    if layer.op != "MatMul" or len(layer.edges) != 2:
        return None
    act = next((e for e in layer.edges if not e.weight and e.q is not None), None)
    wgt = next((e for e in layer.edges if e.weight), None)
    if act is None or wgt is None or act.slot != 0 or wgt.slot != 1 or act.format not in TOP:
        return None
    vals = values.get(act.source) or []
    inits = _initializers(model)
    w = (_array(inits[wgt.source]) if wgt.q is not None
         else np.asarray(weights[wgt.dq], np.float32))
    if not vals or w.ndim != 2:
        return None
    x_max = np.max(np.stack([np.abs(v).reshape(-1, v.shape[-1]).max(axis=0) for v in vals]),
                   axis=0)
    w_max = np.abs(w).max(axis=1)
    s = np.sqrt(np.maximum(x_max, 1e-12) / np.maximum(w_max, 1e-12)).astype(np.float32)
    out = _copy(model)
    nodes = dict(zip(_names(out), out.graph.node))
    q = nodes[act.q]  # type: ignore[index]
    inv, smoothed = _fresh(out, f"{act.source}_smooth_inverse"), _fresh(out, f"{act.source}_smoothed")
    s_type = inits[q.input[1]].data_type
    np_type = helper.tensor_dtype_to_np_dtype(s_type)
    out.graph.initializer.append(numpy_helper.from_array((1 / s).astype(np_type), inv))
    position = list(out.graph.node).index(q)
    out.graph.node.insert(position, helper.make_node("Mul", [act.source, inv], [smoothed],
                                                     _fresh(out, f"{layer.name}/smooth")))
    q.input[0] = smoothed
    amax = max(float(np.max(np.abs(v / s))) for v in vals)
    _rescale(out, Edge(act.consumer, act.slot, act.dq, act.q, smoothed, False, act.format,
                       act.scale, False, 1), np.array(amax / TOP[act.format], np.float32), None)
    # the weight: its rows times s, quantized per output column behind a Q -> DQ pair
    new_w = (w * s[:, None]).astype(np_type)
    w_name = _fresh(out, f"{wgt.source}_smoothed")
    out.graph.initializer.append(numpy_helper.from_array(new_w, w_name))
    col = np.maximum(np.abs(new_w.astype(np.float32)).max(axis=0), 1e-30) / TOP[wgt.format]
    sc, zp = _fresh(out, f"{w_name}_scale"), _fresh(out, f"{w_name}_zero_point")
    zp_type = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8,
               "fp8e4m3fn": TensorProto.FLOAT8E4M3FN, "fp8e5m2": TensorProto.FLOAT8E5M2
               }.get(wgt.format, TensorProto.INT8)
    out.graph.initializer.extend([
        numpy_helper.from_array(col.astype(np_type), sc),
        helper.make_tensor(zp, zp_type, list(col.shape), [0] * col.size)])
    wq, wdq = _fresh(out, f"{w_name}_q"), _fresh(out, f"{w_name}_dq")
    mm = nodes[layer.name]
    position = list(out.graph.node).index(mm)
    out.graph.node.insert(position, helper.make_node(DQ, [wq, sc, zp], [wdq], wdq, axis=1))
    out.graph.node.insert(position, helper.make_node(Q, [w_name, sc, zp], [wq], wq, axis=1))
    mm.input[1] = wdq
    return out


def variants(model: onnx.ModelProto, layer: Layer, findings: Sequence[Finding],
             values: Mapping[str, Sequence[np.ndarray]], weights: Mapping[str, np.ndarray]
             ) -> list[tuple[str, onnx.ModelProto]]:
    """(description, the model with the fix applied) for each fix trtbisect can apply."""
    kinds = {f.kind: f for f in findings}
    found: list[tuple[str, onnx.ModelProto]] = []
    if "weight_channel_range" in kinds:
        for e in layer.edges:
            m = _per_channel(model, layer, e)
            if m is not None:
                found.append(("per-channel weight scales", m))
    rescaled = model
    own = False
    for e in layer.edges:
        f = next((f for f in findings if f.edge == e.source
                  and f.kind in ("saturation", "oversized_scale")), None)
        if f is not None:
            m = _own_scale(rescaled, e, values.get(e.source) or [])
            if m is not None:
                rescaled, own = m, True
    if own:
        found.append(("each activation's scale from its own range (max calibration)", rescaled))
    if "activation_outlier" in kinds:
        m = _smooth(model, layer, values, weights)
        if m is not None:
            found.append(("SmoothQuant-style scaling (alpha 0.5)", m))
    return found


@dataclass(frozen=True)
class FixJudged:
    """One fix judged on a plan layer (quant/run.py `judge_fixes`, precision.json's
    "fixes_judged"): the layer kept quantized with the fix, the rest of the plan as it is.
    `errors`: per output OutputError.to_json() of the judged model; `error`: why ONNX Runtime
    refused the variant (then not passed, no errors)."""
    fix: str
    passed: bool
    errors: dict[str, dict] | None = None
    error: str | None = None

    @property
    def max_rel(self) -> float | None:
        """The largest relative error over the outputs (None: none measured)."""
        return max((e.get("rel", 0) for e in (self.errors or {}).values()
                    if isinstance(e.get("rel"), (int, float))), default=None)

    def to_json(self) -> dict:
        if self.errors is None:
            return {"fix": self.fix, "passed": self.passed, "error": self.error}
        return {"fix": self.fix, "passed": self.passed, "errors": dict(self.errors)}

    @classmethod
    def from_json(cls, d: Mapping) -> FixJudged:
        errors = d.get("errors")
        return cls(d["fix"], d["passed"], dict(errors) if errors is not None else None,
                   d.get("error"))
