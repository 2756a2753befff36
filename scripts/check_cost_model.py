#!/usr/bin/env python3
"""Check the cost model (trtbisect/search/cost.py) against real timings on a GPU with PyTorch CUDA.

No GPU was at hand when the cost model was written (docs/cost.md says so); this script is
what a session with one runs. For each node of a model it can map to a PyTorch op (MatMul,
Gemm, Conv, ConvTranspose, pointwise, Softmax, reductions, LayerNormalization) it builds
random tensors of the shapes the run prices (cost.infer_shapes on the model's sample),
times the op in FP16 and in FP32 with CUDA events (median of `--reps`, after warm-up;
TF32 off unless `--tf32`), and compares per node the measured FP32 premium (t32 - t16) with
the estimated one. With `--trace` (a run's trace.json) it also ranks the plans the search
evaluated by estimated price and by the sum of their nodes' measured times, and reports
Kendall's tau between the two rankings: the question the search depends on.

    python scripts/check_cost_model.py model.onnx --inputs x.npz --gpu h100 \\
        --trace runs/model/trace.json --out cost_check.md
    python scripts/check_cost_model.py models/demo.onnx --inputs models/demo_inputs.npz \\
        --device cpu --reps 3        # a dry run of the plumbing (CPU timings mean nothing)

Per-node timings leave out what the model also leaves out (fusion, launch overhead shared by
fused layers); a fused layer's measured time is the sum of its nodes' here, so the check is
of the per-op roofline, and of the plan ranking the search relies on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trtbisect.graph import Graph  # noqa: E402
from trtbisect.judge import semantics  # noqa: E402
from trtbisect.search.cost import pricing_for  # noqa: E402

UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf", "Exp": "exp",
         "Sqrt": "sqrt", "Log": "log", "Abs": "abs", "Neg": "neg", "Reciprocal": "reciprocal"}
BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow",
          "Max": "maximum", "Min": "minimum"}


def op_for(node, shapes: dict, torch) -> Callable[[], Callable] | None:
    """A factory: given a dtype, the tensors and a closure that runs the node once."""
    def shape(t):
        return shapes.get(t)

    ins = [shape(t) for t in node.input]
    out = shape(node.output[0]) if node.output else None
    if out is None or any(s is None for s in ins[:2] if s is not None) or not ins or ins[0] is None:
        return None
    attrs = {a.name: a for a in node.attribute}
    F = torch.nn.functional

    def make(dtype, device):
        xs = [torch.randn(*(s or (1,)), dtype=dtype, device=device) if s is not None else None
              for s in ins]
        if node.op_type == "MatMul":
            return lambda: torch.matmul(xs[0], xs[1])
        if node.op_type == "Gemm":
            a = xs[0].t() if "transA" in attrs and attrs["transA"].i else xs[0]
            b = xs[1].t() if "transB" in attrs and attrs["transB"].i else xs[1]
            return lambda: torch.matmul(a, b)
        if node.op_type in ("Conv", "ConvTranspose"):
            group = attrs["group"].i if "group" in attrs else 1
            stride = list(attrs["strides"].ints) if "strides" in attrs else 1
            pads = list(attrs["pads"].ints)[: len(ins[0]) - 2] if "pads" in attrs else 0
            dil = list(attrs["dilations"].ints) if "dilations" in attrs else 1
            fn = F.conv2d if node.op_type == "Conv" else F.conv_transpose2d
            if len(ins[0]) != 4:
                return None
            return lambda: fn(xs[0], xs[1], None, stride, pads, groups=group, dilation=dil)
        if node.op_type in UNARY:
            f = getattr(torch, UNARY[node.op_type])
            return lambda: f(xs[0])
        if node.op_type in BINARY and len(xs) == 2 and xs[1] is not None:
            f = getattr(torch, BINARY[node.op_type])
            return lambda: f(xs[0], xs[1])
        if node.op_type == "Softmax":
            axis = attrs["axis"].i if "axis" in attrs else -1
            return lambda: torch.softmax(xs[0], axis)
        if node.op_type in ("ReduceMean", "ReduceSum"):
            f = torch.mean if node.op_type == "ReduceMean" else torch.sum
            return lambda: f(xs[0], dim=-1, keepdim=True)
        if node.op_type == "LayerNormalization":
            return lambda: F.layer_norm(xs[0], xs[0].shape[-1:])
        return None

    return make


def timed(fn: Callable, reps: int, torch, device: str) -> float:
    for _ in range(3):
        fn()
    if device == "cpu":
        import time

        samples = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t)
        return statistics.median(samples)
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def kendall(xs: list[float], ys: list[float]) -> float:
    n, s = len(xs), 0
    for i in range(n):
        for j in range(i + 1, n):
            s += np.sign(xs[i] - xs[j]) * np.sign(ys[i] - ys[j])
    return 2 * s / (n * (n - 1)) if n > 1 else float("nan")


def spearman(xs: list[float], ys: list[float]) -> float:
    rx, ry = np.argsort(np.argsort(xs)), np.argsort(np.argsort(ys))
    return float(np.corrcoef(rx, ry)[0, 1]) if len(xs) > 1 else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--inputs", required=True, help="an .npz sample (the run's own)")
    ap.add_argument("--gpu", default="l4", help="the cost model's GPU class to compare with")
    ap.add_argument("--semantics", default="trt", choices=["trt", "strict"])
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--trace", help="a run's trace.json: rank its plans both ways")
    ap.add_argument("--device", default="cuda", help="cuda (the check) or cpu (a dry run)")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", help="write the markdown report here")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        raise SystemExit("needs PyTorch: pip install 'trtbisect[torch]' "
                         "(a CUDA build for the check)") from None
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this check needs a GPU (--device cpu only dry-runs it)")
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        torch.backends.cudnn.allow_tf32 = args.tf32
    g = Graph.from_path(args.model)
    if args.semantics == "trt":
        g, prepared = semantics.prepare_graph(g, "trt")
    else:
        prepared = semantics.prepare(g.model, "strict")
    units = semantics.units(prepared, g.candidates())
    with np.load(args.inputs) as d:
        sample = {k: d[k] for k in d.files}
    pricing = pricing_for(g, units, sample, args.gpu, args.tf32)
    shapes = pricing._shapes  # noqa: SLF001 - the shapes the run priced
    measured: dict[str, tuple[float, float]] = {}
    with torch.no_grad():
        for name in g.candidates():
            make = op_for(g.node(name), shapes, torch)
            if make is None:
                continue
            try:
                t16 = timed(make(torch.float16, args.device), args.reps, torch, args.device)
                t32 = timed(make(torch.float32, args.device), args.reps, torch, args.device)
            except (RuntimeError, TypeError, ValueError):  # an op's exotic attributes
                continue
            measured[name] = (t16, t32)
    rows = []
    for u, ns in units.items():
        got = [measured[n] for n in ns if n in measured]
        if len(got) == len(ns):
            c = pricing.cost[u]
            rows.append((u, c.premium, sum(t32 - t16 for t16, t32 in got),
                         c.fp16_s, sum(t16 for t16, _ in got)))
    est, real = [r[1] for r in rows], [r[2] for r in rows]
    lines = [f"# Cost model check: {Path(args.model).name} on {torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu (dry run)'}",
             "", f"Cost model `--gpu {args.gpu}`{' --tf32' if args.tf32 else ''}; {len(rows)} of "
             f"{len(units)} units timed in FP16 and FP32 ({args.reps} reps, median).", "",
             f"- per unit, FP32 premium (t32 - t16): Spearman {spearman(est, real):.3f}, "
             f"Kendall {kendall(est, real):.3f}"]
    if args.trace:
        trials = json.loads(Path(args.trace).read_text())["trials"]
        timed_units = {r[0] for r in rows}
        plans = [t["fp32"] for t in trials if set(t["fp32"]) <= timed_units]
        premium = {r[0]: r[2] for r in rows}
        e = [pricing.price(p) for p in plans]
        m = [sum(premium[u] for u in p) for p in plans]
        lines.append(f"- the trace's {len(plans)} fully timed plans, estimated price against "
                     f"measured FP32 premium: Kendall {kendall(e, m):.3f}")
    lines += ["", "| unit | estimated premium (us) | measured premium (us) | estimated FP16 (us) "
              "| measured FP16 (us) |", "|---|---|---|---|---|"]
    for u, a, b, c, d in sorted(rows, key=lambda r: -r[1])[:40]:
        lines.append(f"| {u} | {1e6 * a:.3g} | {1e6 * b:.3g} | {1e6 * c:.3g} | {1e6 * d:.3g} |")
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
