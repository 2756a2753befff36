"""Cheaper neighbours: after a cost search, step to a cheaper passing plan while one exists.

Pure, like minimal.py. The FP16 price only grows with every unit kept FP32, so the cheapest
passing FP16 plan is 1-minimal and the cost search can stop at its certificate. The quantized
price is not monotone (quant/cost.py): un-quantizing a layer next to the plan's removes the
Q/DQ reformat between them, which can save more than the layer's float math costs, so the
cheapest passing plan may hold a unit no accuracy needs, and a unit needed by the 1-minimal
plan may be replaced by a cheaper one only once such a unit is in.

`descend` tries the plan's neighbours that are cheaper than it: one unit added (a cheaper
superset), one removed, or one swapped for a unit adjacent to it in the data flow (the swap
certificate's neighbours); the cheapest first (equal prices: by the
units' names), the first that passes is taken, and the step repeats from it until no cheaper
neighbour passes. A plan that fails is never taken, so the plan passes all along and its price
falls at every step. At most `allowance` new evaluations in all (plans the search already
judged are free); where the allowance runs out, the cheaper neighbours left are counted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .minimal import BudgetExhausted, CheaperStep, Oracle

Price = Callable[[frozenset[str]], float]


@dataclass
class Descent:
    """What the step did: the plan it ends with, its moves (in order), the cheaper neighbours
    of the final plan it judged (all failed) and those it left unjudged (the allowance)."""

    plan: frozenset[str]
    moves: list[dict] = field(default_factory=list)  # {"added": [...], "removed": [...]}
    tried: int = 0  # cheaper neighbours of the final plan judged, all failed
    untried: int = 0  # cheaper neighbours of the final plan not judged (the allowance)
    evaluations: int = 0  # new evaluations the step made
    stopped: bool = False  # the run's --max-evals ran out during the step

    def step(self, allowance: int) -> CheaperStep:
        """The certificate's record of it."""
        return CheaperStep(tuple(self.moves), self.tried, self.untried, self.evaluations,
                           allowance, self.stopped)


@dataclass(frozen=True)
class Cheaper:
    """`find_minimal_fp32(after=...)`: `descend` from the certified plan over `candidates`,
    at most `allowance` new evaluations."""

    candidates: Sequence[str]
    price: Price
    adjacent: Mapping[str, Sequence[str]]
    allowance: int

    def __call__(self, oracle: Oracle, plan: frozenset[str]
                 ) -> tuple[frozenset[str], CheaperStep, bool]:
        d = descend(oracle, plan, self.candidates, self.price, self.adjacent, self.allowance)
        return d.plan, d.step(self.allowance), d.stopped


def cheaper_neighbours(plan: frozenset[str], candidates: Sequence[str], price: Price,
                       adjacent: Mapping[str, Sequence[str]]) -> list[frozenset[str]]:
    """The plans one unit away from `plan` that cost less than it: any unit added, a unit
    removed, or a unit swapped for one `adjacent` to it; the cheapest first, equal prices by
    their units' names. Never the empty plan (the file as given, judged first by every
    search)."""
    whole = price(plan)
    outside = [u for u in dict.fromkeys(candidates) if u not in plan]
    near: set[frozenset[str]] = {plan | {u} for u in outside}
    for x in plan:
        near.add(plan - {x})
        near.update((plan - {x}) | {y} for y in adjacent.get(x, ()) if y not in plan)
    priced = [(price(p), sorted(p), p) for p in near if p]
    return [p for c, _, p in sorted(priced, key=lambda t: (t[0], t[1])) if c < whole]


def descend(oracle: Oracle, plan: frozenset[str], candidates: Sequence[str], price: Price,
            adjacent: Mapping[str, Sequence[str]], allowance: int) -> Descent:
    """From a passing `plan`, take the first passing cheaper neighbour
    (`cheaper_neighbours`' order), repeatedly; at most `allowance` new evaluations. Every plan
    is judged through `oracle` (the search's: counted, journaled, memoized)."""
    out = Descent(plan)
    left = allowance
    while True:
        oracle.phase = "cheaper"
        trials: list[frozenset[str]] = []
        new, untried = 0, 0
        for t in cheaper_neighbours(out.plan, candidates, price, adjacent):
            if oracle.known(t) is None:
                if new >= left:
                    untried += 1
                    continue
                new += 1
            trials.append(t)
        oracle.remaining = new
        before = len(oracle.trials)
        try:
            k = oracle.first(trials)
        except BudgetExhausted:
            out.evaluations += len(oracle.trials) - before
            out.stopped = True
            return out
        spent = len(oracle.trials) - before
        left -= spent
        out.evaluations += spent
        if k is None:
            out.tried, out.untried = len(trials), untried
            return out
        out.moves.append({"added": list(oracle.sorted(trials[k] - out.plan)),
                          "removed": list(oracle.sorted(out.plan - trials[k]))})
        out.plan = trials[k]
