"""Benchmark models at deployment scale, each with a planted FP16 fault (issue #10).

* `synthetic_transformer`: a pre-norm transformer stack sized by node count (500 to 20k nodes)
  with decomposed LayerNorm (opset 14, as the TorchScript exporter emits it), attention with
  Reshape/Transpose plumbing, an Erf GELU MLP and residuals. Tensors are small (seq 16, d 64)
  so an FP32 inference takes milliseconds and the cost measured is the tool's, not the math's.
* `wide_matmul_stack`: wide RMSNorm + MatMul + Add + Relu blocks whose FP32 weights may exceed
  what one protobuf can hold (2 GiB). The weights are streamed to one external-data file and
  the model proto only references them, so the generator never holds more than one block.

Faults are planted in constants, not in the sample, so any N(0, 1) input triggers them: a
per-block pre-scale of 1e3 in front of a normalisation makes its x^2 overflow FP16 (as
`deep_model` in tests/models/make_models.py does); the other blocks' pre-scale is 1.

    python scripts/bench_models.py transformer 5000 /tmp/t5k.onnx
    python scripts/bench_models.py wide 2.5e9 /tmp/wide      # writes wide.onnx + wide.onnx.data
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 10
OPSET = 14
FAULT_SCALE = 1e3  # x ~ 1 becomes ~1e3, so x^2 ~ 1e6 > 65504 (FP16 max)
ALIGN = 1 << 16  # external tensors start on 64 KiB boundaries, so ORT can map them


@dataclass(frozen=True)
class BenchModel:
    """An in-memory benchmark model, one sample and the chains its planted faults break."""

    name: str
    model: onnx.ModelProto
    inputs: dict[str, np.ndarray]
    expected_fp32: frozenset[str]  # the planted overflow chains (the set to find if nothing else fails)


@dataclass(frozen=True)
class ExternalModel:
    """A benchmark model written to disk with its weights in one external-data file."""

    path: Path
    data_path: Path
    inputs: dict[str, np.ndarray]
    expected_fp32: frozenset[str]
    weight_bytes: int  # bytes of float32 weights in the data file (padding excluded)
    blocks: int
    width: int


class _Graph:
    """Nodes, initializers and value names for one generated model."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []

    def const(self, name: str, value: Any) -> str:
        if isinstance(value, float):
            value = np.array(value, np.float32)
        elif isinstance(value, (list, tuple)):
            value = np.array(value, np.int64)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type: str, name: str, inputs: Sequence[str], **attrs: Any) -> str:
        out = f"{name}_output_0"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=name, **attrs))
        return out

    def model(self, name: str, inputs: dict[str, list[int]], outputs: dict[str, list[int]]
              ) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()],
            initializer=self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                 ir_version=IR_VERSION, producer_name="trtbisect-bench")


def overflow_chain(prefix: str) -> set[str]:
    """The nodes of a normalisation that read or write x^2: they must stay FP32 when it overflows."""
    return {f"{prefix}/Pow", f"{prefix}/ReduceMean_1", f"{prefix}/Add", f"{prefix}/Sqrt"}


def _layernorm(g: _Graph, x: str, p: str, d: int, centre: bool = True) -> str:
    """Decomposed LayerNorm (RMSNorm when not `centre`), with the overflow_chain node names."""
    if centre:
        x = g.op("Sub", f"{p}/Sub", [x, g.op("ReduceMean", f"{p}/ReduceMean", [x], axes=[-1])])
    sq = g.op("Pow", f"{p}/Pow", [x, g.const(f"{p}.two", 2.0)])
    var = g.op("ReduceMean", f"{p}/ReduceMean_1", [sq], axes=[-1])
    std = g.op("Sqrt", f"{p}/Sqrt", [g.op("Add", f"{p}/Add", [var, g.const(f"{p}.eps", 1e-5)])])
    y = g.op("Mul", f"{p}/Mul", [g.op("Div", f"{p}/Div", [x, std]),
                                 g.const(f"{p}.weight", 1 + 0.1 * g.rng.standard_normal(d, np.float32))])
    return g.op("Add", f"{p}/Add_1", [y, g.const(f"{p}.bias", 0.1 * g.rng.standard_normal(d, np.float32))])


def _linear(g: _Graph, x: str, p: str, d_in: int, d_out: int, scale: float = 1.0) -> str:
    w = g.rng.standard_normal((d_in, d_out), np.float32) * np.float32(scale / math.sqrt(d_in))
    y = g.op("MatMul", f"{p}/MatMul", [x, g.const(f"{p}.weight", w)])
    return g.op("Add", f"{p}/Add", [y, g.const(f"{p}.bias", 0.02 * g.rng.standard_normal(d_out, np.float32))])


