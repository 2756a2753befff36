"""Why even the all-float plan of a quantized file fails: weights or constants the given file
already holds broken (a converter wrote a value beyond FP16's range as inf, or keeps an FP32
value beyond it that the file casts to FP16), by name, and which tool probably wrote them.

ModelOpt's ONNX PTQ quantizes through ONNX Runtime's quantization tool, which stamps the file
`producer_name` "onnx.quantize"; with high_precision_dtype='fp16' (its default) ModelOpt then
converts everything outside the Q/DQ to FP16, and a BatchNorm variance of 1e7 or an
attention mask of -3.4e38 becomes inf there.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from ..base.escape import visible

FP16_MAX = 65504.0
FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
          onnx.TensorProto.DOUBLE)
SHOWN = 5  # broken tensors named, the rest counted


def _values(model: onnx.ModelProto):
    from ..judge import semantics

    for t in model.graph.initializer:
        yield t.name, t
    for n in model.graph.node:
        t = semantics.constant_tensor(n) if n.op_type == "Constant" else None
        if t is not None and n.output:
            yield n.output[0], t


def _cast_to_half(model: onnx.ModelProto) -> set[str]:
    """Tensors the file casts to FP16 (a Cast to=FLOAT16 reads them)."""
    return {n.input[0] for n in model.graph.node if n.op_type == "Cast" and n.input
            and any(a.name == "to" and a.i == onnx.TensorProto.FLOAT16 for a in n.attribute)}


def broken_values(model: onnx.ModelProto) -> list[str]:
    """Each float weight or constant holding a value that is not finite, or an FP32 one beyond
    FP16's range that the file casts to FP16, in words, by name."""
    halved = _cast_to_half(model)
    out = []
    for name, t in _values(model):
        if t.data_type not in FLOATS:
            continue
        a = np.asarray(numpy_helper.to_array(t), np.float64)
        kind = onnx.TensorProto.DataType.Name(t.data_type).lower()
        bad = int(a.size - np.count_nonzero(np.isfinite(a)))
        if bad:
            out.append(f"{visible(name)} ({kind}) holds {bad} non-finite value(s)")
            continue
        if name in halved and a.size:
            big = np.abs(a)[np.abs(a) > FP16_MAX]
            if big.size:
                out.append(f"{visible(name)} ({kind}) holds {big.size} value(s) beyond FP16's "
                           f"range (up to {float(big.max()):.3g}) that the file casts to FP16 "
                           "(inf there)")
    return out


def probable_writer(model: onnx.ModelProto) -> str:
    """Which tool probably wrote the file, in words ("" when it says nothing)."""
    who = " ".join(visible(x) for x in (model.producer_name, model.producer_version) if x)
    if model.producer_name == "onnx.quantize":
        half = any(t.data_type == onnx.TensorProto.FLOAT16 for t in model.graph.initializer)
        return (f"{who}: ONNX Runtime's quantization tool, which NVIDIA ModelOpt's ONNX PTQ "
                "calls" + ("; its FP16 conversion (high_precision_dtype='fp16') probably "
                           "turned values beyond FP16's range (65504) into inf" if half else ""))
    tools = [visible(p.key) for p in model.metadata_props if "modelopt" in p.key.lower()]
    if tools:
        return f"{who or 'a tool'} (metadata {', '.join(tools)}: NVIDIA ModelOpt)"
    return who


def reasons(model: onnx.ModelProto) -> list[str]:
    """precision.json's `reasons` for a `no_plan` whose all-float plan fails (empty when the
    file's values are all sound)."""
    bad = broken_values(model)
    if not bad:
        return []
    who = probable_writer(model)
    return [f"the given file's weights are already broken: {'; '.join(bad[:SHOWN])}"
            + (f" (and {len(bad) - SHOWN} more)" if len(bad) > SHOWN else "")
            + (f"; the file was written by {who}" if who else "")
            + ("" if "inf" in who else "; a converter probably wrote a value beyond FP16's "
               "range (65504) as inf")]
