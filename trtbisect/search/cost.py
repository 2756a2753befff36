"""What a precision plan costs in engine speed: a roofline estimate per TensorRT layer.

The price is the engine's: the layers TensorRT is predicted to build (`--semantics trt`'s
units), whatever rounding the judge uses; a strict plan of nodes is priced by the layers they
belong to (`PlanPricing`). Each layer's time in each precision is the roofline
`max(FLOPs / peak, bytes / bandwidth)` on a GPU class whose figures come from NVIDIA's
datasheets (`GPUS`, with their addresses): MatMul, Gemm, Conv, ConvTranspose and Attention run
on the tensor cores (FP16, or TF32 with `--tf32`, else FP32 on the CUDA cores); every other op
moves its tensors. A layer reads each tensor at the width it was stored in and writes at its
own, so an FP16/FP32 boundary is a wider read, never a kernel of its own, and one layer more in
FP32 never makes a plan cheaper. A fused layer is priced as one: the tensors it keeps inside
cost no memory traffic. Nodes inside If branches, Loop and Scan bodies are priced as often as
they run on the analysed sample (`node_runs`); what cannot be priced is named (`unpriced`) and
the run falls back to the count search. docs/cost.md states the model, its sources and its
limits.

No runtime here: the shapes come in (`infer_shapes`: ONNX shape inference on the run's own
sample shapes, so a dynamic model is priced at the shape it was analysed at), and the search
receives `PlanPricing.price`, a pure function of the plan.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..errors import TrtBisectError
from ..graph import PARAMETER_INPUTS, Graph, fp16_signature, structure, subgraphs, walk_graphs
from .flow import HOLDERS, branches_taken, node_runs

FLOAT_BYTES = {16: 2, 32: 4}
EPS = 1e-12  # slowdowns this close to the budget count as within it (float sums)


@dataclass(frozen=True)
class GpuClass:
    """Published peak figures of one GPU class (dense, i.e. without 2:4 sparsity)."""

    name: str  # --gpu value
    title: str
    fp16_tensor: float  # FLOP/s, FP16 tensor cores, dense
    tf32_tensor: float  # FLOP/s, TF32 tensor cores, dense
    fp32: float  # FLOP/s, FP32 on the CUDA cores (no tensor cores)
    bandwidth: float  # bytes/s, device memory
    source: str  # the datasheet the figures come from
    note: str = ""  # how a figure was read off it

    def to_json(self) -> dict:
        return {"name": self.name, "title": self.title, "fp16_tensor_flops": self.fp16_tensor,
                "tf32_tensor_flops": self.tf32_tensor, "fp32_flops": self.fp32,
                "bandwidth_bytes_per_s": self.bandwidth, "source": self.source}


T = 1e12
SPARSE = "the datasheet's tensor-core figures are with sparsity; dense is half of them"
GPUS: dict[str, GpuClass] = {g.name: g for g in (
    GpuClass("h100", "NVIDIA H100 SXM (Hopper, datacenter)", 989.5 * T, 494.5 * T, 67 * T,
             3.35e12, "https://www.nvidia.com/en-us/data-center/h100/",
             f"FP16 1,979 and TF32 989 TFLOPS with sparsity: {SPARSE}"),
    GpuClass("a100", "NVIDIA A100 80GB SXM (Ampere, datacenter)", 312 * T, 156 * T, 19.5 * T,
             2.039e12, "https://www.nvidia.com/en-us/data-center/a100/",
             "dense figures as listed (624 and 312 TFLOPS with sparsity); 2,039 GB/s"),
    GpuClass("l4", "NVIDIA L4 (Ada Lovelace, inference)", 121 * T, 60 * T, 30.3 * T, 300e9,
             "https://www.nvidia.com/en-us/data-center/l4/",
             f"FP16 242 and TF32 120 TFLOPS with sparsity: {SPARSE}"),
    GpuClass("a10", "NVIDIA A10 (Ampere, inference)", 125 * T, 62.5 * T, 31.2 * T, 600e9,
             "https://www.nvidia.com/en-us/data-center/products/a10-gpu/",
             "dense figures as listed (250 and 125 TFLOPS with sparsity)"),
    GpuClass("orin", "NVIDIA Jetson AGX Orin 64GB (Ampere, embedded)", 42.5 * T, 21.25 * T,
             5.3 * T, 204.8e9,
             "https://www.nvidia.com/content/dam/en-zz/Solutions/gtcf21/jetson-orin/"
             "nvidia-jetson-agx-orin-technical-brief.pdf",
             "the brief gives the GPU's 5.3 FP32 TFLOPS and 170 sparse INT8 TOPS (85 dense); "
             "FP16 = INT8 / 2 and TF32 = INT8 / 4 as on every Ampere tensor core (A100: "
             "624 / 312 / 156); 204.8 GB/s LPDDR5"),
)}
DEFAULT_GPU = "l4"  # the inference card most TensorRT deployments in a cloud run on

MATH_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "Attention"})
# layouts TensorRT builds as a reinterpretation of the same memory (a shuffle without a
# transpose): no traffic of their own
VIEW_OPS = frozenset({"Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten"})
NO_DATA_OPS = frozenset({"Shape", "Size", "Constant", "ConstantOfShape"})
# ops that read only the part of their first input they return (an embedding lookup reads its
# rows, not the table): that input is counted at the output's size
PARTIAL_READ_OPS = frozenset({"Gather", "GatherElements", "GatherND", "Slice"})


def gpu_class(name: str) -> GpuClass:
    try:
        return GPUS[name]
    except KeyError:
        raise TrtBisectError(f"unknown GPU class {name!r}: choose one of {', '.join(GPUS)} "
                             f"(e.g. --gpu {DEFAULT_GPU})") from None


# Quantized tensor-core peaks (trtbisect/quant/, issue #38), dense, in OP/s, from the same
# datasheets as GPUS (INT8 TOPS and FP8 TFLOPS; the sparse figures halved as above). None: the
# class has no such tensor cores (FP8 arrived with Ada and Hopper; Ampere has none).
QUANT_PEAKS: dict[str, dict[str, float | None]] = {
    "h100": {"int8": 1979 * T, "fp8": 1979 * T},  # 3,958 TOPS / TFLOPS with sparsity
    "a100": {"int8": 624 * T, "fp8": None},  # 624 TOPS dense (1,248 with sparsity); no FP8
    "l4": {"int8": 242.5 * T, "fp8": 242.5 * T},  # 485 TOPS / TFLOPS with sparsity
    "a10": {"int8": 250 * T, "fp8": None},  # 250 TOPS dense (500 with sparsity); no FP8
    "orin": {"int8": 85 * T, "fp8": None},  # 170 sparse INT8 TOPS (the GPU's, see GPUS)
}


def quantized_peak(gpu: str, fmt: str) -> float:
    """Dense tensor-core peak of `gpu` for `fmt` (int8 | fp8); a usage error where the class
    has no such tensor cores (`--precision fp8 --gpu a100`)."""
    peak = QUANT_PEAKS[gpu_class(gpu).name].get(fmt)
    if peak is None:
        raise TrtBisectError(f"--precision {fmt} --gpu {gpu}: the {GPUS[gpu].title} has no "
                             f"{fmt.upper()} tensor cores; use --precision int8, or a GPU class "
                             "with FP8 (h100, l4)")
    return peak


# ---------------------------------------------------------------- shapes and FLOPs

Shapes = dict[str, tuple[int, ...]]
Probe = Callable[[Sequence[str]], Mapping[str, tuple[int, ...]]]


def infer_shapes(g: Graph, sample: Mapping[str, np.ndarray], probe: Probe | None = None) -> Shapes:
    """Static shapes of every tensor at this sample's input shapes: ONNX shape inference,
    then `probe` (shapes one reference inference produces) for float tensors it left open."""
    m = structure(g.model)
    for v in m.graph.input:
        if v.name in sample:
            t = v.type.tensor_type
            t.shape.Clear()
            for n in np.shape(sample[v.name]):
                t.shape.dim.add().dim_value = int(n)
    try:
        m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:  # best effort: the probe fills what inference could not
        pass
    shapes: Shapes = {}
    for graph in walk_graphs(m.graph):  # subgraphs too: the bodies of If, Loop and Scan
        shapes.update({t.name: tuple(int(d) for d in t.dims) for t in graph.initializer})
        for v in [*graph.input, *graph.value_info, *graph.output]:
            tt = v.type.tensor_type
            if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
                shapes.setdefault(v.name, tuple(d.dim_value for d in tt.shape.dim))
    for node in m.graph.node:
        if node.op_type == "Constant" and node.output and node.output[0] not in shapes:
            for a in node.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    shapes[node.output[0]] = tuple(int(d) for d in a.t.dims)
    for name, arr in sample.items():
        shapes[name] = tuple(np.shape(arr))
    if probe is not None:
        # top-level tensors and those inside If branches: a value inside a Loop body has a
        # shape per trip, which one exposed value does not give (only static ones are exposed);
        # such nodes are priced on what inference knows, else named unpriced
        missing = [t for node in g.nodes for t in node.output
                   if t and t not in shapes and g.is_float(t) and g.exposable(t)]
        if missing:
            shapes.update({t: tuple(int(d) for d in s) for t, s in probe(missing).items()})
    return shapes


def _prod(dims: Iterable[int]) -> int:
    out = 1
    for d in dims:
        out *= int(d)
    return out


def node_flops(node: onnx.NodeProto, shapes: Mapping[str, tuple[int, ...]]) -> float:
    """Multiply-add FLOPs (2 per MAC) of a math op; 0 for other ops or unknown shapes."""
    if node.op_type not in MATH_OPS or len(node.input) < 2:
        return 0.0
    a, w, y = (shapes.get(t) for t in (node.input[0], node.input[1], node.output[0]))
    if a is None or w is None or y is None or not a:
        return 0.0
    if node.op_type == "MatMul":  # [..., M, K] x [..., K, N]
        return 2.0 * _prod(y) * a[-1]
    if node.op_type == "Gemm":
        trans_a = next((x.i for x in node.attribute if x.name == "transA"), 0)
        return 2.0 * _prod(y) * (a[0] if trans_a else a[-1])
    if node.op_type == "Conv":  # w = [C_out, C_in / groups, *kernel]
        return 2.0 * _prod(y) * _prod(w[1:])
    if node.op_type == "ConvTranspose":  # every input element meets C_out / groups * kernel
        return 2.0 * _prod(a) * _prod(w[1:])
    # Attention (opset 23): Q [B, S, hidden] or [B, H, S, d]; K's sequence axis is -2 (4-D)
    kv = w[-2] if len(w) == 4 else w[1] if len(w) >= 2 else 1
    return 4.0 * _prod(a) * kv  # Q K^T and P V


def _itemsize(elem_type: int) -> int:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return 4


# ---------------------------------------------------------------- pricing

@dataclass(frozen=True)
class UnitCost:
    """One unit's work per inference (a body's times its runs) and its estimated time: in
    all-FP16, and alone in FP32 (every other unit FP16)."""

    flops: float
    float_elements: int  # float elements it reads (weights included) and writes outside itself
    other_bytes: int  # non-float data it reads and writes (indices, shapes)
    fp16_s: float
    fp32_s: float

    @property
    def premium(self) -> float:
        """Seconds that keeping this unit alone in FP32 adds to its own time."""
        return self.fp32_s - self.fp16_s


@dataclass(frozen=True)
class _Reader:
    """A unit or a node no plan switches, as the price sees it (per run of its body)."""

    name: str
    unit: bool  # False: a node no plan switches, FP32 in every plan
    runs: float
    flops: float
    other: int  # bytes of non-float data
    fixed: int  # float bytes whose width no plan changes (declared inputs and outputs)
    own: int  # float elements at its own width: the weights it reads, what it writes
    sources: tuple[tuple[str, int], ...]  # (unit, elements): read as that unit stored them


@dataclass(frozen=True)
class _Edge:
    """A float tensor that may cross a precision boundary: its producer side and consumer
    sides, each a unit name or a fixed precision (16 / 32). Counts the mixed file's Casts."""

    tensor: str
    producer: str | int
    consumers: tuple[str | int, ...]


