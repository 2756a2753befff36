"""What every rewrite shares: its record types, a read-only view of a model, and an editor.

A rewrite never mutates the model it is given: `Editor` works on a copy and re-sorts the
nodes topologically, so a rule only says which nodes go and which come.
"""

from __future__ import annotations

import contextlib
import heapq
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..graph import data_flow, node_names, structure

FP16_MAX = 65504.0
FP16_MIN_NORMAL = 2.0**-14
# Value-preserving ops a scalar or mask may flow through without being computed on.
LAYOUT_OPS = frozenset({"Cast", "Unsqueeze", "Squeeze", "Reshape", "Expand", "Transpose",
                        "Concat", "Tile", "Slice", "Identity", "Flatten"})

Ranges = Callable[[str], "float | None"]  # FP32 max|value| of a tensor over the samples


class RewriteRefused(Exception):
    """Raised inside `apply` when a precondition only shows while rewriting (e.g. the opset)."""


@dataclass(frozen=True)
class Match:
    """One place a rewrite applies; `params` holds what `apply` needs, by tensor name."""

    rewrite: str
    where: tuple[str, ...]  # trtbisect node names of the matched nodes
    why: str
    params: Mapping[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Refusal:
    """A near miss: the pattern is there but a precondition fails, and why."""

    rewrite: str
    where: tuple[str, ...]
    reason: str

    def to_json(self) -> dict:
        return {"rewrite": self.rewrite, "where": list(self.where), "reason": self.reason}


@dataclass(frozen=True)
class Rewrite:
    """A named FP16-safe transformation.

    `find(model, ranges)` lists matches and near misses; `ranges` gives the FP32 max|value|
    of a tensor over the samples (None: no samples), which rules that choose a scale need.
    `apply(model, match)` returns a rewritten copy or raises RewriteRefused.
    """

    name: str
    find: Callable[[onnx.ModelProto, Ranges | None], list[Match | Refusal]]
    apply: Callable[[onnx.ModelProto, Match], onnx.ModelProto]
    summary: str
    exact: str  # how the FP32 result changes: "exact", "rounding", "data-dependent"
    advice: str  # what to change in the PyTorch source so the export needs no rewrite
    patterns: tuple[str, ...] = ()  # diagnose.py patterns this rewrite addresses


def opset_of(model: onnx.ModelProto) -> int:
    """The model's default-domain opset."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


class View:
    """Producers, consumers, constants and shapes of a model (read only)."""

    _shared: View | None = None  # while `shared` lasts: the one View of its model

    @classmethod
    @contextlib.contextmanager
    def shared(cls, model: onnx.ModelProto) -> Iterator[View]:
        """Within: `View.of(model)` is one View (the finders of every rule read the same,
        unchanged model; a View of a 20k-node model costs 0.2 s)."""
        outer, cls._shared = cls._shared, cls(model)
        try:
            yield cls._shared
        finally:
            cls._shared = outer

    @classmethod
    def of(cls, model: onnx.ModelProto) -> View:
        shared = cls._shared
        return shared if shared is not None and shared.model is model else cls(model)

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.nodes = list(model.graph.node)
        self.names = node_names(model)
        self.inits = {t.name: t for t in model.graph.initializer}
        self.graph_outputs = {v.name for v in model.graph.output}
        self.producer, self.consumers = data_flow(self.nodes)
        self._shapes: dict[str, list[int | None]] | None = None

    @property
    def opset(self) -> int:
        return opset_of(self.model)

    def prod(self, tensor: str) -> onnx.NodeProto | None:
        i = self.producer.get(tensor)
        return None if i is None else self.nodes[i]

    def made(self, tensor: str) -> onnx.NodeProto:
        """The node producing `tensor`, which a rule's match found (a bug if none)."""
        node = self.prod(tensor)
        if node is None:
            raise ValueError(f"no node produces {tensor!r}: the match is stale")
        return node

    def users(self, tensor: str) -> list[onnx.NodeProto]:
        return [self.nodes[i] for i in self.consumers.get(tensor, [])]

    def name(self, node: onnx.NodeProto) -> str:
        return self.names[self.producer[node.output[0]]]

    def user_names(self, tensor: str) -> list[str]:
        return [self.names[i] for i in self.consumers.get(tensor, [])]

    def only_user(self, tensor: str) -> onnx.NodeProto | None:
        """The single consumer of a tensor that is not a graph output, else None."""
        users = self.users(tensor)
        if len(users) != 1 or tensor in self.graph_outputs:
            return None
        return users[0]

    def const(self, tensor: str) -> np.ndarray | None:
        """The value of an initializer or a Constant node's output."""
        if tensor in self.inits:
            return numpy_helper.to_array(self.inits[tensor])
        node = self.prod(tensor)
        if node is None or node.op_type != "Constant":
            return None
        for a in node.attribute:
            if a.name == "value":
                return numpy_helper.to_array(a.t)
            if a.name in ("value_float", "value_int"):
                return np.array(helper.get_attribute_value(a))
            if a.name in ("value_floats", "value_ints"):
                return np.array(list(helper.get_attribute_value(a)))
        return None

    def scalar(self, tensor: str) -> float | None:
        arr = self.const(tensor)
        if arr is None or arr.size != 1 or arr.dtype.kind != "f":
            return None
        return float(arr.reshape(-1)[0])

    def static(self, tensor: str, depth: int = 3) -> np.ndarray | None:
        """A constant, or an elementwise Add/Sub/Mul (or layout op) of constants."""
        arr = self.const(tensor)
        node = self.prod(tensor)
        if arr is not None or node is None or depth == 0:
            return arr
        if node.op_type in ("Add", "Sub", "Mul"):
            a, b = (self.static(t, depth - 1) for t in node.input[:2])
            if a is None or b is None:
                return None
            return {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}[node.op_type](a, b)
        if node.op_type in ("Unsqueeze", "Reshape", "Cast", "Identity"):
            return self.static(node.input[0], depth - 1)
        return None

    def shape(self, tensor: str) -> list[int | None] | None:
        if self._shapes is None:
            self._shapes = _infer_shapes(self.model)
        return self._shapes.get(tensor)

    def rank(self, tensor: str) -> int | None:
        s = self.shape(tensor)
        return None if s is None else len(s)

    def reduce_axes(self, node: onnx.NodeProto) -> list[int] | None:
        """A Reduce* node's axes (attribute before opset 18 / 13 for ReduceSum, else input);
        None when they are not constant; [] when the node reduces every axis."""
        for a in node.attribute:
            if a.name == "axes":
                return list(a.ints)
        if len(node.input) > 1 and node.input[1]:
            arr = self.const(node.input[1])
            return None if arr is None else [int(v) for v in arr.reshape(-1)]
        return []

    def attr(self, node: onnx.NodeProto, name: str, default: Any = None) -> Any:
        for a in node.attribute:
            if a.name == name:
                return helper.get_attribute_value(a)
        return default


def _infer_shapes(model: onnx.ModelProto) -> dict[str, list[int | None]]:
    try:  # on the weight-free structure: never serialize the weights for it
        inferred = onnx.shape_inference.infer_shapes(structure(model), data_prop=True)
    except Exception:  # best effort: rules that need a shape refuse without one
        inferred = model
    out: dict[str, list[int | None]] = {}
    g = inferred.graph
    for v in [*g.input, *g.value_info, *g.output]:
        t = v.type.tensor_type
        if v.type.HasField("tensor_type") and t.HasField("shape"):
            out[v.name] = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
    for init in g.initializer:
        out[init.name] = list(init.dims)
    return out


def square_of(view: View, node: onnx.NodeProto) -> str | None:
    """The tensor x when the node computes x*x or Pow(x, 2), else None."""
    if node.op_type == "Mul" and len(node.input) == 2 and node.input[0] == node.input[1]:
        return node.input[0]
    if node.op_type == "Pow" and view.scalar(node.input[1]) == 2.0:
        return node.input[0]
    return None


def normalized_axes(axes: Sequence[int], rank: int | None) -> list[int] | None:
    if rank is None:
        return None if any(a >= 0 for a in axes) else sorted(axes)
    return sorted(a % rank for a in axes) if axes else list(range(rank))


class Editor:
    """A copy of a model to which a rule removes and adds nodes and constants."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = onnx.ModelProto()
        self.model.CopyFrom(model)
        self.view = View(self.model)
        self._taken = {t for n in self.model.graph.node for t in [*n.input, *n.output, n.name]}
        self._taken |= set(self.view.inits) | {v.name for v in self.model.graph.input}
        self._drop: set[int] = set()
        self._add: list[tuple[float, onnx.NodeProto]] = []

    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self._taken:
            k += 1
            name = f"{base}_{k}"
        self._taken.add(name)
        return name

    def constant(self, base: str, value: np.ndarray | float) -> str:
        name = self.fresh(base)
        arr = np.asarray(value, dtype=np.float32) if isinstance(value, float) else value
        self.model.graph.initializer.append(numpy_helper.from_array(arr, name))
        return name

    def node_at(self, tensor: str) -> int:
        return self.view.producer[tensor]

    def drop(self, *tensors: str) -> None:
        """Remove the nodes that produce these tensors."""
        self._drop.update(self.view.producer[t] for t in tensors)

    def add(self, after: str | None, op: str, inputs: Sequence[str], outputs: Sequence[str],
            name: str, **attrs: Any) -> onnx.NodeProto:
        """A new node, placed after the producer of `after` (None: at the start)."""
        pos = -0.5 if after is None else self.view.producer.get(after, -1) + 0.5
        node = helper.make_node(op, list(inputs), list(outputs), name=self.fresh(name), **attrs)
        self._add.append((pos + len(self._add) * 1e-6, node))
        return node

    def replace_input(self, tensor_of_node: str, old: str, new: str) -> None:
        node = self.model.graph.node[self.view.producer[tensor_of_node]]
        for k, t in enumerate(node.input):
            if t == old:
                node.input[k] = new

    def finish(self) -> onnx.ModelProto:
        kept = [(float(i), n) for i, n in enumerate(self.model.graph.node) if i not in self._drop]
        ordered = _topological([*kept, *self._add])
        del self.model.graph.node[:]
        self.model.graph.node.extend(ordered)
        _drop_unused_initializers(self.model)
        onnx.checker.check_model(self.model)
        return self.model


def _topological(nodes: list[tuple[float, onnx.NodeProto]]) -> list[onnx.NodeProto]:
    """Nodes in an order where producers come first, keeping the given order where possible."""
    producer = {t: k for k, (_, n) in enumerate(nodes) for t in n.output if t}
    waiting = [sum(1 for t in set(n.input) if t in producer) for _, n in nodes]
    users: dict[int, list[int]] = defaultdict(list)
    for k, (_, n) in enumerate(nodes):
        for t in set(n.input):
            if t in producer:
                users[producer[t]].append(k)
    heap = [(pos, k) for k, (pos, _) in enumerate(nodes) if waiting[k] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        _, k = heapq.heappop(heap)
        out.append(nodes[k][1])
        for u in users[k]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(heap, (nodes[u][0], u))
    if len(out) != len(nodes):
        raise RewriteRefused("the rewritten graph has a cycle")
    return out


def _drop_unused_initializers(model: onnx.ModelProto) -> None:
    """Forget constants nothing reads any more (never one listed as a graph input)."""
    used = {t for n in model.graph.node for t in n.input} | {v.name for v in model.graph.output}
    used |= {v.name for v in model.graph.input}
    keep = [t for t in model.graph.initializer if t.name in used]
    if len(keep) != len(model.graph.initializer):
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)


@dataclass
class NormTail:
    """What follows Sqrt(variance + eps) in a decomposed norm, in any of the forms exporters
    write: x / sqrt(v) (TorchScript), x * Reciprocal(sqrt(v)) (torch.rsqrt: Hugging Face's
    RMSNorm, nn.RMSNorm through the dynamo exporter), x * Div(1, sqrt(v)), and
    (w * x) / sqrt(v) with a constant w (a weight applied first)."""

    nodes: list[onnx.NodeProto]  # the nodes after Sqrt (and the w * x Mul), in data order
    numerator: onnx.NodeProto  # the node that reads x: the Div, the Mul, or the w * x Mul
    out: str  # the normalised (and, for w * x, scaled) value
    weight: str | None = None  # w's tensor when w * x comes first


def norm_tail(view: View, sqrt: onnx.NodeProto, x: str) -> NormTail | str:
    """The tail that divides x by `sqrt`'s output, or why there is none."""
    s = sqrt.output[0]
    u = view.only_user(s)
    if u is None:
        return "sqrt(variance + eps) is used by more than one node"
    if u.op_type == "Div" and list(u.input) == [x, s]:
        return NormTail([u], u, u.output[0])
    if u.op_type == "Div" and u.input[1] == s:
        pre = view.prod(u.input[0])
        w = _other(pre, x) if pre is not None and pre.op_type == "Mul" else None
        if pre is not None and w is not None and view.const(w) is not None \
                and view.only_user(pre.output[0]) is u:
            return NormTail([pre, u], pre, u.output[0], w)
        if u.input[0] != x and view.scalar(u.input[0]) == 1.0:
            return _times_x(view, [u], x)
        return "the Div after Sqrt divides neither x nor a constant times x"
    if u.op_type == "Reciprocal":
        return _times_x(view, [u], x)
    return (f"sqrt(variance + eps) feeds {u.op_type}, not a Div of x, a Reciprocal or "
            "Div(1, .) times x")


def _other(node: onnx.NodeProto, x: str) -> str | None:
    """The other input of a two-input node that reads x once."""
    if len(node.input) != 2 or list(node.input).count(x) != 1:
        return None
    return node.input[1] if node.input[0] == x else node.input[0]


def _times_x(view: View, nodes: list[onnx.NodeProto], x: str) -> NormTail | str:
    """1/sqrt(v) (the last of `nodes`) multiplied by x."""
    inv = nodes[-1].output[0]
    mul = view.only_user(inv)
    if mul is None or mul.op_type != "Mul" or sorted(mul.input) != sorted([x, inv]):
        return "1/sqrt(variance + eps) is not multiplied by x alone"
    return NormTail([*nodes, mul], mul, mul.output[0])
