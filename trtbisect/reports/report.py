"""report.html and report.md: the answer a deployment engineer reads, not just node names.

Both are views of one RunResult (its frozen records, read by attribute): the verdict,
each culprit group with its cause, evidence and fixes, a plot of every tensor's magnitude and
FP16 error along the graph, the search trace, the error per output before and after, and the
commands that apply the plan. The HTML is self-contained (inline CSS, the plot as a base64
PNG) so it can be mailed or attached to a bug. matplotlib is imported only here, lazily.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..base.escape import md_code, md_fence, md_table_cell, md_text, shown_text
from ..base.files import atomic_write, atomic_write_text
from ..diagnosis.diagnose import CulpritGroup, num, pct
from ..errors import require
from ..judge.compare import FP16_MAX, FP16_TINY, OutputError
from ..judge.precision import FP16, Precision
from ..judge.validation import line as validation_line
from ..outputs.plan_groups import (
    DEFAULT_TOP,
    has_plan,
    kinds_text,
    layers_words,
    plan_groups,
    plural,
    search_words,
)
from ..result import RunResult, StabilityRecord

MATPLOTLIB_HINT = "install the report extra: pip install 'trtbisect[report]'"
TRACE_ROWS = 200  # a search trace longer than this is cut in the report (trace.json has it all)
VERDICTS = {"fp16_ok": "FP16 already meets {meet}: nothing needs FP32",
            "fixed": "fixed by keeping {n} of {c} nodes{layers} in FP32",
            "reference_invalid": "the FP32 reference is already non-finite: FP16 is not to blame",
            "reference_unstable": "two FP32 runs of the model differ (it draws random numbers): "
                                  "nothing can be judged against a reference that moves",
            "no_plan": "no precision plan meets {meet}",
            "partial": "partial judgement: {partial}",
            "nothing_to_judge": "nothing to judge in FP16: no node computes in float32 or "
                                "float16",
            "over_budget": "no plan within the --budget passes: the best within it keeps {n} of "
                           "{c} nodes{layers} in FP32 and misses {meet}",
            "fragile": "fragile: the nearest plan keeps {n} of {c} nodes{layers} in FP32 and "
                       "meets {meet} by less than the spread of what the tools compute; no "
                       "plan has the margin, so it is not called fixed",
            # fragile because the search's own noise stopped it (search/noise.py)
            "fragile_noisy": "fragile: {meet} cannot tell plans apart near its bound (keeping "
                             "more in FP32 made the error worse by as much as a plan's "
                             "margin); the best passing plan so far keeps {n} of {c} "
                             "nodes{layers} in FP32 and is not called fixed: a criterion that "
                             "fits decides",
            "unvalidated": "unvalidated: the plan keeps {n} of {c} nodes{layers} in FP32 and "
                           "meets {meet} on the samples it was searched on, but fails the "
                           "samples it never saw; it is not called fixed",
            # unvalidated with no FP32 node: FP16 as it is passed the searched samples only
            "unvalidated_as_is": "unvalidated: FP16 as it is meets {meet} on the samples it "
                                 "was judged on, but fails the samples it never saw; it is "
                                 "not called fixed"}


def require_matplotlib() -> None:
    """Fail before a long search, not after it, when the report cannot be drawn."""
    require("matplotlib", MATPLOTLIB_HINT)


def write_report(result: RunResult, out_dir: Path) -> dict[str, str]:
    """Write report.html, report.md and the plots beside them; returns {kind: path}."""
    png, columns = plot(result) if result.stats else (None, [])  # none: reference invalid
    trade = tradeoff_png(result)
    files = {"report_html": out_dir / "report.html", "report_md": out_dir / "report.md"}
    if png is not None:
        files["report_plot"] = out_dir / "report_plot.png"
        atomic_write(files["report_plot"], lambda tmp: _write_bytes(tmp, png))
    if trade is not None:
        files["report_tradeoff"] = out_dir / "report_tradeoff.png"
        atomic_write(files["report_tradeoff"], lambda tmp: _write_bytes(tmp, trade))
    atomic_write_text(files["report_md"], render_markdown(
        result, files["report_plot"].name if png is not None else None,
        files["report_tradeoff"].name if trade is not None else None))
    atomic_write_text(files["report_html"], render_html(result, png, columns, trade))
    return {k: str(v) for k, v in files.items()}


def _write_bytes(path: str, data: bytes) -> None:
    Path(path).write_bytes(data)


def low_of(result: RunResult) -> Precision:
    """The run's low precision (precision.json "precision"; FP16 for older runs)."""
    return result.precision or FP16


def verdict_line(result: RunResult) -> str:
    from ..stages.coverage import partial_words
    partial = partial_words(result) if result.verdict == "partial" else ""
    key: str = result.verdict
    if key == "unvalidated" and not result.fp32_nodes:
        key = "unvalidated_as_is"
    if key == "fragile" and result.certificate is not None and result.certificate.search_noise:
        key = "fragile_noisy"
    line = VERDICTS[key].format(n=len(result.fp32_nodes), c=result.candidates,
                                           layers=layers_words(result),
                                           partial=partial,
                                           meet=result.criteria.standard)
    low = low_of(result)
    return line.replace("FP16", low.label) if key in ("fp16_ok", "unvalidated_as_is") else line


def groups_of(result: RunResult) -> list[CulpritGroup]:
    return list(result.culprit_groups or [])


def group_of_node(result: RunResult) -> dict[str, CulpritGroup]:
    return {n: g for g in groups_of(result) for n in g.nodes}


# ---------------------------------------------------------------- plot

def plot_png(result: RunResult) -> bytes:
    """Max |x| and FP16 error of every stored tensor in graph order, culprits marked."""
    return plot(result)[0]


Column = tuple[str, float, float, float, float]  # tensor, left, top, width, height (% of image)


