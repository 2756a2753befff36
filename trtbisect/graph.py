"""ONNX facade: loading with clear errors, node names, float tensors, producers and consumers.

The input model is never mutated; everything that rewrites a graph works on a copy.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper, numpy_helper

from .errors import TrtBisectError

log = logging.getLogger(__name__)

FLOAT = TensorProto.FLOAT
# Nodes that move or retype data but compute nothing in floating point: they keep their
# declared types (the mixed model never retypes a user's Cast) and are never FP16 candidates.
PASS_THROUGH_OPS = frozenset({"Constant", "ConstantOfShape", "Shape", "Size", "Cast", "CastLike"})
PROTOBUF_LIMIT = 2**31 - 1


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Load and validate an ONNX file, weights left where they are.

    External data stays on disk (the returned proto points at it; `Graph.from_path` maps it), so
    a model of any size, beyond protobuf's 2 GiB too, loads in the memory of its graph alone.
    Every failure is a one-line TrtBisectError.
    """
    p = Path(path)
    if not p.is_file():
        raise TrtBisectError(f"model file not found: {p}")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except (DecodeError, RuntimeWarning, ValueError, UnicodeDecodeError) as exc:
        raise TrtBisectError(f"{p} is not a readable ONNX model (truncated or corrupt?): "
                             f"{_first_line(exc)}")
    except OSError as exc:
        raise TrtBisectError(f"cannot read {p}: {exc.strerror or exc}")
    if not model.graph.node and not model.graph.output:
        raise TrtBisectError(f"{p} is not a readable ONNX model (empty graph: truncated?)")
    for t in model.graph.initializer:
        if t.data_location == TensorProto.EXTERNAL:
            _check_external(p, t)
    try:
        # by path: the checker reads the file itself and never needs the weights in one proto
        onnx.checker.check_model(str(p))
    except (onnx.checker.ValidationError, ValueError, OSError) as exc:
        raise TrtBisectError(f"{p} is not a valid ONNX model: {_first_line(exc)}") from exc
    return model


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _check_external(model_path: Path, t: TensorProto) -> None:
    info = {e.key: e.value for e in t.external_data}
    where = info.get("location", "")
    data = model_path.parent / where
    need = int(info.get("offset", 0) or 0) + int(info.get("length", 0) or 0)
    if not where or Path(where).is_absolute() or ".." in Path(where).parts:
        raise TrtBisectError(f"{model_path}: initializer {t.name!r} has an unsafe external-data "
                             f"location {where!r}; keep the data files beside the model")
    if not data.is_file() or data.stat().st_size < need:
        raise TrtBisectError(f"{model_path} keeps weights in external data that could not be read "
                             f"({where!r} for {t.name!r} is missing or too short); keep the data "
                             "files beside the model")


def model_hash(path: str | os.PathLike) -> str:
    """sha256 of the model file and of its external data files, read in chunks."""
    p = Path(path)
    h = hashlib.sha256()
    files = [p]
    try:
        model = onnx.load(str(p), load_external_data=False)
        files += sorted({p.parent / e.value for t in model.graph.initializer
                         for e in t.external_data if e.key == "location"})
    except Exception:  # the file was validated by load_model; hash what is there
        pass
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 24), b""):
                h.update(chunk)
    return h.hexdigest()


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


HALF_TYPES = {TensorProto.FLOAT16: np.float16, TensorProto.BFLOAT16: None}
STORE_LOCATION = "trtbisect:store"  # marks an initializer whose data a Weights store holds
SMALL_BYTES = 1024  # initializers up to this size stay inside session protos


