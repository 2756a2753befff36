"""What a precision plan costs in engine speed: a roofline estimate per TensorRT layer.

A plan keeps some units (fused TensorRT layers, or single nodes) in FP32. Each unit's time in
each precision is the roofline `max(FLOPs / peak, bytes / bandwidth)` on a GPU class whose
figures come from NVIDIA's datasheets (`GPUS`, with their addresses): MatMul, Gemm, Conv,
ConvTranspose and Attention run on the tensor cores (FP16, or TF32 with `--tf32`, else FP32 on
the CUDA cores); every other op moves its tensors at 2 or 4 bytes per float element. A fused
layer is priced as one: the tensors it keeps inside cost no memory traffic. Every tensor that
crosses an FP16/FP32 boundary under the plan costs a Cast (a read and a write), counted the
way the mixed-ONNX writer places them (one per tensor and target type). docs/cost.md states the
model, its sources and its limits.

No runtime here: the shapes come in (`infer_shapes`: ONNX shape inference on the run's own
sample shapes, so a dynamic model is priced at the shape it was analysed at), and the search
receives `Pricing.price`, a pure function of the plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from .errors import TrtBisectError
from .graph import PARAMETER_INPUTS, Graph, fp16_signature, structure

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
    shapes: Shapes = {t.name: tuple(int(d) for d in t.dims) for t in m.graph.initializer}
    for v in [*m.graph.input, *m.graph.value_info, *m.graph.output]:
        tt = v.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            shapes[v.name] = tuple(d.dim_value for d in tt.shape.dim)
    for node in m.graph.node:
        if node.op_type == "Constant" and node.output and node.output[0] not in shapes:
            for a in node.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    shapes[node.output[0]] = tuple(int(d) for d in a.t.dims)
    for name, arr in sample.items():
        shapes[name] = tuple(np.shape(arr))
    if probe is not None:
        # top-level tensors only: a value inside a Loop body has a shape per trip, which one
        # exposed (stacked) value does not give; such nodes are priced on what inference knows
        missing = [t for name, node in zip(g.names, g.nodes) if not g.is_inner(name)
                   for t in node.output if t and t not in shapes and g.is_float(t)]
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
    """One unit's work and its estimated time in each precision."""

    flops: float
    float_elements: int  # float elements it reads (weights included) and writes outside itself
    other_bytes: int  # non-float data it reads and writes (indices, shapes)
    fp16_s: float
    fp32_s: float

    @property
    def premium(self) -> float:
        """Seconds that keeping this unit in FP32 adds, boundary Casts aside."""
        return self.fp32_s - self.fp16_s


@dataclass(frozen=True)
class _Edge:
    """A float tensor that may cross a precision boundary: its producer side and consumer
    sides, each a unit name or a fixed precision (16 / 32)."""

    tensor: str
    elements: int
    producer: str | int
    consumers: tuple[str | int, ...]


