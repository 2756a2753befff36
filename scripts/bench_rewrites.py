#!/usr/bin/env python3
"""Benchmark of `--rewrite` (issue #13 item 4): FP32 nodes and FP32 FLOP share with rewrites,
without them, with plain ddmin and with ModelOpt AutoCast; writes the measured table into
docs/rewrites.md.

Each model runs `trtbisect.pipeline.run` four times (rewrite off/on x semantics strict/trt) and
plain ddmin (no prior) on the same emulator under each semantics. Every case runs in its own
child process, one at a time, and is skipped after `--timeout` seconds (2 cores are shared).
Results accumulate in `--results` (JSON), so cases can be measured one at a time and the table
always shows every case measured so far.

    python scripts/bench_rewrites.py                 # demo, zoo, deep_24, cached real models
    python scripts/bench_rewrites.py --quick         # demo + zoo only
    python scripts/bench_rewrites.py --only ppocr_rec

Real models are every `.onnx` under `<cache>/models` (scripts/fetch_models.py's cache;
TRTBISECT_BENCH_CACHE overrides it), fed `<cache>/inputs/<name>.npz` when present, else the
seeded random inputs of its fetch_models spec (seed 0).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from trtbisect.context import Options, prepare  # noqa: E402
from trtbisect.graph import with_node_names  # noqa: E402
from trtbisect.judge import semantics  # noqa: E402
from trtbisect.judge.compare import Tolerance  # noqa: E402
from trtbisect.pipeline import _shape_probe, run  # noqa: E402
from trtbisect.result import RunResult  # noqa: E402
from trtbisect.search.cost import engine_pricing  # noqa: E402
from trtbisect.search.minimal import ddmin  # noqa: E402
from trtbisect.stages.evaluator import Evaluator  # noqa: E402

FLOP_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose")
SEMANTICS = ("strict", "trt")
MAX_EVALS = 300  # per search (pipeline and ddmin); "stopped" when hit
TIMEOUT_S = 600  # per case
# diagnosed culprit patterns a rewrite is meant to remove (the goal: zero FP32 nodes)
GOAL_PATTERNS = {"attention_mask": "mask", "layernorm_decomposed": "decomposed norm",
                 "rmsnorm_decomposed": "decomposed norm", "attention_logits": "pre-scale attention"}
DOC = ROOT / "docs" / "rewrites.md"
RESULTS = ROOT / "runs" / "bench_rewrites" / "results.json"
BEGIN, END = "<!-- bench_rewrites: begin -->", "<!-- bench_rewrites: end -->"


# ---------------------------------------------------------------- FLOPs

def flop_table(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, int | None]:
    """FLOPs (2 per multiply-add) of each MatMul/Gemm/Conv/ConvTranspose node, by node name,
    from ONNX shape inference with the feeds' concrete input shapes; None where a shape stays
    unknown."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for v in m.graph.input:
        if v.name in feeds:
            shape = v.type.tensor_type.shape
            shape.Clear()
            for n in np.shape(feeds[v.name]):
                shape.dim.add().dim_value = int(n)
    with contextlib.suppress(Exception):  # partial shapes are still useful
        m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    shapes = {t.name: list(t.dims) for t in m.graph.initializer}
    for v in [*m.graph.input, *m.graph.value_info, *m.graph.output]:
        dims = v.type.tensor_type.shape.dim
        if v.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            shapes[v.name] = [d.dim_value for d in dims]
    return {n.name: _node_flops(n, shapes) for n in m.graph.node if n.op_type in FLOP_OPS}


def _node_flops(node: onnx.NodeProto, shapes: Mapping[str, list[int]]) -> int | None:
    a, w, out = (shapes.get(t) for t in (node.input[0], node.input[1], node.output[0]))
    if a is None or w is None or out is None:
        return None
    if node.op_type == "MatMul":  # [..., M, K] x [..., K, N]: K is A's last axis
        return 2 * _prod(out) * a[-1]
    if node.op_type == "Gemm":
        trans_a = next((x.i for x in node.attribute if x.name == "transA"), 0)
        return 2 * _prod(out) * (a[0] if trans_a else a[-1])
    if node.op_type == "Conv":  # out = [N, Cout, *spatial]; w = [Cout, Cin/groups, *kernel]
        return 2 * _prod(out) * _prod(w[1:])
    return 2 * _prod(a) * _prod(w[1:])  # ConvTranspose: w = [Cin, Cout/groups, *kernel]


