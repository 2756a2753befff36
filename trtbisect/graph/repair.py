"""trtbisect's own copy of an input model: what ONNX Runtime runs, in a form every copy the run
writes (mixed models, emulated graphs) can carry and onnx.checker accepts.

The user's file is never modified: `own_copy` changes the proto `load_model` read, which only
trtbisect holds. What it changes, and why (docs/input_models.md):

- sparse initializers are made dense (the copies rewrite initializers, not sparse ones), in
  the main graph and in every If branch and Loop/Scan body at any depth; a body's weight kept
  in external data moves to the main graph, where the weights store maps it;
- IR version < 4 becomes 4: there every initializer had to be a graph input, and ONNX Runtime
  takes them as constants; at IR >= 4 the copies may add weights (`W::fp16`) that are not;
- a graph input that also has an initializer (a default value) becomes the constant it holds,
  as TensorRT's ONNX parser takes it: it is no longer fed, used or unused;
- default-domain opset < 6 (a Cast's `to` was a string there, and ONNX Runtime has no kernel
  for it) and, under --precision bf16, opset < 13 (Cast took bfloat16 there) are converted by
  onnx's version converter;
- where the model fails onnx.checker: nodes sorted into execution order, an empty graph name
  filled in, graph outputs without a shape given the one shape inference finds, graph inputs
  without one given --shape's (or the first --inputs .npz's array's: `data.sources.npz_shapes`).

Nodes without a name are given trtbisect's names (`<op_type>_<i>`, by their place in the
user's file) before anything reorders or adds nodes, so the plan names the user's nodes.
"""

from __future__ import annotations

import heapq
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import TrtBisectError, first_line
from .control_flow import node_reads, subgraphs, walk_graphs
from .names import flatten
from .weights import structure

log = logging.getLogger(__name__)

CAST_INT_OPSET = 6  # Cast's `to` is an int from opset 6 on (and ONNX Runtime's Cast kernels)
DEFAULT_DOMAINS = ("", "ai.onnx")


def own_copy(model: onnx.ModelProto, path: Path, min_opset: int = 1,
             shapes: Mapping[str, Sequence[int]] | None = None,
             checker_error: str | None = None) -> tuple[onnx.ModelProto, list[str]]:
    """`model` (read from `path`, trtbisect's to change) made fit for the run's copies, and
    one short phrase per change. `checker_error`: what onnx.checker said of the file as given
    (None: it passed); the checker repairs run only then, and the copy must pass after them.
    """
    notes: list[str] = []
    if checker_error is not None:
        _name_unnamed(model)  # before anything reorders the nodes
        notes += _checker_repairs(model, path, shapes or {})
    notes += _dense_sparse(model)
    notes += _subgraph_defaults(model)  # before the hoist: a default is then no body input
    notes += _hoist_external(model, path)
    notes += _weights_not_inputs(model)
    notes += _convert_opset(model, path, max(min_opset, CAST_INT_OPSET))
    if checker_error is not None:
        try:
            onnx.checker.check_model(_checkable(model))
        except (onnx.checker.ValidationError, ValueError) as exc:
            raise TrtBisectError(f"{path} is not a valid ONNX model: {checker_error}") from exc
    return model, notes


def say(path: Path, notes: Sequence[str]) -> str:
    """The one line that tells the user what trtbisect changed in its copies."""
    return (f"{path.name}: trtbisect's copies {'; '.join(notes)} (the file itself is "
            "untouched)")


# ---------------------------------------------------------------- always

def _dense_sparse(model: onnx.ModelProto) -> list[str]:
    """Every graph's sparse initializers made dense: the main graph's and those of If branches
    and Loop/Scan bodies at any depth (a weight is a weight however the exporter stored it)."""
    if not any(g.sparse_initializer for g in walk_graphs(model.graph)):
        return []  # the common case, without naming every subgraph
    names = []
    for where, g in held_graphs(model):
        for sp in g.sparse_initializer:
            g.initializer.append(numpy_helper.from_array(densify(sp), sp.values.name))
            names.append(_located(sp.values.name, where))
        del g.sparse_initializer[:]
    return [f"hold sparse initializer(s) {_list(names, quoted=True)} dense"] if names else []


def held_graphs(model: onnx.ModelProto) -> list[tuple[str | None, onnx.GraphProto]]:
    """The main graph (None) and every subgraph at any depth, by where it lives: its holder's
    trtbisect name and the attribute (`loop[body]`, `outer[then_branch]/inner[else_branch]`).
    The protos are the model's own, to change in place."""
    out: list[tuple[str | None, onnx.GraphProto]] = [(None, model.graph)]
    flat = flatten(model)
    for node, name in zip(flat.nodes, flat.names):
        out.extend((f"{name}[{attr}]", g) for attr, g in subgraphs(node))
    return out


def _replace(field, kept: list) -> None:
    """A repeated message field made `kept` (some of its own elements), through copies: the
    elements are the field's own, which clearing it would take from under them."""
    copies = [type(m)() for m in kept]
    for c, m in zip(copies, kept):
        c.CopyFrom(m)
    del field[:]
    field.extend(copies)


