"""ONNX node -> PyTorch module mapping (trtbisect.graph.modules): pure, no torch needed."""

from __future__ import annotations

import json

import onnx
import pytest
from onnx import helper

from trtbisect.graph.modules import (
    MODULES_KEY,
    ancestors,
    module_label,
    module_of,
    rebuild_path,
    scope_components,
    unqualified,
    within,
)


@pytest.mark.parametrize("name, expected", [
    ("/blocks/blocks.3/ln2/Pow", ("blocks.3.ln2", None)),
    ("/blocks.3/ln2/Pow", ("blocks.3.ln2", None)),
    ("/layers.0/seq/seq.0/seq.0.0/Gemm", ("layers.0.seq.0.0", None)),
    ("/blocks/blocks.0/Add", ("blocks.0", None)),
    ("/norm/ReduceMean_1", ("norm", None)),
    ("/Exp", None),  # an op of the root module
    ("Identity_6", None),  # no scope at all
    ("node_layer_norm", None),  # dynamo name without its metadata
])
def test_module_of_from_torchscript_names(name, expected):
    assert module_of(name) == expected


def test_unqualified_matches_the_torchscript_exporter():
    assert unqualified("blocks.0.ln2") == "ln2"
    assert unqualified("blocks.3") == "blocks.3"
    assert unqualified("layers.0.seq.0.0") == "seq.0.0"
    assert unqualified("0.1") == "0.1"


def test_rebuild_and_helpers():
    assert scope_components("/a/a.1/b/Conv") == ["a", "a.1", "b"]
    assert rebuild_path(["layers.0", "seq", "seq.0"]) == "layers.0.seq.0"
    assert ancestors("a.b.c") == ["a.b", "a"]
    assert within("blocks.1.ln2", {"blocks.1"}) and not within("blocks.10", {"blocks.1"})


def _model(nodes, table=None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [2])],
                              [helper.make_tensor_value_info("y", 1, [2])])
    model = helper.make_model(graph)
    if table is not None:
        model.metadata_props.append(onnx.StringStringEntryProto(key=MODULES_KEY,
                                                                value=json.dumps(table)))
    return model


TABLE = {"": "m.Outer", "layers": "torch.nn.modules.container.ModuleList",
         "layers.0": "m.Inner", "layers.0.d": "torch.nn.modules.container.ModuleDict",
         "layers.0.d.a": "torch.nn.modules.linear.Linear", "act": "torch.nn.modules.activation.Tanh",
         "blocks": "torch.nn.modules.container.Sequential", "blocks.3": "m.Block",
         "blocks.3.ln2": "torch.nn.modules.normalization.LayerNorm"}


def test_module_table_gives_exact_paths_and_classes():
    """What TorchScript names hide (a ModuleDict atom, a second call's `_1`) the table restores."""
    names = ["/blocks/blocks.3/ln2/Pow", "/layers.0/a/Gemm", "/act_1/Tanh"]
    model = _model([helper.make_node("Identity", ["x"], ["y"], name=names[0])], TABLE)
    assert module_of(names[0], model) == ("blocks.3.ln2", "LayerNorm")
    assert module_of(names[1], model) == ("layers.0.d.a", "Linear")
    assert module_of(names[2], model) == ("act", "Tanh")
    assert module_of(names[1]) == ("layers.0.a", None)  # the best guess without the table
    assert module_label(names[0], model) == "blocks.3.ln2 (LayerNorm)"
    assert module_label("/Exp", model) is None


def test_dynamo_node_metadata():
    """What torch 2.13's dynamo exporter writes on each node."""
    node = helper.make_node("LayerNormalization", ["x"], ["y"], name="node_layer_norm")
    for key, value in {
        "namespace": ": m.M/blocks: torch.nn.modules.container.Sequential/blocks.0: m.Block/"
                     "blocks.0.ln2: torch.nn.modules.normalization.LayerNorm/layer_norm: "
                     "aten.layer_norm.default",
        "pkg.torch.onnx.name_scopes": "['', 'blocks', 'blocks.0', 'blocks.0.ln2', 'layer_norm']",
        "pkg.torch.onnx.class_hierarchy": "['m.M', 'torch.nn.modules.container.Sequential', "
                                          "'m.Block', 'torch.nn.modules.normalization.LayerNorm',"
                                          " 'aten.layer_norm.default']",
    }.items():
        node.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))
    root = helper.make_node("Exp", ["x"], ["z"], name="node_exp")
    root.metadata_props.append(onnx.StringStringEntryProto(
        key="pkg.torch.onnx.name_scopes", value="['', 'exp']"))
    model = _model([node, root])
    assert module_of("node_layer_norm", model) == ("blocks.0.ln2", "LayerNorm")
    assert module_of("node_exp", model) is None
