"""What the judge covers, and what TensorRT's ONNX parser can import: never a silent "FP16 is
fine" for a graph that was not fully judged.

* `unjudged`: nodes that compute in floating point but that the emulator cannot round: ops
  outside ONNX's default domain (ONNX Runtime's com.microsoft FusedMatMul, Attention,
  SkipLayerNormalization; custom ops), ops onnx does not know, and ops whose schema allows
  float16 but that the emulator has no rule for. ONNX Runtime runs them in FP32 in every
  judgement while the engine may not, so a verdict on a graph holding them is partial (`run`'s
  verdict "partial", exit 5; `check` exits 5 too).
* `kept_fp32`: ops whose schema takes no float16 at all (Range, as YOLOv8's anchor grid
  uses it). No FP16 file can type them float16, so they compute in FP32 in the file, in
  TensorRT 11 and in the judge alike: judged, listed, and pinned under weak typing.
* `trt_unsupported`: ops TensorRT's ONNX parser has no importer for (docs/operators.md of
  onnx-tensorrt, below as data), or a non-default-domain op it can only take as a plugin,
  reported before any search with what to do.

Pure: onnx only.
"""

from __future__ import annotations

from collections import defaultdict

from ..graph import Graph, fp32_by_schema, has_schema
from ..judge.verdict import VerdictName
from ..result import Coverage, OpCount, Partial

# onnx-tensorrt's operator support matrix, docs/operators.md at commit 96e7811 (2024-06-17:
# "TensorRT 10.0 supports operators in the inclusive range of opset 9 to opset 20"), the newest
# this project could read. NVIDIA's ONNX opset guide for TensorRT 11.x points to the same file
# and raises the maximum opset to 25, so an op missing from both sets below is "not listed",
# not "unsupported": check the file for your release.
OPERATORS_SOURCE = ("https://github.com/onnx/onnx-tensorrt/blob/"
                    "96e781103cfc4adf4a6bb557e94bac8e693f6f4c/docs/operators.md")
OPSET_GUIDE = "https://docs.nvidia.com/deeplearning/tensorrt/latest/reference/onnx-opset-guide.html"
# The parser finds an importer by op_type alone, else asks the plugin registry for a plugin of
# that name: onnx-tensorrt ModelImporter.cpp, parseNode ("No importer registered for op: ...
# Attempting to import as plugin."; FallbackPluginImporter).
PLUGIN_FALLBACK_SOURCE = ("https://github.com/onnx/onnx-tensorrt/blob/"
                          "96e781103cfc4adf4a6bb557e94bac8e693f6f4c/ModelImporter.cpp")

TRT_UNSUPPORTED_OPS = frozenset({
    "AffineGrid", "Bernoulli", "BitShift", "BitwiseAnd", "BitwiseNot", "BitwiseOr",
    "BitwiseXor", "BlackmanWindow", "Col2Im", "CenterCropPad", "Compress",
    "ConcatFromSequence", "ConvInteger", "DFT", "Det", "DynamicQuantizeLinear", "HammingWindow",
    "HannWindow", "ImageDecoder", "MatMulInteger", "MaxRoiPool", "MaxUnpool", "MelWeightMatrix",
    "Multinomial", "NegativeLogLikelihoodLoss", "Optional", "OptionalGetElement",
    "OptionalHasElement", "QLinearConv", "QLinearMatMul", "RegexFullMatch", "STFT",
    "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase", "SequenceInsert",
    "SequenceLength", "SequenceMap", "SoftmaxCrossEntropyLoss", "SplitToSequence",
    "StringConcat", "StringNormalizer", "StringSplit", "TfIdfVectorizer", "Unique"})
