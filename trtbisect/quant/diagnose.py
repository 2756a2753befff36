"""Why a quantized layer fails: numbers measured on the reference's own values at each of the
layer's quantized edges, and the fix each finding calls for (docs/quantization.md).

* activation outlier: a few large values stretch a per-tensor scale, and most of the tensor
  lands below one quantization step (the share is measured);
* weight channels of another range: a per-tensor weight scale whose output channels' ranges
  differ by a large factor (per-channel scales would give each its own);
* saturation: values beyond the format's largest (FP8 E4M3 448, E5M2 57344, INT8 127 steps)
  times the scale, clamped by QuantizeLinear;
* a Softmax or LayerNormalization input quantized: their outputs are exponentially or
  variance sensitive, and TensorRT's placement advice keeps them in float;
* otherwise: the edge's quantization noise (rms of DQ(Q(x)) - x against rms of x).

The round trip DQ(Q(x)) is ONNX Runtime's own (a probe model holding the edge's Q and DQ),
never a re-implementation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..base.escape import visible
from .qdq import DQ, FP8_MAX, INT_RANGE, Edge, Layer, Q, _initializers, _names

OUTLIER_SHARE = 0.5  # at least this share of an activation below one step: an outlier scale
CHANNEL_RATIO = 8.0  # channel ranges this far apart under one scale: 3 bits lost or more
NORMALIZING = {"Softmax": "softmax_input", "LayerNormalization": "layernorm_input"}
SAMPLES = 4  # samples whose values the diagnosis measures


@dataclass
class Finding:
    """One reason a layer fails quantized, with its numbers and the fix."""

    kind: str  # activation_outlier | weight_channel_range | saturation | softmax_input | ...
    edge: str  # the quantized tensor (the Q's input, or the weight)
    text: str
    fix: str
    evidence: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"kind": self.kind, "tensor": self.edge, "text": self.text, "fix": self.fix,
                "evidence": self.evidence}


@dataclass
class EdgeStats:
    values: np.ndarray  # the float values (flattened over the samples measured)
    noise: float  # rms(DQ(Q(x)) - x) / rms(x) (nan: unknown, a stored quantized weight)
    scale: np.ndarray
    clipped: float  # share of values beyond the format's largest times the scale
    below_step: float  # share of |x| below one quantization step (integer formats)
    covers: tuple[float, float] = (0.0, 0.0)  # the range the scale and zero point cover


def _g(x: float) -> str:
    return f"{x:.3g}"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if x >= 0.001 else f"{100 * x:.2g}%"


def _q(name: str) -> str:
    """A model's name as a sentence quotes it (escaped: names are hostile input)."""
    return repr(visible(name))


def _array(t: TensorProto) -> np.ndarray:
    return np.asarray(numpy_helper.to_array(t)).astype(np.float32)


def roundtrip(model: onnx.ModelProto, edge: Edge, values: Sequence[np.ndarray]
              ) -> list[np.ndarray]:
    """DQ(Q(v)) for each of `values`, with the edge's own Q and DQ nodes on ONNX Runtime (one
    probe session per edge)."""
    from .judge import session

    names = _names(model)
    nodes = {name: n for name, n in zip(names, model.graph.node)}
    q, dq = nodes[edge.q], nodes[edge.dq]  # type: ignore[index]
    inits = _initializers(model)
    feeds = sorted({t for t in [*q.input[1:], *dq.input[1:]] if t})
    copies = [helper.make_node(Q, ["x", *q.input[1:]], ["q"], domain=q.domain,
                               **{a.name: helper.get_attribute_value(a) for a in q.attribute}),
              helper.make_node(DQ, ["q", *dq.input[1:]], ["y"], domain=dq.domain,
                               **{a.name: helper.get_attribute_value(a) for a in dq.attribute})]
    inits_used = []
    for t in feeds:
        c = TensorProto()
        c.CopyFrom(inits[t])
        c.name = t
        inits_used.append(c)
    elem = inits[q.input[1]].data_type  # the scale's type is the float side's (a float16 file)
    g = helper.make_graph(copies, "probe",
                          [helper.make_tensor_value_info("x", elem, None)],
                          [helper.make_tensor_value_info("y", elem, None)], inits_used)
    m = helper.make_model(g, opset_imports=list(model.opset_import))
    m.ir_version = model.ir_version
    sess = session(m)
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    return [np.asarray(sess.run(["y"], {"x": np.asarray(v).astype(dtype)})[0], np.float32)
            for v in values]


