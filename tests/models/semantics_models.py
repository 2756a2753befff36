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


# ------------------------------------------- weights held in Constant nodes (issue #20)

def constant_stored(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same model with every initializer held by an unnamed Constant node (placed first),
    the way paddle2onnx and tf2onnx store weights."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    consts = [helper.make_node("Constant", [], [t.name], value=t) for t in g.initializer]
    nodes = consts + list(g.node)
    del g.node[:]
    g.node.extend(nodes)
    names = {t.name for t in g.initializer}
    keep = [v for v in g.input if v.name not in names]
    del g.input[:]
    g.input.extend(keep)
    del g.initializer[:]
    return out


def _const(name: str, value) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(
        np.asarray(value), name))


def batchnorm_in_constants() -> Planted:
    """The pitch CNN's BatchNorm with its parameters in Constant nodes, the variance (4.97e5)
    reached through an Identity and the mean through a Cast from float64: TensorRT imports
    Constants as weights and folds both, so the BatchNorm is a scale/shift computed in FP32."""
    rng = np.random.default_rng(0)
    c = 4
    nodes = [
        _const("w", (rng.standard_normal((c, 1, 3, 3)) * 30).astype(np.float32)),
        _const("b", rng.standard_normal(c).astype(np.float32)),
        _const("g", np.ones(c, np.float32)), _const("beta", np.zeros(c, np.float32)),
        _const("mean64", np.full(c, 50.0)), _const("var_raw", np.full(c, 4.97e5, np.float32)),
        helper.make_node("Cast", ["mean64"], ["mean"], name="mean_cast", to=F),
        helper.make_node("Identity", ["var_raw"], ["var"], name="var_identity"),
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("BatchNormalization", ["r", "g", "beta", "mean", "var"], ["y"],
                         name="bn")]
    m = _model(nodes, {}, [("x", [1, 1, 8, 8])], [("y", [1, c, 8, 8])])
    x = np.random.default_rng(1).standard_normal((1, 1, 8, 8)).astype(np.float32)
    return Planted("batchnorm_in_constants", m, {"x": x},
                   {"strict": ("fixed", frozenset({"bn", "var_identity"})),
                    "trt": ("fp16_ok", frozenset())})


def eps_in_constant() -> Planted:
    """RMS norm of 1e-4-scaled values with eps = 1e-12 (a Constant) added to a mean square of
    ~1e-8 (below FP16's normal range): per node the eps flushes to zero; TensorRT clamps the
    weight to 2^-24 instead (weights_clamp_v10), which is harmless next to the mean square."""
    rng = np.random.default_rng(4)
    d = 32
    nodes = [
        _const("scale", np.array(1e-4, np.float32)), _const("eps", np.array(1e-12, np.float32)),
        _const("one", np.array(1.0, np.float32)),
        helper.make_node("Mul", ["x", "scale"], ["xs"], name="scale_mul"),
        helper.make_node("Mul", ["xs", "xs"], ["sq"], name="square"),
        helper.make_node("ReduceMean", ["sq"], ["ms"], name="mean_square", axes=[-1]),
        helper.make_node("Add", ["ms", "eps"], ["mse"], name="add_eps"),
        helper.make_node("Sqrt", ["mse"], ["rms"], name="sqrt"),
        helper.make_node("Div", ["one", "rms"], ["inv"], name="inverse"),
        helper.make_node("Mul", ["xs", "inv"], ["y"], name="normalize")]
    m = _model(nodes, {}, [("x", [4, d])], [("y", [4, d])], opset=13)
    x = rng.standard_normal((4, d)).astype(np.float32)
    return Planted("eps_in_constant", m, {"x": x}, {})


