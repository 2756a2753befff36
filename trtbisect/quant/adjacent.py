"""The quantized search's neighbours: units joined by a tensor, as the FP16 run's `adjacent`
(search/cost.py `_adjacency`) joins its units.

A unit is a quantized layer (its compute node), an FP16 node kept in FP32, or a fused FP16
layer (judge.py `units`). Two units are adjacent when a tensor one writes reaches the other,
through the Q/DQ nodes between them (the quantized edges every layer boundary has) and at most
one other node no plan switches (a Cast, a Reshape). A layer and the FP32 unit of its own node
are adjacent too. The cost search swaps a unit of its plan for a cheaper neighbour
(search/minimal.py `swap_neighbourhood`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx

from .qdq import DQ, Q

PASS_THROUGH = frozenset({Q, DQ})  # crossed at no charge: every layer boundary has them


def unit_adjacency(model: onnx.ModelProto, units: Mapping[str, Sequence[str]]
                   ) -> dict[str, tuple[str, ...]]:
    """`units`: unit -> its nodes. Returns unit -> the adjacent units, in `units`' order."""
    nodes = {n.name: n for n in model.graph.node}
    producer = {t: n.name for n in model.graph.node for t in n.output if t}
    consumers: dict[str, list[str]] = {}
    for n in model.graph.node:
        for t in dict.fromkeys(n.input):
            if t:
                consumers.setdefault(t, []).append(n.name)
    owners: dict[str, list[str]] = {}
    for u, ns in units.items():
        for n in ns:
            owners.setdefault(n, []).append(u)

    def touching(name: str) -> list[str]:
        node = nodes[name]
        up = [producer[t] for t in node.input if t in producer]
        down = [c for t in node.output if t for c in consumers.get(t, ())]
        return [*up, *down]

    order = {u: i for i, u in enumerate(units)}
    out: dict[str, tuple[str, ...]] = {}
    for u, ns in units.items():
        near: set[str] = {v for n in ns for v in owners.get(n, ()) if v != u}
        seen = {n: 2 for n in ns}  # node -> the most spare crossings it was reached with
        frontier = [(m, 1) for n in ns if n in nodes for m in touching(n)]
        while frontier:
            name, spare = frontier.pop()
            if seen.get(name, -1) >= spare:
                continue
            seen[name] = spare
            if name in owners:
                near.update(v for v in owners[name] if v != u)
                continue
            if nodes[name].op_type in PASS_THROUGH:
                frontier.extend((m, spare) for m in touching(name))
            elif spare:
                frontier.extend((m, spare - 1) for m in touching(name))
        out[u] = tuple(sorted(near, key=order.__getitem__))
    return out