class Pricing:
    """Estimated engine time of any plan over `units` (name -> nodes of `g`).

    A layer reads each tensor at the width it was stored in and writes at its own: a boundary
    between FP16 and FP32 layers is a conversion on load (or, at a graph or body output, on
    store), never a kernel of its own. So keeping a unit in FP32 never makes a plan cheaper:
    every plan is priced between all-FP16 and all-FP32 (docs/cost.md)."""

    def __init__(self, g: Graph, units: Mapping[str, Sequence[str]], shapes: Mapping[str, tuple],
                 gpu: GpuClass | str = DEFAULT_GPU, tf32: bool = False,
                 taken: Mapping[tuple[int, str], bool] | None = None) -> None:
        self.gpu = gpu if isinstance(gpu, GpuClass) else gpu_class(gpu)
        self.tf32 = tf32
        self._nodes = list(g.nodes)  # every node, subgraphs' too; a list: protobuf indexes slowly
        self._node = dict(zip(g.names, self._nodes))
        self.units = {u: tuple(ns) for u, ns in units.items()}
        self.unit_of = {n: u for u, ns in self.units.items() for n in ns}
        self._shapes = shapes
        self.flow = node_runs(g, shapes, taken, lambda i, a: self._branch_estimate(g, i, a))
        self._runs = dict(zip(g.names, self.flow.runs))
        self.unknown = sorted({t for n in self.unit_of if self._runs[n] > 0
                               for t in [*self._node[n].input, *self._node[n].output]
                               if t and t not in shapes})
        self.unpriced = list(self.flow.unpriced)
        floats = [t for t in self.unknown if g.is_float(t)]
        if floats:
            self.unpriced.append(f"{len(floats)} float tensor(s) whose shape neither inference "
                                 f"nor the reference run gives: {', '.join(floats[:5])}"
                                 + (", ..." if len(floats) > 5 else ""))
        self._constant = self._constants(g)
        self._body_outputs = {v.name for node in self._nodes for _, b in subgraphs(node)
                              for v in b.output}
        self._declared = {v.name: (16 if g.declared.get(v.name) == TensorProto.FLOAT16 else 32)
                          for v in [*g.model.graph.input, *g.model.graph.output]}
        self._readers = [self._reader(g, u, ns, True) for u, ns in self.units.items()]
        self._readers += [self._reader(g, n, (n,), False) for n in g.names
                          if n not in self.unit_of and self._node[n].op_type
                          not in NO_DATA_OPS | VIEW_OPS | HOLDERS]
        self._of_unit = {r.name: k for k, r in enumerate(self._readers) if r.unit}
        self._dependents: dict[str, list[int]] = {}
        for k, r in enumerate(self._readers):
            for u, _ in r.sources:
                if u != r.name:
                    self._dependents.setdefault(u, []).append(k)
        self._base = [self._time(r, frozenset()) for r in self._readers]
        self.fp16_s = math.fsum(self._base)
        self.cost = {u: self._unit_cost(u) for u in self.units}
        self.edges = self._edges(g)
        self.adjacent = self._adjacency(g)
        self._memo: dict[frozenset[str], float] = {}

    # ---- one unit

    def _elements(self, t: str) -> int:
        s = self._shapes.get(t)
        return _prod(s) if s is not None else 0

    def _constants(self, g: Graph) -> set[str]:
        """Values known when the engine is built (weights, constants and what is computed from
        them alone): converted at build time, read at the reader's width."""
        constant = set(g.initializers) | set(g.inner_weights)
        for node in self._nodes:
            if node.op_type == "Constant" or (node.input and all(not t or t in constant
                                                                  for t in node.input)):
                constant.update(t for t in node.output if t)
        return constant

    def _stored(self, g: Graph, t: str) -> str | int:
        """The precision tensor t is stored in: its unit's (a name), or a fixed 16 / 32."""
        p = g.producer.get(t)
        if p is None:
            return self._declared.get(t, 16 if t in g.half_typed else 32)
        return self.unit_of.get(g.names[p], 16 if t in g.half_typed else 32)

    def _reader(self, g: Graph, name: str, nodes: Sequence[str], unit: bool) -> _Reader:
        members = set(nodes)
        produced = {t for n in nodes for t in self._node[n].output if t}
        outputs = set(g.output_names())
        flops, other, fixed, own = 0.0, 0, 0, 0
        reads: dict[str, None] = {}
        writes: dict[str, None] = {}
        for n in nodes:
            node = self._node[n]
            flops += node_flops(node, self._shapes)
            if node.op_type in VIEW_OPS:
                continue
            for t in node.input:
                if t and t not in produced:
                    reads[t] = None
            for t in node.output:
                if t and (t in outputs or t in self._body_outputs
                          or any(g.names[c] not in members for c in g.consumers.get(t, []))):
                    writes[t] = None
        partial = {self._node[n].input[0]: self._node[n].output[0] for n in nodes
                   if self._node[n].op_type in PARTIAL_READ_OPS and self._node[n].input}
        sources: dict[str, int] = {}
        for t in reads:
            count = self._elements(partial[t]) if t in partial else self._elements(t)
            if not g.is_float(t):
                other += count * _itemsize(g.types.get(t, TensorProto.FLOAT))
            elif t in self._constant:
                own += count
            else:
                side = self._stored(g, t)
                if isinstance(side, str):
                    sources[side] = sources.get(side, 0) + count
                else:
                    fixed += count * FLOAT_BYTES[side]
        for t in writes:
            count = self._elements(t)
            if not g.is_float(t):
                other += count * _itemsize(g.types.get(t, TensorProto.FLOAT))
            elif t in outputs:  # written in the declared type (a conversion on store)
                fixed += count * FLOAT_BYTES[self._declared.get(t, 32)]
            elif t in self._body_outputs:  # If, Loop and Scan keep their declared types
                fixed += count * FLOAT_BYTES[16 if t in g.half_typed else 32]
            else:
                own += count
        runs = self._runs[nodes[0]] if nodes else 0.0
        return _Reader(name, unit, runs, flops, other, fixed, own, tuple(sources.items()))

    def _roofline(self, flops: float, nbytes: float, bits: int) -> float:
        peak = (self.gpu.fp16_tensor if bits == 16
                else self.gpu.tf32_tensor if self.tf32 else self.gpu.fp32)
        return max(flops / peak, nbytes / self.gpu.bandwidth)

    def _time(self, r: _Reader, fp32: frozenset[str]) -> float:
        if not r.runs:
            return 0.0
        bits = 32 if (not r.unit or r.name in fp32) else 16
        nbytes = (r.other + r.fixed + r.own * FLOAT_BYTES[bits]
                  + sum(n * (4 if u in fp32 else 2) for u, n in r.sources))
        return r.runs * self._roofline(r.flops, nbytes, bits)

    def _unit_cost(self, u: str) -> UnitCost:
        r = self._readers[self._of_unit[u]]
        floats = r.own + sum(n for _, n in r.sources) + r.fixed // 4  # at 4 bytes each
        return UnitCost(r.runs * r.flops, int(r.runs * floats), int(r.runs * r.other),
                        self._base[self._of_unit[u]], self._time(r, frozenset((u,))))

    def _branch_estimate(self, g: Graph, i: int, attr: str) -> float:
        """An If branch's FP32 work, nested bodies counted once: the dearer-branch rule."""
        todo, total = list(g.body_nodes(i, attr)), 0.0
        while todo:
            j = todo.pop()
            node = self._nodes[j]
            for a, _ in subgraphs(node):
                todo.extend(g.body_nodes(j, a))
            nbytes = 4 * sum(self._elements(t) for t in [*node.input, *node.output] if t)
            total += self._roofline(node_flops(node, self._shapes), nbytes, 32)
        return total

    # ---- boundaries (the Casts the mixed file holds: counted, their price is in the reads)

    def _edges(self, g: Graph) -> list[_Edge]:
        """Every float activation whose reads may need a Cast, as mixed.py writes them: an FP16
        node reads its FP16 inputs in FP16 and everything else in FP32; other nodes read FP32
        (Cast, Shape and Size read what they are given); graph inputs and outputs keep their
        declared types. Weights and constants are converted at build time: no Cast."""
        half_in = {n: self._fp16_inputs(g, n) for n in self.unit_of}
        edges = []
        tensors = [v.name for v in g.inputs()] + [t for node in self._nodes for t in node.output]
        for t in dict.fromkeys(tensors):
            if not t or not g.is_float(t) or t in self._constant:
                continue
            p = g.producer.get(t)
            if p is not None and not self._runs[g.names[p]]:
                continue  # a body that does not run on the analysed sample
            producer = self._stored(g, t)
            consumers: list[str | int] = []
            for c in g.consumers.get(t, []):
                name, node = g.names[c], self._nodes[c]
                if name in self.unit_of:
                    side = self.unit_of[name]
                    if side == producer:
                        continue  # inside one unit: one precision, no boundary
                    consumers.append(side if t in half_in[name] else 32)
                elif node.op_type not in ("Cast", "CastLike", "Shape", "Size"):
                    consumers.append(32)
            if t in self._declared and p is not None:
                consumers.append(self._declared[t])
            if any(isinstance(s, str) for s in (producer, *consumers)):
                edges.append(_Edge(t, producer, tuple(consumers)))
        return edges

    def _fp16_inputs(self, g: Graph, name: str) -> set[str]:
        """`Graph.fp16_inputs` on the cached node (the same rule: schema and parameters)."""
        node = self._node[name]
        allowed = fp16_signature(node, g.opset)
        if allowed is None:
            return set()
        params = PARAMETER_INPUTS.get(node.op_type, ())
        return {t for k, t in enumerate(node.input)
                if g.is_float(t) and k in allowed and k not in params}

    @staticmethod
    def _edge_casts(e: _Edge, fp32: frozenset[str]) -> int:
        """How many Casts one tensor needs under a plan (one per target type)."""
        def prec(side: str | int) -> int:
            return (32 if side in fp32 else 16) if isinstance(side, str) else side

        home = prec(e.producer)
        return len({prec(c) for c in e.consumers} - {home})

    def _adjacency(self, g: Graph) -> dict[str, tuple[str, ...]]:
        """Units that share a tensor with each unit, directly or through one node no plan
        switches (a user's Cast, a Shape)."""
        near: dict[str, dict[str, None]] = {u: {} for u in self.units}

        def sides(i: int, seen: int = 0) -> list[str]:
            name = g.names[i]
            if name in self.unit_of:
                return [self.unit_of[name]]
            if seen:
                return []
            node = self._nodes[i]
            up = [g.producer[t] for t in node.input if t in g.producer]
            down = [c for t in node.output for c in g.consumers.get(t, [])]
            return [u for j in [*up, *down] for u in sides(j, 1)]

        for u, nodes in self.units.items():
            for n in nodes:
                node = self._node[n]
                up = [g.producer[t] for t in node.input if t in g.producer]
                down = [c for t in node.output for c in g.consumers.get(t, [])]
                for j in [*up, *down]:
                    for v in sides(j):
                        if v != u:
                            near[u][v] = None
        return {u: tuple(v) for u, v in near.items()}

    # ---- plans

    def price(self, fp32_units: Iterable[str]) -> float:
        """Estimated engine time (seconds) of the plan keeping these units in FP32."""
        plan = frozenset(u for u in fp32_units if u in self.cost)
        if plan not in self._memo:
            # math.fsum: exactly rounded, so the same plan has the same price whatever order a
            # set iterates in (it changes with PYTHONHASHSEED): the search's ties between
            # equally priced units, and so its plan, must not depend on the process
            touched = {self._of_unit[u] for u in plan}
            touched.update(k for u in plan for k in self._dependents.get(u, ()))
            extra = math.fsum(self._time(self._readers[k], plan) - self._base[k] for k in touched)
            if len(self._memo) > 1 << 16:
                self._memo.clear()
            self._memo[plan] = self.fp16_s + extra
        return self._memo[plan]

    def own(self, unit: str, fp32_units: Iterable[str]) -> float:
        """Seconds keeping `unit` in FP32 adds to its own time under the plan."""
        plan = frozenset(u for u in fp32_units if u in self.cost)
        k = self._of_unit[unit]
        return self._time(self._readers[k], plan) - self._base[k]

    def casts(self, fp32_units: Iterable[str]) -> tuple[int, float]:
        """How many boundary Casts the plan's mixed model holds, and what the conversions add:
        the plan's time over all-FP16 less what its FP32 units add to their own time (the
        wider reads of the FP16 layers and fixed nodes that read FP32 values)."""
        plan = frozenset(u for u in fp32_units if u in self.cost)
        count = sum(self._edge_casts(e, plan) for e in self.edges)
        seconds = self.price(plan) - self.fp16_s - math.fsum(self.own(u, plan) for u in plan)
        return count, seconds

    @property
    def fp32_s(self) -> float:
        return self.price(self.units)

    def slowdown(self, fp32_units: Iterable[str]) -> float:
        """The plan's estimated time over all-FP16's, minus one (0.05: 5% slower)."""
        return self.price(fp32_units) / self.fp16_s - 1 if self.fp16_s > 0 else 0.0

    def summary(self, fp32_units: Iterable[str], objective: str = "cost",
                budget: float | None = None, low: str = "fp16",
                names: Mapping[str, str] | None = None,
                nodes: Mapping[str, Sequence[str]] | None = None) -> dict:
        """precision.json's "cost" entry (`budget`: --budget, in percent; `low`: the run's low
        precision; `names`: unit -> the TensorRT layer name tables show; `nodes`: unit -> the
        plan's nodes it holds). The units' shares and the boundary Casts' add up to the
        slowdown."""
        plan = [u for u in dict.fromkeys(fp32_units) if u in self.cost]
        names, nodes = names or {}, nodes or {}
        flops = sum(c.flops for c in self.cost.values())
        moved = sum(c.float_elements * 4 + c.other_bytes for c in self.cost.values())
        casts, cast_s = self.casts(plan)
        plan_s = self.price(plan)
        base = self.fp16_s
        return {
            "gpu": self.gpu.name, "gpu_title": self.gpu.title, "gpu_source": self.gpu.source,
            "tf32": self.tf32, "objective": objective, "model": "roofline (docs/cost.md)",
            "precision": low, "all_low_s": base, f"all_{low}_s": base,
            "plan_s": plan_s, "all_fp32_s": self.fp32_s,
            "slowdown": self.slowdown(plan),
            "fp32_flop_share": sum(self.cost[u].flops for u in plan) / flops if flops else 0.0,
            "fp32_byte_share": (sum(self.cost[u].float_elements * 4 + self.cost[u].other_bytes
                                    for u in plan) / moved) if moved else 0.0,
            "boundary_casts": casts, "boundary_casts_s": cast_s,
            "boundary_casts_share": cast_s / base if base > 0 else 0.0,
            "units": {names.get(u, u): {"fp16_s": self.cost[u].fp16_s,
                                        "fp32_s": self.cost[u].fp16_s + self.own(u, plan),
                                        "share": self.own(u, plan) / base if base > 0 else 0.0,
                                        "nodes": list(nodes.get(u, self.units[u]))}
                      for u in plan},
            "plan_layers": len(plan), "layers": len(self.units),
            "unknown_shapes": len(self.unknown),
            **({"unpriced": list(self.unpriced)} if self.unpriced else {}),
            **({"notes": list(self.flow.notes)} if self.flow.notes else {}),
            **({"budget_pct": budget, "within_budget": self.slowdown(plan) <= budget / 100 + EPS}
               if budget is not None else {}),
        }

    def share(self, unit: str) -> float:
        """What keeping this unit alone in FP32 adds, as a fraction of all-FP16's time."""
        return (self.price((unit,)) - self.fp16_s) / self.fp16_s if self.fp16_s > 0 else 0.0