def matmul_weight_in_constant() -> Planted:
    """A MatMul weight held in a Constant whose one column holds 2e5: per node it rounds to
    inf (the output turns inf/NaN); TensorRT clamps it to 65504 (the output is wrong, not
    NaN). Either way the MatMul keeps FP32: only the words differ."""
    rng = np.random.default_rng(5)
    d = 8
    w = (rng.standard_normal((d, d)) * 0.3).astype(np.float32)
    w[:, 3] = 2e5
    nodes = [_const("w", w),
             helper.make_node("MatMul", ["x", "w"], ["m"], name="matmul"),
             helper.make_node("Relu", ["m"], ["y"], name="relu")]
    m = _model(nodes, {}, [("x", [4, d])], [("y", [4, d])])
    x = rng.standard_normal((4, d)).astype(np.float32)
    return Planted("matmul_weight_in_constant", m, {"x": x},
                   {"strict": ("fixed", frozenset({"matmul", "relu"})),
                    "trt": ("fixed", frozenset({"matmul", "relu"}))})


def reshape_shape_in_constant() -> Planted:
    """tf32_offset's MatMul with its weight stored flat and reshaped by a shape that Concat
    builds from two Constants: TensorRT folds the shape arithmetic and the Reshape, so the
    weight is one weight read in FP32 by the FP32 MatMul; per node the Reshape is a layer of
    its own whose FP16 output already loses what the offset cancellation needs."""
    base = tf32_offset()
    d = 16
    w = next(numpy_helper.to_array(t) for t in base.model.graph.initializer if t.name == "w")
    c = next(numpy_helper.to_array(t) for t in base.model.graph.initializer if t.name == "c")
    nodes = [
        _const("offset", np.array(4096.0, np.float32)), _const("c", c),
        _const("w_flat", w.reshape(-1)), _const("rows", np.array([d], np.int64)),
        _const("cols", np.array([-1], np.int64)),
        helper.make_node("Concat", ["rows", "cols"], ["shape"], name="shape_concat", axis=0),
        helper.make_node("Reshape", ["w_flat", "shape"], ["w"], name="reshape_w"),
        helper.make_node("Add", ["x", "offset"], ["a"], name="offset_add"),
        helper.make_node("MatMul", ["a", "w"], ["m"], name="matmul"),
        helper.make_node("Sub", ["m", "c"], ["y"], name="remove_offset")]
    m = _model(nodes, {}, [("x", [4, d])], [("y", [4, d])])
    trt = frozenset({"offset_add", "matmul", "remove_offset"})
    return Planted("reshape_shape_in_constant", m, dict(base.inputs),
                   {"strict": ("fixed", trt | {"reshape_w"}), "trt": ("fixed", trt)})


def constant_planted() -> dict[str, Planted]:
    """Planted cases whose weights live in Constant nodes; each also as `constant_stored` zoo
    models in the tests."""
    return {p.name: p for p in (batchnorm_in_constants(), eps_in_constant(),
                                matmul_weight_in_constant(), reshape_shape_in_constant())}


def layernorm_overflow_opset17() -> Planted:
    """x * 3e5 feeds an opset-17 LayerNormalization whose Mean is a graph output too: the Mul
    writes values beyond 65504 and the LayerNorm reads them, so both keep FP32 under either
    semantics. Before issue #20 no plan could name the LayerNorm (its Mean/InvStdDev cannot be
    float16, so it had no FP16 signature and was never rounded)."""
    rng = np.random.default_rng(6)
    d = 16
    m = _model(
        [helper.make_node("Mul", ["x", "k"], ["big"], name="mul"),
         helper.make_node("LayerNormalization", ["big", "gamma", "beta"], ["y", "mean"],
                          name="ln", axis=-1, epsilon=1e-5),
         helper.make_node("Relu", ["y"], ["out"], name="relu")],
        {"k": np.array(3e5), "gamma": 1 + 0.1 * rng.standard_normal(d),
         "beta": 0.1 * rng.standard_normal(d)},
        [("x", [4, d])], [("out", [4, d]), ("mean", [4, 1])])
    x = rng.standard_normal((4, d)).astype(np.float32)
    both = ("fixed", frozenset({"mul", "ln"}))
    return Planted("layernorm_overflow_opset17", m, {"x": x}, {"strict": both, "trt": both})