def plot(result: RunResult) -> tuple[bytes, list[Column]]:
    """The plot, and where each tensor's column lies on it (for hover titles in the HTML)."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 6.2), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True)
    stats = list(result.stats.values())
    culprits = {c.node for c in result.culprits}
    marked = [i for i, s in enumerate(stats) if s.producer in culprits]
    low = low_of(result)
    fig.suptitle(f"Every stored tensor in graph order: FP32 magnitude, and the all-{low.label} "
                 "error", x=0.01, ha="left", fontsize=11)
    _plot_magnitude(top, stats, marked, low)
    plan = plan_errors(result, stats)
    _plot_error(bottom, stats, marked, result.tolerance.rtol, plan)
    _label_x(bottom, stats, marked, _group_starts(result, stats))
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue(), _columns(fig, top, bottom, stats, plan)


def _columns(fig, top, bottom, stats: Sequence, plan: list[float] | None) -> list[Column]:
    """Each tensor's vertical band over both axes, in percent of the figure (scale-proof)."""
    width = fig.bbox.width
    xs = [bottom.transData.transform((i, 1.0))[0] / width * 100 for i in range(len(stats))]
    y_top = (1 - top.get_position().y1) * 100
    height = (top.get_position().y1 - bottom.get_position().y0) * 100
    out = []
    for i, s in enumerate(stats):
        left = (xs[i - 1] + xs[i]) / 2 if i else xs[i] - (xs[1] - xs[0] if len(xs) > 1 else 1) / 2
        right = (xs[i] + xs[i + 1]) / 2 if i + 1 < len(xs) else 2 * xs[i] - left
        title = (f"{s.name} (by {s.producer or 'input'}): FP32 max|x| {s.fp32_absmax:.3g}, "
                 f"all-FP16 rel err {s.rel_err:.3g}")
        if plan is not None and math.isfinite(plan[i]):
            title += f", with the plan {plan[i]:.3g}"
        out.append((title, left, y_top, max(right - left, 0.05), height))
    return out


def _positive(values: Iterable[float]) -> list[float]:
    """Log axes cannot show 0: leave a gap instead."""
    return [v if v > 0 and math.isfinite(v) else math.nan for v in values]


def _plot_magnitude(ax, stats: Sequence, marked: list[int], low: Precision = FP16) -> None:
    x = range(len(stats))
    ax.semilogy(x, _positive(s.fp32_absmax for s in stats), ".-", color="#1f77b4",
                lw=1, ms=4, label="FP32 max |x|")
    if low.narrow_range:  # BF16's edges (3.39e38, 9.2e-41) would only squash the axis
        ax.axhline(FP16_MAX, color="#d62728", ls="--", lw=1.2, label="FP16 max 65504")
    smallest = min((s.fp32_absmax for s in stats if s.fp32_absmax > 0), default=1.0)
    if smallest < 1e-2 and low.narrow_range:  # only near underflow: else it squashes the axis
        ax.axhline(FP16_TINY, color="#9467bd", ls=":", lw=1, label="FP16 smallest subnormal 6e-8")
    if marked:
        ax.semilogy(marked, _positive(stats[i].fp32_absmax for i in marked), "o",
                    mfc="none", mec="#d62728", ms=9, mew=1.5, label="written by an FP32 node")
    _shade(ax, marked)
    ax.set_ylabel("max |value|")
    _legend(ax)
    ax.grid(True, which="major", alpha=0.3)


def plan_errors(result: RunResult, stats: Sequence) -> list[float] | None:
    """Per-tensor relative error with the plan applied, aligned with `stats`, when the pipeline
    measured it (`result.layerwise_plan`: tensor -> TensorStats, its JSON, or a float)."""
    plan: Mapping[str, object] | None = result.layerwise_plan
    if not isinstance(plan, Mapping) or not plan:
        return None

    def rel(v: object) -> float:
        if isinstance(v, Mapping):
            v = v.get("rel_err", math.nan)
        v = getattr(v, "rel_err", v)
        try:
            return float(v)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return math.nan

    return [rel(plan[s.name]) if s.name in plan else math.nan for s in stats]


def _plot_error(ax, stats: Sequence, marked: list[int], rtol: float,
                with_plan: Sequence[float] | None = None) -> None:
    x = list(range(len(stats)))
    finite = [s.rel_err if math.isfinite(s.rel_err) and s.rel_err > 0 else math.nan for s in stats]
    top = max([v for v in finite if not math.isnan(v)] + [rtol, 1.0]) * 3
    ax.semilogy(x, finite, ".-", color="#2ca02c", lw=1, ms=4, label="all-FP16 error / max |ref|")
    shown = [v for v in [*finite, *_positive(with_plan or [])] if not math.isnan(v)]
    low = min(shown + [rtol if rtol > 0 else 1e-3])
    ax.set_ylim(low / 10, top * 2)  # explicit: an FP16 run without error has no span of its own
    if with_plan is not None:
        ax.semilogy(x, _positive(with_plan), ".-", color="#1f77b4", lw=1, ms=3,
                    label="with the plan")
    bad = [i for i, s in enumerate(stats) if s.new_nonfinite or not math.isfinite(s.rel_err)]
    if bad:
        ax.semilogy(bad, [top] * len(bad), "x", color="#d62728", ms=7, label="NaN / inf in FP16")
    ax.axhline(rtol, color="#ff7f0e", ls="--", lw=1.2, label=f"rtol {rtol:g}")
    _shade(ax, marked)
    ax.set_ylabel("relative error")
    ax.set_xlabel("tensor (topological order)")
    _legend(ax)
    ax.grid(True, which="major", alpha=0.3)


def _legend(ax) -> None:
    """Above the axes, so it never hides a culprit's point."""
    ax.legend(loc="lower left", bbox_to_anchor=(0, 1.0), ncols=4, fontsize=8, frameon=False,
              borderaxespad=0.2)


def _shade(ax, marked: list[int]) -> None:
    for i in marked:
        ax.axvspan(i - 0.5, i + 0.5, color="#d62728", alpha=0.08, lw=0)


def _group_starts(result: RunResult, stats: Sequence) -> dict[int, str]:
    """Tick position -> label for the first tensor each culprit group writes."""
    index = {s.producer: i for i, s in reversed(list(enumerate(stats))) if s.producer}
    out = {}
    for k, g in enumerate(groups_of(result), 1):
        first = min((index[n] for n in g.nodes if n in index), default=None)
        if first is not None:
            out[first] = f"{k}: {g.scope or g.nodes[0]}"
    return out


def _label_x(ax, stats: Sequence, marked: list[int], groups: Mapping[int, str]) -> None:
    """Every producer on small graphs; one label per culprit group on big ones."""
    if len(stats) <= 40:
        labels = {i: s.producer or s.name for i, s in enumerate(stats)}
    else:
        labels = dict(groups) or {i: stats[i].producer or stats[i].name for i in marked[:20]}
    ticks = sorted(labels)
    ax.set_xticks(ticks)
    ax.set_xticklabels([_short(labels[i]) for i in ticks], rotation=60, ha="right", fontsize=7)
    for i, label in zip(ticks, ax.get_xticklabels()):
        if i in marked:
            label.set_color("#d62728")
            label.set_fontweight("bold")


def _short(name: str, width: int = 28) -> str:
    name = shown_text(name)  # a tick label shows control characters escaped, like every output
    return name if len(name) <= width else "…" + name[-(width - 1):]


