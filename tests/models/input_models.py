"""Models as exporters of every year write them (#34): what ONNX Runtime CPU loads and runs in
FP32, each built with onnx.helper around one planted fault (tests/graph/test_input_models.py and the
fuzz corpus use them).

The fault: y = ((x @ 1000 I) @ 1000 I) @ 1e-6 I. FP16 overflows after `up2` (values of 2e6), so
the plan is exactly {up2, down} under either semantics: `up1` writes at most 2e3, and `down`
reads the 2e6. MatMul runs in ONNX Runtime at every opset, the oldest too.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

X = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)
PLAN = {"up1": False, "up2": True, "down": True}  # node -> kept in FP32
SCALES = (("k1", 1000.0), ("k2", 1000.0), ("k3", 1e-6))


def _weights() -> list[onnx.TensorProto]:
    return [nh.from_array(np.eye(4, dtype=np.float32) * v, n) for n, v in SCALES]


def _nodes(names=("up1", "up2", "down"), out: str = "y") -> list[onnx.NodeProto]:
    return [h.make_node("MatMul", ["x", "k1"], ["a"], name=names[0]),
            h.make_node("MatMul", ["a", "k2"], ["b"], name=names[1]),
            h.make_node("MatMul", ["b", "k3"], [out], name=names[2])]


def _vi(name: str, shape=(2, 4), elem: int = TP.FLOAT) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, elem, None if shape is None else list(shape))


def _model(g: onnx.GraphProto, opset: int = 13, ir: int = 10,
           extra: tuple[tuple[str, int], ...] = ()) -> onnx.ModelProto:
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset),
                                       *(h.make_opsetid(d, v) for d, v in extra)],
                     producer_name="input_models")
    m.ir_version = ir
    return m


def overflow(opset: int = 13, ir: int = 10) -> onnx.ModelProto:
    return _model(h.make_graph(_nodes(), "ovf", [_vi("x")], [_vi("y")], _weights()), opset, ir)


def ir3_weights_as_inputs() -> onnx.ModelProto:
    """IR version 3 (a 2017-2018 export): every initializer is a graph input too."""
    w = _weights()
    g = h.make_graph(_nodes(), "ir3", [_vi("x"), *(_vi(t.name, (4, 4)) for t in w)], [_vi("y")], w)
    return _model(g, opset=8, ir=3)


def opset4_casts() -> onnx.ModelProto:
    """Opset 4, IR 3: a Cast wants a string `to` there (ORT has no kernel for it)."""
    m = ir3_weights_as_inputs()
    m.opset_import[0].version = 4
    return m


def defaulted_input_used() -> onnx.ModelProto:
    """k2 is a graph input with a default value (its initializer): Polygraphy's instancenorm."""
    g = h.make_graph(_nodes(), "dflt", [_vi("x"), _vi("k2", (4, 4))], [_vi("y")], _weights())
    return _model(g)


def defaulted_input_unused() -> onnx.ModelProto:
    """An input with a default value that no node reads (onnx's light_resnet50): it must not
    become required."""
    w = [*_weights(), nh.from_array(np.ones(3, np.float32), "unused")]
    g = h.make_graph(_nodes(), "dflt_unused", [_vi("x"), _vi("unused", (3,))], [_vi("y")], w)
    return _model(g)


def sparse_initializer() -> onnx.ModelProto:
    """k2 as a sparse_initializer (4 non-zeros: onnx-graphsurgeon's sparse_nnz.onnx)."""
    w = [t for t in _weights() if t.name != "k2"]
    values = nh.from_array(np.full(4, 1000.0, np.float32), "k2")
    indices = nh.from_array(np.array([0, 5, 10, 15], np.int64), "k2_indices")
    g = h.make_graph(_nodes(), "sparse", [_vi("x")], [_vi("y")], w)
    g.sparse_initializer.extend([h.make_sparse_tensor(values, indices, [4, 4])])
    return _model(g)


def initializer_output() -> onnx.ModelProto:
    """A graph output that is an initializer (initializer_is_output.onnx)."""
    g = h.make_graph(_nodes(), "init_out", [_vi("x")], [_vi("y"), _vi("k1", (4, 4))], _weights())
    return _model(g)


def shapeless_io() -> onnx.ModelProto:
    """No shape field on the graph's input and output: what onnx-graphsurgeon writes for a
    tensor whose shape is None. Needs --shape or an --inputs .npz for the input."""
    g = h.make_graph(_nodes(), "gs", [_vi("x", None)], [_vi("y", None)], _weights())
    return _model(g)


