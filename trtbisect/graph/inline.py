"""Model-local functions inlined as TensorRT's ONNX parser imports them, with readable node
names."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import onnx

from .control_flow import subgraphs

log = logging.getLogger(__name__)


def inline_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its model-local functions inlined, as TensorRT's ONNX parser imports them
    (onnx-tensorrt's LocalFunctionImporter parses a function's nodes in place of the call).

    onnx's own inliner does the work; its node names are then made readable and stable: each
    node taken from a function body is named `<call node>/<its name in the body>` (unnamed:
    `<op_type>_<position>`), nested calls nesting the prefix.
    """
    import onnx.inliner

    funcs = {(f.domain, f.name): f for f in model.functions}
    out = onnx.inliner.inline_local_functions(model)
    try:
        end = _name_inlined(list(model.graph.node), list(out.graph.node), 0, "", funcs)
        if end != len(out.graph.node):
            raise ValueError("node counts differ")
    except (ValueError, IndexError) as exc:  # keep the inliner's names rather than guess
        log.warning("inlined functions keep onnx's generated node names (%s)", exc)
    return out


def _name_inlined(orig: Sequence[onnx.NodeProto], new: Sequence[onnx.NodeProto], pos: int,
                  prefix: str, funcs: Mapping[tuple[str, str], onnx.FunctionProto]) -> int:
    """Walk `orig` (a graph's or a function body's nodes) against the inliner's output from
    `pos` on, naming the nodes that came from function bodies; returns where `orig` ends."""
    for k, o in enumerate(orig):
        name = prefix + (o.name or f"{o.op_type}_{k}")
        f = funcs.get((o.domain, o.op_type))
        if f is not None:
            pos = _name_inlined(list(f.node), new, pos, f"{name}/", funcs)
            continue
        n = new[pos]
        if n.op_type != o.op_type:
            raise ValueError(f"{n.op_type} where {o.op_type} was expected")
        pos += 1
        if prefix:
            n.name = name
        for (_, og), (_, ng) in zip(subgraphs(o), subgraphs(n)):
            if _name_inlined(list(og.node), list(ng.node), 0, prefix, funcs) != len(ng.node):
                raise ValueError("node counts differ in a subgraph")
    return pos