# ---------------------------------------------------------------- the run's use of a price

class PlanPricing:
    """The run's prices, over the search's units: always the engine TensorRT is predicted to
    build (the layers of `--semantics trt`), whatever rounding the judge uses. Under
    `--semantics strict` a plan of single nodes is priced by the layers its nodes belong to
    (`engine_of`: search unit -> engine units; a node TensorRT folds away costs nothing)."""

    def __init__(self, engine: Pricing, units: Mapping[str, Sequence[str]],
                 engine_of: Mapping[str, Sequence[str]] | None = None,
                 names: Mapping[str, str] | None = None) -> None:
        self.engine = engine
        self.search_units = {u: tuple(ns) for u, ns in units.items()}
        self.engine_of = ({u: tuple(v) for u, v in engine_of.items()} if engine_of is not None
                          else {u: (u,) for u in units})
        self.names = dict(names or {})
        self.adjacent = self._adjacency()
        self.gpu, self.tf32 = engine.gpu, engine.tf32

    def _adjacency(self) -> dict[str, tuple[str, ...]]:
        """Search units whose engine layers are adjacent (or the same layer)."""
        if all(v == (u,) for u, v in self.engine_of.items()):
            return {u: tuple(x for x in self.engine.adjacent.get(u, ()) if x in self.engine_of)
                    for u in self.search_units}
        holders: dict[str, list[str]] = {}
        for u, es in self.engine_of.items():
            for e in es:
                holders.setdefault(e, []).append(u)
        out = {}
        for u, es in self.engine_of.items():
            near = [e2 for e in es for e2 in (e, *self.engine.adjacent.get(e, ()))]
            out[u] = tuple(dict.fromkeys(v for e in near for v in holders.get(e, ()) if v != u))
        return out

    def layers(self, plan: Iterable[str]) -> frozenset[str]:
        """The engine layers a plan of search units keeps in FP32."""
        return frozenset(e for u in plan for e in self.engine_of.get(u, ()))

    def price(self, plan: Iterable[str]) -> float:
        return self.engine.price(self.layers(plan))

    def slowdown(self, plan: Iterable[str]) -> float:
        return self.engine.slowdown(self.layers(plan))

    def casts(self, plan: Iterable[str]) -> tuple[int, float]:
        return self.engine.casts(self.layers(plan))

    @property
    def fp16_s(self) -> float:
        return self.engine.fp16_s

    @property
    def fp32_s(self) -> float:
        return self.engine.fp32_s

    @property
    def unpriced(self) -> list[str]:
        return self.engine.unpriced

    def summary(self, plan: Sequence[str], objective: str = "cost", budget: float | None = None,
                low: str = "fp16") -> dict:
        """`Pricing.summary` of the plan's layers, each keyed by the TensorRT layer name the
        tables show, with the plan's nodes it holds."""
        nodes: dict[str, list[str]] = {}
        for u in plan:
            for e in self.engine_of.get(u, ()):
                nodes.setdefault(e, []).extend(self.search_units.get(u, (u,)))
        layers = [e for u in plan for e in self.engine_of.get(u, ())]
        out = self.engine.summary(layers, objective, budget, low, self.names, nodes)
        if self.unpriced and objective == "cost":
            out["objective"] = "count"
            out["fallback"] = ("--objective cost fell back to count: the cost model cannot price "
                               + "; ".join(self.unpriced))
        return out

    def record(self, plan: Sequence[str], objective: str = "cost",
               budget: float | None = None, low: str = "fp16") -> CostRecord:
        """The frozen record a result keeps (`CostRecord`): its `to_json` is `summary`'s."""
        return CostRecord.from_json(self.summary(plan, objective, budget, low))