# ---------------------------------------------------------------- trade-off

# (estimated cost, score, passed[, why it failed: `KIND: where`, stages/evaluator.py
# `failure`]); lower is better in both
Point = tuple


def pareto_front(points: Sequence[Point]) -> list[int]:
    """Indices of the passing points no other passing point beats in both cost and score
    (ties: the first), cheapest first. A non-finite score (NaN: not measured) is never on the
    front, nor a failing plan (a front through plans that fail promises what none gives)."""
    order = sorted((i for i, p in enumerate(points) if p[1] == p[1] and p[2]),
                   key=lambda i: (points[i][0], points[i][1], i))
    front, best = [], math.inf
    for i in order:
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front


def tradeoff_points(result: RunResult) -> tuple[list[Point], Point | None, float]:
    """The search's evaluated plans as (slowdown %, worst relative error, passed), the
    written plan's point, and the tolerance the error is held to (rtol)."""
    cost = result.cost
    if result.search is None or cost is None or not cost.all_low_s:
        return [], None, result.tolerance.rtol
    base = float(cost.all_low_s)
    pts = [(100 * (t.price / base - 1), math.nan if t.score is None else float(t.score),
            t.passed, None if t.passed else (t.why or "failed"))
           for t in result.search.trials if t.price is not None]
    chosen = None
    plan = tuple(result.fp32_layers or ())
    for t, p in zip([t for t in result.search.trials if t.price is not None], pts):
        if set(t.fp32) == set(plan):
            chosen = p
    if chosen is None and result.verdict in ("fixed", "fp16_ok", "over_budget"):
        chosen = (100 * float(cost.slowdown), math.nan, result.verdict != "over_budget",
                  None)
    return pts, chosen, result.tolerance.rtol


def tradeoff_png(result: RunResult) -> bytes | None:
    """Error against estimated cost for every plan the search evaluated (None: nothing to
    plot), the Pareto front, the written plan, the tolerance and the --budget."""
    points, chosen, rtol = tradeoff_points(result)
    if len(points) < 2:
        return None
    cost = result.cost
    budget = cost.budget_pct if cost is not None else None
    gpu = cost.gpu_title if cost is not None else ""
    xlabel = f"estimated slowdown against all-{low_of(result).label} on {gpu} (%)"
    if not result.criteria.default:  # the points are the criterion's severities
        return plot_tradeoff(points, chosen, 1.0, budget, xlabel,
                             ylabel="worst criterion severity (1 = at its bound)")
    return plot_tradeoff(points, chosen, rtol, budget, xlabel)


def plot_tradeoff(points: Sequence[Point], chosen: Point | None = None, limit: float | None = None,
                  budget: float | None = None, xlabel: str = "estimated cost",
                  ylabel: str = "worst relative error (max|d| / max|ref|)",
                  marks: Sequence[tuple[float, str]] = ()) -> bytes:
    """The trade-off plot from (cost, score, passed) points: passing plans, failing ones,
    the Pareto front, `chosen` (the written plan), the criterion's `limit` and the `budget`.
    A criterion with its own score feeds its points here unchanged."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 5.2), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    finite = [p[1] for p in points if math.isfinite(p[1]) and p[1] > 0]
    low = min(finite + ([limit] if limit else []) + [1e-3]) / 3
    top = max(finite + ([limit] if limit else []) + [low * 10]) * 3
    ceiling = top * 3  # non-finite errors (NaN / inf outputs) are drawn along the top
    nonfinite = any(not math.isfinite(p[1]) for p in points)

    def y(v: float) -> float:
        return ceiling if not math.isfinite(v) else max(v, low)

    below = failing_below(points, limit)
    for passed, style in ((True, dict(marker="o", color="#2ca02c", label="passes")),
                          (False, dict(marker="x", color="#d62728", label="fails"))):
        sel = [p for i, p in enumerate(points) if p[2] == passed and p[1] == p[1]
               and i not in below]
        if sel:
            ax.scatter([p[0] for p in sel], [y(p[1]) for p in sel], s=28, alpha=0.75,
                       **style)  # type: ignore[arg-type]
    # a plan that fails under the line failed by what its error does not show: marked by why
    kinds: dict[str, list[Point]] = {}
    for i in sorted(below):
        kinds.setdefault(below[i], []).append(points[i])
    for (kind, sel), marker in zip(sorted(kinds.items()), "^sDvP<>*"):
        ax.scatter([p[0] for p in sel], [y(p[1]) for p in sel], s=34, marker=marker,
                   facecolors="none", edgecolors="#d62728", linewidths=1.2,
                   label=f"fails under the line: {FAILURE_WORDS.get(kind, kind)} ({len(sel)})")
    front = [points[i] for i in pareto_front(points)]
    if front:
        xs, ys = [p[0] for p in front], [y(p[1]) for p in front]
        ax.step(xs, ys, where="post", color="#1f77b4", lw=1.3, label="Pareto front")
    if chosen is not None:
        ax.scatter([chosen[0]], [y(chosen[1]) if chosen[1] == chosen[1] else (limit or low)],
                   marker="*", s=260, color="#ff7f0e", edgecolor="black", zorder=5,
                   label="the written plan")
    if limit:
        ax.axhline(limit, color="#ff7f0e", ls="--", lw=1.1, label=f"tolerance {limit:g}")
    if budget is not None:
        ax.axvline(budget, color="#9467bd", ls=":", lw=1.3, label=f"budget {budget:g}%")
    for (x, label), color in zip(marks, ("#8c564b", "#e377c2", "#7f7f7f")):  # `marks`: x, name
        ax.axvline(x, color=color, ls="-.", lw=1.1, label=label)
    if nonfinite:
        ax.axhline(ceiling, color="#999999", lw=0.6)
        ax.text(0.5, ceiling, "NaN / inf", transform=ax.get_yaxis_transform(), va="bottom",
                ha="center",
                fontsize=8, color="#666666")
    ax.set_yscale("log")
    ax.set_ylim(low, ceiling * 3 if nonfinite else top)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title("Every plan the search evaluated: error against estimated cost", loc="left",
                 fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper right", fontsize=8, framealpha=0.9)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


FAILURE_WORDS = {  # stages/evaluator.py FAILURES, short enough for a legend
    "tensor": "a tensor non-finite (--strict)", "timeout": "--eval-timeout",
    "nonfinite": "an output non-finite", "criterion": "a criterion", "hook": "the --check hook",
    "margin": "the aimed bound (margin)", "own": "an output's own --output-tol",
    "bound": "an output's bound", "pass-rate": "--pass-rate", "crashed": "crashed",
    "carried": "a looser bound, carried", "failed": "no reason recorded"}


def failing_below(points: Sequence[Point], limit: float | None) -> dict[int, str]:
    """Index -> the kind of failure (stages/evaluator.py `failure`: `KIND: where`) of each
    failing point drawn at or under the `limit` line: plans the line alone would call
    passing."""
    if limit is None:
        return {}
    return {i: str(p[3] if len(p) > 3 and p[3] else "failed").split(":", 1)[0]
            for i, p in enumerate(points)
            if not p[2] and p[1] == p[1] and p[1] <= limit}


# ---------------------------------------------------------------- shared rows

def output_rows(result: RunResult) -> list[tuple[str, ...]]:
    """Per output: all-low-precision's error, and the plan's when a plan was judged."""
    planned = has_plan(result)
    return [(name, error_text(before),
             *([error_text(result.errors_after.get(name))] if planned else []))
            for name, before in result.errors_before.items()]


def output_table(result: RunResult) -> tuple[list[str], list[tuple[str, ...]]]:
    head = ["output", f"all {low_of(result).label}",
            *(["with the plan"] if has_plan(result) else [])]
    return head, output_rows(result)


def margin_lines(result: RunResult) -> list[str]:
    """How far under its bound each output lands (the plan's, else all-low-precision's), and
    against FP32's own noise where it was measured: the number the verdict rests on."""
    errors = result.errors_after if has_plan(result) else result.errors_before
    who = "the plan" if has_plan(result) else f"all {low_of(result).label}"
    margins = result.margins or {}
    out = []
    for name, err in list(errors.items())[:5]:
        if err.scores:
            held = [m.text("its margin")
                    for k, m in (result.certificate.scores if result.certificate else {}).items()
                    if k.startswith(f"{name}:") and math.isfinite(m.margin)
                    and math.isfinite(m.spread)]
            out.append(f"{name}: {who} {'passes' if err.passed else 'fails'} "
                       f"{err.scores_text}" + (f"; {'; '.join(held)}" if held else ""))
            continue
        # the one record per output (compare.py `worst`): the largest max|d| over the
        # samples against the smallest bound, the one the renderings write and the
        # certificate's margin is measured under (stages/spread.py)
        worst, bound = err.max_abs, err.bound
        used = worst / bound if bound > 0 else math.inf
        m = margins.get(name)
        spread = m.spread if m is not None else None
        floor = (f"; what the tools compute spreads by {num(float(spread))}"
                 + (" (fragile: the margin is within it)" if m and m.fragile else "")
                 if isinstance(spread, (int, float)) else "")
        verb = "uses" if err.passed and not err.nonfinite else "misses: reaches"
        out.append(f"{name}: {who} {verb} {pct_of(used)} of the bound: {err.max_text(num)}"
                   + (f", {err.nonfinite} non-finite" if err.nonfinite else "") + f"{floor}")
    if len(errors) > 5:
        out.append(f"... and {plural(len(errors) - 5, 'more output')} under “Error per output”")
    said = validation_line(result.validation)
    if said:
        out.append(said)
    return out


