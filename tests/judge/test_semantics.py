"""Every rule of trtbisect.judge.semantics proven on a planted model (IR 10, built with onnx.helper)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.models.semantics_models import conv_relu_bn
from trtbisect.errors import TrtBisectError
from trtbisect.judge import semantics as sem

DOCS = Path(__file__).resolve().parents[2] / "docs" / "semantics.md"
F = TensorProto.FLOAT


def _model(nodes, inits, inputs, outputs, opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, F, None) for n in outputs],
        [numpy_helper.from_array(np.asarray(v, dtype=np.float32), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return _session(model).run(None, feeds)


def _per_node_fp16(model: onnx.ModelProto, rule: str = "inf") -> onnx.ModelProto:
    """Every node in FP16 the strict way: weights and every float tensor rounded where made."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    for t in g.initializer:
        t.CopyFrom(numpy_helper.from_array(sem.round_weight(numpy_helper.to_array(t), rule),
                                           t.name))
    nodes = []
    rounded = {}

    def rnd(t: str) -> str:
        if t not in rounded:
            nodes.append(helper.make_node("Cast", [t], [f"{t}::h"], to=TensorProto.FLOAT16))
            nodes.append(helper.make_node("Cast", [f"{t}::h"], [f"{t}::r"], to=F))
            rounded[t] = f"{t}::r"
        return rounded[t]

    for v in g.input:
        rnd(v.name)
    for n in g.node:
        n2 = onnx.NodeProto()
        n2.CopyFrom(n)
        for k, t in enumerate(n2.input):
            if t in rounded:
                n2.input[k] = rounded[t]
        nodes.append(n2)
        for t in n.output:
            rnd(t)
    for v in g.output:
        nodes.append(helper.make_node("Identity", [rounded[v.name]], [f"{v.name}::out"]))
        v.name = f"{v.name}::out"
    del g.node[:]
    g.node.extend(nodes)
    del g.value_info[:]
    return out


def _rel_err(a: np.ndarray, b: np.ndarray) -> float:
    with np.errstate(invalid="ignore"):
        return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


# ------------------------------------------------------------------------ planted models

def conv_bn_relu() -> onnx.ModelProto:
    """Conv -> BatchNorm -> Relu: the BatchNorm folds into the Conv's weights."""
    rng = np.random.default_rng(1)
    c = 3
    return _model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"),
         helper.make_node("BatchNormalization", ["c", "g", "beta", "mean", "var"], ["n"],
                          name="bn", epsilon=1e-3),
         helper.make_node("Relu", ["n"], ["y"], name="relu")],
        {"w": rng.standard_normal((c, 2, 3, 3)), "b": rng.standard_normal(c),
         "g": rng.uniform(0.5, 2, c), "beta": rng.standard_normal(c),
         "mean": rng.standard_normal(c), "var": rng.uniform(0.5, 3e5, c)},
        [("x", [1, 2, 6, 6])], ["y"])


def constant_overflow() -> onnx.ModelProto:
    """y = x + (300 * 300) / 8: the constant product overflows FP16 only if computed in FP16."""
    return _model(
        [helper.make_node("Mul", ["a", "a"], ["sq"]),
         helper.make_node("Div", ["sq", "eight"], ["k"]),
         helper.make_node("Add", ["x", "k"], ["y"])],
        {"a": np.full(4, 300.0), "eight": np.array(8.0)},
        [("x", [4])], ["y"])


