"""Why a culprit fails: its cause class, the numbers that prove it, and the fixes.

A list of node names is not an answer. detect.py reads the evidence (cause class, pattern and
numbers) for each group of culprits connected through data flow; wording.py says, in the words
a deployment engineer uses, what goes wrong and what to do about it. This module puts the two
together for the pipeline: `diagnose`, `diagnose_plan`, `note_semantics`, and `annotate` (Netron).

Pure: numpy and onnx only, no runtime.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import onnx

from ..graph import Graph, walk, with_node_names
from ..graph.modules import module_label
from ..judge.compare import OutputError, TensorStats, Tolerance
from ..judge.criteria import Criteria
from ..judge.precision import FP16, Precision
from ..search.prior import ConstantStats
from .detect import detect, group_culprits, scope_of
from .facts import Evidence, Facts
from .wording import Fix, fixes_for, node_why, num, pct, summarize

# Names others import from here (group_culprits, Fix; num and pct for the report).
__all__ = ["CulpritGroup", "Fix", "annotate", "diagnose", "diagnose_plan", "group_culprits",
           "note_semantics", "noted_culprits", "num", "pct"]


PER_NODE_ROUNDING = "per_node_rounding_only"  # note_semantics's group: no FP32 needed


@dataclass(frozen=True)
class CulpritGroup:
    """Culprits connected through data flow, with one diagnosis for all of them (a run's
    `culprit_groups`, with its evidence as precision.json writes it: `as_written`). New words
    make a new record (dataclasses.replace): advice.py's, note_semantics's."""

    nodes: list[str]
    cause: str
    pattern: str | None
    evidence: Evidence
    summary: str
    fixes: list[Fix]
    applied_fix: str | None
    scope: str | None = None
    # per node, for Culprit.why (precision.json has it in "culprits", not here)
    why: dict[str, str] = field(default_factory=dict, compare=False)

    def to_json(self) -> dict:
        d = {"nodes": list(self.nodes), "scope": self.scope, "cause": self.cause,
             "pattern": self.pattern, "evidence": evidence_json(self.evidence),
             "summary": self.summary, "fixes": [f.to_json() for f in self.fixes],
             "applied_fix": self.applied_fix}
        if self.cause == PER_NODE_ROUNDING:  # precision.json has always written its summary
            d["summary"] = d.pop("summary")  # after its (empty) fixes
        return d

    @classmethod
    def from_json(cls, d: Mapping) -> CulpritGroup:
        """Back from precision.json (per-node `why` lives in `culprits`, not here)."""
        return cls(list(d["nodes"]), d["cause"], d.get("pattern"), dict(d["evidence"]),
                   d["summary"], [Fix.from_json(f) for f in d["fixes"]],
                   d.get("applied_fix"), d.get("scope"))

    def as_written(self) -> CulpritGroup:
        """The group with its evidence as precision.json holds it (what a run records, so
        that the console and the reports say the numbers the file says)."""
        return replace(self, evidence=evidence_json(self.evidence))


def evidence_json(evidence: Evidence) -> Evidence:
    """The evidence as precision.json writes it (`_jnum`: 6 digits, inf and NaN as text)."""
    return {k: _jnum(v) for k, v in evidence.items()}


def _jnum(v: float | int | str | None) -> float | int | str | None:
    """JSON has no inf/NaN; and 6 significant digits are plenty for evidence."""
    if isinstance(v, float):
        return float(f"{v:.6g}") if math.isfinite(v) else str(v)
    return v


# ---------------------------------------------------------------- entry points

def diagnose(g: Graph, nodes: Sequence[str], stats: Mapping[str, TensorStats],
             constants: Mapping[str, ConstantStats], applied: bool = True,
             modules: Mapping[str, str | None] | None = None,
             relax: str | None = None, precision: Precision = FP16) -> list[CulpritGroup]:
    """One diagnosis per connected group of `nodes`; `applied`: the plan keeps them FP32;
    `relax`: how to loosen the run's criterion (default: raise --rtol); `precision`: the
    low precision the statistics compare FP32 with (its range and spacing in the evidence)."""
    f = Facts(g, stats, constants, precision)
    if relax is not None:
        f.relax = relax
    return [_diagnose_group(f, grp, applied, modules) for grp in group_culprits(g, nodes)]


def _diagnose_group(f: Facts, group: list[str], applied: bool,
                    modules: Mapping[str, str | None] | None) -> CulpritGroup:
    cause, pattern, ev = detect(f, group)
    fixes = fixes_for(f, group, cause, pattern, ev)
    scope = scope_of(group, modules)
    return CulpritGroup(
        nodes=group, cause=cause, pattern=pattern, evidence=ev,
        summary=summarize(f, group, cause, pattern, ev, fixes, scope), fixes=fixes,
        applied_fix="keep_fp32" if applied else None, scope=scope,
        why={n: node_why(f, n, cause, ev) for n in group})


def diagnose_plan(g: Graph, nodes: Sequence[str], culprits: Sequence[Culprit],
                  stats: Mapping[str, TensorStats], constants: Mapping[str, ConstantStats],
                  applied: bool, relax: str | None,
                  precision: Precision = FP16) -> tuple[list[Culprit], list[CulpritGroup]]:
    """A run's culprit groups, as precision.json writes them (the pipeline's diagnosis):
    `nodes`, the plan's (`applied`: the plan applied "keep_fp32"), or with no plan the
    layer-wise suspects (the prior's seeds, no fix marked applied). Returns the `culprits`,
    each with its group's words for it (`why`), and the groups."""
    modules = {c.node: c.module for c in culprits}
    groups = diagnose(g, nodes, stats, constants, applied=applied, modules=modules,
                      relax=relax, precision=precision)
    whys = {n: w for grp in groups for n, w in grp.why.items()}
    return ([replace(c, why=whys.get(c.node, c.why)) for c in culprits],
            [grp.as_written() for grp in groups])


RTOL_REACH = 5  # beyond 5x the run's rtol, a larger --rtol is no longer an honest fix


def relax_words(result, precision: Precision = FP16) -> str | None:
    """How loosening the run's criterion would shrink the plan, in the numbers all-FP16
    showed: the --rtol that lets every output pass, when it is near the run's; a task
    criterion when it is not; nothing when all FP16 turns outputs non-finite (no tolerance
    covers NaN). None: no outputs judged (the generic words)."""
    return relax_for(getattr(result, "criteria", None),
                     getattr(result, "errors_before", None) or {}, result.tolerance, precision)


def relax_for(crit: Criteria | None, before: Mapping[str, OutputError], tolerance: Tolerance,
              precision: Precision = FP16) -> str | None:
    """`relax_words` of the run's criteria, all-FP16's errors and tolerance."""
    if crit is not None and not crit.default:
        return f"if the outputs' error is acceptable, relax the criterion ({crit.describe()})" \
               ": the plan would need fewer FP32 nodes"
    if not before:
        return None
    if any(e.nonfinite for e in before.values()):
        return ""
    rtol, low = tolerance.rtol, precision.label
    worst = max(before.values(), key=lambda e: e.rel)
    if worst.rel <= RTOL_REACH * max(rtol, 1e-12):
        return (f"if {pct(worst.rel)} of an output's range is acceptable (all {low}'s worst; "
                f"--rtol is {rtol:g}), raise --rtol to {num(worst.rel * 1.01)}: all {low} "
                "would pass")
    return (f"judge by what the task needs (--metric cosine:MIN, topk:K, iou:T:MIN, or "
            f"--check) instead of max|d|: all {low}'s worst error is {pct(worst.rel)} of an "
            f"output's range, {num(worst.rel / max(rtol, 1e-12))}x the --rtol of {rtol:g}")


RANGE_WORDS = ("65504", "non-finite", "flush")


def note_fused(culprits: Sequence[Culprit], units: Mapping[str, Sequence[str]],
               unit_of: Mapping[str, str]) -> list[Culprit]:
    """A node kept in FP32 only because TensorRT fuses it with a culprit into one layer says
    so, instead of its own (small) FP16 error. Returns the culprits, so noted (each in turn,
    a later one reading the words an earlier one was given)."""
    why = {c.node: c.why for c in culprits}

    def ranged(words: str) -> bool:
        return any(w in words for w in RANGE_WORDS)

    for c in culprits:
        unit = units.get(unit_of.get(c.node, ""), ())
        lead = next((n for n in unit if n in why and n != c.node and ranged(why[n])), None)
        if len(unit) > 1 and lead is not None and not ranged(why[c.node]):
            why[c.node] = (f"fused with {lead} into one TensorRT layer, so it runs in that "
                           "layer's precision")
    return [replace(c, why=why[c.node]) for c in culprits]


def note_semantics(groups: Sequence[CulpritGroup], notes: Mapping[str, str],
                   new_group: bool) -> list[CulpritGroup]:
    """Say where the two emulation semantics disagree (docs/semantics.md): each noted node's
    group summary gets the note (its `why`: `noted_culprits`); `new_group`: the nodes
    (culprits only per node, not in the plan) form their own group. Returns the groups (new
    records where noted)."""
    if not notes:
        return list(groups)
    groups = [_noted(grp, notes) for grp in groups]
    if new_group:
        groups.append(CulpritGroup(
            nodes=list(notes), cause=PER_NODE_ROUNDING, pattern=None, evidence={},
            summary="; ".join(f"{n} {w}" for n, w in notes.items())
            + ": no FP32 fallback needed for TensorRT.", fixes=[], applied_fix=None))
    return groups


def noted_culprits(culprits: Sequence[Culprit], notes: Mapping[str, str]) -> list[Culprit]:
    """`note_semantics`'s notes in the noted culprits' `why`."""
    return [replace(c, why=f"{c.why}; {notes[c.node]}") if c.node in notes else c
            for c in culprits]


def _noted(grp: CulpritGroup, notes: Mapping[str, str]) -> CulpritGroup:
    """The group, its summary followed by the notes of its nodes (itself: none noted)."""
    hits = [n for n in grp.nodes if n in notes]
    if not hits:
        return grp
    return replace(grp, summary=f"{grp.summary} " + "; ".join(f"{n} {notes[n]}" for n in hits)
                   + ".")


def annotate(model: onnx.ModelProto, groups: Sequence[CulpritGroup], whys: Mapping[str, str],
             meta: Mapping[str, str] | None = None) -> onnx.ModelProto:
    """A named copy whose culprit nodes carry their diagnosis, so Netron shows it.

    `groups` are a run's culprit groups. The diagnosis goes into each node's doc_string
    (Netron shows it with the node's properties) and, where the IR version has them (>= 10),
    node metadata_props; the model gets a summary in its metadata_props.
    """
    out = with_node_names(model)
    by_name = {n.name: n for n in walk(out.graph.node)}  # subgraphs' nodes too
    for k, grp in enumerate(groups):
        for name in grp.nodes:
            node = by_name.get(name)
            if node is None:
                continue
            node.doc_string = _node_doc(grp, whys.get(name, ""), k)
            if out.ir_version >= 10:
                _set_props(node.metadata_props, {
                    "trtbisect.precision": "fp32", "trtbisect.cause": grp.cause,
                    "trtbisect.pattern": grp.pattern or "",
                    "trtbisect.group": str(k + 1)})
    _set_props(out.metadata_props, dict(meta or {}))
    return out


def _node_doc(grp: CulpritGroup, why: str, k: int) -> str:
    pattern = f", {grp.pattern}" if grp.pattern else ""
    head = "keep FP32" if grp.applied_fix else "suspect"
    return f"trtbisect: {head} ({grp.cause}{pattern}, group {k + 1}). {why}. {grp.summary}"


def _set_props(props, values: Mapping[str, str]) -> None:
    existing = {p.key: p for p in props}
    for key, value in values.items():
        if key in existing:
            existing[key].value = value
        else:
            props.add(key=key, value=value)


# ---------------------------------------------------------------- one line per culprit

@dataclass(frozen=True)
class Culprit:
    node: str
    op: str
    why: str
    module: str | None = None
    layer: str | None = None  # the fused TensorRT layer it belongs to (trt semantics)

    def to_json(self) -> dict:
        d = {"node": self.node, "op": self.op, "why": self.why}
        if self.module:
            d["module"] = self.module
        if self.layer:
            d["layer"] = self.layer
        return d


def explain(g: Graph, fp32_nodes: Sequence[str], stats: Mapping[str, TensorStats],
            constants: Mapping[str, ConstantStats],
            layers: Mapping[str, str] | None = None,
            precision: Precision = FP16) -> list[Culprit]:
    """A one-line reason per culprit from the layer-wise numbers (`diagnose_plan` goes deeper);
    `layers`: node -> the TensorRT-style fused layer computing it."""
    out = []
    for name in fp32_nodes:
        node = g.node(name)
        layer = (layers or {}).get(name)
        own = g.own_name(name) if g.is_inner(name) else node.name  # without its holders
        out.append(Culprit(name, node.op_type, _why(g, name, stats, constants, precision),
                           module_label(own, g.model),  # PyTorch's name, when known
                           layer if layer != name else None))
    return out


def _why(g: Graph, name: str, stats: Mapping[str, TensorStats],
         constants: Mapping[str, ConstantStats], p: Precision = FP16) -> str:
    top, low = p.max_text, p.label
    for t in g.float_outputs(name):
        s = stats.get(t)
        if s is not None and (s.fp32_absmax > p.max or s.overflow):
            return f"output max {s.fp32_absmax:.3g} > {top}"
    for t in g.float_inputs(name):
        c = constants.get(t)
        if c is not None and c.overflow:
            return f"constant {t!r} holds {c.absmax:.3g}, beyond {low}'s {top}"
        s = stats.get(t)
        if s is not None and (s.fp32_absmax > p.max or s.overflow):
            return f"reads {t!r} of max {s.fp32_absmax:.3g} > {top}"
    for t in [*g.float_inputs(name), *g.float_outputs(name)]:
        c, s = constants.get(t), stats.get(t)
        if c is not None and c.flushed:
            return f"constant {t!r} has {c.flushed} value(s) that {low} flushes to zero"
        if c is not None and c.raised:
            return f"constant {t!r} has {c.raised} value(s) below {low}'s smallest subnormal " \
                   f"that TensorRT's {low} conversion raises to {p.tiny:.3g}".replace("e-0", "e-")
        if s is not None and s.flushed:
            return f"{t!r}: {s.flushed} of {s.size} values flush to zero in {low}"
    for t in g.float_outputs(name):
        s = stats.get(t)
        if s is not None and s.new_nonfinite:
            return f"output turns non-finite in {low} ({s.fp16_nonfinite} values)"
        if s is not None:
            entering = max((stats[i].rel_err for i in g.float_inputs(name) if i in stats),
                           default=0.0)
            if s.rel_err > 1.05 * entering:
                return (f"{low} error grows here from {entering:.2g} to {s.rel_err:.2g} of "
                        "the tensor's range")
            return (f"{low} error {s.rel_err:.2g} of the tensor's range here ({entering:.2g} "
                    "where its inputs enter)")
    return "needed by the tolerance"