def engine_pricing(graph: Graph, judged: Graph, prepared, units: Mapping[str, Sequence[str]],
                   sample: Mapping[str, np.ndarray], gpu: str = DEFAULT_GPU, tf32: bool = False,
                   probe_for: Callable[[Graph], Probe] | None = None) -> PlanPricing:
    """The run's prices over its search `units` of `judged`: the layers TensorRT is predicted
    to build from `graph` (the model as given), priced at the sample's shapes. `prepared`:
    the run's `semantics.Prepared`; `probe_for(g)`: a shape probe of graph g."""
    from ..judge import semantics

    if prepared is None or prepared.semantics == "trt":
        eg, eprep, eunits, engine_of = judged, prepared, units, None
    else:
        eg, eprep = semantics.prepare_graph(graph, "trt", prepared.trt_version)
        eunits = semantics.units(eprep, eg.candidates())
        layer_of = {n: e for e, ns in eunits.items() for n in ns}
        for original, carrier in eprep.renamed.items():  # absorbed into another node
            if carrier in layer_of:
                layer_of.setdefault(original, layer_of[carrier])
        engine_of = {u: tuple(dict.fromkeys(layer_of[n] for n in ns if n in layer_of))
                     for u, ns in units.items()}
    fused = semantics.fused_layer_names(eprep) if eprep is not None else {}
    names = {e: fused.get(ns[0], e) if len(ns) == 1 else e for e, ns in eunits.items()}
    engine = pricing_for(eg, eunits, sample, gpu, tf32,
                         probe_for(eg) if probe_for is not None else None)
    return PlanPricing(engine, units, engine_of, names)


