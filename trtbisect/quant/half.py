"""The other side of a quantized file: nodes it computes in FP16 (ModelOpt's default
`high_precision_dtype='fp16'` writes the non-quantized part so), and the same model with chosen
ones computed in FP32.

A node computes in FP16 when one of its outputs is float16 (ONNX type inference). Keeping it
in FP32 reads each float16 input through a Cast to float (a neighbour kept in FP32 hands its
output over in FP32) and writes each output read by an FP16 node or the graph through a Cast back
to float16: the node computes in FP32 on the values the file stores, as a strongly typed TensorRT
network does with the same Casts. Its float16 weights stay as stored (their rounding is
the file's; `--reference` judges against the FP32 model's). Ops whose type is an attribute
(Cast, ConstantOfShape, EyeLike, Random*) or that move no data are never candidates.
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx
from onnx import TensorProto, helper

from .qdq import namer, outer_reads

HALF = (TensorProto.FLOAT16, TensorProto.BFLOAT16)
NOT_CANDIDATES = frozenset({
    "Cast", "CastLike", "QuantizeLinear", "DequantizeLinear", "Constant", "ConstantOfShape",
    "Shape", "Size", "EyeLike", "RandomNormal", "RandomNormalLike", "RandomUniform",
    "RandomUniformLike", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose",
    "If", "Loop", "Scan"})


def types(model: onnx.ModelProto) -> dict[str, int]:
    """Every value's element type (ONNX type inference; graph inputs, outputs, weights)."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    g = inferred.graph
    out = {v.name: v.type.tensor_type.elem_type for v in [*g.input, *g.output, *g.value_info]
           if v.type.HasField("tensor_type")}
    out.update({t.name: t.data_type for t in g.initializer})
    for n in g.node:
        if n.op_type == "Constant" and n.output:
            for a in n.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    out[n.output[0]] = a.t.data_type
    return out


def half_nodes(model: onnx.ModelProto) -> list[str]:
    """Names of the main graph's nodes that compute in FP16/BF16, in graph order."""
    ty = types(model)
    return [n.name for n in model.graph.node
            if n.domain in ("", "ai.onnx") and n.op_type not in NOT_CANDIDATES
            and any(ty.get(o) in HALF for o in n.output if o)]


