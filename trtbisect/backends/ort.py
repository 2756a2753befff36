"""The embedded default backend: a faithful FP16 emulator on ONNX Runtime's CPU provider.

Why not simply run an FP16 model on ORT CPU? Its CPU kernels upcast most FP16 ops to FP32
internally, so an x*x of 300 gives 90000 instead of inf and the bug is invisible. We instead
compute in FP32 and round explicitly with `Cast(float16) -> Cast(float)` pairs, which ORT keeps.

Semantics (exactly): a node in FP16 reads every float data input rounded to FP16 and stores every
float output rounded to FP16 (round to nearest even, overflow to +-inf); a node in FP32 computes
and stores in FP32, reading whatever its producers stored. Inputs that parametrise an op
(`graph.PARAMETER_INPUTS`) are never rounded.

One judge: every session here (the FP32 reference, the search's emulator, `check` of a written
mixed model) runs with ORT's graph optimizations and weight prepacking off, and every weight is a
constant initializer handed to ORT by reference (`add_external_initializers`). Then each compute
node runs the same kernel on the same values in every graph, and the numbers the search measures
for a plan are, bit for bit, those `check` measures on the file written for it.

Speed: a plan is evaluated on a static graph (Cast pairs only where the plan rounds, weights
pre-rounded) in which only an *active set* of nodes is switchable: each group of active nodes
(a search unit: a predicted TensorRT layer, or one node) is one `If` on a boolean input, whose
branches hold the group in FP16 and in FP32. Only the chosen branch runs, so a switched group
costs one dispatch more than a fixed one, where an element-wise `Where` per value costs a full
pass over it (on PP-OCRv4 det, 422 of them took 44% of an evaluation). Plans inside the active
set cost one inference; a plan outside it rebuilds the session around a larger set.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections import ChainMap, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..base import child as child_mod
from ..base import limits
from ..base.spill import release_pages, spill
from ..errors import TrtBisectError
from ..graph import (
    FLOAT,
    HALF_TYPES,
    SMALL_BYTES,
    STORE_LOCATION,
    Graph,
    _mark_stored,
    node_reads,
    structure,
    subgraphs,
    walk,
    walk_graphs,
)
from ..judge.precision import FP16, Precision
from ..judge.semantics import (
    MAX_ACCUMULATE_BLOCKS,
    STRICT,
    Rules,
    find_layers,
    round_weight,
    tf32_round,
    tf32_round_nodes,
)

log = logging.getLogger(__name__)

MAX_IR_VERSION_HINT = "re-save it with an older IR version (onnx.save after setting model.ir_version)"

# Ops whose output is FP16-exact when every float input is: they select, move or compare values
# but create none, so the Cast pair after them is skipped (it would change no bit).
EXACT_OPS = frozenset({
    "Identity", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Expand", "Tile",
    "Slice", "Split", "Concat", "Gather", "GatherElements", "GatherND", "ScatterND",
    "ScatterElements", "DepthToSpace", "SpaceToDepth", "Relu", "Max", "Min", "Clip", "Neg",
    "Abs", "Sign", "Floor", "Ceil", "Round", "Where", "MaxPool", "ReduceMax", "ReduceMin",
})


def session_options(threads: int | None = None, judge: bool = True):
    """The one configuration every judge runs under (see the module docstring); `judge=False`:
    ORT's defaults (optimizing kernels), for measuring what that changes."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if judge:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        opts.add_session_config_entry("session.disable_prepacking", "1")
    if threads:
        opts.intra_op_num_threads = threads
    return opts


class Session:
    """An ORT session over a weightless proto; its big initializers are arrays passed by
    reference (never serialized, never copied)."""

    def __init__(self, proto: onnx.ModelProto, arrays: Mapping[str, np.ndarray],
                 threads: int | None = None, judge: bool = True,
                 aliases: Mapping[str, str] | None = None) -> None:
        """`judge=False`: ORT's default, optimizing kernels (see `session_options`).
        `aliases`: tensor -> the graph output that exposes it (a value inside a subgraph)."""
        import onnxruntime as ort

        self.aliases = dict(aliases or {})

        opts = session_options(threads, judge)
        names = [t.name for t in proto.graph.initializer if _stored(t)]
        self._values = [ort.OrtValue.ortvalue_from_numpy(_contiguous(arrays[n])) for n in names]
        if names:
            opts.add_external_initializers(names, self._values)
        self.inputs = {i.name: i.type for i in proto.graph.input}
        try:
            self.session = ort.InferenceSession(proto.SerializeToString(), opts,
                                                providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises several unrelated types for unloadable models
            first = _first_line(exc)
            if "IR version" in first or "ir_version" in first:
                raise TrtBisectError(
                    f"onnxruntime {ort.__version__} cannot read this model's IR version "
                    f"{proto.ir_version}: {first}; {MAX_IR_VERSION_HINT}") from exc
            raise TrtBisectError(f"onnxruntime cannot load this model: {first}") from exc
        self.float_inputs = {i.name for i in self.session.get_inputs() if i.type == "tensor(float)"}
        release_pages(arrays[n] for n in names)  # ORT holds its own copy of every initializer

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str]) -> list[np.ndarray]:
        fed = {k: np.asarray(v, np.float32) if k in self.float_inputs else np.asarray(v)
               for k, v in feeds.items()}
        return run_session(self.session, fed, [self.aliases.get(n, n) for n in outputs])


_SWITCH = {True: np.array(True), False: np.array(False)}  # a switch's value: runs in FP16


def _stored(t: TensorProto) -> bool:
    return t.data_location == TensorProto.EXTERNAL and any(
        e.key == "location" and e.value == STORE_LOCATION for e in t.external_data)


def _contiguous(a: np.ndarray) -> np.ndarray:
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def make_session(model: onnx.ModelProto, threads: int | None = None):
    """A raw ORT session for a whole in-memory model (small models: export checks, tests)."""
    arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
              if t.data_location != TensorProto.EXTERNAL}
    return Session(structure(model), arrays, threads).session


def model_session(model: onnx.ModelProto | str | Path, threads: int | None = None,
                  what: str = "the quantized model"):
    """A raw ORT session under the judge's options (`session_options`) over an in-memory
    model or a file, as written: the quantized judge's (quant/judge.py), whose Q/DQ and float16
    values must run exactly as the file holds them (no initializer is moved or converted)."""
    import onnxruntime as ort

    source = str(model) if isinstance(model, (str, Path)) else model.SerializeToString()
    try:
        return ort.InferenceSession(source, session_options(threads),
                                    providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises several unrelated types for unloadable models
        raise TrtBisectError(f"onnxruntime cannot load {what}: {_first_line(exc)}") from exc


_ran = [0.0]  # seconds spent inside ORT's run in this process


def run_seconds() -> float:
    """Seconds this process has spent running sessions (not building them): what an
    evaluation costs once its session exists (the default --workers' estimate)."""
    return _ran[0]


def run_session(session, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None):
    """One inference, interruptible (limits.py): Ctrl-C, SIGTERM and --eval-timeout set the
    run's `terminate` flag, which ORT checks between kernels, inside Loop bodies too."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.log_severity_level = 4  # a run we stop is ours to report, not ORT's error log
    names = list(outputs) if outputs is not None else None
    began = time.perf_counter()
    try:
        return limits.interruptible(lambda: session.run(names, dict(feeds), options),
                                    limits.eval_timeout(),
                                    lambda: setattr(options, "terminate", True))
    except TrtBisectError:
        raise
    except Exception as exc:
        raise TrtBisectError(f"onnxruntime failed to run the model: {_first_line(exc)}") from exc
    finally:
        _ran[0] += time.perf_counter() - began


class Rounded:
    """Low-precision (FP16 or BF16) copies of a graph's float initializers (under the weight
    rule), and their TF32-rounded copies, made once and shared by every session over the graph
    (`Rounded.of`): the weights' FP16 copy exists once."""

    def __init__(self, graph: Graph, weight_rule: str = "inf",
                 precision: Precision = FP16) -> None:
        self.graph, self.weight_rule, self.precision = graph, weight_rule, precision
        self._arrays: dict[str, np.ndarray] = {}
        self._tf32: dict[str, np.ndarray] = {}

    @classmethod
    def of(cls, graph: Graph, weight_rule: str = "inf",
           precision: Precision = FP16) -> Rounded:
        shared = getattr(graph, "_rounded", None) or {}
        key = weight_rule if precision is FP16 else f"{weight_rule}:{precision.name}"
        if key not in shared:
            shared[key] = cls(graph, weight_rule, precision)
            graph._rounded = shared  # type: ignore[attr-defined]
        return shared[key]

    @staticmethod
    def release(graph: Graph) -> None:
        """Drop the graph's shared copies (sessions that hold them keep theirs alive)."""
        graph._rounded = None  # type: ignore[attr-defined]

    def array(self, name: str) -> np.ndarray:
        if name not in self._arrays:
            src = self.graph.array(name)
            self._arrays[name] = spill(round_weight(np.asarray(src, np.float32), self.weight_rule,
                                                    self.precision))
            release_pages([src])  # the FP32 weights' pages: read once, not held
        return self._arrays[name]

    def tf32(self, name: str) -> np.ndarray:
        if name not in self._tf32:
            src = self.graph.array(name)
            self._tf32[name] = spill(tf32_round(np.asarray(src, np.float32)))
            release_pages([src])
        return self._tf32[name]


