"""Strongly typed mixed-precision ONNX: writing one from a plan, and judging any one faithfully.

`write_mixed_onnx` is what TensorRT 11 builds (it has no weak typing: precision lives in the
graph). FP16 nodes get float16 inputs, weights and outputs; FP32 nodes are fenced by Cast nodes;
the model's own Casts keep their types, and graph inputs and outputs keep their declared types.

`emulate_mixed` turns any mixed model (ours, AutoCast's, a hand-made FP16 one) into an FP32 model
that rounds every float16 tensor where it is produced: each FP16 op then computes in FP32 on
FP16-exact inputs and stores an FP16-rounded output, which is what the CPU emulator does.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .graph import FLOAT, Graph, with_node_names

FLOAT16 = TensorProto.FLOAT16


def write_mixed_onnx(model: onnx.ModelProto, fp32_nodes: Iterable[str]) -> onnx.ModelProto:
    """The model with every candidate node outside `fp32_nodes` computing in FP16."""
    named = with_node_names(model)
    graph = Graph(named)
    keep = set(fp32_nodes)
    half_nodes = {n for n in graph.candidates() if n not in keep}
    out = onnx.ModelProto()
    out.CopyFrom(named)
    g = out.graph
    # home[t]: the element type tensor t has in the mixed graph
    home = dict(graph.types)
    for name in half_nodes:
        for t in graph.float_outputs(name):
            home[t] = FLOAT16
    # graph outputs produced in FP16 get an internal name and a final Cast to their declared type
    renamed = {v.name: f"{v.name}::fp16" for v in g.output if home.get(v.name) == FLOAT16}
    converted: dict[tuple[str, int], str] = {}
    new_inits: list[TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def as_type(t: str, want: int) -> str:
        src = renamed.get(t, t)
        if home.get(t) == want:
            return src
        key = (t, want)
        if key not in converted:
            suffix = "fp16" if want == FLOAT16 else "fp32"
            name = f"{t}::{suffix}" if t not in renamed else f"{t}::{suffix}::cast"
            if t in graph.initializers and want == FLOAT16:
                arr = numpy_helper.to_array(graph.initializers[t])
                with np.errstate(over="ignore"):
                    new_inits.append(numpy_helper.from_array(arr.astype(np.float16), name))
            else:
                nodes.append(helper.make_node("Cast", [src], [name], to=want, name=f"{name}::cast"))
            converted[key] = name
        return converted[key]

    for name, node in zip(graph.names, graph.model.graph.node):
        new = onnx.NodeProto()
        new.CopyFrom(node)
        if name in half_nodes:
            halves = set(graph.fp16_inputs(name))
            for k, t in enumerate(new.input):
                if t in halves:
                    new.input[k] = as_type(t, FLOAT16)
                elif graph.is_float(t):
                    new.input[k] = as_type(t, FLOAT)
        elif node.op_type in ("Cast", "Shape", "Size"):
            new.input[:] = [renamed.get(t, t) for t in new.input]  # any input type will do
        else:
            for k, t in enumerate(new.input):
                if graph.is_float(t):
                    new.input[k] = as_type(t, FLOAT)
        new.output[:] = [renamed.get(t, t) for t in new.output]
        nodes.append(new)
    for t, internal in renamed.items():
        nodes.append(helper.make_node("Cast", [internal], [t], to=FLOAT, name=f"{t}::output_cast"))
    del g.node[:]
    g.node.extend(nodes)
    used = {t for n in nodes for t in n.input}
    unused = [i for i in g.initializer if i.name not in used]
    for i in unused:
        g.initializer.remove(i)
    g.initializer.extend(new_inits)
    del g.value_info[:]
    out.metadata_props.append(onnx.StringStringEntryProto(
        key="trtbisect.fp32_nodes", value=",".join(sorted(keep))))
    return onnx.shape_inference.infer_shapes(out)


def emulate_mixed(model: onnx.ModelProto) -> onnx.ModelProto:
    """An FP32 model that rounds every float16 tensor of `model` where it is produced."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = Graph(inferred).types
    out = onnx.ModelProto()
    out.CopyFrom(inferred)
    g = out.graph
    is_half = {t for t, ty in types.items() if ty == FLOAT16}
    for init in g.initializer:
        if init.data_type == FLOAT16:
            init.CopyFrom(numpy_helper.from_array(
                numpy_helper.to_array(init).astype(np.float32), init.name))
    nodes: list[onnx.NodeProto] = []

    def round_into(raw: str, t: str) -> None:
        nodes.append(helper.make_node("Cast", [raw], [f"{t}::half"], to=FLOAT16))
        nodes.append(helper.make_node("Cast", [f"{t}::half"], [t], to=FLOAT))

    for v in g.input:
        if v.name in is_half and v.type.tensor_type.elem_type == FLOAT16:
            v.type.tensor_type.elem_type = FLOAT
            raw = f"{v.name}::fed"
            round_into(raw, v.name)
            v.name = raw
    for node in g.node:
        new = onnx.NodeProto()
        new.CopyFrom(node)
        _retype_attributes(new)
        rounds = []
        for k, t in enumerate(new.output):
            if t in is_half:
                new.output[k] = f"{t}::raw"
                rounds.append(t)
        nodes.append(new)
        for t in rounds:
            round_into(f"{t}::raw", t)
    del g.node[:]
    g.node.extend(nodes)
    for v in [*g.output]:
        if v.type.tensor_type.elem_type == FLOAT16:
            v.type.tensor_type.elem_type = FLOAT
    del g.value_info[:]
    return out


def _retype_attributes(node: onnx.NodeProto) -> None:
    """Make type-setting attributes produce float32 where they said float16."""
    for a in node.attribute:
        if a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT and a.i == FLOAT16:
            a.i = FLOAT
        elif a.type == onnx.AttributeProto.TENSOR and a.t.data_type == FLOAT16:
            a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float32),
                                                 a.t.name))