def pct_of(x: float) -> str:
    """A fraction as a percentage people read: 3.5%, 0.0012%, >1000%."""
    if not math.isfinite(x):
        return "inf%"
    return ">1000%" if x > 10 else f"{num(100 * x)}%"


def plan_group_table(result: RunResult) -> tuple[str, list[str], list[tuple]]:
    """The plan by module (else by TensorRT layer), costliest first (outputs/plan_groups.py)."""
    groups = plan_groups(result)
    if not groups:
        return "", [], []
    by_module = any(g.by_module for g in groups)
    diag = groups_of(result)
    costs = any(g.share is not None for g in groups)
    head = ["module" if by_module else "layer (first node)", "nodes", "ops",
            *(["cost"] if costs else []), "cause"]
    from ..search.cost import pct as cost_pct

    rows = [(g.label, g.nodes_text, g.ops_text(None),
             *([cost_pct(g.share) if g.share is not None else ""] if costs else []),
             kinds_text(g, diag)) for g in groups]
    return f"The plan by {'module' if by_module else 'TensorRT layer'}", head, rows


def error_text(e: OutputError | None) -> str:
    if e is None:
        return "-"
    extra = f", {e.nonfinite} non-finite" if e.nonfinite else ""
    if e.scores:  # judged by other criteria than the default (judge/criteria.py)
        on = f" on sample {e.sample}" if e.sample is not None else ""
        return (f"{'pass' if e.passed else 'FAIL'}: " + e.scores_text
                + f"{on} (max|d| {num(e.max_abs)}, cosine {e.cosine:.4f}){extra}")
    return (f"{'pass' if e.passed else 'FAIL'}: {e.max_text(num)}, rel {num(e.rel)}, "
            f"cosine {e.cosine:.4f}{extra}")


def trace_rows(result: RunResult) -> list[tuple[int, str, int, str, str, str]]:
    """Per evaluation: its number, phase, size, result, units and why it failed (judge/
    evaluator.py `failure`)."""
    if result.search is None:
        return []
    return [(t.index, t.phase, len(t.fp32), "pass" if t.passed else "fail", _nodes(t.fp32),
             "" if t.passed else (t.why or ""))
            for t in result.search.trials[:TRACE_ROWS]]


def _nodes(names: Sequence[str], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", … (+{len(names) - limit})" if len(names) > limit else "")


def command_rows(result: RunResult) -> list[tuple[str, str]]:
    if result.verdict not in ("fixed", "fp16_ok", "partial"):
        return []
    from ..outputs.render import RenderContext, render_all

    ctx = result.render_context or RenderContext(
        model=result.files.get("named_model", result.model_path),
        mixed_model=result.files.get("mixed_model", "<mixed>.onnx"), tolerance=result.tolerance)
    return [(r.title, r.text) for r in render_all(result.fp32_nodes, ctx).values()]


def fix_lines(group: CulpritGroup) -> list[tuple[bool, str]]:
    """(applied by the plan?, text) for each suggested fix."""
    return [(f.kind == group.applied_fix, f.text) for f in group.fixes]


def evidence_items(group: CulpritGroup) -> list[tuple[str, str]]:
    out = []
    for k, v in group.evidence.items():
        if v is None or k in ("limit",):
            continue
        if isinstance(v, float) and k in ("fraction",):
            out.append((k, pct(v)))
        else:
            out.append((k, num(v) if isinstance(v, float) else str(v)))
    return out