class Pricing:
    """Estimated engine time of any plan over `units` (name -> nodes of `g`)."""

    def __init__(self, g: Graph, units: Mapping[str, Sequence[str]], shapes: Mapping[str, tuple],
                 gpu: GpuClass | str = DEFAULT_GPU, tf32: bool = False) -> None:
        self.gpu = gpu if isinstance(gpu, GpuClass) else gpu_class(gpu)
        self.tf32 = tf32
        self._nodes = list(g.nodes)  # every node, subgraphs' too; a list: protobuf indexes slowly
        self._node = dict(zip(g.names, self._nodes))
        self.units = {u: tuple(ns) for u, ns in units.items()}
        self.unit_of = {n: u for u, ns in self.units.items() for n in ns}
        self.unknown = sorted({t for n in self.unit_of
                               for t in [*self._node[n].input, *self._node[n].output]
                               if t and t not in shapes})
        self._shapes = shapes
        self.cost = {u: self._unit(g, ns) for u, ns in self.units.items()}
        self.fixed_s = self._fixed(g)
        self.edges = self._edges(g)
        self._by_unit: dict[str, list[int]] = {}
        for k, e in enumerate(self.edges):
            for side in {e.producer, *e.consumers}:
                if isinstance(side, str):
                    self._by_unit.setdefault(side, []).append(k)
        self.adjacent = self._adjacency(g)
        self._base_casts = sum(self._edge_casts(e, frozenset())[0] for e in self.edges)
        self.fp16_s = self.fixed_s + sum(c.fp16_s for c in self.cost.values()) + self._base_casts
        self._memo: dict[frozenset[str], float] = {}

    # ---- one unit

    def _elements(self, t: str) -> int:
        s = self._shapes.get(t)
        return _prod(s) if s is not None else 0

    def _unit(self, g: Graph, nodes: Sequence[str]) -> UnitCost:
        members = set(nodes)
        produced = {t for n in nodes for t in self._node[n].output if t}
        outputs = set(g.output_names())
        flops, floats, other = 0.0, 0, 0
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
                if t and (t in outputs or any(g.names[c] not in members
                                              for c in g.consumers.get(t, []))):
                    writes[t] = None
        partial = {self._node[n].input[0]: self._node[n].output[0] for n in nodes
                   if self._node[n].op_type in PARTIAL_READ_OPS and self._node[n].input}
        for t in {**reads, **writes}:
            count = self._elements(partial[t]) if t in partial else self._elements(t)
            if g.is_float(t):
                floats += count
            else:
                other += count * _itemsize(g.types.get(t, TensorProto.FLOAT))
        return UnitCost(flops, floats, other, self._roofline(flops, floats, other, 16),
                        self._roofline(flops, floats, other, 32))

    def _roofline(self, flops: float, floats: int, other: int, bits: int) -> float:
        peak = (self.gpu.fp16_tensor if bits == 16
                else self.gpu.tf32_tensor if self.tf32 else self.gpu.fp32)
        return max(flops / peak, (floats * FLOAT_BYTES[bits] + other) / self.gpu.bandwidth)

    def _fixed(self, g: Graph) -> float:
        """Nodes no plan switches (user Casts, ops without FP16 kernels): FP32, every plan."""
        total = 0.0
        for i, n in enumerate(g.names):
            node = self._nodes[i]
            if n in self.unit_of or node.op_type in NO_DATA_OPS | VIEW_OPS:
                continue
            floats = sum(self._elements(t) for t in [*node.input, *node.output] if g.is_float(t))
            other = sum(self._elements(t) * _itemsize(g.types.get(t, TensorProto.FLOAT))
                        for t in [*node.input, *node.output] if t and not g.is_float(t))
            total += self._roofline(node_flops(node, self._shapes), floats, other, 32)
        return total

    # ---- boundaries

    def _edges(self, g: Graph) -> list[_Edge]:
        """Every float activation whose reads may need a Cast, as mixed.py writes them: an FP16
        node reads its FP16 inputs in FP16 and everything else in FP32; other nodes read FP32
        (Cast, Shape and Size read what they are given); graph inputs and outputs keep their
        declared types. Weights and constants are converted at build time: no Cast."""
        constant = set(g.initializers)
        for node in self._nodes:
            if node.op_type == "Constant" or (node.input and all(not t or t in constant
                                                                  for t in node.input)):
                constant.update(t for t in node.output if t)
        declared = {v.name: (16 if g.declared.get(v.name) == TensorProto.FLOAT16 else 32)
                    for v in [*g.model.graph.input, *g.model.graph.output]}
        half_in = {n: self._fp16_inputs(g, n) for n in self.unit_of}
        edges = []
        tensors = [v.name for v in g.inputs()] + [t for node in self._nodes for t in node.output]
        for t in dict.fromkeys(tensors):
            if not t or not g.is_float(t) or t in constant:
                continue
            p = g.producer.get(t)
            producer: str | int = (declared.get(t, 32) if p is None
                                   else self.unit_of.get(g.names[p], 16 if t in g.half_typed else 32))
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
            if t in declared and p is not None:
                consumers.append(declared[t])
            if any(isinstance(s, str) for s in (producer, *consumers)):
                edges.append(_Edge(t, self._elements(t), producer, tuple(consumers)))
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

    def _edge_casts(self, e: _Edge, fp32: frozenset[str]) -> tuple[float, int]:
        """Seconds and count of the Casts one tensor needs under a plan."""
        def prec(side: str | int) -> int:
            return (32 if side in fp32 else 16) if isinstance(side, str) else side

        home = prec(e.producer)
        wants = {prec(c) for c in e.consumers} - {home}
        per = e.elements * (FLOAT_BYTES[home] + FLOAT_BYTES[32 if home == 16 else 16])
        return len(wants) * per / self.gpu.bandwidth, len(wants)

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
            extra = math.fsum(self.cost[u].premium for u in plan)
            touched = {k for u in plan for k in self._by_unit.get(u, ())}
            casts = math.fsum(self._edge_casts(self.edges[k], plan)[0]
                              - self._edge_casts(self.edges[k], frozenset())[0] for k in touched)
            if len(self._memo) > 1 << 16:
                self._memo.clear()
            self._memo[plan] = self.fp16_s + extra + casts
        return self._memo[plan]

    def casts(self, fp32_units: Iterable[str]) -> tuple[int, float]:
        """How many boundary Casts the plan's mixed model holds, and their seconds."""
        plan = frozenset(fp32_units)
        pairs = [self._edge_casts(e, plan) for e in self.edges]
        return sum(n for _, n in pairs), sum(s for s, _ in pairs)

    @property
    def fp32_s(self) -> float:
        return self.price(self.units)

    def slowdown(self, fp32_units: Iterable[str]) -> float:
        """The plan's estimated time over all-FP16's, minus one (0.05: 5% slower)."""
        return self.price(fp32_units) / self.fp16_s - 1 if self.fp16_s > 0 else 0.0

    def summary(self, fp32_units: Iterable[str], objective: str = "cost",
                budget: float | None = None) -> dict:
        """precision.json's "cost" entry (`budget`: --budget, in percent)."""
        plan = [u for u in dict.fromkeys(fp32_units) if u in self.cost]
        flops = sum(c.flops for c in self.cost.values())
        moved = sum(c.float_elements * 4 + c.other_bytes for c in self.cost.values())
        casts, cast_s = self.casts(plan)
        plan_s = self.price(plan)
        return {
            "gpu": self.gpu.name, "gpu_title": self.gpu.title, "gpu_source": self.gpu.source,
            "tf32": self.tf32, "objective": objective, "model": "roofline (docs/cost.md)",
            "all_fp16_s": self.fp16_s, "plan_s": plan_s, "all_fp32_s": self.fp32_s,
            "slowdown": self.slowdown(plan),
            "fp32_flop_share": sum(self.cost[u].flops for u in plan) / flops if flops else 0.0,
            "fp32_byte_share": (sum(self.cost[u].float_elements * 4 + self.cost[u].other_bytes
                                    for u in plan) / moved) if moved else 0.0,
            "boundary_casts": casts, "boundary_casts_s": cast_s,
            "units": {u: {"fp16_s": self.cost[u].fp16_s, "fp32_s": self.cost[u].fp32_s,
                          "share": self.share(u)} for u in plan},
            "unknown_shapes": len(self.unknown),
            **({"budget_pct": budget, "within_budget": self.slowdown(plan) <= budget / 100 + EPS}
               if budget is not None else {}),
        }

    def share(self, unit: str) -> float:
        """What keeping this unit alone in FP32 adds, as a fraction of all-FP16's time."""
        return self.cost[unit].premium / self.fp16_s if self.fp16_s > 0 else 0.0


