"""A zoo of small ONNX models, each with a planted FP16 fault and its known minimal FP32 set.

The models are built with `onnx.helper` only (no torch) so the test suite can create them in
milliseconds. Every expected set is derived from the emulator semantics trtbisect uses: a
candidate node in FP16 reads its float inputs rounded to FP16 and stores its float outputs
rounded to FP16, so any node that reads or writes a value outside the FP16 range (or one that
flushes to zero and matters) must stay FP32.

Faults are planted in weights and constants, not in the sample, so trtbisect's default random
N(0, 1) inputs trigger them too. Each small model's set was checked to be the unique minimum by
exhaustive search over all subsets up to its size (bundled sample and five random seeds); for
`deep_model` the set passes and each of its nodes alone in FP16 fails.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 10
OPSET = 13
FP32_MIN = float(np.finfo(np.float32).min)  # what torch.finfo(float32).min exports as


@dataclass(frozen=True)
class ZooModel:
    """One model of the zoo with the answer trtbisect should find for it."""

    name: str
    model: onnx.ModelProto
    inputs: dict[str, np.ndarray]  # one deterministic sample (fixed seed)
    expected_fp32: frozenset[str]  # exact minimal set of node names; empty for healthy
    expected_verdict: str  # "fp16_ok" | "fixed" | "reference_invalid"
    cause: str  # "overflow" | "constant_out_of_range" | "underflow" | "precision_loss" | ...
    pattern: str | None
    description: str


class _Builder:
    """Accumulates nodes and initializers; names each output after its node (readable logs)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._names: set[str] = set()

    def const(self, name: str, value: np.ndarray | float | Sequence[int]) -> str:
        """An initializer; Python floats become float32 scalars, int lists become int64 vectors."""
        if isinstance(value, float):
            arr = np.array(value, dtype=np.float32)
        elif isinstance(value, (list, tuple)):
            arr = np.array(value, dtype=np.int64)
        else:
            arr = np.asarray(value)
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def weight(self, name: str, shape: Sequence[int], scale: float = 1.0) -> str:
        """A random float32 initializer, N(0, 1) / sqrt(fan_in) * scale (fan_in = shape[-2])."""
        fan_in = shape[-2] if len(shape) >= 2 else 1
        w = self.rng.standard_normal(shape) / np.sqrt(fan_in) * scale
        return self.const(name, w.astype(np.float32))

    def op(self, op_type: str, name: str, inputs: Sequence[str], out: str | None = None,
           **attrs: Any) -> str:
        """Add one node and return its (single) output name."""
        if name in self._names:
            raise ValueError(f"duplicate node name {name}")
        self._names.add(name)
        output = out or f"{name}_output_0"
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], name=name, **attrs))
        return output

    def build(self, graph_name: str, inputs: dict[str, Sequence[int]], outputs: Sequence[str],
              opset: int = OPSET) -> onnx.ModelProto:
        """Assemble the model and fill the graph outputs' shapes by ONNX shape inference."""
        graph = helper.make_graph(
            self.nodes, graph_name,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape))
             for n, shape in inputs.items()],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
            initializer=self.inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                  ir_version=IR_VERSION, producer_name="trtbisect-zoo")
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        del model.graph.output[:]
        model.graph.output.extend(inferred.graph.output)
        return model

    def normal(self, shape: Sequence[int], scale: float = 1.0) -> np.ndarray:
        """Seeded float32 N(0, scale^2) data, drawn from the same stream as the weights."""
        return (self.rng.standard_normal(shape) * scale).astype(np.float32)


# --------------------------------------------------------------------------- building blocks


def _layernorm(b: _Builder, x: str, prefix: str, dim: int, eps: float = 1e-5,
               out: str | None = None) -> str:
    """Decomposed LayerNorm exactly as the TorchScript exporter emits it (opset < 17)."""
    mean = b.op("ReduceMean", f"{prefix}/ReduceMean", [x], axes=[-1], keepdims=1)
    centred = b.op("Sub", f"{prefix}/Sub", [x, mean])
    sq = b.op("Pow", f"{prefix}/Pow", [centred, b.const(f"{prefix}.two", 2.0)])
    var = b.op("ReduceMean", f"{prefix}/ReduceMean_1", [sq], axes=[-1], keepdims=1)
    var_eps = b.op("Add", f"{prefix}/Add", [var, b.const(f"{prefix}.eps", eps)])
    std = b.op("Sqrt", f"{prefix}/Sqrt", [var_eps])
    normed = b.op("Div", f"{prefix}/Div", [centred, std])
    gamma = b.const(f"{prefix}.weight", (1.0 + 0.1 * b.rng.standard_normal(dim)).astype(np.float32))
    beta = b.const(f"{prefix}.bias", (0.1 * b.rng.standard_normal(dim)).astype(np.float32))
    scaled = b.op("Mul", f"{prefix}/Mul", [normed, gamma])
    return b.op("Add", f"{prefix}/Add_1", [scaled, beta], out=out)


