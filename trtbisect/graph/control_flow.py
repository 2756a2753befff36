"""If, Loop and Scan: the graphs a node holds, walking them at any depth, what a node reads
through them from outer scopes, and the data flow (producers and consumers) that follows."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator

import onnx


def subgraphs(node: onnx.NodeProto) -> list[tuple[str, onnx.GraphProto]]:
    """The graphs a node holds, by attribute name: If's `then_branch` / `else_branch`, Loop's
    and Scan's `body` (a GRAPHS attribute's k-th graph is `<name>.<k>`)."""
    attributes = node.attribute
    if not attributes:  # most nodes: a run asks this of every node some hundred times
        return []
    out: list[tuple[str, onnx.GraphProto]] = []
    for a in attributes:
        kind = a.type
        if kind == _GRAPH:
            out.append((a.name, a.g))
        elif kind == _GRAPHS:
            out.extend((f"{a.name}.{k}", g) for k, g in enumerate(a.graphs))
    return out


_GRAPH, _GRAPHS = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS


def walk(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """Every node, and every node of their subgraphs (any depth)."""
    for n in nodes:
        yield n
        for _, g in subgraphs(n):
            yield from walk(g.node)


def walk_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """The graph and every subgraph inside it (any depth)."""
    yield graph
    for n in graph.node:
        for _, g in subgraphs(n):
            yield from walk_graphs(g)


def node_reads(node: onnx.NodeProto) -> list[str]:
    """The names a node reads: its inputs, and what its subgraphs take from outer scopes (a
    branch reading a weight of the main graph reads it through the If node)."""
    subs = [g for _, g in subgraphs(node)]
    if not subs:
        return list(dict.fromkeys(t for t in node.input if t))
    inner = list(walk(n for g in subs for n in g.node))
    own = {o for n in inner for o in n.output} | {
        v.name for s in subs for g in walk_graphs(s) for v in [*g.input, *g.initializer]}
    return list(dict.fromkeys([*(t for t in node.input if t),
                               *(t for n in inner for t in n.input if t and t not in own)]))


def data_flow(nodes) -> tuple[dict[str, int], dict[str, list[int]]]:
    """tensor -> index of the node that writes it, and -> indices of the nodes that read it."""
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = defaultdict(list)
    for i, node in enumerate(nodes):
        for t in node.output:
            if t:
                producer[t] = i
        for t in node_reads(node):  # a node holding subgraphs reads what they read outside
            consumers[t].append(i)
    return producer, consumers