def to_fp32(model: onnx.ModelProto, names: Iterable[str],
            value_types: dict[str, int] | None = None) -> onnx.ModelProto:
    """A copy of `model` with the nodes `names` computing in FP32 behind Casts."""
    chosen = set(names)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    if not chosen:
        return out
    ty = value_types if value_types is not None else types(model)
    taken = {t for n in out.graph.node for t in [*n.input, *n.output]}
    taken |= {t.name for t in out.graph.initializer} | {i.name for i in out.graph.input}

    fresh = namer(taken)

    outputs = {o.name for o in out.graph.output}
    readers: dict[str, set[str]] = {}
    for n in out.graph.node:
        for t in n.input:
            readers.setdefault(t, set()).add(n.name)
        for a in n.attribute:  # a subgraph reading an outer value reads the FP16 one
            if a.type == onnx.AttributeProto.GRAPH:
                for t in outer_reads(a.g):
                    readers.setdefault(t, set()).add("")
    nodes: list[onnx.NodeProto] = []
    upcast: dict[str, str] = {}  # a float16 value -> its float32 copy (one Cast per value)
    for node in out.graph.node:
        if node.name not in chosen:
            nodes.append(node)
            continue
        for k, t in enumerate(node.input):
            if t and ty.get(t) in HALF:
                if t not in upcast:
                    upcast[t] = fresh(f"{t}_fp32")
                    nodes.append(helper.make_node("Cast", [t], [upcast[t]],
                                                  fresh(f"{node.name}/cast_in{k}"),
                                                  to=TensorProto.FLOAT))
                node.input[k] = upcast[t]
        back = []
        for k, o in enumerate(node.output):
            if o and ty.get(o) in HALF:
                wide = fresh(f"{o}_fp32")
                node.output[k] = wide
                upcast[o] = wide  # FP32 readers read it as computed
                if o in outputs or any(r not in chosen for r in readers.get(o, ())):
                    back.append(helper.make_node("Cast", [wide], [o],
                                                 fresh(f"{node.name}/cast_out{k}"), to=ty[o]))
        nodes.append(node)
        nodes += back
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def fp32_view(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every float16/bfloat16 type made float32 (graph's upcast), weights
    included (upcast exactly)."""
    import numpy as np
    from onnx import numpy_helper

    from ..graph import Graph

    g = Graph(model)
    out = onnx.ModelProto()
    out.CopyFrom(g.model)
    for t in out.graph.initializer:
        if t.data_location == TensorProto.EXTERNAL:
            t.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(g.array(t.name)), t.name))
    return out


def fused_internal(model: onnx.ModelProto, value_types: dict[str, int]) -> frozenset[str]:
    """The float16 values TensorRT keeps inside a fused layer, never stored and so never
    rounded (`--semantics trt`, the default): semantics.py's rules `epilogue_fusion` and
    `pointwise_fusion` (a pointwise chain is one PWN layer that computes in FP32 registers and
    rounds its output once; their evidence is there), predicted by semantics.find_layers on
    the file as it is, certain predictions only (semantics.internal_tensors: a MatMul's
    epilogue is uncertain and keeps per-node rounding, the pessimistic side)."""
    from ..judge.semantics import find_layers, internal_tensors

    if not any(ty in HALF for ty in value_types.values()):
        return frozenset()
    return frozenset(t for t in internal_tensors(find_layers(model))
                     if value_types.get(t) in HALF)


def emulate(model: onnx.ModelProto, value_types: dict[str, int],
            internal: frozenset[str] = frozenset()) -> onnx.ModelProto:
    """The file's FP16 storage made explicit, as the FP16 emulator does (README "The CPU FP16
    emulator"): computed in FP32, and every value the file types float16 rounded where it is
    written, by a Cast(float16) -> Cast(float) pair that ONNX Runtime keeps; `internal`
    values (inside a fused layer: `fused_internal`) are not. Run as it is, ORT's
    CPU provider computes most float16 ops in float32 and drops the Casts between them, so an
    FP16 overflow between two such ops never shows (tests/quant/test_quant.py's fp16_side). Graph
    inputs and outputs keep their declared types."""
    half_values = {t for t, ty in value_types.items() if ty in HALF and t not in internal}
    if not half_values:
        return model
    out = fp32_view(model)
    g = out.graph
    declared = {v.name: v.type.tensor_type.elem_type for v in [*model.graph.input,
                                                                 *model.graph.output]}
    taken = {t for n in g.node for t in [*n.input, *n.output]} | {i.name for i in g.input}

    fresh = namer(taken)

    nodes: list[onnx.NodeProto] = []
    for v in g.input:  # a float16 graph input: fed as float16, widened once
        if declared.get(v.name) in HALF:
            wide = fresh(f"{v.name}_fp32")
            v.type.tensor_type.elem_type = declared[v.name]
            for n in g.node:
                n.input[:] = [wide if t == v.name else t for t in n.input]
            nodes.append(helper.make_node("Cast", [v.name], [wide], fresh(f"{v.name}/widen"),
                                          to=TensorProto.FLOAT))
    for n in g.node:
        nodes.append(n)
        for k, o in enumerate(n.output):
            if o in half_values:
                raw, low = fresh(f"{o}_raw"), fresh(f"{o}_rounded")
                n.output[k] = raw
                to = value_types[o]
                nodes += [helper.make_node("Cast", [raw], [low], fresh(f"{o}/round"), to=to),
                          helper.make_node("Cast", [low], [o], fresh(f"{o}/back"),
                                           to=TensorProto.FLOAT)]
    for v in g.output:
        if declared.get(v.name) in HALF:  # written as the file declares it
            wide = fresh(f"{v.name}_fp32")
            for n in nodes:
                n.output[:] = [wide if t == v.name else t for t in n.output]
                n.input[:] = [wide if t == v.name else t for t in n.input]
            nodes.append(helper.make_node("Cast", [wide], [v.name], fresh(f"{v.name}/narrow"),
                                          to=declared[v.name]))
            v.type.tensor_type.elem_type = declared[v.name]
    del g.node[:]
    g.node.extend(nodes)
    return out
