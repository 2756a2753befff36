#!/usr/bin/env python3
"""Quantized runs on real models (docs/quantization.md, "Benchmark"): each model quantized by
ModelOpt's ONNX PTQ (`trtbisect run --precision int8|fp8`, FP32 elsewhere) on 4 seeded samples
(`--samples N`)
from scripts/fetch_models.py, then bisected. One line per model and format: the verdict, layers
un-quantized, evaluations, errors before and after, the estimated engine times, wall time.

Needs ModelOpt (docs/quantization.md has the install line) and the fetched models.

    python scripts/bench_quant.py magika ppocr_det --formats int8 fp8 -- --rtol 2e-4
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fetch_models import MODELS, fetch  # noqa: E402

SAMPLES = 4


def one(name: str, fmt: str, extra: list[str], folder: Path, samples: int = SAMPLES) -> str:
    path = fetch(name)
    inputs = []
    for k in range(samples):
        f = folder / f"{name}_{k}.npz"
        np.savez(f, **MODELS[name].make_inputs(seed=k))
        inputs += ["--inputs", str(f)]
    began = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "trtbisect", "-q", "run", str(path),
                        "--precision", fmt, *inputs, "--out", str(folder / f"{name}-{fmt}"),
                        "--json", *extra], capture_output=True, text=True)
    wall = time.perf_counter() - began
    try:
        d = json.loads(r.stdout)
    except json.JSONDecodeError:
        return f"| {name} | {fmt} | exit {r.returncode}: {r.stderr.strip()[-200:]} |"
    c = d["cost"]

    def worst(errors: dict) -> str:
        vals = [e["rel"] for e in errors.values() if isinstance(e.get("rel"), float)]
        return f"{max(vals):.3g}" if vals else "-"
    return (f"| {name} | {fmt} | {d['verdict']} | {len(d['unquantized_layers'])} of "
            f"{d['quantized_layers']} | {d['evaluations']} | {worst(d['errors_before'])} | "
            f"{worst(d['errors_after'])} | {c['all_fp16_s'] * 1e6:.1f} | "
            f"{c['all_quantized_s'] * 1e6:.1f} | {c['plan_s'] * 1e6:.1f} | {wall:.0f} s |")


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", choices=sorted(MODELS))
    ap.add_argument("--formats", nargs="+", default=["int8", "fp8"], choices=["int8", "fp8"])
    ap.add_argument("--samples", type=int, default=SAMPLES, help="seeded samples per model")
    args = ap.parse_args(argv)
    print("| model | format | verdict | layers un-quantized | evaluations | rel. error before "
          "| after | est. all FP16 (us) | all quantized (us) | plan (us) | wall |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="bench-quant-") as tmp:
        for name in args.models:
            for fmt in args.formats:
                print(one(name, fmt, extra, Path(tmp), args.samples), flush=True)


if __name__ == "__main__":
    main()