class Weights:
    """Initializer arrays by name: read once, shared by every session, never copied into a proto.

    External data is memory-mapped from its file; embedded data is taken out of the proto when
    the graph owns it (`Graph.from_path`), so the weights are held once.
    """

    def __init__(self, model: onnx.ModelProto, base_dir: Path | None, own: bool,
                 parent: "Weights | None" = None) -> None:
        self.base_dir = base_dir
        self.parent = parent  # holds what this model's store-marked initializers name
        self._protos = {t.name: t for t in model.graph.initializer}
        self._raw: dict[str, np.ndarray] = {}
        self._float: dict[str, np.ndarray] = {}
        if own:
            for t in model.graph.initializer:
                if t.data_location != TensorProto.EXTERNAL and _payload_bytes(t) > SMALL_BYTES:
                    from .spill import spill
                    self._raw[t.name] = spill(numpy_helper.to_array(t))  # on disk, not twice
                    _mark_stored(t)

    def __contains__(self, name: str) -> bool:
        return name in self._protos

    def raw(self, name: str) -> np.ndarray:
        """The initializer's values in its own dtype (memory-mapped when external)."""
        if name not in self._raw:
            t = self._protos[name]
            if self.parent is not None and _is_stored(t) and name in self.parent:
                return self.parent.raw(name)  # held once, by the graph this one derives from
            self._raw[name] = self._map(t) if t.data_location == TensorProto.EXTERNAL \
                else numpy_helper.to_array(t)
        return self._raw[name]

    def array(self, name: str) -> np.ndarray:
        """The initializer's values; float16/bfloat16 come back as (exact) float32."""
        if self.parent is not None and name not in self._raw and _is_stored(self._protos[name]) \
                and name in self.parent:
            return self.parent.array(name)
        arr = self.raw(name)
        if arr.dtype == np.float16 or arr.dtype.name == "bfloat16":
            if name not in self._float:
                from .spill import release_pages, spill
                self._float[name] = spill(arr.astype(np.float32))
                release_pages([arr])
            return self._float[name]
        return arr

    def _map(self, t: TensorProto) -> np.ndarray:
        info = {e.key: e.value for e in t.external_data}
        if info.get("location") == STORE_LOCATION or self.base_dir is None:
            raise TrtBisectError(f"the data of initializer {t.name!r} is not available")
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
        shape = tuple(t.dims)
        count = int(np.prod(shape, dtype=np.int64))
        if count == 0:
            return np.zeros(shape, dtype)
        return np.memmap(self.base_dir / info["location"], dtype=dtype.newbyteorder("<"),
                         mode="c", offset=int(info.get("offset", 0) or 0), shape=shape)

    def nbytes(self, name: str) -> int:
        t = self._protos[name]
        count = int(np.prod(tuple(t.dims), dtype=np.int64))
        return count * np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize

    def total_bytes(self) -> int:
        return sum(self.nbytes(n) for n in self._protos)


def _payload_bytes(t: TensorProto) -> int:
    return len(t.raw_data) if t.raw_data else 4 * int(np.prod(tuple(t.dims), dtype=np.int64))


def _is_stored(t: TensorProto) -> bool:
    return t.data_location == TensorProto.EXTERNAL and any(
        e.key == "location" and e.value == STORE_LOCATION for e in t.external_data)


def _mark_stored(t: TensorProto) -> None:
    """Drop a tensor's data from the proto; the store holds it."""
    for f in ("raw_data", "float_data", "int32_data", "int64_data", "double_data",
              "uint64_data", "string_data"):
        t.ClearField(f)
    del t.external_data[:]
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value=STORE_LOCATION)