def search_args(pricing: Pricing | PlanPricing, objective: str, budget: float | None = None,
                score: Callable[[frozenset[str]], float | None] | None = None) -> dict:
    """What `search.find_minimal_fp32` gets for the run's --objective and --budget PCT (None:
    no budget). A model the cost model cannot price wholly is searched by count
    (precision.json says so); a budget then cannot steer."""
    if objective not in ("cost", "count"):
        raise TrtBisectError(f"unknown objective {objective!r}: choose cost or count")
    if pricing.unpriced:
        return {}
    out: dict = {}
    if objective == "cost":
        out.update(price=pricing.price, adjacent=pricing.adjacent)
    if budget is not None:
        out.update(price=pricing.price, adjacent=pricing.adjacent,
                   limit=pricing.fp16_s * (1 + budget / 100) * (1 + EPS),
                   score=score or (lambda plan: None))
    return out


def score_trials(result, pricing: Pricing | PlanPricing,
                 score: Callable[[tuple[str, ...]], float | None],
                 why: Callable[[tuple[str, ...]], str | None] = lambda units: None) -> None:
    """Each evaluated plan with its price and its worst relative error (the trade-off plot's
    points): `score(units)` is what the evaluator measured for it, `why(units)` why it failed."""
    from dataclasses import replace

    result.trials = [replace(t, price=pricing.price(t.fp32), score=score(t.fp32),
                             why=None if t.passed else why(t.fp32))
                     for t in result.trials]


