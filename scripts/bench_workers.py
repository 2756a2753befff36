#!/usr/bin/env python3
"""Evaluations on worker processes, measured (issue #23).

Writes the section between the `bench_workers` markers of docs/search_benchmark.md
(scripts/bench_search.py keeps it when it rewrites the page).

For each benchmark model: `trtbisect run` in a child process with `--workers 1` and
`--workers 2` (wall time, the search stage's time, their ratio inside this one run; the
run's peak RSS and each worker's), whether the plan, evaluations and trace agree, and the
search's critical path in rounds against its evaluations. Then a simulation of a TensorRT
search on 8 GPUs: the same run with an in-process pool 8 wide (parallel/pool.InlinePool:
rounds as 8 workers run them), each evaluation priced as one engine build of `--build-min`
minutes: sequential = evaluations x build, 8 GPUs = rounds x build.

Models: synthetic transformers of about 5k and 20k nodes (scripts/bench_models.py, two planted
LayerNorm overflows), PP-OCRv4 det (scripts/fetch_models.py, random input), and a 200-sample
run (the 12-block `deep_model` of the test zoo on 200 seeded random samples).

    python scripts/bench_workers.py                       # about 8 min on 2 shared cores
    python scripts/bench_workers.py --only transformer_5000 --no-doc
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
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

DOC = ROOT / "docs" / "search_benchmark.md"
BEGIN, END = "<!-- bench_workers: begin -->", "<!-- bench_workers: end -->"
SIM_WIDTH = 8
from doc_section import replace_section  # noqa: E402


@dataclass
class Case:
    name: str
    model: str
    args: list[str]  # --inputs or --samples
    nodes: int
    samples: int


@dataclass
class Run:
    workers: int  # 1, 2; SIM_WIDTH for the simulation
    wall_s: float = 0.0
    search_s: float = 0.0
    rss_mib: float = 0.0  # the run's largest process's peak RSS (GNU time's %M)
    worker_rss_mib: list[float] = field(default_factory=list)
    evaluations: int = 0
    rounds: int = 0
    speculative: int = 0
    verdict: str = ""
    fp32: list[str] = field(default_factory=list)
    trials: list = field(default_factory=list)
    error: str = ""


def cases(work: Path, want) -> list[Case | str]:
    import numpy as np
    import onnx
    from bench_models import synthetic_transformer

    from tests.models.make_models import deep_model

    out: list[Case | str] = []
    for n in (5000, 20000):
        name = f"transformer_{n}"
        if want(name):
            m = synthetic_transformer(n, faults=2)
            path = work / f"{name}.onnx"
            onnx.save(m.model, path)
            np.savez(work / f"{name}.npz", **m.inputs)
            out.append(Case(name, str(path), ["--inputs", str(work / f"{name}.npz")],
                            len(m.model.graph.node), 1))
    if want("ppocr_det"):
        try:
            from fetch_models import MODELS, fetch
            path = fetch("ppocr_det", quiet=True)
            np.savez(work / "ppocr_det.npz", **MODELS["ppocr_det"].make_inputs(seed=0))
            nodes = len(onnx.load(str(path), load_external_data=False).graph.node)
            out.append(Case("ppocr_det", str(path), ["--inputs", str(work / "ppocr_det.npz")],
                            nodes, 1))
        except Exception as exc:  # offline, no cache: said in the doc
            out.append(f"ppocr_det skipped: {str(exc).splitlines()[0]}")
    if want("deep_12_200_samples"):
        z = deep_model(blocks=12, overflow_blocks=(3, 9))
        path = work / "deep_12.onnx"
        onnx.save(z.model, path)
        out.append(Case("deep_12_200_samples", str(path), ["--samples", "200", "--seed", "1"],
                        len(z.model.graph.node), 200))
    return out


def run_child(case: Case, workers: int, work: Path, timeout: int) -> Run:
    """One `trtbisect run` in a child (the simulation: this script's --sim child)."""
    out = work / f"{case.name}-w{workers}"
    if workers == SIM_WIDTH:
        cmd = [sys.executable, __file__, "--sim", case.model, str(out), *case.args]
    else:
        cmd = [sys.executable, "-m", "trtbisect.cli", "-q", "run", case.model, *case.args,
               "--out", str(out), "--workers", str(workers), "--threads", "1", "--no-resume"]
    rss_file = work / f"{case.name}-w{workers}.rss"
    if Path("/usr/bin/time").exists():  # GNU time: the largest process's peak RSS
        cmd = ["/usr/bin/time", "-f", "%M", "-o", str(rss_file), *cmd]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = Run(workers)
    began = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        r.error = f"timed out after {timeout} s"
        return r
    r.wall_s = time.perf_counter() - began
    if proc.returncode not in (0, 4, 5):
        r.error = f"exit {proc.returncode}: {stderr.strip().splitlines()[-1:]}"
        return r
    plan = json.loads((out / "precision.json").read_text())
    r.verdict, r.fp32, r.evaluations = plan["verdict"], plan["fp32_nodes"], plan["evaluations"]
    r.search_s = sum(s["seconds"] for s in plan.get("stages", [])
                     if s["stage"].startswith("searching"))
    stats = plan.get("workers") or {}
    r.rounds = stats.get("rounds", r.evaluations)
    r.speculative = stats.get("speculative", 0)
    r.worker_rss_mib = stats.get("peak_rss_mib", []) if workers != SIM_WIDTH else []
    trace = json.loads((out / "trace.json").read_text())
    r.trials = [[t["fp32"], t["passed"], t["phase"]] for t in trace.get("trials", [])]
    try:
        r.rss_mib = int(rss_file.read_text().split()[-1]) / 1024  # KiB
    except (OSError, ValueError, IndexError):
        pass
    return r


def sim_child(model: str, out: str, rest: list[str]) -> None:
    """The run in this process with an `InlinePool` SIM_WIDTH wide as its workers."""
    from trtbisect.cli import main
    from trtbisect.parallel import pool
    from trtbisect.stages import batch

    batch.LocalPool = lambda spec, data, width: pool.InlinePool(spec, data, SIM_WIDTH)
    sys.argv = ["trtbisect", "-q", "run", model, *rest, "--out", out,
                "--workers", str(SIM_WIDTH), "--threads", "1", "--no-resume"]
    main(prog_name="trtbisect")


def measure(case: Case, work: Path, timeout: int, sim: bool) -> dict:
    runs = [run_child(case, w, work, timeout) for w in (1, 2)]
    if sim and not runs[0].error:
        runs.append(run_child(case, SIM_WIDTH, work, timeout))
    for r in runs:
        print(f"{case.name} workers={r.workers}: {r.error or f'{r.wall_s:.1f} s, '}"
              f"{r.evaluations} evaluations, {r.rounds} rounds", file=sys.stderr)
    return {"case": asdict(case), "runs": [asdict(r) for r in runs]}


def _same(a: dict, b: dict) -> bool:
    return (not a["error"] and not b["error"] and a["fp32"] == b["fp32"]
            and a["evaluations"] == b["evaluations"] and a["trials"] == b["trials"])


def render(rows: list[dict], notes: list[str], build_min: float) -> str:
    when = datetime.date.today().isoformat()
    lines = [BEGIN, "", "## Evaluations on worker processes (#23)", "",
             f"`python scripts/bench_workers.py` on {platform.machine()}, "
             f"{os.cpu_count()} cores shared with other work, {when}. Each run is "
             "`trtbisect run --threads 1` in a child process; ratios are within this one run. "
             "*search* is the search stage alone (the pool starts before it); *rounds* is the "
             "search's critical path in evaluation times at that width (a round: up to N plans "
             "evaluated side by side), *spec.* the plans evaluated ahead that the search never "
             "took (counted apart, in no trace). *same* : the plan, evaluations and trace agree "
             "with the 1-worker run.", "",
             "| model | nodes | samples | evaluations | wall 1 w | wall 2 w | 2 w / 1 w | "
             "search 1 w | search 2 w | rounds (2 w) | spec. (2 w) | same | peak RSS 1 w | "
             "peak RSS per worker (2 w) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        c, runs = row["case"], row["runs"]
        one, two = runs[0], runs[1]
        if one["error"] or two["error"]:
            lines.append(f"| {c['name']} | {c['nodes']} | {c['samples']} | - | "
                         f"{one['error'] or _s(one['wall_s'])} | {two['error'] or _s(two['wall_s'])}"
                         " | - | - | - | - | - | - | - | - |")
            continue
        rss = ", ".join(f"{v:.0f}" for v in two["worker_rss_mib"]) + " MiB"
        lines.append(
            f"| {c['name']} | {c['nodes']} | {c['samples']} | {one['evaluations']} | "
            f"{_s(one['wall_s'])} | {_s(two['wall_s'])} | {two['wall_s'] / one['wall_s']:.2f} | "
            f"{_s(one['search_s'])} | {_s(two['search_s'])} | {two['rounds']} | "
            f"{two['speculative']} | {'yes' if _same(one, two) else '**no**'} | "
            f"{one['rss_mib']:.0f} MiB | {rss} |")
    lines += ["", f"### A TensorRT search on {SIM_WIDTH} GPUs, simulated", "",
              f"The same runs with an in-process pool {SIM_WIDTH} wide "
              "(`parallel.pool.InlinePool`: the search proposes and consumes rounds exactly "
              f"as with {SIM_WIDTH} workers, each plan judged here), every evaluation priced "
              f"as one engine build of {build_min:g} min: one GPU = evaluations x build, "
              f"{SIM_WIDTH} GPUs = rounds x build (speculative builds run on otherwise idle "
              "GPUs; the build of the written plan and the reference are left out).", "",
              f"| model | evaluations | rounds at {SIM_WIDTH} | speculative | same plan | "
              f"1 GPU | {SIM_WIDTH} GPUs | speed-up |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        c, runs = row["case"], row["runs"]
        if len(runs) < 3 or runs[2]["error"]:
            why = runs[2]["error"] if len(runs) > 2 else "not simulated"
            lines.append(f"| {c['name']} | - | {why} | - | - | - | - | - |")
            continue
        sim = runs[2]
        seq_h = sim["evaluations"] * build_min / 60
        par_h = sim["rounds"] * build_min / 60
        lines.append(f"| {c['name']} | {sim['evaluations']} | {sim['rounds']} | "
                     f"{sim['speculative']} | {'yes' if _same(runs[0], sim) else '**no**'} | "
                     f"{seq_h:.1f} h | {par_h:.1f} h | {seq_h / max(par_h, 1e-9):.1f}x |")
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    lines += ["", END]
    return "\n".join(lines)


def _s(x: float) -> str:
    return f"{x:.1f} s" if x >= 1 else f"{x * 1000:.0f} ms"


def write_doc(text: str, doc: Path = DOC) -> None:
    replace_section(doc, text, BEGIN, END)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--sim":
        sim_child(sys.argv[2], sys.argv[3], sys.argv[4:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], help="a model name (repeatable)")
    ap.add_argument("--skip", action="append", default=[], help="a model name to leave out")
    ap.add_argument("--no-sim", action="append", default=[],
                    help=f"a model not to simulate on {SIM_WIDTH} GPUs (its run costs one more "
                         "sequential search)")
    ap.add_argument("--build-min", type=float, default=5.0, help="minutes per engine build")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per run")
    ap.add_argument("--note", action="append", default=[], help="a line for the notes")
    ap.add_argument("--rows", help="also save the rows as JSON here")
    ap.add_argument("--from-rows", help="only render the markdown from saved rows")
    ap.add_argument("--no-doc", action="store_true", help="print the section, write no doc")
    args = ap.parse_args()
    if args.from_rows:
        saved = json.loads(Path(args.from_rows).read_text())
        rows, notes = saved["rows"], saved["notes"]
    else:
        def want(name: str) -> bool:
            return (not args.only or name in args.only) and name not in args.skip
        rows, notes = [], []
        with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
            for c in cases(Path(tmp), want):
                if isinstance(c, str):
                    notes.append(c)
                    continue
                rows.append(measure(c, Path(tmp), args.timeout, c.name not in args.no_sim))
        notes += args.note
        if args.rows:
            Path(args.rows).write_text(json.dumps({"rows": rows, "notes": notes}, indent=1))
    text = render(rows, notes, args.build_min)
    if args.no_doc:
        print(text)
    else:
        write_doc(text)
        print(f"wrote {DOC}", file=sys.stderr)


if __name__ == "__main__":
    main()
