"""report.html and report.md for a quantized run (`run model_qdq.onnx --report`, `run
--precision int8|fp8 --report`): the FP16 run's report (report.py) for a QuantResult.

The verdict first, then the margin each output keeps under its bound, the trade-off plot,
the plan's culprits with the side each is on (a quantized layer run un-quantized, or an FP16
node of the file kept in FP32), the diagnosis with its fixes and which of them trtbisect
applied and judged, the error per output, the search trace and the renderings. report.py's
helpers draw and escape (its `plot_tradeoff`, `e`, tables, CSS): a model's names are hostile
input, escaped for Markdown and HTML as the FP16 report escapes them (base/escape.py).

It sits beside report.py, above the run: quant/console.py hands `write_report` to run(),
which calls it inside --out's generation (a lower module never imports the report).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from pathlib import Path

from rich.text import Text

from ..base.escape import md_code, md_fence, md_text
from ..base.files import atomic_write, atomic_write_text
from ..diagnosis.wording import num
from ..reports.report import (
    TRACE_ROWS,
    e,
    e_lines,
    error_text,
    html_page,
    html_table,
    md_table,
    pct_of,
    plot_tradeoff,
)
from ..search.cost import pct as cost_pct
from .report import NAME as TRADEOFF
from .report import rounding_words, tradeoff_png, verdict_line

TRADEOFF_NOTE = ("Every plan the search evaluated, at its estimated engine time (x) and the worst "
                 "relative error its judge measured (y, log scale): passing and failing plans, "
                 "their Pareto front, the written plan (a star), the tolerance, the file as "
                 "given (all quantized) and the all-FP16 engine's time (a vertical line: its "
                 "error is not judged on this road).")
CULPRIT_HEAD = ["culprit", "side", "op", "what it reads quantized / why FP32",
                "time against all quantized", "cause"]


def write_report(result, out_dir: Path, rtol: float, default: bool) -> dict[str, str]:
    """Write report.md, report.html and (points to draw) the trade-off plot into --out;
    returns {kind: path}, precision.json's `files` keys."""
    png = tradeoff_png(result, rtol, default, plot_tradeoff)
    files = {"report_html": out_dir / "report.html", "report_md": out_dir / "report.md"}
    if png is not None:
        files["report_tradeoff"] = out_dir / TRADEOFF
        atomic_write(files["report_tradeoff"], lambda tmp: Path(tmp).write_bytes(png))
    atomic_write_text(files["report_md"], render_markdown(
        result, TRADEOFF if png is not None else None))
    atomic_write_text(files["report_html"], render_html(result, png))
    return {k: str(v) for k, v in files.items()}


def verdict_text(result) -> str:
    return Text.from_markup(verdict_line(result)).plain


def margin_lines(result) -> list[str]:
    """Per output, how much of its bound the plan's file uses (the file as given where
    nothing was planned): the number the verdict rests on."""
    planned = result.after is not None
    judged = result.after if planned else result.before
    if judged is None:
        return []
    who = "the plan" if planned else "the file as given"
    out = []
    for name, err in judged.errors.items():
        if err.scores:
            out.append(f"{name}: {who} {'passes' if err.passed else 'fails'} {err.scores_text}")
            continue
        used = err.max_abs / err.bound if err.bound > 0 else math.inf
        verb = "uses" if err.passed and not err.nonfinite else "misses: reaches"
        out.append(f"{name}: {who} {verb} {pct_of(used)} of the bound: {err.max_text(num)}"
                   + (f", {err.nonfinite} non-finite" if err.nonfinite else ""))
    return out


def side_of(result, name: str) -> str:
    """Which side of the file a culprit is on, in words."""
    if name in result.plan:
        fmts = "/".join(f.upper() for f in result.layer(name).formats)
        return f"quantized ({fmts}): run un-quantized"
    return "FP16: kept in FP32"


def _added(result) -> dict[str, str]:
    """Per culprit, what it adds to the engine's estimated time against all quantized
    (quant/cost.py's rows; an FP16 node's row is named by its search unit)."""
    rows = result.cost.rows if result.cost is not None else []
    half_units = [u for u in result.units if u not in set(result.plan)]
    node_of = dict(zip(half_units, result.fp32_nodes))
    return {node_of.get(r.row, r.row): cost_pct(r.share) for r in rows
            if isinstance(r.share, (int, float))}


