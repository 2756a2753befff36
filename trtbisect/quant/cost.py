"""Estimated engine time of a quantized plan, priced like cost.py prices an FP16 one: a
roofline `max(FLOPs / peak, bytes / bandwidth)` per node on the run's GPU class.

* a quantized weighted layer (Conv, ConvTranspose, MatMul, Gemm with DQ'd inputs, rule R2)
  computes at its format's dense tensor-core peak (cost.py `QUANT_PEAKS`) and reads its
  quantized inputs at 1 byte per element;
* another quantized layer (R3: an Add, a pooling) moves its quantized inputs at 1 byte;
* a quantized layer writes its output at 1 byte per element where the Q after it fuses into
  it (TensorRT Developer Guide, "Explicit Quantization", Q/DQ fusion: a convolution with its
  inputs and output quantized, whose fused output is INT8; where a float tensor is read
  besides the Q, as a residual's, the output stays float) and the Q is all that reads it;
  otherwise in the file's float type (2 bytes in a file FP16 elsewhere, 4 in one FP32);
* every other node computes in the file's float type: FP16 (the tensor-core peak for math,
  2 bytes per element) in a file FP16 elsewhere, FP32 (CUDA cores, 4 bytes) in one FP32
  elsewhere, as TensorRT builds a strongly typed network; an FP16 node the plan keeps in FP32
  costs FP32;
* the all-FP16 engine prices every node in FP16, Q/DQ removed;
* Q/DQ boundary traffic (`Boundary`): a Q fuses into the quantized layer writing its input
  (through ops that commute with it, rule R1, and a Relu, which TensorRT fuses into the
  convolution or GEMM before it), and a DQ into the quantized layer reading it; where a
  quantized layer meets an un-quantized one, or the graph's inputs and outputs, the Q or DQ
  is a reformat of its own: a Q reads the float tensor and writes 1 byte per element, a
  graph output's DQ reads 1 byte and writes the float tensor, priced at the GPU class's
  bandwidth as cost.py prices a precision boundary. A Q/DQ pair left for another reader of a
  tensor a plan un-quantizes is priced as long as a quantized layer reads it.
An estimate, stated in docs/quantization.md with its limits.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx

from ..graph import Graph
from ..search.cost import (
    GPUS,
    MATH_OPS,
    NO_DATA_OPS,
    VIEW_OPS,
    Probe,
    gpu_class,
    infer_shapes,
    node_flops,
    quantized_peak,
)
from ..search.minimal import CheaperStep, SearchCertificate
from .qdq import COMMUTING, DQ, WEIGHTED, Layer, Q

FLOAT_BYTES = {"fp16": 2, "fp32": 4}


@dataclass
class _Node:
    name: str
    op: str
    flops: float
    quantized_in: int  # elements read through a DQ
    float_in: int  # other elements read
    out: int  # elements written


@dataclass
class Boundary:
    """One quantized activation (a QuantizeLinear and the DQs reading it) and where it may
    need a reformat kernel of its own."""

    q: str  # the QuantizeLinear node
    elements: int
    float_bytes: int  # bytes per element of the float tensor on the other side
    writer: str | None  # the quantized layer the Q fuses into (None: a graph input, another
    # node: always a reformat of its own)
    writer_node: str | None  # the node writing the Q's input (an FP16 node a plan may keep in FP32)
    readers: frozenset[str]  # the quantized layers reading it through a DQ (fused there)
    output_of: str | None = None  # the layer whose graph output this DQ gives (R2')
    sole_reader: bool = False  # the Q (past R1's ops and a fused Relu) is all that reads
    # what `writer` writes: fused, the layer's output is the quantized tensor alone

    def lives(self, plan: frozenset[str]) -> bool:
        """A quantized layer still reads this Q/DQ pair (or the graph output still has it)."""
        return bool(self.readers - plan) or (self.output_of is not None
                                             and self.output_of not in plan)

    def kernels(self, plan: frozenset[str], floated: frozenset[str] = frozenset()
                ) -> tuple[bool, bool, int]:
        """Under the plan: is the Q a kernel of its own, is the graph output's DQ, and how
        many DQs are (one per `floated` reader: a quantized layer the plan keeps in FP32)?"""
        out = self.output_of is not None and self.output_of not in plan
        q = self.lives(plan) and (self.writer is None or self.writer in plan
                                  or self.writer in floated)
        return q, out, len((self.readers - plan) & floated)

    def bytes(self, plan: frozenset[str], fp32_nodes: frozenset[str],
              floated: frozenset[str] = frozenset()) -> int:
        """Bytes the standalone Q and DQ kernels of this tensor move under the plan."""
        q, dq, dqs = self.kernels(plan, floated)
        fb = 4 if self.writer_node in fp32_nodes else self.float_bytes
        return (self.elements * (fb + 1) if q else 0) + (  # Q: float read, 1 byte written
            self.elements * (1 + self.float_bytes) * (int(dq) + dqs))  # DQ: 1 byte, float


@dataclass
class QuantPricing:
    gpu: str
    fmt: str  # int8 | fp8: the peak quantized layers run at
    half_file: bool
    nodes: list[_Node] = field(default_factory=list)
    layer_of: dict[str, str] = field(default_factory=dict)  # node -> its quantized layer
    half_units: dict[str, str] = field(default_factory=dict)  # unit -> FP16 node
    boundaries: list[Boundary] = field(default_factory=list)
    epilogue: dict[str, str] = field(default_factory=dict)  # Relu -> the layer it fuses into

    def _time(self, n: _Node, prec: str, out_bytes: int | None = None) -> float:
        """`out_bytes`: per element a quantized layer writes (1 where its output Q fuses
        into it, `written_bytes`; by default the file's float width)."""
        g = GPUS[self.gpu]
        if prec == "q":
            width = out_bytes if out_bytes is not None else FLOAT_BYTES[self._base]
            peak, bytes_ = quantized_peak(self.gpu, self.fmt), (n.quantized_in + n.float_in
                                                                + width * n.out)
            if n.op not in WEIGHTED:
                peak = 0.0
        else:
            size = FLOAT_BYTES[prec]
            peak = g.fp16_tensor if prec == "fp16" else g.fp32
            bytes_ = size * (n.quantized_in + n.float_in + n.out)
        compute = n.flops / peak if (n.flops and peak) else 0.0
        return max(compute, bytes_ / g.bandwidth)

    @property
    def _base(self) -> str:
        return "fp16" if self.half_file else "fp32"

    def written_bytes(self, layer: str, plan: frozenset[str]) -> int:
        """Bytes per element the quantized `layer` writes under the plan: 1 where a Q it
        fuses with lives (a quantized layer still reads it: TensorRT's "Q/DQ fusion", the
        convolution figure's right half, inputs and output quantized, the fused layer's output
        INT8/FP8) and the Q is the only reader of what the layer writes; else the float type."""
        if layer not in plan and any(b.writer == layer and b.sole_reader and b.lives(plan)
                                     for b in self.boundaries):
            return 1
        return FLOAT_BYTES[self._base]

    def floated(self, chosen: frozenset[str]) -> frozenset[str]:
        """The quantized layers the plan leaves quantized but keeps in FP32 (the FP32 unit of
        the layer's own node): the written file puts Casts between their DQs and them, and
        a DQ moves only past the ops rule R1 lists (a Cast is none), so TensorRT fuses no DQ
        into them: they compute in FP32 on dequantized values, each DQ a kernel of its own."""
        fp32_nodes = {n for u, n in self.half_units.items() if u in chosen}
        return frozenset(la for n, la in self.layer_of.items()
                         if n in fp32_nodes and la not in chosen)

    def node_times(self, units: Iterable[str]) -> dict[str, float]:
        """Seconds of each node (Q/DQ aside) with `units` applied to the file."""
        chosen = frozenset(units)
        fp32_nodes = {n for u, n in self.half_units.items() if u in chosen}
        floated = self.floated(chosen)
        out = {}
        for n in self.nodes:
            layer = self.layer_of.get(n.name)
            if self._fused(n.name, chosen, floated, fp32_nodes):
                out[n.name] = 0.0
            elif layer is not None and layer not in chosen and layer not in floated:
                out[n.name] = self._time(n, "q", self.written_bytes(layer, chosen))
            else:
                out[n.name] = self._time(n, "fp32" if n.name in fp32_nodes else self._base)
        return out

    def _fused(self, name: str, chosen: frozenset[str], floated: frozenset[str],
               fp32_nodes: set[str]) -> bool:
        """Is `name` a Relu TensorRT fuses into the layer before it under the plan: the layer
        quantized (its epilogue), or both in the same float precision?"""
        layer = self.epilogue.get(name)
        if layer is None:
            return False
        if layer not in chosen and layer not in floated:
            return True
        return (layer in fp32_nodes) == (name in fp32_nodes)

    def boundary(self, units: Iterable[str]) -> tuple[int, float]:
        """The standalone Q/DQ kernels under the plan: how many, and their seconds."""
        chosen = frozenset(units)
        fp32_nodes = frozenset(n for u, n in self.half_units.items() if u in chosen)
        floated = self.floated(chosen)
        moved = [b.bytes(chosen, fp32_nodes, floated) for b in self.boundaries]
        kernels = sum(sum(b.kernels(chosen, floated)) for b in self.boundaries)
        return kernels, math.fsum(moved) / GPUS[self.gpu].bandwidth

    def price(self, units: Iterable[str]) -> float:
        """Estimated seconds of the engine with `units` (layers un-quantized, FP16 nodes in
        FP32) applied to the file: its nodes and its standalone Q/DQ kernels."""
        chosen = frozenset(units)
        return math.fsum(self.node_times(chosen).values()) + self.boundary(chosen)[1]

    def all_fp16(self) -> float:
        return math.fsum(self._time(n, "fp16") for n in self.nodes if n.name not in self.epilogue)

    def summary(self, units: Sequence[str]) -> dict:
        """precision.json's "cost": the three engines, and `rows`: what each unit of the plan
        adds to its own nodes' time and what the Q/DQ boundaries add, each against
        all-quantized; the rows add up to the plan's slowdown against all-quantized."""
        plan, quantized, fp16 = self.price(units), self.price(()), self.all_fp16()
        before, after = self.node_times(()), self.node_times(units)
        (k0, b0), (k1, b1) = self.boundary(()), self.boundary(units)
        added: dict[str, float] = {u: 0.0 for u in units}
        unit_of = {**{n: u for u, n in self.half_units.items()}, **self.layer_of}
        fused = 0.0  # a layer left quantized whose output Q no longer fuses: Q/DQ traffic
        for name, t in after.items():
            u = unit_of.get(name)
            if u is not None and u in added:
                added[u] += t - before[name]
            else:
                fused += t - before[name]

        def share(s: float) -> float | None:
            return s / quantized if quantized else None
        rows = [{"row": u, "kind": "fp16" if u in self.half_units else "quantized",
                 "added_s": s, "share": share(s)} for u, s in added.items()]
        rows.append({"row": "Q/DQ boundaries", "kind": "qdq", "added_s": b1 - b0 + fused,
                     "share": share(b1 - b0 + fused)})
        return {"gpu": self.gpu, "title": gpu_class(self.gpu).title, "format": self.fmt,
                "all_fp16_s": fp16, "all_quantized_s": quantized, "plan_s": plan,
                "plan_vs_all_quantized": plan / quantized - 1 if quantized else None,
                "plan_vs_all_fp16": plan / fp16 - 1 if fp16 else None,
                "qdq_boundaries": {"all_quantized": {"kernels": k0, "s": b0},
                                   "plan": {"kernels": k1, "s": b1}},
                "rows": rows}


def _shapes(model: onnx.ModelProto, sample: Mapping[str, np.ndarray],
            probe: Probe | None = None) -> dict[str, tuple]:
    """Static shapes at the sample's input shapes (cost.infer_shapes, the FP16 pricing's),
    those shape inference leaves open from `probe` (one inference), as the FP16 run does."""
    return dict(infer_shapes(Graph(model), sample, probe))


def shape_probe(model: onnx.ModelProto, sample: Mapping[str, np.ndarray],
                threads: int | None = None, batch: int = 512) -> Probe:
    """The shapes of tensors the file computes on `sample`, by one ONNX Runtime inference of
    the file as given per batch of names (only shapes are kept)."""
    from .judge import run_outputs, session

    def probe(names: Sequence[str]) -> dict[str, tuple[int, ...]]:
        out: dict[str, tuple[int, ...]] = {}
        for k in range(0, len(names), batch):
            chunk = list(names[k:k + batch])
            m = onnx.ModelProto()
            m.CopyFrom(model)
            have = {o.name for o in m.graph.output}
            m.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t)
                                  for t in chunk if t not in have)
            got = run_outputs(session(m, threads), sample, chunk)
            out.update({t: tuple(int(d) for d in np.shape(v)) for t, v in got.items()})
        return out
    return probe


