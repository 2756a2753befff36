"""TensorRT knowledge that needs no TensorRT: inspector parsing, mapping, precision checks (the
search strategy that reads them: tests/search/test_refine.py)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from trtbisect.graph import node_names
from trtbisect.judge import trt_layers as tl

FIXTURES = Path(__file__).parents[1] / "fixtures" / "trt"
US = tl.METADATA_SEPARATOR
ORDER = ["/stem/Conv", "/stem/Relu", "/blk/MatMul", "/blk/Add", "/blk/Sigmoid", "/blk/Mul",
         "/attn/MatMul", "/attn/Div", "/attn/Softmax", "/attn/MatMul_1", "ReduceMean_10",
         "/ln/Sub", "/ln/Pow", "/head/Gemm", "/head/Softmax"]


def fixture_model() -> onnx.ModelProto:
    """The graph the fixtures describe (shapes are irrelevant to the mapping)."""
    ops = ["Conv", "Relu", "MatMul", "Add", "Sigmoid", "Mul", "MatMul", "Div", "Softmax",
           "MatMul", "ReduceMean", "Sub", "Pow", "Gemm", "Softmax"]
    nodes, prev = [], "input"
    for i, (name, op) in enumerate(zip(ORDER, ops)):
        out = "mean_out" if op == "ReduceMean" else f"t{i}"
        nodes.append(helper.make_node(op, [prev], [out], name="" if i == 10 else name))
        prev = out
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)])
    return helper.make_model(graph)


def load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


# ------------------------------------------------------------------------------ naming

def test_fixture_order_is_trtbisect_naming():
    assert node_names(fixture_model()) == ORDER  # the unnamed ReduceMean is ReduceMean_10


def test_parser_aliases_cover_unnamed_nodes_only():
    assert tl.parser_aliases(fixture_model()) == {"node_of_mean_out": "ReduceMean_10"}


# ---------------------------------------------------------------------- inspector JSON

@pytest.mark.parametrize("text,dtype", [
    ("Row major linear FP32", "fp32"), ("Channel major FP16 format where channel % 8 == 0", "fp16"),
    ("Half", "fp16"), ("Float", "fp32"), ("BFloat16", "bf16"), ("Row major linear BF16 format", "bf16"),
    ("Int8", "int8"), ("UInt8", "uint8"), ("Int32", "int32"), ("Int64", "int64"), ("Bool", "bool"),
    ("FP8", "fp8"), ("N/A due to dynamic shapes", ""), ("", ""),
])
def test_dtype_of(text, dtype):
    assert tl.dtype_of(text) == dtype


def test_tensor_info_reads_both_versions():
    v10 = tl.tensor_info({"Name": "x", "Format/Datatype": "Row major linear FP16 format"})
    assert (v10.name, v10.dtype) == ("x", "fp16")
    for key in ("DataType", "Datatype"):
        v11 = tl.tensor_info({"Name": "y", "Format": "Row major linear FP32 format (kLINEAR)",
                              key: "Half"})
        assert (v11.dtype, v11.format) == ("fp16", "Row major linear FP32 format (kLINEAR)")


def test_metadata_nodes():
    assert tl.metadata_nodes(f"[ONNX Layer: a]{US}[ONNX Layer: b]") == ["a", "b"]
    assert tl.metadata_nodes("[ONNX Layer: a][ONNX Layer: b]") == ["a", "b"]  # no separator
    assert tl.metadata_nodes(f"[ONNX Layer: a]{US}[ONNX Layer: a]") == ["a"]
    assert tl.metadata_nodes("[ONNX Layer: a]\x1e[ONNX Layer: b]") == ["a", "b"]  # record sep
    assert tl.metadata_nodes("") == [] and tl.metadata_nodes("something else") == []
    # a node inside an ONNX local function: the caller in the top-level graph is the one we know
    stacked = "[ONNX Layer: inner/Add | block_0 (MyBlock)]"
    assert tl.metadata_nodes(stacked, known={"block_0"}) == ["block_0"]
    assert tl.metadata_nodes(stacked) == ["inner/Add"]


def test_foreign_range():
    assert tl.foreign_range("{ForeignNode[/a/MatMul.../b/Add]}", ORDER + ["/a/MatMul", "/b/Add"]) \
        == ("/a/MatMul", "/b/Add")
    names = {"x...y", "z"}  # a node name that itself contains "..."
    assert tl.foreign_range("{ForeignNode[x...y...z]}", names) == ("x...y", "z")
    assert tl.foreign_range("{ForeignNode[z]}", names) == ("z", "z")
    assert tl.foreign_range("{ForeignNode[p...q]}", names) is None
    assert tl.foreign_range("Conv_0 + Relu_1", names) is None


def test_name_nodes_reads_fused_names():
    known = set(ORDER)
    assert tl.name_nodes("/stem/Conv + /stem/Relu", known) == ["/stem/Conv", "/stem/Relu"]
    assert tl.name_nodes("PWN(PWN(/blk/Sigmoid), /blk/Mul)", known) == ["/blk/Sigmoid", "/blk/Mul"]
    assert tl.name_nodes("/attn/MatMul || /attn/MatMul_1", known) == ["/attn/MatMul", "/attn/MatMul_1"]
    assert tl.name_nodes("/ln/Pow_1", known) == ["/ln/Pow"]  # parser's unique-name suffix
    assert tl.name_nodes("/attn/MatMul_1", known) == ["/attn/MatMul_1"]  # a real name wins
    assert tl.name_nodes("Reformatting CopyNode for Input Tensor 0 to /stem/Conv", known) == []
    assert tl.name_nodes("__myl_MatmAdd_myl0_0", known) == []


def test_layer_owner_prefers_metadata_then_name():
    known = set(ORDER)
    assert tl.layer_owner("[ONNX Layer: /ln/Sub]", "anything", known) == "/ln/Sub"
    assert tl.layer_owner("", "/ln/Pow_2", known) == "/ln/Pow"
    assert tl.layer_owner("[ONNX Layer: cast_7]", "ONNXTRT_helper", known) is None


# The inspector JSON as TensorRT writes it (the sources: tests/fixtures/trt/README.md). Keys a
# record must have; a layer may carry more (ParameterType, TacticValue, Weights, ...).
LAYER_KEYS = {"Name", "LayerType", "Inputs", "Outputs"}
TENSOR_KEYS = {10: {"Name", "Location", "Dimensions", "Format/Datatype"},
               11: {"Name", "Location", "Dimensions", "Format", "Datatype"}}
IO_KEY = {10: "Bindings", 11: "I/O Tensors"}
IO_TENSOR_KEYS = {"Name", "IOMode", "DataType", "Dimensions", "Location", "IsShapeInferenceIO",
                  "ProfileInfo"}


def assert_real_format(info: dict, major: int) -> None:
    """`info` is shaped like TensorRT `major`'s DETAILED engine information."""
    assert set(info) == {"Layers", IO_KEY[major]}, set(info)
    if major == 10:
        assert all(isinstance(name, str) for name in info["Bindings"])
    else:
        assert all(set(t) == IO_TENSOR_KEYS for t in info["I/O Tensors"])
        assert all(t["IOMode"] in ("Input", "Output") for t in info["I/O Tensors"])
    for layer in info["Layers"]:
        assert LAYER_KEYS <= set(layer), layer
        for tensor in layer["Inputs"] + layer["Outputs"]:
            assert set(tensor) == TENSOR_KEYS[major], tensor
            assert isinstance(tensor["Dimensions"], list)
        metadata = layer.get("Metadata", "")
        assert not metadata or all(p.startswith("[ONNX Layer: ") and p.endswith("]")
                                   for p in tl.METADATA_SEPARATORS.split(metadata)), metadata