def shapeless_output() -> onnx.ModelProto:
    """No shape field on the output only (Polygraphy's conv.onnx)."""
    g = h.make_graph(_nodes(), "gs_out", [_vi("x")], [_vi("y", None)], _weights())
    return _model(g)


def empty_graph_name() -> onnx.ModelProto:
    return _model(h.make_graph(_nodes(), "", [_vi("x")], [_vi("y")], _weights()))


def unsorted_nodes() -> onnx.ModelProto:
    """The nodes in reverse execution order."""
    return _model(h.make_graph(_nodes()[::-1], "unsorted", [_vi("x")], [_vi("y")], _weights()))


def unsorted_unnamed() -> onnx.ModelProto:
    """Reverse order and no names: the plan must name them by their place in the file
    (down is MatMul_0, up2 MatMul_1, up1 MatMul_2)."""
    nodes = _nodes(("", "", ""))[::-1]
    return _model(h.make_graph(nodes, "unsorted", [_vi("x")], [_vi("y")], _weights()))


def scalar_output() -> onnx.ModelProto:
    """A rank-0 output: the largest value of the overflow chain's result, and a scalar weight."""
    nodes = [*_nodes(out="c"), h.make_node("ReduceMax", ["c"], ["s"], name="max", keepdims=0),
             h.make_node("Mul", ["s", "half"], ["y"], name="scale")]
    w = [*_weights(), nh.from_array(np.array(0.5, np.float32), "half")]
    return _model(h.make_graph(nodes, "scalar", [_vi("x")], [_vi("y", ())], w))


def _sparse_k2() -> onnx.SparseTensorProto:
    values = nh.from_array(np.full(4, 1000.0, np.float32), "k2")
    return h.make_sparse_tensor(values, nh.from_array(np.array([0, 5, 10, 15], np.int64),
                                                      "k2_indices"), [4, 4])


def _always_true() -> list[onnx.NodeProto]:
    """cond = max|x| >= 0, computed at run time (a constant one would be folded)."""
    return [h.make_node("Abs", ["x"], ["abs"], name="abs"),
            h.make_node("ReduceMax", ["abs"], ["max"], keepdims=0, name="max"),
            h.make_node("GreaterOrEqual", ["max", "zero"], ["cond"], name="cond")]


def _zero() -> onnx.TensorProto:
    return nh.from_array(np.array(0.0, np.float32), "zero")


def if_branch_sparse() -> onnx.ModelProto:
    """The planted chain inside the If branch the data takes, k2 a sparse_initializer of that
    branch (onnx.checker's full check fails on it: its shape inference does not see it)."""
    then = h.make_graph(_nodes(out="then_y"), "then", [], [_vi("then_y")])
    then.sparse_initializer.extend([_sparse_k2()])
    other = h.make_graph([h.make_node("Neg", ["x"], ["else_y"], name="neg")], "else", [],
                         [_vi("else_y")])
    w = [t for t in _weights() if t.name != "k2"] + [_zero()]
    nodes = [*_always_true(), h.make_node("If", ["cond"], ["y"], then_branch=then,
                                          else_branch=other, name="branch")]
    return _model(h.make_graph(nodes, "if_sparse", [_vi("x")], [_vi("y")], w), opset=17)


def _loop_body(inits: list[onnx.TensorProto], defaulted: tuple[str, ...] = (),
               sparse: bool = False) -> onnx.GraphProto:
    """One trip of the planted chain on the loop-carried value; `defaulted`: initializers the
    body lists as inputs too (default values: ONNX Runtime feeds the other inputs)."""
    nodes = _nodes(out="v_out")
    nodes[0].input[0] = "v_in"
    body = h.make_graph(
        [*nodes, h.make_node("Identity", ["cond_in"], ["cond_out"], name="keep")], "body",
        [_vi("i", (), TP.INT64), _vi("cond_in", (), TP.BOOL), _vi("v_in"),
         *(_vi(n, (4, 4)) for n in defaulted)],
        [_vi("cond_out", (), TP.BOOL), _vi("v_out")], inits)
    if sparse:
        body.sparse_initializer.extend([_sparse_k2()])
    return body


def _loop(body: onnx.GraphProto, x: str = "x", y: str = "y") -> onnx.NodeProto:
    return h.make_node("Loop", ["trips", "go", x], [y], body=body, name="loop")


def _trips() -> list[onnx.TensorProto]:
    return [nh.from_array(np.array(1, np.int64), "trips"), nh.from_array(np.array(True), "go")]


