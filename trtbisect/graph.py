"""ONNX facade: loading with clear errors, node names, float tensors, producers and consumers.

The input model is never mutated; everything that rewrites a graph works on a copy.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto

from .errors import TrtBisectError

log = logging.getLogger(__name__)

FLOAT = TensorProto.FLOAT
# Nodes that move or retype data but compute nothing in floating point: they keep their
# declared types (the mixed model never retypes a user's Cast) and are never FP16 candidates.
PASS_THROUGH_OPS = frozenset({"Constant", "ConstantOfShape", "Shape", "Size", "Cast", "CastLike"})
PROTOBUF_LIMIT = 2**31 - 1


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Load and validate an ONNX file; every failure is a one-line TrtBisectError."""
    p = Path(path)
    if not p.is_file():
        raise TrtBisectError(f"model file not found: {p}")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except (DecodeError, RuntimeWarning, ValueError) as exc:
        raise TrtBisectError(f"{p} is not a readable ONNX model (truncated or corrupt?): {exc}")
    if not model.graph.node and not model.graph.output:
        raise TrtBisectError(f"{p} is not a readable ONNX model (empty graph: truncated?)")
    if _uses_external_data(model):
        try:
            onnx.load_external_data_for_model(model, str(p.parent))
        except (OSError, ValueError, onnx.checker.ValidationError) as exc:
            raise TrtBisectError(
                f"{p} keeps weights in external data that could not be read ({exc}); "
                "keep the data files beside the model") from exc
        if model.ByteSize() > PROTOBUF_LIMIT:
            raise TrtBisectError(f"{p} is larger than 2 GiB with its external data; "
                                 "models this large are not supported yet")
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0]
        raise TrtBisectError(f"{p} is not a valid ONNX model: {first}") from exc
    return model


def _uses_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)


def model_hash(model: onnx.ModelProto) -> str:
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()


def check_names(model: onnx.ModelProto) -> None:
    """Names that are not valid UTF-8 (protobuf hands them over as bytes) cannot be rendered
    into a plan, a command line or a mixed model: refuse them up front."""
    g = model.graph
    values = [*g.input, *g.output, *g.value_info, *g.initializer]
    names = [v.name for v in values] + [g.name]
    for node in g.node:
        names += [node.name, node.op_type, node.domain, *node.input, *node.output]
    bad = next((n for n in names if not isinstance(n, str)), None)
    if bad is not None:
        raise TrtBisectError(f"the model holds a name that is not valid UTF-8 ({bad!r}); "
                             "rename it (ONNX requires UTF-8 strings)")


def node_names(model: onnx.ModelProto) -> list[str]:
    """The name trtbisect uses for each node of graph.node, in order.

    A node's own name, or `<op_type>_<i>` (i: its position) when it has none; a name used twice
    gets `_<i>` appended to its later uses so that every plan entry names exactly one node.
    """
    names: list[str] = []
    seen: set[str] = set()
    for i, node in enumerate(model.graph.node):
        name = node.name or f"{node.op_type}_{i}"
        if name in seen:
            name = f"{name}_{i}"
        seen.add(name)
        names.append(name)
    return names