# ---------------------------------------------------------------- the emulation graph

HALF, FULL, ACTIVE = "half", "full", "active"


class _Builder:
    """Writes the emulation graph of one static assignment: every node HALF, FULL or ACTIVE.

    ACTIVE nodes come in groups (`groups`: node -> group key; default, a group each), each group
    one `If` on its boolean input whose branches hold the group's nodes in FP16 and in FP32.
    Only the chosen branch runs, and a value leaves a group as its branch stored it, so a
    reader rounds it exactly when a HALF node would (rounding an FP16-exact value changes no
    bit). Nothing is selected element by element: an active group costs one dispatch.

    Names it adds all contain `sep`, a string no name of the model contains, so they never
    collide with the model's own.
    """

    def __init__(self, graph: Graph, state: Mapping[str, str], rounded: Rounded,
                 round_outputs: bool = True, rules: Rules = STRICT,
                 groups: Mapping[str, str] | None = None) -> None:
        self.g, self.state, self.rounded_store = graph, dict(state), rounded
        self.rules = rules
        self.internal = rules.internal
        self.group_of = dict(groups or {})
        self.sep = _separator(graph)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []
        self.arrays: dict[str, np.ndarray] = {}
        self.switch_of: dict[str, str] = {}  # active node -> its bool input ("runs in FP16")
        self.cands = frozenset(graph.candidates())
        self._weights: dict[str, str] = {}  # initializer -> its FP16-rounded constant
        self._weights_tf32: dict[str, str] = {}  # initializer -> its TF32-rounded constant
        # Scoped by branch (a value made inside a branch exists only there): a tensor's own name
        # holds the value its producer stored; these hold the others.
        self.raw: ChainMap[str, str] = ChainMap()  # tensor -> its unrounded value
        self.rounded: ChainMap[str, str] = ChainMap()  # tensor -> its FP16-rounded value
        self.producer_state: ChainMap[str, str] = ChainMap()
        self._tf32: ChainMap[str, str] = ChainMap()  # tensor -> its TF32-rounded copy
        self._slices: ChainMap[tuple[str, int, int, int], str] = ChainMap()  # --fp16-accumulate
        self.round_outputs = round_outputs
        self._k = 0
        self._needed: set[str] = set()  # read outside any group: graph outputs, exposed, watched
        self._readers: dict[str, set[int]] = {}
        # exposing a value made inside a subgraph: holder -> (value, attribute) to carry out,
        # and each value's name in the scope it has reached so far
        self._pending: dict[int, list[tuple[str, str]]] = defaultdict(list)
        self.carried: dict[str, str] = {}

    _SCOPED = ("raw", "rounded", "producer_state", "_tf32", "_slices")

    def fresh(self, tag: str) -> str:
        self._k += 1
        return f"{self.sep}{tag}{self._k}"

    def switch(self, node: str) -> str:
        if node not in self.switch_of:
            self.switch_of[node] = f"{self.sep}fp16:{self.group_of.get(node, node)}"
        return self.switch_of[node]

    # -- values
    def round_pair(self, src: str, dst: str, to: int | None = None) -> None:
        """dst = src rounded to type `to` (default: the run's low precision)."""
        half = self.fresh("h")
        to = self.rules.precision.onnx_type if to is None else to
        self.nodes.append(helper.make_node("Cast", [src], [half], to=to))
        self.nodes.append(helper.make_node("Cast", [half], [dst], to=FLOAT))

    def _weight(self, t: str) -> bool:
        return (t in self.g.initializers and t not in self.g.producer) or t in self.g.inner_weights

    def rounded_of(self, t: str) -> str:
        """The FP16-rounded value of tensor t (made on first use); a fused layer's internal
        tensor is never rounded."""
        if t in self.internal:
            return t
        if self._weight(t):
            return self._weight_copy(t, self._weights, "w", self.rounded_store.array)
        if t not in self.rounded:
            name = self.fresh("r")
            self.round_pair(self.raw.get(t, t), name)
            self.rounded[t] = name
        return self.rounded[t]

    def _weight_copy(self, t: str, made: dict[str, str], tag: str,
                     array: Callable[[str], np.ndarray]) -> str:
        """Weight t's rounded copy, a constant of the whole model (made once; a subgraph's
        weight too: the main graph's initializers are visible in every subgraph)."""
        if t not in made:
            made[t] = self.fresh(tag)
            self._constant(made[t], array(t))
        return made[t]

    def _constant(self, name: str, arr: np.ndarray) -> None:
        if arr.nbytes <= SMALL_BYTES:
            self.inits.append(numpy_helper.from_array(np.asarray(arr, order="C"), name))
            return
        t = TensorProto(name=name, data_type=FLOAT)
        t.dims.extend(arr.shape)
        _mark_stored(t)
        self.inits.append(t)
        self.arrays[name] = arr

    def tf32_of(self, v: str) -> str:
        """Value `v` rounded to TF32 (what an FP32 inner product reads under --tf32)."""
        if self._weight(v):
            return self._weight_copy(v, self._weights_tf32, "tf32", self.rounded_store.tf32)
        if v not in self._tf32:
            name = self.fresh("tf32")
            self.nodes.extend(tf32_round_nodes(v, name, self.fresh("t") + "_"))
            self._tf32[v] = name
        return self._tf32[v]

    def read(self, t: str, reader: str, tf32: bool = False) -> str:
        """What `reader` (a candidate, FP16 data input t) sees of t under the assignment;
        `tf32`: an inner-product operand, TF32-rounded when the reader runs in FP32."""
        if t in self.internal:
            return t
        if self.state[reader] == FULL:
            return self.tf32_of(t) if tf32 else t
        return self.rounded_of(t)

    # -- nodes
    def add(self, i: int, node: onnx.NodeProto) -> None:
        """Node i, HALF or FULL (an ACTIVE node is added by `_add_group`, once per branch)."""
        name = self.g.names[i]
        mode = self.state.get(name, FULL)
        new = onnx.NodeProto()
        new.CopyFrom(node)
        new.name = name
        tf32 = self.rules.tf32_inputs(node.op_type) if name in self.cands else ()
        if mode == HALF:
            halves = set(self.g.fp16_inputs(name))
            for k, t in enumerate(new.input):
                if t in halves:
                    new.input[k] = self.read(t, name, k in tf32)
        else:
            for k, t in enumerate(new.input):
                if k in tf32 and self.g.is_float(t):
                    new.input[k] = self.tf32_of(t)
        forced = []
        kept = set(self.g.fp32_outputs(name)) if mode == HALF else set()
        for k, t in enumerate(new.output):
            if not self.g.is_float(t):
                continue
            if t in kept:  # an output the schema keeps float32 (LayerNormalization's Mean)
                self.producer_state[t] = FULL
                continue
            self.producer_state[t] = mode
            if t in self.internal and mode == HALF:
                continue  # stays inside the fused kernel: read raw, never rounded
            if mode == HALF and self._exact(node, name):
                self.rounded[t] = t
            elif mode == HALF:
                new.output[k] = self.raw[t] = self.fresh("raw")
            elif t in self.g.half_typed and self.round_outputs and name not in self.cands:
                new.output[k] = self.raw[t] = self.fresh("raw")
                forced.append(t)
        self._rebuild_bodies(i, new)
        self._emit(node, new, name, mode)
        for t in self.g.float_outputs(name) if mode == HALF else []:
            if t in self.rounded or t in self.internal or t in kept:
                continue
            self.round_pair(self.raw[t], t)
            self.rounded[t] = t
        for t in forced:  # a half-typed value the model itself rounds (a Cast to float16, ...)
            self.round_pair(self.raw[t], t, self.g.half_typed[t])
            if self.g.half_typed[t] == self.rules.precision.onnx_type:
                self.rounded[t] = t

    def _rebuild_bodies(self, i: int, new: onnx.NodeProto) -> None:
        """The subgraphs of node i (If branches, Loop and Scan bodies), in `new`, rebuilt node
        by node under the same assignment, at any depth: an FP16 node inside reads and stores
        rounded values as a top-level one does (outer-scope values, weights included, are read
        through their rounded copies), an active one switches on its own boolean input."""
        for attr, body in subgraphs(new):
            outer, self.nodes = self.nodes, []
            for a in self._SCOPED:  # values made inside exist only there
                setattr(self, a, getattr(self, a).new_child())
            for j in self.g.body_nodes(i, attr):
                if self.state.get(self.g.names[j]) == ACTIVE:
                    self._add_group([j])
                else:
                    self.add(j, self.g.nodes[j])
            made, self.nodes = self.nodes, outer
            for a in self._SCOPED:
                setattr(self, a, getattr(self, a).parents)
            del body.node[:]
            body.node.extend(made)
            del body.value_info[:]
        for t, attr in self._pending.get(i, ()):
            self._carry_out(new, t, attr)

    def _carry_out(self, holder: onnx.NodeProto, t: str, attr: str) -> None:
        """Make value t (by its name in `attr`'s graph) an output of `holder`: If gets one more
        output (its other branches give an empty tensor), Loop and Scan one more scan output
        (every iteration's value, stacked)."""
        src, out = self.carried[t], self.fresh("x")
        for a, body in subgraphs(holder):
            made = self.fresh("o")
            if a == attr:
                body.node.append(helper.make_node("Identity", [src], [made]))
            else:
                body.node.append(helper.make_node("Constant", [], [made], value=numpy_helper
                                                  .from_array(np.zeros(0, np.float32))))
            body.output.append(helper.make_tensor_value_info(made, FLOAT, None))
        holder.output.append(out)
        for a in holder.attribute:  # Scan: the new scan output's axis and direction
            if a.name in ("scan_output_axes", "scan_output_directions"):
                a.ints.append(0)
        self.carried[t] = out

    def _add_group(self, members: list[int]) -> None:
        """One `If` on the group's switch: the members in FP16 (then) or in FP32 (else). A
        node inside a subgraph is a group of its own, and every output of it leaves its If."""
        nodes = self.g.nodes
        names = [self.g.names[i] for i in members]
        inside = set(members)
        inner = members[0] >= self.g.top
        exits = [t for i in members for t in nodes[i].output if t and (
            inner or t in self._needed or any(r not in inside for r in self._readers.get(t, ())))]
        if not exits:  # nothing reads what the group computes: its precision changes nothing
            for n in names:
                self.state[n] = ACTIVE
            return
        branches = []
        for mode in (HALF, FULL):
            outer, self.nodes = self.nodes, []
            for a in self._SCOPED:
                setattr(self, a, getattr(self, a).new_child())
            for i, n in zip(members, names):
                self.state[n] = mode
                self.add(i, nodes[i])
            body, self.nodes = self.nodes, outer
            for a in self._SCOPED:
                setattr(self, a, getattr(self, a).parents)
            branches.append(self._branch(body, exits, mode))
        for n in names:
            self.state[n] = ACTIVE
        self.nodes.append(helper.make_node("If", [self.switch(names[0])], exits,
                                           then_branch=branches[0], else_branch=branches[1]))
        for n in names[1:]:
            self.switch_of[n] = self.switch_of[names[0]]
        for t in exits:
            if self.g.is_float(t):
                self.producer_state[t] = ACTIVE  # rounded or not: a HALF reader rounds it

    def _branch(self, body: list[onnx.NodeProto], exits: list[str], tag: str) -> onnx.GraphProto:
        """A branch graph: every name it defines made its own (no shadowing of outer names)."""
        own = {o: self.fresh(tag) for n in body for o in n.output if o}
        for n in body:
            n.input[:] = [own.get(t, t) for t in n.input]
            n.output[:] = [own.get(t, t) for t in n.output]
        return helper.make_graph(body, self.fresh(tag), [],
                                 [onnx.ValueInfoProto(name=own[t]) for t in exits])

    def _emit(self, node: onnx.NodeProto, new: onnx.NodeProto, name: str, mode: str) -> None:
        """Append `new` (node as rewired); under --fp16-accumulate a MatMul/Gemm/Conv that runs
        in FP16 computes its output in the blocked FP16-accumulating form instead."""
        spec = _blocking(self.g, node, name, self.rules.accumulate) if mode == HALF else None
        if spec is None:
            self.nodes.append(new)
        else:
            self._blocked(new, spec, new.output[0])

    def _blocked(self, new: onnx.NodeProto, spec: _Blocking, out: str) -> None:
        """The node's output accumulated in FP16: partial products over blocks of the inner
        dimension, each rounded to FP16, the running sum rounded after every add, the bias
        added last and rounded."""
        a, b = new.input[0], new.input[1]
        bias = new.input[2] if len(new.input) > 2 and new.input[2] else None
        attrs = [x for x in new.attribute if x.name not in ("alpha", "beta")]
        acc = ""
        for lo, hi in spec.blocks:
            part = self.fresh("part")
            node = helper.make_node(new.op_type, [self._slice(a, spec.axis_a, lo, hi),
                                                  self._slice(b, spec.axis_b, lo, hi)], [part])
            node.attribute.extend(attrs)
            self.nodes.append(node)
            rounded = self.fresh("partr")
            self.round_pair(part, rounded)
            if acc:
                total = self.fresh("sum")
                self.nodes.append(helper.make_node("Add", [acc, rounded], [total]))
                rounded = self.fresh("sumr")
                self.round_pair(total, rounded)
            acc = rounded
        if bias is not None:
            if spec.bias_shape is not None:
                shaped = self.fresh("bias")
                shape = self.fresh("bshape")
                self.inits.append(numpy_helper.from_array(np.array(spec.bias_shape, np.int64),
                                                          shape))
                self.nodes.append(helper.make_node("Reshape", [bias, shape], [shaped]))
                bias = shaped
            total = self.fresh("sum")
            self.nodes.append(helper.make_node("Add", [acc, bias], [total]))
            acc = self.fresh("sumr")
            self.round_pair(total, acc)
        self.nodes.append(helper.make_node("Identity", [acc], [out]))

    def _slice(self, t: str, axis: int, lo: int, hi: int) -> str:
        key = (t, axis, lo, hi)
        cache = self._slices
        if key not in cache:
            names = [self.fresh("s") for _ in range(3)]
            for n, v in zip(names, (lo, hi, axis)):
                self.inits.append(numpy_helper.from_array(np.array([v], np.int64), n))
            cache[key] = self.fresh("slice")
            self.nodes.append(helper.make_node("Slice", [t, *names], [cache[key]]))
        return cache[key]

    def _exact(self, node: onnx.NodeProto, name: str) -> bool:
        ins = self.g.float_inputs(name)  # an internal (raw) input makes the output inexact
        return (node.op_type in EXACT_OPS and set(ins) <= set(self.g.fp16_inputs(name))
                and not any(t in self.internal for t in ins))

    def build(self, expose: Sequence[str] = (), watch: Sequence[str] = (),
              half_outputs: bool = False) -> onnx.ModelProto:
        """The emulation model. `half_outputs`: graph outputs the model declares float16 are
        rounded (what a written mixed model stores there)."""
        base = structure(self.g.model)
        nodes = self.g.model.graph.node
        self._needed = {*self.g.output_names(), *expose, *watch}
        for t in dict.fromkeys([*expose, *watch]):  # values inside subgraphs: carried out
            at = self.g.scope_of(t)
            if at is not None:
                self.carried[t] = t
                while at is not None:
                    self._pending[at[0]].append((t, at[1]))
                    at = self.g.where[at[0]]
        reads = [node_reads(n) for n in nodes]
        self._readers = defaultdict(set)
        for i, ts in enumerate(reads):
            for t in ts:
                self._readers[t].add(i)
        for item in self._order(reads):
            if self.state.get(self.g.names[item[0]]) == ACTIVE:
                self._add_group(item)
            else:
                self.add(item[0], nodes[item[0]])
        gr = base.graph
        for v in list(gr.output):
            if (half_outputs and self.g.declared.get(v.name) in HALF_TYPES
                    and self.producer_state.get(v.name, FULL) != HALF):
                src = self.fresh("out")
                self._rename_value(v.name, src)
                self.round_pair(src, v.name, self.g.declared[v.name])
        if watch:
            self.nodes.extend(_nonfinite_flags([self.carried.get(t, t) for t in watch], self.sep))
        del gr.node[:]
        gr.node.extend(self.nodes)
        gr.initializer.extend(self.inits)
        used = {t for n in walk(self.nodes) for t in n.input} | {v.name for v in gr.output}
        # ORT drops unused initializers before it takes ours by reference (one pass: removing
        # them one by one rescans the list, 1.4 s for 4,000 of 6,000)
        kept = [t for t in gr.initializer if t.name in used]
        del gr.initializer[:]
        gr.initializer.extend(kept)
        gr.input.extend(helper.make_tensor_value_info(s, TensorProto.BOOL, [])
                        for s in dict.fromkeys(self.switch_of.values()))
        known = {v.name for v in gr.output}
        gr.output.extend(helper.make_tensor_value_info(self.carried.get(t, t), FLOAT, None)
                         for t in expose if t not in known)
        if watch:
            gr.output.append(helper.make_tensor_value_info(f"{self.sep}nonfinite", TensorProto.BOOL,
                                                           [len(watch)]))
        del gr.value_info[:]
        return base

    def _order(self, reads: list[list[str]]) -> list[list[int]]:
        """Node indices in a topological order where each active group is one item (graph
        order otherwise). A group that some path leaves and re-enters cannot be one node: its
        members become groups of their own."""
        groups: dict[str, list[int]] = {}
        for i, n in enumerate(self.g.names[:self.g.top]):  # subgraphs' nodes: _rebuild_bodies
            if self.state.get(n) == ACTIVE:
                groups.setdefault(self.group_of.get(n, n), []).append(i)
        while True:
            head = list(range(len(reads)))  # node -> the first index of its item
            for members in groups.values():
                for i in members:
                    head[i] = members[0]
            succ: dict[int, set[int]] = defaultdict(set)
            indegree = dict.fromkeys(set(head), 0)
            for i, ts in enumerate(reads):
                for t in ts:
                    p = self.g.producer.get(t)
                    if p is not None and head[p] != head[i] and head[i] not in succ[head[p]]:
                        succ[head[p]].add(head[i])
                        indegree[head[i]] += 1
            ready = [h for h, d in indegree.items() if d == 0]
            heapq.heapify(ready)
            order: list[int] = []
            while ready:
                h = heapq.heappop(ready)
                order.append(h)
                for s in succ[h]:
                    indegree[s] -= 1
                    if indegree[s] == 0:
                        heapq.heappush(ready, s)
            if len(order) == len(indegree):
                items = {members[0]: members for members in groups.values()}
                return [items.get(h, [h]) for h in order]
            stuck = set(indegree) - set(order)
            split = [k for k, m in groups.items() if m[0] in stuck and len(m) > 1]
            if not split:
                raise TrtBisectError("the model's graph has a cycle")
            for key in split:
                log.debug("active group %s is not convex: its nodes switch alone", key)
                for i in groups.pop(key):
                    groups[self.g.names[i]] = [i]
                    self.group_of[self.g.names[i]] = self.g.names[i]

    def weights_of(self, proto: onnx.ModelProto) -> dict[str, np.ndarray]:
        """Every array a session over `proto` (this builder's model) takes by reference: the
        copies this builder made, and the graph's own stored weights."""
        arrays = dict(self.arrays)
        for t in proto.graph.initializer:
            if _stored(t) and t.name not in arrays:
                arrays[t.name] = self.g.array(t.name)
        return arrays

    def _rename_value(self, old: str, new: str) -> None:
        """Make `new` the name of the value the graph computes as `old` (for a final rounding)."""
        for n in walk(self.nodes):
            for k, t in enumerate(n.output):
                if t == old:
                    n.output[k] = new
            for k, t in enumerate(n.input):
                if t == old:
                    n.input[k] = new


