"""Tiny models whose written files went wrong (#45 item 5), each after one of onnx's node tests:
a Pad whose `constant_value` is a float parameter of the data's type (test_constant_pad), a
MeanVarianceNormalization whose function body adds a float32 epsilon (test_mvn), a Unique whose
output shape depends on the data (test_unique_*), a rank-0 declaration on a [2, 3] output (an
exporter's `[]`, PP-OCRv5 rec's `fetch_name_0`) and a Conv for BF16 at an opset whose Conv
schema predates bfloat16 (12 and 15; onnx lists it from 22).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

X = np.linspace(-2, 2, 12, dtype=np.float32).reshape(2, 6)
# Unique's input: 1.0001 and 1.00005 (times 3) are distinct in FP32, one value in FP16
UNIQUE_X = np.array([1.0, 1.0001, 2.0, 2.0, 3.0, 1.00005], np.float32)


def _model(nodes, inputs, outputs, inits, opset: int = 13) -> onnx.ModelProto:
    g = h.make_graph(nodes, "m", inputs, outputs, inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=8)


def _vi(name: str, shape=(2, 6), elem: int = TP.FLOAT) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, elem, None if shape is None else list(shape))


def pad_constant() -> onnx.ModelProto:
    """y = Pad(x * 3, pads, constant_value=1.5): Pad's `constant_value` is type T, the data's."""
    inits = [nh.from_array(np.array(3.0, np.float32), "k"),
             nh.from_array(np.array([0, 1, 0, 2], np.int64), "pads"),
             nh.from_array(np.array(1.5, np.float32), "cv")]
    nodes = [h.make_node("Mul", ["x", "k"], ["m"], name="scale"),
             h.make_node("Pad", ["m", "pads", "cv"], ["y"], name="pad", mode="constant")]
    return _model(nodes, [_vi("x")], [_vi("y", (2, 9))], inits)


def mvn() -> onnx.ModelProto:
    """y = MeanVarianceNormalization(x * 3) over axes 0, 1."""
    inits = [nh.from_array(np.array(3.0, np.float32), "k")]
    nodes = [h.make_node("Mul", ["x", "k"], ["m"], name="scale"),
             h.make_node("MeanVarianceNormalization", ["m"], ["y"], name="mvn", axes=[0, 1])]
    return _model(nodes, [_vi("x")], [_vi("y")], inits)


def unique_inside() -> onnx.ModelProto:
    """y = Unique(x * 3) * 3: FP16 merges 3.0003 and 3.00015 into one value, so all-FP16's y
    has 4 elements where FP32's has 5. The plan is {scale, uniq}: both round the two apart."""
    inits = [nh.from_array(np.array(3.0, np.float32), "k")]
    nodes = [h.make_node("Mul", ["x", "k"], ["m"], name="scale"),
             h.make_node("Unique", ["m"], ["u"], name="uniq", sorted=1),
             h.make_node("Mul", ["u", "k"], ["y"], name="after")]
    return _model(nodes, [_vi("x", (6,))], [_vi("y", ("n",))], inits)


def rank0_declared() -> onnx.ModelProto:
    """y = x * x computes [2, 6]; the file declares y rank 0 (`[]`)."""
    return _model([h.make_node("Mul", ["x", "x"], ["y"], name="sq")], [_vi("x")],
                  [_vi("y", ())], [])


def shapeless_output() -> onnx.ModelProto:
    """y = x * x computes [2, 6]; the file declares no shape for y."""
    return _model([h.make_node("Mul", ["x", "x"], ["y"], name="sq")], [_vi("x")],
                  [_vi("y", None)], [])


def conv(opset: int) -> onnx.ModelProto:
    """A 3x3 Conv (4 from 3 channels) then Relu, at `opset`."""
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [h.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c"], ["y"], name="relu")]
    return _model(nodes, [_vi("x", (1, 3, 8, 8))], [_vi("y", (1, 4, 8, 8))],
                  [nh.from_array(w, "w")], opset)


CONV_X = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
