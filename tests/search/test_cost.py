"""The cost model on tiny graphs whose prices are computed by hand (docs/cost.md's formulas)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtbisect.errors import TrtBisectError
from trtbisect.graph import Graph
from trtbisect.judge import semantics
from trtbisect.search.cost import (
    DEFAULT_GPU,
    GPUS,
    GpuClass,
    Pricing,
    gpu_class,
    infer_shapes,
    node_flops,
    pricing_for,
)

# round figures: FP16 tensor 1 PFLOP/s, TF32 0.5, FP32 0.1; 1 TB/s
GPU = GpuClass("test", "test", 1e15, 5e14, 1e14, 1e12, "hand-made")


def _model(nodes, inits, inputs, outputs) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def matmul_relu(n: int = 256) -> onnx.ModelProto:
    """x[n, n] -> MatMul(W[n, n]) -> Relu -> y."""
    w = numpy_helper.from_array(np.ones((n, n), np.float32), "W")
    return _model([helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
                   helper.make_node("Relu", ["h"], ["y"], name="relu")], [w],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", n])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", n])])


SAMPLE = {"x": np.zeros((256, 256), np.float32)}
E = 256 * 256  # elements of x, W, h and y alike
MM_FLOPS = 2.0 * 256 ** 3


def strict_units(g: Graph) -> dict[str, tuple[str, ...]]:
    return {n: (n,) for n in g.candidates()}


def test_roofline_per_node_and_conversions_at_each_boundary():
    """A layer reads a tensor at the width it was stored in and writes at its own; a graph
    output is written in its declared type. So x (an FP32 input) costs 4 bytes an element to
    the FP16 MatMul, and y (an FP32 output) 4 bytes to the FP16 Relu."""
    g = Graph(matmul_relu())
    p = Pricing(g, strict_units(g), infer_shapes(g, SAMPLE), GPU)
    mm, relu = p.cost["mm"], p.cost["relu"]
    assert mm.flops == MM_FLOPS and mm.float_elements == 3 * E  # x, W, h
    assert mm.fp16_s == pytest.approx(max(MM_FLOPS / 1e15, (4 + 2 + 2) * E / 1e12))  # memory
    assert mm.fp32_s == pytest.approx(max(MM_FLOPS / 1e14, 3 * E * 4 / 1e12))  # math-bound
    assert relu.flops == 0 and relu.fp16_s == pytest.approx((2 + 4) * E / 1e12)
    assert relu.fp32_s == relu.fp16_s  # alone in FP32 it still reads h as the MatMul stored it
    assert p.fp16_s == pytest.approx(mm.fp16_s + relu.fp16_s)
    assert p.casts([]) == (2, pytest.approx(0))  # the mixed file's Casts at x and y: no kernel
    # the MatMul in FP32: it stores h in FP32, which the FP16 Relu reads at 4 bytes
    assert p.price({"mm"}) == pytest.approx(mm.fp32_s + (4 + 4) * E / 1e12)
    assert p.casts({"mm"}) == (2, pytest.approx(2 * E / 1e12))  # h and y; the wider read of h
    assert p.price({"mm", "relu"}) == pytest.approx(mm.fp32_s + 8 * E / 1e12)
    assert p.fp32_s == pytest.approx(p.price({"mm", "relu"}))
    assert p.casts({"mm", "relu"})[0] == 0
    assert p.slowdown({"mm"}) == pytest.approx(p.price({"mm"}) / p.fp16_s - 1)
    assert p.adjacent == {"mm": ("relu",), "relu": ("mm",)}


def test_tf32_prices_fp32_math_at_the_tf32_peak():
    g = Graph(matmul_relu())
    p = Pricing(g, strict_units(g), infer_shapes(g, SAMPLE), GPU, tf32=True)
    assert p.cost["mm"].fp32_s == pytest.approx(max(MM_FLOPS / 5e14, 3 * E * 4 / 1e12))
    assert p.cost["relu"].fp32_s == pytest.approx(6 * E / 1e12)  # no math: unchanged


def test_a_fused_layer_is_one_unit_whose_inside_costs_no_traffic():
    g = Graph(matmul_relu())
    prepared = semantics.prepare(g.model, "trt")
    units = semantics.units(prepared, Graph(prepared.model).candidates())
    assert list(units) == ["mm + relu"]
    pg = Graph(prepared.model)
    p = Pricing(pg, units, infer_shapes(pg, SAMPLE), GPU)
    layer = p.cost["mm + relu"]
    assert layer.float_elements == 3 * E  # x, W, y: h stays inside
    assert layer.fp32_s == pytest.approx(max(MM_FLOPS / 1e14, 3 * E * 4 / 1e12))
    assert layer.fp16_s == pytest.approx(max(MM_FLOPS / 1e15, (4 + 2 + 4) * E / 1e12))
    assert p.fp16_s == pytest.approx(layer.fp16_s)
    assert p.price({"mm + relu"}) == pytest.approx(layer.fp32_s)  # no boundary left


def test_shapes_come_from_the_sample_so_dynamic_models_are_priced_at_the_analysed_shape():
    g = Graph(matmul_relu())
    small = Pricing(g, strict_units(g), infer_shapes(g, {"x": np.zeros((2, 256), np.float32)}),
                    GPU)
    big = Pricing(g, strict_units(g), infer_shapes(g, SAMPLE), GPU)
    assert small.cost["mm"].flops == 2.0 * 2 * 256 * 256
    assert big.cost["mm"].flops == MM_FLOPS


def test_shapes_inference_leaves_open_come_from_the_probe():
    g = Graph(matmul_relu())
    asked = []

    def probe(names):
        asked.extend(names)
        return {t: (256, 256) for t in names}

    m = matmul_relu()
    del m.graph.output[:]
    m.graph.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, None))
    node = helper.make_node("Reshape", ["x", "shape"], ["x2"], name="reshape")
    # a shape only known at run time: inference cannot follow a Reshape of a computed shape
    m.graph.node.insert(0, helper.make_node("Shape", ["x"], ["shape"], name="shape_of"))
    m.graph.node.insert(1, node)
    m.graph.node[2].input[0] = "x2"
    g = Graph(m)
    shapes = infer_shapes(g, SAMPLE, probe)
    assert shapes["h"] == (256, 256) and shapes["y"] == (256, 256)
    assert set(asked) <= {"x2", "h", "y"}


def test_views_cost_nothing_and_a_gather_reads_only_its_rows():
    table = numpy_helper.from_array(np.ones((1000, 8), np.float32), "table")
    m = _model([helper.make_node("Gather", ["table", "ids"], ["e"], name="gather"),
                helper.make_node("Reshape", ["e", "shape"], ["r"], name="reshape")],
               [table, numpy_helper.from_array(np.array([4, 8], np.int64), "shape")],
               [helper.make_tensor_value_info("ids", TensorProto.INT64, [4])],
               [helper.make_tensor_value_info("r", TensorProto.FLOAT, [4, 8])])
    g = Graph(m)
    p = Pricing(g, strict_units(g), infer_shapes(g, {"ids": np.zeros(4, np.int64)}), GPU)
    gather = p.cost["gather"]
    assert gather.float_elements == 4 * 8 + 4 * 8  # 4 rows read, 4 rows written
    assert gather.other_bytes == 4 * 8  # the int64 indices
    assert p.cost["reshape"].fp16_s == p.cost["reshape"].fp32_s == 0


def test_flops_of_the_math_ops():
    shapes = {"a": (1, 3, 8, 8), "w": (16, 3, 3, 3), "y": (1, 16, 6, 6)}
    assert node_flops(helper.make_node("Conv", ["a", "w"], ["y"]), shapes) == 2 * 16 * 36 * 27
    shapes = {"a": (1, 16, 6, 6), "w": (16, 4, 3, 3), "y": (1, 4, 8, 8)}
    assert node_flops(helper.make_node("ConvTranspose", ["a", "w"], ["y"]), shapes) == \
        2 * 16 * 36 * 4 * 9
    shapes = {"a": (5, 7), "w": (9, 7), "y": (5, 9)}
    assert node_flops(helper.make_node("Gemm", ["a", "w"], ["y"], transB=1), shapes) == 2 * 45 * 7
    shapes = {"q": (2, 4, 16, 8), "k": (2, 4, 32, 8), "y": (2, 4, 16, 8)}
    assert node_flops(helper.make_node("Attention", ["q", "k", "v"], ["y"]), shapes) == \
        4 * 2 * 4 * 16 * 8 * 32
    assert node_flops(helper.make_node("Relu", ["a"], ["y"]), shapes) == 0


def test_every_gpu_class_has_its_source_and_dense_figures_in_order():
    assert {"h100", "a100", "l4", "orin"} <= set(GPUS) and DEFAULT_GPU in GPUS
    for gpu in GPUS.values():
        assert gpu.source.startswith("https://www.nvidia.com/")
        assert gpu.fp16_tensor > gpu.tf32_tensor > gpu.fp32 > 0 and gpu.bandwidth > 0
    with pytest.raises(TrtBisectError, match="unknown GPU class 'v100'.*--gpu l4"):
        gpu_class("v100")


def test_summary_states_the_price_and_the_shares():
    g = Graph(matmul_relu())
    p = pricing_for(g, strict_units(g), SAMPLE, "h100")
    s = p.summary(["mm"])
    assert s["gpu"] == "h100" and s["plan_s"] == pytest.approx(p.price({"mm"}))
    assert s["all_fp16_s"] < s["plan_s"] and s["all_fp16_s"] < s["all_fp32_s"]
    assert s["fp32_flop_share"] == 1.0  # the MatMul holds every FLOP
    assert s["fp32_byte_share"] == pytest.approx(3 / 5)  # x, W, h of x, W, h, h, y
    assert s["boundary_casts"] == 2
    assert s["units"]["mm"]["share"] == pytest.approx(p.cost["mm"].premium / p.fp16_s)
    assert s["units"]["mm"]["nodes"] == ["mm"] and s["plan_layers"] == 1 and s["layers"] == 2
    # the rows add up: the units' shares and the boundary conversions make the slowdown
    assert s["units"]["mm"]["share"] + s["boundary_casts_share"] == pytest.approx(s["slowdown"])
    assert s["precision"] == "fp16" and s["all_low_s"] == s["all_fp16_s"] == p.fp16_s
    bf = p.summary(["mm"], low="bf16")
    assert bf["all_bf16_s"] == bf["all_low_s"] and "all_fp16_s" not in bf


PRICE_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
from tests.models.make_models import deep_model
from trtbisect.search.cost import pricing_for
from trtbisect.graph import Graph
z = deep_model(blocks=8, overflow_blocks=())
g = Graph(z.model)
units = {{n: (n,) for n in g.candidates()}}
p = pricing_for(g, units, z.inputs, "l4")
names = sorted(units)
print(" ".join(p.price(names[k::3]).hex() for k in range(3)))
"""


def test_a_plans_price_does_not_depend_on_the_processs_hash_seed(tmp_path):
    """Plans are sets: their price is summed exactly (math.fsum), so equally priced units
    tie the same way in every process, and a resumed or parallel run reaches the same plan
    (before, ppocr and deep models found different plans under different PYTHONHASHSEEDs)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = str(Path(__file__).resolve().parents[2])
    script = tmp_path / "price.py"
    script.write_text(PRICE_SCRIPT.format(root=root))
    got = {subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout
           for seed in range(6)}
    assert len(got) == 1, got
