"""Planted FP16 faults inside control flow, model-local functions and contrib ops (issue #26).

Each builder returns a `Planted`: the model, one sample, and the exact minimal FP32 set under
each semantics, derived from the emulator's rules (a node in FP16 reads and stores FP16; a value
beyond 65504 becomes inf). Node names are trtbisect's qualified names: a node inside a subgraph
is `<holder>[<attribute>]/<own name>` (graph.qualified_name), a node inlined from a function
`<call node>/<own name>`. Every body reads at least one weight from the outer scope.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 10
OPSET = 17
F = TensorProto.FLOAT


@dataclass(frozen=True)
class Planted:
    name: str
    model: onnx.ModelProto
    inputs: dict[str, np.ndarray]
    strict: frozenset[str]  # the exact minimal FP32 set under --semantics strict
    trt: frozenset[str]  # ... under --semantics trt
    description: str


def _model(nodes, inputs, outputs, inits=(), functions=(), opsets=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), *opsets],
                              functions=list(functions), ir_version=IR_VERSION)
    onnx.checker.check_model(model, full_check=True)
    return model


def _vi(name: str, shape, elem: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _w(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def _always_true(x: str, prefix: str) -> list[onnx.NodeProto]:
    """cond = max|x| >= 0: true for every finite x, but computed at run time (TensorRT builds an
    IIfConditional for it; a constant condition would be folded to one branch)."""
    return [helper.make_node("Abs", [x], [f"{prefix}abs"], name=f"{prefix}abs"),
            helper.make_node("ReduceMax", [f"{prefix}abs"], [f"{prefix}max"], keepdims=0,
                             name=f"{prefix}max"),
            helper.make_node("GreaterOrEqual", [f"{prefix}max", "zero"], [f"{prefix}cond"],
                             name=f"{prefix}cond")]


def _square_root_branch(tag: str, x: str, out: str) -> onnx.GraphProto:
    """a = x * big (an outer-scope weight), b = a * a (beyond 65504), y = sqrt(b) * small."""
    nodes = [helper.make_node("Mul", [x, "big"], [f"{tag}_a"], name="scale"),
             helper.make_node("Mul", [f"{tag}_a", f"{tag}_a"], [f"{tag}_b"], name="square"),
             helper.make_node("Sqrt", [f"{tag}_b"], [f"{tag}_c"], name="root"),
             helper.make_node("Mul", [f"{tag}_c", "small"], [out], name="shrink")]
    return helper.make_graph(nodes, tag, [], [_vi(out, [2, 8])])


def _harmless_branch(tag: str, x: str, out: str) -> onnx.GraphProto:
    nodes = [helper.make_node("Mul", [x, "small"], [f"{tag}_a"], name="scale"),
             helper.make_node("Tanh", [f"{tag}_a"], [out], name="tanh")]
    return helper.make_graph(nodes, tag, [], [_vi(out, [2, 8])])


def _sample(seed: int = 0, shape=(2, 8)) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": (1.0 + rng.random(shape)).astype(np.float32)}  # in [1, 2): no zeros


def if_taken_branch() -> Planted:
    """The taken branch squares x*300 (up to 3.6e5); the other branch is harmless."""
    then = _square_root_branch("then", "x", "then_y")
    other = _harmless_branch("else", "x", "else_y")
    nodes = [*_always_true("x", "c_"),
             helper.make_node("If", ["c_cond"], ["y0"], then_branch=then, else_branch=other,
                              name="branch"),
             helper.make_node("Add", ["y0", "one"], ["y"], name="out")]
    m = _model(nodes, [_vi("x", [2, 8])], [_vi("y", [2, 8])],
               [_w("big", 300.0), _w("small", 1e-3), _w("zero", 0.0), _w("one", 1.0)])
    want = frozenset({"branch[then_branch]/square", "branch[then_branch]/root"})
    return Planted("if_taken_branch", m, _sample(), want, want,
                   "overflow in the If branch the data takes, none in the other")


def if_other_branch() -> Planted:
    """The overflow sits in the branch the data never takes: FP16 is fine for these inputs."""
    then = _harmless_branch("then", "x", "then_y")
    other = _square_root_branch("else", "x", "else_y")
    nodes = [*_always_true("x", "c_"),
             helper.make_node("If", ["c_cond"], ["y"], then_branch=then, else_branch=other,
                              name="branch")]
    m = _model(nodes, [_vi("x", [2, 8])], [_vi("y", [2, 8])],
               [_w("big", 300.0), _w("small", 1e-3), _w("zero", 0.0)])
    return Planted("if_other_branch", m, _sample(), frozenset(), frozenset(),
                   "overflow only in the branch the data does not take")


def nested_if() -> Planted:
    """An If inside an If's then-branch; the inner taken branch overflows."""
    inner = helper.make_node("If", ["c_cond"], ["t_y"], name="inner",
                             then_branch=_square_root_branch("in_then", "t_x", "in_then_y"),
                             else_branch=_harmless_branch("in_else", "t_x", "in_else_y"))
    then = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["t_n"], name="neg"),
         helper.make_node("Neg", ["t_n"], ["t_x"], name="neg_again"),
         inner,
         helper.make_node("Add", ["t_y", "small"], ["then_y"], name="bias")],
        "then", [], [_vi("then_y", [2, 8])])
    nodes = [*_always_true("x", "c_"),
             helper.make_node("If", ["c_cond"], ["y"], then_branch=then,
                              else_branch=_harmless_branch("else", "x", "else_y"),
                              name="outer")]
    m = _model(nodes, [_vi("x", [2, 8])], [_vi("y", [2, 8])],
               [_w("big", 300.0), _w("small", 1e-3), _w("zero", 0.0)])
    want = frozenset({"outer[then_branch]/inner[then_branch]/square",
                      "outer[then_branch]/inner[then_branch]/root"})
    return Planted("nested_if", m, _sample(), want, want,
                   "an If in an If; the overflow two levels down")