@pytest.mark.parametrize("name,major", [("layers_trt10.json", 10), ("layers_trt11.json", 11)])
def test_fixtures_are_in_the_real_format(name, major):
    assert_real_format(load(name), major)


def test_the_format_check_refuses_the_other_versions_shape():
    """The two formats differ where TensorRT 11 changed them: an 11 file is no 10 file."""
    for name, other in (("layers_trt10.json", 11), ("layers_trt11.json", 10)):
        with pytest.raises(AssertionError):
            assert_real_format(load(name), other)


def test_map_layers_trt10_fixture():
    layers = tl.map_layers(load("layers_trt10.json"), ORDER)
    got = {layer.name: (layer.nodes, layer.source) for layer in layers}
    assert got == {
        "Reformatting CopyNode for Input Tensor 0 to /stem/Conv + /stem/Relu": ((), "none"),
        "/stem/Conv + /stem/Relu": (("/stem/Conv", "/stem/Relu"), "metadata"),
        "__myl_MatmAdd_myl0_0": (("/blk/MatMul", "/blk/Add"), "metadata"),
        "PWN(PWN(/blk/Sigmoid), /blk/Mul)": (("/blk/Sigmoid", "/blk/Mul"), "name"),
        "{ForeignNode[/attn/MatMul.../attn/MatMul_1]}":
            (("/attn/MatMul", "/attn/Div", "/attn/Softmax", "/attn/MatMul_1"), "range"),
        "ReduceMean_10": (("ReduceMean_10",), "metadata"),
        "/ln/Sub": (("/ln/Sub",), "metadata"),
        "/ln/Pow_1": (("/ln/Pow",), "name"),
        "__myl_GemmSoft_myl1_2": (("/head/Gemm", "/head/Softmax"), "metadata"),
    }
    conv = layers[1]
    assert conv.layer_type == "CaskConvolution" and conv.float_dtypes == {"fp16"}
    assert conv.tactic.startswith("sm80_xmma_fprop")
    assert layers[0].inputs[0].dtype == "fp32" and layers[0].outputs[0].dtype == "fp16"
    covered = {n for layer in layers for n in layer.nodes}
    assert covered == set(ORDER)


