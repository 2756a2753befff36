"""Benchmark: does `fixed` hold outside the run (issue #32)? Writes the table docs/trust.md shows.

For each case, `trtbisect run` (a fresh `--out`), then the two Polygraphy lines commands.sh
writes for the mixed model on ONNX Runtime, run as written (Polygraphy's defaults: ORT's graph
optimizations on), and the ONNX checker's full check and an ORT load of every written .onnx.
Recorded: verdict, FP32 nodes, estimated slowdown, per output the margin under the rendered
bound and the spread (the certificate; before #32 only the noise floor, measured when close),
whether the Polygraphy check passes, and whether every written file loads.

`--tree DIR` runs the trtbisect of another checkout (`git worktree add /tmp/old cfa9d9c`: the
code before #32), so one script measures before and after:

    python scripts/fetch_models.py ppocr_det silero_vad_if magika minilm_l3
    python scripts/bench_trust.py --tree /tmp/old --json before.json
    python scripts/bench_trust.py --json after.json
    python scripts/bench_trust.py --table before.json after.json   # the docs table

Cases (the issue's six): PP-OCRv4 det on the page image (scripts/page_image.py) and on the
page, its mirror and its upside-down copy; silero-vad's If model on 4 streamed chunks at
--rtol 1e-4 (scripts/bench_control_flow.py's samples); magika and MiniLM-L3 (--semantics
strict) on seeded random inputs; the demo.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))


def _det_samples(work: Path, n: int) -> list[str]:
    from page_image import page_input

    page = page_input()
    copies = [page, page[..., ::-1].copy(), page[..., ::-1, :].copy()][:n]
    out = []
    for k, x in enumerate(copies):
        path = work / f"det_{n}_{k}.npz"
        np.savez(path, x=np.ascontiguousarray(x))
        out.append(str(path))
    return out


def _silero_samples(work: Path) -> list[str]:
    from bench_control_flow import stream_samples
    from fetch_models import fetch

    out = []
    for k, s in enumerate(stream_samples(fetch("silero_vad_if", quiet=True))):
        path = work / f"chunk{k}.npz"
        np.savez(path, **s)
        out.append(str(path))
    return out


def _views(work: Path) -> list[str]:
    """The page seen other ways (mirrored, upside down): data the 1-sample run never saw."""
    return _det_samples(work, 3)[1:]


def cases(work: Path) -> list[tuple[str, str, list[str]]]:
    """(name, model, run arguments)."""
    from fetch_models import fetch

    def inputs(paths):
        return [a for p in paths for a in ("--inputs", p)]

    det = str(fetch("ppocr_det", quiet=True))
    return [
        ("PP-OCRv4 det, 1 sample", det, inputs(_det_samples(work, 1))),
        ("PP-OCRv4 det, 3 samples", det, inputs(_det_samples(work, 3))),
        ("silero-vad (If), 4 samples, rtol 1e-4", str(fetch("silero_vad_if", quiet=True)),
         [*inputs(_silero_samples(work)), "--rtol", "1e-4"]),
        ("magika", str(fetch("magika", quiet=True)), ["--shape", "bytes:1x2048"]),
        ("MiniLM-L3, strict", str(fetch("minilm_l3", quiet=True)),
         ["--semantics", "strict", "--shape", "input_ids:1x64", "--shape", "attention_mask:1x64"]),
        ("demo", str(ROOT / "models" / "demo.onnx"),
         ["--inputs", str(ROOT / "models" / "demo_inputs.npz")]),
    ]


def loads(path: Path) -> bool:
    import onnx
    import onnxruntime as ort

    try:
        onnx.checker.check_model(str(path), full_check=True)
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    except Exception:
        return False
    return True


def polygraphy_passes(out: Path, plan: dict) -> bool | None:
    text = (plan.get("renderings") or {}).get("polygraphy_check")
    if not text:
        return None
    poly = Path(sys.executable).parent / "polygraphy"
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        argv = shlex.split(line)
        done = subprocess.run([str(poly), *argv[1:]], cwd=out, capture_output=True, text=True)
        if done.returncode != 0:
            return False
    return True


def measure(name: str, model: str, args: list[str], tree: Path, work: Path) -> dict:
    out = work / name.replace(" ", "_").replace(",", "").replace("(", "").replace(")", "")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "trtbisect", "-q", "run", model, *args,
                           "--out", str(out), "--json"], env=env, capture_output=True, text=True,
                          cwd=work)  # not the checkout: `-m` puts the working folder first
    wall = time.perf_counter() - began
    try:
        plan = json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"case": name, "error": done.stderr.strip().splitlines()[-1:]}
    cert = plan.get("certificate") or {}
    margins = {o: {"margin": m.get("margin"), "spread": m.get("spread", m.get("noise_floor"))}
               for o, m in (cert.get("outputs") or plan.get("margins") or {}).items()}
    written = sorted(out.glob("*.onnx"))
    validation = plan.get("validation") or {}
    views = None
    if name.startswith("PP-OCRv4 det, 1") and (plan.get("files") or {}).get("mixed_model"):
        # the written plan on other views of the page, as `check` judges it (issue #45)
        views = []
        for v in _views(work):
            c = subprocess.run([sys.executable, "-m", "trtbisect", "check",
                                plan["files"]["mixed_model"], "--reference", model,
                                "--inputs", v, "--json"], env=env, capture_output=True,
                               text=True, cwd=work)
            try:
                e = json.loads(c.stdout)["errors"]
                views.append({o: [x["max_abs"], x["bound"]] for o, x in e.items()})
            except (json.JSONDecodeError, KeyError):
                views.append({"error": c.stderr.strip().splitlines()[-1:]})
    aims = plan.get("aimed_searches") or []
    return {"case": name, "exit": done.returncode, "verdict": plan["verdict"],
            "validation": {"kind": validation.get("kind"), "passed": validation.get("passed")},
            "aimed_evaluations": sum(a.get("evaluations", 0) for a in aims),
            "decided": cert.get("decided"), "other_views": views,
            "fp32_nodes": len(plan["fp32_nodes"]), "candidates": plan["model"]["candidates"],
            "slowdown": (plan.get("cost") or {}).get("slowdown"), "margins": margins,
            "certified": cert.get("certified"), "evaluations": plan["evaluations"],
            "polygraphy": polygraphy_passes(out, plan),
            "files_load": all(loads(f) for f in written), "files": len(written),
            "wall": round(wall, 1)}


def table(before: list[dict], after: list[dict]) -> str:
    def cell(r: dict) -> str:
        if "error" in r:
            return f"error: {r['error']}"
        m = "; ".join(f"{o} {_g(v['margin'])}/{_g(v['spread'])}" for o, v in r["margins"].items())
        slow = "" if r["slowdown"] is None else f", {100 * r['slowdown']:+.1f}%"
        poly = {True: "passes", False: "FAILS", None: "-"}[r["polygraphy"]]
        v = r.get("validation") or {}
        val = ("-" if not v.get("kind") else
               f"{v['kind']} {'passes' if v['passed'] else 'FAILS' if v['passed'] is False else '-'}")
        views = "; ".join(
            "error" if "error" in w else ", ".join(
                f"{_g(d)}/{_g(b)} {'ok' if d <= b else 'FAIL'}" for d, b in w.values())
            for w in (r.get("other_views") or []))
        return (f"{r['verdict']} (exit {r['exit']}), {r['fp32_nodes']}/{r['candidates']} FP32"
                f"{slow}; {r.get('evaluations')} evaluations"
                + (f" ({r['aimed_evaluations']} aimed)" if r.get("aimed_evaluations") else "")
                + f"; margin/spread {m or '-'}; validation {val}"
                + (f"; other views of the page {views}" if views else "")
                + f"; Polygraphy {poly}; files load: {'yes' if r['files_load'] else 'NO'}")

    rows = ["| case | before | after |", "|---|---|---|"]
    for b, a in zip(before, after):
        rows.append(f"| {a['case']} | {cell(b)} | {cell(a)} |")
    return "\n".join(rows) + "\n"


def _g(x) -> str:
    return str(x) if not isinstance(x, (int, float)) else f"{x:.3g}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose trtbisect runs")
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--only", help="run only the cases whose name contains this")
    ap.add_argument("--table", nargs=2, type=Path, metavar=("BEFORE", "AFTER"),
                    help="print the docs table from two --json files")
    a = ap.parse_args()
    if a.table:
        print(table(json.loads(a.table[0].read_text()), json.loads(a.table[1].read_text())))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, model, args in cases(work):
            if a.only and a.only not in name:
                continue
            row = measure(name, model, args, a.tree.resolve(), work)
            print(json.dumps(row), flush=True)
            rows.append(row)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