def with_node_names(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose nodes carry the names trtbisect uses (so TensorRT layers get them too)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for node, name in zip(out.graph.node, node_names(model)):
        node.name = name
    return out


@dataclass
class Graph:
    """Read-only view of a model: names, float typing and data flow."""

    model: onnx.ModelProto
    names: list[str] = field(init=False)
    types: dict[str, int] = field(init=False)
    producer: dict[str, int] = field(init=False)
    consumers: dict[str, list[int]] = field(init=False)
    initializers: dict[str, TensorProto] = field(init=False)

    def __post_init__(self) -> None:
        check_names(self.model)
        self.names = node_names(self.model)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.initializers = {t.name: t for t in self.model.graph.initializer}
        self.types = infer_types(self.model)
        self.producer = {}
        self.consumers = defaultdict(list)
        for i, node in enumerate(self.model.graph.node):
            for t in node.output:
                if t:
                    self.producer[t] = i
            for t in dict.fromkeys(node.input):
                if t:
                    self.consumers[t].append(i)

    def node(self, name: str) -> onnx.NodeProto:
        return self.model.graph.node[self.index[name]]

    def is_float(self, tensor: str) -> bool:
        return bool(tensor) and self.types.get(tensor) == FLOAT

    def inputs(self) -> list[onnx.ValueInfoProto]:
        """Graph inputs that must be fed (old IR versions also list initializers as inputs)."""
        return [v for v in self.model.graph.input if v.name not in self.initializers]

    def output_names(self) -> list[str]:
        return [v.name for v in self.model.graph.output]

    @property
    def opset(self) -> int:
        return next((o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx")), 1)

    def is_candidate(self, i: int) -> bool:
        """Can this node be switched between FP16 and FP32?

        Not when it only moves or retypes data, holds a subgraph (If/Loop/Scan stay FP32: their
        bodies are not rewritten), or its schema does not accept float16.
        """
        node = self.model.graph.node[i]
        if node.op_type in PASS_THROUGH_OPS or node.domain not in ("", "ai.onnx"):
            return False
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for a in node.attribute):
            return False
        if not any(self.is_float(t) for t in [*node.input, *node.output]):
            return False
        return fp16_signature(node, self.opset) is not None

    def fp16_inputs(self, name: str) -> list[str]:
        """Float inputs that the node reads in FP16 when it runs in FP16 (schema permitting)."""
        node = self.node(name)
        allowed = fp16_signature(node, self.opset)
        if allowed is None:
            return []
        return [t for k, t in enumerate(node.input)
                if self.is_float(t) and k in allowed and t not in node.input[:k]]

    def candidates(self) -> list[str]:
        return [n for i, n in enumerate(self.names) if self.is_candidate(i)]

    def float_outputs(self, name: str) -> list[str]:
        return [t for t in self.node(name).output if self.is_float(t)]

    def float_inputs(self, name: str) -> list[str]:
        return [t for t in dict.fromkeys(self.node(name).input) if self.is_float(t)]

    def stored_tensors(self) -> list[str]:
        """Float tensors written by candidate nodes, in topological order."""
        return [t for n in self.candidates() for t in self.float_outputs(n)]


def fp16_signature(node: onnx.NodeProto, opset: int) -> set[int] | None:
    """Input positions that may hold float16 when the node runs in FP16, or None when a float
    output cannot be float16 (the node cannot run in FP16 at all)."""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    except onnx.defs.SchemaError:
        return None
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}

    def takes_half(type_str: str) -> bool:
        return "tensor(float16)" in allowed.get(type_str, {type_str})

    for param in schema.outputs:
        if ("tensor(float)" in allowed.get(param.type_str, {param.type_str})
                and not takes_half(param.type_str)):
            return None
    positions: set[int] = set()
    formal = list(schema.inputs)
    for k in range(len(node.input)):
        param = formal[min(k, len(formal) - 1)] if formal else None
        if param is not None and takes_half(param.type_str):
            positions.add(k)
    return positions


def infer_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor name we can type (inputs, initializers, node outputs)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as exc:  # inference is best effort: typing falls back to declared infos
        log.warning("ONNX shape inference failed (%s); using declared types only", exc)
        inferred = model
    types: dict[str, int] = {}
    g = inferred.graph
    for v in [*g.input, *g.value_info, *g.output]:
        if v.type.HasField("tensor_type"):
            types[v.name] = v.type.tensor_type.elem_type
    for t in g.initializer:
        types[t.name] = t.data_type
    for node in g.node:
        if node.op_type == "Constant" and node.output:
            for a in node.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    types[node.output[0]] = a.t.data_type
                elif a.name in ("value_float", "value_floats"):
                    types[node.output[0]] = FLOAT
    return types
