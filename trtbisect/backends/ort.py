"""The embedded default backend: a faithful FP16 emulator on ONNX Runtime's CPU provider.

Why not simply run an FP16 model on ORT CPU? Its CPU kernels upcast most FP16 ops to FP32
internally, so an x*x of 300 gives 90000 instead of inf and the bug is invisible. We instead
compute in FP32 and round explicitly with `Cast(float16) -> Cast(float)` pairs, which ORT keeps.

Semantics (exactly): a node in FP16 reads every float input rounded to FP16 and stores every
float output rounded to FP16 (round to nearest even, overflow to +-inf); a node in FP32 computes
and stores in FP32, reading whatever its producers stored.

Speed: one session serves every plan. Each candidate node k gets a boolean scalar graph input
`trtbisect_fp16_k`; `Where(switch, rounded, raw)` selects per node at run time, so an evaluation
costs about one inference, not a graph rewrite and a new session.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..errors import TrtBisectError
from ..graph import Graph

log = logging.getLogger(__name__)

SWITCH_PREFIX = "trtbisect_fp16_"
NONFINITE_OUTPUT = "trtbisect_nonfinite"
MAX_IR_VERSION_HINT = "re-save it with an older IR version (onnx.save after setting model.ir_version)"


def make_session(model: onnx.ModelProto, threads: int | None = None):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(model.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises several unrelated types for unloadable models
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "IR version" in first or "ir_version" in first:
            raise TrtBisectError(
                f"onnxruntime {ort.__version__} cannot read this model's IR version "
                f"{model.ir_version}: {first}; {MAX_IR_VERSION_HINT}") from exc
        raise TrtBisectError(f"onnxruntime cannot load this model: {first}") from exc


def run_session(session, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None):
    try:
        return session.run(list(outputs) if outputs is not None else None, dict(feeds))
    except Exception as exc:
        first = str(exc).strip().splitlines()[0]
        raise TrtBisectError(f"onnxruntime failed to run the model: {first}") from exc


class Reference:
    """The untouched FP32 model on ORT CPU."""

    name = "ort-fp32"

    def __init__(self, graph: Graph, threads: int | None = None) -> None:
        self.graph = graph
        self.session = make_session(graph.model, threads)
        self.outputs = graph.output_names()

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = run_session(self.session, feeds, self.outputs)
        return {n: np.asarray(v) for n, v in zip(self.outputs, values)}


class Emulator:
    """Backend: the FP16 emulator. See the module docstring for the exact semantics."""

    name = "ort-emulator"

    def __init__(self, graph: Graph, threads: int | None = None,
                 expose: Sequence[str] = (), watch: Sequence[str] = ()) -> None:
        self.graph = graph
        self._candidates = graph.candidates()
        self.expose = list(expose)
        self.watch = list(watch)
        self.model, self.edges = build_emulated_model(graph, self._candidates, self.expose,
                                                      self.watch)
        self.session = make_session(self.model, threads)
        self.outputs = graph.output_names()
        self._on, self._off = np.array(True), np.array(False)
        # edge k is on when node _edge_nodes[k, 0] or [k, 1] runs in FP16 (index -1: never)
        index = {n: i for i, n in enumerate(self._candidates)}
        self._edge_nodes = np.array([[index.get(n, -1) for n in e.nodes] for e in self.edges],
                                    dtype=np.int64).reshape(-1, 2)
        self._edge_names = [e.switch for e in self.edges]

    def candidates(self) -> list[str]:
        return list(self._candidates)

    def switches(self, fp32_nodes: Iterable[str] | None) -> dict[str, np.ndarray]:
        """Feeds for a plan; `None` means everything FP32.

        A switch guards one read (or one store) and is on when the value read there is FP16:
        the reading node runs in FP16, or the node that stored the value did.
        """
        if fp32_nodes is None:
            return {e.switch: self._off for e in self.edges}
        keep = frozenset(fp32_nodes)
        unknown = keep - set(self._candidates)
        if unknown:
            raise TrtBisectError(f"not switchable nodes in plan: {', '.join(sorted(unknown))}")
        half = np.array([n not in keep for n in self._candidates] + [False])  # [-1]: "never"
        on = half[self._edge_nodes].any(axis=1)
        return {name: self._on if v else self._off for name, v in zip(self._edge_names, on)}

    def run(self, fp32_nodes: frozenset[str], feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = run_session(self.session, {**feeds, **self.switches(fp32_nodes)}, self.outputs)
        return {n: np.asarray(v) for n, v in zip(self.outputs, values)}

    def run_tensors(self, fp16: bool, feeds: Mapping[str, np.ndarray],
                    names: Sequence[str]) -> dict[str, np.ndarray]:
        """Exposed intermediate tensors (pass them as `expose=` at construction)."""
        plan = frozenset() if fp16 else None
        values = run_session(self.session, {**feeds, **self.switches(plan)}, names)
        return {n: np.asarray(v) for n, v in zip(names, values)}

    def nonfinite(self, fp32_nodes: frozenset[str], feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list[str]]:
        """Outputs, and the watched tensors that hold a NaN or inf under the plan."""
        names = [*self.outputs, NONFINITE_OUTPUT]
        values = run_session(self.session, {**feeds, **self.switches(fp32_nodes)}, names)
        flags = np.asarray(values[-1]).reshape(-1)
        bad = [t for t, f in zip(self.watch, flags) if f]
        return {n: np.asarray(v) for n, v in zip(self.outputs, values[:-1])}, bad

    def close(self) -> None:
        self.session = None


@dataclass(frozen=True)
class Edge:
    """A switch input and the two nodes (reader, writer) whose FP16-ness turns it on."""

    switch: str
    nodes: tuple[str | None, str | None]


class _Builder:
    """Accumulates the rewritten node list of the emulated graph."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.rounded: dict[str, str] = {}
        self.reads: dict[tuple[str, str | None, str | None], str] = {}
        self.edges: list[Edge] = []

    def switch(self, reader: str | None, writer: str | None) -> str:
        name = f"{SWITCH_PREFIX}{len(self.edges)}"
        self.edges.append(Edge(name, (reader, writer)))
        return name

    def rounded_of(self, tensor: str) -> str:
        if tensor not in self.rounded:
            half, back = f"{tensor}::fp16", f"{tensor}::rounded"
            self.nodes.append(helper.make_node("Cast", [tensor], [half], to=TensorProto.FLOAT16,
                                               name=f"{tensor}::cast16"))
            self.nodes.append(helper.make_node("Cast", [half], [back], to=TensorProto.FLOAT,
                                               name=f"{tensor}::cast32"))
            self.rounded[tensor] = back
        return self.rounded[tensor]

    def select(self, raw: str, out: str, reader: str | None, writer: str | None) -> None:
        self.nodes.append(helper.make_node("Where", [self.switch(reader, writer), self.rounded_of(raw), raw],
                                           [out], name=f"{out}::where"))

    def read(self, raw: str, reader: str, writer: str | None) -> str:
        """What `reader` sees of a value `writer` produced (raw, before any store rounding)."""
        key = (raw, reader, writer)
        if key not in self.reads:
            name = f"{raw}::in::{len(self.reads)}"
            self.select(raw, name, reader, writer)
            self.reads[key] = name
        return self.reads[key]