# ---------------------------------------------------------------- markdown
# Every model-controlled string is escaped for Markdown (base/escape.py): names as code
# spans nothing in them can end, sentences with Markdown's and HTML's characters escaped, the
# commands in fenced blocks they cannot close. A Markdown renderer shows a name as text, never
# as HTML, a link or a heading.

def render_markdown(result: RunResult, plot_name: str | None,
                    tradeoff_name: str | None = None) -> str:
    parts = [f"# trtbisect report: {md_code(Path(result.model_path).name)}", "",
             f"**Verdict: {md_text(verdict_line(result))}.**", "",
             *(f"- {md_text(line)}" for line in margin_lines(result)), "", *_md_facts(result), ""]
    title, head, rows = plan_group_table(result)
    parts += md_table(title, head, rows, code=(0,))
    parts += _md_groups(result)
    parts += md_table("FP16-safe rewrites applied", REWRITE_HEAD, rewrite_rows(result),
                       code=(1,))
    parts += _md_culprits(result)
    if plot_name:
        parts += ["## Magnitude and error along the graph", "", f"![per-tensor plot]({plot_name})",
                  ""]
    if tradeoff_name:
        parts += ["## Error against estimated cost", "", TRADEOFF_NOTE, "",
                  f"![trade-off plot]({tradeoff_name})", ""]
    parts += md_table("Error per output", *output_table(result), code=(0,))
    parts += md_table("Margin against the spread of what the tools compute", MARGIN_HEAD,
                       margin_rows(result), code=(0,))
    parts += md_table("Criteria that may fit better", HINT_HEAD, hint_rows(result),
                       code=(0, 2))
    parts += _md_stability(result)
    parts += md_table("Search trace", ["#", "phase", "FP32 units (TensorRT layers)", "result",
                                        "units", "why it failed"],
                       trace_rows(result))
    if command_rows(result):
        parts += ["## Apply the plan", ""]
    for title, cmd in command_rows(result):
        parts += [f"### {md_text(title)}", "", *md_fence(cmd, "sh"), ""]
    return "\n".join(parts).rstrip() + "\n"


MARGIN_HEAD = ["output", "bound (as rendered)", "worst", "margin", "spread", "noise floor",
               "holds"]


def margin_rows(result: RunResult) -> list[tuple[str, ...]]:
    """Per output, the written plan's margin under the bound the renderings check against the
    spread of what the tools may compute (stages/spread.py); a row per failing variation."""
    cert = result.certificate
    if cert is None:
        return []

    def of(k: int | None) -> str:
        return f" (sample {k})" if isinstance(k, int) else ""
    rows: list[tuple[str, ...]] = [(name, fmt_num(m.bound) + of(m.bound_sample),
             f"max|d| {fmt_num(m.worst)}{of(m.sample)}", fmt_num(m.margin),
             fmt_num(m.spread), fmt_num(m.noise_floor),
             "yes" if m.certified else "NO (fragile)")
            for name, m in cert.outputs.items()]
    # a criterion's score against its threshold (--metric, --check-error-stat, a hook's)
    rows += [(key, f"threshold {fmt_num(s.bound)}", f"score {fmt_num(s.worst)}"
              + of(s.sample) + f", severity {fmt_num(s.severity)}",
              fmt_num(s.margin), fmt_num(s.spread), "-",
              "yes" if s.certified else "NO (fragile)")
             for key, s in cert.scores.items()]
    rows += [(f"(every output) under {label}", "", "", "", "", "", "fails the criteria")
             for label, ok in cert.variants.items() if not ok]
    return rows


HINT_HEAD = ["output", "why the default criterion may mislead", "criterion", "all FP16"]


def hint_rows(result: RunResult) -> list[tuple[str, ...]]:
    """judge/hints.py: per output the default judges poorly, each criterion that fits."""
    return [(h.output, "; ".join(h.why), c.flags, c.all_fp16)
            for h in result.criterion_hints or [] for c in h.criteria]


def fmt_num(x) -> str:
    return x if isinstance(x, str) else "-" if x is None else f"{x:.3g}"


class _Code(str):
    """A fact's name (a path, an output, an op): a code span in Markdown, text in HTML."""


class _Words(str):
    """A fact's sentence the model or a tool wrote: escaped in Markdown, text in HTML. A
    fact's plain `str` parts are trtbisect's own words, the same in both."""


@dataclass(frozen=True)
class _Fact:
    """One line of the run's facts: its parts (str, _Code, _Words), rendered by `_md_facts`
    and `_facts_text`; `markdown_only`: the criterion, coverage and cost lines, which the
    HTML page's "Run" box does not list."""
    parts: tuple[str, ...]
    markdown_only: bool = False


def _fact(*parts: str, markdown_only: bool = False) -> _Fact:
    return _Fact(parts, markdown_only)


def _facts(result: RunResult) -> list[_Fact]:
    """The run's facts, once: report.md lists them all, report.html's "Run" box those not
    `markdown_only`."""
    return [_fact("model: ", _Code(result.model_path), " (sha256 ",
                  _Code(f"{result.model_sha256[:16]}…"), f", {result.nodes} nodes, "
                  f"{result.candidates} candidates)"),
            _fact(f"tolerance: rtol {result.tolerance.rtol:g}, atol {result.tolerance.atol:g}"
                  f"{', strict' if result.strict else ''}; {result.samples} sample(s)"),
            *_criteria_facts(result),
            _fact(f"search: {search_words(result)}, {result.seconds:.1f}s"),
            *_semantics_facts(result),
            *_coverage_facts(result),
            *_cost_facts(result),
            *[_fact("problem: ", _Words(p)) for p in result.reference_problems]]


def _md_facts(result: RunResult) -> list[str]:
    """The facts as Markdown list items."""
    def md(part: str) -> str:
        return (md_code(part) if isinstance(part, _Code) else
                md_text(part) if isinstance(part, _Words) else part)
    return ["- " + "".join(md(p) for p in fact.parts) for fact in _facts(result)]


def _facts_text(result: RunResult) -> list[str]:
    """The facts as plain text (the HTML escapes them itself), without the Markdown's own."""
    return ["".join(fact.parts) for fact in _facts(result) if not fact.markdown_only]


TRADEOFF_NOTE = ("Every plan the search evaluated, by its estimated slowdown against all-FP16 "
                 "(docs/cost.md) and its worst relative error over the outputs (under a criterion "
                 "flag: its worst severity, 1 at the criterion's bound; a failing "
                 "plan's error is what the samples up to the first failing one showed); the "
                 "line is the Pareto front of the passing plans, the star the written plan. A "
                 "plan that fails under the tolerance line failed by what its error does not "
                 "show, marked by why (an aimed bound inside the tolerance: the margin; an "
                 "output's own tolerance; a criterion; a non-finite tensor); trace.json gives "
                 "each failing plan's reason, output and sample (`why`).")


