"""Planted explicitly quantized models (Q/DQ written with onnx.helper, scales computed with
numpy, no ModelOpt): each has one culprit layer and the exact minimal plan a run must find.

* `outlier`: one activation channel 100x the others stretches a per-tensor INT8 scale; the
  first MatMul's input keeps almost nothing of the other channels. Plan: {mm1}.
* `fp8_saturation`: an FP8 E4M3 activation scale calibrated on a quiet sample (amax 448), run
  on values up to 4000: QuantizeLinear clamps at 448. Plan: {mm1}.
* `softmax`: a Softmax whose logits (range +-40) are quantized to INT8. Plan: {softmax}.
* `residual`: an Add quantized on both sides with the residual's scale (an outlier channel)
  shared by the branch, read by a MatMul that weights the outlier channel by ~0. Plan: {add}.
* `channels`: a per-tensor INT8 weight whose output channels differ 300x in range.
  Plan: {mm1}.

Every other layer is quantized well (per-channel weights, activation scales from their own
range): quantized alone, each stays within `RTOL`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RTOL = 0.03  # the planted tests' --rtol: well-quantized layers stay within it, culprits do not
N, C = 16, 16  # samples per batch, channels


@dataclass
class Planted:
    name: str
    model: onnx.ModelProto
    inputs: dict[str, np.ndarray]
    plan: set[str]
    finding: str  # the kind diagnosis must give the culprit
    rtol: float = RTOL


@dataclass
class QBuilder:
    """Q/DQ on activations and weights, INT8 (symmetric, zero point 0) or FP8 E4M3."""

    fmt: str = "int8"
    half: bool = False  # float16 scales and float weights (a file FP16 elsewhere)
    nodes: list = field(default_factory=list)
    inits: list = field(default_factory=list)
    count: int = 0

    @property
    def float(self) -> type:
        return np.float16 if self.half else np.float32

    @property
    def top(self) -> float:
        return 127.0 if self.fmt == "int8" else 448.0

    def _zp(self, name: str, shape=()) -> str:
        if self.fmt == "int8":
            self.inits.append(numpy_helper.from_array(np.zeros(shape, np.int8), name))
        else:
            self.inits.append(helper.make_tensor(name, TensorProto.FLOAT8E4M3FN, list(shape),
                                                 [0.0] * int(np.prod(shape))))
        return name

    def act(self, t: str, amax: float | np.ndarray, axis: int | None = None) -> str:
        """Q -> DQ of `t` with the scale amax / top (per tensor, or per `axis` for an array)."""
        k, self.count = self.count, self.count + 1
        s = f"{t}_scale"
        scale = (np.asarray(amax, np.float32) / self.top).astype(self.float)
        self.inits.append(numpy_helper.from_array(scale, s))
        zp = self._zp(f"{t}_zp", scale.shape)
        attrs = {"axis": axis} if axis is not None else {}
        self.nodes += [helper.make_node("QuantizeLinear", [t, s, zp], [f"{t}_q"], f"q{k}_{t}",
                                        **attrs),
                       helper.make_node("DequantizeLinear", [f"{t}_q", s, zp], [f"{t}_dq"],
                                        f"dq{k}_{t}", **attrs)]
        return f"{t}_dq"

    def weight(self, name: str, w: np.ndarray, per_channel: bool = True,
               stored: bool = True) -> str:
        """A MatMul weight [in, out], per output column or per tensor: INT8 stored quantized
        behind a DQ (as ONNX Runtime's quantizer writes it), or (`stored=False`, and always
        for FP8) the float weight behind Q -> DQ (TensorRT quantizes it at build time)."""
        amax = np.abs(w).max(axis=0) if per_channel else np.array(np.abs(w).max())
        if self.fmt == "fp8" or not stored:
            self.inits.append(numpy_helper.from_array(w.astype(self.float), name))
            return self.act(name, amax, 1 if per_channel else None)
        scale = (amax / 127.0).astype(np.float32)
        q = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
        self.inits += [numpy_helper.from_array(q, f"{name}_int8"),
                       numpy_helper.from_array(scale, f"{name}_scale")]
        zp = self._zp(f"{name}_zp", scale.shape)
        attrs = {"axis": 1} if per_channel else {}
        self.nodes.append(helper.make_node("DequantizeLinear", [f"{name}_int8", f"{name}_scale",
                                                                zp], [f"{name}_dq"],
                                           f"dq_{name}", **attrs))
        return f"{name}_dq"

    def node(self, op: str, inputs, output: str, name: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], name, **attrs))
        return output

    def model(self, inputs: dict[str, np.ndarray], outputs, opset: int | None = None
              ) -> onnx.ModelProto:
        g = helper.make_graph(
            self.nodes, "planted",
            [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v.shape))
             for k, v in inputs.items()],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, [N, C]) for o in outputs],
            self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid(
            "", opset or (21 if self.fmt == "fp8" else 13))])
        m.ir_version = 10
        onnx.checker.check_model(m, full_check=True)
        return m


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _w(rng, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal((C, C)) * scale / np.sqrt(C)).astype(np.float32)


def _amax(x: np.ndarray) -> float:
    return float(np.abs(x).max())


def _tail(b: QBuilder, t: str, rng, amax: float) -> str:
    """A well-quantized MatMul layer `mm2` reading `t` (range amax)."""
    return b.node("MatMul", [b.act(t, amax), b.weight("w2", _w(rng))], "y", "mm2")


def outlier() -> Planted:
    rng = _rng(1)
    x = rng.standard_normal((N, C)).astype(np.float32)
    x[:, 3] *= 100.0  # the outlier channel
    w1 = _w(rng)
    w1[3, :] *= 0.01  # weighted down, as a LayerNorm gain or a SmoothQuant'd model would
    b = QBuilder()
    h = b.node("MatMul", [b.act("x", _amax(x)), b.weight("w1", w1)], "h", "mm1")
    r = b.node("Relu", [h], "hr", "relu")
    _tail(b, r, rng, _amax(np.maximum(x @ w1, 0)))
    return Planted("outlier", b.model({"x": x}, ["y"]), {"x": x}, {"mm1"},
                   "activation_outlier")


def fp8_saturation() -> Planted:
    rng = _rng(2)
    x = (rng.standard_normal((N, C)) * 60).astype(np.float32)
    x[::3, 5] = 4000.0  # beyond the calibrated range: clamped at 448 x scale (= 448)
    w1 = _w(rng)
    b = QBuilder("fp8")
    h = b.node("MatMul", [b.act("x", 448.0), b.weight("w1", w1)], "h", "mm1")
    _tail(b, h, rng, _amax(x @ w1))
    return Planted("fp8_saturation", b.model({"x": x}, ["y"]), {"x": x}, {"mm1"},
                   "saturation", rtol=0.08)  # FP8's 3 fraction bits: a wider tolerance


def softmax() -> Planted:
    rng = _rng(3)
    x = (rng.standard_normal((N, C)) * 13).astype(np.float32)
    b = QBuilder()
    p = b.node("Softmax", [b.act("x", _amax(x))], "p", "softmax", axis=-1)
    _tail(b, p, rng, 1.0)
    return Planted("softmax", b.model({"x": x}, ["y"]), {"x": x}, {"softmax"},
                   "softmax_input")


def residual() -> Planted:
    rng = _rng(4)
    a = rng.standard_normal((N, C)).astype(np.float32)
    x = rng.standard_normal((N, C)).astype(np.float32)
    x[:, 7] *= 100.0  # the residual's outlier channel
    w1, w2 = _w(rng), _w(rng)
    w2[7, :] = 0.0  # the next layer ignores it
    b = QBuilder()
    h = b.node("MatMul", [b.act("a", _amax(a)), b.weight("w1", w1)], "h", "mm1")
    shared = _amax(x)  # one scale for both sides of the Add (the residual's)
    s = b.node("Add", [b.act(h, shared), b.act("x", shared)], "s", "add")
    b.node("MatMul", [s, b.weight("w2", w2)], "y", "mm2")  # weight-only quantized
    return Planted("residual", b.model({"a": a, "x": x}, ["y"]), {"a": a, "x": x}, {"add"},
                   "oversized_scale")


def channels() -> Planted:
    rng = _rng(5)
    x = rng.standard_normal((N, C)).astype(np.float32)
    w1 = _w(rng)
    w1[:, 0] *= 300.0  # one output column 300x the others, under one per-tensor scale
    b = QBuilder()
    h = b.node("MatMul", [b.act("x", _amax(x)),
                          b.weight("w1", w1, per_channel=False, stored=False)],
               "h", "mm1")
    hs = b.node("Mul", [h, "col_gain"], "hs", "gain")  # brings column 0 back to the others
    gain = np.ones(C, np.float32)
    gain[0] = 1 / 300.0
    b.inits.append(numpy_helper.from_array(gain, "col_gain"))
    _tail(b, hs, rng, _amax((x @ w1) * gain))
    return Planted("channels", b.model({"x": x}, ["y"]), {"x": x}, {"mm1"},
                   "weight_channel_range")


def fp16_side(fused: bool = False) -> Planted:
    """A file FP16 elsewhere (as ModelOpt writes by default) with a culprit on each side: the
    outlier layer `mm1`, and an FP16 `amp` -> `back` pair after the last layer whose middle
    value overflows 65504.
    Plan: layer {mm1} un-quantized and nodes {amp, back} in FP32.

    `fused`: a Transpose between `mm2` and `amp` (so the pair is not a MatMul's epilogue, whose
    fusion semantics.py calls uncertain): TensorRT fuses the pair into one PWN layer that
    rounds only its output, so under the default `--semantics trt` the overflow never happens
    and the plan is {mm1} alone; `--semantics strict` (per node) still needs {amp, back}."""
    rng = _rng(6)
    x = rng.standard_normal((N, C)).astype(np.float32)
    x[:, 3] *= 100.0
    w1 = _w(rng)
    w1[3, :] *= 0.01
    b = QBuilder(half=True)
    xh = b.node("Cast", ["x"], "xh", "cast_in", to=TensorProto.FLOAT16)
    h = b.node("MatMul", [b.act(xh, _amax(x)), b.weight("w1", w1, stored=False)], "h", "mm1")
    b.inits += [numpy_helper.from_array(np.array(2.0 ** 15, np.float16), "gain"),
                numpy_helper.from_array(np.array(2.0 ** -15, np.float16), "ungain")]
    out = b.node("MatMul", [b.act(h, _amax(x @ w1)), b.weight("w2", _w(rng), stored=False)],
                 "yh", "mm2")
    if fused:
        out = b.node("Transpose", [out], "yt", "flip", perm=[1, 0])
    big = b.node("Mul", [out, "gain"], "big", "amp")  # |yh| > 2 overflows 65504
    back = b.node("Mul", [big, "ungain"], "hb", "back")
    b.node("Cast", [back], "y", "cast_out", to=TensorProto.FLOAT)
    return Planted("fp16_side", b.model({"x": x}, ["y"], opset=19), {"x": x}, {"mm1"},
                   "activation_outlier")


PLANTED = (outlier, fp8_saturation, softmax, residual, channels)
