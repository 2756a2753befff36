"""`--report` for a quantized run: the trade-off plot of every plan the search evaluated
(estimated engine time against worst relative error), drawn by report.py's `plot_tradeoff`
(handed in by quant/console.py: a lower module never imports the report), with the
all-quantized point (the file as given) and the all-FP16 engine's time marked."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

NAME = "report_tradeoff.png"


def worst_rel(errors) -> float:
    """A verdict's worst relative error (NaN where nothing was measured)."""
    rels = [float(e.rel) for e in errors.values()]
    return max(rels) if rels else math.nan


def tradeoff_points(result) -> tuple[list, tuple | None, tuple | None]:
    """(estimated us, worst relative error, passed) for the file as given and every plan the
    search evaluated, the written plan's point, and the all-quantized point."""
    c = result.cost or {}
    if not c.get("all_quantized_s") or result.before is None:
        return [], None, None
    given = (1e6 * c["all_quantized_s"], worst_rel(result.before.errors), result.before.passed)
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
    marks = [(1e6 * c["all_fp16_s"], "all FP16 (Q/DQ removed)"),
             (given[0], f"all quantized ({c['format'].upper()}, the file as given)")]
    return plot_tradeoff(points, chosen, rtol if default else 1.0, None,
                         f"estimated engine time on {c['title']} (us)",
                         marks=marks)


def write(result, out_dir: Path, draw: Callable) -> str | None:
    """Write the plot `draw(result)` gives (None: nothing to draw) into --out, inside the
    run's generation; its path, or None."""
    from ..outputs.files import atomic_write

    png = draw(result)
    if png is None:
        return None
    path = out_dir / NAME

    def save(tmp: str) -> None:
        Path(tmp).write_bytes(png)
    atomic_write(path, save)
    return str(path)