def _cost_facts(result: RunResult) -> list[_Fact]:
    """The plan's price (precision.json "cost")."""
    c = result.cost
    if c is None or result.verdict == "reference_invalid":
        return []
    from ..search.cost import cost_sentence

    return [_fact(f"estimated engine time on {c.gpu_title} (objective {c.objective}): "
                  f"{cost_sentence(c)}", markdown_only=True),
            *([_fact(_Words(c.fallback), markdown_only=True)] if c.fallback else [])]


def _coverage_facts(result: RunResult) -> list[_Fact]:
    """Nodes judged inside subgraphs, ops not judged, ops TensorRT's parser cannot import."""
    cov = result.coverage
    if cov is None:
        return []
    out = []
    if cov.judged_in_subgraphs or cov.functions_inlined:
        out.append(_fact(f"judged: {cov.judged} nodes, {cov.judged_in_subgraphs} of them "
                         "inside If/Loop/Scan subgraphs"
                         + ("; model-local functions inlined" if cov.functions_inlined
                            else ""), markdown_only=True))
    for ops, what in ((cov.unjudged, "not judged (run in FP32)"),
                      (cov.fp32_by_schema, "judged in FP32, as every FP16 file keeps it"),
                      (cov.tensorrt_unsupported, "TensorRT's ONNX parser cannot import")):
        for c in ops:
            fix = [_Words(f"; {c.fix}")] if c.fix else []
            out.append(_fact(f"{what}: ", _Code(c.op), " (", _Code(c.domain),
                             f") x{len(c.nodes)}: ", _Words(c.why), *fix, markdown_only=True))
    return out


def _criteria_facts(result: RunResult) -> list[_Fact]:
    """The criterion, on how many samples the plan was judged, and how it fared on each."""
    judged = result.judged
    crit = result.criteria_record
    if judged is None or crit is None:
        return []
    after = judged.shown
    if after is None:
        return []
    per = after.severities
    failed = [k for k, ok in enumerate(after.samples) if not ok]
    worst = sorted(range(len(per)), key=lambda k: -per[k])[:5]
    search = judged.search_samples
    return [_fact(f"criterion: {crit.description}", markdown_only=True),
            _fact(f"judged on {len(after.samples)} sample(s): "
                  f"{'the plan' if judged.after is not None else 'all FP16'} passes on "
                  f"{sum(after.samples)} (needs {after.required})"
                  + (f", fails on {', '.join(map(str, failed[:20]))}" if failed else "")
                  + "; worst (severity, 1 = at the bound): "
                  + ", ".join(f"#{k} {per[k]:.3g}" for k in worst)
                  + (f"; the search judged on samples {', '.join(map(str, search))}"
                     if search else ""), markdown_only=True)]


def _semantics_facts(result: RunResult) -> list[_Fact]:
    """Which emulation semantics judged the run, and all-FP16 under the other (strict) one."""
    rec = result.semantics
    if rec is None:
        return []
    layers = len(_names(result.fp32_layers))  # named in layer_precisions.txt
    out = [_fact(f"semantics: {rec.semantics} (TensorRT {rec.trt_version}, TF32 "
                 f"{'on' if rec.tf32 else 'off'}, weights {rec.weight_rule}); "
                 f"{plural(layers, 'TensorRT layer')} kept FP32")]
    strict = result.errors_before_strict
    if strict is not None:
        out += [_fact(f"all {low_of(result).label} under per-node rounding (strict), ",
                      _Code(name), f": {'pass' if s.error.passed else 'FAIL'}, ",
                      *([_Words(str(s.text)), ", "] if s.text else []),
                      f"max|d| {_g(s.error.max_abs)}, rel {_g(s.error.rel)}")
                for name, s in strict.items()]
    return out


def _names(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _md_groups(result: RunResult) -> list[str]:
    """Each group's heading and summary; evidence and fixes for the first of each kind (cause
    and pattern) only: the others of that kind repeat them with other numbers."""
    out = ["## Diagnosis", ""] if groups_of(result) else []
    seen: set[tuple] = set()
    for k, g in enumerate(groups_of(result)):
        pattern = f", pattern {md_code(g.pattern)}" if g.pattern else ""
        out += [f"### Group {k + 1}: {md_code(g.cause)}{pattern}", "", md_text(g.summary), ""]
        kind = (g.cause, g.pattern)
        if kind in seen:
            continue
        seen.add(kind)
        evidence, fixes = evidence_items(g), fix_lines(g)  # a section with nothing is left out
        if evidence:
            out += ["Evidence: " + ", ".join(f"{md_text(a)} = {md_text(b)}" for a, b in evidence),
                    ""]
        if fixes:
            out += ["Fixes:", "", *(f"- {'**applied by the plan:** ' if applied else ''}"
                                    f"{md_text(text)}" for applied, text in fixes), ""]
    return out


REWRITE_HEAD = ["rewrite", "where", "why", "FP32 drift (of the output range)",
                "all-FP16 error before -> after", "in the PyTorch source"]


def rewrite_rows(result: RunResult) -> list[tuple]:
    """What `run --rewrite` kept (precision.json "rewrites"), one row each."""
    rows = []
    for a in result.rewrites.applied if result.rewrites is not None else []:
        where = a.where[0] if len(a.where) == 1 else f"{a.where[0]} .. {a.where[-1]}"
        rows.append((a.rewrite, where, a.why, f"{a.drift.rel:.2g}",
                     f"{_g(a.error_before)} -> {_g(a.error_after)}", a.advice))
    return rows


def _g(v: object) -> str:
    """A number for people (3 significant digits, 5.5e6), "-" for none."""
    try:
        return num(float(v))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "-"


def culprit_rows(result: RunResult) -> tuple[list[str], list[tuple]]:
    """The culprit table (markdown and HTML alike): the PyTorch module and the TensorRT layer
    columns only when some culprit has one."""
    by_node = group_of_node(result)
    modules = any(c.module for c in result.culprits)
    layers = any(c.layer and c.layer != c.node for c in result.culprits)
    from ..search.cost import boundary_row, cost_cells

    price = result.cost
    shares = cost_cells(price, [(c.node, c.layer or "") for c in result.culprits])
    priced = any(shares)
    head = ["node", "op", *(["module"] if modules else []),
            *(["TensorRT layer"] if layers else []), *(["cost"] if priced else []),
            "cause", "why"]
    rows, seen = [], set()
    for c, share in zip(result.culprits, shares):
        unit = c.layer or c.node
        layer = "same layer" if unit in seen else (c.layer or "") if c.layer != c.node else ""
        seen.add(unit)
        group = by_node.get(c.node)
        rows.append((c.node, c.op, *([c.module or ""] if modules else []),
                     *([layer] if layers else []), *([share] if priced else []),
                     group.cause if group is not None else "", c.why))
    casts = boundary_row(price) if priced else None
    if casts is not None:  # the rows add up to the plan's slowdown
        rows.append(("(boundary Casts)", "Cast", *([""] if modules else []),
                     *([""] if layers else []), casts[0], "", casts[1]))
    return head, rows


def _md_culprits(result: RunResult) -> list[str]:
    head, rows = culprit_rows(result)
    names = [k for k, h in enumerate(head) if h not in ("cost", "cause", "why")]  # model strings
    return md_table("Nodes to keep in FP32", head, rows, code=tuple(names))


STABILITY_HEAD = ["plan", "output", "error / bound", "noise", "margin", "flips", "fragile"]


def _stability_rows(st: StabilityRecord) -> list[tuple]:
    """--stability's table, per plan and output (the Markdown and the HTML page alike)."""
    return [(p.plan, out, _g(o.judged_ratio), _g(o.noise), _g(o.margin),
             "yes" if o.flips else "no", "yes" if o.fragile else "no")
            for p in st.plans for out, o in p.outputs.items()]


def _md_stability(result: RunResult) -> list[str]:
    st = result.stability
    if st is None:
        return []
    rows = _stability_rows(st)
    head = ["## Stability", "", f"{md_text(st.method)}; deterministic reruns: "
            f"{md_text(st.deterministic)}.",
            "", *([f"- **{md_text(f)}**" for f in st.flags]
                  or ["- no plan flips or sits within the noise"]), ""]
    return head + md_table("", STABILITY_HEAD, rows, code=(1,))


def md_table(title: str, head: Sequence[str], rows: Sequence[Sequence[object]],
              code: Sequence[int] = ()) -> list[str]:
    """A GFM table; cells in `code` columns are names (code spans), the others sentences."""
    if not rows:
        return []
    out = [f"## {title}", ""] if title else []
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(md_table_cell(md_code(v) if j in code and str(v) else md_text(v))
                              for j, v in enumerate(row)) + " |" for row in rows]
    return out + [""]


