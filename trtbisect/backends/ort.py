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
        self.model = build_emulated_model(graph, self._candidates, self.expose, self.watch)
        self.session = make_session(self.model, threads)
        self.outputs = graph.output_names()
        self._switch = {n: f"{SWITCH_PREFIX}{k}" for k, n in enumerate(self._candidates)}
        self._on, self._off = np.array(True), np.array(False)

    def candidates(self) -> list[str]:
        return list(self._candidates)

    def switches(self, fp32_nodes: Iterable[str] | None) -> dict[str, np.ndarray]:
        """Feeds for a plan; `None` means everything FP32."""
        if fp32_nodes is None:
            return {s: self._off for s in self._switch.values()}
        keep = frozenset(fp32_nodes)
        unknown = keep - self._switch.keys()
        if unknown:
            raise TrtBisectError(f"not switchable nodes in plan: {', '.join(sorted(unknown))}")
        return {s: (self._off if n in keep else self._on) for n, s in self._switch.items()}

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


class _Builder:
    """Accumulates the rewritten node list of the emulated graph."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.rounded: dict[str, str] = {}
        self.reads: dict[tuple[str, str], str] = {}

    def rounded_of(self, tensor: str) -> str:
        if tensor not in self.rounded:
            half, back = f"{tensor}::fp16", f"{tensor}::rounded"
            self.nodes.append(helper.make_node("Cast", [tensor], [half], to=TensorProto.FLOAT16,
                                               name=f"{tensor}::cast16"))
            self.nodes.append(helper.make_node("Cast", [half], [back], to=TensorProto.FLOAT,
                                               name=f"{tensor}::cast32"))
            self.rounded[tensor] = back
        return self.rounded[tensor]

    def read(self, tensor: str, switch: str) -> str:
        key = (tensor, switch)
        if key not in self.reads:
            name = f"{tensor}::in::{switch}"
            self.nodes.append(helper.make_node("Where", [switch, self.rounded_of(tensor), tensor],
                                               [name], name=f"{name}::where"))
            self.reads[key] = name
        return self.reads[key]


def build_emulated_model(graph: Graph, candidates: Sequence[str], expose: Sequence[str] = (),
                         watch: Sequence[str] = ()) -> onnx.ModelProto:
    """A copy of the model whose candidate nodes round their I/O when their switch is on."""
    model = onnx.ModelProto()
    model.CopyFrom(graph.model)
    g = model.graph
    switch = {n: f"{SWITCH_PREFIX}{k}" for k, n in enumerate(candidates)}
    b = _Builder()
    for name, node in zip(graph.names, graph.model.graph.node):
        new = onnx.NodeProto()
        new.CopyFrom(node)
        s = switch.get(name)
        if s is None:
            b.nodes.append(new)
            continue
        halves = set(graph.fp16_inputs(name))
        for k, t in enumerate(new.input):
            if t in halves:
                new.input[k] = b.read(t, s)
        stores = []
        for k, t in enumerate(new.output):
            if graph.is_float(t):
                new.output[k] = f"{t}::raw"
                stores.append(t)
        b.nodes.append(new)
        for t in stores:
            # round(stored) == round(raw) whatever the switch, so readers share one rounding
            b.nodes.append(helper.make_node("Where", [s, b.rounded_of(f"{t}::raw"), f"{t}::raw"],
                                            [t], name=f"{t}::store"))
            b.rounded[t] = b.rounded[f"{t}::raw"]
    if watch:
        b.nodes.extend(_nonfinite_flags(watch))
    del g.node[:]
    g.node.extend(b.nodes)
    g.input.extend(helper.make_tensor_value_info(s, TensorProto.BOOL, []) for s in switch.values())
    known = {v.name for v in g.output}
    g.output.extend(helper.make_tensor_value_info(t, TensorProto.FLOAT, None)
                    for t in expose if t not in known)
    if watch:
        g.output.append(helper.make_tensor_value_info(NONFINITE_OUTPUT, TensorProto.BOOL, [len(watch)]))
    return model


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