def covered(model: onnx.ModelProto, edge: Edge) -> tuple[float, float]:
    """The float range a per-tensor Q covers: (qmin - zp) * s to (qmax - zp) * s for the
    integer formats, +-largest * s for FP8 (whose zero point is 0)."""
    inits = _initializers(model)
    s = float(np.abs(_array(inits[edge.scale])).reshape(-1).max())
    if edge.format in FP8_MAX:
        return -FP8_MAX[edge.format] * s, FP8_MAX[edge.format] * s
    qmin, qmax = INT_RANGE.get(edge.format, (-128, 127))
    zp = 0.0
    nodes = dict(zip(_names(model), model.graph.node))
    dq = nodes.get(edge.dq)
    if dq is not None and len(dq.input) > 2 and dq.input[2] in inits:
        zp = float(np.asarray(numpy_helper.to_array(inits[dq.input[2]]),
                              np.float64).reshape(-1)[0])
    return (qmin - zp) * s, (qmax - zp) * s


def edge_stats(model: onnx.ModelProto, edge: Edge, values: Sequence[np.ndarray]) -> EdgeStats:
    """The edge's numbers on `values` (one array per sample, or the weight)."""
    inits = _initializers(model)
    scale = np.abs(_array(inits[edge.scale])).reshape(-1)
    if edge.q is not None and values:
        noise_num = noise_den = 0.0
        for v, back in zip(values, roundtrip(model, edge, values)):
            noise_num += float(np.sum((back.astype(np.float64) - v) ** 2))
            noise_den += float(np.sum(v.astype(np.float64) ** 2))
        noise = float(np.sqrt(noise_num / noise_den)) if noise_den > 0 else 0.0
    else:
        noise = float("nan")
    signed = np.concatenate([np.asarray(v, np.float32).reshape(-1) for v in values]) \
        if values else np.zeros(0, np.float32)
    flat = np.abs(signed)
    step = float(scale.max()) if scale.size else 0.0
    clipped = below = 0.0
    lo, hi = covered(model, edge)
    if flat.size and not edge.per_channel and step > 0:
        clipped = float(np.mean((signed < lo * (1 + 1e-6)) | (signed > hi * (1 + 1e-6))))
        if edge.format in INT_RANGE:
            below = float(np.mean(flat < step))
    return EdgeStats(flat, noise, scale, clipped, below, (lo, hi))


def _channel_ranges(w: np.ndarray, op: str, slot: int, node: onnx.NodeProto) -> np.ndarray | None:
    """Per output channel: the weight's largest magnitude (None: no channel axis known)."""
    if w.ndim < 2:
        return None
    axis = {"Conv": 0, "ConvTranspose": 1, "MatMul": w.ndim - 1}.get(op)
    if op == "Gemm":
        trans = {a.name: a.i for a in node.attribute}.get("transB" if slot == 1 else "transA", 0)
        axis = 0 if (slot == 1 and trans) else (1 if slot == 1 else None)
    if axis is None:
        return None
    moved = np.moveaxis(np.abs(w), axis, 0).reshape(w.shape[axis], -1)
    return moved.max(axis=1)


def diagnose(model: onnx.ModelProto, layer: Layer, values: Mapping[str, Sequence[np.ndarray]],
             weights: Mapping[str, np.ndarray]) -> list[Finding]:
    """The findings for `layer`: `values` maps an activation's float source tensor to its
    values on a few samples (the reference's); `weights`: the dequantized stored weights by DQ
    node name."""
    inits = _initializers(model)
    nodes = dict(zip(_names(model), model.graph.node))
    found: list[Finding] = []
    measured: list[EdgeStats] = []
    for e in layer.edges:
        if e.weight:
            w = weights.get(e.dq) if e.q is None else _array(inits[e.source])
            vals = [np.asarray(w, np.float32)] if w is not None else []
        else:
            vals = list(values.get(e.source, ()))
        s = edge_stats(model, e, vals)
        if not e.weight:
            measured.append(s)
        found += _edge_findings(layer, e, s, nodes[layer.name])
        if e.weight and vals:
            found += weight_findings(layer, e, vals[0], nodes[layer.name])
    if layer.op in NORMALIZING:
        found.append(Finding(
            NORMALIZING[layer.op], layer.edges[0].source,
            f"the {layer.op} input is quantized ({layer.edges[0].format}): its output is "
            f"sensitive to the input's absolute error" + (
                ", which exp() turns into a relative error of each probability"
                if layer.op == "Softmax" else ", through the variance it divides by"),
            f"exclude the op type: ModelOpt op_types_to_exclude=['{layer.op}'] (or "
            f"--op_types_to_exclude {layer.op}); TensorRT runs it in float then"))
    if not found:
        worst = max(measured, key=lambda s: -1 if np.isnan(s.noise) else s.noise,
                    default=None)
        noise = worst.noise if worst is not None else float("nan")
        found.append(Finding(
            "quantization_noise", layer.edges[0].source,
            f"{layer.op} computes on quantized inputs whose noise is "
            + (f"{_pct(noise)} of their rms" if not np.isnan(noise) else "unmeasured")
            + "; nothing else stands out, so the error builds up over the layer",
            "keep it in float (nodes_to_exclude), or calibrate on more representative samples",
            {"noise": noise}))
    return found