def build_emulated_model(graph: Graph, candidates: Sequence[str], expose: Sequence[str] = (),
                         watch: Sequence[str] = ()) -> tuple[onnx.ModelProto, list[Edge]]:
    """A copy of the model whose candidate nodes round their I/O when their switches are on.

    A candidate's float outputs stay raw (FP32) in the graph; a reader gets
    `Where(switch, round(raw), raw)` whose switch is on when the reader or the writer is FP16,
    which is exactly what the reader would see of the stored value. A stored value is
    materialised (under the tensor's own name) only where something observes it directly: a
    graph output, a non-candidate consumer, or an exposed or watched tensor.
    """
    model = onnx.ModelProto()
    model.CopyFrom(graph.model)
    g = model.graph
    cand = set(candidates)
    observed = {*graph.output_names(), *expose, *watch}
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
           for n in graph.model.graph.node for a in n.attribute):
        observed |= set(graph.types)  # subgraphs may read any outer value by name
    for i, node in enumerate(graph.model.graph.node):
        if graph.names[i] not in cand:
            observed.update(node.input)
    b = _Builder()
    raw_of: dict[str, str] = {}  # stored tensor name -> the raw name readers round from
    writer: dict[str, str] = {}
    for name, node in zip(graph.names, graph.model.graph.node):
        new = onnx.NodeProto()
        new.CopyFrom(node)
        if name not in cand:
            b.nodes.append(new)
            continue
        halves = set(graph.fp16_inputs(name))
        for k, t in enumerate(new.input):
            if t in halves:
                new.input[k] = b.read(raw_of.get(t, t), name, writer.get(t))
        stores = []
        for k, t in enumerate(new.output):
            if graph.is_float(t):
                writer[t] = name
                if t in observed:
                    new.output[k] = raw_of[t] = f"{t}::raw"
                    stores.append(t)
        b.nodes.append(new)
        for t in stores:
            b.select(raw_of[t], t, None, name)  # the stored value: rounded when its writer is FP16
    if watch:
        b.nodes.extend(_nonfinite_flags(watch))
    del g.node[:]
    g.node.extend(b.nodes)
    g.input.extend(helper.make_tensor_value_info(e.switch, TensorProto.BOOL, []) for e in b.edges)
    known = {v.name for v in g.output}
    g.output.extend(helper.make_tensor_value_info(t, TensorProto.FLOAT, None)
                    for t in expose if t not in known)
    if watch:
        g.output.append(helper.make_tensor_value_info(NONFINITE_OUTPUT, TensorProto.BOOL, [len(watch)]))
    return model, b.edges


def _nonfinite_flags(watch: Sequence[str]) -> list[onnx.NodeProto]:
    """One bool per watched tensor: does it hold a NaN or an inf? (x - x is NaN exactly there.)"""
    nodes, flags = [], []
    for k, t in enumerate(watch):
        p = f"trtbisect_watch_{k}"
        nodes += [
            helper.make_node("Sub", [t, t], [f"{p}_d"]),
            helper.make_node("IsNaN", [f"{p}_d"], [f"{p}_n"]),
            helper.make_node("Cast", [f"{p}_n"], [f"{p}_f"], to=TensorProto.FLOAT),
            helper.make_node("ReduceMax", [f"{p}_f"], [f"{p}_m"], keepdims=0),
            helper.make_node("Reshape", [f"{p}_m", "trtbisect_watch_shape"], [f"{p}_r"]),
        ]
        flags.append(f"{p}_r")
    nodes.insert(0, helper.make_node("Constant", [], ["trtbisect_watch_shape"],
                                     value=helper.make_tensor("s", TensorProto.INT64, [1], [1])))
    nodes.append(helper.make_node("Concat", flags, ["trtbisect_watch_all"], axis=0))
    nodes.append(helper.make_node("Cast", ["trtbisect_watch_all"], [NONFINITE_OUTPUT],
                                  to=TensorProto.BOOL))
    return nodes