TRT_SUPPORTED_OPS = frozenset({
    "Abs", "Acos", "Acosh", "Add", "And", "ArgMax", "ArgMin", "Asin", "Asinh", "Atan",
    "Atanh", "AveragePool", "BatchNormalization", "Cast", "CastLike", "Ceil", "Celu", "Clip",
    "Concat", "Constant", "ConstantOfShape", "Conv", "ConvTranspose", "Cos", "Cosh", "CumSum",
    "DeformConv", "DepthToSpace", "DequantizeLinear", "Div", "Dropout", "Einsum", "Elu",
    "Equal", "Erf", "Exp", "Expand", "EyeLike", "Flatten", "Floor", "Gather", "GatherElements",
    "GatherND", "Gelu", "Gemm", "GlobalAveragePool", "GlobalLpPool", "GlobalMaxPool",
    "Greater", "GreaterOrEqual", "GridSample", "GroupNormalization", "GRU", "HardSigmoid",
    "HardSwish", "Hardmax", "Identity", "If", "ImageScaler", "InstanceNormalization", "IsInf",
    "IsNaN", "LayerNormalization", "LeakyRelu", "Less", "LessOrEqual", "Log", "LogSoftmax",
    "Loop", "LRN", "LSTM", "LpNormalization", "LpPool", "MatMul", "Max", "MaxPool", "Mean",
    "MeanVarianceNormalization", "Min", "Mish", "Mod", "Mul", "Neg", "NonMaxSuppression",
    "NonZero", "Not", "OneHot", "Or", "Pad", "ParametricSoftplus", "Pow", "PRelu",
    "QuantizeLinear", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
    "Range", "Reciprocal", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
    "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare", "Relu",
    "Reshape", "Resize", "ReverseSequence", "RNN", "RoiAlign", "Round", "ScaledTanh", "Scan",
    "Scatter", "ScatterElements", "ScatterND", "Selu", "Shape", "Shrink", "Sigmoid", "Sign",
    "Sin", "Sinh", "Size", "Slice", "Softmax", "Softplus", "Softsign", "SpaceToDepth", "Split",
    "Sqrt", "Squeeze", "Sub", "Sum", "Tan", "Tanh", "ThresholdedRelu", "Tile", "TopK",
    "Transpose", "Trilu", "Unsqueeze", "Upsample", "Where", "Xor"})

DEFAULT_DOMAINS = ("", "ai.onnx")
KEPT_FP32_WHY = ("its schema takes no float16: every FP16 file computes it in FP32, as the "
                 "judge does (TensorRT 10's lines pin it)")
EXPORT_HINT = ("export the model again without ONNX Runtime's transformer optimizer (its "
               "com.microsoft fusions are for ONNX Runtime only), or register a TensorRT "
               "plugin of that name")


def unjudged(graph: Graph) -> list[OpCount]:
    """Nodes computing in floating point that no judgement rounds, grouped by op kind."""
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    why: dict[tuple[str, str], str] = {}
    for name, node in graph.float_non_candidates():
        key = (node.op_type, node.domain)
        if node.domain not in DEFAULT_DOMAINS:
            why[key] = f"outside ONNX's default domain ({node.domain}): run in FP32"
        elif not has_schema(node, graph.opset):
            why[key] = "an op onnx does not know: run in FP32"
        elif fp32_by_schema(node, graph.opset):
            continue  # `fp32_by_schema`: judged as every FP16 file computes it
        else:
            why[key] = "the emulator has no FP16 rule for it yet: run in FP32"
        found[key].append(name)
    return [OpCount(op, domain or DEFAULT_DOMAINS[1], tuple(nodes), why[(op, domain)])
            for (op, domain), nodes in found.items()]


def kept_fp32(graph: Graph) -> list[OpCount]:
    """Nodes of float data whose schema takes no float16 (Range), grouped by op kind. Judged,
    not partial: no FP16 file can hold them in float16, so the mixed model keeps them FP32,
    TensorRT 11 builds them as the file declares, the weak-typing renderings pin them
    (outputs/render.py), and the judge computes them in FP32 as well."""
    found: dict[str, list[str]] = defaultdict(list)
    for name in graph.fp32_by_schema():
        found[graph.node(name).op_type].append(name)
    return [OpCount(op, DEFAULT_DOMAINS[1], tuple(nodes), KEPT_FP32_WHY)
            for op, nodes in found.items()]