def fp16_road_price(ref_model: onnx.ModelProto, sample: Mapping[str, np.ndarray], gpu: str,
                    trt_version: int = 11, threads: int | None = None) -> float:
    """All-FP16's estimated time as the FP16 road prices the float model (search/cost.py:
    TensorRT's fused layers), so that a quantized run and an FP16 run of one model on one GPU
    class say one all-FP16 figure (#46)."""
    from ..backends.ort import Reference
    from ..judge import semantics
    from ..search.cost import engine_pricing

    g = Graph(ref_model)
    judged, prepared = semantics.prepare_graph(g, "trt", trt_version)
    units = semantics.units(prepared, judged.candidates())

    def probe_for(graph: Graph) -> Probe:
        def probe(names: Sequence[str]) -> dict[str, tuple[int, ...]]:
            ref = Reference(graph, threads)
            try:
                return {t: tuple(a.shape) for t, a in ref.run_tensors(sample, names).items()}
            finally:
                ref.close()
        return probe
    return engine_pricing(g, judged, prepared, units, sample, gpu, False, probe_for).engine.fp16_s


def pricing_for(model: onnx.ModelProto, layers: Sequence[Layer], half_units: Mapping[str, str],
                sample: Mapping[str, np.ndarray], gpu: str, half_file: bool,
                probe: Probe | None = None) -> QuantPricing:
    """Per node of the file: FLOPs and elements at this sample's shapes (`probe`: the shapes
    shape inference leaves open, `shape_probe`)."""
    shapes = _shapes(model, sample, probe)
    formats = {f for la in layers for f in la.formats}
    fmt = "fp8" if any(f.startswith("fp8") for f in formats) else "int8"
    quantized_peak(gpu, fmt)  # an FP8 file on a class without FP8: refused in one line
    dq_out = {n.output[0] for n in model.graph.node if n.op_type == DQ}

    def elems(t: str) -> int:
        s = shapes.get(t)
        return int(np.prod(s)) if s is not None else 0
    out = QuantPricing(gpu, fmt, half_file, half_units=dict(half_units))
    for n in model.graph.node:
        if n.op_type in (Q, DQ) or n.op_type in NO_DATA_OPS or n.op_type in VIEW_OPS \
                or n.op_type in ("Cast",):
            continue
        flops = node_flops(n, shapes) if n.op_type in MATH_OPS else 0.0
        q_in = sum(elems(t) for t in n.input if t in dq_out)
        f_in = sum(elems(t) for t in n.input if t and t not in dq_out)
        out.nodes.append(_Node(n.name, n.op_type, flops, q_in, f_in,
                               sum(elems(t) for t in n.output if t)))
    out.layer_of = {la.name: la.name for la in layers}
    out.boundaries = _boundaries(model, layers, elems, 2 if half_file else 4)
    out.epilogue = _epilogues(model, layers)
    return out