def structure(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the model without weight data (for shape inference and session protos)."""
    out = onnx.ModelProto()
    g = model.graph
    for f in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        setattr(out, f, getattr(model, f))
    out.doc_string = model.doc_string
    out.opset_import.extend(model.opset_import)
    out.metadata_props.extend(model.metadata_props)
    out.functions.extend(model.functions)
    og = out.graph
    og.name = g.name
    og.node.extend(g.node)
    og.input.extend(g.input)
    og.output.extend(g.output)
    og.value_info.extend(g.value_info)
    for t in g.initializer:
        if t.data_location == TensorProto.EXTERNAL or _payload_bytes(t) > SMALL_BYTES:
            light = og.initializer.add()
            light.name, light.data_type = t.name, t.data_type
            light.dims.extend(t.dims)
            _mark_stored(light)
        else:
            og.initializer.append(t)
    return out


@dataclass
class Graph:
    """Read-only view of a model: names, float typing, data flow and its weights.

    A model with float16/bfloat16 tensors is viewed in FP32 (its upcast): `half_typed` remembers
    which tensors were half, so the emulator can round them where the model itself rounds, and
    `declared` keeps the graph inputs' and outputs' own types for the files trtbisect writes.
    """

    model: onnx.ModelProto
    base_dir: Path | None = None
    own: bool = False
    parent: Weights | None = field(default=None, repr=False)  # store-marked names resolve here
    names: list[str] = field(init=False)
    types: dict[str, int] = field(init=False)
    producer: dict[str, int] = field(init=False)
    consumers: dict[str, list[int]] = field(init=False)
    initializers: dict[str, TensorProto] = field(init=False)
    weights: Weights = field(init=False)
    half_typed: dict[str, int] = field(init=False)
    declared: dict[str, int] = field(init=False)
    source: onnx.ModelProto = field(init=False, repr=False)

    @classmethod
    def from_path(cls, path: str | os.PathLike) -> "Graph":
        """Load a model file; its weights stay on disk or are held once, in the store."""
        p = Path(path)
        return cls(load_model(p), base_dir=p.parent, own=True)

    def __post_init__(self) -> None:
        check_names(self.model)
        self.weights = Weights(self.model, self.base_dir, self.own, self.parent)
        self.source = self.model  # as given (half types kept); `model` is its FP32 view
        self.declared = {v.name: v.type.tensor_type.elem_type
                         for v in [*self.model.graph.input, *self.model.graph.output]
                         if v.type.HasField("tensor_type")}
        original = infer_types(self.model)
        self.half_typed = {t: ty for t, ty in original.items() if ty in HALF_TYPES}
        if self.half_typed:
            self.model = upcast(self.model)
        self.types = {t: (FLOAT if ty in HALF_TYPES else ty) for t, ty in original.items()}
        self.names = node_names(self.model)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.initializers = {t.name: t for t in self.model.graph.initializer}
        self.producer, self.consumers = data_flow(self.model.graph.node)

    def array(self, name: str) -> np.ndarray:
        """An initializer's values (float16 ones as exact float32)."""
        return self.weights.array(name)

    def node(self, name: str) -> onnx.NodeProto:
        return self.model.graph.node[self.index[name]]

    def is_float(self, tensor: str) -> bool:
        return bool(tensor) and self.types.get(tensor) == FLOAT

    def inputs(self) -> list[onnx.ValueInfoProto]:
        """Graph inputs that must be fed (old IR versions also list initializers as inputs)."""
        return [v for v in self.model.graph.input if v.name not in self.initializers]

    def fed_inputs(self) -> list[onnx.ValueInfoProto]:
        """The inputs to feed, with the types the model declares (float16 stays float16)."""
        return [v for v in self.source.graph.input if v.name not in self.initializers]

    def output_names(self) -> list[str]:
        return [v.name for v in self.model.graph.output]

    def all_names(self) -> set[str]:
        """Every tensor and node name in the graph (internal names must avoid all of them)."""
        g = self.model.graph
        names = {t for n in g.node for t in [*n.input, *n.output]}
        names.update(v.name for v in [*g.input, *g.output, *g.value_info, *g.initializer])
        return names | set(self.names)

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
        """Float data inputs that the node reads in FP16 when it runs in FP16.

        Schema permitting, and never an input that parametrises the op rather than carrying data
        (Resize's roi and scales, Range's bounds, ...): TensorRT reads those as shape parameters,
        and rounding them would change the op, not its precision.
        """
        node = self.node(name)
        allowed = fp16_signature(node, self.opset)
        if allowed is None:
            return []
        params = PARAMETER_INPUTS.get(node.op_type, ())
        return [t for k, t in enumerate(node.input)
                if self.is_float(t) and k in allowed and k not in params
                and t not in node.input[:k]]

    @functools.cached_property
    def _candidates(self) -> list[str]:
        return [n for i, n in enumerate(self.names) if self.is_candidate(i)]

    def candidates(self) -> list[str]:
        return list(self._candidates)

    @functools.cached_property
    def candidate_set(self) -> frozenset[str]:
        """`candidates()` for membership tests (a list's are linear: quadratic over a graph)."""
        return frozenset(self._candidates)

    def float_outputs(self, name: str) -> list[str]:
        return [t for t in self.node(name).output if self.is_float(t)]

    def fp32_outputs(self, name: str) -> list[str]:
        """Float outputs that stay FP32 when the node runs in FP16 (graph.fp32_outputs)."""
        node = self.node(name)
        keep = fp32_outputs(node, self.opset)
        return [t for k, t in enumerate(node.output) if k in keep and self.is_float(t)]

    def float_inputs(self, name: str) -> list[str]:
        return [t for t in dict.fromkeys(self.node(name).input) if self.is_float(t)]

    def stored_tensors(self) -> list[str]:
        """Float tensors written by candidate nodes, in topological order."""
        return [t for n in self._candidates for t in self.float_outputs(n)]

    def materialize(self) -> onnx.ModelProto:
        """The whole model with its weights in one proto (small models only: TensorRT, tests)."""
        out = onnx.ModelProto()
        out.CopyFrom(self.model)
        for t in out.graph.initializer:
            if t.data_location == TensorProto.EXTERNAL:
                t.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(self.array(t.name)),
                                                   t.name))
        return out


