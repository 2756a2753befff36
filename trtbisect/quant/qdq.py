"""Q/DQ analysis: which layers of an explicitly quantized ONNX are quantized, as TensorRT
fuses them, and the same model with chosen layers un-quantized.

A quantized *edge* is one input of one node that reads a DequantizeLinear's output: an
activation quantized by a QuantizeLinear -> DequantizeLinear pair, or a weight (a quantized
initializer behind a DequantizeLinear, or a float initializer behind a Q -> DQ pair). A
quantized *layer* is the compute node TensorRT fuses those DQs into (docs/quantization.md,
rules R1-R4, each citing TensorRT's "Explicit Quantization" section):

* R1 (DQ propagation): a DQ output that passes through ops that commute with quantization
  (Reshape, Transpose, MaxPool, ...) is moved past them, so the layer is the first
  non-commuting op after them;
* R2 (weighted-op fusion): DQ'd activations and DQ'd weights feeding Conv/ConvTranspose/
  MatMul/Gemm fuse into one quantized layer (its input edges together);
* R3 (quantizable ops): an Add, a pooling, or any other node with DQ'd inputs is its own
  quantized layer (an Add with both inputs DQ'd fuses its two DQs);
* R4 (weights): a quantized weight is dequantized at build time (its DQ is folded into the
  layer); a float weight behind Q -> DQ is quantized at build time by TensorRT.

Un-quantizing a layer removes the Q/DQ on its edges only: the node reads the float tensor the
Q read (or the weight, dequantized once, for a stored quantized weight); another layer reading
the same Q/DQ pair keeps it. The model with every layer un-quantized is the reference.

Only the main graph is analysed: Q/DQ inside If/Loop/Scan bodies are left as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import TrtBisectError

Q, DQ = "QuantizeLinear", "DequantizeLinear"
# R1: ops TensorRT moves a DQ past (they commute with per-tensor quantization)
COMMUTING = frozenset({"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity",
                       "MaxPool", "Slice", "Gather", "Expand", "Concat"})
WEIGHTED = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})  # R2
FORMATS: dict[int, str] = {TensorProto.INT8: "int8", TensorProto.UINT8: "uint8",
           TensorProto.FLOAT8E4M3FN: "fp8e4m3fn", TensorProto.FLOAT8E5M2: "fp8e5m2",
           TensorProto.INT4: "int4", TensorProto.UINT4: "uint4"}
FP8_MAX = {"fp8e4m3fn": 448.0, "fp8e5m2": 57344.0}
INT_RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int4": (-8, 7), "uint4": (0, 15)}


@dataclass(frozen=True)
class Edge:
    """One quantized input of a node."""

    consumer: str  # the node whose input is re-pointed when the edge is un-quantized
    slot: int  # which input of `consumer`
    dq: str  # the DequantizeLinear node
    q: str | None  # the QuantizeLinear before it (None: a stored quantized weight)
    source: str  # the float tensor Q reads, or the quantized initializer DQ reads
    weight: bool  # the quantized value is a constant
    format: str  # int8 | uint8 | fp8e4m3fn | fp8e5m2 | int4 | uint4
    scale: str  # the scale tensor's name
    per_channel: bool  # more than one scale
    axis: int  # DQ's axis attribute (per-channel axis)
    # the Q's range starts at 0 (zero point at the format's minimum): it clamps negatives as a
    # ReLU would, and ONNX Runtime's quantizer drops a Relu before such a Q; un-quantized, the
    # edge keeps that clamp (a Relu), so the reference computes what the model did
    clamps_at_zero: bool = False

    def to_json(self) -> dict:
        return {"consumer": self.consumer, "input": self.slot, "dq": self.dq, "q": self.q,
                "source": self.source, "weight": self.weight, "format": self.format,
                "per_channel": self.per_channel, "axis": self.axis}


@dataclass(frozen=True)
class Layer:
    """A quantized layer as TensorRT fuses it: the compute node and its quantized edges."""

    name: str
    op: str
    edges: tuple[Edge, ...]
    rule: str  # R2 | R3 (docs/quantization.md)

    @property
    def formats(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(e.format for e in self.edges))

    def to_json(self) -> dict:
        return {"name": self.name, "op": self.op, "rule": self.rule,
                "formats": list(self.formats), "edges": [e.to_json() for e in self.edges]}


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    for a in node.attribute:
        if a.name == name:
            return int(a.i)
    return default


def _initializers(model: onnx.ModelProto) -> dict[str, TensorProto]:
    found = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:  # Constant nodes hold weights as well
        if n.op_type == "Constant" and n.output:
            for a in n.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    found[n.output[0]] = a.t
    return found


def _shape_size(t: TensorProto) -> int:
    return int(np.prod(t.dims)) if len(t.dims) else 1


def is_quantized(model: onnx.ModelProto) -> bool:
    """True when the main graph holds a DequantizeLinear of the default domain: a model
    TensorRT builds with explicit quantization."""
    return any(n.op_type == DQ and n.domain in ("", "ai.onnx") for n in model.graph.node)


def _names(model: onnx.ModelProto) -> list[str]:
    return [n.name or f"{n.op_type}_{i}" for i, n in enumerate(model.graph.node)]


def analyse(model: onnx.ModelProto) -> list[Layer]:
    """The quantized layers, in graph order."""
    nodes = list(model.graph.node)
    names = _names(model)
    producer = {t: i for i, n in enumerate(nodes) for t in n.output if t}
    consumers: dict[str, list[tuple[int, int]]] = {}
    for i, n in enumerate(nodes):
        for k, t in enumerate(n.input):
            if t:
                consumers.setdefault(t, []).append((i, k))
    inits = _initializers(model)
    outputs = {o.name for o in model.graph.output}
    edges: dict[int, list[Edge]] = {}
    for d, node in enumerate(nodes):
        if node.op_type != DQ or node.domain not in ("", "ai.onnx"):
            continue
        x = node.input[0]
        p = producer.get(x)
        q_node = nodes[p] if p is not None and nodes[p].op_type == Q else None
        if q_node is not None:
            source = q_node.input[0]
            weight = source in inits
            fmt_t = _q_format(q_node, inits)
        elif x in inits:
            source, weight, fmt_t = x, True, inits[x].data_type
        else:
            continue  # a DQ of a quantized graph input: nothing float to go back to
        fmt = FORMATS.get(fmt_t, f"type {fmt_t}")
        scale = node.input[1]
        per_channel = scale in inits and _shape_size(inits[scale]) > 1
        for c, slot in consumers.get(node.output[0], []):
            owner = _owner(nodes, consumers, c)
            if owner is None:
                continue
            edges.setdefault(owner, []).append(Edge(
                names[c], slot, names[d], names[p] if q_node is not None and p is not None
                else None, source,
                weight, fmt, scale, per_channel, _attr(node, "axis", 1),
                q_node is not None and not weight and _clamps_at_zero(q_node, inits, fmt)
                and _op(nodes, producer, source) != "Relu"))
        if node.output[0] in outputs and q_node is not None:
            # a quantized graph output: its Q fuses into the layer writing it (R2, output
            # quantized), its DQ gives the graph its float output; un-quantized, the DQ node
            # becomes an Identity of the Q's input (the output keeps its name)
            owner = producer.get(source)
            if owner is not None and p is not None and nodes[owner].op_type not in (Q, DQ):
                edges.setdefault(owner, []).append(Edge(
                    names[d], -1, names[d], names[p], source, False, fmt, scale, per_channel,
                    _attr(node, "axis", 1), _clamps_at_zero(q_node, inits, fmt)
                    and nodes[owner].op_type != "Relu"))
    return [Layer(names[i], nodes[i].op_type, tuple(edges[i]),
                  "R2" if nodes[i].op_type in WEIGHTED else "R3")
            for i in sorted(edges)]


def _op(nodes: Sequence[onnx.NodeProto], producer: Mapping[str, int], t: str) -> str | None:
    return nodes[producer[t]].op_type if t in producer else None


def _clamps_at_zero(q_node: onnx.NodeProto, inits: Mapping[str, TensorProto], fmt: str
                    ) -> bool:
    """A per-tensor integer Q whose zero point is the format's minimum covers [0, max]."""
    if fmt not in INT_RANGE:
        return False
    if len(q_node.input) > 2 and q_node.input[2]:
        zp = inits.get(q_node.input[2])
        if zp is None:
            return False
        values = np.asarray(numpy_helper.to_array(zp)).reshape(-1)
        return values.size == 1 and int(values[0]) == INT_RANGE[fmt][0]
    return INT_RANGE[fmt][0] == 0  # no zero point: 0, the minimum of uint8


