"""The search's own noise: whether keeping more of the graph in FP32 ever made an output worse.

A search that bisects and removes units assumes that an output's error falls as more of the
graph runs in FP32. On an output whose error is a few near-ties (class probabilities judged by
max|d|: one probability of 18385 moves when an upstream rounding changes), it does not: one more
unit in FP32 moves the error by as much as a plan's margin, every verdict near the bound is a
coin toss, and the search chases it (PP-OCRv5 rec: thousands of evaluations for a plan fitted
to the noise, where two nodes pass another run's bound).

`Monotony` watches the plans a search evaluates, in the order the search takes them. For every
pair where one plan keeps a superset of the other's units in FP32, an output whose pressure
(its error over its bound, or a criterion's severity: 1 at the bound, judge/compare.py) is
higher under the larger plan has risen by that much. The largest rise is the search's noise,
measured in the unit of the certificate's spread share (stages/spread.py SPREAD_SHARE). Rises
count only where the search decides: from a pressure within the share of the bound (a plan
near it, passing or failing), up to at most `CEILING`. An overflowing output whose error moves
from 900 to 1200 times its bound says nothing about plans near it; nor does a plan passing by
far whose error grows and still passes (magika: 0.28 to 0.58 of the bound), nor one from
well inside the bound to far over it (an LSTM's state kept FP32 beside an FP16 step: silero-vad
0.72 to 10 times the bound), which is a real interaction the search handles. A plan judged on only some of its samples (a failure stops the judge early) gives a
pressure that is a lower bound: it stands as the larger plan of a pair, never as the smaller.

One rise over the share can be physics: two roundings that cancel, so that keeping one of them
in FP32 leaves the other's error bare (the planted detector of tests/search/test_aim_budget.py),
and an aimed search finds a plan clear of it; so can one addition seen from several plans
(the grow phase's nested prefixes). The search is called noisy when `REPEATS` rises over the
share neither their smaller nor their larger plan: then the error moves with whichever
units happen to be FP32.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

CEILING = 2.0  # rises are counted from pressures under twice the bound, and capped there
REPEATS = 2  # rises over the share, no two sharing a plan: the search is noisy


@dataclass(frozen=True)
class Rise:
    """An output whose pressure rose when the plan kept more in FP32: from `low` under the
    smaller plan (evaluation `smaller`, 1-based as the trace numbers them) to `high` under the
    larger one (`larger`)."""

    output: str
    low: float
    high: float
    smaller: int
    larger: int

    @property
    def size(self) -> float:
        return min(self.high, CEILING) - self.low

    def to_json(self) -> dict:
        return {"output": self.output, "rise": self.size, "low": self.low,
                "high": self.high, "smaller": self.smaller, "larger": self.larger}

    @classmethod
    def from_json(cls, d: Mapping) -> Rise:
        """The rise precision.json records (`rise` is the size, computed again)."""
        def num(x):  # the quantized road writes a non-finite number as a string ("inf")
            return float(x) if isinstance(x, str) else x
        return cls(d["output"], num(d["low"]), num(d["high"]), d["smaller"], d["larger"])

    def text(self) -> str:
        return (f"on {self.output}, keeping more in FP32 raised the error from {self.low:.3g} "
                f"to {self.high:.3g} of its bound (evaluations {self.smaller} and "
                f"{self.larger})")


@dataclass
class _Seen:
    index: int
    plan: frozenset[str]
    pressure: dict[str, float]
    complete: bool


class Monotony:
    """The largest rise over the plans seen so far (module docstring); `noisy()` says whether
    it is over `share` of the bound."""

    def __init__(self, share: float) -> None:
        self.share = share
        self.worst: Rise | None = None
        self.over: list[Rise] = []  # rises over the share, no two sharing a plan
        self._seen: list[_Seen] = []

    def add(self, index: int, plan: frozenset[str], pressure: Mapping[str, float],
            complete: bool = True) -> Rise | None:
        """One more evaluated plan (`index`: its evaluation number) and its pressure per
        output; returns the largest rise known after it."""
        now = _Seen(index, plan, {o: p for o, p in pressure.items() if math.isfinite(p)},
                    complete)
        for was in self._seen:
            if was.plan < plan:
                self._pair(was, now)
            elif plan < was.plan:
                self._pair(now, was)
        self._seen.append(now)
        return self.worst

    def _pair(self, smaller: _Seen, larger: _Seen) -> None:
        if not smaller.complete:
            return
        for o, low in smaller.pressure.items():
            high = larger.pressure.get(o)
            if high is None or abs(low - 1) > self.share or high <= low:
                continue
            rise = Rise(o, low, high, smaller.index, larger.index)
            if self.worst is None or rise.size > self.worst.size:
                self.worst = rise
            if rise.size > self.share and not any(
                    r.smaller == rise.smaller or r.larger == rise.larger for r in self.over):
                self.over.append(rise)

    def noisy(self) -> Rise | None:
        """The largest rise once REPEATS rises over the share share no plan (the search cannot
        tell plans apart near the bound), else None."""
        return self.worst if len(self.over) >= REPEATS else None


Pressure = Callable[[frozenset[str]], "tuple[Mapping[str, float], bool] | None"]


def watching(pressure_of: Pressure, share: float) -> Callable[[int, frozenset[str]], Rise | None]:
    """A search's watch (search/minimal.py `Watch`) over a fresh `Monotony`: each plan the
    search takes with its pressures per output and whether every sample was judged
    (`pressure_of`; None: nothing measured, nothing compared); it names the largest rise once
    the search is noisy."""
    monotony = Monotony(share)

    def watch(index: int, plan: frozenset[str]) -> Rise | None:
        got = pressure_of(plan)
        if got is None:
            return None
        monotony.add(index, plan, *got)
        return monotony.noisy()
    return watch