def loop_body_defaulted() -> onnx.ModelProto:
    """k2 an initializer of the Loop body that the body also lists as an input: a default value
    ONNX Runtime takes as the constant (the checker's full check counts 4 body inputs for 3)."""
    k2 = next(t for t in _weights() if t.name == "k2")
    body = _loop_body([k2], defaulted=("k2",))
    w = [t for t in _weights() if t.name != "k2"] + _trips()
    return _model(h.make_graph([_loop(body)], "loop_dflt", [_vi("x")], [_vi("y")], w),
                  opset=17)


def nested_sparse_defaulted() -> onnx.ModelProto:
    """Both at depth 2: a Loop inside an If branch, its body holding k2 sparse and k3 as a
    defaulted input."""
    k3 = next(t for t in _weights() if t.name == "k3")
    body = _loop_body([k3], defaulted=("k3",), sparse=True)
    then = h.make_graph([_loop(body, "x", "then_y")], "then", [], [_vi("then_y")])
    other = h.make_graph([h.make_node("Neg", ["x"], ["else_y"], name="neg")], "else", [],
                         [_vi("else_y")])
    w = [next(t for t in _weights() if t.name == "k1"), _zero(), *_trips()]
    nodes = [*_always_true(), h.make_node("If", ["cond"], ["y"], then_branch=then,
                                          else_branch=other, name="branch")]
    return _model(h.make_graph(nodes, "nested", [_vi("x")], [_vi("y")], w), opset=17)


def scan_body_sparse_defaulted() -> onnx.ModelProto:
    """A Scan over the rows of x whose body holds k2 sparse and k3 as a defaulted input (ONNX
    Runtime feeds it the row alone)."""
    nodes = _nodes(out="row_y")
    nodes[0].input[0] = "row"
    k3 = next(t for t in _weights() if t.name == "k3")
    body = h.make_graph(nodes, "body", [_vi("row", (4,)), _vi("k3", (4, 4))],
                        [_vi("row_y", (4,))], [k3])
    body.sparse_initializer.extend([_sparse_k2()])
    scan = h.make_node("Scan", ["x"], ["y"], body=body, num_scan_inputs=1, name="scan")
    w = [next(t for t in _weights() if t.name == "k1")]
    return _model(h.make_graph([scan], "scan", [_vi("x")], [_vi("y")], w), opset=17)


def loop_body_wrong_rank() -> onnx.ModelProto:
    """The body declares its loop-carried output as rank 1 where it computes 2x4: the
    checker's full check fails on the file and on every copy of it; ONNX Runtime runs it."""
    body = _loop_body([next(t for t in _weights() if t.name == "k2")])
    body.output[1].type.tensor_type.shape.dim.pop()
    w = [t for t in _weights() if t.name != "k2"] + _trips()
    return _model(h.make_graph([_loop(body)], "loop_rank", [_vi("x")], [_vi("y")], w), opset=17)


def loop_body_dataless() -> onnx.ModelProto:
    """A body initializer with dims but no data: ONNX Runtime refuses the model (not ours)."""
    k2 = TP()
    k2.name, k2.data_type = "k2", TP.FLOAT
    k2.dims.extend([4, 4])
    w = [t for t in _weights() if t.name != "k2"] + _trips()
    return _model(h.make_graph([_loop(_loop_body([k2]))], "loop_dataless", [_vi("x")],
                               [_vi("y")], w), opset=17)


DRAWS = (32, 32)  # what a discrete draw covers: two runs agree by chance at most 2^-1024