def _prod(dims: Sequence[int]) -> int:
    out = 1
    for d in dims:
        out *= int(d)
    return out


def flop_share(plan: Sequence[str], flops: Mapping[str, int | None], total: int) -> float | None:
    """The plan's share of the model's MatMul/Gemm/Conv FLOPs (None when nothing is known)."""
    return sum(flops.get(n) or 0 for n in plan) / total if total else None


# ---------------------------------------------------------------- cases

@dataclass
class Case:
    name: str
    source: str
    model: onnx.ModelProto  # nodes named as trtbisect names them
    inputs: dict[str, np.ndarray]
    inputs_note: str
    tolerance: Tolerance = field(default_factory=Tolerance)


def case_builders(quick: bool) -> dict[str, Callable[[], Case]]:
    """Every case by name, built only when measured (real models are loaded lazily)."""
    from tests.models.make_models import deep_model, zoo

    def demo() -> Case:
        with np.load(ROOT / "models" / "demo_inputs.npz") as d:
            feeds = {k: d[k] for k in d.files}
        return Case("demo", "models/demo.onnx", with_node_names(onnx.load(ROOT / "models" / "demo.onnx")),
                    feeds, "models/demo_inputs.npz")

    def zoo_case(name: str) -> Case:
        z = zoo()[name]
        return Case(f"zoo/{name}", "tests/models/make_models.py", with_node_names(z.model), z.inputs,
                    "the zoo's sample")

    def deep() -> Case:
        z = deep_model(blocks=24, overflow_blocks=(2, 11, 20))
        return Case("deep_24", "deep_model(24, (2, 11, 20))", with_node_names(z.model), z.inputs,
                    "the zoo's sample")

    out: dict[str, Callable[[], Case]] = {"demo": demo}
    for name in zoo():
        out[f"zoo/{name}"] = lambda name=name: zoo_case(name)
    if not quick:
        out["deep_24"] = deep
        for path in sorted((cache_root() / "models").glob("*.onnx")):
            out[path.stem] = lambda path=path: real_case(path)
    return out


def cache_root() -> Path:
    from fetch_models import cache_root as root

    return root()


def real_case(path: Path) -> Case:
    """A cached real model with its cached inputs, else its spec's seeded random inputs."""
    from fetch_models import MODELS

    cached = cache_root() / "inputs" / f"{path.stem}.npz"
    if cached.is_file():
        with np.load(cached) as d:
            feeds, note = {k: d[k] for k in d.files}, f"cached {cached.name}"
    elif path.stem in MODELS:
        feeds, note = MODELS[path.stem].make_inputs(seed=0), "seeded random (fetch_models spec, seed 0)"
    else:
        raise SystemExit(f"{path.stem}: no cached inputs and no fetch_models spec")
    spec = MODELS.get(path.stem)
    source = f"{spec.package}=={spec.version}" if spec else str(path)
    return Case(path.stem, source, with_node_names(onnx.load(str(path))), feeds, note)


# ---------------------------------------------------------------- measuring

def measure(case: Case, workdir: Path, max_evals: int = MAX_EVALS,
            on_step: Callable[[dict], None] | None = None) -> dict:
    """Every method on one case: pipeline runs (rewrite off/on) and ddmin, per semantics;
    `on_step(record)` after each, so a case killed at its time limit keeps what it measured."""
    step = on_step or (lambda _rec: None)
    workdir.mkdir(parents=True, exist_ok=True)
    path, npz = workdir / "model.onnx", workdir / "inputs.npz"
    onnx.save(case.model, path)
    np.savez(npz, **case.inputs)
    flops = flop_table(case.model, case.inputs)
    unknown = sorted(n for n, f in flops.items() if f is None)
    if unknown:  # dims shape inference cannot see: one FP32 inference's (scripts/bench.py)
        from bench import node_flops

        probed = node_flops(case.model, case.inputs)
        flops.update({n: int(probed[n]) for n in unknown if n in probed})
    total = sum(f or 0 for f in flops.values())
    rec: dict = {"flop_from_inference": len(unknown), "model": case.name, "source": case.source, "inputs": case.inputs_note,
                 "nodes": len(case.model.graph.node), "gflop": total / 1e9,
                 "flop_unknown": sorted(n for n, f in flops.items() if f is None),
                 "rtol": case.tolerance.rtol, "date": datetime.date.today().isoformat(), "runs": {}}
    for sem in SEMANTICS:
        opts = Options.of(inputs=[str(npz)], tolerance=case.tolerance, semantics=sem,
                          max_evaluations=max_evals, resume=False)
        for rewrite in (False, True):
            out = workdir / f"{sem}-{'rewrite' if rewrite else 'plain'}"
            result = run(path, opts.but(rewrite=rewrite), out)
            known = flops
            if "rewritten_model" in result.files:  # a node a rewrite added counts too
                rewritten = onnx.load(result.files["rewritten_model"])
                known = {**flop_table(rewritten, case.inputs), **flops}
            rec["runs"][f"{sem}/{'rewrite' if rewrite else 'plain'}"] = summarize(result, known, total)
            step(rec)
        if rec["runs"][f"{sem}/plain"]["verdict"] == "reference_invalid":
            rec["runs"][f"{sem}/ddmin"] = {**rec["runs"][f"{sem}/plain"], "evaluations": 0,
                                            "seconds": 0.0}
        else:
            rec["runs"][f"{sem}/ddmin"] = run_ddmin(path, opts, flops, total, max_evals)
        step(rec)
    return rec


