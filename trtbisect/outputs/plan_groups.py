"""The plan as a person reads it: its nodes grouped by PyTorch module (else by TensorRT
layer), one row per group, biggest estimated cost first (issue #37).

A 250-node plan listed node by node fills a thousand terminal lines and a report no one
scrolls; grouped, the same plan is a dozen rows that say where the FP32 time goes and why.
The full list stays in precision.json ("fp32_nodes", "culprits") and layer_precisions.txt.
The console and report.html both read these rows; the cost of a row is the sum of the
existing cost result's per-unit shares (precision.json "cost"), each unit counted once.

Pure: reads a RunResult (or anything with its `culprits` and `extra`), no runtime.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..search.cost import CostRecord

DEFAULT_TOP = 10  # rows `run` shows unless --top N or --all
OPS_WIDTH = 24  # characters of the ops cell: a row fits one line of an 80-column terminal


@dataclass
class PlanGroup:
    """Culprits of one module (or, without module names, of one TensorRT layer)."""

    label: str  # the module path, or the layer's first node
    by_module: bool
    nodes: list[str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)  # one per node, graph order
    units: list[str] = field(default_factory=list)  # TensorRT layers (search units) it holds
    share: float | None = None  # what keeping it FP32 adds to all-FP16's estimated time
    diagnoses: list[int] = field(default_factory=list)  # 1-based, as `diagnosis_lines` numbers

    def ops_text(self, width: int | None = OPS_WIDTH) -> str:
        """`Mul x2, Add x2, Pow, +3 more`: each op once with its count, the commonest first
        (then graph order), cut to about `width` characters (None: all of them) so a row
        stays one line."""
        counts: dict[str, int] = {}
        for op in self.ops:
            counts[op] = counts.get(op, 0) + 1
        words = [op if n == 1 else f"{op} x{n}"
                 for op, n in sorted(counts.items(), key=lambda kv: -kv[1])]
        if width is None or len(", ".join(words)) <= width:
            return ", ".join(words)
        kept: list[str] = []
        for w in words:
            if len(", ".join([*kept, w])) + len(", +99 more") > width and kept:
                break
            kept.append(w)
        return ", ".join([*kept, f"+{len(words) - len(kept)} more"])

    @property
    def nodes_text(self) -> str:
        layers = len(self.units)
        return f"{len(self.nodes)}" + (f" ({plural(layers, 'layer')})"
                                        if layers != len(self.nodes) else "")


def unit_shares(cost: CostRecord | None) -> dict[str, float]:
    """Unit (TensorRT layer or node) -> its share of all-FP16's estimated time, from the
    cost result as written (precision.json "cost" "units"); {} when there is none."""
    out: dict[str, float] = {}
    for unit, v in (cost.units if cost is not None else {}).items():
        if isinstance(v.share, (int, float)) and math.isfinite(v.share):
            out[unit] = float(v.share)
    return out


class Diagnosed(Protocol):
    """What the rows read of a culprit group (diagnosis/diagnose.CulpritGroup, a layer
    above: read by attribute, not imported)."""

    @property
    def nodes(self) -> Sequence[str]: ...
    @property
    def cause(self) -> str: ...
    @property
    def pattern(self) -> str | None: ...


def diagnosis_keys(groups: Sequence[Diagnosed]) -> list[tuple]:
    """The culprit groups folded by what their paragraph says (cause and pattern): the
    distinct keys in first-seen order."""
    return list(dict.fromkeys(_key(g) for g in groups))


def _key(g: Diagnosed) -> tuple:
    return (g.cause, g.pattern)


def plan_groups(result: Any) -> list[PlanGroup]:
    """The plan's culprits grouped, costliest first (then most nodes, then graph order)."""
    culprits = list(getattr(result, "culprits", []) or [])
    shares = unit_shares(getattr(result, "cost", None))
    by_module = any(c.module for c in culprits)
    diag: list[Diagnosed] = list(getattr(result, "culprit_groups", None) or [])
    keys = diagnosis_keys(diag)
    number = {n: keys.index(_key(g)) + 1 for g in diag for n in g.nodes}
    groups: dict[str, PlanGroup] = {}
    counted: set[str] = set()
    for c in culprits:
        unit = c.layer or c.node
        label = (c.module if by_module and c.module else None) or unit
        grp = groups.get(label)
        if grp is None:
            grp = groups[label] = PlanGroup(label if label != unit else c.node,
                                            by_module and bool(c.module))
        grp.nodes.append(c.node)
        grp.ops.append(c.op)
        if unit not in grp.units:
            grp.units.append(unit)
        if unit not in counted and unit in shares:  # a unit's price once, where it starts
            counted.add(unit)
            grp.share = (grp.share or 0.0) + shares[unit]
        k = number.get(c.node)
        if k is not None and k not in grp.diagnoses:
            grp.diagnoses.append(k)
    order = {id(g): i for i, g in enumerate(groups.values())}
    return sorted(groups.values(), key=lambda g: (-(g.share or 0.0), -len(g.nodes),
                                                   order[id(g)]))