def data_flow(nodes) -> tuple[dict[str, int], dict[str, list[int]]]:
    """tensor -> index of the node that writes it, and -> indices of the nodes that read it."""
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = defaultdict(list)
    for i, node in enumerate(nodes):
        for t in node.output:
            if t:
                producer[t] = i
        for t in dict.fromkeys(node.input):
            if t:
                consumers[t].append(i)
    return producer, consumers


# Inputs that parametrise an op (positions), never rounded: they are not FP16 data.
PARAMETER_INPUTS: dict[str, tuple[int, ...]] = {
    "Resize": (1, 2), "Upsample": (1,), "Range": (0, 1, 2), "Pad": (2,), "Dropout": (1,),
    "NonMaxSuppression": (3, 4),
}


def upcast(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model's structure with every float16/bfloat16 type made float32 (weights untouched:
    the store upcasts arrays when they are read)."""
    out = structure(model)
    g = out.graph
    for v in [*g.input, *g.output, *g.value_info]:
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type in HALF_TYPES:
            v.type.tensor_type.elem_type = FLOAT
    for t in g.initializer:
        if t.data_type in HALF_TYPES:
            if t.data_location == TensorProto.EXTERNAL:
                t.data_type = FLOAT  # the store hands out float32 for it
            else:
                t.CopyFrom(numpy_helper.from_array(
                    numpy_helper.to_array(t).astype(np.float32), t.name))
    for node in g.node:
        for a in node.attribute:
            if a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT and a.i in HALF_TYPES:
                a.i = FLOAT
            elif a.type == onnx.AttributeProto.TENSOR and a.t.data_type in HALF_TYPES:
                a.t.CopyFrom(numpy_helper.from_array(
                    numpy_helper.to_array(a.t).astype(np.float32), a.t.name))
    return out


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
    positions: set[int] = set()
    formal = list(schema.inputs)
    for k in range(inputs):
        param = formal[min(k, len(formal) - 1)] if formal else None
        if param is not None and takes_half(param.type_str):
            positions.add(k)
    return frozenset(positions)


def infer_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor name we can type (inputs, initializers, node outputs)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(structure(model), data_prop=True)
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