def loop_third_trip() -> Planted:
    """v <- sqrt(v * v) * grow, three trips from v = x in [1, 2): v reaches 400-800 on the
    third trip, where v * v overflows FP16; FP32's output stays below 1.7e4."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["v_in", "v_in"], ["v_sq"], name="square"),
         helper.make_node("Sqrt", ["v_sq"], ["v_abs"], name="root"),
         helper.make_node("Mul", ["v_abs", "grow"], ["v_out"], name="grow"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep")],
        "body", [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL),
                 _vi("v_in", [2, 8])],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("v_out", [2, 8])])
    nodes = [helper.make_node("Loop", ["trips", "go", "x"], ["y"], body=body, name="loop")]
    m = _model(nodes, [_vi("x", [2, 8])], [_vi("y", [2, 8])],
               [numpy_helper.from_array(np.array(3, np.int64), "trips"),
                numpy_helper.from_array(np.array(True), "go"), _w("grow", 20.0)])
    want = frozenset({"loop[body]/square", "loop[body]/root"})
    return Planted("loop_third_trip", m, _sample(), want, want,
                   "a Loop whose body overflows FP16 on its third trip only")


def scan_rows() -> Planted:
    """Scan over 6 rows of x*250: each step adds sqrt(row * row) to a running sum."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["row", "row"], ["row_sq"], name="square"),
         helper.make_node("Sqrt", ["row_sq"], ["row_abs"], name="root"),
         helper.make_node("Mul", ["row_abs", "small"], ["row_small"], name="shrink"),
         helper.make_node("Add", ["s_in", "row_small"], ["s_out"], name="accumulate")],
        "body", [_vi("s_in", [8]), _vi("row", [8])], [_vi("s_out", [8])])
    nodes = [helper.make_node("Mul", ["x", "big"], ["xs"], name="scale"),
             helper.make_node("Scan", ["s0", "xs"], ["y"], body=body, num_scan_inputs=1,
                              name="scan")]
    m = _model(nodes, [_vi("x", [6, 8])], [_vi("y", [8])],
               [_w("big", 250.0), _w("small", 1e-3), _w("s0", np.zeros(8))])
    want = frozenset({"scan[body]/square", "scan[body]/root"})
    return Planted("scan_rows", m, _sample(shape=(6, 8)), want, want,
                   "a Scan whose body overflows FP16 on every row")


def local_function() -> Planted:
    """A model-local function l2(a) = sqrt(reduce_sum(a * a)) called on x * 400 (8 values per
    row of 400-800): a * a and the sum leave FP16's range, the root brings them back."""
    fn = helper.make_function(
        "local", "L2", ["a"], ["n"],
        [helper.make_node("Constant", [], ["axes"], name="axes",
                          value=numpy_helper.from_array(np.array([1], np.int64))),
         helper.make_node("Mul", ["a", "a"], ["sq"], name="square"),
         helper.make_node("ReduceSum", ["sq", "axes"], ["ss"], keepdims=1, name="sum"),
         helper.make_node("Sqrt", ["ss"], ["n"], name="root")],
        [helper.make_opsetid("", OPSET)])
    nodes = [helper.make_node("Mul", ["x", "big"], ["xs"], name="scale"),
             helper.make_node("L2", ["xs"], ["norm"], domain="local", name="l2"),
             helper.make_node("Mul", ["norm", "small"], ["y"], name="shrink")]
    m = _model(nodes, [_vi("x", [2, 8])], [_vi("y", [2, 1])],
               [_w("big", 400.0), _w("small", 1e-3)],
               functions=[fn], opsets=[helper.make_opsetid("local", 1)])
    want = frozenset({"l2/square", "l2/sum", "l2/root"})
    # under trt, scale + square and root + shrink are predicted PWN layers: each switches whole
    return Planted("local_function", m, _sample(), want, want | {"scale", "shrink"},
                   "a model-local function whose body overflows FP16")


