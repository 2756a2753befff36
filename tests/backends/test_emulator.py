"""The emulator's semantics, exactly: FP16 nodes round what they read and what they store."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h

from tests.conftest import x_to_y
from trtbisect.backends.base import Backend
from trtbisect.backends.ort import Emulator, Reference
from trtbisect.graph import Graph


def chain(*ops):
    """x -> op0 -> t0 -> op1 -> t1 ... -> y, of 4 values; each op is (op_type, extra_inputs)."""
    nodes, prev = [], "x"
    for k, (op, extra) in enumerate(ops):
        ins = [prev, *extra] if extra is not None else [prev, prev]
        nodes.append(h.make_node(op, ins, [f"t{k}"], name=f"n{k}"))
        prev = f"t{k}"
    nodes[-1].output[0] = "y"
    return x_to_y(nodes)


def test_fp16_node_overflows_where_ort_fp16_kernels_would_not():
    emu = Emulator(Graph(chain(("Mul", None))))
    x = {"x": np.array([300, 1, 2, 255.9], np.float32)}
    y16 = emu.run(frozenset(), x)["y"]
    assert np.isinf(y16[0]) and y16[1] == 1
    assert emu.run(frozenset({"n0"}), x)["y"][0] == 90000


def test_fp32_node_reads_what_an_fp16_producer_stored():
    m = chain(("Mul", None), ("Sqrt", []))  # y = sqrt(x*x)
    emu = Emulator(Graph(m))
    x = {"x": np.array([300, 3, 0.5, 2], np.float32)}
    # producer n0 in FP16 stores inf; n1 in FP32 reads that inf
    assert np.isinf(emu.run(frozenset({"n1"}), x)["y"][0])
    # producer in FP32 stores 90000; consumer in FP16 reads it rounded to inf
    assert np.isinf(emu.run(frozenset({"n0"}), x)["y"][0])
    assert emu.run(frozenset({"n0", "n1"}), x)["y"][0] == 300


def test_rounding_is_round_to_nearest_even_and_flushes_tiny_values():
    emu = Emulator(Graph(chain(("Identity", []))))
    x = np.array([2049, 2051, 1e-8, 65519], np.float32)
    got = emu.run(frozenset(), {"x": x})["y"]
    np.testing.assert_array_equal(got, x.astype(np.float16).astype(np.float32))
    assert got[0] == 2048 and got[1] == 2052 and got[2] == 0 and got[3] == 65504


def test_weights_are_read_rounded_by_fp16_nodes_only():
    w = np.array([1e5, 1.0, 1e-9, 3.0], np.float32)
    nodes = [h.make_node("Mul", ["x", "w"], ["y"], name="scale")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [4])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [4])],
                     [onnx.numpy_helper.from_array(w, "w")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 10
    emu = Emulator(Graph(m))
    x = {"x": np.full(4, 1e-3, np.float32)}
    assert np.isinf(emu.run(frozenset(), x)["y"][0])
    np.testing.assert_allclose(emu.run(frozenset({"scale"}), x)["y"], w * 1e-3, rtol=1e-6)


def test_all_fp32_plan_matches_the_reference(zoo):
    z = zoo["attention_logits"]
    g = Graph(z.model)
    emu, ref = Emulator(g), Reference(g)
    got = emu.run(frozenset(g.candidates()), z.inputs)
    switched = Emulator(g, active=g.candidates()).run(frozenset(g.candidates()), z.inputs)
    for name, value in ref.run(z.inputs).items():  # the same bits, whatever the graph
        np.testing.assert_array_equal(got[name], value)
        np.testing.assert_array_equal(switched[name], value)


def test_plans_inside_the_active_set_share_one_session(zoo):
    z = zoo["layernorm_overflow"]
    g = Graph(z.model)
    cands = g.candidates()
    emu = Emulator(g, active=cands[:3])
    assert emu.session is None and emu.rebuilds == 0  # built on first use
    emu.ensure(cands[3:4])  # before the first run: no rebuild, one session around both
    emu.run(frozenset(), z.inputs)
    session = emu.session
    for plan in (frozenset(cands[:4]), frozenset(cands[1:3]), frozenset(cands[3:4])):
        emu.run(plan, z.inputs)
    assert emu.session is session and emu.rebuilds == 1
    emu.run(frozenset(cands[2:6]), z.inputs)  # leaves the set: one rebuild around the union
    assert emu.rebuilds == 2 and emu.active == frozenset(cands[:6])


def test_switched_and_static_graphs_agree_bit_for_bit(zoo):
    """A plan gives the same bits whether its nodes are switchable or fixed in the graph."""
    z = zoo["attention_logits"]
    g = Graph(z.model)
    cands = g.candidates()
    rng = np.random.default_rng(0)
    switched = Emulator(g, active=cands)
    for _ in range(4):
        plan = frozenset(c for c in cands if rng.random() < 0.4)
        static = Emulator(g, active=plan)  # the plan's nodes switchable, all others fixed FP16
        a, b = switched.run(plan, z.inputs), static.run(plan, z.inputs)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


def test_one_session_serves_plans_samples_and_output_lists_in_any_order(zoo):
    """Plans, samples and output lists (outputs, exposed tensors, non-finite flags) in any
    order on one session give what a fresh emulator gives for each, bit for bit."""
    z = zoo["layernorm_overflow"]
    g = Graph(z.model)
    cands = g.candidates()
    exposed = g.stored_tensors()[:3]
    emu = Emulator(g, active=cands, expose=exposed, watch=exposed)
    other = {k: (v * 0.5).astype(v.dtype) for k, v in z.inputs.items()}
    rng = np.random.default_rng(2)
    for k in range(12):
        plan = frozenset(c for c in cands if rng.random() < 0.3)
        feeds = (z.inputs, other)[k % 2]
        fresh = Emulator(g, active=cands, expose=exposed, watch=exposed)
        if k // 2 % 3 == 0:  # two plans in a row with each list of outputs
            a, b = emu.run_tensors_for(plan, feeds, exposed), \
                fresh.run_tensors_for(plan, feeds, exposed)
        elif k // 2 % 3 == 1:
            (a, bad_a), (b, bad_b) = emu.nonfinite(plan, feeds), fresh.nonfinite(plan, feeds)
            assert bad_a == bad_b
        else:
            a, b = emu.run(plan, feeds), fresh.run(plan, feeds)
        assert a.keys() == b.keys()
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
    assert emu.rebuilds == 1


def _static(g, plan, feeds):
    return Emulator(g, active=plan).run(plan, feeds)  # the plan's nodes fixed in their If


def test_grouped_switches_agree_with_static_graphs_bit_for_bit(zoo):
    """Groups (the search's units) switch as one If each: every plan made of whole groups
    runs on one session and gives the bits of a graph built for that plan alone."""
    z = zoo["layernorm_overflow"]
    g = Graph(z.model)
    cands = g.candidates()
    groups = [cands[k:k + 3] for k in range(0, len(cands), 3)]
    emu = Emulator(g, active=cands, groups=groups)
    assert len(emu.feeds_for(frozenset())) == len(groups) and emu.rebuilds == 1
    rng = np.random.default_rng(1)
    for _ in range(5):
        plan = frozenset(n for grp in groups if rng.random() < 0.5 for n in grp)
        got, want = emu.run(plan, z.inputs), _static(g, plan, z.inputs)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
    assert emu.rebuilds == 1


def test_a_plan_that_splits_a_group_splits_it_and_stays_exact(zoo):
    z = zoo["layernorm_overflow"]
    g = Graph(z.model)
    cands = g.candidates()
    emu = Emulator(g, active=cands[:4], groups=[cands[:4]])
    assert len(emu.feeds_for(frozenset(cands[:4]))) == 1
    plan = frozenset(cands[:2])
    got = emu.run(plan, z.inputs)
    assert emu.rebuilds == 2 and len(emu.feeds_for(plan)) == 2
    for k, v in _static(g, plan, z.inputs).items():
        np.testing.assert_array_equal(got[k], v)


def test_a_group_a_path_leaves_and_reenters_switches_node_by_node():
    """n0 and n2 grouped around n1: one If for both would be a cycle."""
    m = chain(("Mul", None), ("Sqrt", []), ("Mul", None))
    g = Graph(m)
    emu = Emulator(g, active=["n0", "n2"], groups=[["n0", "n2"]])
    x = {"x": np.array([300, 1, 2, 255.9], np.float32)}
    for plan in (frozenset(), frozenset({"n0", "n2"})):
        got = emu.run(plan, x)
        np.testing.assert_array_equal(got["y"], _static(g, plan, x)["y"])
    assert np.isinf(emu.run(frozenset(), x)["y"][0])
    assert len(emu.feeds_for(frozenset())) == 2  # two switches, one per node


def test_a_switchable_node_nothing_reads_is_harmless():
    """A dead node in the active set: no If without outputs (ORT refuses those)."""
    nodes = [h.make_node("Mul", ["x", "x"], ["a"], name="n0"),
             h.make_node("Add", ["x", "x"], ["unused"], name="dead"),
             h.make_node("Sqrt", ["a"], ["y"], name="n1")]
    graph = Graph(x_to_y(nodes))
    emu = Emulator(graph, active=graph.candidates())
    x = {"x": np.array([300, 1, 2, 3], np.float32)}
    assert np.isinf(emu.run(frozenset({"dead"}), x)["y"][0])
    assert emu.run(frozenset({"dead", "n0", "n1"}), x)["y"][0] == 300


def test_backend_contract():
    emu = Emulator(Graph(chain(("Mul", None))))
    assert isinstance(emu, Backend)
    assert emu.candidates() == ["n0"]


def test_casts_and_shape_ops_are_not_candidates():
    nodes = [h.make_node("Cast", ["x"], ["xd"], to=TP.DOUBLE, name="c1"),
             h.make_node("Cast", ["xd"], ["xf"], to=TP.FLOAT, name="c2"),
             h.make_node("Shape", ["xf"], ["s"], name="shape"),
             h.make_node("Reshape", ["xf", "s"], ["y"], name="reshape")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [4])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [4])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 10
    assert Graph(m).candidates() == ["reshape"]