def _q_format(q_node: onnx.NodeProto, inits: Mapping[str, TensorProto]) -> int:
    """The quantized type a Q writes: its zero point's type, else its output_dtype
    attribute, else uint8 (the ONNX default)."""
    if len(q_node.input) > 2 and q_node.input[2] in inits:
        return inits[q_node.input[2]].data_type
    return _attr(q_node, "output_dtype", 0) or TensorProto.UINT8


def _owner(nodes: Sequence[onnx.NodeProto], consumers: Mapping[str, list[tuple[int, int]]],
           c: int) -> int | None:
    """The layer a DQ output read by node `c` belongs to (R1): past a chain of commuting
    ops, each read by one node only, the first node that computes; None for a Q (a requantize
    chain, not a layer)."""
    seen = 0
    while nodes[c].op_type in COMMUTING and seen < len(nodes):
        outs = consumers.get(nodes[c].output[0], []) if nodes[c].output else []
        if len(outs) != 1 or nodes[outs[0][0]].op_type in (Q, DQ):
            break
        c, seen = outs[0][0], seen + 1
    return None if nodes[c].op_type in (Q, DQ) else c


def dequantized_weights(model: onnx.ModelProto, edges: Iterable[Edge]) -> dict[str, np.ndarray]:
    """The float values of stored quantized weights (DQ of an initializer), by DQ node name,
    computed by ONNX Runtime's own DequantizeLinear (so int4, blocked and FP8 weights mean what
    ORT makes of them)."""
    from ..backends.ort import make_session

    wanted = {e.dq for e in edges if e.weight and e.q is None}
    if not wanted:
        return {}
    names = _names(model)
    inits = _initializers(model)
    dqs = [n for n, name in zip(model.graph.node, names) if name in wanted]
    needed = {t for n in dqs for t in n.input if t}
    g = helper.make_graph(
        [helper.make_node(DQ, list(n.input), [f"w{k}"], domain=n.domain,
                          **{a.name: helper.get_attribute_value(a) for a in n.attribute})
         for k, n in enumerate(dqs)], "weights", [],
        [helper.make_tensor_value_info(f"w{k}", TensorProto.FLOAT, None)
         for k in range(len(dqs))],
        [_named(inits[t], t) for t in needed if t in inits])
    m = helper.make_model(g, opset_imports=list(model.opset_import))
    m.ir_version = model.ir_version
    session = make_session(m)
    values = session.run(None, {})
    return {name: np.asarray(v)  # the DQ's own output type (float16 in a float16 file)
            for name, v in zip([nm for nm in names if nm in wanted], values)}