def within_budget(result, pricing: Pricing | PlanPricing, budget: float | None):
    """--budget PCT: the search's plan when its estimated slowdown against all-FP16 stays
    within PCT%; else the best plan evaluated within it (a passing one, the cheapest; else the
    one with the smallest error), returned as a new, uncertified result with `over_budget`
    set when it fails. None when the plan already fits (or there is no budget)."""
    from .minimal import SearchResult

    if budget is None or not result.found:
        return None
    limit = budget / 100 + EPS
    if pricing.slowdown(result.fp32) <= limit:
        return None
    inside = [t for t in result.trials if pricing.slowdown(t.fp32) <= limit]
    passing = [t for t in inside if t.passed]

    def err(t) -> float:
        return t.score if t.score is not None and t.score == t.score else math.inf

    best = (min(passing, key=lambda t: (pricing.price(t.fp32), t.index)) if passing else
            min(inside, key=lambda t: (err(t), pricing.price(t.fp32), t.index)))
    return SearchResult(list(best.fp32), True, False, result.evaluations, list(result.trials),
                        result.stopped_early, None, over_budget=not best.passed,
                        rounds=result.rounds, speculative=result.speculative)


def pricing_for(g: Graph, units: Mapping[str, Sequence[str]], sample: Mapping[str, np.ndarray],
                gpu: str = DEFAULT_GPU, tf32: bool = False, probe: Probe | None = None) -> Pricing:
    """The run's price list: shapes at the sample's own input shapes."""
    shapes = infer_shapes(g, sample, probe)
    taken = branches_taken(g, probe) if probe is not None else None
    return Pricing(g, units, shapes, gpu_class(gpu), tf32, taken)