def _epilogues(model: onnx.ModelProto, layers: Sequence[Layer]) -> dict[str, str]:
    """Each Relu whose input a quantized weighted layer writes for it alone: TensorRT runs it
    in that layer's epilogue (Developer Guide, "Explicit Quantization", Q/DQ layer placement:
    a linear operation followed by an activation function, and convolution, batch norm and
    ReLU fused in the network's order; Best Practices guide, "Types of Fusions"), so it moves
    no tensor of its own and costs nothing beside the layer."""
    weighted = {la.name for la in layers if la.op in WEIGHTED}
    producer = {t: n.name for n in model.graph.node for t in n.output if t}
    reads: dict[str, int] = {}
    for n in model.graph.node:
        for t in dict.fromkeys(n.input):
            reads[t] = reads.get(t, 0) + 1
    outputs = {o.name for o in model.graph.output}
    return {n.name: producer[n.input[0]] for n in model.graph.node
            if n.op_type in FUSED_ACTIVATIONS and n.input and producer.get(n.input[0]) in weighted
            and reads.get(n.input[0], 0) == 1 and n.input[0] not in outputs}


# pointwise activations TensorRT fuses into the convolution or GEMM before them (Best
# Practices guide, "Types of Fusions": convolution and ReLU), so a Q after one still fuses
FUSED_ACTIVATIONS = frozenset({"Relu"})