def conv_bias_relu() -> onnx.ModelProto:
    """Conv (no bias) + bias Add + Relu, unnamed: TensorRT-style name from trtbisect's names."""
    rng = np.random.default_rng(2)
    return _model(
        [helper.make_node("Conv", ["x", "w"], ["c"]),
         helper.make_node("Add", ["c", "b"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"])],
        {"w": rng.standard_normal((2, 1, 3, 3)), "b": rng.standard_normal((1, 2, 1, 1))},
        [("x", [1, 1, 5, 5])], ["y"])


def pointwise_chain() -> onnx.ModelProto:
    """MatMul feeds two consumers (no epilogue); then Mul -> Add -> Sigmoid*x is one PWN."""
    rng = np.random.default_rng(3)
    return _model(
        [helper.make_node("MatMul", ["x", "w"], ["m"]),
         helper.make_node("Softmax", ["m"], ["s"], axis=-1),
         helper.make_node("Mul", ["m", "k"], ["p"]),
         helper.make_node("Add", ["p", "s"], ["q"]),
         helper.make_node("Sigmoid", ["q"], ["sg"]),
         helper.make_node("Mul", ["q", "sg"], ["y"])],
        {"w": rng.standard_normal((4, 4)), "k": np.array(0.5)},
        [("x", [2, 4])], ["y"])


def silu_conv() -> onnx.ModelProto:
    """Conv -> Sigmoid -> Mul(conv, sigmoid): SiLU fused into the Conv's epilogue."""
    rng = np.random.default_rng(4)
    return _model(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
         helper.make_node("Sigmoid", ["c"], ["s"], name="sig"),
         helper.make_node("Mul", ["c", "s"], ["y"], name="mul")],
        {"w": rng.standard_normal((2, 1, 1, 1))}, [("x", [1, 1, 3, 3])], ["y"])


def combined() -> onnx.ModelProto:
    """All rewrites at once, for idempotence and FP32 equivalence."""
    rng = np.random.default_rng(5)
    c = 3
    return _model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["c", "g", "beta", "mean", "var"], ["n"],
                          name="bn1"),
         helper.make_node("Relu", ["n"], ["r"], name="relu"),
         helper.make_node("BatchNormalization", ["r", "g", "beta", "mean", "var"], ["n2"],
                          name="bn2"),
         helper.make_node("Mul", ["a", "a"], ["sq"], name="const_mul"),
         helper.make_node("Sqrt", ["sq"], ["rt"], name="const_sqrt"),
         helper.make_node("Mul", ["n2", "rt"], ["m"], name="scale"),
         helper.make_node("Add", ["m", "x"], ["y"], name="residual")],
        {"w": rng.standard_normal((c, c, 3, 3)), "b": rng.standard_normal(c),
         "g": rng.uniform(0.5, 2, c), "beta": rng.standard_normal(c),
         "mean": rng.standard_normal(c), "var": rng.uniform(1, 1e6, c),
         "a": np.array(0.75)},
        [("x", [1, c, 5, 5])], ["y"])


# ------------------------------------------------------------------------------ the tests

def test_strict_returns_the_model_unchanged():
    m = conv_relu_bn()
    before = m.SerializeToString()
    p = sem.prepare(m, "strict")
    assert p.model is m and p.model.SerializeToString() == before
    assert p.layers == [] and p.renamed == {} and p.weight_rule == "inf"


def test_unknown_semantics_or_version_is_a_user_error():
    with pytest.raises(TrtBisectError, match="--semantics"):
        sem.prepare(conv_relu_bn(), "fast")
    with pytest.raises(TrtBisectError, match="--trt-version"):
        sem.prepare(conv_relu_bn(), "trt", 9)


def test_weight_rule_per_version():
    # TensorRT 10 clamps; for 11 the writer stores the weights clamped, so the file holds them
    assert sem.prepare(conv_relu_bn(), "trt", 10).weight_rule == "clamp"
    assert sem.prepare(conv_relu_bn(), "trt", 11).weight_rule == "clamp"
    assert sem.prepare(conv_relu_bn(), "strict", 11).weight_rule == "inf"


def test_huge_variance_batchnorm_overflows_only_per_node():
    m = conv_relu_bn()
    x = np.random.default_rng(7).standard_normal((1, 1, 8, 8)).astype(np.float32)
    ref = _run(m, {"x": x})[0]
    strict = _run(_per_node_fp16(m), {"x": x})[0]
    p = sem.prepare(m)
    trt = _run(_per_node_fp16(p.model, p.weight_rule), {"x": x})[0]
    assert _rel_err(strict, ref) > 0.1  # the raw variance 4.97e5 rounds to inf
    assert _rel_err(trt, ref) < 5e-3  # scale/shift precomputed in FP32
    bn = next(n for n in p.model.graph.node if n.name == "bn")
    inits = {t.name: numpy_helper.to_array(t) for t in p.model.graph.initializer}
    assert np.all(inits[bn.input[4]] == 1) and not inits[bn.input[3]].any()
    assert "var" not in inits  # the raw variance is gone
    assert any(n.startswith("batchnorm_scale") for n in p.notes)


def test_batchnorm_folds_into_its_conv():
    m = conv_bn_relu()
    p = sem.prepare(m)
    assert [n.name for n in p.model.graph.node] == ["conv", "relu"]
    assert p.renamed == {"bn": "conv"}
    (layer,) = p.layers
    assert layer.name == "conv + bn + relu" and layer.nodes == ("conv", "relu")
    assert layer.internal == ("n",) and layer.kind == "conv_epilogue" and layer.certain
    x = np.random.default_rng(8).standard_normal((1, 2, 6, 6)).astype(np.float32)
    assert _rel_err(_run(p.model, {"x": x})[0], _run(m, {"x": x})[0]) < 1e-5
    names = sem.fused_layer_names(p)
    assert names == {"conv": "conv + bn + relu", "relu": "conv + bn + relu",
                     "bn": "conv + bn + relu"}


