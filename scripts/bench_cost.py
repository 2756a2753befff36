#!/usr/bin/env python3
"""What each search's plan costs in estimated engine time (issue #21): cost-aware search
against count-only, plain ddmin and ModelOpt AutoCast; writes a section of
docs/search_benchmark.md.

Per model, on the same emulator, criterion and samples, priced by the same cost model
(trtbisect/search/cost.py, `--gpu l4`, docs/cost.md):

* *cost*: `trtbisect run` (the default `--objective cost`);
* *count*: `trtbisect run --objective count` (the earlier, count-minimal search);
* *ddmin*: plain ddmin (no prior) over the same units with the pipeline's evaluator;
* *AutoCast, plan*: ModelOpt AutoCast told to keep the cost plan's nodes in FP32
  (`nodes_to_exclude`, `data_max=inf`, `init_max=inf`), given what the plan's rendering gives
  it (under trt the graph TensorRT builds, `*.autocast_input.onnx`): its file judged by
  `check_mixed` against the model as given;
* *AutoCast, rules*: AutoCast with its own default rules (`data_max=512`), no FP16 check;
  its FP32 nodes priced (a unit with any FP32 node counts FP32) and its file judged.

Each cell: FP32 units (nodes), estimated slowdown against all-FP16, FP32 share of FLOPs,
evaluations, whether the written file passes. The models run one at a time in child
processes (2 shared cores), each skipped after `--timeout` seconds.

    python scripts/bench_cost.py                        # demo, zoo, deep_24, transformers, cache
    python scripts/bench_cost.py --only demo --only zoo/ --out /tmp/cost.md
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from doc_section import replace_section  # noqa: E402

from trtbisect.context import Options, prepare  # noqa: E402
from trtbisect.graph import with_node_names  # noqa: E402
from trtbisect.judge import semantics  # noqa: E402
from trtbisect.pipeline import _shape_probe, check_mixed, run  # noqa: E402
from trtbisect.search.cost import engine_pricing  # noqa: E402
from trtbisect.search.minimal import ddmin  # noqa: E402
from trtbisect.stages.evaluator import Evaluator  # noqa: E402

DOC = ROOT / "docs" / "search_benchmark.md"
BEGIN, END = "<!-- bench_cost: begin -->", "<!-- bench_cost: end -->"
MAX_EVALS = 300
METHODS = ("cost", "count", "ddmin", "autocast_plan", "autocast_rules")


# ---------------------------------------------------------------- cases

def cases(want: Callable[[str], bool]) -> Iterator[tuple[str, Callable[[], tuple]]]:
    """(name, build) -> (model, inputs, note); built only when measured."""
    from bench_models import synthetic_transformer

    from tests.models.make_models import deep_model, zoo

    def demo():
        with np.load(ROOT / "models" / "demo_inputs.npz") as d:
            return onnx.load(ROOT / "models" / "demo.onnx"), {k: d[k] for k in d.files}, ""

    if want("demo"):
        yield "demo", demo
    for name, z in zoo().items():
        if z.expected_verdict == "fixed" and want(f"zoo/{name}"):
            yield f"zoo/{name}", (lambda z=z: (z.model, z.inputs, ""))
    if want("deep_24"):
        yield "deep_24", lambda: (lambda z: (z.model, z.inputs, ""))(
            deep_model(blocks=24, overflow_blocks=(2, 11, 20)))
    for n, faults in ((1300, 1), (1300, 2)):
        label = f"transformer_{n}_{faults}fault"
        if want(label):
            yield label, (lambda n=n, f=faults: (lambda m: (m.model, m.inputs, ""))(
                synthetic_transformer(n, faults=f)))
    from fetch_models import MODELS, cache_root

    models = cache_root() / "models"
    for path in sorted(models.glob("*.onnx")) if models.is_dir() else []:
        if not want(path.stem):
            continue
        cached = cache_root() / "inputs" / f"{path.stem}.npz"

        def real(path=path, cached=cached):
            if cached.is_file():
                with np.load(cached) as d:
                    feeds = {k: d[k] for k in d.files}
            else:
                feeds = MODELS[path.stem].make_inputs(seed=0)
            return onnx.load(str(path)), feeds, ""
        if cached.is_file() or path.stem in MODELS:
            yield path.stem, real


# ---------------------------------------------------------------- measuring (child)

def measure(name: str, build: Callable[[], tuple], work: Path, sem: str = "trt") -> dict:
    model, feeds, note = build()
    work.mkdir(parents=True, exist_ok=True)
    path, npz = work / "model.onnx", work / "inputs.npz"
    onnx.save(with_node_names(model), path)
    np.savez(npz, **feeds)
    opts = Options.of(inputs=[str(npz)], max_evaluations=MAX_EVALS, resume=False, semantics=sem)
    ctx = prepare(path, opts)
    g = ctx.judged
    units = semantics.units(ctx.prepared, g.candidates())
    unit_of = {n: u for u, ns in units.items() for n in ns}
    pricing = engine_pricing(ctx.graph, g, ctx.prepared, units, ctx.samples[0], opts.search.gpu,
                             opts.judge.tf32, lambda pg: _shape_probe(ctx, opts.judge, pg))
    rec = {"model": name, "semantics": sem, "nodes": len(ctx.graph.names), "candidates": len(g.candidates()),
           "units": len(units), "gflop": sum(c.flops for c in pricing.engine.cost.values()) / 1e9,
           "all_fp16_us": 1e6 * pricing.fp16_s, "all_fp32_us": 1e6 * pricing.fp32_s,
           "date": datetime.date.today().isoformat(), "note": note, "methods": {}}

    def priced(plan_units, **extra) -> dict:
        s = pricing.summary(plan_units)
        return {"units": len(set(plan_units)), "nodes": sum(len(units[u]) for u in set(plan_units)),
                "slowdown": s["slowdown"], "flop_share": s["fp32_flop_share"],
                "byte_share": s["fp32_byte_share"], **extra}

    cost_plan: list[str] = []
    autocast_input = path  # what the cost run's AutoCast rendering converts
    for objective in ("cost", "count"):
        t = time.perf_counter()
        r = run(path, Options.of(inputs=[str(npz)], objective=objective, semantics=sem,
                                 max_evaluations=MAX_EVALS, resume=False), work / objective)
        layers = list(r.fp32_layers or [])
        if objective == "cost":
            cost_plan = list(r.fp32_nodes)
            autocast_input = Path(r.files.get("autocast_input", path))
        rec["methods"][objective] = priced(
            layers, verdict=r.verdict, evaluations=r.evaluations,
            passes=r.mixed_model_passed if r.mixed_model_passed is not None else r.verdict == "fp16_ok",
            stopped=bool(r.search is not None and r.search.stopped_early),
            seconds=round(time.perf_counter() - t, 2))
        yield_rec(rec)
    t = time.perf_counter()
    ev = Evaluator(ctx, opts.judge, {}, None)
    ev.emulator.ensure(g.candidates())
    s = ddmin(list(units), lambda us: ev.check(frozenset(n for u in us for n in units[u])),
              max_evaluations=MAX_EVALS)
    ev.close()
    rec["methods"]["ddmin"] = priced(s.fp32 if s.found else [], evaluations=s.evaluations,
                                     passes=s.found, stopped=s.stopped_early,
                                     seconds=round(time.perf_counter() - t, 2))
    yield_rec(rec)
    for label, kw in (("autocast_plan", {"plan": cost_plan, "given": autocast_input}),
                      ("autocast_rules", {})):
        rec["methods"][label] = autocast(path, npz, ctx, unit_of, priced, sem, **kw)
        yield_rec(rec)
    return rec


def autocast(path: Path, npz: Path, ctx, unit_of: dict, priced, sem: str, plan=None,
             given: Path | None = None) -> dict:
    """AutoCast on `given` (the plan's rendering converts the graph TensorRT builds, under trt)
    or on the model; its file judged against the model as given."""
    try:
        from modelopt.onnx.autocast import configure_logging, convert_to_mixed_precision
    except Exception as exc:  # optional: docs/rivals.md says how it installs
        return {"error": f"not installed ({type(exc).__name__})"}
    from bench import fp32_of_artifact

    t = time.perf_counter()
    configure_logging("ERROR")
    kw = {}
    if plan is not None:
        import re
        kw = {"nodes_to_exclude": [f"^{re.escape(n)}$" for n in plan],
              "data_max": float("inf"), "init_max": float("inf")}
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = convert_to_mixed_precision(str(given or path), low_precision_type="fp16",
                                             keep_io_types=True, calibration_data=str(npz),
                                             providers=["cpu"], **kw)
    except Exception as exc:
        words = (str(exc).splitlines() or [""])[0][:120]
        if words.isdigit():  # a KeyError of an object's id: different on every run
            words = "an object id"
        return {"error": f"{type(exc).__name__}: {words}"}
    mixed = path.parent / f"autocast_{'plan' if plan is not None else 'rules'}.onnx"
    onnx.save(out, mixed)
    source = ctx.judged if given not in (None, path) else ctx.graph  # whose names it carries
    fp32 = fp32_of_artifact(onnx.load(str(given or path)), out, source.candidates())
    plan_units = sorted({unit_of[n] for n in fp32 if n in unit_of})
    try:
        passes = check_mixed(mixed, path, Options.of(inputs=[str(npz)], semantics=sem)).passed
    except Exception as exc:
        passes = f"not judged: {type(exc).__name__}"
    return priced(plan_units, evaluations=0, passes=passes, fp32_nodes=len(fp32),
                  seconds=round(time.perf_counter() - t, 2))


def yield_rec(rec: dict) -> None:
    """The record so far on stdout: the parent keeps the last, even after a timeout."""
    print("REC " + json.dumps(rec), flush=True)


# ---------------------------------------------------------------- rendering

def _cell(m: dict | None) -> str:
    if not m:
        return "-"
    if "error" in m:
        return m["error"]
    passes = m.get("passes")
    ok = "✓" if passes is True else "**✗**" if passes is False else str(passes)
    ev = f", {m['evaluations']} ev" + (" (stopped)" if m.get("stopped") else "") \
        if m.get("evaluations") else ""
    return (f"{m['units']} ({m['nodes']}), {100 * m['slowdown']:+.2f}%, "
            f"{100 * m['flop_share']:.1f}% FLOPs{ev}, {ok}")


def render(records: list[dict]) -> str:
    lines = [BEGIN, "", "## What each plan costs: cost-aware against count, ddmin and AutoCast",
             "",
             "Measured by `python scripts/bench_cost.py` (issue #21). Every plan is priced by the "
             "same cost model (docs/cost.md: a roofline per TensorRT layer and a Cast per "
             "boundary, on the default `--gpu l4`); *not checked against real timings* (no GPU "
             "here). Each model under `--semantics trt` (units: predicted TensorRT layers) and, "
             "where marked *strict*, per-node rounding (units: nodes); rtol 1e-2, the model's "
             "bundled or seeded sample. Each cell: FP32 units (nodes), estimated slowdown against all-FP16, the "
             "FP32 share of FLOPs, evaluations, whether the written file passes `check`. "
             "*cost*: `trtbisect run` (default `--objective cost`); *count*: `--objective "
             "count` (the earlier search); *ddmin*: plain ddmin over the same units on the "
             "same evaluator; *AutoCast, plan*: ModelOpt AutoCast 0.47.0 told to keep the "
             "cost plan's nodes FP32; *AutoCast, rules*: its own default rules (data_max 512), "
             f"no FP16 check. Searches capped at {MAX_EVALS} evaluations.", "",
             "| model | nodes / units | all-FP16 | cost | count | ddmin | AutoCast, plan "
             "| AutoCast, rules |", "|---|---|---|---|---|---|---|---|"]
    for r in records:
        if "error" in r and not r.get("methods"):
            lines.append(f"| {r['model']} | error: {r['error']} |" + " |" * 6)
            continue
        m = r["methods"]
        label = r["model"] + (" (strict)" if r.get("semantics") == "strict" else "")
        lines.append(f"| {label} | {r['nodes']} / {r['units']} | {r['all_fp16_us']:.3g} us "
                     + "".join(f"| {_cell(m.get(k))} " for k in METHODS) + "|")
    lines += ["", *summary(records), "", END]
    return "\n".join(lines) + "\n"


def summary(records: list[dict]) -> list[str]:
    """The issue's checks, counted over the models."""
    both = [r for r in records if {"cost", "ddmin", "count"} <= set(r.get("methods", {}))]
    cheaper = [r["model"] + (" (strict)" if r.get("semantics") == "strict" else "")
               for r in both if r["methods"]["cost"]["slowdown"]
               > r["methods"]["ddmin"]["slowdown"] + 1e-12 and r["methods"]["ddmin"]["passes"]]
    ratio = [(r["model"] + (" (strict)" if r.get("semantics") == "strict" else ""),
              r["methods"]["cost"]["evaluations"] / r["methods"]["count"]["evaluations"])
             for r in both if r["methods"]["count"]["evaluations"]]
    over = [f"{m} ({x:.2f}x)" for m, x in ratio if x > 1.5]
    worst = max(ratio, key=lambda p: p[1]) if ratio else None
    out = [f"- **Cost against ddmin**: the cost plan's estimated slowdown is at most ddmin's on "
           f"{len(both) - len(cheaper)} of {len(both)} runs (model x semantics)"
           + (f"; above it on {', '.join(cheaper)}." if cheaper else ".")]
    if worst:
        out.append(f"- **Evaluations against the count search**: at most 1.5x on "
                   f"{len(ratio) - len(over)} of {len(ratio)} runs (largest: {worst[0]}, "
                   f"{worst[1]:.2f}x)" + (f"; over 1.5x on {', '.join(over)}." if over else "."))
    return out


def write_doc(text: str, doc: Path) -> None:
    replace_section(doc, text, BEGIN, END)


# ---------------------------------------------------------------- driver

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], help="model name prefix (repeatable)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per model")
    ap.add_argument("--semantics", action="append", choices=["trt", "strict"], default=[],
                    help="repeatable; default: trt and strict")
    ap.add_argument("--results", default=str(ROOT / "runs" / "bench_cost" / "results.json"))
    ap.add_argument("--out", default=str(DOC))
    ap.add_argument("--render-only", action="store_true", help="only rewrite the doc from --results")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()

    def want(name: str) -> bool:
        return not args.only or any(name.startswith(o) for o in args.only)

    if args.child:
        name, _, sem = args.child.partition("@")
        build = dict(cases(lambda n: n == name))[name]
        with tempfile.TemporaryDirectory() as tmp:
            yield_rec(measure(name, build, Path(tmp), sem or "trt"))
        return
    results = Path(args.results)
    saved = json.loads(results.read_text()) if results.exists() else {}
    if not args.render_only:
        todo = [(n, sem) for n, _ in cases(want) for sem in args.semantics or ["trt", "strict"]]
        for name, sem in todo:
            key = name if sem == "trt" else f"{name}@{sem}"
            print(f"[bench_cost] {key} ...", file=sys.stderr, flush=True)
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            try:
                proc = subprocess.run([sys.executable, __file__, "--child", key],
                                      capture_output=True, text=True, timeout=args.timeout, env=env)
                out, tail = proc.stdout, (proc.stderr.strip().splitlines() or [""])[-1]
            except subprocess.TimeoutExpired as exc:
                out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
                tail = f"timed out after {args.timeout} s"
            recs = [ln[4:] for ln in out.splitlines() if ln.startswith("REC ")]
            saved[key] = json.loads(recs[-1]) if recs else {"model": name, "semantics": sem,
                                                             "error": tail[:160]}
            print(f"[bench_cost]   {json.dumps(saved[key])[:400]}", file=sys.stderr, flush=True)
            results.parent.mkdir(parents=True, exist_ok=True)
            results.write_text(json.dumps(saved, indent=1))
    order = {n: i for i, (n, _) in enumerate(cases(lambda n: True))}
    text = render(sorted(saved.values(), key=lambda r: (order.get(r["model"], len(order)),
                                                       r.get("semantics") == "strict")))
    write_doc(text, Path(args.out))
    print(text)


if __name__ == "__main__":
    main()
