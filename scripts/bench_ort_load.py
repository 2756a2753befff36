"""How long ONNX Runtime's CPU provider takes to load a graph in FP32 and in FP16, by size
(docs/search_benchmark.md, "What bounds it from below"): the run must load every file it
writes, and the FP16 load grows with casts x nodes (`InsertCastTransformer` names each Cast it
inserts with `Graph::GenerateNodeName`, which compares the name with every node).

    python scripts/bench_ort_load.py 2500 5000 10000 20000

Each size: the synthetic transformer of scripts/bench_models.py as it is, and the same graph
with every float tensor float16 (weights, inputs, outputs, Constant values); each loaded once
in a fresh process (optimizations off, one thread, as `runtime_problem` loads a file).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import synthetic_transformer  # noqa: E402

LOAD = """
import sys, time, onnxruntime as ort
so = ort.SessionOptions()
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
so.intra_op_num_threads = 1
t = time.perf_counter()
ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
print(time.perf_counter() - t)
"""


def to_half(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same graph with every float tensor float16 (the whole graph in FP16)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    for t in g.initializer:
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(
                numpy_helper.to_array(t).astype(np.float16), t.name))
    for v in [*g.input, *g.output, *g.value_info]:
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            v.type.tensor_type.elem_type = TensorProto.FLOAT16
    for n in g.node:
        for a in n.attribute:
            if a.name == "value" and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(
                    numpy_helper.to_array(a.t).astype(np.float16)))
    onnx.checker.check_model(m, full_check=True)
    return m


def load_seconds(path: Path) -> float:
    out = subprocess.run([sys.executable, "-c", LOAD, str(path)], check=True,
                         capture_output=True, text=True)
    return float(out.stdout)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sizes", type=int, nargs="+", help="node counts")
    args = ap.parse_args(argv)
    print("| nodes | FP32 file | FP16 file |\n|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            model = synthetic_transformer(size).model
            fp32, fp16 = Path(tmp) / f"t{size}.onnx", Path(tmp) / f"h{size}.onnx"
            onnx.save(model, fp32)
            onnx.save(to_half(model), fp16)
            print(f"| {len(model.graph.node):,} | {load_seconds(fp32):.1f} s | "
                  f"{load_seconds(fp16):.1f} s |", flush=True)


if __name__ == "__main__":
    main()