def _boundaries(model: onnx.ModelProto, layers: Sequence[Layer], elems, float_bytes: int
                ) -> list[Boundary]:
    """Every quantized activation: the layer its Q fuses into, the layers reading its DQs."""
    producer = {t: n for n in model.graph.node for t in n.output if t}
    reads: dict[str, int] = {}
    for n in model.graph.node:
        for t in dict.fromkeys(n.input):
            reads[t] = reads.get(t, 0) + 1
    for o in model.graph.output:
        reads[o.name] = reads.get(o.name, 0) + 1
    readers: dict[str, set[str]] = {}
    output_of: dict[str, str] = {}
    source: dict[str, str] = {}
    for la in layers:
        for e in la.edges:
            if e.weight or e.q is None:
                continue
            source[e.q] = e.source
            if e.slot < 0:
                output_of[e.q] = la.name
            else:
                readers.setdefault(e.q, set()).add(la.name)
    names = {la.name for la in layers}
    out = []
    for q in dict.fromkeys([*readers, *output_of]):
        t = source[q]
        writer = producer.get(t)
        sole = reads.get(t, 0) == 1
        while writer is not None and (writer.op_type in COMMUTING or writer.op_type
                                      in FUSED_ACTIVATIONS) and writer.input:
            sole = sole and reads.get(writer.input[0], 0) == 1
            writer = producer.get(writer.input[0])  # R1: the Q moves back past it
        layer = writer.name if writer is not None and writer.name in names else None
        direct = producer.get(t)
        out.append(Boundary(q, elems(t), float_bytes, layer,
                            direct.name if direct is not None else None,
                            frozenset(readers.get(q, ())), output_of.get(q),
                            sole and layer is not None))
    return out