@dataclass(frozen=True)
class _Blocking:
    """How a node splits its inner dimension for --fp16-accumulate."""

    axis_a: int
    axis_b: int
    blocks: tuple[tuple[int, int], ...]
    bias_shape: tuple[int, ...] | None = None  # Conv: the bias reshaped to broadcast


_refused: set[tuple[str, str]] = set()  # (node, why): each refusal logged once per process


def _blocking(graph: Graph, node: onnx.NodeProto, name: str, block: int) -> _Blocking | None:
    """The blocked form of an FP16 MatMul / Gemm / Conv, or None: the node keeps FP32
    accumulation (flag off, another op, non-default attributes, K unknown or too long).
    Depends only on the node and static shapes, so the emulator and `check` of a written file
    decide alike."""
    if not block or node.op_type not in ("MatMul", "Gemm", "Conv"):
        return None
    spec, why = _spec(graph, node)
    if spec is None:
        _refuse(name, why)
        return None
    axis_a, axis_b, k, bias_shape = spec
    blocks = tuple((lo, min(k, lo + block)) for lo in range(0, k, block))
    if len(blocks) > MAX_ACCUMULATE_BLOCKS:
        _refuse(name, f"inner dimension {k} needs more than {MAX_ACCUMULATE_BLOCKS} blocks "
                      f"of {block}")
        return None
    return _Blocking(axis_a, axis_b, blocks, bias_shape)


