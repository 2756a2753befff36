"""Reasons for a `no_plan` where even all-float fails (#42 item 5): the given file's broken
weights and constants by name, and the tool that probably wrote them."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.models import quant_models as qm
from trtbisect.context import Options
from trtbisect.judge.compare import Tolerance
from trtbisect.quant import analyse, unquantize
from trtbisect.quant.broken import broken_values, probable_writer
from trtbisect.quant.run import run


def _broken(p, bias: np.ndarray, producer: str = "onnx.quantize") -> onnx.ModelProto:
    """The planted file with `y` moved by a float16 bias (as ModelOpt's FP16 conversion
    writes one), stamped as ONNX Runtime's quantization tool stamps it."""
    m = onnx.ModelProto()
    m.CopyFrom(p.model)
    for n in m.graph.node:
        n.output[:] = ["y0" if t == "y" else t for t in n.output]
    with np.errstate(over="ignore"):  # the converter's overflow, planted
        half = bias.astype(np.float16)
    m.graph.initializer.append(numpy_helper.from_array(half, "bn_var"))
    m.graph.node.extend([
        helper.make_node("Cast", ["bn_var"], ["bias"], name="bias_cast", to=TensorProto.FLOAT),
        helper.make_node("Add", ["y0", "bias"], ["y"], name="bias_add")])
    m.producer_name, m.producer_version = producer, "0.1.0"
    return m


def test_no_plan_where_all_float_fails_names_the_broken_weight_and_its_writer(tmp_path):
    p = qm.outlier()
    bias = np.zeros(p.inputs["x"].shape[1], np.float32)
    bias[2] = 4.8e7  # a BatchNorm variance beyond FP16's range: fp16 inf
    model, ref, inputs = tmp_path / "q.onnx", tmp_path / "ref.onnx", tmp_path / "in.npz"
    onnx.save(_broken(p, bias), model)
    onnx.save(unquantize(p.model, analyse(p.model)), ref)
    np.savez(inputs, **p.inputs)
    r = run(model, Options.of(inputs=[str(inputs)], tolerance=Tolerance(p.rtol, 0.0), threads=1,
                              validation_share=0), tmp_path / "out", reference_path=ref)
    assert r.verdict == "no_plan"
    (line,) = json.loads((tmp_path / "out" / "precision.json").read_text())["reasons"]
    assert "bn_var (float16) holds 1 non-finite value(s)" in line
    assert "onnx.quantize 0.1.0: ONNX Runtime's quantization tool, which NVIDIA ModelOpt" in line
    assert "high_precision_dtype='fp16'" in line
    # the same file with a sound bias: a plan exists and no reason is given
    onnx.save(_broken(p, np.zeros_like(bias)), model)
    r = run(model, Options.of(inputs=[str(inputs)], tolerance=Tolerance(p.rtol, 0.0), threads=1,
                              validation_share=0), None, reference_path=ref)
    assert r.verdict != "no_plan" and r.reasons == []


def test_an_fp32_constant_the_file_casts_to_fp16_beyond_its_range_is_named():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    mask = numpy_helper.from_array(np.array([0.0, -3.4e38], np.float32), "mask")
    ok = numpy_helper.from_array(np.array([1.0, 6e4], np.float32), "ok")
    g = helper.make_graph([
        helper.make_node("Cast", ["mask"], ["m16"], to=TensorProto.FLOAT16),
        helper.make_node("Cast", ["ok"], ["o16"], to=TensorProto.FLOAT16),
        helper.make_node("Add", ["m16", "o16"], ["s"]),
        helper.make_node("Cast", ["s"], ["s32"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["x", "s32"], ["y"])], "g", [x], [y], [mask, ok])
    m = helper.make_model(g)
    (said,) = broken_values(m)
    assert said.startswith("mask (float) holds 1 value(s) beyond FP16's range (up to 3.4e+38)")
    m.producer_name = "pytorch"
    assert probable_writer(m) == "pytorch"
    m.metadata_props.add(key="modelopt_version", value="0.47.0")
    assert "NVIDIA ModelOpt" in probable_writer(m)
