"""Estimated engine time of a quantized plan, priced like cost.py prices an FP16 one: a
roofline `max(FLOPs / peak, bytes / bandwidth)` per node on the run's GPU class.

* a quantized weighted layer (Conv, ConvTranspose, MatMul, Gemm with DQ'd inputs, rule R2)
  computes at its format's dense tensor-core peak (cost.py `QUANT_PEAKS`) and reads its
  quantized inputs at 1 byte per element;
* another quantized layer (R3: an Add, a pooling) moves its quantized inputs at 1 byte;
* every other node computes in the file's float type: FP16 (the tensor-core peak for math,
  2 bytes per element) in a file FP16 elsewhere, FP32 (CUDA cores, 4 bytes) in one FP32
  elsewhere, as TensorRT builds a strongly typed network; an FP16 node the plan keeps in FP32
  costs FP32;
* the all-FP16 engine prices every node in FP16, Q/DQ removed.
Q/DQ nodes are taken as fused into their layers (no time of their own), and a Q/DQ pair left
for another reader of a tensor a plan un-quantizes is not priced: an estimate, stated in
docs/quantization.md with its limits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np
import onnx

from ..cost import (GPUS, MATH_OPS, NO_DATA_OPS, VIEW_OPS, gpu_class, infer_shapes, node_flops,
                    quantized_peak)
from ..graph import Graph
from .qdq import DQ, Q, WEIGHTED, Layer

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
class QuantPricing:
    gpu: str
    fmt: str  # int8 | fp8: the peak quantized layers run at
    half_file: bool
    nodes: list[_Node] = field(default_factory=list)
    layer_of: dict[str, str] = field(default_factory=dict)  # node -> its quantized layer
    half_units: dict[str, str] = field(default_factory=dict)  # unit -> FP16 node

    def _time(self, n: _Node, prec: str) -> float:
        g = GPUS[self.gpu]
        if prec == "q":
            peak, bytes_ = quantized_peak(self.gpu, self.fmt), (n.quantized_in + n.float_in
                                                                + 2 * n.out)
            if n.op not in WEIGHTED:
                peak = 0.0
            # float outputs of a quantized layer are written in the float type (FP16)
        else:
            size = FLOAT_BYTES[prec]
            peak = g.fp16_tensor if prec == "fp16" else g.fp32
            bytes_ = size * (n.quantized_in + n.float_in + n.out)
        compute = n.flops / peak if (n.flops and peak) else 0.0
        return max(compute, bytes_ / g.bandwidth)

    def price(self, units: Iterable[str]) -> float:
        """Estimated seconds of the engine with `units` (layers un-quantized, FP16 nodes in
        FP32) applied to the file."""
        chosen = set(units)
        fp32_nodes = {n for u, n in self.half_units.items() if u in chosen}
        base = "fp16" if self.half_file else "fp32"
        total = 0.0
        for n in self.nodes:
            layer = self.layer_of.get(n.name)
            if layer is not None and layer not in chosen:
                total += self._time(n, "q")
            else:
                total += self._time(n, "fp32" if n.name in fp32_nodes else base)
        return total

    def all_fp16(self) -> float:
        return sum(self._time(n, "fp16") for n in self.nodes)

    def summary(self, units: Sequence[str]) -> dict:
        plan, quantized, fp16 = self.price(units), self.price(()), self.all_fp16()
        return {"gpu": self.gpu, "title": gpu_class(self.gpu).title, "format": self.fmt,
                "all_fp16_s": fp16, "all_quantized_s": quantized, "plan_s": plan,
                "plan_vs_all_quantized": plan / quantized - 1 if quantized else None,
                "plan_vs_all_fp16": plan / fp16 - 1 if fp16 else None}


def _shapes(model: onnx.ModelProto, sample: Mapping[str, np.ndarray]) -> dict[str, tuple]:
    """Static shapes at the sample's input shapes (cost.infer_shapes, the FP16 pricing's)."""
    return dict(infer_shapes(Graph(model), sample))


def pricing_for(model: onnx.ModelProto, layers: Sequence[Layer], half_units: Mapping[str, str],
                sample: Mapping[str, np.ndarray], gpu: str, half_file: bool) -> QuantPricing:
    """Per node of the file: FLOPs and elements at this sample's shapes."""
    shapes = _shapes(model, sample)
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
    return out