def float_side(pricing: QuantPricing) -> dict:
    """The float type the quantized file computes in outside its quantized layers (FP32 in a
    file ModelOpt wrote with high_precision_dtype='fp32'), and in such a file the
    all-quantized engine with that side in FP16 instead (high_precision_dtype='fp16'), so a
    reader sees why all-quantized can cost more than all-FP16."""
    from dataclasses import replace

    out: dict = {"dtype": pricing._base}
    if not pricing.half_file:
        half = replace(pricing, half_file=True,
                       boundaries=[replace(b, float_bytes=2) for b in pricing.boundaries])
        out["all_quantized_fp16_elsewhere_s"] = half.price(())
    return out


@dataclass(frozen=True)
class CostRow:
    """What one unit of the plan (or the Q/DQ boundaries) adds against all-quantized."""
    row: str
    kind: str  # "quantized", "fp16", "qdq"
    added_s: float
    share: float | None  # of all-quantized's time (None: all-quantized priced 0)

    def to_json(self) -> dict:
        return {"row": self.row, "kind": self.kind, "added_s": self.added_s,
                "share": self.share}

    @classmethod
    def from_json(cls, d: Mapping) -> CostRow:
        return cls(d["row"], d["kind"], d["added_s"], d["share"])


@dataclass(frozen=True)
class QdqKernels:
    """The standalone Q/DQ kernels of one plan: how many, and their seconds."""
    kernels: int
    s: float

    def to_json(self) -> dict:
        return {"kernels": self.kernels, "s": self.s}

    @classmethod
    def from_json(cls, d: Mapping) -> QdqKernels:
        return cls(d["kernels"], d["s"])


@dataclass(frozen=True)
class FloatSide:
    """`float_side`: the file's float type outside its quantized layers and, in a file FP32
    there, all-quantized with that side in FP16."""
    dtype: str  # "fp16" | "fp32"
    all_quantized_fp16_elsewhere_s: float | None = None

    def to_json(self) -> dict:
        return {"dtype": self.dtype,
                **({"all_quantized_fp16_elsewhere_s": self.all_quantized_fp16_elsewhere_s}
                   if self.all_quantized_fp16_elsewhere_s is not None else {})}

    @classmethod
    def from_json(cls, d: Mapping) -> FloatSide:
        return cls(d["dtype"], d.get("all_quantized_fp16_elsewhere_s"))


