"""How often each node runs per inference on the analysed sample: the cost model prices a node
inside an If branch, a Loop or a Scan body as many times as it runs (docs/cost.md, "Control
flow and local functions"). Local functions need nothing here: `Graph` inlines them as
TensorRT's parser does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..graph import Graph, constant_value, subgraphs

Probe = Callable[[Sequence[str]], Mapping[str, tuple[int, ...]]]

HOLDERS = frozenset({"If", "Loop", "Scan"})  # they compute nothing: their bodies are priced


@dataclass(frozen=True)
class Flow:
    """How many times each node runs per inference on the analysed sample (`runs`, by index
    of `Graph.nodes`), what rule priced a body, and what could not be priced."""

    runs: list[float]
    notes: list[str]
    unpriced: list[str]


def _constant(g: Graph, t: str) -> np.ndarray | None:
    if not t:
        return None
    if t in g.initializers:
        try:
            return np.asarray(g.array(t))
        except Exception:  # an unreadable weight: unknown, not an error
            return None
    p = g.producer.get(t)
    if p is not None and g.nodes[p].op_type == "Constant":
        return constant_value(g.nodes[p])
    return None


def _loop_trips(g: Graph, i: int, shapes: Mapping[str, tuple[int, ...]]) -> int | None:
    """A Loop's trips: the length of a scan output, else its trip count M when the loop
    cannot stop early (no condition, or one the body passes through unchanged)."""
    node = g.nodes[i]
    carried = max(len(node.input) - 2, 0)
    for t in node.output[carried:]:
        if shapes.get(t):
            return int(shapes[t][0])
    m = _constant(g, node.input[0] if node.input else "")
    if m is None or m.size != 1:
        return None
    body = next(b for a, b in subgraphs(node) if a == "body")
    cond = node.input[1] if len(node.input) > 1 else ""
    start = _constant(g, cond)
    if cond and (start is None or not bool(start.reshape(-1)[0])):
        return None if start is None else 0
    cond_in, cond_out = body.input[1].name, body.output[0].name
    made = {o: n for n in body.node for o in n.output}
    keeps = cond_out == cond_in or (cond_out in made and made[cond_out].op_type == "Identity"
                                    and made[cond_out].input[0] == cond_in)
    return int(m.reshape(-1)[0]) if keeps else None


def _scan_trips(g: Graph, i: int, shapes: Mapping[str, tuple[int, ...]]) -> int | None:
    node = g.nodes[i]
    k = next((a.i for a in node.attribute if a.name == "num_scan_inputs"), 0)
    axes = next((list(a.ints) for a in node.attribute if a.name == "scan_input_axes"), [])
    if k < 1:
        return None
    first = node.input[len(node.input) - k]
    s = shapes.get(first)
    if s is None:
        return None
    axis = axes[0] if axes else 0
    return int(s[axis % len(s)]) if s else None


def node_runs(g: Graph, shapes: Mapping[str, tuple[int, ...]],
              taken: Mapping[tuple[int, str], bool] | None = None,
              dearer: Callable[[int, str], float] | None = None) -> Flow:
    """Runs per inference of every node: 1 at the top level; inside an If, the branch taken on
    the analysed sample (`taken`: (holder, attribute) -> bool) runs once and the other never,
    and where that is unknown the dearer branch (`dearer(holder, attribute)`: its estimated
    FP32 time) counts once; a Loop or Scan body runs its trip count on the analysed sample.
    A body whose trips are unknown is unpriced (runs 0) and said so."""
    taken = taken or {}
    factor: dict[tuple[int, str], float] = {}
    notes: list[str] = []
    unpriced: list[str] = []
    runs = [1.0] * len(g.nodes)
    for i in g.order:  # holders before the nodes of their bodies
        at = g.where[i]
        if at is not None:
            runs[i] = runs[at[0]] * factor.get((at[0], at[1]), 1.0)
        node = g.nodes[i]
        bodies = [a for a, _ in subgraphs(node)]
        if not bodies:
            continue
        name, ran = g.names[i], runs[i] > 0  # a holder that never runs says nothing
        if node.op_type == "If":
            known = {a: taken[(i, a)] for a in bodies if (i, a) in taken}
            if len(known) < len(bodies):
                cost = {a: dearer(i, a) if dearer else 0.0 for a in bodies}
                pick = max(bodies, key=lambda a: (cost[a], a == "then_branch"))
                known = {a: a == pick for a in bodies}
                if ran:
                    notes.append(f"If {name!r}: the branch taken on the analysed sample is "
                                 f"unknown; its dearer branch ({pick}) is priced")
            factor.update({(i, a): 1.0 if known[a] else 0.0 for a in bodies})
            continue
        trips = (_loop_trips(g, i, shapes) if node.op_type == "Loop" else
                 _scan_trips(g, i, shapes) if node.op_type == "Scan" else 1)
        if trips is None and ran:
            unpriced.append(f"the body of {node.op_type} {name!r} (its trip count on the "
                            "analysed sample is unknown)")
        factor.update({(i, a): float(trips or 0) for a in bodies})
    return Flow(runs, notes, unpriced)


def branches_taken(g: Graph, probe: Probe) -> dict[tuple[int, str], bool]:
    """Which If branches ran on the analysed sample: one value each branch makes, read off the
    FP32 reference (a branch not taken leaves an empty value)."""
    asked: dict[tuple[int, str], str] = {}
    for i, node in enumerate(g.nodes):
        if node.op_type != "If":
            continue
        for attr, _ in subgraphs(node):
            t = next((t for j in g.body_nodes(i, attr) for t in g.nodes[j].output
                      if g.is_float(t) and g.exposable(t)), None)
            if t is not None:
                asked[(i, attr)] = t
    if not asked:
        return {}
    try:
        got = probe(list(dict.fromkeys(asked.values())))
    except Exception:  # best effort: the dearer-branch rule then prices it
        return {}
    out: dict[tuple[int, str], bool] = {}
    for i in {i for i, _ in asked}:
        ran = {a: math.prod(got[t]) > 0 for (j, a), t in asked.items() if j == i and t in got}
        if sum(ran.values()) == 1:  # exactly one branch left a value: that one ran
            attrs = [a for a, _ in subgraphs(g.nodes[i])]
            out.update({(i, a): ran.get(a, False) for a in attrs})
    return out