def _overflow_chain(prefix: str) -> set[str]:
    """The nodes of a decomposed LayerNorm that touch x^2 when x^2 > 65504: Pow writes it,
    the variance ReduceMean and the eps Add read and write it, Sqrt reads it and brings it back."""
    return {f"{prefix}/Pow", f"{prefix}/ReduceMean_1", f"{prefix}/Add", f"{prefix}/Sqrt"}


def _linear(b: _Builder, x: str, prefix: str, d_in: int, d_out: int, scale: float = 1.0,
            out: str | None = None) -> str:
    """MatMul + Add bias, the shape torch.nn.Linear exports to for 3-D inputs."""
    y = b.op("MatMul", f"{prefix}/MatMul", [x, b.weight(f"{prefix}.weight", [d_in, d_out], scale)])
    bias = b.const(f"{prefix}.bias", b.normal([d_out], 0.1))
    return b.op("Add", f"{prefix}/Add", [y, bias], out=out)


# --------------------------------------------------------------------------- zoo models


def layernorm_overflow() -> ZooModel:
    """Residual MLP over a ~1e3-valued stream, then LayerNorm: (x - mean)^2 ~ 1e6 overflows."""
    b = _Builder(seed=1)
    x = _linear(b, "x", "embed", 32, 32, scale=700.0)
    h = b.op("Relu", "mlp/Relu", [_linear(b, x, "mlp/fc1", 32, 64)])
    h = _linear(b, h, "mlp/fc2", 64, 32, scale=0.5)
    r = b.op("Add", "residual/Add", [x, h])
    _layernorm(b, r, "ln", 32, out="y")
    model = b.build("layernorm_overflow", {"x": [1, 16, 32]}, ["y"])
    return ZooModel(
        "layernorm_overflow", model, {"x": b.normal([1, 16, 32])},
        frozenset(_overflow_chain("ln")), "fixed", "overflow", "layernorm_decomposed",
        "An embedding with large weights makes a ~1e3 residual stream that feeds a decomposed "
        "LayerNorm; Pow writes (x-mean)^2 ~1e6 > 65504, so Pow, the variance ReduceMean, the "
        "eps Add and Sqrt (which brings it back) stay FP32.",
    )