def _random(op: str, **given) -> Callable[[], onnx.ModelProto]:
    """The planted chain, then an op that draws random numbers. A discrete draw (Dropout's
    mask, Bernoulli, Multinomial) covers DRAWS values at even odds, never the chain's own
    few values, which FP32 may push to probabilities of 0 or 1: two runs of it must differ
    whatever the machine, not with some chance."""
    def build() -> onnx.ModelProto:
        attrs = dict(given)
        nodes = _nodes(out="c")
        w = _weights()
        opset = 15
        if op in ("Dropout", "Bernoulli", "Multinomial"):
            w.append(nh.from_array(np.array([DRAWS[0] // 2, DRAWS[1] // 4], np.int64), "reps"))
            # even odds: 0.5 (Bernoulli), equal logits (Multinomial); Dropout keeps the values
            base = "c" if op == "Dropout" else "even"
            if op != "Dropout":
                w += [nh.from_array(np.array(0.0, np.float32), "zero"),
                      nh.from_array(np.array(0.5, np.float32), "half")]
                nodes += [h.make_node("Mul", ["c", "zero"], ["c0"], name="flat"),
                          h.make_node("Add", ["c0", "half"], ["even"], name="even")]
            nodes.append(h.make_node("Tile", [base, "reps"], ["wide"], name="wide"))
        if op == "Dropout":
            w += [nh.from_array(np.array(0.5, np.float32), "ratio"),
                  nh.from_array(np.array(attrs.pop("training")), "training")]
            nodes.append(h.make_node("Dropout", ["wide", "ratio", "training"], ["y"],
                                     name="drop", **attrs))
            return _model(h.make_graph(nodes, op, [_vi("x")], [_vi("y", DRAWS)], w), opset)
        elif op == "Bernoulli":
            nodes += [h.make_node("Bernoulli", ["wide"], ["y"], name="draw", **attrs)]
            return _model(h.make_graph(nodes, op, [_vi("x")], [_vi("y", DRAWS)], w), opset)
        elif op == "Multinomial":
            nodes += [h.make_node("Multinomial", ["wide"], ["i"], name="draw",
                                  sample_size=DRAWS[1], **attrs),
                      h.make_node("Cast", ["i"], ["y"], name="tofloat", to=TP.FLOAT)]
            return _model(h.make_graph(nodes, op, [_vi("x")], [_vi("y", DRAWS)], w), opset)
        else:
            nodes += [h.make_node(op, ["c"], ["r"], name="draw", **attrs),
                      h.make_node("Add", ["c", "r"], ["y"], name="noise")]
        return _model(h.make_graph(nodes, op, [_vi("x")], [_vi("y")], w), opset)
    return build


random_normal_like = _random("RandomNormalLike")
random_uniform_like_seeded = _random("RandomUniformLike", seed=7.0)
dropout_training = _random("Dropout", training=True)
dropout_inference = _random("Dropout", training=False)
bernoulli = _random("Bernoulli")
multinomial = _random("Multinomial")

# name -> (builder, fed an .npz?) : every class of #34 that is judged
JUDGED: dict[str, Callable[[], onnx.ModelProto]] = {
    "ir3_weights_as_inputs": ir3_weights_as_inputs, "opset4_casts": opset4_casts,
    "defaulted_input_used": defaulted_input_used,
    "defaulted_input_unused": defaulted_input_unused,
    "sparse_initializer": sparse_initializer, "initializer_output": initializer_output,
    "shapeless_io": shapeless_io, "shapeless_output": shapeless_output,
    "empty_graph_name": empty_graph_name, "unsorted_nodes": unsorted_nodes,
    "unsorted_unnamed": unsorted_unnamed, "scalar_output": scalar_output,
    "dropout_inference": dropout_inference,
    "if_branch_sparse": if_branch_sparse, "loop_body_defaulted": loop_body_defaulted,
    "nested_sparse_defaulted": nested_sparse_defaulted,
    "scan_body_sparse_defaulted": scan_body_sparse_defaulted,
}
# name -> the holders of the planted nodes, for the classes whose chain sits in a subgraph
HOLDERS = {"if_branch_sparse": "branch[then_branch]/", "loop_body_defaulted": "loop[body]/",
           "nested_sparse_defaulted": "branch[then_branch]/loop[body]/",
           "scan_body_sparse_defaulted": "scan[body]/"}
# name -> builder: models whose two FP32 runs differ (reference_unstable), the drawing op's name
UNSTABLE: dict[str, Callable[[], onnx.ModelProto]] = {
    "random_normal_like": random_normal_like,
    "random_uniform_like_seeded": random_uniform_like_seeded,
    "dropout_training": dropout_training, "bernoulli": bernoulli, "multinomial": multinomial,
}


def if_branches_one_weight_name() -> onnx.ModelProto:
    """Both If branches hold their own initializer 'w' (the taken one the planted k2, the
    other 2 I): one name in two scopes, so neither can move to the main graph."""
    then = h.make_graph(_nodes(out="then_y"), "then", [], [_vi("then_y")],
                        [nh.from_array(np.eye(4, dtype=np.float32) * 1000.0, "w")])
    then.node[1].input[1] = "w"
    other = h.make_graph([h.make_node("MatMul", ["x", "w"], ["else_y"], name="twice")], "else",
                         [], [_vi("else_y")], [nh.from_array(np.eye(4, dtype=np.float32) * 2, "w")])
    w = [t for t in _weights() if t.name != "k2"] + [_zero()]
    nodes = [*_always_true(), h.make_node("If", ["cond"], ["y"], then_branch=then,
                                          else_branch=other, name="branch")]
    return _model(h.make_graph(nodes, "if_w", [_vi("x")], [_vi("y")], w), opset=17)