# ---------------------------------------------------------------- html

CSS = """
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2330;
 background:#f4f6f9}
main{max-width:1120px;margin:0 auto;padding:24px 28px 48px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:19px;margin:32px 0 10px;
 border-bottom:2px solid #dde3ec;padding-bottom:4px}
.muted{color:#5b6577;font-size:13px}
.verdict{padding:14px 18px;border-radius:8px;font-size:18px;font-weight:600;margin:16px 0}
.ok{background:#e3f5e8;border-left:6px solid #2e9d50}.bad{background:#fde7e7;
 border-left:6px solid #d13b3b}
.card{background:#fff;border:1px solid #dde3ec;border-radius:8px;padding:14px 18px;margin:12px 0}
.tag{display:inline-block;border-radius:4px;padding:1px 8px;font-size:12px;font-weight:600;
 margin-right:6px;background:#e8edf5;color:#2b3b55}
.tag.cause{background:#fde2cf;color:#8a3b00}
table{border-collapse:collapse;width:100%;background:#fff;font-size:13px}
th,td{border:1px solid #dde3ec;padding:5px 8px;text-align:left;vertical-align:top}
th{background:#eef2f7}tr.fail td.r{color:#c62828;font-weight:600}
tr.pass td.r{color:#2e7d32;font-weight:600}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
pre{background:#1f2430;color:#e6e9ef;padding:10px 12px;border-radius:6px;overflow-x:auto;
 white-space:pre-wrap;word-break:break-all}
ul.fixes{margin:6px 0 0 0;padding-left:20px}li.applied{font-weight:600;color:#2e7d32}
dl.ev{display:grid;grid-template-columns:repeat(3,max-content minmax(0,1fr));gap:2px 14px;
 margin:8px 0;font-size:13px}
dl.ev dt{color:#5b6577}dl.ev dd{margin:0;font-family:ui-monospace,monospace;
 overflow-wrap:anywhere}
.plotbox{position:relative}.plotbox .col{position:absolute}.plotbox .col:hover{background:rgba(31,119,180,.12)}
img.plot{display:block;width:100%;border:1px solid #dde3ec;border-radius:8px;background:#fff}
.flag{color:#b23c17;font-weight:600}
.margin{font-size:15px;margin:6px 0 6px 4px}
details{background:#fff;border:1px solid #dde3ec;border-radius:8px;padding:8px 14px;margin:12px 0}
details summary{cursor:pointer;font-weight:600}
img.plot.narrow{max-width:820px}
td.num{text-align:right;white-space:nowrap}
"""


def e(value: object) -> str:
    """Text for HTML: escaped, and (a model's names being hostile) every control or bidi
    character shown as `\x1b`, `\u202e`, ... so nothing reorders or hides what is shown."""
    return html.escape(shown_text(value), quote=True)


def e_lines(text: str) -> str:
    """A block of lines (a command, a snippet) for a <pre>: `e` line by line."""
    return "\n".join(e(line) for line in text.split("\n"))


def render_html(result: RunResult, png: bytes | None, columns: Sequence[Column] = (),
                tradeoff: bytes | None = None) -> str:
    """The page leads with what a person decides on (the verdict, the margin, the trade-off,
    the plan by module); node lists sit collapsed, each in one place only."""
    ok = result.verdict in ("fixed", "fp16_ok")
    body = [f"<h1>trtbisect report: {e(Path(result.model_path).name)}</h1>",
            f"<div class='verdict {'ok' if ok else 'bad'}'>{e(verdict_line(result))}</div>"]
    body += [f"<p class='margin'>{e(line)}</p>" for line in margin_lines(result)]
    if tradeoff is not None:
        body += ["<h2>Error against estimated cost</h2>", f"<p class='muted'>{e(TRADEOFF_NOTE)}</p>",
                 "<img class='plot narrow' alt='error against estimated cost' "
                 f"src='data:image/png;base64,{base64.b64encode(tradeoff).decode()}'>"]
    body += _html_plan_groups(result)
    body += _html_groups(result)
    body += html_table("FP16-safe rewrites applied", REWRITE_HEAD, rewrite_rows(result))
    body += html_table("Error per output", *output_table(result))
    body += html_table("Margin against the spread of what the tools compute", MARGIN_HEAD,
                        margin_rows(result))
    body += html_table("Criteria that may fit better", HINT_HEAD, hint_rows(result))
    if png is not None:
        hover = "".join(f"<span class='col' title='{e(t)}' style='left:{x:.3f}%;top:{y:.3f}%;"
                        f"width:{w:.3f}%;height:{h:.3f}%'></span>" for t, x, y, w, h in columns)
        body += ["<h2>Magnitude and error along the graph</h2>",
                 "<div class='plotbox'><img class='plot' alt='per-tensor magnitude and FP16 error' "
                 f"src='data:image/png;base64,{base64.b64encode(png).decode()}'>{hover}</div>",
                 "<div class='muted'>Hover over the plot for each tensor's name and numbers.</div>"]
    body += _html_culprits(result)
    body += _html_stability(result)
    body += _html_trace(result)
    body += _html_commands(result)
    return html_page(e(Path(result.model_path).name), body, _facts_text(result))


