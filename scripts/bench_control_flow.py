#!/usr/bin/env python3
"""Control flow judged (issue #26), measured. Writes docs/control_flow.md.

On the two silero-vad 6.2.3 files with If branches (scripts/fetch_models.py: silero_vad_if, the
package's default silero_vad.onnx, all of whose network sits inside an If; silero_vad_op15,
whose LSTM decoder sits inside Ifs reading weights from the main graph), and on the planted
models of tests/models/control_flow_models.py:

* nodes (top level / inside subgraphs) and the candidates judged, now and before #26 (when a
  subgraph's nodes were never rounded);
* the all-FP16 error (max|d| / max|FP32| per output, worst over the samples), now and with the
  subgraphs' nodes left in FP32 (what trtbisect judged before #26);
* `trtbisect run` (pipeline.run) at two tolerances and both semantics: verdict, plan size (and
  how much of it lies inside subgraphs), evaluations, wall time, and whether `check` of the
  written file agreed with the search bit for bit.

Samples are the user's kind of data: a synthetic 16 kHz signal (harmonic tones under an
amplitude envelope, plus noise), streamed frame by frame through the FP32 model so that each
sample carries the LSTM state the stream had reached (frames 8, 16, 24 and 32).

    python scripts/bench_control_flow.py            # ~1-2 min on 2 cores
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from fetch_models import MODELS, fetch  # noqa: E402

from tests.models.control_flow_models import all_planted  # noqa: E402
from trtbisect import pipeline  # noqa: E402
from trtbisect.backends.ort import Emulator, Reference  # noqa: E402
from trtbisect.context import Options  # noqa: E402
from trtbisect.graph import Graph  # noqa: E402
from trtbisect.judge.compare import Tolerance  # noqa: E402

SILERO = ("silero_vad_if", "silero_vad_op15")
FRAME, CONTEXT, RATE = 512, 64, 16000
SAMPLE_FRAMES = (8, 16, 24, 32)
SETTINGS = (("trt", 1e-2), ("trt", 1e-3), ("strict", 1e-3))


def stream_samples(path: Path) -> list[dict[str, np.ndarray]]:
    """Samples of a streamed signal: each frame's input with the state FP32 reached there."""
    rng = np.random.default_rng(0)
    t = np.arange(FRAME * (max(SAMPLE_FRAMES) + 1)) / RATE
    voice = sum(np.sin(2 * np.pi * f * t) / k for k, f in enumerate((180, 360, 540, 900), 1))
    envelope = 0.5 * (1 + np.sin(2 * np.pi * 2.5 * t))
    signal = (0.3 * envelope * voice + 0.02 * rng.standard_normal(t.size)).astype(np.float32)
    ref = Reference(Graph.from_path(path))
    state = np.zeros((2, 1, 128), np.float32)
    context = np.zeros(CONTEXT, np.float32)
    samples = []
    for k in range(max(SAMPLE_FRAMES) + 1):
        chunk = signal[k * FRAME:(k + 1) * FRAME]
        feed = {"input": np.concatenate([context, chunk])[None], "state": state,
                "sr": np.array(RATE, np.int64)}
        if k in SAMPLE_FRAMES:
            samples.append({n: np.array(v) for n, v in feed.items()})
        state, context = ref.run(feed)["stateN"], chunk[-CONTEXT:]
    ref.close()
    return samples


def relative_errors(g: Graph, samples, fp32_nodes: frozenset[str] | None) -> dict[str, float]:
    """max|d| / max|FP32| per output, worst over the samples, for the plan (strict rounding)."""
    ref, emu = Reference(g), Emulator(g)
    worst: dict[str, float] = {}
    for s in samples:
        r, h = ref.run(s), emu.run(fp32_nodes or frozenset(), s)
        for name, value in r.items():
            d = np.abs(h[name].astype(np.float64) - value)
            rel = float(d.max() / max(np.abs(value).max(), 1e-30)) if np.isfinite(d).all() \
                else float("inf")
            worst[name] = max(worst.get(name, 0.0), rel)
    emu.close()
    ref.close()
    return worst


def fmt(x: float) -> str:
    return "inf" if not np.isfinite(x) else f"{x:.2e}"


def errors_cell(errs: dict[str, float]) -> str:
    return ", ".join(f"{k} {fmt(v)}" for k, v in errs.items())


