#!/usr/bin/env python3
"""FP16 and BF16 side by side on the benchmark models (issue #24); writes a section of
docs/bf16.md.

Per model, on the same emulator, samples and default criterion (`--semantics trt`, TensorRT
11, `--gpu l4`), `trtbisect run` once per precision; then `check` of each written mixed ONNX
(`--precision` matching) must give the run's numbers bit for bit (the one judge). Each row:
verdict, FP32 nodes of candidates, the plan's estimated engine time against all-low-precision
(cost.py; FP16 and BF16 share the tensor-core rate on the GPUs priced), the written mixed
ONNX's size, evaluations and seconds. Models run one after the other in this process (2 shared
cores); `--budget-s` skips the rest once spent.

    python scripts/bench_bf16.py                      # zoo, demo, deep_24, cached real models
    python scripts/bench_bf16.py --only zoo/ --out /tmp/bf16.md
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from doc_section import replace_section  # noqa: E402

from trtbisect.context import Options  # noqa: E402
from trtbisect.graph import with_node_names  # noqa: E402
from trtbisect.pipeline import check_mixed, run  # noqa: E402

DOC = ROOT / "docs" / "bf16.md"
BEGIN, END = "<!-- bench_bf16: begin -->", "<!-- bench_bf16: end -->"
MAX_EVALS = 300
PRECISIONS = ("fp16", "bf16")


def cases(want: Callable[[str], bool]) -> Iterator[tuple[str, Callable[[], tuple]]]:
    """(name, build) -> (model, inputs); built only when measured."""
    from tests.models.make_models import deep_model, zoo

    def demo():
        with np.load(ROOT / "models" / "demo_inputs.npz") as d:
            return onnx.load(ROOT / "models" / "demo.onnx"), {k: d[k] for k in d.files}

    if want("demo"):
        yield "demo", demo
    for name, z in zoo().items():
        if want(f"zoo/{name}"):
            yield f"zoo/{name}", (lambda z=z: (z.model, z.inputs))
    from fetch_models import MODELS, cache_root

    models = cache_root() / "models"
    for path in sorted(models.glob("*.onnx")) if models.is_dir() else []:
        if want(path.stem) and path.stem in MODELS:
            yield path.stem, (lambda path=path: (at_least_opset_13(onnx.load(str(path))),
                                                 MODELS[path.stem].make_inputs(seed=0)))
    if want("deep_24"):
        yield "deep_24", lambda: (lambda z: (z.model, z.inputs))(
            deep_model(blocks=24, overflow_blocks=(2, 11, 20)))


CONVERTED: dict[int, int] = {}  # id(model) -> its opset before conversion (the table notes it)


def at_least_opset_13(model: onnx.ModelProto) -> onnx.ModelProto:
    """--precision bf16 needs Cast to bfloat16 (opset 13); an older export (PP-OCRv4: opset 12)
    is converted once with onnx's version converter, and both precisions judge that file."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    if opset >= 13:
        return model
    from onnx import version_converter
    out = version_converter.convert_version(model, 13)
    CONVERTED[id(out)] = opset
    return out


def measure(name: str, build: Callable[[], tuple], work: Path) -> dict:
    model, feeds = build()
    converted = CONVERTED.pop(id(model), None)
    work.mkdir(parents=True, exist_ok=True)
    path, npz = work / "model.onnx", work / "inputs.npz"
    onnx.save(with_node_names(model), path)
    np.savez(npz, **feeds)
    rec: dict = {"model": name + (f" (opset {converted} -> 13)" if converted else ""),
                 "date": datetime.date.today().isoformat(), "runs": {}}
    for p in PRECISIONS:
        opts = Options.of(inputs=[str(npz)], max_evaluations=MAX_EVALS, resume=False, precision=p)
        t = time.perf_counter()
        with contextlib.redirect_stderr(io.StringIO()):
            r = run(path, opts, work / p)
        seconds = time.perf_counter() - t
        c = r.cost  # search/cost.CostRecord, read by attribute
        mixed = Path(r.files["mixed_model"]) if "mixed_model" in r.files else None
        one_judge = None
        if mixed is not None and r.errors_after:
            checked = check_mixed(mixed, path, Options.of(inputs=[str(npz)], precision=p))
            one_judge = all(r.errors_after[k].to_json() == e.to_json()
                            for k, e in checked.errors.items())
        rec["candidates"] = r.candidates
        rec["runs"][p] = {
            "verdict": r.verdict, "fp32_nodes": len(r.fp32_nodes),
            "causes": sorted({g.cause for g in (r.culprit_groups or [])}),
            "all_low_us": 1e6 * c.all_low_s if c else None,
            "plan_us": 1e6 * c.plan_s if c else None,
            "all_fp32_us": 1e6 * c.all_fp32_s if c else None,
            "slowdown": c.slowdown if c else None,
            "mixed_bytes": mixed.stat().st_size if mixed is not None and mixed.exists() else None,
            "evaluations": r.evaluations, "one_minimal": r.one_minimal,
            "seconds": round(seconds, 2),
            "search_equals_check": one_judge}
    return rec


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def _evals(run: dict) -> str:
    """Evaluations, starred where the plan is not certified 1-minimal (the cap was reached)."""
    short = run["verdict"] == "fixed" and not run["one_minimal"]
    return f"{run['evaluations']}{'*' if short else ''}"


