"""Strongly typed mixed-precision ONNX: writing one from a plan, and saving models of any size.

`mixed_model` is what TensorRT 11 builds (it has no weak typing: precision lives in the graph).
FP16 nodes get float16 inputs, weights and outputs; FP32 nodes are fenced by Cast nodes; the
model's own Casts keep their types, and graph inputs and outputs keep their declared types.
`check` judges such a file with `backends.ort.MixedModel`, bit for bit what the search measured.

Weights are never gathered into one proto unless the model is small: a `Written` model is a
weightless proto plus arrays, saved with external data when it is large.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .graph import FLOAT, SMALL_BYTES, Graph, _mark_stored, structure, with_node_names
from .plan import atomic_write
from .spill import release_pages, spill
from .semantics import round_weight

FLOAT16 = TensorProto.FLOAT16
EMBED_LIMIT = 1 << 28  # weights up to this size are saved inside the .onnx file (256 MiB):
# above, a single file would mean gathering every weight into one proto (twice the memory)


@dataclass
class Written:
    """A model to save: a proto without weight data, and the arrays of its stored initializers."""

    proto: onnx.ModelProto
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def weight_bytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def materialize(self) -> onnx.ModelProto:
        """One proto with every weight inside (small models only)."""
        out = onnx.ModelProto()
        out.CopyFrom(self.proto)
        for t in out.graph.initializer:
            if t.name in self.arrays:
                t.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(self.arrays[t.name]),
                                                   t.name))
        return out

    def save(self, path: Path) -> list[Path]:
        """Atomically: a temporary file renamed into place. Returns the files written."""
        path = Path(path)
        if self.weight_bytes() <= EMBED_LIMIT:
            atomic_write(path, lambda tmp: onnx.save(self.materialize(), tmp))
            return [path]
        data = path.with_name(path.name + ".data")
        proto = onnx.ModelProto()
        proto.CopyFrom(self.proto)
        offsets: dict[str, tuple[int, int]] = {}

        def write_data(tmp: str) -> None:
            with open(tmp, "wb") as fh:
                for t in proto.graph.initializer:
                    if t.name in self.arrays:
                        arr = np.ascontiguousarray(self.arrays[t.name])
                        pad = (-fh.tell()) % 64
                        fh.write(b"\0" * pad)
                        offsets[t.name] = (fh.tell(), arr.nbytes)
                        fh.write(memoryview(arr.reshape(-1).view(np.uint8)))
                        release_pages([self.arrays[t.name]])
        atomic_write(data, write_data)
        for t in proto.graph.initializer:
            if t.name in offsets:
                del t.external_data[:]
                t.data_location = TensorProto.EXTERNAL
                off, length = offsets[t.name]
                for k, v in (("location", data.name), ("offset", str(off)), ("length", str(length))):
                    t.external_data.add(key=k, value=v)
        atomic_write(path, lambda tmp: onnx.save(proto, tmp))
        return [path, data]


def graph_model(graph: Graph, proto: onnx.ModelProto | None = None) -> Written:
    """The graph's own model as given (node names filled in), or `proto` derived from it, with
    the weights by reference."""
    proto = structure(proto if proto is not None else with_node_names(graph.source))
    arrays = {t.name: np.asarray(graph.weights.raw(t.name)) for t in proto.graph.initializer
              if t.data_location == TensorProto.EXTERNAL and t.name in graph.weights}
    return Written(proto, arrays)


def mixed_model(graph: Graph, fp32_nodes: Iterable[str], weight_rule: str = "inf") -> Written:
    """The model with every candidate node outside `fp32_nodes` computing in FP16; FP32
    weights an FP16 node reads become float16 under `weight_rule` (semantics.round_weight),
    the rule the judge assumed."""
    return _MixedWriter(graph, set(fp32_nodes), weight_rule).write()


def write_mixed_onnx(model: onnx.ModelProto, fp32_nodes: Iterable[str],
                     weight_rule: str = "inf") -> onnx.ModelProto:
    """`mixed_model` of a small in-memory model, as one proto."""
    return mixed_model(Graph(model), fp32_nodes, weight_rule).materialize()


class _MixedWriter:
    def __init__(self, graph: Graph, keep: set[str], weight_rule: str = "inf") -> None:
        self.g = graph
        self.keep = keep
        self.weight_rule = weight_rule
        self.half = {n for n in graph.candidates() if n not in keep}
        self.sep = _readable_separator(graph)
        # home[t]: the element type tensor t has in the mixed graph
        self.home: dict[str, int] = {t: ty for t, ty in graph.types.items()}
        self.home.update(graph.half_typed)  # what the model itself keeps half
        for name in graph.candidates():
            kept = graph.fp32_outputs(name)  # float-only outputs (LayerNormalization's Mean)
            for t in graph.float_outputs(name):
                self.home[t] = FLOAT16 if name in self.half and t not in kept else FLOAT
        for v in graph.inputs():
            self.home[v.name] = graph.declared.get(v.name, self.home.get(v.name, FLOAT))
        self.converted: dict[tuple[str, int], str] = {}
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []
        self.arrays: dict[str, np.ndarray] = {}
        self.renamed: dict[str, str] = {}

    def as_type(self, t: str, want: int) -> str:
        src = self.renamed.get(t, t)
        if self.home.get(t) == want:
            return src
        key = (t, want)
        if key not in self.converted:
            suffix = "fp16" if want == FLOAT16 else "fp32"
            name = f"{t}{self.sep}{suffix}"
            if t in self.g.initializers and t not in self.g.producer:
                arr = np.asarray(self.g.array(t), np.float32)
                if want == FLOAT16:
                    self._constant(name, spill(round_weight(arr, self.weight_rule)
                                               .astype(np.float16)))
                    release_pages([arr])  # the FP32 weight was only read
                else:
                    self._constant(name, arr)
            else:
                self.nodes.append(helper.make_node("Cast", [src], [name], to=want,
                                                   name=f"{name}{self.sep}cast"))
            self.converted[key] = name
        return self.converted[key]

    def _constant(self, name: str, arr: np.ndarray) -> None:
        if arr.nbytes <= SMALL_BYTES:
            self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
            return
        t = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(arr.dtype))
        t.dims.extend(arr.shape)
        _mark_stored(t)
        self.inits.append(t)
        self.arrays[name] = arr

    def write(self) -> Written:
        g = self.g
        out = structure(g.source)
        og = out.graph
        for v in og.output:
            declared = g.declared.get(v.name, FLOAT)
            if self.home.get(v.name) != declared and v.name in g.producer:
                self.renamed[v.name] = f"{v.name}{self.sep}{'fp16' if self.home[v.name] == FLOAT16 else 'fp32'}"
        source_nodes = list(g.source.graph.node)
        for i, (name, node) in enumerate(zip(g.names, g.model.graph.node)):
            if name in g.candidate_set:
                new = self._candidate(name, node)
            else:
                new = onnx.NodeProto()
                new.CopyFrom(source_nodes[i])  # the model's own types, Casts included
                new.name = name
                if node.op_type not in ("Cast", "Shape", "Size"):
                    for k, t in enumerate(new.input):
                        if g.is_float(t) and t not in g.half_typed:
                            new.input[k] = self.as_type(t, FLOAT)
                        elif t:
                            new.input[k] = self.renamed.get(t, t)
                else:
                    new.input[:] = [self.renamed.get(t, t) for t in new.input]
            new.output[:] = [self.renamed.get(t, t) for t in new.output]
            self.nodes.append(new)
        self.nodes = _casts_after_producers(self.nodes, set(self.converted.values()))
        for t, internal in self.renamed.items():
            self.nodes.append(helper.make_node("Cast", [internal], [t], to=g.declared.get(t, FLOAT),
                                               name=f"{t}{self.sep}output_cast"))
        del og.node[:]
        og.node.extend(self.nodes)
        used = {t for n in self.nodes for t in n.input}
        keep_inits = [t for t in og.initializer if t.name in used]
        del og.initializer[:]
        og.initializer.extend(keep_inits)
        og.initializer.extend(self.inits)
        arrays = dict(self.arrays)
        for t in og.initializer:
            if t.data_location == TensorProto.EXTERNAL and t.name not in arrays:
                arrays[t.name] = np.asarray(g.weights.raw(t.name))
        del og.value_info[:]
        out.metadata_props.append(onnx.StringStringEntryProto(
            key="trtbisect.fp32_nodes", value=",".join(sorted(self.keep))))
        return Written(out, arrays)

    def _candidate(self, name: str, node: onnx.NodeProto) -> onnx.NodeProto:
        g = self.g
        new = onnx.NodeProto()
        new.CopyFrom(node)
        new.name = name
        want = FLOAT16 if name in self.half else FLOAT
        halves = set(g.fp16_inputs(name)) if want == FLOAT16 else set()
        for k, t in enumerate(new.input):
            if t in halves:
                new.input[k] = self.as_type(t, FLOAT16)
            elif g.is_float(t):
                new.input[k] = self.as_type(t, FLOAT)
        for a in new.attribute:  # ops that make floats of a set type (RandomNormal, EyeLike...)
            if a.name == "dtype" and a.type == onnx.AttributeProto.INT and a.i == FLOAT:
                a.i = want
        return new


def _casts_after_producers(nodes: list[onnx.NodeProto], casts: set[str]) -> list[onnx.NodeProto]:
    """Each precision Cast moved right after the node producing its input (graph inputs' first):
    a fused layer then reads only values produced before it, so `find_layers` sees in the file
    the layers it saw in the model."""
    moved = {n.output[0]: n for n in nodes if n.op_type == "Cast" and n.output
             and n.output[0] in casts}
    after: dict[str, list[onnx.NodeProto]] = {}
    produced = {t for n in nodes if not (n.output and n.output[0] in moved) for t in n.output}
    first = []
    for n in moved.values():
        src = n.input[0]
        if src in produced:
            after.setdefault(src, []).append(n)
        else:
            first.append(n)
    out = list(first)
    for n in nodes:
        if n.output and n.output[0] in moved:
            continue
        out.append(n)
        for t in n.output:
            out.extend(after.get(t, []))
    return out


def _readable_separator(graph: Graph) -> str:
    names = graph.all_names()
    sep = "::"
    while any(sep in n for n in names):
        sep += ":"
    return sep