def _located(name: str, where: str | None) -> str:
    return repr(name) if where is None else f"{name!r} (in {where!r})"


def _hoist_external(model: onnx.ModelProto, path: Path) -> list[str]:
    """A subgraph's initializer kept in external data is moved to the main graph, which its
    nodes read through the outer scope: there the weights store maps it from its file as it
    does the main graph's (no session can resolve a body's relative location from a proto in
    memory). Where its name names another value of the model, its data is read into the copy
    instead (load.py checked the location and the size)."""
    if not any(t.data_location == TensorProto.EXTERNAL
               for g in list(walk_graphs(model.graph))[1:] for t in g.initializer):
        return []
    from onnx.external_data_helper import load_external_data_for_tensor
    defined = Counter(_defined(model.graph))
    hoisted, read = [], []
    for where, g in held_graphs(model)[1:]:
        kept = []
        for t in g.initializer:
            if t.data_location != TensorProto.EXTERNAL:
                kept.append(t)
            elif defined[t.name] == 1:  # its only definition: the outer scope may hold it
                model.graph.initializer.append(t)
                hoisted.append(_located(t.name, where))
            else:
                load_external_data_for_tensor(t, str(path.parent))
                t.data_location = TensorProto.DEFAULT
                del t.external_data[:]
                kept.append(t)
                read.append(_located(t.name, where))
        if len(kept) < len(g.initializer):
            _replace(g.initializer, kept)
    notes = []
    if hoisted:
        notes.append(f"keep subgraph weight(s) {_list(hoisted, quoted=True)}, stored in "
                     "external data, in the main graph (their nodes read them from the outer "
                     "scope)")
    if read:
        notes.append(f"read subgraph weight(s) {_list(read, quoted=True)} from external data "
                     "into the copy (their names are taken elsewhere in the model)")
    return notes


def _defined(graph: onnx.GraphProto) -> list[str]:
    """Every name a graph and its subgraphs define (inputs, initializers, node outputs), once
    per definition."""
    out = []
    for g in walk_graphs(graph):
        out += [v.name for v in g.input] + [t.name for t in g.initializer]
        out += [t.name for t in g.sparse_initializer]
        out += [o for n in g.node for o in n.output if o]
    return out


def densify(sp: onnx.SparseTensorProto) -> np.ndarray:
    """The dense array of a sparse tensor (indices flat [NNZ], or coordinates [NNZ, rank])."""
    values = numpy_helper.to_array(sp.values)
    dims = tuple(int(d) for d in sp.dims)
    out = np.zeros(dims, values.dtype)
    if values.size:
        idx = numpy_helper.to_array(sp.indices).astype(np.int64)
        flat = idx if idx.ndim == 1 else np.ravel_multi_index(tuple(idx.T), dims)
        out.reshape(-1)[flat] = values.reshape(-1)
    return out


def _weights_not_inputs(model: onnx.ModelProto) -> list[str]:
    """IR < 4 lists every initializer as a graph input (ONNX Runtime takes them as constants);
    at IR >= 4 an input with an initializer is a default value TensorRT takes as a weight."""
    g = model.graph
    inits = {t.name for t in g.initializer}
    listed = [v for v in g.input if v.name in inits]
    notes = []
    if model.ir_version < 4:
        notes.append(f"are IR version 4, not {model.ir_version} (its weights are no graph "
                     "inputs there)")
        model.ir_version = 4
    elif listed:
        notes.append(f"take input(s) {_list([v.name for v in listed])} as the constant(s) "
                     "their initializers hold, as TensorRT's parser does")
    if listed:
        kept = [v for v in g.input if v.name not in inits]
        del g.input[:]
        g.input.extend(kept)
    return notes


def _subgraph_defaults(model: onnx.ModelProto) -> list[str]:
    """A subgraph input that has an initializer is a default value its holder never feeds:
    ONNX Runtime feeds a Loop or Scan body's other inputs in order and takes these as the
    constants they hold. The copy holds them as weights, no longer inputs, as the main graph's
    (`_weights_not_inputs`): onnx.checker and the copies count a body's inputs."""
    if not any({t.name for t in g.initializer} & {v.name for v in g.input}
               for g in list(walk_graphs(model.graph))[1:]):
        return []
    names = []
    for where, g in held_graphs(model)[1:]:
        inits = {t.name for t in g.initializer}
        listed = [v.name for v in g.input if v.name in inits]
        if listed:
            _replace(g.input, [v for v in g.input if v.name not in inits])
            names += [_located(n, where) for n in listed]
    return [f"take subgraph input(s) {_list(names, quoted=True)} as the constant(s) their "
            "initializers hold, as ONNX Runtime does"] if names else []


def _convert_opset(model: onnx.ModelProto, path: Path, wanted: int) -> list[str]:
    at = next((o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS), None)
    if at is None or at >= wanted:
        return []
    from onnx import version_converter
    _name_unnamed(model)  # the converter adds nodes (a Reshape's shape becomes a Constant)
    try:
        converted = version_converter.convert_version(model, wanted)
    except Exception as exc:  # the converter raises its own C++ error types
        raise TrtBisectError(
            f"{path} is opset {at}; trtbisect's copies need opset >= {wanted} (their Casts) and "
            f"onnx's version converter could not convert it: {first_line(exc)}") from exc
    model.CopyFrom(converted)
    return [f"are opset {wanted}, converted from {at} by onnx.version_converter (the Casts "
            f"they add need opset {wanted})"]