def _mb(x: int | None) -> str:
    return "-" if x is None else (f"{x / 1e6:.2f} MB" if x >= 1e5 else f"{x / 1e3:.1f} kB")


def markdown(records: list[dict], skipped: list[str]) -> str:
    lines = [BEGIN, "",
             f"Measured {records[0]['date'] if records else datetime.date.today()} by "
             "`python scripts/bench_bf16.py` (emulator, `--semantics trt`, TensorRT 11, "
             "`--gpu l4`, default criterion, one seeded sample per model). *slowdown*: the "
             "plan's estimated engine time over all-FP16 (resp. all-BF16); *one judge*: "
             "`check` of the written file equals the run's numbers bit for bit.", "",
             "| model | candidates | FP16 verdict | FP16 FP32 nodes | FP16 slowdown | FP16 causes "
             "| BF16 verdict | BF16 FP32 nodes | BF16 slowdown | BF16 causes | mixed ONNX "
             "(FP16 / BF16) | evaluations | seconds | one judge |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        a, b = r["runs"]["fp16"], r["runs"]["bf16"]
        judged = [x["search_equals_check"] for x in (a, b) if x["search_equals_check"] is not None]
        lines.append(
            f"| {r['model']} | {r['candidates']} | {a['verdict']} | {a['fp32_nodes']} | "
            f"{_pct(a['slowdown'])} | {', '.join(a['causes']) or '-'} | {b['verdict']} | "
            f"{b['fp32_nodes']} | {_pct(b['slowdown'])} | {', '.join(b['causes']) or '-'} | "
            f"{_mb(a['mixed_bytes'])} / {_mb(b['mixed_bytes'])} | "
            f"{_evals(a)} / {_evals(b)} | {a['seconds']} / {b['seconds']} | "
            f"{'yes' if judged and all(judged) else ('-' if not judged else 'NO')} |")
    lines += ["", f"\\* the search stopped at the {MAX_EVALS}-evaluation cap: the plan passes (it "
              "is the file `check` judged) but is not certified 1-minimal."]
    if skipped:
        lines += ["", "Not measured (time budget spent): " + ", ".join(skipped) + "."]
    lines += ["", END]
    return "\n".join(lines) + "\n"


def write_section(text: str, doc: Path) -> None:
    replace_section(doc, text, BEGIN, END, empty=f"# BF16\n\n{BEGIN}\n{END}\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", action="append", default=[],
                    help="Measure the models whose name starts with this (repeatable).")
    ap.add_argument("--out", type=Path, default=DOC, help="The markdown file to update.")
    ap.add_argument("--json", type=Path, default=None, help="Also write the records here.")
    ap.add_argument("--budget-s", type=float, default=540.0,
                    help="Skip the remaining models once this many seconds are spent.")
    args = ap.parse_args()

    def want(name: str) -> bool:
        return not args.only or any(name.startswith(o) for o in args.only)

    records, skipped, started = [], [], time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for name, build in cases(want):
            if time.perf_counter() - started > args.budget_s:
                skipped.append(name)
                continue
            print(f"{name} ...", file=sys.stderr, flush=True)
            rec = measure(name, build, Path(tmp) / name.replace("/", "_"))
            records.append(rec)
            print("  " + json.dumps({p: (v["verdict"], v["fp32_nodes"], v["seconds"])
                                     for p, v in rec["runs"].items()}), file=sys.stderr,
                  flush=True)
    write_section(markdown(records, skipped), args.out)
    if args.json:
        args.json.write_text(json.dumps(records, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