def summarize(r: RunResult, flops: Mapping[str, int | None], total: int) -> dict:
    rewrites = r.rewrites  # rewrites/driver.RewritesRecord
    applied = rewrites.applied if rewrites is not None else []
    drift = [a.drift.rel for a in applied]
    groups = r.culprit_groups or []
    return {
        "verdict": r.verdict, "fp32_nodes": len(r.fp32_nodes), "plan": list(r.fp32_nodes),
        "flop_share": flop_share(r.fp32_nodes, flops, total), "evaluations": r.evaluations,
        "slowdown": r.cost.slowdown if r.cost else None,  # estimated (docs/cost.md)
        "seconds": round(r.seconds, 2),
        "stopped": bool(r.search is not None and r.search.stopped_early),
        "rewrites": [a.rewrite for a in applied],
        "drift": max(drift) if drift else None,
        "refused": [x.to_json() for x in (rewrites.refused if rewrites is not None else [])],
        "patterns": sorted({g.pattern for g in groups if g.pattern}),
    }


def run_ddmin(path: Path, opts: Options, flops: Mapping[str, int | None], total: int,
              max_evals: int) -> dict:
    """Plain ddmin (no prior) on the pipeline's own emulator and criterion, over the same
    units the pipeline searches (TensorRT-fused layers under trt, nodes under strict)."""
    started = time.perf_counter()
    ctx = prepare(path, opts)
    ev = Evaluator(ctx, opts.judge, {}, None)
    assert ctx.prepared is not None
    units = semantics.units(ctx.prepared, ctx.judged.candidates())
    ev.emulator.ensure(ctx.judged.candidates())  # ddmin's second plan is all-FP32

    def nodes(chosen) -> frozenset[str]:
        return frozenset(n for u in chosen for n in units[u])

    s = ddmin(list(units), lambda us: ev.check(nodes(us)), max_evaluations=max_evals)
    ev.emulator.close()
    plan = sorted(nodes(s.fp32)) if s.found else []
    verdict = "no_plan" if not s.found else ("fixed" if plan else "fp16_ok")
    pricing = engine_pricing(ctx.graph, ctx.judged, ctx.prepared, units, ctx.samples[0],
                             opts.search.gpu, opts.judge.tf32,
                             lambda pg: _shape_probe(ctx, opts.judge, pg))
    return {"verdict": verdict, "fp32_nodes": len(plan), "plan": plan,
            "slowdown": pricing.slowdown(s.fp32) if s.found else None,
            "flop_share": flop_share(plan, flops, total), "evaluations": s.evaluations,
            "seconds": round(time.perf_counter() - started, 2), "stopped": s.stopped_early}


def measure_autocast(case: Case, workdir: Path) -> dict | None:
    """ModelOpt AutoCast through scripts/bench.py's harness, when modelopt imports."""
    try:
        import modelopt.onnx.autocast  # noqa: F401
    except Exception:
        return None
    import bench

    (workdir / "autocast").mkdir(parents=True, exist_ok=True)  # Bench saves the model there
    b = bench.Bench(bench.Case(case.name, "rw", case.source, case.model, case.inputs,
                               case.tolerance), workdir / "autocast")
    row = bench.run_method(b, "autocast", bench.Budget(0, 600.0))
    return {"fp32_nodes": row.fp32_nodes, "flop_share": row.flop_share, "check": row.check,
            "source": "measured"}


