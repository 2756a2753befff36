"""What `--report` on a quantized run draws from, below the report itself: the verdict's
words, and the trade-off plot's points (every plan the search evaluated: estimated engine
time against worst relative error, the all-quantized point, the file as given, and the
all-FP16 engine's time marked), drawn by report.py's `plot_tradeoff` handed in. The pages
(report.html, report.md) are quant/pages.py's: it sits beside report.py, above the run."""

from __future__ import annotations

import math
from collections.abc import Callable

NAME = "report_tradeoff.png"


def verdict_line(result) -> str:
    """The verdict in rich markup (the console prints it; the report pages strip the markup)."""
    meet = "the criteria" if "default" not in result.criteria.describe() else "the tolerance"
    n, total = len(result.plan), len(result.layers)
    return {"quantized_ok": f"[green]the quantized model already meets {meet}[/] ({total} "
                            "quantized layers)",
            "fixed": f"[green]fixed[/] by running {n} of {total} quantized layers un-quantized "
                     "(their Q/DQ removed)" + (
                         f" and keeping {len(result.fp32_nodes)} of {result.half_nodes} FP16 "
                         "nodes in FP32" if result.fp32_nodes else ""),
            "no_plan": f"[red]no plan meets {meet}[/]",
            "fragile": f"[yellow]fragile[/]: the plan ({n} of {total} layers un-quantized) meets "
                       f"{meet} by less than the spread of what the tools compute",
            "unvalidated": f"[yellow]unvalidated[/]: the plan ({n} of {total} layers "
                           f"un-quantized) meets {meet} on its search samples, not on the "
                           "samples it never saw",
            "reference_invalid": "[red]the reference is already non-finite[/]"}[result.verdict]


def rounding_words(result) -> str:
    """Where the FP16 side of the file rounds, as the console and the pages say it."""
    return ("rounded per node: --semantics strict" if result.semantics == "strict"
            else "rounded once per fused TensorRT layer: --semantics trt")


def worst_rel(errors) -> float:
    """A verdict's worst relative error (NaN where nothing was measured)."""
    rels = [float(e.rel) for e in errors.values()]
    return max(rels) if rels else math.nan


def tradeoff_points(result) -> tuple[list, tuple | None, tuple | None]:
    """(estimated us, worst relative error, passed) for the file as given and every plan the
    search evaluated, the written plan's point, and the all-quantized point."""
    c = result.cost
    if c is None or not c.all_quantized_s or result.before is None:
        return [], None, None
    given = (1e6 * c.all_quantized_s, worst_rel(result.before.errors), result.before.passed)
    points = [given]
    chosen = None
    plan = set(result.units)
    for t in result.trials:
        if t.price is None:
            continue
        p = (1e6 * t.price, math.nan if t.score is None else float(t.score), t.passed)
        points.append(p)
        if set(t.fp32) == plan and plan:
            chosen = p
    return points, chosen, given


def tradeoff_png(result, rtol: float, default: bool, plot_tradeoff: Callable) -> bytes | None:
    """The plot (None: fewer than two points, e.g. the file passes as given); `default`: the
    run judges by trtbisect's default criterion (else the limit drawn is a severity of 1)."""
    points, chosen, given = tradeoff_points(result)
    if len(points) < 2 or given is None:
        return None
    c = result.cost
    marks = [(1e6 * c.all_fp16_s, "all FP16 (Q/DQ removed)"),
             (given[0], f"all quantized ({c.format.upper()}, the file as given)")]
    return plot_tradeoff(points, chosen, rtol if default else 1.0, None,
                         f"estimated engine time on {c.title} (us)",
                         marks=marks)