def _attention(g: _Graph, x: str, p: str, d: int, heads: int, seq: int) -> str:
    split = g.const(f"{p}.split_shape", [1, seq, heads, d // heads])
    q, k, v = (g.op("Reshape", f"{p}/{n}/Reshape", [_linear(g, x, f"{p}/{n}", d, d), split])
               for n in ("q", "k", "v"))
    q = g.op("Transpose", f"{p}/q/Transpose", [q], perm=[0, 2, 1, 3])
    k = g.op("Transpose", f"{p}/k/Transpose", [k], perm=[0, 2, 3, 1])
    v = g.op("Transpose", f"{p}/v/Transpose", [v], perm=[0, 2, 1, 3])
    s = g.op("Div", f"{p}/Div", [g.op("MatMul", f"{p}/MatMul", [q, k]),
                                 g.const(f"{p}.sqrt_dh", math.sqrt(d // heads))])
    o = g.op("MatMul", f"{p}/MatMul_1", [g.op("Softmax", f"{p}/Softmax", [s], axis=-1), v])
    o = g.op("Transpose", f"{p}/Transpose", [o], perm=[0, 2, 1, 3])
    o = g.op("Reshape", f"{p}/Reshape", [o, g.const(f"{p}.merge_shape", [1, seq, d])])
    return _linear(g, o, f"{p}/o", d, d, 0.5)


def _gelu_erf(g: _Graph, x: str, p: str) -> str:
    """x * 0.5 * (1 + erf(x / sqrt 2)), the pattern torch exports nn.GELU() to."""
    e = g.op("Erf", f"{p}/Erf", [g.op("Div", f"{p}/Div", [x, g.const(f"{p}.sqrt2", math.sqrt(2))])])
    y = g.op("Mul", f"{p}/Mul", [x, g.op("Add", f"{p}/Add", [e, g.const(f"{p}.one", 1.0)])])
    return g.op("Mul", f"{p}/Mul_1", [y, g.const(f"{p}.half", 0.5)])


def _block(g: _Graph, x: str, i: int, d: int, seq: int, heads: int, faulty: bool) -> str:
    p = f"blocks.{i}"
    h = g.op("Mul", f"{p}/ln1/pre_scale",
             [x, g.const(f"{p}.ln1.pre_scale", FAULT_SCALE if faulty else 1.0)])
    x = g.op("Add", f"{p}/Add", [x, _attention(g, _layernorm(g, h, f"{p}/ln1", d), f"{p}/attn",
                                               d, heads, seq)])
    h = _linear(g, _layernorm(g, x, f"{p}/ln2", d), f"{p}/mlp/fc1", d, 2 * d)
    h = _linear(g, _gelu_erf(g, h, f"{p}/mlp/gelu"), f"{p}/mlp/fc2", 2 * d, d, 0.5)
    return g.op("Add", f"{p}/Add_1", [x, h])


def _nodes_per_block(d: int, seq: int, heads: int) -> int:
    g = _Graph(0)
    _block(g, "x", 0, d, seq, heads, False)
    return len(g.nodes)


def fault_blocks(blocks: int, faults: int) -> list[int]:
    """`faults` block indices spread evenly over the stack (none for faults=0)."""
    return sorted({(k + 1) * blocks // (faults + 1) for k in range(faults)})


def synthetic_transformer(n_nodes_target: int, d_model: int = 64, seq: int = 16, seed: int = 0,
                          faults: int = 2, heads: int = 4) -> BenchModel:
    """A transformer stack of about `n_nodes_target` nodes whose `faults` blocks overflow FP16.

    The node count is met to within one block (~50 nodes); `faults=0` gives a stack with no
    planted fault (FP16 may still be fine or not: depth accumulates rounding error).
    """
    head_nodes = 2 + 9 + 2  # embed, final norm, head
    blocks = max(1, round((n_nodes_target - head_nodes) / _nodes_per_block(d_model, seq, heads)))
    bad = fault_blocks(blocks, faults)
    g = _Graph(seed)
    x = _linear(g, "x", "embed", d_model, d_model)
    for i in range(blocks):
        x = _block(g, x, i, d_model, seq, heads, i in bad)
    _linear(g, _layernorm(g, x, "norm", d_model), "head", d_model, 16)
    g.nodes[-1].output[0] = "y"
    name = f"transformer_{len(g.nodes)}"
    model = g.model(name, {"x": [1, seq, d_model]}, {"y": [1, seq, 16]})
    expected = set().union(*(overflow_chain(f"blocks.{i}/ln1") for i in bad))
    inputs = {"x": g.rng.standard_normal((1, seq, d_model), np.float32)}
    return BenchModel(name, model, inputs, frozenset(expected))


# ------------------------------------------------------------------ external data, > 2 GiB


class _DataFile:
    """Appends float32 arrays to one external-data file and returns the tensors that point there."""

    def __init__(self, f: BinaryIO, location: str) -> None:
        self.f, self.location, self.bytes = f, location, 0

    def tensor(self, name: str, array: np.ndarray) -> TensorProto:
        pad = -self.f.tell() % ALIGN
        if pad:
            self.f.write(b"\0" * pad)
        offset = self.f.tell()
        array = np.ascontiguousarray(array, np.float32)
        self.f.write(memoryview(array).cast("B"))
        self.bytes += array.nbytes
        t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=array.shape,
                        data_location=TensorProto.EXTERNAL)
        for key, value in (("location", self.location), ("offset", offset),
                           ("length", array.nbytes)):
            t.external_data.add(key=key, value=str(value))
        return t


def _width_for(total_bytes: float) -> int:
    """The widest power of two up to 4096 that still gives the stack at least four blocks."""
    width = 4096
    while width > 16 and 4 * width * width * 4 > total_bytes:
        width //= 2
    return width


def wide_matmul_stack(total_bytes: float, out_dir: str | Path, name: str = "wide",
                      width: int | None = None, rows: int = 8, seed: int = 0) -> ExternalModel:
    """Write `<out_dir>/<name>.onnx` and `<name>.onnx.data`: blocks of RMSNorm -> MatMul ->
    Add -> Relu with about `total_bytes` of float32 weights, the middle block's norm faulty.

    Each weight matrix is generated, appended to the data file and dropped before the next,
    so peak memory is about one block's weights whatever the total.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    width = width or _width_for(total_bytes)
    blocks = max(2, round(total_bytes / (width * width * 4)))
    bad = blocks // 2
    path, data_path = out / f"{name}.onnx", out / f"{name}.onnx.data"
    g = _Graph(seed)
    x = "x"
    with open(data_path, "wb") as f:
        data = _DataFile(f, data_path.name)
        for i in range(blocks):
            p = f"blocks.{i}"
            h = g.op("Mul", f"{p}/norm/pre_scale",
                     [x, g.const(f"{p}.norm.pre_scale", FAULT_SCALE if i == bad else 1.0)])
            h = _layernorm(g, h, f"{p}/norm", width, centre=False)
            w = g.rng.standard_normal((width, width), np.float32)
            w *= np.float32(math.sqrt(2.0 / width))  # He init: Relu keeps the scale
            g.inits.append(data.tensor(f"{p}.fc.weight", w))
            del w
            g.inits.append(data.tensor(f"{p}.fc.bias", 0.02 * g.rng.standard_normal(width, np.float32)))
            h = g.op("MatMul", f"{p}/fc/MatMul", [h, f"{p}.fc.weight"])
            h = g.op("Add", f"{p}/fc/Add", [h, f"{p}.fc.bias"])
            x = g.op("Relu", f"{p}/Relu", [h])
    g.nodes[-1].output[0] = "y"
    model = g.model(name, {"x": [rows, width]}, {"y": [rows, width]})
    onnx.save_model(model, str(path))  # references only: the proto holds no weight bytes
    inputs = {"x": g.rng.standard_normal((rows, width), np.float32)}
    return ExternalModel(path, data_path, inputs, frozenset(overflow_chain(f"blocks.{bad}/norm")),
                         data.bytes, blocks, width)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=["transformer", "wide"])
    ap.add_argument("size", type=float, help="nodes (transformer) or weight bytes (wide)")
    ap.add_argument("out", help="the .onnx path (transformer) or a folder (wide)")
    args = ap.parse_args(argv)
    if args.kind == "transformer":
        m = synthetic_transformer(int(args.size))
        onnx.save(m.model, args.out)
        np.savez(Path(args.out).with_suffix(".npz"), **m.inputs)
        print(f"{args.out}: {len(m.model.graph.node)} nodes, faults {sorted(m.expected_fp32)}")
    else:
        w = wide_matmul_stack(args.size, args.out)
        np.savez(w.path.with_suffix(".npz"), **w.inputs)
        print(f"{w.path}: {w.blocks} blocks of width {w.width}, {w.weight_bytes / 1e9:.2f} GB "
              f"of weights in {w.data_path.name}, faults {sorted(w.expected_fp32)}")


if __name__ == "__main__":
    main()