def test_map_layers_trt11_fixture_ignores_inserted_casts():
    layers = tl.map_layers(load("layers_trt11.json"), ORDER)
    got = {layer.name: (layer.nodes, layer.source) for layer in layers}
    assert got["/stem/Conv + /stem/Relu"] == (("/stem/Conv", "/stem/Relu"), "metadata")
    assert got["{ForeignNode[/attn/MatMul.../ln/Sub]}"] == (
        ("/attn/MatMul", "/attn/Div", "/attn/Softmax", "/attn/MatMul_1", "ReduceMean_10",
         "/ln/Sub"), "range")
    assert got["__myl_CastGemmSoft_myl1_0"] == (("/head/Gemm", "/head/Softmax"), "metadata")
    assert layers[2].outputs[0].dtype == "fp32" and layers[0].outputs[0].dtype == "fp16"


def test_map_layers_names_only_and_parser_aliases():
    """LAYER_NAMES_ONLY verbosity lists bare names; an unrenamed model shows `node_of_...`."""
    info = {"Layers": ["/stem/Conv + /stem/Relu", "node_of_mean_out", "{ForeignNode[/ln/Sub.../head/Gemm]}"],
            "Bindings": ["input", "output"]}
    layers = tl.map_layers(info, ORDER, aliases=tl.parser_aliases(fixture_model()))
    assert [layer.nodes for layer in layers] == [
        ("/stem/Conv", "/stem/Relu"), ("ReduceMean_10",), ("/ln/Sub", "/ln/Pow", "/head/Gemm")]
    meta = [{"Name": "x", "Metadata": "[ONNX Layer: node_of_mean_out]"}]
    assert tl.map_layers(meta, ORDER, tl.parser_aliases(fixture_model()))[0].nodes == ("ReduceMean_10",)
    assert tl.map_layers(json.dumps(info), ORDER)[0].source == "name"  # a JSON string works too