def _named(t: TensorProto, name: str) -> TensorProto:
    out = TensorProto()
    out.CopyFrom(t)
    out.name = name
    return out


def unquantize(model: onnx.ModelProto, layers: Sequence[Layer],
               weights: Mapping[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """A copy of `model` with `layers` un-quantized: each of their edges reads the float
    tensor again; Q/DQ nodes and initializers nobody reads any more are dropped. `weights`:
    the dequantized stored weights (dequantized_weights), computed when not given."""
    edges = [e for layer in layers for e in layer.edges]
    if weights is None:
        weights = dequantized_weights(model, edges)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    names = _names(out)
    by_name = {name: n for name, n in zip(names, out.graph.node)}
    made: set[str] = set()
    taken = {t for n in out.graph.node for t in [*n.input, *n.output]}
    taken |= {t.name for t in out.graph.initializer}
    relus: dict[str, str] = {}

    def source(e: Edge) -> str:
        """The float tensor the edge reads un-quantized (through the Q's ReLU clamp, kept)."""
        if not e.clamps_at_zero:
            return e.source
        if e.source not in relus:
            name = f"{e.source}_relu"
            while name in taken:
                name += "_"
            taken.add(name)
            relus[e.source] = name
            q = by_name[e.q]  # type: ignore[index]
            at = list(out.graph.node).index(q)
            out.graph.node.insert(at, helper.make_node("Relu", [e.source], [name],
                                                       f"{e.q}/relu"))
        return relus[e.source]

    for e in edges:
        node = by_name[e.consumer]
        if e.slot < 0:  # a quantized graph output: its DQ becomes an Identity
            node.op_type, node.domain = "Identity", ""
            node.input[:] = [source(e)]
            del node.attribute[:]
            continue
        if e.q is not None:
            node.input[e.slot] = source(e)
            continue
        name = f"{e.source}_dequantized"
        while name in taken and name not in made:
            name += "_"
        if name not in made:
            out.graph.initializer.append(numpy_helper.from_array(weights[e.dq], name))
            made.add(name)
            taken.add(name)
        node.input[e.slot] = name
    _drop_dead(out)
    return out


def _drop_dead(model: onnx.ModelProto) -> None:
    """Remove Q/DQ nodes whose outputs nobody reads, then initializers nobody reads."""
    g = model.graph
    outputs = {o.name for o in g.output}
    while True:
        read = {t for n in g.node for t in n.input} | outputs
        read |= {t for n in g.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH
                 for t in outer_reads(a.g)}
        dead = [n for n in g.node if n.op_type in (Q, DQ) and not any(o in read for o in n.output)]
        if not dead:
            break
        for n in dead:
            g.node.remove(n)
    read = {t for n in g.node for t in n.input} | outputs
    read |= {t for n in g.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH
             for t in outer_reads(a.g)}
    for t in [t for t in g.initializer if t.name not in read]:
        g.initializer.remove(t)


def namer(taken: set[str]):
    """A function giving `base`, or `base` with underscores, never a name in `taken` (which
    it extends)."""
    def fresh(base: str) -> str:
        name = base
        while name in taken:
            name += "_"
        taken.add(name)
        return name
    return fresh


def outer_reads(body: onnx.GraphProto) -> set[str]:
    """Every value a body's nodes (and their bodies') read: outer-scope names among them."""
    out = {t for n in body.node for t in n.input}
    for n in body.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                out |= outer_reads(a.g)
    return out


def reference(model: onnx.ModelProto, layers: Sequence[Layer]) -> onnx.ModelProto:
    """The model with every quantized layer un-quantized: what the quantized one is judged
    against when no --reference is given. Refused when a Q/DQ pair stays (one feeding a graph
    output directly): the reference would still be quantized."""
    out = unquantize(model, layers)
    if any(n.op_type == DQ for n in out.graph.node):
        left = next(n.name or n.output[0] for n in out.graph.node if n.op_type == DQ)
        raise TrtBisectError(f"DequantizeLinear {left!r} feeds no layer trtbisect can "
                             "un-quantize (a graph output, or a quantized graph input): give "
                             "the FP32 model with --reference")
    return out