# ---------------------------------------------------------------- the run's use of a price

def search_args(pricing: Pricing, options) -> dict:
    """What `search.find_minimal_fp32` gets for the run's --objective."""
    if options.objective == "count":
        return {}
    if options.objective != "cost":
        raise TrtBisectError(f"unknown objective {options.objective!r}: choose cost or count")
    return {"price": pricing.price, "adjacent": pricing.adjacent}


def score_trials(result, pricing: Pricing, score: Callable[[tuple[str, ...]], float | None]) -> None:
    """Each evaluated plan with its price and its worst relative error (the trade-off plot's
    points): `score(units)` is what the evaluator measured for it."""
    from dataclasses import replace

    result.trials = [replace(t, price=pricing.price(t.fp32), score=score(t.fp32))
                     for t in result.trials]


def within_budget(result, pricing: Pricing, budget: float | None):
    """--budget PCT: the search's plan when its estimated slowdown against all-FP16 stays
    within PCT%; else the best plan evaluated within it (a passing one, the cheapest; else the
    one with the smallest error), returned as a new, uncertified result with `over_budget`
    set when it fails. None when the plan already fits (or there is no budget)."""
    from .search import SearchResult

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
    return Pricing(g, units, infer_shapes(g, sample, probe), gpu_class(gpu), tf32)


def pct(x: float) -> str:
    """A share or slowdown as people read it."""
    if not math.isfinite(x):
        return str(x)
    return f"{100 * x:+.1f}%" if abs(x) >= 0.0005 else f"{100 * x:+.2g}%"
