"""The diagnosis's model fixes, checked against what `run --rewrite` can do (issue #37).

A fix the diagnosis recommends ("divide x by a power of two before squaring", "re-export at
opset 17") and the rewrite catalogue (rewrites/) are two views of one remedy. Advice that
`--rewrite` then refuses, with no word of why, sends the user round in circles. So each fix
that a rewrite implements says, for this model and this group of nodes: `--rewrite` matches
it here; or it was tried and refused, and why; or its rule does not match this form (the
user has to change the source). The words go into the fix, its group's summary and a
"rewrite" record beside the fix in precision.json.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..rewrites.driver import RewritesRecord
from .diagnose import CulpritGroup
from .wording import RewriteAdvice

log = logging.getLogger(__name__)

# fix kind (wording.py) -> the rewrites (rewrites/) that apply it, most exact first
FIX_REWRITES: dict[str, tuple[str, ...]] = {
    "reexport_opset17": ("fuse_layernorm",),
    "fuse_layernorm": ("fuse_layernorm",),
    "prescale_norm": ("scale_before_square", "fuse_rmsnorm"),
    "scale_before_matmul": ("prescale_attention",),
    "clamp_mask_fill": ("clamp_mask_constant",),
    "mean_before_sum": ("reducesum_to_mean",),
    "raise_eps": ("raise_epsilon",),
}


def advise(groups: Sequence[CulpritGroup], record: RewritesRecord | None, ctx: Any,
           stats: Mapping[str, Any]) -> list[CulpritGroup]:
    """Every culprit group's rewritable fixes checked against this model (pipeline, after
    the diagnosis): the run's --rewrite `record` when it tried them, else the rules' own
    match. Returns the groups, advised as new records (as they were where nothing is
    checked)."""
    wanted = {r for g in groups for f in g.fixes for r in FIX_REWRITES.get(f.kind, ())}
    if not wanted:
        return list(groups)
    found: tuple[list, list] | None = ([], [])
    if record is None:
        found = _find(ctx, stats, wanted)
        if found is None:
            return list(groups)
    return [advise_group(g, record, *(found or ([], []))) for g in groups]


def _find(ctx: Any, stats: Mapping[str, Any], wanted: set[str]) -> tuple[list, list] | None:
    """Matches and refusals of the wanted rules on the model as given (None: too large to
    look at, as --rewrite itself would not)."""
    from ..rewrites.driver import REWRITE_WEIGHT_LIMIT, find_all
    from ..rewrites.rules import rewrites_for

    if ctx.graph.weights.total_bytes() > REWRITE_WEIGHT_LIMIT:
        return None
    rules = [r for r in rewrites_for(ctx.rules.precision.narrow_range) if r.name in wanted]
    ranges = {t: s.fp32_absmax for t, s in stats.items()}
    try:
        return find_all(ctx.graph.materialize(), ranges.get, rules)
    except Exception as exc:  # advice is best effort: the plan stands without it
        log.info("checking the fixes against the rewrites failed: %s", exc)
        return None


def advise_group(group: CulpritGroup, record: RewritesRecord | None, matches: Sequence = (),
                 refusals: Sequence = ()) -> CulpritGroup:
    """The group with words and a record for each of its fixes that a rewrite implements
    (a new record; `group` is left as it is)."""
    nodes = set(group.nodes)
    fixes, summary = [], group.summary
    for fix in group.fixes:
        rules = FIX_REWRITES.get(fix.kind)
        if not rules or fix.rewrite is not None:
            fixes.append(fix)
            continue
        verdict = (_from_record(record, rules, nodes) if record is not None
                   else _from_rules(rules, nodes, matches, refusals))
        text = f"{fix.text} ({verdict.words})"
        fixes.append(replace(fix, text=text, rewrite=verdict))
        summary = summary.replace(fix.text, text, 1)
    return replace(group, fixes=fixes, summary=summary)


def _touches(where: Iterable[str], nodes: set[str]) -> bool:
    return bool(nodes & set(where))


def _from_rules(rules: Sequence[str], nodes: set[str], matches: Sequence,
                refusals: Sequence) -> RewriteAdvice:
    for rule in rules:
        if any(m.rewrite == rule and _touches(m.where, nodes) for m in matches):
            return RewriteAdvice(rule, "matches",
                                 f"`run --rewrite` can do this here: {rule}, kept only if it "
                                 "helps all FP16 pass")
    for rule in rules:
        r = next((r for r in refusals if r.rewrite == rule and _touches(r.where, nodes)), None)
        if r is not None:
            return RewriteAdvice(rule, "refused",
                                 f"`run --rewrite` cannot do it here: {rule}: {r.reason}",
                                 r.reason)
    return RewriteAdvice(rules[0], "no_match",
                         f"no `--rewrite` rule ({', '.join(rules)}) matches this form of it: "
                         "change the source")


def _from_record(record: RewritesRecord, rules: Sequence[str],
                 nodes: set[str]) -> RewriteAdvice:
    """The run's own --rewrite attempts (precision.json "rewrites")."""
    for r in record.refused:
        if r.rewrite in rules and _touches(r.where, nodes):
            return RewriteAdvice(r.rewrite, "refused",
                                 f"--rewrite tried {r.rewrite} here and refused it: "
                                 f"{r.reason}", r.reason)
    return RewriteAdvice(rules[0], "no_match",
                         f"--rewrite found no {' or '.join(rules)} match here: change the "
                         "source")