def contrib_fused_matmul() -> Planted:
    """com.microsoft FusedMatMul (ONNX Runtime's optimizer writes it; TensorRT's parser has no
    importer for it) followed by a Mul whose output reaches ~6e6."""
    rng = np.random.default_rng(3)
    w = 10 * np.abs(rng.standard_normal((8, 8))).astype(np.float32) + 5
    nodes = [helper.make_node("FusedMatMul", ["x", "w"], ["mm"], domain="com.microsoft",
                              alpha=1.0, name="fused_mm"),
             helper.make_node("Mul", ["mm", "huge"], ["big"], name="blow_up"),
             helper.make_node("Mul", ["big", "tiny"], ["y"], name="shrink")]
    m = _model(nodes, [_vi("x", [2, 8])], [_vi("y", [2, 8])],
               [_w("w", w), _w("huge", 4e4), _w("tiny", 1e-6)],
               opsets=[helper.make_opsetid("com.microsoft", 1)])
    want = frozenset({"blow_up", "shrink"})
    return Planted("contrib_fused_matmul", m, _sample(), want, want,
                   "a contrib op the emulator cannot round, then a Mul reaching 6e6")


def if_branch_constant_weight() -> Planted:
    """A branch multiplies by its own Constant node holding 70000: a weight beyond FP16's range
    (TensorRT 10 clamps it to 65504; a plain cast makes it inf)."""
    then = helper.make_graph(
        [helper.make_node("Constant", [], ["w70k"], name="weight",
                          value=numpy_helper.from_array(np.array(7e4, np.float32))),
         helper.make_node("Mul", ["x", "small"], ["t_a"], name="scale"),
         helper.make_node("Mul", ["t_a", "w70k"], ["then_y"], name="weigh")],
        "then", [], [_vi("then_y", [2, 8])])
    nodes = [*_always_true("x", "c_"),
             helper.make_node("If", ["c_cond"], ["y"], then_branch=then,
                              else_branch=_harmless_branch("else", "x", "else_y"),
                              name="branch")]
    m = _model(nodes, [_vi("x", [2, 8])], [_vi("y", [2, 8])],
               [_w("small", 1e-3), _w("zero", 0.0)])
    # clamped (trt), the product is 6.4% off: FP32 at the default tolerance, FP16 at rtol 0.1
    want = frozenset({"branch[then_branch]/weigh"})
    return Planted("if_branch_constant_weight", m, _sample(), want, want,
                   "a Constant weight inside a branch, beyond FP16's range")


def if_untyped_branch_outputs() -> Planted:
    """As PyTorch's exporter and silero-vad write an If: the branches' outputs carry no type.
    The plan keeps the taken branch's last node in FP32 while the other branch's last node is
    FP16, so a written file must give both branches one type for the If to pass the checker."""
    root_out = helper.make_graph(
        [helper.make_node("Mul", ["x", "big"], ["then_a"], name="scale"),
         helper.make_node("Mul", ["then_a", "then_a"], ["then_b"], name="square"),
         helper.make_node("Sqrt", ["then_b"], ["then_y"], name="root")],
        "then", [], [helper.make_empty_tensor_value_info("then_y")])
    other = _harmless_branch("else", "x", "else_y")
    other.output[0].CopyFrom(helper.make_empty_tensor_value_info("else_y"))
    nodes = [*_always_true("x", "c_"),
             helper.make_node("If", ["c_cond"], ["y0"], then_branch=root_out, else_branch=other,
                              name="branch"),
             helper.make_node("Mul", ["y0", "small"], ["y"], name="out")]
    m = _model(nodes, [_vi("x", [2, 8])], [_vi("y", [2, 8])],
               [_w("big", 300.0), _w("small", 1e-3), _w("zero", 0.0)])
    want = frozenset({"branch[then_branch]/square", "branch[then_branch]/root"})
    return Planted("if_untyped_branch_outputs", m, _sample(), want, want,
                   "untyped branch outputs; one branch ends FP32 in the plan, the other FP16")


def all_planted() -> dict[str, Planted]:
    out = {}
    for make in (if_taken_branch, if_other_branch, nested_if, loop_third_trip, scan_rows,
                 local_function, contrib_fused_matmul, if_branch_constant_weight,
                 if_untyped_branch_outputs):
        p = make()
        out[p.name] = p
    return out