def measure(name: str, path: Path, samples, inputs: list[str], work: Path) -> dict:
    g = Graph.from_path(path)
    inner = [n for n in g.candidates() if g.is_inner(n)]
    row = {"name": name, "nodes": len(g.names), "top": g.top, "inner_nodes": len(g.names) - g.top,
           "candidates": len(g.candidates()), "inner_candidates": len(inner),
           "before_candidates": len(g.candidates()) - len(inner),
           "fp16_now": relative_errors(g, samples, None),
           "fp16_before": relative_errors(g, samples, frozenset(inner)), "runs": []}
    for sem, rtol in SETTINGS:
        opts = Options.of(inputs=inputs, semantics=sem, tolerance=Tolerance(rtol=rtol))
        out = work / f"{name}-{sem}-{rtol}"
        start = time.perf_counter()
        r = pipeline.run(path, opts, out)
        wall = time.perf_counter() - start
        plan_inner = sum(1 for n in r.fp32_nodes if r.fp32_nodes and n in set(inner))
        row["runs"].append({"semantics": sem, "rtol": rtol, "verdict": r.verdict,
                            "fp32": len(r.fp32_nodes), "fp32_inner": plan_inner,
                            "evaluations": r.evaluations, "wall": wall,
                            "one_judge": (r.one_judge.search_equals_check if r.one_judge else None),
                            "plan": list(r.fp32_nodes)})
        print(f"[bench] {name} {sem} rtol={rtol}: {r.verdict}, {len(r.fp32_nodes)} FP32, "
              f"{r.evaluations} evaluations, {wall:.1f} s", file=sys.stderr)
    return row


def planted_rows(work: Path) -> list[dict]:
    rows = []
    for name, p in all_planted().items():
        folder = work / "planted" / name
        folder.mkdir(parents=True)
        model, inputs = folder / f"{name}.onnx", folder / "inputs.npz"
        onnx.save(p.model, model)
        np.savez(inputs, **p.inputs)
        g = Graph.from_path(model)
        inner = frozenset(n for n in g.candidates() if g.is_inner(n))
        old = "-"  # the function and contrib cases: as issue #26 reports them (see the text)
        if inner:  # all-FP16 with the subgraphs' nodes in FP32, against rtol 1e-2
            before = relative_errors(g, [p.inputs], inner)
            old = "passes" if all(np.isfinite(v) and v <= 1e-2 for v in before.values()) \
                else "fails"
        r = pipeline.run(model, Options.of(inputs=[str(inputs)], semantics="strict"),
                         folder / "out")
        rows.append({"name": name, "inner": len(inner) or ("inlined" if g.inlined else 0),
                     "before": old, "verdict": r.verdict, "fp32": sorted(r.fp32_nodes),
                     "exact": set(r.fp32_nodes) == p.strict, "evaluations": r.evaluations,
                     "one_judge": (r.one_judge.search_equals_check if r.one_judge else None)})
    return rows


