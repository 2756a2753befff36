"""The names trtbisect gives nodes (graph/names.py, graph/inline.py, #26): a node inside an If
branch, a Loop or Scan body is a candidate under a name qualified by its holders, unnamed ones
get deterministic names, no name collides with a top-level one, the names read back from a copy
carrying them, and a model-local function's nodes are named after the call."""

from __future__ import annotations

import onnx
import pytest

from tests.graph.test_control_flow import PLANTED, SUBGRAPHS
from trtbisect.graph import Graph, node_names, with_node_names


@pytest.mark.parametrize("name", SUBGRAPHS)
def test_nodes_inside_subgraphs_are_candidates_with_qualified_names(name):
    p = PLANTED[name]
    g = Graph(p.model)
    cands = g.candidates()
    assert p.strict <= set(cands)  # the planted culprits can be named by a plan
    inner = [n for n in cands if g.is_inner(n)]
    assert inner and all("[" in n or "/" in n for n in inner)
    # stable: the names are those of a copy carrying them (what trtbisect writes), read back
    assert node_names(with_node_names(p.model)) == g.names
    assert len(set(g.names)) == len(g.names)


def test_qualified_names_show_the_path_of_holders():
    g = Graph(PLANTED["nested_if"].model)
    name = "outer[then_branch]/inner[then_branch]/square"
    assert g.holders(name) == ["outer", "outer[then_branch]/inner"]
    assert g.own_name(name) == "square" and g.node(name).op_type == "Mul"


def test_unnamed_subgraph_nodes_get_deterministic_names():
    m = onnx.ModelProto()
    m.CopyFrom(PLANTED["loop_third_trip"].model)
    body = m.graph.node[0].attribute[0].g
    for n in body.node:
        n.name = ""
    names = Graph(m).names
    assert names[1:] == ["loop[body]/Mul_0", "loop[body]/Sqrt_1", "loop[body]/Mul_2",
                         "loop[body]/Identity_3"]
    assert Graph(with_node_names(m)).names == names


def test_a_subgraph_name_never_collides_with_a_top_level_one():
    m = onnx.ModelProto()
    m.CopyFrom(PLANTED["loop_third_trip"].model)
    m.graph.node.add().CopyFrom(onnx.helper.make_node("Identity", ["y"], ["y2"],
                                                      name="loop[body]/square"))
    names = Graph(m).names
    assert len(set(names)) == len(names) and "loop[body]/square" in names


def test_a_model_local_function_is_inlined_with_readable_names():
    p = PLANTED["local_function"]
    g = Graph(p.model)
    assert g.inlined and not g.model.functions
    assert g.names == ["scale", "l2/axes", "l2/square", "l2/sum", "l2/root", "shrink"]