def html_page(title: str, body: Sequence[str], facts: Sequence[str]) -> str:
    """A whole report page: `body` (HTML lines), then the run's facts (text, escaped here)
    under "Run"; `title` is HTML already."""
    run = ["<h2>Run</h2>", "<div class='muted'>" + "<br>".join(e(f) for f in facts) + "</div>"]
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>trtbisect: {title}</title><style>{CSS}</style>"
            "</head><body><main>" + "\n".join([*body, *run]) + "</main></body></html>\n")


def _html_groups(result: RunResult) -> list[str]:
    """One card per culprit group; of groups with the same cause and pattern, the first is
    shown and the others sit collapsed under it."""
    groups = groups_of(result)
    out = ["<h2>Diagnosis</h2>"] if groups else []
    kinds: dict[tuple, list[int]] = {}
    for k, g in enumerate(groups):
        kinds.setdefault((g.cause, g.pattern), []).append(k)
    cards = _html_cards(groups)
    for (cause, pattern), members in kinds.items():
        out.append(cards[members[0]])
        if len(members) > 1:
            what = f"{cause}, {pattern}" if pattern else str(cause)
            out += [f"<details><summary>{len(members) - 1} more {e(what)} group"
                    f"{'s' if len(members) > 2 else ''}</summary>",
                    *(cards[k] for k in members[1:]), "</details>"]
    return out


def _html_cards(groups: Sequence[CulpritGroup]) -> list[str]:
    out = []
    for k, g in enumerate(groups):
        tags = f"<span class='tag cause'>{e(g.cause)}</span>" + (
            f"<span class='tag'>{e(g.pattern)}</span>" if g.pattern else "")
        ev = "".join(f"<dt>{e(a)}</dt><dd>{e(b)}</dd>" for a, b in evidence_items(g))
        fixes = "".join(f"<li class='{'applied' if a else ''}'>{'✔ applied by the plan: ' if a else ''}"
                        f"{e(t)}</li>" for a, t in fix_lines(g))
        count = len(g.nodes)
        where = f"{g.scope}, " if g.scope else ""
        out.append(f"<div class='card'><div>{tags}<b>Group {k + 1}</b> "
                   f"<span class='muted'>{e(where)}{e(plural(count, 'node'))} (listed under "
                   "“Every node of the plan”)</span></div>"
                   f"<p>{e(g.summary)}</p>" + (f"<dl class='ev'>{ev}</dl>" if ev else "")
                   + (f"<b>Fixes</b><ul class='fixes'>{fixes}</ul>" if fixes else "") + "</div>")
    return out


def _html_plan_groups(result: RunResult, top: int = DEFAULT_TOP) -> list[str]:
    """The plan by module: the `top` costliest rows, the rest collapsed below them."""
    title, head, rows = plan_group_table(result)
    if not rows:
        return []
    out = html_table(title, head, rows[:top])
    if len(rows) > top:
        out += [f"<details><summary>{len(rows) - top} more rows</summary>",
                *html_table("", head, rows[top:]), "</details>"]
    return out


def _html_culprits(result: RunResult) -> list[str]:
    """Every node of the plan, collapsed: the one place the page lists them."""
    head, rows = culprit_rows(result)
    if not rows:
        return []
    nodes = sum(1 for r in rows if r[0] != "(boundary Casts)")  # the Casts' row is no node
    return [f"<details><summary>Every node of the plan ({nodes})</summary>",
            *html_table("", head, rows), "</details>"]


def html_table(title: str, head: Sequence[str], rows: Sequence[Sequence[object]],
                result_col: int | None = None) -> list[str]:
    """A table; `result_col` holds "pass"/"fail", which colours its cell."""
    if not rows:
        return []
    ths = "".join(f"<th>{e(h)}</th>" for h in head)
    trs = "".join(
        f"<tr class='{e(row[result_col]) if result_col is not None else ''}'>" +
        "".join(f"<td class='{'r' if j == result_col else ''}'>{e(v)}</td>"
                for j, v in enumerate(row)) + "</tr>" for row in rows)
    return ([f"<h2>{e(title)}</h2>"] if title else []) + [f"<table><tr>{ths}</tr>{trs}</table>"]


def _html_trace(result: RunResult) -> list[str]:
    rows = trace_rows(result)
    if not rows:
        return []
    total = len(result.search.trials) if result.search else 0
    note = (f"<p class='muted'>First {TRACE_ROWS} of {total} evaluations; trace.json has all."
            "</p>" if total > TRACE_ROWS else "")
    shown_rows = [(*row[:4], row[5]) for row in rows]  # which units: trace.json (the plan's
    # are listed once)
    return [f"<details><summary>Search trace ({plural(total, 'evaluation')})</summary>",
            *html_table("", ["#", "phase", "FP32 units (TensorRT layers)", "result",
                              "why it failed"], shown_rows, result_col=3), note, "</details>"]


def _html_stability(result: RunResult) -> list[str]:
    st = result.stability
    if st is None:
        return []
    rows = _stability_rows(st)
    flags = "".join(f"<li class='flag'>{e(f)}</li>" for f in st.flags) or \
        "<li>no plan flips or sits within the noise</li>"
    return ["<h2>Stability</h2>", f"<p class='muted'>{e(st.method)}; deterministic reruns: "
            f"{e(st.deterministic)}</p><ul>{flags}</ul>"] + html_table("", STABILITY_HEAD, rows)


def _html_commands(result: RunResult) -> list[str]:
    rows = command_rows(result)
    if not rows:
        return []
    return ["<h2>Apply the plan</h2>", "<p class='muted'>commands.sh in the run's folder holds "
            "every one of them.</p>"] + [f"<details><summary>{e(t)}</summary><pre>{e_lines(c)}"
                                         "</pre></details>" for t, c in rows]