def reducesum_overflow() -> ZooModel:
    """Global sum pooling of a 32x32 map whose elements are in range but whose sum is ~1.5e5."""
    b = _Builder(seed=2)
    w = b.const("stem.weight", b.normal([8, 4, 3, 3], 375.0 / 6.0))
    h = b.op("Conv", "stem/Conv", ["x", w, b.const("stem.bias", b.normal([8], 1.0))],
             kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    h = b.op("Relu", "stem/Relu", [h])
    s = b.op("ReduceSum", "pool/ReduceSum", [h, b.const("pool.axes", [2, 3])], keepdims=1)
    m = b.op("Mul", "pool/Mul", [s, b.const("pool.inv_hw", 1.0 / 1024.0)])
    f = b.op("Flatten", "head/Flatten", [m], axis=1)
    y = b.op("MatMul", "head/MatMul", [f, b.weight("head.weight", [8, 10], 0.05)])
    b.op("Add", "head/Add", [y, b.const("head.bias", b.normal([10], 0.1))], out="logits")
    model = b.build("reducesum_overflow", {"x": [1, 4, 32, 32]}, ["logits"])
    return ZooModel(
        "reducesum_overflow", model, {"x": b.normal([1, 4, 32, 32])},
        frozenset({"pool/ReduceSum", "pool/Mul"}), "fixed", "overflow", "large_reduction",
        "ReduceSum over a 32x32 map of ~150-valued activations writes ~1.5e5 > 65504; "
        "the ReduceSum and the Mul by 1/HW that reads it and brings it back stay FP32.",
    )


def _project_heads(b: _Builder, x: str, d: int, q_scale: float) -> tuple[str, str, str]:
    """Single-head Q, K^T, V projections of x [1, S, d]."""
    q = b.op("MatMul", "attn/q_proj/MatMul", [x, b.weight("attn.q.weight", [d, d], q_scale)])
    k = b.op("MatMul", "attn/k_proj/MatMul", [x, b.weight("attn.k.weight", [d, d], q_scale)])
    v = b.op("MatMul", "attn/v_proj/MatMul", [x, b.weight("attn.v.weight", [d, d])])
    kt = b.op("Transpose", "attn/Transpose", [k], perm=[0, 2, 1])
    return q, kt, v


def attention_logits() -> ZooModel:
    """Q.K^T with |q|,|k| ~ 120 at d=64 gives logits ~1e5; the 1/sqrt(d) Div brings them back."""
    b = _Builder(seed=3)
    q, kt, v = _project_heads(b, "x", 64, q_scale=120.0)
    s = b.op("MatMul", "attn/MatMul", [q, kt])
    s = b.op("Div", "attn/Div", [s, b.const("attn.sqrt_d", 8.0)])
    p = b.op("Softmax", "attn/Softmax", [s], axis=-1)
    o = b.op("MatMul", "attn/MatMul_1", [p, v])
    b.op("MatMul", "attn/out_proj/MatMul", [o, b.weight("attn.out.weight", [64, 64])], out="y")
    model = b.build("attention_logits", {"x": [1, 16, 64]}, ["y"])
    return ZooModel(
        "attention_logits", model, {"x": b.normal([1, 16, 64])},
        frozenset({"attn/MatMul", "attn/Div"}), "fixed", "overflow", "attention_logits",
        "Q.K^T logits reach ~3e5 before the 1/sqrt(d) scale; the QK MatMul writes them and the "
        "Div reads them, so both stay FP32 (scaled logits < 65504 and well separated).",
    )


def eps_underflow() -> ZooModel:
    """RMS norm of ~1e-5 activations: x*x ~1e-10 and eps=1e-10 both flush to zero in FP16."""
    b = _Builder(seed=4)
    x = b.op("Mul", "scale/Mul", ["x", b.const("scale.value", 1e-5)])
    sq = b.op("Mul", "rms/Mul", [x, x])
    ms = b.op("ReduceMean", "rms/ReduceMean", [sq], axes=[-1], keepdims=1)
    ms = b.op("Add", "rms/Add", [ms, b.const("rms.eps", 1e-10)])
    rms = b.op("Sqrt", "rms/Sqrt", [ms])
    y = b.op("Div", "rms/Div", [x, rms])
    y = b.op("Mul", "rms/Mul_1", [y, b.const("rms.weight", (1 + b.normal([32], 0.1)))])
    _linear(b, y, "head", 32, 16, out="y")
    model = b.build("eps_underflow", {"x": [1, 16, 32]}, ["y"])
    return ZooModel(
        "eps_underflow", model, {"x": b.normal([1, 16, 32])},
        frozenset({"rms/Mul", "rms/ReduceMean", "rms/Add", "rms/Sqrt"}), "fixed", "underflow",
        "rmsnorm_decomposed",
        "Input scaled by 1e-5: x*x ~1e-10 is below the FP16 subnormal 6e-8, and so are the mean "
        "and eps=1e-10; every node that writes or reads them (Mul, ReduceMean, Add, Sqrt) must "
        "stay FP32, else the denominator is wrong by sqrt(2) or zero.",
    )


def constant_out_of_range() -> ZooModel:
    """HF-style padding mask (1 - m) * finfo(float32).min: the constant rounds to -inf, 0*-inf=NaN.

    The padding mask is baked in as an initializer (last 4 of 16 keys padded) so that any
    sample, including trtbisect's default random one, triggers the fault."""
    b = _Builder(seed=5)
    q, kt, v = _project_heads(b, "x", 32, q_scale=1.0)
    s = b.op("MatMul", "attn/MatMul", [q, kt])
    s = b.op("Div", "attn/Div", [s, b.const("attn.sqrt_d", float(np.sqrt(32.0)))])
    keep = np.ones([1, 16], np.float32)
    keep[:, 12:] = 0.0
    inv = b.op("Sub", "mask/Sub", [b.const("mask.one", 1.0), b.const("attention_mask", keep)])
    fmin = b.op("Constant", "mask/Constant", [],
                value=numpy_helper.from_array(np.array(FP32_MIN, np.float32), "fmin"))
    bias = b.op("Mul", "mask/Mul", [inv, fmin])
    bias = b.op("Unsqueeze", "mask/Unsqueeze", [bias, b.const("mask.axes", [1])])
    s = b.op("Add", "attn/Add", [s, bias])
    p = b.op("Softmax", "attn/Softmax", [s], axis=-1)
    o = b.op("MatMul", "attn/MatMul_1", [p, v])
    b.op("MatMul", "attn/out_proj/MatMul", [o, b.weight("attn.out.weight", [32, 32])], out="y")
    model = b.build("constant_out_of_range", {"x": [1, 16, 32]}, ["y"])
    return ZooModel(
        "constant_out_of_range", model, {"x": b.normal([1, 16, 32])},
        frozenset({"mask/Mul"}), "fixed", "constant_out_of_range", "attention_mask",
        "(1 - mask) * -3.4e38: in FP16 the Mul reads the constant as -inf and 0 * -inf = NaN "
        "for every kept key. Only that Mul must be FP32; downstream -3.4e38 -> -inf is harmless "
        "because Softmax gives 0 for it either way (no row is fully masked).",
    )


def healthy() -> ZooModel:
    """Conv + pooling + Gemm on unit-scale data: FP16 everywhere is within tolerance."""
    b = _Builder(seed=6)
    h = b.op("Conv", "conv/Conv", ["x", b.const("conv.weight", b.normal([8, 3, 3, 3], 0.2)),
                                   b.const("conv.bias", b.normal([8], 0.1))],
             kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    h = b.op("Relu", "conv/Relu", [h])
    h = b.op("GlobalAveragePool", "pool/GlobalAveragePool", [h])
    h = b.op("Flatten", "head/Flatten", [h], axis=1)
    b.op("Gemm", "head/Gemm", [h, b.const("head.weight", b.normal([10, 8], 0.3)),
                               b.const("head.bias", b.normal([10], 0.1))], out="logits", transB=1)
    model = b.build("healthy", {"x": [1, 3, 16, 16]}, ["logits"])
    return ZooModel(
        "healthy", model, {"x": b.normal([1, 3, 16, 16])}, frozenset(), "fp16_ok", "none", None,
        "Small conv net with unit-scale values; FP16 everywhere passes, nothing to keep FP32.",
    )


def fp32_broken() -> ZooModel:
    """Log of a partly negative tensor: the FP32 reference itself holds NaN."""
    b = _Builder(seed=7)
    h = _linear(b, "x", "fc", 8, 8)
    h = b.op("Sub", "bad/Sub", [h, b.const("bad.shift", 0.5)])
    b.op("Log", "bad/Log", [h], out="y")
    model = b.build("fp32_broken", {"x": [1, 8]}, ["y"])
    return ZooModel(
        "fp32_broken", model, {"x": b.normal([1, 8])}, frozenset(), "reference_invalid",
        "reference_invalid", None,
        "Log of (fc(x) - 0.5), negative for some elements: the FP32 output already has NaN, "
        "so there is no valid reference to match.",
    )


def two_outputs() -> ZooModel:
    """One ~800-valued trunk, two heads: a sum pool (overflow in ReduceSum) and an RMS norm
    (overflow in x*x), each feeding its own graph output."""
    b = _Builder(seed=8)
    h = b.op("MatMul", "trunk/MatMul", ["x", b.weight("trunk.weight", [32, 32], 800.0)])
    h = b.op("Relu", "trunk/Relu", [h])
    s = b.op("ReduceSum", "pool/ReduceSum", [h, b.const("pool.axes", [1])], keepdims=0)
    s = b.op("Mul", "pool/Mul", [s, b.const("pool.inv_n", 1.0 / 256.0)])
    b.op("MatMul", "head_a/MatMul", [s, b.weight("head_a.weight", [32, 4], 0.01)], out="out_a")
    sq = b.op("Mul", "rms/Mul", [h, h])
    ms = b.op("ReduceMean", "rms/ReduceMean", [sq], axes=[-1], keepdims=1)
    ms = b.op("Add", "rms/Add", [ms, b.const("rms.eps", 1e-6)])
    rms = b.op("Sqrt", "rms/Sqrt", [ms])
    b.op("Div", "rms/Div", [h, rms], out="out_b")
    model = b.build("two_outputs", {"x": [1, 256, 32]}, ["out_a", "out_b"])
    chain_a = {"pool/ReduceSum", "pool/Mul"}
    chain_b = {"rms/Mul", "rms/ReduceMean", "rms/Add", "rms/Sqrt"}
    return ZooModel(
        "two_outputs", model, {"x": b.normal([1, 256, 32])}, frozenset(chain_a | chain_b),
        "fixed", "overflow", None,
        "Trunk ~800: out_a sums 256 tokens (ReduceSum ~8e4 -> Mul 1/256), out_b squares them "
        "(Mul ~6e5 -> ReduceMean -> eps Add -> Sqrt); the answer is the union of both chains.",
    )


def precision_loss() -> ZooModel:
    """A DC offset of 1e4 added then removed: FP16 spacing at 1e4 is 8, so x ~ 1 is lost."""
    b = _Builder(seed=9)
    h = _linear(b, "x", "enc", 32, 32)
    h = b.op("Add", "offset/Add", [h, b.const("offset.value", 1e4)])
    h = b.op("Sub", "offset/Sub", [h, b.const("offset.value_1", 1e4)])
    _linear(b, h, "dec", 32, 16, out="y")
    model = b.build("precision_loss", {"x": [1, 16, 32]}, ["y"])
    return ZooModel(
        "precision_loss", model, {"x": b.normal([1, 16, 32])},
        frozenset({"offset/Add", "offset/Sub"}), "fixed", "precision_loss", None,
        "x + 1e4 stored in FP16 keeps only multiples of 8 (error up to 4 on a unit signal); the "
        "Add that writes it and the Sub that reads it (cancelling the offset) stay FP32.",
    )


# --------------------------------------------------------------------------- deep model


def _attention(b: _Builder, x: str, p: str, d: int, heads: int, seq: int) -> str:
    """Multi-head self-attention with the Reshape/Transpose plumbing exporters emit."""
    dh = d // heads
    split = b.const(f"{p}.split_shape", [1, seq, heads, dh])
    q, k, v = (_linear(b, x, f"{p}/{n}", d, d, 0.5) for n in ("q", "k", "v"))
    q = b.op("Transpose", f"{p}/q/Transpose",
             [b.op("Reshape", f"{p}/q/Reshape", [q, split])], perm=[0, 2, 1, 3])
    kt = b.op("Transpose", f"{p}/k/Transpose",
              [b.op("Reshape", f"{p}/k/Reshape", [k, split])], perm=[0, 2, 3, 1])
    v = b.op("Transpose", f"{p}/v/Transpose",
             [b.op("Reshape", f"{p}/v/Reshape", [v, split])], perm=[0, 2, 1, 3])
    s = b.op("Div", f"{p}/Div", [b.op("MatMul", f"{p}/MatMul", [q, kt]),
                                 b.const(f"{p}.sqrt_d", float(np.sqrt(dh)))])
    o = b.op("MatMul", f"{p}/MatMul_1", [b.op("Softmax", f"{p}/Softmax", [s], axis=-1), v])
    o = b.op("Transpose", f"{p}/Transpose", [o], perm=[0, 2, 1, 3])
    o = b.op("Reshape", f"{p}/Reshape", [o, b.const(f"{p}.merge_shape", [1, seq, d])])
    return _linear(b, o, f"{p}/o", d, d, 0.5)


def _gelu_tanh(b: _Builder, x: str, p: str) -> str:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), decomposed as older exporters do."""
    c = b.op("Mul", f"{p}/Mul", [b.op("Pow", f"{p}/Pow", [x, b.const(f"{p}.three", 3.0)]),
                                 b.const(f"{p}.c", 0.044715)])
    t = b.op("Mul", f"{p}/Mul_1", [b.op("Add", f"{p}/Add", [x, c]),
                                   b.const(f"{p}.k", float(np.sqrt(2.0 / np.pi)))])
    t = b.op("Add", f"{p}/Add_1", [b.op("Tanh", f"{p}/Tanh", [t]), b.const(f"{p}.one", 1.0)])
    return b.op("Mul", f"{p}/Mul_3", [b.op("Mul", f"{p}/Mul_2", [x, t]), b.const(f"{p}.half", 0.5)])


def _block(b: _Builder, x: str, i: int, d: int, seq: int, ln_scale: float) -> str:
    """Pre-norm transformer block; `ln_scale` multiplies ln1's input (LayerNorm is scale
    invariant, so the result is unchanged in FP32, but x^2 overflows FP16 when it is ~1e3)."""
    p = f"blocks.{i}"
    h = b.op("Mul", f"{p}/ln1/pre_scale", [x, b.const(f"{p}.ln1.pre_scale", float(ln_scale))])
    x = b.op("Add", f"{p}/Add", [x, _attention(b, _layernorm(b, h, f"{p}/ln1", d), f"{p}/attn",
                                               d, 2, seq)])
    h = _linear(b, _layernorm(b, x, f"{p}/ln2", d), f"{p}/mlp/fc1", d, 2 * d, 0.5)
    h = _linear(b, _gelu_tanh(b, h, f"{p}/mlp/gelu"), f"{p}/mlp/fc2", 2 * d, d, 0.5)
    return b.op("Add", f"{p}/Add_1", [x, h])


def deep_model(blocks: int = 12, overflow_blocks: Sequence[int] = (3, 9), seed: int = 0,
               d: int = 32, seq: int = 8) -> ZooModel:
    """A transformer-ish stack (~53 nodes per block) for search benchmarks: exactly the
    `overflow_blocks` have their ln1 input scaled by 1e3, so only their x^2 chains overflow."""
    bad = set(overflow_blocks)
    if not bad <= set(range(blocks)):
        raise ValueError(f"overflow_blocks {sorted(bad)} outside range({blocks})")
    b = _Builder(seed)
    x = _linear(b, "x", "embed", d, d)
    for i in range(blocks):
        x = _block(b, x, i, d, seq, 1e3 if i in bad else 1.0)
    _linear(b, _layernorm(b, x, "norm", d), "head", d, 16, out="y")
    model = b.build(f"deep_{blocks}", {"x": [1, seq, d]}, ["y"])
    expected = set().union(*(_overflow_chain(f"blocks.{i}/ln1") for i in sorted(bad)))
    return ZooModel(
        f"deep_{blocks}", model, {"x": b.normal([1, seq, d])}, frozenset(expected),
        "fixed" if bad else "fp16_ok", "overflow" if bad else "none",
        "layernorm_decomposed" if bad else None,
        f"{blocks} pre-norm transformer blocks; ln1 of blocks {sorted(bad)} sees a 1e3-scaled "
        "input so its x^2 overflows; the answer is the union of those LayerNorm chains.",
    )


_BUILDERS: tuple[Callable[[], ZooModel], ...] = (
    layernorm_overflow, reducesum_overflow, attention_logits, eps_underflow,
    constant_out_of_range, healthy, fp32_broken, two_outputs, precision_loss,
)


def zoo() -> dict[str, ZooModel]:
    """Every small zoo model by name (built fresh each call; they are cheap)."""
    return {m.name: m for m in (build() for build in _BUILDERS)}


def norm_stack(norms: int = 36, d: int = 16, seq: int = 4, seed: int = 0) -> ZooModel:
    """`norms` decomposed LayerNorms in a row, each fed its input scaled by 1e3, so every
    one's x^2 overflows: a plan of ~7 nodes per norm under --semantics trt (the whole fused
    tail), 4 under strict. For what a person reads about a 250-node plan (issue #37)."""
    b = _Builder(seed)
    x = "x"
    for i in range(norms):
        p = f"norms.{i}"
        h = b.op("Mul", f"/{p}/pre_scale", [x, b.const(f"{p}.pre_scale", 1e3)])
        x = _layernorm(b, h, f"/{p}", d, out="y" if i == norms - 1 else None)
    model = b.build(f"norm_stack_{norms}", {"x": [1, seq, d]}, ["y"])
    expected = set().union(*(_overflow_chain(f"/norms.{i}") for i in range(norms)))
    return ZooModel(
        f"norm_stack_{norms}", model, {"x": b.normal([1, seq, d])}, frozenset(expected),
        "fixed", "overflow", "layernorm_decomposed",
        f"{norms} decomposed LayerNorms, each reading a 1e3-scaled input whose x^2 overflows.",
    )