def _edge_findings(layer: Layer, e: Edge, s: EdgeStats, node: onnx.NodeProto) -> list[Finding]:
    out: list[Finding] = []
    name = e.source
    if s.clipped > 0:
        top = FP8_MAX.get(e.format)
        limit = (f"{e.format.upper()}'s largest value {top:g} times the scale "
                 f"{_g(float(s.scale.max()))}" if top else
                 f"the range [{_g(s.covers[0])}, {_g(s.covers[1])}] its {e.format} scale and "
                 "zero point cover")
        out.append(Finding(
            "saturation", name,
            f"{_pct(s.clipped)} of the values of {_q(name)} fall outside {limit} (they reach "
            f"{_g(float(s.values.max()))} in magnitude): QuantizeLinear clamps them",
            "recalibrate so the scale covers the tensor's range (amax / "
            + (f"{top:g}" if top else "the format's largest") + "; ModelOpt "
            "calibration_method='max'), or exclude the layer",
            {"clipped_share": s.clipped, "max_abs": float(s.values.max()),
             "scale": float(s.scale.max()), "covered": list(s.covers)}))
    if not e.weight and s.below_step >= OUTLIER_SHARE and s.values.size:
        step, top = float(s.scale.max()), float(s.values.max())
        covers, median = step * 127, float(np.median(s.values))
        evidence = {"below_step_share": s.below_step, "max_abs": top, "median_abs": median,
                    "scale": step, "noise": s.noise}
        if covers > 2 * top:  # the scale is not the tensor's own
            out.append(Finding(
                "oversized_scale", name,
                f"{_pct(s.below_step)} of the values of {_q(name)} are below one quantization step "
                f"({_g(step)}): its scale covers {_g(covers)}, the tensor reaches "
                f"{_g(top)} only (a scale shared with another tensor, or calibrated on other "
                "data)",
                "give the tensor a scale from its own range (for an Add, each side its own "
                "scale), or exclude the layer", evidence))
        elif median > 0:  # a median of 0 (one-hot, mostly zeros) gives no outlier ratio
            out.append(Finding(
                "activation_outlier", name,
                f"{_pct(s.below_step)} of the values of {_q(name)} are below one quantization step "
                f"({_g(step)}): its largest value {_g(top)} is {_g(top / median)}x "
                f"its median magnitude {_g(median)}, and the per-tensor scale stretches to it",
                "SmoothQuant-style scaling (move the outlier channel's range into the next "
                "weight), or a percentile/entropy calibration (ModelOpt "
                "calibration_method='entropy'), or exclude the layer", evidence))
    return out


def weight_findings(layer: Layer, e: Edge, w: np.ndarray, node: onnx.NodeProto
                    ) -> list[Finding]:
    """A per-tensor weight whose output channels' ranges differ widely."""
    if e.per_channel or not e.weight:
        return []
    ranges = _channel_ranges(np.asarray(w, np.float32), layer.op, e.slot, node)
    if ranges is None or ranges.size < 2:
        return []
    nz = ranges[ranges > 0]
    if nz.size < 2:
        return []
    ratio = float(nz.max() / nz.min())
    if ratio < CHANNEL_RATIO:
        return []
    return [Finding(
        "weight_channel_range", e.source,
        f"{layer.op}'s weight {_q(e.source)} has one {e.format} scale for all {ranges.size} "
        f"output channels, whose ranges differ {_g(ratio)}x (largest {_g(float(nz.max()))}, "
        f"smallest {_g(float(nz.min()))}): the small channels keep "
        f"{max(0.0, 7 - np.log2(ratio)):.1f} of 7 bits",
        "quantize the weight per channel (axis of the output channels; ModelOpt and "
        "TensorRT's per-channel weight scales), or exclude the layer",
        {"channel_range_ratio": ratio, "channels": int(ranges.size)})]
