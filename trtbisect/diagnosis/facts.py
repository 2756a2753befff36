"""The graph with its layer-wise and constant statistics: what detection reads.

Pure: numpy and onnx only, no runtime.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from ..graph import Graph
from ..judge.compare import TensorStats
from ..judge.precision import FP16, Precision
from ..search.prior import ConstantStats

# Nodes that only move data: culprits joined through them are one group, and a constant read
# through them is still that constant.
LAYOUT_OPS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity",
                        "Cast", "CastLike", "Expand", "Slice", "Gather", "Concat", "Split",
                        "Tile"})
# Names and numbers only: an identifier, a count, a value (never a sentence).
Evidence = dict[str, "float | int | str | None"]


class Facts:
    """The graph with its layer-wise and constant statistics, and the walks diagnosis needs."""

    def __init__(self, g: Graph, stats: Mapping[str, TensorStats],
                 constants: Mapping[str, ConstantStats], precision: Precision = FP16) -> None:
        self.g, self.stats, self.constants = g, stats, constants
        self.p = precision  # the low precision the statistics compare FP32 with
        # how to loosen the run's criterion (diagnose.relax_words; "": it would not help)
        self.relax = ("if the outputs' error is acceptable, raise --rtol or judge by what the "
                      "task needs (--metric, --check-error-stat): the plan would need fewer "
                      "FP32 nodes")
        self._arrays: dict[str, np.ndarray | None] = {}

    def op(self, node: str) -> str:
        return self.g.node(node).op_type

    def producer(self, tensor: str) -> str | None:
        i = self.g.producer.get(tensor)
        return None if i is None else self.g.names[i]

    def consumers(self, tensor: str) -> list[str]:
        return [self.g.names[i] for i in self.g.consumers.get(tensor, [])]

    def successors(self, node: str) -> list[str]:
        return [c for t in self.g.node(node).output for c in self.consumers(t)]

    def absmax(self, tensor: str) -> float:
        s = self.stats.get(tensor)
        if s is not None:
            return s.fp32_absmax
        hit = self.constant_at(tensor)
        return hit[1].absmax if hit is not None else 0.0

    def in_absmax(self, node: str) -> float:
        return max((self.absmax(t) for t in self.g.float_inputs(node)), default=0.0)

    def out_absmax(self, node: str) -> float:
        return max((self.absmax(t) for t in self.g.float_outputs(node)), default=0.0)

    def constant_source(self, tensor: str) -> str | None:
        """The initializer or Constant a tensor is, possibly through layout ops."""
        for _ in range(8):
            if tensor in self.constants or tensor in self.g.initializers:
                return tensor
            p = self.producer(tensor)
            if p is None or self.op(p) not in LAYOUT_OPS or not self.g.node(p).input:
                return None
            tensor = self.g.node(p).input[0]
        return None

    def constant_at(self, tensor: str) -> tuple[str, ConstantStats] | None:
        """The constant a tensor reads (through layout ops) with its range facts."""
        src = self.constant_source(tensor)
        c = self.constants.get(src) if src is not None else None
        return (src, c) if src is not None and c is not None else None

    def constant_array(self, name: str) -> np.ndarray | None:
        if name not in self._arrays:
            self._arrays[name] = _constant_array(self.g, name)
        return self._arrays[name]

    def constant_label(self, name: str) -> str:
        """An initializer by its name, a Constant output by its node's name (what Netron shows)."""
        p = self.producer(name)
        return p if p is not None and self.op(p) == "Constant" else name

    def scalar(self, tensor: str) -> float | None:
        src = self.constant_source(tensor)
        arr = self.constant_array(src) if src else None
        return float(arr.reshape(-1)[0]) if arr is not None and arr.size == 1 else None


def _constant_array(g: Graph, name: str) -> np.ndarray | None:
    if name in g.initializers:
        return g.array(name)
    i = g.producer.get(name)
    if i is None:
        return None
    for a in g.nodes[i].attribute:
        if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
            return numpy_helper.to_array(a.t)
        if a.name == "value_float":
            return np.array(a.f, np.float32)
    return None