def cause_text(g: PlanGroup, diag: Sequence[Diagnosed]) -> str:
    """`1. overflow`: the numbered diagnosis paragraph(s) the group's nodes belong to."""
    keys = diagnosis_keys(diag)
    return ", ".join(f"{k}. {keys[k - 1][0]}" for k in sorted(g.diagnoses)) or "-"


def kinds_text(g: PlanGroup, diag: Sequence[Diagnosed]) -> str:
    """`overflow, layernorm_decomposed`: the cause and pattern of the group's nodes in words
    (the report, where the diagnosis cards are numbered per group, not per kind)."""
    keys = diagnosis_keys(diag)
    return "; ".join(", ".join(str(part) for part in keys[k - 1] if part)
                     for k in sorted(g.diagnoses)) or "-"


def rest_text(rest: Sequence[PlanGroup], shown: str = "row") -> str:
    """What the rows left out hold, in one line."""
    nodes = sum(len(g.nodes) for g in rest)
    total = sum(g.share or 0.0 for g in rest)
    from ..search.cost import pct

    price = f", {pct(total)} together" if any(g.share is not None for g in rest) else ""
    return (f"... and {plural(len(rest), 'more ' + shown)} ({plural(nodes, 'node')}{price})")


def plural(n: int, word: str) -> str:
    """`1 evaluation`, `2 evaluations`."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def has_plan(result: Any) -> bool:
    """A plan (FP32 nodes, or a kept rewrite) was written and judged, so "with the plan" has
    numbers of its own; not for fp16_ok (nothing to apply) or no_plan (nothing written)."""
    verdict = result.verdict
    if verdict == "partial":
        verdict = result.partial.judged_verdict if result.partial is not None else verdict
    # fragile and unvalidated plans are written and judged too: their own errors are shown
    return verdict in ("fixed", "over_budget", "fragile", "unvalidated")


def search_words(result: Any) -> str:
    """`5 evaluations (5 inferences), certified 1-minimal`: minimality said only of a plan
    that has something to be minimal about."""
    words = (f"{plural(result.evaluations, 'evaluation')} "
             f"({plural(result.inferences, 'inference')})")
    if result.fp32_nodes:
        words += ", certified 1-minimal" if result.one_minimal else ", not certified minimal"
    return words


def layers_words(result: Any) -> str:
    """` (3 TensorRT layers)` after a node count, when the plan's layers (the search's units,
    layer_precisions.txt's entries) are fewer than its nodes; "" otherwise."""
    layers = getattr(result, "fp32_layers", None)
    n = len(layers) if isinstance(layers, list) else 0
    return f" ({plural(n, 'TensorRT layer')})" if n and n != len(result.fp32_nodes) else ""
