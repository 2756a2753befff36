"""Models FP16 cannot change, and models computed in float64: answered in one line.

- No node computes in float32/16 (an int64 Add, a bool-only model, a graph without nodes, one
  that only moves data): FP16 changes nothing TensorRT computes, so there is nothing to judge.
  (Float nodes the judge cannot take, with no candidate beside them, are refused instead: FP16
  could change them.)
  That is a verdict of its own, `nothing_to_judge`, with exit code 0: the question a deploy
  script asks (may this model be built with FP16 enabled?) has the answer yes, and the verdict
  tells a person or a machine that nothing was judged, rather than that FP16 was judged fine.
- The model computes in float64 (DOUBLE): TensorRT has no double type; its ONNX parser maps a
  DOUBLE tensor to FLOAT and casts double weights down to float, clamping to +-FLT_MAX
  (onnx-tensorrt importerUtils.cpp `convertDtype` and `convertDouble`; docs/operators.md:
  "TensorRT will attempt to cast ... DOUBLE down to FLOAT"). The network TensorRT builds is
  then a float32 one that trtbisect never saw (its FP32 reference would be float64), so a
  model with float64 compute and nothing in float32/16 is refused with that reason (exit 2):
  convert it to float32 first. Float64 nodes beside float32 ones are named in a warning: they
  are not FP16 candidates here, though TensorRT would compute them in FP32 or FP16.
"""

from __future__ import annotations

import logging
from typing import Final

from onnx import TensorProto

from ..errors import TrtBisectError
from ..graph import PASS_THROUGH_OPS, Graph

log = logging.getLogger(__name__)

NOTHING_TO_JUDGE: Final = "nothing_to_judge"  # a verdict (judge/verdict.VerdictName)
ONNX_TENSORRT_DOUBLE = ("https://github.com/onnx/onnx-tensorrt/blob/main/importerUtils.cpp "
                        "(convertDtype: DOUBLE -> kFLOAT; convertDouble)")


def double_nodes(g: Graph) -> list[str]:
    """Nodes that compute (not only move or cast) and write a float64 tensor."""
    return [name for name, node in zip(g.names, g.model.graph.node)
            if node.op_type not in PASS_THROUGH_OPS
            and any(g.types.get(t) == TensorProto.DOUBLE for t in node.output if t)]


def check_judgeable(g: Graph, path: object) -> None:
    """Refuse a model that computes in float64 and in nothing FP16 could change; warn about
    float64 nodes beside float32 ones."""
    doubles = double_nodes(g)
    if not doubles:
        return
    if not g.candidates():
        raise TrtBisectError(
            f"{path} computes in float64 ({len(doubles)} node(s), e.g. {doubles[0]!r}); "
            "TensorRT's ONNX parser casts DOUBLE down to FLOAT, so the engine would be a float32 "
            "network trtbisect never saw: export or convert the model to float32 and run "
            f"trtbisect on that (see {ONNX_TENSORRT_DOUBLE})")
    log.warning("%d node(s) compute in float64 (e.g. %r): trtbisect does not judge them in FP16, "
                "though TensorRT's parser casts DOUBLE down to FLOAT", len(doubles), doubles[0])


def float_compute_nodes(g: Graph) -> list[str]:
    """Nodes that compute (not only move or cast data) and write a float32/16 tensor: what
    FP16 could change, whether or not the emulator can judge it (`g.types` shows float16 and
    bfloat16 as float32)."""
    return [name for name, node in zip(g.names, g.model.graph.node)
            if node.op_type not in PASS_THROUGH_OPS
            and any(g.types.get(t) == TensorProto.FLOAT for t in node.output if t)]


def nothing_to_judge(g: Graph) -> str | None:
    """Why FP16 cannot change this model (None when it can). A model whose float nodes are all
    beyond the judge (an op it cannot round, a node holding a subgraph) is never "nothing to
    judge": FP16 could change it, so it is refused, never called fine."""
    if g.candidates():
        return None
    unjudged = float_compute_nodes(g)
    if unjudged:
        node = g.node(unjudged[0])
        raise TrtBisectError(f"{len(unjudged)} node(s) compute in floating point but none can be "
                             f"judged (e.g. {unjudged[0]!r}, op {node.op_type}); trtbisect will "
                             "not call FP16 fine for a graph it did not judge")
    if not g.model.graph.node:
        return "the graph has no nodes"
    return "no node computes in float32 or float16 (FP16 changes nothing the engine computes)"
