#!/usr/bin/env python3
"""Constants and LayerNormalization as TensorRT sees them, measured (issue #20).

Writes the section between the `bench_constants` markers of docs/search_benchmark.md
(scripts/bench_search.py keeps it when it rewrites the page).

* PP-OCRv4 det (paddle2onnx: every weight in a Constant node) on a printed page
  (scripts/page_image.py, 640x640), and its initializer twin
  (`semantics.constants_as_initializers`: the same model to TensorRT), under `trt` and
  `strict`: the all-FP16 error, the plan, its FP32 FLOP share, evaluations, and whether the
  twin's answer is the model's bit for bit;
* an rxnmapper-like encoder (scripts/rxn_like.py, opset-17 LayerNormalization; needs torch):
  the all-FP16 error and plan under both semantics, at the default tolerance and at rtol 1e-3.

Each `trtbisect run` is a child process. `--baseline DIR` also runs every case on an older
source tree (e.g. `git archive <commit> | tar -x -C DIR`): the "before" rows.

    python scripts/bench_constants.py --baseline /tmp/trtbisect-main     # about 30 min, 2 cores
    python scripts/bench_constants.py --only rxn --rows /tmp/rows.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_rewrites import flop_share, flop_table  # noqa: E402
from doc_section import replace_section  # noqa: E402

from trtbisect.graph import with_node_names  # noqa: E402
from trtbisect.judge.semantics import constants_as_initializers  # noqa: E402

DOC = ROOT / "docs" / "search_benchmark.md"
BEGIN, END = "<!-- bench_constants: begin -->", "<!-- bench_constants: end -->"


MAX_EVALS = 300  # per search: strict PP-OCRv4 det needs about 1,500 (27 min on 2 shared cores)


def run_case(code: Path, model: Path, inputs: Path, semantics: str, out: Path,
             rtol: float | None = None, timeout: int = 3600) -> dict:
    """One `trtbisect run --json` on the trtbisect of source tree `code`, in a child."""
    cmd = [sys.executable, "-m", "trtbisect", "run", str(model), "--inputs", str(inputs),
           "--semantics", semantics, "--out", str(out), "--json", "-q", "--no-resume",
           "--max-evals", str(MAX_EVALS)]
    if rtol is not None:
        cmd += ["--rtol", str(rtol)]
    env = {**os.environ, "PYTHONPATH": str(code)}
    print(f"[bench] {code.name}: {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=str(out.parent))
    if not done.stdout.strip():
        raise SystemExit(f"run failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def summary(r: dict, flops: dict, total: int) -> dict:
    (out, e), = list(r["errors_before"].items())[:1]
    share = flop_share(r["fp32_nodes"], flops, total)
    groups = [(g["cause"], g.get("pattern"), len(g["nodes"]), g["summary"])
              for g in r.get("culprit_groups", [])]
    return {"verdict": r["verdict"], "output": out, "max_abs": e["max_abs"], "bound": e["bound"],
            "mean_abs": e["mean_abs"], "p99_abs": e["p99_abs"], "cosine": e["cosine"],
            "plan": len(r["fp32_nodes"]), "candidates": r["model"]["candidates"],
            "nodes": r["model"]["nodes"], "flop_share": share, "evaluations": r["evaluations"],
            "seconds": r["seconds"], "stopped": r["evaluations"] >= MAX_EVALS
            and not r.get("one_minimal"), "one_judge": r.get("one_judge", {}).get(
                "search_equals_check"), "groups": groups, "fp32_nodes": r["fp32_nodes"],
            "errors_before": r["errors_before"], "errors_after": r["errors_after"],
            "layer_norms": sum(1 for n in r["fp32_nodes"] if "LayerNorm" in n)}


DET_LOOSE_RTOL = 0.1  # a looser criterion: does all-FP16 pass once nothing rounds to inf?


def _key(case: str, code: str, semantics: str, rtol: float) -> str:
    return f"{case}|{code}|{semantics}|{rtol}"


def det_cases(work: Path, codes: dict[str, Path], done: dict[str, dict]) -> list[dict]:
    from fetch_models import fetch
    from page_image import page_input

    model = Path(fetch("ppocr_det", quiet=True))
    twin = work / "ppocr_det_twin.onnx"
    onnx.save(constants_as_initializers(onnx.load(model)), twin)
    inputs = work / "page.npz"
    feeds = {"x": page_input(640, 640)}
    np.savez(inputs, **feeds)
    flops = flop_table(with_node_names(onnx.load(model)), feeds)
    total = sum(v or 0 for v in flops.values())
    rows = []
    for code_name, code in codes.items():
        runs = [(s, label, path, 0.01) for s in ("trt", "strict")
                for label, path in (("ppocr_det", model), ("ppocr_det twin", twin))
                if not (code_name == "before" and s == "strict" and "twin" in label)]
        runs.append(("trt", "ppocr_det", model, DET_LOOSE_RTOL))
        for semantics, label, path, rtol in runs:
            key = _key(label, code_name, semantics, rtol)
            if key not in done:
                out = work / f"{code_name}_{semantics}_{label.replace(' ', '_')}_{rtol}"
                r = run_case(code, path, inputs, semantics, out, rtol)
                done[key] = {"case": label, "code": code_name, "semantics": semantics,
                             "rtol": rtol, **summary(r, flops, total)}
            rows.append(done[key])
    return rows


def rxn_cases(work: Path, codes: dict[str, Path], done: dict[str, dict]) -> list[dict]:
    from trtbisect.torch.export import ExportOptions, export

    model = work / "rxn_like.onnx"
    res = export(f"{ROOT / 'scripts' / 'rxn_like.py'}:rxn_like", [], model,
                 ExportOptions(opset=17))
    inputs = Path(res.inputs_path)
    feeds = dict(np.load(inputs))
    loaded = onnx.load(model)
    flops = flop_table(with_node_names(loaded), feeds)
    total = sum(v or 0 for v in flops.values())
    norms = sum(1 for n in loaded.graph.node if n.op_type == "LayerNormalization")
    rows = []
    for code_name, code in codes.items():
        for semantics in ("strict", "trt"):
            for rtol in (0.01, 0.001):
                key = _key("rxn_like", code_name, semantics, rtol)
                if key not in done:
                    out = work / f"rxn_{code_name}_{semantics}_{rtol}"
                    r = run_case(code, model, inputs, semantics, out, rtol)
                    done[key] = {"case": "rxn_like", "code": code_name, "semantics": semantics,
                                 "rtol": rtol, "model_nodes": len(loaded.graph.node),
                                 "model_norms": norms, **summary(r, flops, total)}
                rows.append(done[key])
    return rows


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def same_answer(a: dict, b: dict) -> bool:
    return (a["verdict"], a["fp32_nodes"], a["errors_before"], a["errors_after"]) == (
        b["verdict"], b["fp32_nodes"], b["errors_before"], b["errors_after"])


def render(rows: list[dict], baseline: str | None) -> str:
    lines = [BEGIN, "", "## Constants and LayerNormalization as TensorRT sees them (issue #20)", "",
             f"Measured by `python scripts/bench_constants.py` on {datetime.date.today()} "
             f"({platform.machine()}, {os.cpu_count()} shared cores, onnxruntime and onnx as "
             "above). *before*: the same cases on "
             f"{baseline or 'the code before issue #20'} (`--baseline`); *after*: this tree. "
             "*FP32 FLOPs*: the plan's share of the model's Conv/ConvTranspose/MatMul/Gemm "
             "FLOPs (2 per multiply-add, from ONNX shape inference at the sample's shapes). "
             "Errors are the all-FP16 output errors the run reports (max, mean and p99 of "
             "|fp16 - fp32|, cosine); *bound* is the default criterion's (rtol 0.01 of the "
             "output's range unless said). *check*: `trtbisect check` of the written mixed "
             "model gives the run's numbers (`one_judge.search_equals_check`). Each search is "
             f"capped at {MAX_EVALS} evaluations (*stopped*: the cap was hit; the plan passes "
             "but is not certified 1-minimal).", "",
             "PP-OCRv4 det is the rapidocr-onnxruntime 1.4.4 wheel's paddle2onnx export "
             "(scripts/fetch_models.py): 342 of its 672 nodes are `Constant` nodes holding every "
             "weight, no initializer. Its input is a printed page, not random data: "
             "`scripts/page_image.py` renders 18 lines of black text (an invoice) on a white "
             "640x640 page in Pillow's built-in bitmap font, normalised as RapidOCR's detector "
             "normalises (x/255, ImageNet mean and std). *twin*: "
             "`semantics.constants_as_initializers(model)`, the same model with its Constant "
             "nodes turned into initializers of the same names and its nodes named as "
             "trtbisect names them; TensorRT's parser imports both alike.", "",
             "| model | code | semantics | rtol | verdict | all-FP16 max / bound | mean | p99 | "
             "cosine | FP32 nodes | FP32 FLOPs | evaluations | check | seconds |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["case"].startswith("ppocr"):
            lines.append(
                f"| {r['case']} | {r['code']} | {r['semantics']} | {r['rtol']} | {r['verdict']} | "
                f"{_g(r['max_abs'])} / {_g(r['bound'])} | {_g(r['mean_abs'])} | "
                f"{_g(r['p99_abs'])} | {r['cosine']:.6f} | {r['plan']} of {r['candidates']} | "
                f"{_pct(r['flop_share'])} | {r['evaluations']}{' (stopped)' if r['stopped'] else ''} | "
                f"{'yes' if r['one_judge'] else '-'} | {r['seconds']:.0f} |")
    det = {(r["code"], r["semantics"], r["case"]): r for r in rows
           if r["case"].startswith("ppocr") and r["rtol"] == 0.01}
    notes = []
    for code in ("before", "after"):
        for semantics in ("trt", "strict"):
            a, b = det.get((code, semantics, "ppocr_det")), det.get((code, semantics,
                                                                      "ppocr_det twin"))
            if a and b:
                notes.append(f"- {code}, `{semantics}`: the twin's verdict, plan and errors "
                             f"{'equal' if same_answer(a, b) else '**differ from**'} the "
                             "model's" + (" bit for bit." if same_answer(a, b) else "."))
    loose = {r["code"]: r for r in rows if r["case"] == "ppocr_det" and r["rtol"] != 0.01}
    if loose:
        notes.append("- At rtol " + ", ".join(sorted({str(r["rtol"]) for r in loose.values()}))
                     + " (`trt`): " + "; ".join(
                         f"{code}: {r['verdict']}, all-FP16 max {_g(r['max_abs'])}, "
                         f"{r['plan']} FP32 nodes ({_pct(r['flop_share'])} of the FLOPs)"
                         for code, r in loose.items())
                     + ". What is left at rtol 0.01 is FP16 rounding accumulated over the "
                     "network (no value leaves FP16's range), which that criterion rejects "
                     "(max |d| over the whole probability map).")
    after = det.get(("after", "trt", "ppocr_det"))
    if after:
        notes.append(f"- Culprit groups of the `trt` plan after the change ({len(after['groups'])}):")
        for cause, pattern, n, text in after["groups"]:
            notes.append(f"  - {cause}{', ' + pattern if pattern else ''} ({n} nodes): {text}")
    before = det.get(("before", "trt", "ppocr_det"))
    if before:
        notes.append(f"- Culprit groups of the `trt` plan before ({len(before['groups'])}), the "
                     "ones that blame a constant:")
        for cause, pattern, n, text in before["groups"]:
            if cause in ("constant_out_of_range", "underflow"):
                notes.append(f"  - {cause}{', ' + pattern if pattern else ''} ({n} nodes): {text}")
    lines += ["", *notes, ""]
    rxn = [r for r in rows if r["case"] == "rxn_like"]
    if rxn:
        lines += ["The rxnmapper-like encoder (`scripts/rxn_like.py`, exported with "
                  "`trtbisect export ... --opset 17`: "
                  f"{rxn[0]['model_nodes']} nodes, {rxn[0]['model_norms']} of them opset-17 "
                  "LayerNormalization; *FP32 nodes* counts of the judged graph's candidates) on its "
                  "seeded token sample. *LayerNorms in the plan*: how many LayerNormalization "
                  "nodes the plan keeps in FP32 (before issue #20 none could be named: they "
                  "were never rounded).", "",
                  "| code | semantics | rtol | verdict | all-FP16 max / bound | cosine | "
                  "FP32 nodes | LayerNorms in the plan | FP32 FLOPs | evaluations | check |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rxn:
            lines.append(
                f"| {r['code']} | {r['semantics']} | {r['rtol']} | {r['verdict']} | "
                f"{_g(r['max_abs'])} / {_g(r['bound'])} | {r['cosine']:.7f} | "
                f"{r['plan']} of {r['candidates']} | {r['layer_norms']} | "
                f"{_pct(r['flop_share'])} | {r['evaluations']}{' (stopped)' if r['stopped'] else ''} | "
                f"{'yes' if r['one_judge'] else '-'} |")
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def write_doc(text: str, doc: Path = DOC) -> None:
    replace_section(doc, text, BEGIN, END)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", help="an older trtbisect source tree: the 'before' rows")
    ap.add_argument("--baseline-label", help="what --baseline is, for the page (e.g. a commit)")
    ap.add_argument("--only", choices=("det", "rxn"), action="append", default=[])
    ap.add_argument("--workdir", help="where models and runs go (default: a temporary folder)")
    ap.add_argument("--rows", help="save the raw rows as JSON here; rows already in it are "
                    "kept, not measured again (delete it to measure afresh)")
    ap.add_argument("--from-rows", help="only render the section from rows saved by --rows")
    ap.add_argument("--doc", default=str(DOC))
    args = ap.parse_args()
    done: dict[str, dict] = {}
    if args.from_rows:
        saved = json.loads(Path(args.from_rows).read_text())
        text = render(saved["rows"], saved.get("baseline"))
    else:
        codes = {"after": ROOT}
        if args.baseline:
            codes = {"before": Path(args.baseline).resolve(), **codes}
        with tempfile.TemporaryDirectory(prefix="trtbisect-constants-") as tmp:
            work = Path(args.workdir or tmp).resolve()
            work.mkdir(parents=True, exist_ok=True)
            if args.rows and Path(args.rows).is_file():  # measured before: kept, not rerun
                done = {_key(r["case"], r["code"], r["semantics"], r["rtol"]): r
                        for r in json.loads(Path(args.rows).read_text())["rows"]}
            rows: list[dict] = []
            if not args.only or "det" in args.only:
                rows += det_cases(work, codes, done)
            if not args.only or "rxn" in args.only:
                rows += rxn_cases(work, codes, done)
        if args.rows:
            kept = rows + [r for r in done.values() if r not in rows]  # --only keeps the rest
            Path(args.rows).write_text(json.dumps(
                {"rows": kept, "baseline": args.baseline_label or args.baseline}, indent=1))
        text = render(rows, args.baseline_label or args.baseline)
    write_doc(text, Path(args.doc))
    print(text)


if __name__ == "__main__":
    main()
