#!/usr/bin/env python3
"""Search cost and emulator cost, measured (issue: core). Writes docs/search_benchmark.md.

Per model: evaluations of trtbisect's prior-guided search vs plain ddmin over all candidates
(same emulator, same criterion), the sizes of the sets they return, and what one evaluation
costs against a plain FP32 inference of the untouched model on ORT CPU.

    python scripts/bench_search.py            # all models, writes the markdown table
    python scripts/bench_search.py --quick    # skip the 24-block model
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.models.make_models import deep_model  # noqa: E402
from trtbisect.backends.ort import Emulator, Reference  # noqa: E402
from trtbisect.compare import Tolerance, compare_outputs  # noqa: E402
from trtbisect.graph import Graph  # noqa: E402
from trtbisect.pipeline import Options, run  # noqa: E402
from trtbisect.search import ddmin  # noqa: E402


def timed(fn, repeat: int) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def bench(name: str, model: onnx.ModelProto, inputs: dict, repeat: int, threads: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path, npz = Path(tmp) / f"{name}.onnx", Path(tmp) / "inputs.npz"
        onnx.save(model, path)
        np.savez(npz, **inputs)
        t = time.perf_counter()
        ours = run(path, Options(inputs=[str(npz)]), Path(tmp) / "out")
        ours_s = time.perf_counter() - t
    g = Graph(model)
    t = time.perf_counter()
    emu = Emulator(g, threads)
    build_s = time.perf_counter() - t
    ref = Reference(g, threads)
    expected = ref.run(inputs)

    def check(plan):
        return all(e.passed for e in compare_outputs(expected, emu.run(plan, inputs), Tolerance()).values())
    t = time.perf_counter()
    plain = ddmin(g.candidates(), check)
    plain_s = time.perf_counter() - t
    plan = frozenset(ours.fp32_nodes)
    fp32_s = timed(lambda: ref.run(inputs), repeat)
    eval_s = timed(lambda: emu.run(plan, inputs), repeat)
    return dict(model=name, nodes=len(g.names), candidates=len(g.candidates()),
                ours_evals=ours.evaluations, ours_set=len(ours.fp32_nodes), ours_s=ours_s,
                ddmin_evals=plain.evaluations, ddmin_set=len(plain.fp32), ddmin_s=plain_s,
                fp32_ms=fp32_s * 1e3, eval_ms=eval_s * 1e3, ratio=eval_s / fp32_s,
                session_s=build_s)


def models(quick: bool):
    demo = onnx.load(ROOT / "models" / "demo.onnx")
    with np.load(ROOT / "models" / "demo_inputs.npz") as d:
        yield "demo (CNN+Transformer)", demo, {k: d[k] for k in d.files}
    z = deep_model(blocks=12, overflow_blocks=(3, 9))
    yield "deep, 12 blocks, 2 sites", z.model, z.inputs
    if not quick:
        z = deep_model(blocks=24, overflow_blocks=(2, 11, 20))
        yield "deep, 24 blocks, 3 sites", z.model, z.inputs
    z = deep_model(blocks=12, overflow_blocks=(3, 9), d=256, seq=256)
    yield "wide: 12 blocks, d=256, seq=256", z.model, z.inputs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1,
                    help="ORT intra-op threads for both the emulator and the FP32 baseline")
    ap.add_argument("--out", default=str(ROOT / "docs" / "search_benchmark.md"))
    args = ap.parse_args()
    rows = []
    for name, model, inputs in models(args.quick):
        print(f"benchmarking {name} ...", file=sys.stderr)
        rows.append(bench(name, model, inputs, args.repeat, args.threads))
    head = ("| model | nodes | candidates | trtbisect evals | set | ddmin evals | set | "
            "ddmin / trtbisect | FP32 inference | one evaluation | ratio | emulator session build |")
    lines = [
        "# Search and emulator cost",
        "",
        f"Measured by `python scripts/bench_search.py` on {datetime.date.today()}, "
        f"{platform.processor() or platform.machine()}, {__import__('os').cpu_count()} cores, "
        f"Python {platform.python_version()}, onnxruntime {onnxruntime.__version__}, "
        f"onnx {onnx.__version__}. Evaluations count every plan run, the all-FP16 one and "
        "trtbisect's final check included; ddmin is plain delta debugging over all candidate "
        "nodes with no prior, on the same emulator and criterion. Times are medians, with "
        f"{args.threads} ORT thread(s) for both the emulator and the FP32 baseline.",
        "",
        head,
        "|" + "|".join(["---"] * 12) + "|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['nodes']} | {r['candidates']} | {r['ours_evals']} | "
            f"{r['ours_set']} | {r['ddmin_evals']} | {r['ddmin_set']} | "
            f"{r['ddmin_evals'] / r['ours_evals']:.1f}x | {r['fp32_ms']:.2f} ms | "
            f"{r['eval_ms']:.2f} ms | {r['ratio']:.2f}x | {r['session_s']:.2f} s |")
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
