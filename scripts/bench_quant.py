#!/usr/bin/env python3
"""Quantized runs on real models (docs/quantization.md, "Benchmark"): each model quantized by
ModelOpt's ONNX PTQ (`trtbisect run --precision int8|fp8`, FP32 elsewhere) on 4 seeded samples
(`--samples N`)
from scripts/fetch_models.py, then bisected. One line per model and format: the verdict, layers
un-quantized, evaluations, errors before and after, the written file's margin under the bound
against the spread the variations measure (precision.json `margins`: the output nearest to
failing its certificate, both as a share of its bound; `fragile` where the spread is larger),
the validation on unseen samples (precision.json `validation`: what was held out, passed or
not), the estimated engine times, wall time. `--keep DIR` keeps each run's --out folder
(precision.json, renderings) under DIR instead of a temporary folder.

Needs ModelOpt (docs/quantization.md has the install line) and the fetched models.
`--max-evals N` bounds each search (the row then says whether the plan is certified). The
"ModelOpt default" column is what ModelOpt's own default exclusions leave: of the model's
Conv/ConvTranspose/MatMul/Gemm nodes, how many it quantized (the file as given: the "before"
error and the "all quantized" time are that file's).

    python scripts/bench_quant.py magika ppocr_det --formats int8 fp8 -- --rtol 2e-4
    python scripts/bench_quant.py minilm_l3 --max-evals 40
    python scripts/bench_quant.py ppocr_rec ppocr_det --samples 1 [-- --metric iou:0.3:0.98]
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

from trtbisect.quant.cost import QuantCost  # noqa: E402

SAMPLES = 4
# per model: what `run` needs besides its samples (MiniLM's dynamic axes, fixed for ModelOpt)
EXTRA = {"minilm_l3": ["--shape", "input_ids:1x64", "--shape", "attention_mask:1x64"]}
WEIGHTED = ("Conv", "ConvTranspose", "MatMul", "Gemm")


def weighted_ops(path: Path) -> int:
    import onnx
    m = onnx.load(str(path), load_external_data=False)
    return sum(1 for n in m.graph.node if n.op_type in WEIGHTED)


def margin(d: dict) -> str:
    """The output nearest to failing its certificate: margin and spread as shares of its bound
    (precision.json `margins`, stages/spread.py: certified when the margin exceeds the spread).
    A `--metric`'s score is measured in its severity (1 at the threshold), so its margin and
    spread are already shares of the distance from a perfect score to the threshold."""
    shares = [(m["margin"] / m["bound"], m["spread"] / m["bound"], m["certified"])
              for m in (d.get("margins") or {}).values()
              if all(isinstance(m.get(k), float) for k in ("bound", "margin", "spread"))
              and m["bound"] > 0]
    shares += [(m["margin"], m["spread"], m["certified"])
               for m in ((d.get("certificate") or {}).get("scores") or {}).values()
               if isinstance(m.get("margin"), float) and isinstance(m.get("spread"), float)]
    if not shares:
        return "-"
    m, spread, certified = min(shares, key=lambda t: t[0] - t[1])
    return f"{m:.2f} / {spread:.2f}{'' if certified else ' (fails)'}"


def validated(d: dict) -> str:
    """precision.json `validation`: the samples held out (or perturbed copies), passed or not."""
    v = d.get("validation")
    if not v:
        return "-"
    return f"{v['samples']}: {'passed' if v['passed'] else 'FAILED'}"


def one(name: str, fmt: str, extra: list[str], folder: Path, samples: int = SAMPLES,
        max_evals: int | None = None) -> str:
    path = fetch(name)
    inputs = []
    for k in range(samples):
        f = folder / f"{name}_{k}.npz"
        np.savez(f, **MODELS[name].make_inputs(seed=k))
        inputs += ["--inputs", str(f)]
    began = time.perf_counter()
    bound = ["--max-evals", str(max_evals)] if max_evals else []
    r = subprocess.run([sys.executable, "-m", "trtbisect", "-q", "run", str(path),
                        "--precision", fmt, *inputs, "--out", str(folder / f"{name}-{fmt}"),
                        "--json", *EXTRA.get(name, []), *bound, *extra],
                       capture_output=True, text=True)
    wall = time.perf_counter() - began
    try:
        d = json.loads(r.stdout)
    except json.JSONDecodeError:
        return f"| {name} | {fmt} | exit {r.returncode}: {r.stderr.strip()[-200:]} |"
    c = QuantCost.from_json(d["cost"])  # the quantized road's "cost", read by attribute

    def worst(errors: dict) -> str:
        vals = [e["rel"] for e in errors.values() if isinstance(e.get("rel"), float)]
        return f"{max(vals):.3g}" if vals else "-"
    weighted = sum(1 for la in d["layers"] if la["op"] in WEIGHTED)
    step = c.certificate.cheaper if c.certificate is not None else None
    certified = ("" if not d["evaluations"] else " (certified)" if d["one_minimal"]
                 else f" (1-minimal, then {len(step.moves)} cheaper step(s), "
                 f"{step.evaluations} evaluations)" if step is not None and step.moves
                 else " (not certified)")
    plan = (f"{len(d['unquantized_layers'])} layers + {len(d['fp32_nodes'])} FP32 nodes"
            if d["fp32_nodes"] else f"{len(d['unquantized_layers'])}")
    return (f"| {name} | {fmt} | {weighted} of {weighted_ops(path)} | {d['verdict']} | {plan} "
            f"of {d['quantized_layers']} | {d['evaluations']}{certified} | "
            f"{worst(d['errors_before'])} | "
            f"{worst(d['errors_after'])} | {margin(d)} | {validated(d)} | {c.all_fp16_s * 1e6:.1f} | "
            f"{c.all_quantized_s * 1e6:.1f} | {c.plan_s * 1e6:.1f} | {wall:.0f} s |")


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", choices=sorted(MODELS))
    ap.add_argument("--formats", nargs="+", default=["int8", "fp8"], choices=["int8", "fp8"])
    ap.add_argument("--samples", type=int, default=SAMPLES, help="seeded samples per model")
    ap.add_argument("--max-evals", type=int, default=None, help="bound each search")
    ap.add_argument("--keep", type=Path, default=None,
                    help="keep each run's --out folder under this folder")
    args = ap.parse_args(argv)
    print("| model | format | ModelOpt default: weighted ops quantized | verdict | layers "
          "un-quantized | evaluations | rel. error before (ModelOpt default) | after | margin / "
          "spread (of the bound) | validation | est. all FP16 (us) | all quantized (us) | "
          "plan (us) | wall |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="bench-quant-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for name in args.models:
            for fmt in args.formats:
                print(one(name, fmt, extra, folder, args.samples, args.max_evals),
                      flush=True)


if __name__ == "__main__":
    main()