def test_folded_batchnorm_alone_is_a_bn_folded_layer():
    m = conv_bn_relu()
    m.graph.node[2].op_type = "Neg"  # not an activation TensorRT fuses as such... still PWN
    del m.graph.node[2:]
    m.graph.output[0].name = "n"
    p = sem.prepare(m)
    assert p.layers == [sem.Layer("conv + bn", ("conv",), (), "bn_folded", True)]


def test_constant_subgraph_overflows_only_per_node():
    m = constant_overflow()
    x = np.arange(4, dtype=np.float32)
    ref = _run(m, {"x": x})[0]
    assert not np.all(np.isfinite(_run(_per_node_fp16(m), {"x": x})[0]))  # 90000 -> inf
    p = sem.prepare(m)
    assert [n.op_type for n in p.model.graph.node] == ["Add"]
    assert p.renamed == {"Mul_0": "Add_2", "Div_1": "Add_2"}
    out = _run(_per_node_fp16(p.model, p.weight_rule), {"x": x})[0]
    assert np.all(np.isfinite(out)) and _rel_err(out, ref) < 1e-3
    inits = {t.name: numpy_helper.to_array(t) for t in p.model.graph.initializer}
    assert set(inits) == {"k"} and np.all(inits["k"] == np.float32(11250.0))


def test_conv_bias_relu_is_one_layer_named_the_tensorrt_way():
    p = sem.prepare(conv_bias_relu())
    (layer,) = p.layers
    assert layer.name == "Conv_0 + Add_1 + Relu_2"
    assert layer.nodes == ("Conv_0", "Add_1", "Relu_2") and layer.internal == ("c", "a")
    assert layer.kind == "conv_epilogue" and layer.certain


def test_silu_after_conv_joins_its_epilogue():
    (layer,) = sem.prepare(silu_conv()).layers
    assert layer.name == "conv + sig + mul" and layer.internal == ("c", "s")
    assert not layer.certain  # the Conv output feeds the SiLU twice: TensorRT may not fuse


def test_pointwise_chain_is_a_pwn_layer():
    p = sem.prepare(pointwise_chain())
    (layer,) = p.layers
    assert layer.name == "PWN(Mul_2, Add_3, Sigmoid_4, Mul_5)"
    assert layer.internal == ("p", "q", "sg") and layer.kind == "pointwise"


def test_matmul_epilogue_is_marked_uncertain():
    rng = np.random.default_rng(9)
    m = _model([helper.make_node("MatMul", ["x", "w"], ["m"]),
                helper.make_node("Add", ["m", "b"], ["a"]),
                helper.make_node("Relu", ["a"], ["y"])],
               {"w": rng.standard_normal((4, 3)), "b": rng.standard_normal(3)},
               [("x", [2, 4])], ["y"])
    (layer,) = sem.prepare(m).layers
    assert layer.name == "MatMul_0 + Add_1 + Relu_2" and not layer.certain


def test_prepare_is_idempotent_and_does_not_mutate_its_input():
    m = combined()
    before = m.SerializeToString()
    p = sem.prepare(m)
    assert m.SerializeToString() == before
    again = sem.prepare(p.model)
    assert again.layers == p.layers and again.renamed == p.renamed
    assert again.model.SerializeToString() == p.model.SerializeToString()
    assert again.notes == []


def test_combined_rewrites_keep_fp32_outputs():
    m = combined()
    p = sem.prepare(m)
    assert p.renamed == {"bn1": "conv", "const_mul": "scale", "const_sqrt": "scale"}
    assert {layer.name for layer in p.layers} == {
        "conv + bn1 + relu + bn2 + scale + residual"}
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((1, 3, 5, 5)).astype(np.float32)
        assert _rel_err(_run(p.model, {"x": x})[0], _run(m, {"x": x})[0]) < 1e-5


def test_big_weight_passed_through_is_not_folded():
    big = np.zeros((sem.FOLD_LIMIT + 1,), dtype=np.float32)
    m = _model([helper.make_node("Identity", ["w"], ["wi"]),
                helper.make_node("Add", ["x", "wi"], ["y"])],
               {"w": big}, [("x", [sem.FOLD_LIMIT + 1])], ["y"])
    p = sem.prepare(m)
    assert [n.op_type for n in p.model.graph.node] == ["Identity", "Add"]