def culprit_rows(result) -> list[tuple[str, ...]]:
    added = _added(result)
    rows: list[tuple[str, ...]] = []
    for name in result.plan:
        layer = result.layer(name)
        edges = ", ".join(f"{e.source} ({e.format}{', weight' if e.weight else ''}"
                          f"{', per-channel' if e.per_channel else ''})" for e in layer.edges)
        causes = ", ".join(dict.fromkeys(f.kind for f in result.findings.get(name, [])))
        rows.append((name, side_of(result, name), layer.op, edges, added.get(name, ""),
                     causes))
    for name in result.fp32_nodes:
        rows.append((name, side_of(result, name), result.fp32_ops.get(name, ""),
                     result.fp32_reasons.get(name, ""), added.get(name, ""), "fp16_rounding"))
    return rows


def diagnosis(result) -> list[dict]:
    """Per culprit: its findings (kind, sentence, fix) and the fixes trtbisect applied and
    judged with the layer kept quantized."""
    out = []
    for name in result.plan:
        fixes = []
        for fx in result.fixes.get(name, []):
            rel = fx.max_rel
            said = f" (max relative error {num(rel)})" if rel is not None else ""
            fixes.append((bool(fx.passed), f"{'verified' if fx.passed else 'tried'}: "
                          f"{fx.fix} {'lets' if fx.passed else 'does not let'} {name} "
                          f"stay quantized{said}" + (f": {fx.error}" if fx.error else "")))
        out.append({"name": name, "side": side_of(result, name),
                    "findings": [(f.kind, f.text, f.fix) for f in result.findings.get(name, [])],
                    "fixes": fixes})
    for name in result.fp32_nodes:
        out.append({"name": name, "side": side_of(result, name),
                    "findings": [("fp16_rounding", result.fp32_reasons.get(name, ""),
                                  "keep the node in FP32 (the written file does)")],
                    "fixes": []})
    return out


def output_table(result) -> tuple[list[str], list[tuple[str, ...]]]:
    """Per output: the file as given, and the plan's file where one was written."""
    if result.before is None:
        return [], []
    if result.after is None:
        return (["output", "quantized as given"],
                [(name, error_text(e)) for name, e in result.before.errors.items()])
    return (["output", "quantized as given", "with the plan"],
            [(name, error_text(e), error_text(result.after.errors.get(name)))
             for name, e in result.before.errors.items()])


def trace_rows(result) -> list[tuple]:
    return [(t.index, "as given" if t.phase == "all-fp16" else t.phase, len(t.fp32),
             "pass" if t.passed else "fail",
             "" if t.price is None else f"{1e6 * t.price:.4g}",
             "" if t.score is None else num(float(t.score)), ", ".join(t.fp32[:6])
             + (f", … (+{len(t.fp32) - 6})" if len(t.fp32) > 6 else ""))
            for t in result.trials[:TRACE_ROWS]]


TRACE_HEAD = ["#", "phase", "units", "result", "est. us", "worst rel. error", "which"]


def facts(result) -> list[str]:
    """The run's facts in sentences: reference, judge, estimated times, search."""
    out = [f"reference: {result.reference}; judged by {result.criteria.describe()} on ONNX Runtime CPU "
           "(Q/DQ run as written" + (f"; FP16 stores emulated, {rounding_words(result)})"
                                 if result.emulated else ")")]
    c = result.cost
    if c is not None and c.all_quantized_s and result.verdict != "reference_invalid":
        vs = c.plan_vs_all_quantized
        out.append(f"estimated engine time on {c.title}: all FP16 "
                   f"{1e6 * c.all_fp16_s:.4g} us, all quantized ({c.format.upper()}) "
                   f"{1e6 * c.all_quantized_s:.4g} us, the plan {1e6 * c.plan_s:.4g} us"
                   + (f" ({100 * vs:+.1f}% against all quantized)"
                      if vs is not None and result.units else ""))
        qdq = next((r for r in c.rows if r.kind == "qdq"), None)
        plan = c.qdq_plan
        if result.units and qdq is not None:
            out.append(f"the plan's Q/DQ reformat kernels: {plan.kernels}, "
                       f"{1e6 * plan.s:.4g} us; what it changes in Q/DQ traffic (reformats, "
                       f"fused output Qs): {cost_pct(qdq.share)} of all quantized")
    if result.evaluations:
        out.append(f"{result.evaluations} evaluations, {result.minimality}, "
                   f"{result.seconds:.1f}s")
    if result.one_judge is not None:
        out.append("one judge: the written file's errors equal the search's, bit for bit: "
                   f"{'yes' if result.one_judge else 'NO'}")
    out += [f"reference problem: {p}" for p in result.reference_problems]
    return out


def command_rows(result) -> list[tuple[str, str]]:
    if result.verdict != "fixed":
        return []
    r = result.renderings or {}
    rows = [("ModelOpt ONNX PTQ with the plan's layers excluded (Python)",
             r.get("modelopt_python")),
            ("Everything (commands.sh)", r.get("commands_sh"))]
    return [(t, c) for t, c in rows if c]


