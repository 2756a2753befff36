"""What onnx's operator schemas say about FP16: which inputs a node reads in float16, which
float outputs stay FP32, which inputs parametrise the op, which ops only move data."""

from __future__ import annotations

import functools

import onnx

# Nodes that move or retype data but compute nothing in floating point: they keep their
# declared types (the mixed model never retypes a user's Cast) and are never FP16 candidates.
# EyeLike makes ones and zeros of its dtype (exact in every precision; ONNX Runtime has no
# float16 kernel for it).
PASS_THROUGH_OPS = frozenset({"Constant", "ConstantOfShape", "Shape", "Size", "Cast", "CastLike",
                              "EyeLike"})
# Inputs that parametrise an op (positions), never rounded: they are not FP16 data.
PARAMETER_INPUTS: dict[str, tuple[int, ...]] = {
    "Resize": (1, 2), "Upsample": (1,), "Range": (0, 1, 2), "Pad": (2,), "Dropout": (1,),
    "NonMaxSuppression": (3, 4),
}


def fp16_signature(node: onnx.NodeProto, opset: int) -> frozenset[int] | None:
    """Input positions that may hold float16 when the node runs in FP16, or None when no float
    output can be float16 (the node cannot run in FP16 at all). A node with some outputs that
    cannot be float16 still runs in FP16: those stay FP32 (`fp32_outputs`)."""
    return _signature(node.op_type, node.domain, opset, len(node.input))


def fp32_outputs(node: onnx.NodeProto, opset: int) -> frozenset[int]:
    """Output positions that stay float32 when the node runs in FP16: the schema lets them be
    float but not float16 (opset-17 LayerNormalization's Mean and InvStdDev, type U)."""
    return _fp32_outputs(node.op_type, node.domain, opset, len(node.output))


def _schema_types(op_type: str, domain: str, opset: int):
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None, {}
    return schema, {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}


@functools.lru_cache(maxsize=4096)
def _fp32_outputs(op_type: str, domain: str, opset: int, outputs: int) -> frozenset[int]:
    schema, allowed = _schema_types(op_type, domain, opset)
    if schema is None or not schema.outputs:
        return frozenset()
    formal = list(schema.outputs)
    out = set()
    for k in range(outputs):
        types = allowed.get(formal[min(k, len(formal) - 1)].type_str, set())
        if "tensor(float)" in types and "tensor(float16)" not in types:
            out.add(k)
    return frozenset(out)


@functools.lru_cache(maxsize=4096)
def _signature(op_type: str, domain: str, opset: int, inputs: int) -> frozenset[int] | None:
    schema, allowed = _schema_types(op_type, domain, opset)
    if schema is None:
        return None

    def takes_half(type_str: str) -> bool:
        return "tensor(float16)" in allowed.get(type_str, {type_str})

    floats = [p for p in schema.outputs if "tensor(float)" in allowed.get(p.type_str, {p.type_str})]
    if floats and not any(takes_half(p.type_str) for p in floats):
        return None
    if schema.outputs and not any(any(t.startswith("tensor(") for t in allowed.get(
            p.type_str, {p.type_str})) for p in schema.outputs):
        return None  # it makes sequences or optionals (SplitToSequence): they keep their type
    if _float_only_body(schema):
        return None
    positions: set[int] = set()
    formal = list(schema.inputs)
    for k in range(inputs):
        param = formal[min(k, len(formal) - 1)] if formal else None
        if param is not None and takes_half(param.type_str):
            positions.add(k)
    return frozenset(positions)


def _float_only_body(schema) -> bool:
    """An op onnx defines by a function body that fixes float32 constants and casts none to
    the input's type (MeanVarianceNormalization: `Add(STD, Epsilon)` with a float Epsilon):
    ONNX Runtime has no float16 kernel for it and expands the body, which then binds one type
    variable to float16 and float and the file does not load. It stays FP32."""
    if not schema.has_function:
        return False
    body = schema.function_body.node
    fixed = any(n.op_type == "Constant" and any(
        a.type == onnx.AttributeProto.TENSOR and a.t.data_type == onnx.TensorProto.FLOAT
        for a in n.attribute) for n in body)
    return fixed and not any(n.op_type in ("Cast", "CastLike") for n in body)


def type_params(node: onnx.NodeProto, opset: int) -> list[str] | None:
    """Each input position's type parameter (`T`, `T1`, ...) in the op's schema, or None for an
    op onnx does not know. Inputs with one type parameter must hold one type."""
    return _type_params(node.op_type, node.domain, opset, len(node.input))


@functools.lru_cache(maxsize=4096)
def _type_params(op_type: str, domain: str, opset: int, inputs: int) -> list[str] | None:
    schema, _ = _schema_types(op_type, domain, opset)
    if schema is None or not schema.inputs:
        return None
    formal = list(schema.inputs)
    return [formal[min(k, len(formal) - 1)].type_str for k in range(inputs)]


def fp32_by_schema(node: onnx.NodeProto, opset: int) -> bool:
    """Does onnx's schema of this default-domain op let none of its outputs be float16 (Range:
    float, double and integers only)? Then every FP16 ONNX file computes it in FP32: the mixed
    model keeps it so, TensorRT 11 builds what the file declares, and the judge computes it in
    FP32 too. (A node of float data only; the caller checks that.)"""
    if node.domain not in ("", "ai.onnx"):
        return False
    schema, allowed = _schema_types(node.op_type, node.domain, opset)
    return schema is not None and not any(
        "tensor(float16)" in allowed.get(p.type_str, {p.type_str}) for p in schema.outputs)


def has_schema(node: onnx.NodeProto, opset: int) -> bool:
    """Does onnx know this op (its domain at this opset)?"""
    return _has_schema(node.op_type, node.domain, opset)


@functools.lru_cache(maxsize=4096)
def _has_schema(op_type: str, domain: str, opset: int) -> bool:
    try:
        onnx.defs.get_schema(op_type, opset, domain)
        return True
    except onnx.defs.SchemaError:
        return False