def test_layer_groups_and_json_roundtrip():
    layers = tl.map_layers(load("layers_trt10.json"), ORDER)
    groups = tl.layer_groups(layers, [n for n in ORDER if n != "/stem/Conv"])
    assert groups["/stem/Conv + /stem/Relu"] == ("/stem/Relu",)
    assert "Reformatting CopyNode for Input Tensor 0 to /stem/Conv + /stem/Relu" not in groups
    assert len(groups) == 8
    assert [tl.EngineLayer.from_json(x.to_json()) for x in layers] == layers
    mapping = tl.layer_map_json(layers)
    assert mapping["nodes"]["/attn/Softmax"] == ["{ForeignNode[/attn/MatMul.../attn/MatMul_1]}"]
    json.dumps(mapping)


def test_check_precisions_flags_swallowed_requests():
    layers = tl.map_layers(load("layers_trt10.json"), ORDER)
    checks = {c.node: c for c in tl.check_precisions(
        layers, ["/stem/Relu", "/attn/Softmax", "/ln/Sub", "/ln/Pow", "/head/Softmax", "absent"])}
    assert checks["/stem/Relu"].status == "not-honoured"
    assert checks["/attn/Softmax"].status == "not-honoured"  # inside a Myelin ForeignNode
    assert checks["/attn/Softmax"].layers == ("{ForeignNode[/attn/MatMul.../attn/MatMul_1]}",)
    assert checks["/ln/Sub"].status == "honoured"
    assert checks["/ln/Pow"].status == "not-honoured"  # reads FP32 but writes FP16
    assert checks["/head/Softmax"].status == "honoured"
    assert checks["absent"].status == "unknown"


def test_precision_warnings_name_the_swallowing_layer():
    layers = tl.map_layers(load("layers_trt10.json"), ORDER)
    warnings = tl.precision_warnings(tl.check_precisions(layers, ["/attn/Softmax", "/ln/Sub"]))
    assert warnings == ["FP32 request for /attn/Softmax not honoured: "
                        "{ForeignNode[/attn/MatMul.../attn/MatMul_1]} wrote fp16 "
                        "(a fusion such as Myelin swallowed it)"]


def test_describe_culprits_both_ways():
    layers = tl.map_layers(load("layers_trt10.json"), ORDER)
    lines = tl.describe_culprits(["/attn/Softmax", "/ln/Sub", "gone"], layers)
    assert lines == [
        ("engine layer `{ForeignNode[/attn/MatMul.../attn/MatMul_1]}` contains ONNX nodes "
         "/attn/MatMul, /attn/Div, /attn/Softmax, /attn/MatMul_1; /attn/Softmax must stay FP32"),
        "engine layer `/ln/Sub` contains ONNX node /ln/Sub; /ln/Sub must stay FP32",
        "ONNX node gone (in no engine layer: folded or fused away) must stay FP32",
    ]
    big = [tl.EngineLayer("{ForeignNode[n0...n19]}", "Myelin", tuple(f"n{i}" for i in range(20)), "range")]
    assert tl.describe_culprits(["n3"], big)[0].endswith("n7, ... (20 nodes); n3 must stay FP32")


# ------------------------------------------------------------------------------ cache key

def test_plan_key():
    key = tl.plan_key(b"model", ["b", "a"], "10.13.0")
    assert key == tl.plan_key(b"model", ["a", "b", "a"], "10.13.0")
    assert len({key, tl.plan_key(b"model", ["a"], "10.13.0"), tl.plan_key(b"other", ["a", "b"], "10.13.0"),
                tl.plan_key(b"model", ["a", "b"], "11.4.0"),
                tl.plan_key(b"model", ["a", "b"], "10.13.0", shapes={"x": (1, 3)})}) == 5


# trtexec/Polygraphy command rendering: tests/outputs/test_render.py