def _refuse(name: str, why: str) -> None:
    if (name, why) not in _refused:
        _refused.add((name, why))
        log.info("--fp16-accumulate: %s keeps FP32 accumulation (%s)", name, why)


def _spec(graph: Graph, node: onnx.NodeProto
          ) -> tuple[tuple[int, int, int, tuple[int, ...] | None] | None, str]:
    """(axis of A, axis of B, K, the bias's broadcast shape) of a blockable node, or why not."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    a, b = _dims(graph, node.input[0]), _dims(graph, node.input[1])
    if node.op_type == "MatMul":
        if a is None or b is None:
            return None, "operand ranks unknown"
        axis_b = -2 if len(b) >= 2 else 0
        k = _known(a[-1], b[axis_b])
        return ((-1, axis_b, k, None), "") if k else (None, "inner dimension not static")
    if node.op_type == "Gemm":
        if attrs.get("alpha", 1.0) != 1.0 or (attrs.get("beta", 1.0) != 1.0
                                                and len(node.input) > 2 and node.input[2]):
            return None, "alpha or beta is not 1"
        axis_a, axis_b = (0 if attrs.get("transA", 0) else 1), (1 if attrs.get("transB", 0) else 0)
        k = _known(a[axis_a] if a else None, b[axis_b] if b else None)
        return ((axis_a, axis_b, k, None), "") if k else (None, "inner dimension not static")
    if attrs.get("group", 1) != 1:
        return None, "grouped convolution"
    if b is None or len(b) < 3:
        return None, "weight shape unknown"
    k = _known(a[1] if a and len(a) > 1 else None, b[1])
    if not k:
        return None, "input channels not static"
    return (1, 1, k, (-1,) + (1,) * (len(b) - 2)), ""


def _known(*dims: int | None) -> int:
    return next((d for d in dims if d), 0)


def _dims(graph: Graph, t: str) -> tuple[int | None, ...] | None:
    """Static dims of tensor t (None where unknown), from the initializer or shape inference."""
    if t in graph.initializers:
        return tuple(graph.initializers[t].dims)
    shapes = getattr(graph, "_static_dims", None)
    if shapes is None:
        shapes = {}
        try:
            inferred = onnx.shape_inference.infer_shapes(structure(graph.model), data_prop=True)
        except Exception as exc:  # best effort: unknown shapes keep FP32 accumulation
            log.info("shape inference failed for --fp16-accumulate: %s", _first_line(exc))
            inferred = graph.model
        for g in walk_graphs(inferred.graph):  # a Loop body's values too (per iteration)
            for v in [*g.input, *g.value_info, *g.output]:
                if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape"):
                    shapes[v.name] = tuple(d.dim_value if d.HasField("dim_value") else None
                                           for d in v.type.tensor_type.shape.dim)
        graph._static_dims = shapes  # type: ignore[attr-defined]
    return shapes.get(t)


def _separator(graph: Graph) -> str:
    names = graph.all_names()
    sep = "~tb"
    while any(sep in n for n in names):
        sep += "~"
    return sep + ":"


def _nonfinite_flags(watch: Sequence[str], sep: str) -> list[onnx.NodeProto]:
    """One bool per watched tensor: does it hold a NaN or an inf? (x - x is NaN exactly there.)"""
    nodes, flags = [], []
    shape, flat, zero = f"{sep}watch_shape", f"{sep}watch_flat", f"{sep}watch_zero"
    for k, t in enumerate(watch):
        p = f"{sep}watch{k}"
        nodes += [
            helper.make_node("Sub", [t, t], [f"{p}_d"]),
            helper.make_node("IsNaN", [f"{p}_d"], [f"{p}_n"]),
            helper.make_node("Cast", [f"{p}_n"], [f"{p}_f"], to=TensorProto.FLOAT),
            helper.make_node("Reshape", [f"{p}_f", flat], [f"{p}_v"]),
            # a zero more: the empty value of an If branch not taken reads as finite
            helper.make_node("Concat", [f"{p}_v", zero], [f"{p}_z"], axis=0),
            helper.make_node("ReduceMax", [f"{p}_z"], [f"{p}_m"], keepdims=0),
            helper.make_node("Reshape", [f"{p}_m", shape], [f"{p}_r"]),
        ]
        flags.append(f"{p}_r")
    nodes[:0] = [helper.make_node("Constant", [], [shape],
                                  value=helper.make_tensor("s", TensorProto.INT64, [1], [1])),
                 helper.make_node("Constant", [], [flat],
                                  value=helper.make_tensor("f", TensorProto.INT64, [1], [-1])),
                 helper.make_node("Constant", [], [zero],
                                  value=helper.make_tensor("z", TensorProto.FLOAT, [1], [0.0]))]
    nodes.append(helper.make_node("Concat", flags, [f"{sep}watch_all"], axis=0))
    nodes.append(helper.make_node("Cast", [f"{sep}watch_all"], [f"{sep}nonfinite"],
                                  to=TensorProto.BOOL))
    return nodes


def _session(graph: Graph, state: Mapping[str, str], rounded: Rounded, threads: int | None,
             expose: Sequence[str] = (), watch: Sequence[str] = (),
             half_outputs: bool = False, rules: Rules = STRICT,
             groups: Mapping[str, str] | None = None) -> tuple[Session, _Builder]:
    b = _Builder(graph, state, rounded, rules=rules, groups=groups)
    proto = b.build(expose, watch, half_outputs)
    return Session(proto, b.weights_of(proto), threads, aliases=b.carried), b


# ---------------------------------------------------------------- backends

class Reference:
    """The model in FP32 on ORT CPU: every candidate FP32 (a float16 model computes upcast,
    rounding only where a non-candidate such as its own Cast to float16 rounds)."""

    name = "ort-fp32"

    def __init__(self, graph: Graph, threads: int | None = None) -> None:
        self.graph, self.threads = graph, threads
        self.outputs = graph.output_names()
        self._rounded = Rounded.of(graph)
        self._sessions: dict[tuple[str, ...], Session] = {}  # one at a time: ORT copies weights

    def _session_for(self, names: Sequence[str]) -> Session:
        key = tuple(n for n in names if n not in self.outputs)
        if key not in self._sessions:
            self._sessions.clear()  # the last session's weights go before the next one's come
            self._sessions[key] = _session(self.graph, {}, self._rounded, self.threads, key)[0]
        return self._sessions[key]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = self._session_for(()).run(feeds, self.outputs)
        return {n: as_array(v) for n, v in zip(self.outputs, values)}

    def run_tensors(self, feeds: Mapping[str, np.ndarray], names: Sequence[str]) -> dict[str, np.ndarray]:
        values = self._session_for(names).run(feeds, list(names))
        return {n: as_array(v) for n, v in zip(names, values)}

    def close(self) -> None:
        self._sessions.clear()


class Emulator:
    """Backend: the FP16 emulator. See the module docstring for the exact semantics.

    `active`: the nodes switchable without a rebuild (default: none; the first plan that needs
    more rebuilds around it). The session is built on first use, around every node `ensure`d
    by then. `groups`: nodes that plans keep together (the search's units);
    each switches as one `If`, and a plan that splits one splits it for good (a rebuild).
    `rebuilds` counts sessions built, for cost accounting.
    """

    name = "ort-emulator"

    def __init__(self, graph: Graph, threads: int | None = None,
                 expose: Sequence[str] = (), watch: Sequence[str] = (),
                 active: Iterable[str] = (), rules: Rules = STRICT,
                 groups: Iterable[Iterable[str]] = ()) -> None:
        self.graph, self.threads, self.rules = graph, threads, rules
        self._candidates = graph.candidates()
        self._cand_set = frozenset(self._candidates)
        self._position = {n: k for k, n in enumerate(self._candidates)}
        self._part = {n: frozenset((n,)) for n in self._candidates}  # node -> its group
        for group in groups:
            members = frozenset(group) & self._cand_set
            for n in members:
                self._part[n] = members
        self.expose, self.watch = list(expose), list(watch)
        self.outputs = graph.output_names()
        self._rounded = Rounded.of(graph, rules.weight_rule, rules.precision)
        self.rebuilds = 0
        self.session: Session | None = None
        self._switches: dict[str, frozenset[str]] = {}  # bool input -> the nodes it switches
        self._reference: Reference | None = None
        self.active: frozenset[str] = self._whole(frozenset(active) & self._cand_set)  # built on first use
        self._nonfinite = f"{_separator(graph)}nonfinite"  # the watch flags' output
        # all-FP32 is the plain reference graph (no TF32 reads, no flags or exposed tensors,
        # no half-typed outputs to round)
        self._plain_fp32 = not (rules.tf32 or self.watch or self.expose or any(
            t in HALF_TYPES for t in graph.declared.values()))

    def candidates(self) -> list[str]:
        return list(self._candidates)

    def _whole(self, nodes: frozenset[str]) -> frozenset[str]:
        return frozenset().union(*{self._part[n] for n in nodes})

    def _build(self, active: frozenset[str]) -> None:
        state = {n: (ACTIVE if n in active else HALF) for n in self._candidates}
        key = {n: min(self._part[n], key=self._position.__getitem__) for n in active}
        self.session = None  # the old session's weights go before the new one's come
        self.session, b = _session(self.graph, state, self._rounded, self.threads, self.expose,
                                   self.watch, half_outputs=True, rules=self.rules, groups=key)
        self.active = active
        switches: dict[str, set[str]] = defaultdict(set)
        for n, s in b.switch_of.items():
            switches[s].add(n)
        self._switches = {s: frozenset(ns) for s, ns in switches.items()}
        self.rebuilds += 1
        log.debug("emulator session %d: %d switchable nodes in %d groups", self.rebuilds,
                  len(active), len(self._switches))

    def _known(self, fp32_nodes: Iterable[str]) -> frozenset[str]:
        need = frozenset(fp32_nodes)
        unknown = need - self._cand_set
        if unknown:
            raise TrtBisectError(f"not switchable nodes in plan: {', '.join(sorted(unknown))}")
        return need

    def ensure(self, fp32_nodes: Iterable[str]) -> None:
        """Make every plan inside `fp32_nodes` (whole groups) runnable without a rebuild."""
        need = self._whole(self._known(fp32_nodes))
        if not need <= self.active or self.session is None:  # a closed emulator reopens
            self._build(self.active | need)

    def feeds_for(self, fp32_nodes: frozenset[str]) -> dict[str, bool]:
        """Each switch of the session the plan needs: True where its group runs in FP16."""
        need = self._known(fp32_nodes)
        split = [p for p in {self._part[n] for n in need} if not p <= need]
        if any(p & self.active for p in split):
            self.session = None  # its If nodes switch the whole group
        for part in split:  # the plan splits a group: its two sides switch apart from now on
            for side in (part & need, part - need):
                for n in side:
                    self._part[n] = side
        self.ensure(need)
        return {s: not ns <= need for s, ns in self._switches.items()}

    def _run(self, fp32_nodes: frozenset[str] | None, feeds: Mapping[str, np.ndarray],
             names: Sequence[str]) -> list[np.ndarray]:
        if (fp32_nodes is not None and self._plain_fp32 and not self._cand_set <= self.active
                and frozenset(fp32_nodes) >= self._cand_set):
            fp32_nodes = None  # the static all-FP32 graph is the reference's: no rebuild
        if fp32_nodes is None:  # everything FP32: the reference itself, bit for bit
            if self._reference is None:
                self._reference = Reference(self.graph, self.threads)
            ref = self._reference.run_tensors(feeds, names) if set(names) - set(self.outputs) \
                else self._reference.run(feeds)
            return [ref[n] for n in names]
        switches = self.feeds_for(frozenset(fp32_nodes))
        assert self.session is not None
        return self.session.run({**feeds, **{s: _SWITCH[on] for s, on in switches.items()}},
                                names)

    def run(self, fp32_nodes: frozenset[str] | None, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = self._run(fp32_nodes, feeds, self.outputs)
        return {n: as_array(v) for n, v in zip(self.outputs, values)}

    def run_tensors(self, fp16: bool, feeds: Mapping[str, np.ndarray],
                    names: Sequence[str]) -> dict[str, np.ndarray]:
        """Exposed intermediate tensors of an all-FP16 (fp16=True) or all-FP32 run (pass them
        as `expose=` at construction for FP16)."""
        return self.run_tensors_for(frozenset() if fp16 else None, feeds, names)

    def run_tensors_for(self, fp32_nodes: frozenset[str] | None, feeds: Mapping[str, np.ndarray],
                        names: Sequence[str]) -> dict[str, np.ndarray]:
        """Outputs and exposed tensors under a plan (None: everything FP32)."""
        values = self._run(fp32_nodes, feeds, names)
        return {n: as_array(v) for n, v in zip(names, values)}

    def nonfinite(self, fp32_nodes: frozenset[str], feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list[str]]:
        """Outputs, and the watched tensors that hold a NaN or inf under the plan."""
        if not self.watch:  # nothing watched: the graph has no flags output
            return self.run(fp32_nodes, feeds), []
        values = self._run(fp32_nodes, feeds, [*self.outputs, self._nonfinite])
        flags = np.asarray(values[-1]).reshape(-1)
        bad = [t for t, f in zip(self.watch, flags) if f]
        return {n: as_array(v) for n, v in zip(self.outputs, values[:-1])}, bad

    def close(self) -> None:
        self.session = None
        if self._reference is not None:
            self._reference.close()


class MixedModel:
    """`check`'s judge: any mixed-precision model (ours, AutoCast's, a hand-made FP16 one) in
    FP32 with every float16 tensor rounded where it is produced, so each FP16 op computes in
    FP32 on FP16-exact inputs and stores an FP16-rounded output, as the emulator does."""

    def __init__(self, graph: Graph, threads: int | None = None, rules: Rules = STRICT,
                 fused: bool = False, expose: Sequence[str] = ()) -> None:
        """`rules`: its tf32 flag; `fused` (trt semantics): the internal tensors of the
        certain fused layers that run wholly in FP16 in this file are not rounded. `expose`:
        intermediate tensors `run_tensors` returns too (the judge's graph, `proto`, keeps
        only the model's outputs)."""
        self.graph = graph
        self.outputs = graph.output_names()
        self.exposed = [t for t in expose if t not in self.outputs]
        b = _mixed_builder(graph, rules, fused)
        self.proto = b.build(self.exposed)
        self.arrays = b.weights_of(self.proto)
        self.session = Session(self.proto, self.arrays, threads, aliases=b.carried)
        del self.proto.graph.output[len(self.outputs):]  # built: what is exposed goes

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.run_tensors(feeds)[0]

    def run_tensors(self, feeds: Mapping[str, np.ndarray]
                    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The outputs, and the exposed tensors."""
        fed = {k: v for k, v in feeds.items() if k in self.session.inputs}
        names = self.outputs + self.exposed
        values = [np.asarray(v, np.float32) for v in self.session.run(fed, names)]
        return dict(zip(self.outputs, values)), dict(zip(names, values))


def emulation_of_mixed(graph: Graph, rules: Rules | None = None, fused: bool = False,
                       expose: Sequence[str] = ()) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The FP32 model `MixedModel` runs (weights by reference): also what Polygraphy's ONNX
    Runtime runs to check a plan without a GPU, since ORT's own float16 kernels hide overflow.
    `fused` (trt semantics): the internal tensors of the certain fused layers that run wholly
    in FP16 in this file are not rounded. `expose`: intermediate tensors made outputs too."""
    b = _mixed_builder(graph, rules, fused)
    proto = b.build(expose)
    return proto, b.weights_of(proto)


def _mixed_builder(graph: Graph, rules: Rules | None, fused: bool) -> _MixedBuilder:
    rules = rules or STRICT
    half = {graph.names[graph.producer[t]] for t in graph.half_typed if t in graph.producer}
    state = {n: HALF for n in graph.candidates() if n in half}
    internal = half_layer_internals(graph) if fused else frozenset()
    return _MixedBuilder(graph, state, Rounded.of(graph),
                         rules=Rules(internal, rules.weight_rule, rules.tf32, rules.accumulate,
                                     rules.precision))


class _MixedBuilder(_Builder):
    """A mixed model's own types decide: a half-typed value is rounded where it is produced
    (graph inputs included); nothing else is."""

    alias: dict[str, str]

    def add(self, i: int, node: onnx.NodeProto) -> None:
        name = self.g.names[i]
        new = onnx.NodeProto()
        new.CopyFrom(node)
        new.name = name
        new.input[:] = [self.alias.get(t, t) for t in new.input]
        ins = [t for t in node.input if self.g.is_float(t)]
        exact = node.op_type in EXACT_OPS and all(t in self.g.half_typed and t not in self.internal
                                                  for t in ins)
        outs = [t for t in node.output if self.g.is_float(t)]
        if name in self.cands and outs and not any(t in self.g.half_typed for t in outs):
            for k in self.rules.tf32_inputs(node.op_type):  # an FP32 inner product
                if k < len(new.input) and self.g.is_float(node.input[k]):
                    new.input[k] = self.tf32_of(new.input[k])
        rounds = []
        for k, t in enumerate(new.output):
            if t in self.internal:
                continue  # inside an FP16 fused layer: stays in the kernel
            if t in self.g.half_typed and not (exact and all(
                    self.g.half_typed.get(x) == self.g.half_typed[t] for x in ins)):
                new.output[k] = self.fresh("raw")
                rounds.append((new.output[k], t))
        self._rebuild_bodies(i, new)
        self._emit(node, new, name, self.state.get(name, FULL))
        for raw, t in rounds:
            self.round_pair(raw, t, self.g.half_typed[t])

    def build(self, expose: Sequence[str] = (), watch: Sequence[str] = (),
              half_outputs: bool = False) -> onnx.ModelProto:
        self.alias = {}
        for v in self.g.inputs():  # fed data is rounded to the input's own type on the way in
            if v.name in self.g.half_typed:
                self.alias[v.name] = self.fresh("fed")
                self.round_pair(v.name, self.alias[v.name], self.g.half_typed[v.name])
        return super().build(expose, watch, half_outputs=False)


def half_layer_internals(graph: Graph) -> frozenset[str]:
    """Internal tensors of the certain fused layers (found on the file's FP32 view) whose
    every node stores float16 in the file: TensorRT runs each as one FP16 kernel."""
    out: set[str] = set()
    for layer in find_layers(graph.model):
        outs = [t for n in layer.nodes if n in graph.index for t in graph.float_outputs(n)]
        if layer.certain and outs and all(t in graph.half_typed for t in outs):
            out.update(layer.internal)
    return frozenset(out)


def kernel_noise(graph: Graph, samples: Sequence[Mapping[str, np.ndarray]],
                 references: Sequence[Mapping[str, np.ndarray]],
                 threads: int | None = None) -> dict[str, float]:
    """Per output, how far FP32 itself moves under changes that mean nothing: ORT's default,
    optimizing kernels (fusions, prepacked weights, NCHWc) instead of the judge's, and float
    inputs nudged by one FP32 ulp. TensorRT's kernels differ from both, so a plan whose
    margin under the bound is below this floor is fragile. (The certificate measures the
    optimized half on the sessions of its own optimized variation: `nudge_noise`.)"""
    proto, arrays = _fp32_graph(graph)
    try:
        optimized = Session(proto, arrays, judge_threads(threads), judge=False)
    except TrtBisectError as exc:  # the noise floor is a diagnostic: never fail a run over it
        log.info("kernel noise not measured: %s", exc)
        return {}
    names = graph.output_names()
    noise: dict[str, float] = {}
    for sample, ref in zip(samples, references):
        fed = {k: v for k, v in sample.items() if k in optimized.inputs}
        fp32_moves(noise, ref, dict(zip(names, optimized.run(fed, names))))
    for name, d in nudge_noise(graph, samples, references, threads).items():
        noise[name] = max(noise.get(name, 0.0), d)
    return noise


def nudge_noise(graph: Graph, samples: Sequence[Mapping[str, np.ndarray]],
                references: Sequence[Mapping[str, np.ndarray]],
                threads: int | None = None) -> dict[str, float]:
    """Per output, how far the judge's own FP32 moves when every float input is nudged by one
    FP32 ulp (up or down at random, seeded): half of `kernel_noise`."""
    return nudge_moves(references, _nudged_runs(Session(*_fp32_graph(graph), threads), samples,
                                                graph.output_names()))


def nudge_moves(references: Sequence[Mapping[str, np.ndarray]],
                nudged: Sequence[Mapping[str, np.ndarray]]) -> dict[str, float]:
    """`nudge_noise` from the nudged runs' outputs (`_nudged_runs`), per sample."""
    noise: dict[str, float] = {}
    for ref, got in zip(references, nudged):
        fp32_moves(noise, ref, got)
    return noise


def _nudged_runs(judge: Session, samples: Sequence[Mapping[str, np.ndarray]],
                 names: Sequence[str]) -> list[dict[str, np.ndarray]]:
    """The FP32 judge session's outputs with every float input nudged by one ulp (seeded)."""
    rng = np.random.default_rng(0)
    out = []
    for sample in samples:
        fed = {k: np.asarray(v, np.float32) if k in judge.float_inputs else np.asarray(v)
               for k, v in sample.items()}
        nudged = {k: (np.nextafter(v, np.where(rng.random(v.shape) < 0.5, -np.inf, np.inf)
                                   .astype(np.float32)) if v.dtype == np.float32 else v)
                  for k, v in fed.items()}
        out.append(dict(zip(names, judge.run(nudged, names))))
    return out


def fp32_moves(noise: dict[str, float], reference: Mapping[str, np.ndarray],
               got: Mapping[str, np.ndarray]) -> None:
    """Raise `noise[output]` to the largest finite |got - reference| of each output; a moved
    shape (a data-dependent output: Unique, NonZero) is an infinite move, as FP32 itself
    then computes another tensor."""
    for name, value in got.items():
        r = np.asarray(reference[name], np.float64)
        g = np.asarray(value, np.float64)
        if r.shape != g.shape:
            noise[name] = math.inf
            continue
        finite = np.isfinite(r) & np.isfinite(g)
        d = float(np.max(np.abs(g - r)[finite], initial=0.0))
        noise[name] = max(noise.get(name, 0.0), d)


def _fp32_graph(graph: Graph) -> tuple[onnx.ModelProto, Mapping[str, np.ndarray]]:
    """The FP32 model as the judge builds it (nothing rounded): a proto and its weights."""
    b = _Builder(graph, {}, Rounded.of(graph))
    proto = b.build()
    return proto, b.weights_of(proto)


def judge_threads(threads: int | None) -> int:
    """The intra-op threads a judging session runs on (None: every core, at least 2)."""
    import os

    return threads or max(2, os.cpu_count() or 1)


@dataclass(frozen=True)
class Variant:
    """One way the tools may compute what the judge computes: ONNX Runtime with its default
    graph optimizations (fusions, constant folding, prepacked weights: what `polygraphy run
    --onnxrt` and a plain InferenceSession run) or the judge's settings, on some threads."""

    optimized: bool
    threads: int

    @property
    def label(self) -> str:
        opt = "ORT optimizations on" if self.optimized else "ORT optimizations off"
        return f"{opt}, {self.threads} thread{'s' if self.threads != 1 else ''}"


def variants(threads: int | None) -> list[Variant]:
    """The variations beside the judge's own run (optimizations off on `threads`, None: every
    core): ORT's default optimizations on the judge's threads (what `polygraphy run --onnxrt`
    and a plain InferenceSession compute on this machine), and optimizations off on the other
    thread count (one thread where the judge uses several, else every core: a reduction split
    otherwise). Two variations, four sessions: on a 20k-node transformer each session of the
    written file costs seconds, and the combination of both changes (optimized on one thread)
    moved no certificate measured (docs/search_benchmark.md)."""
    import os

    judge = judge_threads(threads)
    other = 1 if judge != 1 else max(2, os.cpu_count() or 1)
    return [Variant(True, judge), Variant(False, other)]


# The FP32 reference under each variation is computed in a child process (another core) while
# the emulated file's sessions run here, when the FP32 model's weights are at most this many
# bytes (the child holds its own copy of them: a second copy of gigabytes would break the
# memory promise)
VARIANT_CHILD_BYTES = 1 << 30


# The references under each variant are kept for the run's later certificates (the aimed
# rounds' plans have the same FP32 references) while they hold at most this many bytes
VARIANT_KEEP_BYTES = 256 << 20


class VariantReferences:
    """What the certificate and the validation compute of FP32 whatever the plan: the FP32
    reference's outputs under each variant, per sample (kept for the run's later certificates,
    `VARIANT_KEEP_BYTES`), and the FP32 judge session's runs: the nudged samples (the noise
    floor, `nudge_noise`) and the validation's perturbed copies (`others`: their references,
    as `Reference.run` computes them). On a graph worth a child process (base/child.py) whose
    weights fit `VARIANT_CHILD_BYTES`, `start` computes them in a spawned child from the moment
    the samples are known, beside the run's stages (the loads, the all-FP16 verdict, the
    search: one core's work here); the same sessions of the same proto and weights, so the
    same numbers bit for bit as here. `close` ends the child on every way out."""

    def __init__(self, graph: Graph, samples: Sequence[Mapping[str, np.ndarray]],
                 threads: int | None,
                 others: Sequence[Mapping[str, np.ndarray]] | None = None) -> None:
        self.graph, self.samples, self.threads, self.others = graph, samples, threads, others
        self.every = variants(threads)
        self._child: _ReferenceChild | None = None
        self._kept: list[list[dict[str, np.ndarray]]] | None = None
        self._runs: tuple[list, list] | None = None  # (nudged, others' references)

    @classmethod
    def start(cls, graph: Graph, samples: Sequence[Mapping[str, np.ndarray]],
              threads: int | None,
              others: Sequence[Mapping[str, np.ndarray]] | None = None,
              judge_runs: bool = True) -> VariantReferences:
        """`others`: samples whose FP32 references the run will want (None: none);
        `judge_runs`: the judge session's runs too (the nudged samples, `others`)."""
        refs = cls(graph, samples, threads, others)
        if child_mod.worth_a_child(len(graph.names)):
            reference = _fp32_graph(graph)
            if _weight_bytes(reference[1]) <= VARIANT_CHILD_BYTES:
                runs = JudgeRuns(threads, [dict(o) for o in others or ()]) if judge_runs else None
                refs._child = _ReferenceChild.start(
                    refs.every, reference, list(samples), graph.output_names(), runs,
                    rebuild=lambda: _fp32_graph(graph))
        return refs

    def beside(self) -> bool:
        """Whether the references come from elsewhere than the caller's own sessions: a
        child computes them, or they are kept."""
        return self._kept is not None or self._child is not None

    def serves(self, graph: Graph, samples: Sequence[Mapping[str, np.ndarray]],
               threads: int | None) -> bool:
        """Whether these are the references a certificate of `graph` on `samples` needs."""
        return graph is self.graph and samples is self.samples and threads == self.threads

    def _wait(self) -> list[list[dict[str, np.ndarray]]] | None:
        if self._child is None:
            return None
        began = time.perf_counter()
        got, self._runs = self._child.everything()
        self._child = None
        log.info("the certificate's FP32 references: waited %.1f s for them",
                 time.perf_counter() - began)
        self.keep(got)
        return got

    def results(self) -> list[list[dict[str, np.ndarray]]] | None:
        """Per variant, per sample (the child's, waited for); None: neither started nor kept."""
        return self._kept if self._kept is not None else self._wait()

    def nudged(self, graph: Graph, samples: Sequence[Mapping[str, np.ndarray]],
               threads: int | None) -> list | None:
        """The nudged runs of `samples` (`nudge_moves` makes the noise floor of them, once a
        run: given once, then let go); None: not computed early for these."""
        if not self.serves(graph, samples, threads):
            return None
        self.results()
        if self._runs is None:
            return None
        nudged, self._runs = self._runs[0], ([], self._runs[1])
        return nudged or None

    def of_others(self, samples: Sequence[Mapping[str, np.ndarray]]
                  ) -> list[dict[str, np.ndarray]] | None:
        """The FP32 references of `samples` when they are the `others` given (the same
        object); None: not computed early."""
        if self.others is None or samples is not self.others:
            return None
        self.results()
        return self._runs[1] if self._runs is not None else None

    def keep(self, got: list[list[dict[str, np.ndarray]]]) -> None:
        if sum(a.nbytes for per in got for o in per for a in o.values()) <= VARIANT_KEEP_BYTES:
            self._kept = got

    def close(self) -> None:
        if self._child is not None:
            self._child.close()
            self._child = None


def variant_runs(graph: Graph, emulated: tuple[onnx.ModelProto, Mapping[str, np.ndarray]],
                 samples: Iterable[Mapping[str, np.ndarray]], threads: int | None = None,
                 references: VariantReferences | None = None):
    """For each variant and sample: the FP32 reference and the judged file's emulated graph
    (what Polygraphy's check of the mixed model runs), both computed under the variant. Yields
    (variant, sample index, reference outputs, emulated outputs), variant by variant in
    `variants` order, sample by sample. `references`: the run's, started or kept before (used
    when they serve this graph and these samples); else started here, so that the FP32
    references run in a spawned child (when the graph is worth one: `VariantReferences`) while
    the emulated sessions run here: on a 20k-node transformer each session costs seconds
    (ORT's optimizations on the FP32 graph alone 14 s), and a session build holds the GIL (a
    thread would not help). With no child, both sessions run here, a variant at a time."""
    names = graph.output_names()
    every = variants(threads)
    listed = samples if isinstance(samples, Sequence) else list(samples)
    owned = None
    mine = references if (references is not None
                          and references.serves(graph, listed, threads)) else None
    if mine is None:
        mine = owned = VariantReferences.start(graph, listed, threads, judge_runs=False)
    try:
        if not mine.beside():
            kept: list[list[dict[str, np.ndarray]]] = [[] for _ in every]
            reference = _fp32_graph(graph)
            for i, v in enumerate(every):
                for v_, k, r, e in _variant_run(v, reference, emulated, listed, names):
                    kept[i].append(r)
                    yield v_, k, r, e
            mine.keep(kept)
            return
        ran = [[e for _, e in _session_runs(v, emulated, listed, names, np.float32)]
               for v in every]
        for v, fp32, emus in zip(every, mine.results() or [], ran):
            for k, (r, e) in enumerate(zip(fp32, emus)):
                yield v, k, r, e
    finally:
        if owned is not None:
            owned.close()


def _weight_bytes(arrays: Mapping[str, np.ndarray]) -> int:
    return sum(np.asarray(a).nbytes for a in arrays.values())


def _session_runs(v: Variant, model: tuple[onnx.ModelProto, Mapping[str, np.ndarray]],
                  samples: Sequence[Mapping[str, np.ndarray]], names: Sequence[str],
                  dtype=None) -> list[tuple[int, dict[str, np.ndarray]]]:
    """One model's outputs under variant `v`, per sample (`dtype`: the outputs converted)."""
    session = Session(*model, v.threads, judge=not v.optimized)
    out = []
    for k, sample in enumerate(samples):
        fed = {n: x for n, x in sample.items() if n in session.inputs}
        out.append((k, dict(zip(names, (np.asarray(x, dtype) for x in session.run(fed, names))))))
    return out


def _variant_run(v: Variant, reference: tuple[onnx.ModelProto, Mapping[str, np.ndarray]],
                 emulated: tuple[onnx.ModelProto, Mapping[str, np.ndarray]],
                 samples: Sequence[Mapping[str, np.ndarray]], names: Sequence[str]):
    """One variant's (variant, sample index, reference outputs, emulated outputs) per sample,
    both sessions here (one variant's two at a time)."""
    ref = Session(*reference, v.threads, judge=not v.optimized)
    emu = Session(*emulated, v.threads, judge=not v.optimized)
    for k, sample in enumerate(samples):
        r = dict(zip(names, (np.asarray(x) for x in ref.run(sample, names))))
        fed = {n: x for n, x in sample.items() if n in emu.inputs}
        e = dict(zip(names, (np.asarray(x, np.float32) for x in emu.run(fed, names))))
        yield v, k, r, e
    del ref, emu


def _references(every: Sequence[Variant],
                reference: tuple[onnx.ModelProto, Mapping[str, np.ndarray]],
                samples: Sequence[Mapping[str, np.ndarray]], names: Sequence[str]
                ) -> list[list[dict[str, np.ndarray]]]:
    """Per variant, per sample: the FP32 reference's outputs under it, computed as
    `_variant_run` computes them (the sample fed whole)."""
    out = []
    for v in every:
        ref = Session(*reference, v.threads, judge=not v.optimized)
        out.append([dict(zip(names, (np.asarray(x) for x in ref.run(sample, names))))
                    for sample in samples])
        del ref
    return out


@dataclass(frozen=True)
class JudgeRuns:
    """What the FP32 judge session (optimizations off, the judge's threads) computes that no
    plan changes: the nudged runs of every sample (`nudge_noise`) and the references of
    other samples (the validation's perturbed copies: what `Reference.run` computes)."""

    threads: int | None
    others: list[dict[str, np.ndarray]]


def _judge_runs(runs: JudgeRuns, reference: tuple[onnx.ModelProto, Mapping[str, np.ndarray]],
                samples: Sequence[Mapping[str, np.ndarray]], names: Sequence[str]
                ) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
    """The nudged outputs of `samples` and the FP32 outputs of `runs.others`, each computed as
    `nudge_noise` and `Reference.run` compute them (the same proto, session and feeds)."""
    judge = Session(*reference, runs.threads)
    nudged = _nudged_runs(judge, samples, names)
    others = [{n: as_array(v) for n, v in zip(names, judge.run(o, names))} for o in runs.others]
    return nudged, others


def _early(every: Sequence[Variant], reference: tuple[onnx.ModelProto, Mapping[str, np.ndarray]],
           samples: Sequence[Mapping[str, np.ndarray]], names: Sequence[str],
           runs: JudgeRuns | None = None) -> tuple:
    """`_references`, and with `runs` the judge session's (`_judge_runs`; else None)."""
    refs = _references(every, reference, samples, names)
    return refs, (_judge_runs(runs, reference, samples, names) if runs is not None else None)


def _references_in_child(conn) -> None:
    """The child's side of `_ReferenceChild`: the task comes down `conn`, the outputs (or the
    error met) go back up it."""
    try:
        every, (proto, arrays), samples, names, runs = conn.recv()
        answer: tuple = ("done", _early(every, (onnx.load_from_string(proto), arrays),
                                        samples, names, runs))
    except TrtBisectError as exc:
        answer = ("error", str(exc))
    except BaseException as exc:  # noqa: BLE001 - the parent runs the references itself
        answer = ("failed", f"{type(exc).__name__}: {exc}")
    try:
        conn.send(answer)
    finally:
        conn.close()


class _ReferenceChild:
    """The FP32 reference's runs under each variant in a spawned child process (never forked:
    a fork copies ORT's threads and memory). `results()` waits for them; a child that dies or
    fails otherwise than with a TrtBisectError is replaced by the same runs here (the same
    numbers, only later); `close()` ends it whatever happened."""

    def __init__(self, task: tuple, proc, conn):
        self._task, self._proc, self._conn = task, proc, conn

    @classmethod
    def start(cls, every: Sequence[Variant], reference, samples, names,
              runs: JudgeRuns | None = None,
              rebuild: Callable[[], tuple] | None = None) -> _ReferenceChild:
        """`rebuild`: makes `reference` again for the runs here, should the child fail (the
        reference proto and its weights are then not held here meanwhile: a child started
        early lives as long as the run)."""
        task = (list(every), None if rebuild is not None else reference, samples, names, runs,
                rebuild)
        got = child_mod.start(_references_in_child, (), "trtbisect-variant", duplex=True,
                              why="the certificate's references")
        if got is None:
            return cls(task, None, None)
        proc, mine = got
        try:
            mine.send((list(every), (reference[0].SerializeToString(), dict(reference[1])),
                       [dict(s) for s in samples], list(names), runs))
        except (OSError, EOFError):
            pass  # the child is gone already: `results` runs the references here
        return cls(task, proc, mine)

    def results(self) -> list[list[dict[str, np.ndarray]]]:
        """Per variant, per sample: the FP32 reference's outputs."""
        return self.everything()[0]

    def everything(self) -> tuple:
        """`_early`'s answer: the references, and the judge session's runs when asked."""
        answer: tuple = ("failed", "no child process")
        if self._conn is not None:
            try:
                answer = self._conn.recv()
            except (EOFError, OSError):
                answer = ("failed", "the child process ended without an answer")
            finally:
                self.close()
        if answer[0] == "error":
            raise TrtBisectError(answer[1])
        if answer[0] == "failed":
            log.info("the certificate's FP32 references run here: %s", answer[1])
            every, reference, samples, names, runs, rebuild = self._task
            return _early(every, reference if rebuild is None else rebuild(), samples, names,
                          runs)
        return answer[1]

    def close(self) -> None:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        child_mod.end(proc, conn)


def as_array(value) -> np.ndarray:
    """One output as an array. A sequence output (SplitToSequence) of tensors of one shape
    stacks; of several shapes, its elements flattened end to end (a moved element shape is
    then a moved length: an infinite difference, judge/compare.py)."""
    if isinstance(value, (list, tuple)) and value:
        try:
            return np.asarray(value)
        except ValueError:
            return np.concatenate([np.ravel(np.asarray(v)) for v in value])
    return np.asarray(value)
