"""The criterion flags, shared by `run`, `compare`, `check` and `torch` (one click decorator),
and their parsing into `Criteria`.

Per-output values follow Polygraphy's `[OUTPUT:]VALUE` (split at the last ':', so an output
name may hold ':'). A metric's arguments are numbers, so `[OUTPUT:]METRIC[:ARG...]` is read
from the right: the trailing numeric fields are the arguments, the field before them the
metric, and everything before that (':' included) the output.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence

import click

from ..base.flags import apply_flags
from ..errors import TrtBisectError
from . import metrics as _metrics  # noqa: F401  (registers the metrics)
from .criteria import REGISTRY, Criteria, Criterion
from .hooks import HOOK_HELP, load_hook
from .stats import DEFAULT_QUANTILE, STAT_ENTRIES, STATISTICS

STAT_HELP = ("Judge an output by one of Polygraphy's error statistics instead of trtbisect's "
             "max|d| <= rtol*max|ref| + atol: max, mean, median, quantile or elemwise, "
             "meaning what they mean in Polygraphy 0.53 (a statistic fails when both its "
             "|d| exceeds --atol and its |d|/|ref| exceeds --rtol, relative to each reference "
             "element). [OUTPUT:]STAT, repeatable, e.g. --check-error-stat quantile or "
             "--check-error-stat logits:mean. See docs/criteria.md.")
QUANTILE_HELP = ("The quantile for --check-error-stat quantile, in [0, 1] (Polygraphy's "
                 f"default {DEFAULT_QUANTILE}). [OUTPUT:]Q, repeatable, e.g. --error-quantile 0.999.")


def criteria_options(f: Callable) -> Callable:
    """The criterion flags every judging command shares."""
    opts = [
        click.option("--check-error-stat", "check_error_stat", multiple=True,
                     metavar="[OUTPUT:]STAT", help=STAT_HELP),
        click.option("--error-quantile", "error_quantile", multiple=True, metavar="[OUTPUT:]Q",
                     help=QUANTILE_HELP),
        click.option("--metric", "metrics", multiple=True, metavar="[OUTPUT:]METRIC:ARGS",
                     help="Judge an output by task-level agreement instead of its max error: "
                          + "; ".join(f"{e.syntax}: {e.summary}" for e in REGISTRY.values()
                                      if e.family == "metric")
                          + ". Repeatable; with an OUTPUT: prefix for one output, e.g. "
                            "--metric logits:topk:1. See docs/criteria.md."),
        click.option("--check", "checks", multiple=True, metavar="FILE.py[:FUNCTION]",
                     help=HOOK_HELP),
        click.option("--pass-rate", "pass_rate", type=click.FloatRange(0, 1, min_open=True),
                     default=1.0, show_default=True,
                     help="Fraction of the samples a plan must pass the criteria on "
                          "(1: every sample), e.g. --pass-rate 0.98."),
    ]
    return apply_flags(f, opts)


def pop_criteria(kw: dict) -> Criteria:
    """The criteria given by `criteria_options`' values in `kw` (removed from it)."""
    return parse_criteria(kw.pop("check_error_stat", ()), kw.pop("error_quantile", ()),
                          kw.pop("metrics", ()), kw.pop("checks", ()), kw.pop("pass_rate", 1.0))


def parse_criteria(stats: Sequence[str] = (), quantiles: Sequence[str] = (),
                   metrics: Sequence[str] = (), checks: Sequence[str] = (),
                   pass_rate: float = 1.0) -> Criteria:
    """Flags -> Criteria; a bad value is a TrtBisectError naming the flag."""
    items = [_stat(s) for s in stats] + [parse_metric(m) for m in metrics]
    qs = tuple(_quantile(q) for q in quantiles)
    if qs and not any(c.entry.name == "quantile" for c in items):
        raise TrtBisectError("--error-quantile has no effect without --check-error-stat "
                             "quantile (for the same outputs)")
    if not (0 < pass_rate <= 1) or math.isnan(pass_rate):
        raise TrtBisectError(f"--pass-rate {pass_rate}: give a fraction in (0, 1]")
    hooks = tuple(load_hook(spec) for spec in checks)
    return Criteria(tuple(items), hooks, float(pass_rate), qs)


def _split_output(spec: str) -> tuple[str | None, str]:
    """Polygraphy's `[OUTPUT:]VALUE`: split at the last ':'."""
    key, sep, value = spec.rpartition(":")
    return (key if sep else None), value


def _stat(spec: str) -> Criterion:
    output, stat = _split_output(spec)
    if stat not in STATISTICS:
        raise TrtBisectError(f"--check-error-stat {spec!r}: unknown statistic {stat!r}; "
                             f"Polygraphy's are {', '.join(STATISTICS)}")
    if output == "":
        raise TrtBisectError(f"--check-error-stat {spec!r}: empty output name")
    entry = STAT_ENTRIES[stat]
    return Criterion(entry, entry.parse(()), output, stat)


def _quantile(spec: str) -> tuple[str, float]:
    output, value = _split_output(spec)
    try:
        q = float(value)
    except ValueError:
        q = math.nan
    if not 0 <= q <= 1:
        raise TrtBisectError(f"--error-quantile {spec!r}: give a quantile in [0, 1], e.g. 0.99")
    return output or "", q


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_metric(spec: str) -> Criterion:
    """`[OUTPUT:]METRIC[:ARG...]` read from the right (the arguments are numbers)."""
    fields = spec.split(":")
    k = len(fields)
    while k > 0 and _number(fields[k - 1]):
        k -= 1
    names = sorted(n for n, e in REGISTRY.items() if e.family == "metric")
    if k == 0 or fields[k - 1] not in REGISTRY or REGISTRY[fields[k - 1]].family != "metric":
        raise TrtBisectError(f"--metric {spec!r}: unknown metric; give one of "
                             + ", ".join(REGISTRY[n].syntax for n in names)
                             + ", with an OUTPUT: prefix for one output")
    entry, args = REGISTRY[fields[k - 1]], fields[k:]
    output = ":".join(fields[:k - 1]) if k > 1 else None
    if output == "":
        raise TrtBisectError(f"--metric {spec!r}: empty output name")
    try:
        parsed = entry.parse(args)
    except ValueError as exc:
        raise TrtBisectError(f"--metric {spec!r}: {exc} (syntax: {entry.syntax})") from None
    return Criterion(entry, parsed, output, ":".join([entry.name, *args]))


def criteria_flags(criteria: Criteria) -> list[str]:
    """The flags that give `criteria` again (`parse_criteria` of them gives the same
    criteria): for the `trtbisect check` lines the renderings write. Hook files are written
    as absolute paths (commands.sh runs from the plan's folder)."""
    out: list[str] = []
    for c in criteria.items:
        flag = "--check-error-stat" if c.entry.family == "stat" else "--metric"
        out += [flag, c.spec()]
    for output, q in criteria.quantiles:
        out += ["--error-quantile", f"{output}:{q!r}" if output else repr(q)]
    for h in criteria.hooks:
        out += ["--check", f"{os.path.abspath(h.path)}:{h.function}"]
    if criteria.pass_rate < 1.0:
        out += ["--pass-rate", repr(criteria.pass_rate)]
    return out
