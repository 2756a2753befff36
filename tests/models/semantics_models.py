"""Planted models proving each `trt` rule end to end, with exact expected FP32 sets per semantics.

Each model fails per-node rounding (strict) for a reason TensorRT's build removes, or (the TF32
case) passes in true FP32 and fails when FP32 inner products read TF32-rounded operands. The
sets were derived by hand from the semantics (docs/semantics.md) and are asserted exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


@dataclass(frozen=True)
class Planted:
    name: str
    model: onnx.ModelProto
    inputs: dict[str, np.ndarray]
    expected: dict[str, tuple[str, frozenset[str]]]  # "strict" / "trt" / "trt+tf32" -> (verdict, set)


def _model(nodes, inits, inputs, outputs, opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, F, s) for n, s in outputs],
        [numpy_helper.from_array(np.asarray(v, dtype=np.float32), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def conv_relu_bn(var: float = 4.97e5) -> onnx.ModelProto:
    """The pitch CNN pattern: Conv -> Relu -> BatchNorm with a huge running variance."""
    rng = np.random.default_rng(0)
    c = 4
    return _model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"], name="relu"),
         helper.make_node("BatchNormalization", ["r", "g", "beta", "mean", "var"], ["y"],
                          name="bn")],
        {"w": rng.standard_normal((c, 1, 3, 3)) * 30, "b": rng.standard_normal(c),
         "g": np.ones(c), "beta": np.zeros(c), "mean": np.full(c, 50.0),
         "var": np.full(c, var)},
        [("x", [1, 1, 8, 8])], [("y", [1, c, 8, 8])])


def batchnorm_variance() -> Planted:
    """Conv -> Relu -> BatchNorm with running variance 4.97e5 (the pitch CNN): per node the raw
    variance rounds to inf; TensorRT computes scale = gamma / sqrt(var + eps) in FP32."""
    x = np.random.default_rng(1).standard_normal((1, 1, 8, 8)).astype(np.float32)
    return Planted("batchnorm_variance", conv_relu_bn(), {"x": x},
                   {"strict": ("fixed", frozenset({"bn"})), "trt": ("fp16_ok", frozenset())})


def constant_subgraph() -> Planted:
    """y = x * (300 * 300 / 8e4): the constant product overflows only when each node rounds."""
    m = _model(
        [helper.make_node("Mul", ["a", "a"], ["sq"], name="const_sq"),
         helper.make_node("Div", ["sq", "d"], ["k"], name="const_div"),
         helper.make_node("Mul", ["x", "k"], ["y"], name="scale")],
        {"a": np.full(4, 300.0), "d": np.array(8e4)},
        [("x", [4])], [("y", [4])])
    x = np.random.default_rng(1).standard_normal(4).astype(np.float32)
    return Planted("constant_subgraph", m, {"x": x},
                   {"strict": ("fixed", frozenset({"const_sq", "const_div"})),
                    "trt": ("fp16_ok", frozenset())})


def conv_bias_relu_double_rounding() -> Planted:
    """Conv (own bias 2048) + Add(-2048) + Relu: per node the Conv output is stored at FP16
    spacing 2 near 2048 and the Add cancels 2048, leaving that rounding as the whole signal;
    TensorRT runs the three as one kernel and rounds only the (small) result."""
    rng = np.random.default_rng(2)
    m = _model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"),
         helper.make_node("Add", ["c", "shift"], ["a"], name="bias"),
         helper.make_node("Relu", ["a"], ["y"], name="relu")],
        {"w": rng.standard_normal((2, 1, 3, 3)) * 0.3, "b": np.full(2, 2048.0),
         "shift": np.full((1, 2, 1, 1), -2048.0)},
        [("x", [1, 1, 6, 6])], [("y", [1, 2, 4, 4])])
    x = rng.standard_normal((1, 1, 6, 6)).astype(np.float32)
    return Planted("conv_bias_relu", m, {"x": x},
                   {"strict": ("fixed", frozenset({"conv", "bias"})),
                    "trt": ("fp16_ok", frozenset())})


def tf32_offset() -> Planted:
    """y = (x + 4096) @ W - 4096 * colsum(W): FP16 (spacing 4 at 4096) loses x, so the Add,
    the MatMul and the Sub stay FP32; in true FP32 that passes, with TF32 operands (10-bit
    mantissa, the same spacing) the MatMul loses x too and no plan exists."""
    rng = np.random.default_rng(3)
    d = 16
    w = (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32)
    c = (4096.0 * w.astype(np.float64).sum(axis=0)).astype(np.float32)
    m = _model(
        [helper.make_node("Add", ["x", "offset"], ["a"], name="offset_add"),
         helper.make_node("MatMul", ["a", "w"], ["m"], name="matmul"),
         helper.make_node("Sub", ["m", "c"], ["y"], name="remove_offset")],
        {"offset": np.array(4096.0), "w": w, "c": c},
        [("x", [4, d])], [("y", [4, d])])
    x = rng.standard_normal((4, d)).astype(np.float32)
    expected = frozenset({"offset_add", "matmul", "remove_offset"})
    return Planted("tf32_offset", m, {"x": x},
                   {"strict": ("fixed", expected), "trt": ("fixed", expected),
                    "trt+tf32": ("no_plan", frozenset())})


def planted() -> dict[str, Planted]:
    return {p.name: p for p in (batchnorm_variance(), constant_subgraph(),
                                conv_bias_relu_double_rounding(), tf32_offset())}