def pct(x: float) -> str:
    """A share or slowdown as people read it."""
    if not math.isfinite(x):
        return str(x)
    return f"{100 * x:+.1f}%" if abs(x) >= 0.0005 else f"{100 * x:+.2g}%"


# ---------------------------------------------------------------- the price in tables

@dataclass(frozen=True)
class PlanUnitCost:
    """One FP32 unit of the plan in `CostRecord.units`: its low-precision time, its time
    kept FP32 in this plan, its share of all-low's time, and the plan's nodes it holds."""
    fp16_s: float
    fp32_s: float
    share: float
    nodes: list[str]

    def to_json(self) -> dict:
        return {"fp16_s": self.fp16_s, "fp32_s": self.fp32_s, "share": self.share,
                "nodes": list(self.nodes)}

    @classmethod
    def from_json(cls, d: Mapping) -> PlanUnitCost:
        return cls(d["fp16_s"], d["fp32_s"], d["share"], list(d["nodes"]))


@dataclass(frozen=True)
class CostRecord:
    """The plan's estimated engine time (precision.json's "cost", `PlanPricing.summary`):
    all-low, the plan and all-FP32, the shares in FP32, the boundary Casts, each FP32 unit's
    share, what could not be priced, and the --budget."""
    gpu: str
    gpu_title: str
    gpu_source: str
    tf32: bool
    objective: str  # "count" where --objective cost fell back (`fallback` says why)
    model: str
    precision: str  # the run's low precision: "fp16", "bf16"
    all_low_s: float
    plan_s: float
    all_fp32_s: float
    slowdown: float
    fp32_flop_share: float
    fp32_byte_share: float
    boundary_casts: int
    boundary_casts_s: float
    boundary_casts_share: float
    units: dict[str, PlanUnitCost]  # TensorRT layer name -> its price
    plan_layers: int
    layers: int
    unknown_shapes: int
    unpriced: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    budget_pct: float | None = None  # --budget, in percent
    within_budget: bool | None = None
    fallback: str | None = None

    @property
    def low_label(self) -> str:
        return self.precision.upper()

    def to_json(self) -> dict:
        return {
            "gpu": self.gpu, "gpu_title": self.gpu_title, "gpu_source": self.gpu_source,
            "tf32": self.tf32, "objective": self.objective, "model": self.model,
            "precision": self.precision, "all_low_s": self.all_low_s,
            f"all_{self.precision}_s": self.all_low_s,
            "plan_s": self.plan_s, "all_fp32_s": self.all_fp32_s, "slowdown": self.slowdown,
            "fp32_flop_share": self.fp32_flop_share, "fp32_byte_share": self.fp32_byte_share,
            "boundary_casts": self.boundary_casts, "boundary_casts_s": self.boundary_casts_s,
            "boundary_casts_share": self.boundary_casts_share,
            "units": {k: u.to_json() for k, u in self.units.items()},
            "plan_layers": self.plan_layers, "layers": self.layers,
            "unknown_shapes": self.unknown_shapes,
            **({"unpriced": list(self.unpriced)} if self.unpriced else {}),
            **({"notes": list(self.notes)} if self.notes else {}),
            **({"budget_pct": self.budget_pct, "within_budget": self.within_budget}
               if self.budget_pct is not None else {}),
            **({"fallback": self.fallback} if self.fallback is not None else {}),
        }

    @classmethod
    def from_json(cls, d: Mapping) -> CostRecord:
        return cls(
            d["gpu"], d["gpu_title"], d["gpu_source"], d["tf32"], d["objective"], d["model"],
            d["precision"], d["all_low_s"], d["plan_s"], d["all_fp32_s"], d["slowdown"],
            d["fp32_flop_share"], d["fp32_byte_share"], d["boundary_casts"],
            d["boundary_casts_s"], d["boundary_casts_share"],
            {k: PlanUnitCost.from_json(u) for k, u in d["units"].items()}, d["plan_layers"],
            d["layers"], d["unknown_shapes"], list(d.get("unpriced") or []),
            list(d.get("notes") or []), d.get("budget_pct"), d.get("within_budget"),
            d.get("fallback"))