# ---------------------------------------------------------------- where onnx.checker fails

def _checker_repairs(model: onnx.ModelProto, path: Path,
                     shapes: Mapping[str, Sequence[int]]) -> list[str]:
    g = model.graph
    notes = []
    if not g.name:
        g.name = path.stem or "main"
        notes.append(f"name the graph {g.name!r}")
    order = topological_order(g)
    if order != list(range(len(g.node))):
        nodes = [g.node[i] for i in order]
        copied = [onnx.NodeProto() for _ in nodes]
        for c, n in zip(copied, nodes):
            c.CopyFrom(n)
        del g.node[:]
        g.node.extend(copied)
        notes.append("sort the nodes into execution order")
    notes += _add_shapes(model, shapes)
    return notes


def topological_order(g: onnx.GraphProto) -> list[int]:
    """Node indices in an execution order, the file's order wherever it already is one
    (Kahn's algorithm taking the earliest ready node). Nodes whose inputs nothing makes keep
    their place at the end (onnx.checker names them)."""
    made = {t: i for i, n in enumerate(g.node) for t in n.output if t}
    needs: list[set[int]] = []
    readers: dict[int, list[int]] = {}
    for i, n in enumerate(g.node):
        deps = {made[t] for t in node_reads(n) if t in made and made[t] != i}
        needs.append(deps)
        for d in deps:
            readers.setdefault(d, []).append(i)
    ready = [i for i, d in enumerate(needs) if not d]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for r in readers.get(i, ()):
            needs[r].discard(i)
            if not needs[r]:
                heapq.heappush(ready, r)
    placed = set(order)
    return order + [i for i in range(len(g.node)) if i not in placed]


def _add_shapes(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> list[str]:
    g = model.graph
    bare_in = [v for v in g.input if _shapeless(v)]
    bare_out = [v for v in g.output if _shapeless(v)]
    if not bare_in and not bare_out:
        return []
    for v in bare_in:
        if v.name not in shapes:
            raise TrtBisectError(
                f"input {v.name!r} declares no shape, not even its rank: give it with --shape "
                f"{v.name}:DIMS (e.g. --shape {v.name}:1x3x224x224) or an --inputs .npz")
        _set_shape(v, shapes[v.name])
    if bare_out:
        try:
            inferred = onnx.shape_inference.infer_shapes(structure(model))
        except Exception:  # best effort: the checker then names what is missing
            inferred = structure(model)
        known = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.output]
                 if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")}
        for v in bare_out:
            if v.name in known:
                v.type.tensor_type.shape.CopyFrom(known[v.name].type.tensor_type.shape)
            elif v.name in {t.name for t in g.initializer}:
                t = next(t for t in g.initializer if t.name == v.name)
                _set_shape(v, t.dims)
    what = [f"give input(s) {_list([v.name for v in bare_in])} the shape of --shape or of the "
            "first --inputs file"] if bare_in else []
    if bare_out:
        what.append(f"give output(s) {_list([v.name for v in bare_out])} the shapes inference "
                    "finds")
    return what


def input_shapes(model: onnx.ModelProto) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The graph inputs whose every dim is a number, with their dims (what a worker's copy
    gives a graph input the file declares without a shape)."""
    out = []
    for v in model.graph.input:
        t = v.type.tensor_type
        if v.type.HasField("tensor_type") and t.HasField("shape") and all(
                d.HasField("dim_value") for d in t.shape.dim):
            out.append((v.name, tuple(int(d.dim_value) for d in t.shape.dim)))
    return tuple(out)


def _shapeless(v: onnx.ValueInfoProto) -> bool:
    return v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape")


def _set_shape(v: onnx.ValueInfoProto, dims: Sequence[int]) -> None:
    shape = v.type.tensor_type.shape
    shape.Clear()
    for d in dims:
        shape.dim.add().dim_value = int(d)
    if not dims:
        v.type.tensor_type.shape.SetInParent()


def _name_unnamed(model: onnx.ModelProto) -> None:
    """Give every node trtbisect's name for it where it has none (names.flatten's names)."""
    flat = flatten(model)
    for node, name in zip(flat.nodes, flat.names):
        if not node.name:
            node.name = name


def _checkable(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy onnx.checker can read in memory: an external initializer becomes a graph input
    of its type and shape (the checker would look for its file from the working folder)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    external = [t for t in g.initializer if t.data_location == TensorProto.EXTERNAL]
    if external:
        kept = [t for t in g.initializer if t.data_location != TensorProto.EXTERNAL]
        del g.initializer[:]
        g.initializer.extend(kept)
        g.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                       for t in external)
    return out


def _list(names: Sequence[str], most: int = 3, quoted: bool = False) -> str:
    """The first `most` names (repr'd, unless `quoted` already), and how many more."""
    shown = ", ".join(n if quoted else repr(n) for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")
