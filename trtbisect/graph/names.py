"""The names trtbisect gives nodes: a top-level node's own (or `<op_type>_<i>`), a
subgraph node's qualified by its holders (`If_3[then_branch]/Mul_0`), every node in one
flat list (`flatten`); names that are not UTF-8 refused up front."""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from ..errors import TrtBisectError
from .control_flow import subgraphs, walk, walk_graphs


def check_names(model: onnx.ModelProto) -> None:
    """Names that are not valid UTF-8 (protobuf hands them over as bytes) cannot be rendered
    into a plan, a command line or a mixed model: refuse them up front."""
    names: list = []
    for g in walk_graphs(model.graph):
        values = [*g.input, *g.output, *g.value_info, *g.initializer]
        names += [v.name for v in values] + [g.name]
        for node in g.node:
            names += [node.name, node.op_type, node.domain, *node.input, *node.output]
    for f in model.functions:
        names += [f.name, f.domain, *f.input, *f.output]
        for node in walk(f.node):
            names += [node.name, node.op_type, node.domain, *node.input, *node.output]
    bad = next((n for n in names if not isinstance(n, str)), None)
    if bad is not None:
        raise TrtBisectError(f"the model holds a name that is not valid UTF-8 ({bad!r}); "
                             "rename it (ONNX requires UTF-8 strings)")


def node_names(model: onnx.ModelProto) -> list[str]:
    """The name trtbisect uses for each node, in `flatten`'s order (graph.node first).

    A top-level node's own name, or `<op_type>_<i>` (i: its position) when it has none; a name
    used twice gets `_<i>` appended to its later uses so that every plan entry names exactly one
    node. A node inside a subgraph gets a qualified name (`qualified_name`).
    """
    return flatten(model).names


def qualified_name(holder: str, attr: str, own: str) -> str:
    """The name of a node inside a subgraph: its holder's name, the attribute in brackets, then
    its own name: `If_3[then_branch]/Mul_0`, `/model/If[else_branch]/model/rnn/LSTM`.

    Idempotent: a name that already starts with `holder[attr]` (a file trtbisect wrote) is kept,
    so a written model reads back with the same names.
    """
    prefix = f"{holder}[{attr}]"
    if own.startswith(prefix):
        return own
    return prefix + ("" if own.startswith("/") else "/") + own


@dataclass(frozen=True)
class Flat:
    """Every node of a model, subgraphs included, with the names trtbisect gives them.

    `nodes[:top]` is graph.node in order; the nodes of subgraphs follow, each graph's nodes
    together (holders in graph order, depth first). `where[i]` is None for a top-level node,
    else (holder's index, attribute, position in that graph). `order` lists every index in
    execution order: a holder, then the nodes of its subgraphs. `own[i]`: the node's name
    without its qualification (what the exporter called it).
    """

    nodes: list[onnx.NodeProto]
    names: list[str]
    where: list[tuple[int, str, int] | None]
    order: list[int]
    own: list[str]
    top: int


def flatten(model: onnx.ModelProto) -> Flat:
    nodes = list(model.graph.node)
    names: list[str] = []
    seen: set[str] = set()
    for i, node in enumerate(nodes):
        name = node.name or f"{node.op_type}_{i}"
        if name in seen:
            name = f"{name}_{i}"
        seen.add(name)
        names.append(name)
    where: list[tuple[int, str, int] | None] = [None] * len(nodes)
    own = list(names)
    children: dict[int, list[int]] = {}

    def add_bodies(i: int) -> None:
        kids: list[int] = []
        for attr, body in subgraphs(nodes[i]):
            prefix = f"{names[i]}[{attr}]"
            for p, node in enumerate(body.node):
                j = len(nodes)
                mine = node.name or f"{node.op_type}_{p}"
                name = qualified_name(names[i], attr, mine)
                if name in seen:
                    name = f"{name}_{j}"
                seen.add(name)
                nodes.append(node)
                names.append(name)
                where.append((i, attr, p))
                own.append(mine[len(prefix):] if mine.startswith(prefix) else mine)
                kids.append(j)
        children[i] = kids
        for j in kids:
            if subgraphs(nodes[j]):
                add_bodies(j)

    top = len(nodes)
    for i in range(top):
        if subgraphs(nodes[i]):
            add_bodies(i)
    order: list[int] = []

    def visit(i: int) -> None:
        order.append(i)
        for j in children.get(i, ()):
            visit(j)

    for i in range(top):
        visit(i)
    return Flat(nodes, names, where, order, own, top)


def with_node_names(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose nodes, subgraphs' included, carry the names trtbisect uses (so TensorRT
    layers get them too)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    flat = flatten(out)
    for node, name in zip(flat.nodes, flat.names):
        node.name = name
    return out


def named_as_trtbisect_names(model: onnx.ModelProto) -> bool:
    """Does every node of the model (subgraphs' too) already carry trtbisect's name for it?"""
    flat = flatten(model)
    return all(n.name == name for n, name in zip(flat.nodes, flat.names))