def cost_cells(c: CostRecord | None, rows: Sequence[tuple[str, str]]) -> list[str]:
    """The cost column of a table of the plan's nodes (`rows`: (node, TensorRT layer or "")
    in table order): each FP32 layer's share on the first row of its nodes, empty on the
    others; keyed as precision.json's "cost" "units" are (its `nodes` name the rows)."""
    units = c.units if c is not None else {}
    unit_of: dict[str, str] = {}
    for key, u in units.items():
        for n in u.nodes:
            unit_of.setdefault(n, key)
    out, shown = [], set()
    for node, layer in rows:
        key = unit_of.get(node) or (layer if layer in units else node)
        out.append("" if key in shown or key not in units else pct(units[key].share))
        shown.add(key)
    return out


def boundary_row(c: CostRecord | None) -> tuple[str, str] | None:
    """The boundary Casts' row of the same table: (cost, why), or None (no price)."""
    if c is None:
        return None
    low = c.low_label
    return (pct(float(c.boundary_casts_share)),
            f"{c.boundary_casts} Cast(s) between {low} and FP32 layers (the {low} layers' "
            "wider reads of FP32 values)")


def cost_sentence(c: CostRecord, markup: bool = False) -> str:
    """The plan's price in one line (console and report alike)."""
    low = c.low_label
    budget = ""
    if c.budget_pct is not None:
        over = "[red]over[/]" if markup else "over"
        budget = f"; {'within' if c.within_budget else over} the {c.budget_pct:g}% budget"
    layers = f"; the plan keeps {c.plan_layers} of {c.layers} TensorRT layers in FP32"
    return (f"all {low} {1e6 * c.all_low_s:.4g} us, the plan "
            f"{1e6 * c.plan_s:.4g} us ({pct(c.slowdown)}), all FP32 "
            f"{1e6 * c.all_fp32_s:.4g} us; FP32 share {100 * c.fp32_flop_share:.1f}% of "
            f"FLOPs, {100 * c.fp32_byte_share:.1f}% of bytes; {c.boundary_casts} boundary "
            f"Casts{layers}{budget}")