def test_decomposed_layernorm_is_noted():
    m = _model([helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1]),
                helper.make_node("Sub", ["x", "mu"], ["d"]),
                helper.make_node("Pow", ["d", "two"], ["sq"]),
                helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
                helper.make_node("Div", ["d", "var"], ["y"])],
               {"two": np.array(2.0)}, [("x", [2, 8])], ["y"], opset=13)
    notes = sem.prepare(m).notes
    assert any(n.startswith("decomposed_layernorm_rounds") and "Pow_2" in n for n in notes)


def test_mask_constant_is_nan_under_inf_and_finite_under_clamp():
    mask = np.float32(np.finfo(np.float32).min)  # HF attention mask fill, -3.4e38
    inf_rule, clamp_rule = sem.round_weight(mask, "inf"), sem.round_weight(mask, "clamp")
    assert inf_rule == -np.inf and clamp_rule == -65504.0
    with np.errstate(invalid="ignore"):
        assert np.isnan(np.float32(0) * inf_rule) and np.float32(0) * clamp_rule == 0


def test_round_weight_clamp_keeps_tiny_values_and_specials():
    a = np.array([1e-9, -1e-9, 0.0, 70000.0, np.inf, np.nan, 1.0], dtype=np.float32)
    out = sem.round_weight(a, "clamp")
    assert out[0] == 2.0**-24 and out[1] == -(2.0**-24) and out[2] == 0
    assert out[3] == 65504 and np.isposinf(out[4]) and np.isnan(out[5]) and out[6] == 1
    assert sem.round_weight(a, "inf")[0] == 0 and np.isposinf(sem.round_weight(a, "inf")[3])
    assert sem.round_weight(a, "inf").dtype == np.float32


def _tf32_reference(x: np.ndarray) -> np.ndarray:
    """Independent float64 reference: round to 11 significant bits on TF32's grid, RNE."""
    x64 = x.astype(np.float64)
    _, e = np.frexp(x64)
    e = np.maximum(e, -125)  # below 2^-126 the grid is fixed at 2^-136 (TF32 subnormals)
    grid = np.ldexp(1.0, e - 11)
    with np.errstate(over="ignore", invalid="ignore"):
        out = (np.round(x64 / grid) * grid).astype(np.float32)
    out = np.where(np.isfinite(x), out, x)
    return np.where(out == 0, np.copysign(np.float32(0), x), out).astype(np.float32)


def _tf32_cases() -> np.ndarray:
    rng = np.random.default_rng(11)
    random = (rng.standard_normal(20000) * 10.0 ** rng.integers(-40, 39, 20000)).astype(
        np.float32)
    bits = rng.integers(0, 0x7F7FFFFF, 20000, dtype=np.uint32)
    ties = ((bits & ~np.uint32(0x1FFF)) | np.uint32(0x1000)).view(np.float32)
    ties = np.concatenate([ties, -ties])
    huge = np.array([3.4028235e38, -3.4028235e38, 3.4e38, 2.0**127 * 1.99951, 2.0**100,
                     2.0**100 * 1.0001, 1e30, 4.15e34], dtype=np.float32)
    tiny_bits = rng.integers(1, 0x00800000, 5000, dtype=np.uint32)
    tiny = np.concatenate([tiny_bits.view(np.float32), -tiny_bits.view(np.float32),
                           np.array([2.0**-126, 2.0**-149, 1e-45, 2.0**-136 * 1.5],
                                    dtype=np.float32)])
    special = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1.0, -1.0], dtype=np.float32)
    return np.concatenate([random, ties, huge, tiny, special]).astype(np.float32)


def test_tf32_round_nodes_match_the_reference_bit_for_bit():
    x = _tf32_cases()
    nodes = sem.tf32_round_nodes("x", "y", "tf32/")
    graph = helper.make_graph(nodes, "tf32", [helper.make_tensor_value_info("x", F, [None])],
                              [helper.make_tensor_value_info("y", F, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    got = _run(model, {"x": x})[0]
    want = _tf32_reference(x)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    np_got = sem.tf32_round(x)
    assert np.array_equal(np_got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_tf32_rounding_changes_values_it_should():
    x = np.array([1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-10 + 2.0**-12], dtype=np.float32)
    assert list(sem.tf32_round(x)) == [1.0, 1 + 2 * 2.0**-10, 1 + 2.0**-10]


def test_every_default_rule_has_evidence_and_docs_show_the_table():
    names = [r.name for r in sem.RULES]
    assert len(names) == len(set(names))
    for r in sem.RULES:
        assert set(r.versions) <= set(sem.TRT_VERSIONS)
        if r.default:
            assert re.search(r"https?://", r.evidence), r.name
    assert sem.rules_markdown() in DOCS.read_text()