def autocast_from_benchmarks(text: str) -> dict[str, dict]:
    """AutoCast's rows of docs/benchmarks.md's details table (an earlier, recorded run)."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 8 and cells[1] == "AutoCast" and cells[2] == "ok":
            share = cells[6].rstrip("%")
            out[cells[0]] = {"fp32_nodes": int(cells[5]) if cells[5].isdigit() else None,
                             "flop_share": float(share) / 100 if _is_num(share) else None,
                             "check": cells[7].startswith("pass"),
                             "source": "docs/benchmarks.md"}
    return out


def _is_num(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------- rendering

def _pct(x: float | None) -> str:
    return "?" if x is None else f"{100 * x:.1f}%"


def _cell(r: Mapping | None) -> str:
    if r is None:
        return "–"
    if r.get("error"):
        return "error"
    if r["verdict"] == "no_plan":
        text = "no plan"
    elif r["verdict"] == "reference_invalid":
        return "refused: FP32 reference not finite"
    else:
        slow = r.get("slowdown")
        text = f"{r['fp32_nodes']} ({_pct(r['flop_share'])}" + (
            f", {100 * slow:+.1f}% time)" if slow is not None else ")")
    return text + (", stopped" if r.get("stopped") else "")


def _autocast_cell(a: Mapping | None) -> str:
    if a is None:
        return "–"
    mark = "✓" if a["check"] else "**✗**"
    star = "" if a["source"] == "measured" else "†"
    return f"{a['fp32_nodes']} ({_pct(a['flop_share'])}) {mark}{star}"


def _drift(x) -> str:
    return "–" if x is None else (f"{float(x):.1e}" if _is_num(str(x)) else str(x))


def _rewrite_names(names: Sequence[str]) -> str:
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    return ", ".join(f"{n} ×{c}" if c > 1 else n for n, c in counts.items()) or "none"


def table(records: Sequence[dict], autocast: Mapping[str, dict]) -> list[str]:
    head = ["model", "semantics", "culprit patterns (without)",
            "FP32 nodes (FLOPs, estimated slowdown) without",
            "with rewrites", "rewrites kept", "FP32 drift", "plain ddmin", "AutoCast",
            "evaluations without / with / ddmin", "seconds without / with / ddmin"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rec in records:
        if rec.get("skipped"):
            lines.append(f"| {rec['model']} | – | – | {rec['skipped']} |" + " – |" * (len(head) - 4))
            continue
        for sem in SEMANTICS:
            p, w, d = (rec["runs"].get(f"{sem}/{k}") or {} for k in ("plain", "rewrite", "ddmin"))
            ac = rec.get("autocast") or autocast.get(rec["model"])
            cut = f"not reached ({rec['killed']})" if rec.get("killed") else "–"
            lines.append("| " + " | ".join([
                rec["model"], sem, ", ".join(p.get("patterns", ())) or "–", _cell(p) if p else cut,
                _cell(w) if w else cut, _rewrite_names(w.get("rewrites", ())) if w else "–",
                _drift(w.get("drift")), _cell(d) if d else cut, _autocast_cell(ac),
                " / ".join(str(x.get("evaluations", "–")) for x in (p, w, d)),
                " / ".join(f"{x['seconds']:.1f}" if "seconds" in x else "–" for x in (p, w, d))])
                + " |")
    return lines


def verdicts(records: Sequence[dict]) -> list[str]:
    """One sentence per case whose culprits are masks, decomposed norms or pre-scale attention."""
    out = []
    for rec in records:
        if rec.get("skipped"):
            continue
        runs = rec["runs"]
        kinds = sorted({GOAL_PATTERNS[p] for sem in SEMANTICS
                        for p in (runs.get(f"{sem}/plain") or {}).get("patterns", ())
                        if p in GOAL_PATTERNS})
        if not kinds:
            continue
        parts = []
        for sem in SEMANTICS:
            w, p = runs.get(f"{sem}/rewrite"), runs.get(f"{sem}/plain")
            if w is None or p is None:
                parts.append(f"{sem}: not measured ({rec.get('killed', 'missing')})")
                continue
            kept = _rewrite_names(w["rewrites"])
            if p["verdict"] == "fp16_ok":
                parts.append(f"{sem}: already 0 FP32 nodes without rewrites")
            elif w["verdict"] in ("fixed", "fp16_ok") and w["fp32_nodes"] == 0:
                parts.append(f"{sem}: 0 FP32 nodes ({kept})")
            else:
                left = ", ".join(w["patterns"]) or "no named pattern"
                refused = "; ".join(_refusals_at(w))
                parts.append(f"{sem}: {w['fp32_nodes']} FP32 node(s) left after {kept} "
                             f"(left: {left}{'; refused there: ' + refused if refused else ''})")
        reached = all(f"{sem}/rewrite" in runs and runs[f"{sem}/rewrite"]["fp32_nodes"] == 0
                      and runs[f"{sem}/rewrite"]["verdict"] in ("fixed", "fp16_ok")
                      for sem in SEMANTICS)
        head = "reaches zero FP32 nodes" if reached else "does **not** reach zero FP32 nodes"
        out.append(f"- **{rec['model']}** ({', '.join(kinds)}): {head}. " + "; ".join(parts) + ".")
    return out


def _refusals_at(run: Mapping, limit: int = 3) -> list[str]:
    """The refusals of rewrites on the nodes the plan still keeps in FP32: why they stay."""
    left, seen = set(run["plan"]), {}
    for x in run["refused"]:
        if left & set(x.get("where", ())):
            seen.setdefault(x["rewrite"], f"{x['rewrite']} at {x['where'][0]}: {x['reason']}")
    return list(seen.values())[:limit]


def _probed(records: Sequence[dict]) -> str:
    probed = [f"{r['model']}: {r['flop_from_inference']}" for r in records
              if r.get("flop_from_inference")]
    if not probed:
        return ""
    return ("; where inference leaves a shape symbolic, from the shapes of one FP32 inference "
            f"({', '.join(probed)} nodes)")


def section(records: Sequence[dict], autocast: Mapping[str, dict], meta: Mapping) -> str:
    dates = sorted({r["date"] for r in records if r.get("date")})
    lines = [
        BEGIN,
        "## Measured (CPU emulator, default tolerance)",
        "",
        f"Generated by `python scripts/bench_rewrites.py` on {', '.join(dates)}. "
        f"Machine: {meta['machine']}, shared with other jobs (wall times are indicative). "
        "Versions: "
        + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + ".",
        "",
        "Per model and semantics (docs/semantics.md): `trtbisect.pipeline.run` without and with "
        "`rewrite=True`, and plain ddmin (`trtbisect.search.minimal.ddmin`, no prior, the pipeline's own "
        "`Evaluator` and units) on the model as given. **FP32 nodes** counts the plan's nodes; "
        "**FLOPs** is their share of the model's MatMul/Gemm/Conv FLOPs (2 per multiply-add, "
        "from ONNX shape inference at the samples' input shapes" + _probed(records)
        + "). Each search is capped at "
        f"{MAX_EVALS} evaluations (\"stopped\" when hit). **FP32 drift** is the worst kept "
        "rewrite's FP32 output change, max|d| / max|ref|. Evaluations count every judged plan, "
        "each rewrite's judgement included; seconds are the whole run (reference, layer-wise "
        "pass, rewrites, search, check, files).",
        "",
        *table(records, autocast),
        "",
    ]
    if any(not (r.get("autocast") or {}).get("source") == "measured" for r in records):
        lines += [
            "† AutoCast is not measured here: `modelopt` does not import in this environment. "
            "Its numbers are copied from docs/benchmarks.md (its 2026-11-22 run, nvidia-modelopt "
            "0.47.0, default rules, its mixed model judged by `trtbisect check` under the default "
            "`trt` semantics), the same for both rows of a model; – where that run has no "
            "AutoCast row for the model.",
            "",
        ]
    goal = verdicts(records)
    if goal:
        lines += ["Cases whose diagnosed culprits are masks, decomposed norms or pre-scale "
                  "attention (the goal is zero FP32 nodes):", "", *goal, ""]
    lines.append(END)
    return "\n".join(lines)


MEASURED_HEADING = re.compile(r"^## Measured\b.*?(?=^## )", re.S | re.M)


def write_doc(doc: Path, text: str) -> None:
    """Replace the measured-results section (between the markers, or the first `## Measured`
    section up to the next heading), keeping the rest of the page."""
    old = doc.read_text(encoding="utf-8")
    if BEGIN in old and END in old:
        start, stop = old.index(BEGIN), old.index(END) + len(END)
        new = old[:start] + text + old[stop:]
    elif MEASURED_HEADING.search(old):
        new = MEASURED_HEADING.sub(lambda _: text + "\n\n", old, count=1)
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    doc.write_text(new, encoding="utf-8")


def versions() -> dict[str, str]:
    import platform

    out = {"python": platform.python_version()}
    for dist in ("onnx", "onnxruntime", "numpy"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[dist] = metadata.version(dist)
    from trtbisect import __version__

    out["trtbisect"] = __version__
    return out


def machine() -> str:
    import platform

    cpu = platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


# ---------------------------------------------------------------- driver

def run_case(name: str, build: Callable[[], Case], workdir: Path, timeout: float,
             max_evals: int, part: Path | None = None) -> dict:
    """One case in a child process (killed after `timeout` s, keeping the methods it finished),
    or in this one for timeout <= 0 (then `part` receives the record after every method)."""
    if timeout <= 0:
        def save(rec: dict) -> None:
            if part is not None:
                tmp = part.with_suffix(".tmp")
                tmp.write_text(json.dumps(rec), encoding="utf-8")
                os.replace(tmp, part)

        case = build()
        rec = measure(case, workdir, max_evals, save)
        rec["autocast"] = measure_autocast(case, workdir)
        save(rec)
        return rec
    part = workdir.with_suffix(".json")
    part.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--child", name, "--child-out", str(part),
           "--max-evals", str(max_evals)]
    started = time.perf_counter()
    try:
        subprocess.run(cmd, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:  # subprocess.run kills its own child
        if not part.is_file():
            return {"model": name, "skipped": f"skipped after {timeout:.0f} s"}
        rec = json.loads(part.read_text(encoding="utf-8"))
        rec["killed"] = f"stopped at the {timeout:.0f} s limit"
        return rec
    if not part.is_file():
        return {"model": name, "skipped": f"failed after {time.perf_counter() - started:.0f} s"}
    return json.loads(part.read_text(encoding="utf-8"))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="demo + zoo only")
    ap.add_argument("--only", help="one case by name (e.g. zoo/attention_logits, ppocr_rec)")
    ap.add_argument("--max-evals", type=int, default=MAX_EVALS)
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S,
                    help="seconds per case before it is skipped; <= 0: run in this process")
    ap.add_argument("--results", type=Path, default=RESULTS, help="accumulated results (JSON)")
    ap.add_argument("--doc", type=Path, default=DOC, help="the page whose table is replaced")
    ap.add_argument("--benchmarks", type=Path, default=ROOT / "docs" / "benchmarks.md",
                    help="where AutoCast's recorded numbers come from")
    ap.add_argument("--render-only", action="store_true", help="rewrite the table from --results")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    import logging
    import warnings

    logging.basicConfig(level=logging.ERROR)
    warnings.simplefilter("ignore")
    builders = case_builders(args.quick and not args.child)
    if args.child:
        build = builders.get(args.child) or case_builders(False)[args.child]
        run_case(args.child, build, args.child_out.with_suffix(""), 0, args.max_evals,
                 args.child_out)
        return 0
    order = list(builders)
    if args.only:
        if args.only not in builders:
            builders = case_builders(False)
        if args.only not in builders:
            ap.error(f"--only {args.only}: not one of {', '.join(builders)}")
        builders = {args.only: builders[args.only]}
    stored = json.loads(args.results.read_text()) if args.results.is_file() else {"cases": {}}
    if not args.render_only:
        for name, build in builders.items():
            print(f"{name} ...", file=sys.stderr, flush=True)
            workdir = Path(tempfile.gettempdir()) / "bench_rewrites" / name.replace("/", "_")
            stored["cases"][name] = run_case(name, build, workdir, args.timeout, args.max_evals)
        stored["meta"] = {"machine": machine(), "versions": versions()}
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(stored, indent=1), encoding="utf-8")
    full = list(case_builders(False))
    rank = {n: i for i, n in enumerate(order + [n for n in full if n not in order])}
    records = sorted(stored["cases"].values(), key=lambda r: rank.get(r["model"], len(rank)))
    bench_text = args.benchmarks.read_text(encoding="utf-8") if args.benchmarks.is_file() else ""
    write_doc(args.doc, section(records, autocast_from_benchmarks(bench_text), stored["meta"]))
    print(f"wrote {args.doc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