def trt_unsupported(graph: Graph) -> list[OpCount]:
    """Ops TensorRT's ONNX parser cannot import as they are, grouped by op kind, each with
    what to do. Model-local functions are not listed: the parser inlines them."""
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    info: dict[tuple[str, str], tuple[str, str]] = {}
    for i in graph.order:
        node, name = graph.nodes[i], graph.names[i]
        key = (node.op_type, node.domain)
        if node.domain not in DEFAULT_DOMAINS:
            if node.op_type in TRT_SUPPORTED_OPS:
                info[key] = (f"the parser picks importers by op type: this {node.domain} op "
                             f"is imported as ONNX's {node.op_type}",
                             "check that the two compute the same, or rename the op")
            else:
                info[key] = (f"{node.domain} op: TensorRT's parser has no importer for it and "
                             "looks for a plugin of that name", EXPORT_HINT)
        elif node.op_type in TRT_UNSUPPORTED_OPS:
            info[key] = ("marked unsupported in onnx-tensorrt's operator list",
                         "replace it before export, or implement it as a TensorRT plugin")
        elif node.op_type not in TRT_SUPPORTED_OPS:
            info[key] = ("not in the onnx-tensorrt operator list trtbisect carries (TensorRT "
                         "10.0, opsets 9-20)", f"check {OPSET_GUIDE} for your release")
        else:
            continue
        found[key].append(name)
    return [OpCount(op, domain or DEFAULT_DOMAINS[1], tuple(nodes), *info[(op, domain)])
            for (op, domain), nodes in found.items()]


def record(graph: Graph) -> Coverage:
    """precision.json's "coverage": how much of the graph the judge rounds, what it cannot,
    and what TensorRT's parser would refuse."""
    rounded = graph.candidates()
    inner = sum(1 for n in rounded if graph.is_inner(n))
    return Coverage(len(graph.names), len(rounded), inner, graph.inlined,
                    tuple(unjudged(graph)), tuple(trt_unsupported(graph)), OPERATORS_SOURCE,
                    tuple(kept_fp32(graph)))


def summary(counts: list[OpCount]) -> str:
    """`FusedMatMul (com.microsoft) x2, Det x1`."""
    return ", ".join(f"{c.label} x{len(c.nodes)}" for c in counts)


def partial_of(judged: VerdictName, verdict: VerdictName,
               unjudged: tuple[OpCount, ...]) -> Partial | None:
    """A verdict that FP16 is fine (or fixed) on a graph with unjudged nodes (`unjudged`:
    coverage.record's) becomes "partial" (judge/verdict.decide, `covered` False): the
    judged part passes, the rest was never rounded; the plan is kept. The record of it, when
    the verdict (`verdict`) is not the judged part's (`judged`)."""
    return Partial(judged, unjudged) if verdict != judged else None


def partial_words(result) -> str:
    """`FP16 meets the tolerance on the judged part; not judged: FusedMatMul (com.microsoft)
    x1` (the console's and the report's verdict line)."""
    part = result.partial
    judged = (f"FP16 meets {result.criteria.standard}"
              if part is not None and part.judged_verdict == "fp16_ok" else
              f"fixed by keeping {len(result.fp32_nodes)} of {result.candidates} nodes in FP32")
    ops = ", ".join(c.op + (f" ({c.domain})" if c.domain not in DEFAULT_DOMAINS else "")
                    + f" x{len(c.nodes)}" for c in (part.unjudged if part is not None else []))
    return (f"{judged} on the judged part only; not judged (the emulator cannot round them, "
            f"they ran in FP32): {ops}")