@dataclass(frozen=True)
class CostCertificate:
    """`--objective cost`'s certificate of the plan (search/minimal.py, counted by
    `of_search` as precision.json's "cost" writes it): the plan's price, the removals
    and cheaper swaps that all failed (counted), their neighbourhood, and where the cheaper
    step moved the 1-minimal plan (`minimal_plan`, its price, the step). The search's own
    record (search/minimal.py `SearchCertificate`) lists them; the FP16 road writes it whole
    to trace.json. Not the spread certificate (result.CertificateRecord:
    `QuantResult.certified` here)."""
    objective: str
    price_s: float
    neighbourhood: str
    removals_failed: int
    swaps_failed: int
    limit_s: float | None = None  # a plan priced within a limit (search/minimal.py)
    minimal_plan: list[str] | None = None  # the 1-minimal plan the cheaper step left
    minimal_price_s: float | None = None
    cheaper: CheaperStep | None = None

    @classmethod
    def of_search(cls, cert: SearchCertificate) -> CostCertificate:
        """The search's certificate (its removals and swaps each a whole plan: a plan of k
        layers would write k * k names), counted."""
        return cls(cert.objective, cert.price_s, cert.neighbourhood, len(cert.removals),
                   len(cert.swaps), cert.limit_s,
                   list(cert.minimal_plan) if cert.minimal_plan is not None else None,
                   cert.minimal_price_s, cert.cheaper)

    def to_json(self) -> dict:
        return {"objective": self.objective, "price_s": self.price_s,
                **({"limit_s": self.limit_s} if self.limit_s is not None else {}),
                "neighbourhood": self.neighbourhood,
                **({"minimal_plan": list(self.minimal_plan),
                    "minimal_price_s": self.minimal_price_s}
                   if self.minimal_plan is not None else {}),
                **({"cheaper": self.cheaper.to_json()} if self.cheaper is not None else {}),
                "removals_failed": self.removals_failed, "swaps_failed": self.swaps_failed}

    @classmethod
    def from_json(cls, d: Mapping) -> CostCertificate:
        step = d.get("cheaper")
        plan = d.get("minimal_plan")
        return cls(d["objective"], d["price_s"], d["neighbourhood"], d["removals_failed"],
                   d["swaps_failed"], d.get("limit_s"), list(plan) if plan is not None else None,
                   d.get("minimal_price_s"),
                   CheaperStep.from_json(step) if step is not None else None)


@dataclass(frozen=True)
class QuantCost:
    """precision.json's "cost" of a quantized run: `QuantPricing.summary` (the engines, the
    Q/DQ kernels, each unit's row), the objective, the file's float side, the cost
    certificate, and one all-FP16 price per model and GPU class (quant/run.py `_one_price`)."""
    gpu: str
    title: str
    format: str  # "int8" | "fp8"
    all_fp16_s: float
    all_quantized_s: float
    plan_s: float
    plan_vs_all_quantized: float | None
    plan_vs_all_fp16: float | None
    qdq_all_quantized: QdqKernels
    qdq_plan: QdqKernels
    rows: list[CostRow]
    objective: str
    float_side: FloatSide
    all_fp16_from: str
    file_all_float_s: float
    file_fp32_nodes: int
    file_fp32_examples: list[str]
    certificate: CostCertificate | None = None

    def to_json(self) -> dict:
        return {"gpu": self.gpu, "title": self.title, "format": self.format,
                "all_fp16_s": self.all_fp16_s, "all_quantized_s": self.all_quantized_s,
                "plan_s": self.plan_s, "plan_vs_all_quantized": self.plan_vs_all_quantized,
                "plan_vs_all_fp16": self.plan_vs_all_fp16,
                "qdq_boundaries": {"all_quantized": self.qdq_all_quantized.to_json(),
                                   "plan": self.qdq_plan.to_json()},
                "rows": [r.to_json() for r in self.rows], "objective": self.objective,
                "float_side": self.float_side.to_json(),
                **({"certificate": self.certificate.to_json()}
                   if self.certificate is not None else {}),
                "all_fp16_from": self.all_fp16_from, "file_all_float_s": self.file_all_float_s,
                "file_fp32_nodes": self.file_fp32_nodes,
                "file_fp32_examples": list(self.file_fp32_examples)}

    @classmethod
    def from_json(cls, d: Mapping) -> QuantCost:
        q = d["qdq_boundaries"]
        cert = d.get("certificate")
        return cls(d["gpu"], d["title"], d["format"], d["all_fp16_s"], d["all_quantized_s"],
                   d["plan_s"], d["plan_vs_all_quantized"], d["plan_vs_all_fp16"],
                   QdqKernels.from_json(q["all_quantized"]), QdqKernels.from_json(q["plan"]),
                   [CostRow.from_json(r) for r in d["rows"]], d["objective"],
                   FloatSide.from_json(d["float_side"]), d["all_fp16_from"],
                   d["file_all_float_s"], d["file_fp32_nodes"], list(d["file_fp32_examples"]),
                   CostCertificate.from_json(cert) if cert is not None else None)