def markdown(rows: list[dict], planted: list[dict]) -> str:
    today = datetime.date.today().isoformat()
    lines = [
        "# Control flow, functions and contrib ops: every node judged (issue #26)",
        "",
        f"Measured by `python scripts/bench_control_flow.py` on {today}: {platform.machine()}, "
        f"Python {platform.python_version()}, onnxruntime {onnxruntime.__version__}, "
        f"onnx {onnx.__version__}, a machine shared with other jobs (wall times are indicative).",
        "",
        "Models: the two silero-vad 6.2.3 files with `If` branches (`scripts/fetch_models.py "
        "silero_vad_if silero_vad_op15`): *silero_vad_if* is the package's default "
        "`silero_vad.onnx`, whose whole network sits inside the branches of one `If` on the "
        "sample rate (weights in Constant nodes inside the branches); *silero_vad_op15* keeps "
        "its STFT and encoder at the top level and its LSTM decoder inside nested `If`s that "
        "read the weights from the main graph. Samples: a synthetic 16 kHz signal (harmonic "
        "tones under an envelope, plus noise) streamed through the FP32 model; the samples are "
        f"frames {', '.join(map(str, SAMPLE_FRAMES))} with the LSTM state the stream reached.",
        "",
        "## What is judged",
        "",
        "*before*: trtbisect before #26, which never rounded a node inside a subgraph (its "
        "all-FP16 error is computed here with those nodes in FP32). *now*: every node. The "
        "error is max|d| / max|FP32| per output, worst over the samples, all-FP16 under "
        "per-node rounding.",
        "",
        "| model | nodes (top level + in subgraphs) | candidates before | candidates now | "
        "all-FP16 error before | all-FP16 error now |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['name']} | {r['nodes']} ({r['top']} + {r['inner_nodes']}) | "
                     f"{r['before_candidates']} | {r['candidates']} ({r['inner_candidates']} in "
                     f"subgraphs) | {errors_cell(r['fp16_before'])} | "
                     f"{errors_cell(r['fp16_now'])} |")
    lines += [
        "",
        "## trtbisect run",
        "",
        "`pipeline.run` on the four samples. *FP32 nodes*: the plan (of them, inside "
        "subgraphs). *one judge*: `check` of the written mixed file gave the search's numbers "
        "bit for bit.",
        "",
        "| model | semantics | rtol | verdict | FP32 nodes (in subgraphs) | evaluations | wall | "
        "one judge |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for x in r["runs"]:
            lines.append(f"| {r['name']} | {x['semantics']} | {x['rtol']:g} | {x['verdict']} | "
                         f"{x['fp32']} ({x['fp32_inner']}) | {x['evaluations']} | "
                         f"{x['wall']:.1f} s | {'yes' if x['one_judge'] else 'no'} |")
    lines += [
        "",
        "## Planted faults",
        "",
        "tests/models/control_flow_models.py, `--semantics strict`, the bundled sample. "
        "*before*: all-FP16 with the subgraphs' nodes left in FP32 (as trtbisect judged before "
        "#26) against the default rtol 1e-2; for the local function and the contrib op, issue "
        "#26 reports what the old run said: \"FP16 already meets the tolerance\" for both "
        "(the function's call was never rounded; the ops after FusedMatMul went untyped, so "
        "nothing was). *exact*: the plan is the planted minimal set.",
        "",
        "| model | candidates in subgraphs | before | verdict now | plan | exact | evaluations |"
        " one judge |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in planted:
        lines.append(f"| {p['name']} | {p['inner']} | {p['before']} | {p['verdict']} | "
                     f"{', '.join(p['fp32']) or '-'} | {'yes' if p['exact'] else 'no'} | "
                     f"{p['evaluations']} | {'yes' if p['one_judge'] else 'no'} |")
    lines += ["", "## Notes", "", *NOTES, *silero_note(rows)]
    for r in rows:
        lines += ["", f"Plans for {r['name']}:", ""]
        for x in r["runs"]:
            shown = ", ".join(f"`{n}`" for n in x["plan"]) or "(none)"
            lines.append(f"- {x['semantics']}, rtol {x['rtol']:g}: {shown}")
    return "\n".join(lines) + "\n"


def silero_note(rows: list[dict]) -> list[str]:
    """What the tables above say of the silero files at the default tolerance."""
    out = []
    for r in rows:
        default = next(x for x in r["runs"] if x["rtol"] == 1e-2)
        worst_now = max(r["fp16_now"].items(), key=lambda kv: kv[1])
        worst_before = max(r["fp16_before"].items(), key=lambda kv: kv[1])
        out.append(
            f"- **{r['name']} at the default tolerance**: all-FP16 errs at most "
            f"{fmt(worst_now[1])} (on `{worst_now[0]}`) with every node rounded, and at most "
            f"{fmt(worst_before[1])} (on `{worst_before[0]}`) with the subgraphs' nodes left in "
            f"FP32 as before #26; the verdict at rtol 1e-2 is `{default['verdict']}`, now on "
            f"all {r['candidates']} candidates.")
    return out + [
        "- Issue #26 reports a relative error of 6.8e-2 on the state under all-FP16 for "
        "silero_vad_if. On this page's streamed samples the error on `stateN` stays far below "
        "that (table above), so FP16 passes the default tolerance there; at rtol 1e-3 the "
        "search has work (STFT magnitude, encoder Convs, the LSTM and the Identity nodes "
        "around it)."]


NOTES = [
    "- **Names.** A node inside a subgraph is `<holder>[<attribute>]/<its own name>`, nested "
    "holders nesting the path (`outer[then_branch]/inner[then_branch]/square`); an unnamed one "
    "is `<op_type>_<its position in its graph>`; a name taken already gets `_<index>`. Names "
    "are idempotent: the files trtbisect writes carry them, and read back the same. A function "
    "call's nodes are `<call node>/<node in the function>`.",
    "- **What TensorRT does** (docs/semantics.md, rules `conditionals`, `loops`, "
    "`local_functions_inlined`, `unsupported_ops`): an If on a run-time condition is an "
    "IIfConditional whose branch layers run in FP16 like any other; on a build-time constant "
    "only the taken branch is imported; Loop and Scan are ILoops whose body layers run on "
    "every trip; local functions are parsed in place. The emulator rounds every node of what "
    "runs, per node: fused layers are not predicted inside subgraphs (the pessimistic side).",
    "- **Layer-wise statistics inside subgraphs**: an If branch's values are exposed as extra "
    "outputs (an empty tensor from the branch that did not run, skipped by the statistics); a "
    "Loop or Scan body's values of static shape, and the body's own inputs (a Loop's state as "
    "each trip reads it), as scan outputs, every trip stacked. A value inside an If inside a "
    "Loop (or the reverse) is not exposed: the prior ranks its node by position.",
    "- **AutoCast** (ModelOpt 0.47) keeps If/Loop/Scan subgraph nodes in FP32 (checked by "
    "running it: no precision Cast inside a branch), so its rendering says it cannot express "
    "a plan's FP16 subgraph nodes and gives the `trtbisect check` line of the mixed ONNX, "
    "which is the plan. trtexec, Polygraphy and the TensorRT Python snippet name subgraph "
    "layers by the qualified names the named model gives their nodes.",
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "control_flow.md"))
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in SILERO:
            path = fetch(name)
            assert MODELS[name].sha256  # pinned
            samples = stream_samples(path)
            inputs = []
            for k, s in enumerate(samples):
                f = work / f"{name}_sample{k}.npz"
                np.savez(f, **s)
                inputs.append(str(f))
            rows.append(measure(name, path, samples, inputs, work))
        planted = planted_rows(work)
    Path(args.out).write_text(markdown(rows, planted))
    print(f"[bench] wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
