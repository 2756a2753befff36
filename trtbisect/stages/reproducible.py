"""Is the FP32 reference reproducible? A model that draws random numbers (the Random* ops,
Multinomial, Bernoulli, Dropout in training mode) gives other outputs run after run, so any
FP16 error measured against it is noise: such a run stops with `reference_unstable`.

Only a graph holding such an op is run twice (one extra session, two inferences of the first
sample): two runs of one session, since the judge reuses its sessions. A seed does not save
it: ONNX Runtime's kernels seed their generator once per session and draw on run after run, so
only a fresh session repeats the first draw. Whether the op's FP16 copy (its float16 kernel,
seeded alike) draws the same numbers, rounded, is measured on the op alone and said.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..graph import Graph, constant_value

RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                        "RandomUniformLike", "Multinomial", "Bernoulli"})


@dataclass(frozen=True)
class Drawing:
    """A node that may draw random numbers."""

    name: str
    op: str
    seed: float | None

    def words(self) -> str:
        return f"{self.name!r} ({self.op}{'' if self.seed is None else f', seed {self.seed:g}'})"


def drawing_nodes(graph: Graph) -> list[Drawing]:
    """Nodes that may draw random numbers, subgraphs' too: the Random* family, Multinomial,
    Bernoulli, and a Dropout whose training_mode is not a constant false."""
    out = []
    for name, node in zip(graph.names, graph.nodes):
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type in RANDOM_OPS or (node.op_type == "Dropout" and _training(graph, node)):
            seed = next((a.f for a in node.attribute if a.name == "seed"), None)
            out.append(Drawing(name, node.op_type, seed))
    return out


def _training(graph: Graph, node: onnx.NodeProto) -> bool:
    """Dropout trains when its third input (opset 12 on) is not a constant false."""
    if len(node.input) < 3 or not node.input[2]:
        return False
    t = node.input[2]
    if t in graph.initializers and t not in graph.producer:
        return bool(np.asarray(graph.array(t)).any())
    if t in graph.producer:
        made = graph.nodes[graph.producer[t]]
        if made.op_type == "Constant":
            value = constant_value(made)
            return value is None or bool(np.asarray(value).any())
    return True  # fed, or computed: it may be true


def unstable(graph: Graph, sample: Mapping[str, np.ndarray], threads: int | None
             ) -> list[str]:
    """Lines saying how two FP32 runs of one session differ on `sample` and which nodes draw
    random numbers; empty when the model holds no such node or the runs agree bit for bit."""
    nodes = drawing_nodes(graph)
    if not nodes:
        return []
    from ..backends.ort import Reference
    ref = Reference(graph, threads)
    try:
        first, second = ref.run(sample), ref.run(sample)
    finally:
        ref.close()
    lines = []
    for name in graph.output_names():
        a, b = np.asarray(first[name]), np.asarray(second[name])
        if a.shape != b.shape or not np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"):
            lines.append(f"output {name!r} differs between two FP32 runs on the same sample"
                         + _by(a, b))
    if not lines:
        return []
    for d in nodes[:3]:
        lines.append(f"{d.words()} draws random numbers: " + _why(graph, d))
    if len(nodes) > 3:
        lines.append(f"and {len(nodes) - 3} more such node(s)")
    lines.append("judge the model as deployed: export it in inference mode (Dropout's "
                 "training_mode false) or without its random nodes, then run again")
    return lines


def _by(a: np.ndarray, b: np.ndarray) -> str:
    if a.shape != b.shape or a.dtype.kind not in "fc" or not a.size:
        return ""
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return f" (max|d| {float(np.nanmax(d)) if np.isfinite(d).any() else float('nan'):.3g})"


def _why(graph: Graph, d: Drawing) -> str:
    if d.seed is None:
        return "unseeded, every run draws others"
    same = fp16_draws_alike(graph.node(d.name))
    fp16 = ("" if same is None else "; its FP16 copy, seeded alike, draws the same numbers "
            "(rounded)" if same else "; its FP16 copy, seeded alike, draws other numbers")
    return ("its seed fixes the first draw of a session only (ONNX Runtime draws on from it run "
            f"after run){fp16}")


def fp16_draws_alike(node: onnx.NodeProto) -> bool | None:
    """Does the op, alone in a fresh session, draw in float16 the numbers it draws in float32
    (rounded)? None where that cannot be measured (the op alone does not run)."""
    try:
        a = _draw(node, TensorProto.FLOAT)
        b = _draw(node, TensorProto.FLOAT16)
    except Exception:  # ORT raises several types; the line then says nothing of FP16
        return None
    return bool(np.array_equal(a.astype(np.float16), b))


def _draw(node: onnx.NodeProto, elem: int) -> np.ndarray:
    import onnxruntime as ort
    op = node.op_type
    new = onnx.NodeProto()
    new.CopyFrom(node)
    del new.input[:]
    del new.output[:]
    new.output.append("y")
    for a in new.attribute:
        if a.name == "dtype":
            a.i = elem
    feeds: dict[str, np.ndarray] = {}
    inputs = []
    dtype = np.float32 if elem == TensorProto.FLOAT else np.float16
    if op in ("RandomNormalLike", "RandomUniformLike", "Bernoulli"):
        new.input.append("x")
        feeds["x"] = np.full(64, 0.5, dtype)
        inputs.append(helper.make_tensor_value_info("x", elem, [64]))
    elif op == "Multinomial":
        return np.zeros(0)  # integer draws: the input's type does not change them
    elif op == "Dropout":
        new.input.extend(["x", "", "t"])
        feeds.update(x=np.ones(64, dtype), t=np.array(True))
        inputs += [helper.make_tensor_value_info("x", elem, [64]),
                   helper.make_tensor_value_info("t", TensorProto.BOOL, [])]
    out_elem = TensorProto.FLOAT16 if elem == TensorProto.FLOAT16 and op != "Multinomial" \
        else TensorProto.FLOAT
    g = helper.make_graph([new], "draw", inputs, [helper.make_tensor_value_info("y", out_elem,
                                                                               None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])
    m.ir_version = 8
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(s.run(["y"], feeds)[0])