# ---------------------------------------------------------------- markdown

def render_markdown(result, tradeoff: str | None) -> str:
    parts = [f"# trtbisect report: {md_code(Path(result.model_path).name)} (quantized)", "",
             f"**Verdict: {md_text(verdict_text(result))}.**", "",
             *(f"- {md_text(line)}" for line in margin_lines(result)), "",
             *(f"{md_text(f)}  " for f in facts(result)), ""]
    if tradeoff:
        parts += ["## Error against estimated cost", "", md_text(TRADEOFF_NOTE), "",
                  f"![trade-off plot]({tradeoff})", ""]
    parts += md_table("Culprits and their side", CULPRIT_HEAD, culprit_rows(result),
                       code=(0,))
    parts += _md_diagnosis(result)
    parts += md_table("Error per output", *output_table(result), code=(0,))
    parts += md_table("Search trace", TRACE_HEAD, trace_rows(result))
    rows = command_rows(result)
    if rows:
        parts += ["## Apply the plan", ""]
        if result.files.get("mixed_qdq_model"):
            parts += [f"The plan's Q/DQ ONNX (TensorRT 10 and 11, strongly typed): "
                      f"{md_code(Path(result.files['mixed_qdq_model']).name)}", ""]
    for title, cmd in rows:
        parts += [f"### {md_text(title)}", "", *md_fence(cmd, "python" if "Python" in title
                                                         else "sh"), ""]
    return "\n".join(parts).rstrip() + "\n"


def _md_diagnosis(result) -> list[str]:
    items = diagnosis(result)
    if not items:
        return []
    out = ["## Diagnosis", ""]
    for k, d in enumerate(items, 1):
        out += [f"### {k}. {md_code(d['name'])} ({md_text(d['side'])})", ""]
        for kind, text, fix in d["findings"]:
            out += [f"- **{md_text(kind)}**: {md_text(text)}", f"  - fix: {md_text(fix)}"]
        out += [f"- {'**' if ok else ''}{md_text(t)}{'**' if ok else ''}" for ok, t in d["fixes"]]
        out.append("")
    return out


# ---------------------------------------------------------------- html

def render_html(result, tradeoff: bytes | None) -> str:
    ok = result.verdict in ("fixed", "quantized_ok")
    name = e(Path(result.model_path).name)
    body = [f"<h1>trtbisect report: {name} (quantized)</h1>",
            f"<div class='verdict {'ok' if ok else 'bad'}'>{e(verdict_text(result))}</div>"]
    body += [f"<p class='margin'>{e(line)}</p>" for line in margin_lines(result)]
    if tradeoff is not None:
        body += ["<h2>Error against estimated cost</h2>",
                 f"<p class='muted'>{e(TRADEOFF_NOTE)}</p>",
                 "<img class='plot narrow' alt='error against estimated cost' "
                 f"src='data:image/png;base64,{base64.b64encode(tradeoff).decode()}'>"]
    body += html_table("Culprits and their side", CULPRIT_HEAD, culprit_rows(result))
    body += _html_diagnosis(result)
    body += html_table("Error per output", *output_table(result))
    rows = trace_rows(result)
    if rows:
        body += [f"<details><summary>Search trace ({len(result.trials)} evaluations)"
                 "</summary>", *html_table("", TRACE_HEAD, rows, result_col=3), "</details>"]
    body += _html_commands(result)
    return html_page(name, body, facts(result))


def _html_diagnosis(result) -> list[str]:
    items = diagnosis(result)
    out = ["<h2>Diagnosis</h2>"] if items else []
    for d in items:
        tags = "".join(f"<span class='tag cause'>{e(kind)}</span>" for kind, _, _ in d["findings"])
        found = "".join(f"<p>{e(text)}</p><ul class='fixes'><li>fix: {e(fix)}</li></ul>"
                        for _, text, fix in d["findings"])
        fixes = "".join(f"<li class='{'applied' if ok else ''}'>{e(t)}</li>" for ok, t in d["fixes"])
        out.append(f"<div class='card'><div>{tags}<b>{e(d['name'])}</b> <span class='muted'>"
                   f"{e(d['side'])}</span></div>{found}"
                   + (f"<b>Fixes applied and judged</b><ul class='fixes'>{fixes}</ul>"
                      if fixes else "") + "</div>")
    return out


def _html_commands(result) -> list[str]:
    rows: Sequence[tuple[str, str]] = command_rows(result)
    if not rows:
        return []
    return ["<h2>Apply the plan</h2>", "<p class='muted'>commands.sh in the run's folder holds "
            "them; the plan's Q/DQ ONNX is written beside it.</p>"] + [
        f"<details><summary>{e(t)}</summary><pre>{e_lines(c)}</pre></details>" for t, c in rows]
