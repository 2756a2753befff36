"""What the groups of command-line flags share: a number flag refused in one line, and the
group's click options applied as one decorator (cli.input_options, judge/flags.criteria_options,
base/limits.limit_options, cli_torch.torch_input_options)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import click


def apply_flags(f: Callable, flags: Sequence[Callable[[Callable], Callable]]) -> Callable:
    """`f` decorated by every one of `flags`, the first of them outermost (shown first in
    --help), as if written above it in that order."""
    for flag in reversed(flags):
        f = flag(f)
    return f


class Number(click.ParamType):
    """A float flag's value, refused unless `ok` holds of it (click's FloatRange lets NaN
    through; `ok` decides NaN too): "'x' is not `noun`", "'-1' is not `what`"."""

    def __init__(self, name: str, ok: Callable[[float], bool], what: str,
                 noun: str = "a number") -> None:
        self.name, self.ok, self.what, self.noun = name, ok, what, noun

    def convert(self, value, param, ctx) -> float:
        try:
            x = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not {self.noun}", param, ctx)
        if not self.ok(x):
            self.fail(f"{value!r} is not {self.what}", param, ctx)
        return x
