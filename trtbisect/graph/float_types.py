"""Element types: every tensor typed (inference carried past ops onnx does not know), and a
float16/bfloat16 model's FP32 view (`upcast`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .control_flow import walk, walk_graphs
from .schema import has_schema
from .weights import initializer_array, structure

log = logging.getLogger(__name__)

FLOAT = TensorProto.FLOAT
HALF_TYPES = {TensorProto.FLOAT16: np.float16, TensorProto.BFLOAT16: None}


def upcast(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model's structure with every float16/bfloat16 type made float32 (weights untouched:
    the store upcasts arrays when they are read)."""
    out = structure(model)
    for g in walk_graphs(out.graph):  # subgraphs' values, weights and Casts too
        for v in [*g.input, *g.output, *g.value_info]:
            if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type in HALF_TYPES:
                v.type.tensor_type.elem_type = FLOAT
        for t in g.initializer:
            if t.data_type in HALF_TYPES:
                if t.data_location == TensorProto.EXTERNAL:
                    t.data_type = FLOAT  # the store hands out float32 for it
                else:
                    t.CopyFrom(numpy_helper.from_array(
                        initializer_array(t).astype(np.float32), t.name))
        for node in g.node:
            for a in node.attribute:
                if (a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT
                        and a.i in HALF_TYPES):
                    a.i = FLOAT
                elif a.type == onnx.AttributeProto.TENSOR and a.t.data_type in HALF_TYPES:
                    a.t.CopyFrom(numpy_helper.from_array(
                        initializer_array(a.t).astype(np.float32), a.t.name))
    return out


def infer_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor name we can type (inputs, initializers, node outputs).

    onnx's inference stops at an op whose schema it does not know (a com.microsoft op, a
    custom op): such an op's untyped outputs are taken to have its first typed input's element
    type (FusedMatMul, SkipLayerNormalization, Attention... all keep their input's type), and
    inference runs again from there, so what follows it is typed too.
    """
    return infer(model)[0]


def infer(model: onnx.ModelProto) -> tuple[dict[str, int], frozenset[str]]:
    """`infer_types`, and the names whose shape inference gives fully static dims."""
    work = structure(model)
    types: dict[str, int] = {}
    static: frozenset[str] = frozenset()
    for _ in range(MAX_TYPE_GUESSES):
        types, static = _inferred_types(work)
        guessed = _guess_unknown_outputs(work, types)
        if not guessed:
            break
        for name, elem in guessed.items():
            work.graph.value_info.append(helper.make_tensor_value_info(name, elem, None))
            types[name] = elem
    return types, static


MAX_TYPE_GUESSES = 8  # rounds of inference past unknown ops (each round types a further layer)


def _inferred_types(model: onnx.ModelProto) -> tuple[dict[str, int], frozenset[str]]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as exc:  # inference is best effort: typing falls back to declared infos
        log.warning("ONNX shape inference failed (%s); using declared types only", exc)
        inferred = model
    types: dict[str, int] = {}
    static: set[str] = set()
    for g in walk_graphs(inferred.graph):  # names are unique model-wide (SSA)
        for v in [*g.input, *g.value_info, *g.output]:
            if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type:
                types[v.name] = v.type.tensor_type.elem_type
                tt = v.type.tensor_type
                if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
                    static.add(v.name)
        for t in g.initializer:
            types[t.name] = t.data_type
        for node in g.node:
            if node.op_type == "Constant" and node.output:
                for a in node.attribute:
                    if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                        types[node.output[0]] = a.t.data_type
                    elif a.name in ("value_float", "value_floats"):
                        types[node.output[0]] = FLOAT
    return types, frozenset(static)


def _guess_unknown_outputs(model: onnx.ModelProto, types: Mapping[str, int]) -> dict[str, int]:
    guessed: dict[str, int] = {}
    opset = {o.domain: o.version for o in model.opset_import}
    for node in walk(model.graph.node):
        if has_schema(node, opset.get(node.domain, opset.get("", 1))):
            continue
        elem = next((types[t] for t in node.input if t in types), None)
        if elem is None:
            continue
        guessed.update({t: elem for t in node.output if t and t not in types})
    return guessed
