"""Batched searches (#23): evaluations proposed in rounds, results consumed in the sequential
order. For every width the plan, the trace and `evaluations` are the frozen sequential
search's, bit for bit; plans evaluated ahead and never taken are counted apart and change no
decision."""

from __future__ import annotations

import importlib.util
import math
import random
import sys
from pathlib import Path

import pytest

from trtbisect.search.minimal import Oracle, ddmin, find_minimal_fp32
from trtbisect.search.refine import emulator_then_trt

_spec = importlib.util.spec_from_file_location(
    "search_sequential_v1", Path(__file__).parents[1] / "fixtures" / "search_sequential_v1.py")
v1 = importlib.util.module_from_spec(_spec)
sys.modules["search_sequential_v1"] = v1  # dataclasses look their module up
_spec.loader.exec_module(v1)  # type: ignore[union-attr]

WIDTHS = [1, 2, 3, 8]


class FakeBatch:
    """A check run `width` plans at a time: records each round and every plan evaluated;
    `journal`: verdicts known without evaluating (a resumed run)."""

    def __init__(self, check, width, journal=None, budget=None):
        self.check, self.width, self.budget = check, width, budget
        self.journal = dict(journal or {})
        self.rounds: list[list[frozenset]] = []
        self.taken: list[frozenset] = []

    def known(self, plan):
        return self.journal.get(plan)

    def evaluate(self, plans):
        assert 1 <= len(plans) <= self.width and len(set(plans)) == len(plans)
        assert not any(p in self.journal for p in plans), "a journaled plan was evaluated"
        if self.budget is not None:  # a round asks no more than the budget has left
            assert len(plans) <= max(1, self.budget - len(self.taken))
        self.rounds.append(list(plans))
        return [("outcome", bool(self.check(p))) for p in plans]

    def passed(self, outcome):
        return outcome[1]

    def consume(self, plan, outcome):
        self.taken.append(plan)
        if outcome is None:
            return self.journal[plan]
        return outcome[1]

    @property
    def evaluated(self):
        return [p for r in self.rounds for p in r]


def needs(culprits):
    return lambda fp32: set(culprits) <= fp32


def trace(r):
    return [t.to_json() for t in r.trials]


def certificate(r):
    """A search's certificate as trace.json writes it (the frozen sequential search of
    fixtures/ keeps the dict it wrote then)."""
    c = r.certificate
    return c.to_json() if hasattr(c, "to_json") else c


def same(new, old):
    assert trace(new) == trace(old)
    assert (new.fp32, new.found, new.one_minimal, new.evaluations, new.stopped_early,
            certificate(new), new.over_budget) == \
        (old.fp32, old.found, old.one_minimal, old.evaluations, old.stopped_early,
         certificate(old), old.over_budget)


def additive(prices):
    return lambda plan: sum(prices[u] for u in plan) + 0.25 * len(plan) ** 0.5


def chain(nodes):
    return {n: tuple(x for x in (nodes[i - 1] if i else None,
                                  nodes[i + 1] if i + 1 < len(nodes) else None) if x)
            for i, n in enumerate(nodes)}


def problems(count=48, seed=11):
    """Planted problems of every shape: exact, noisy and missing priors, one and many
    culprits, alternatives, non-monotone checks, budgets, most of the candidates needed."""
    rng = random.Random(seed)
    out = []
    for k in range(count):
        n = rng.choice([6, 30, 120, 300])
        nodes = [f"u{i}" for i in range(n)]
        culprits = set(rng.sample(nodes, rng.randint(1, min(12, n))))
        alt = set(rng.sample(nodes, 2))
        kind = k % 5
        if kind == 0:
            check = (lambda c: lambda s: c <= s)(culprits)
        elif kind == 1:
            check = (lambda c, a: lambda s: c <= s or a <= s)(culprits, alt)
        elif kind == 2:  # non-monotone: too many FP32 nodes hurt
            check = (lambda c, lim: lambda s: c <= s and len(s) <= lim)(culprits, len(culprits) + 8)
        elif kind == 3:
            check = (lambda c: lambda s: len(c & s) >= max(1, len(c) - 1))(culprits)
        else:  # most of the candidates needed (the PP-OCRv4 det shape)
            many = set(rng.sample(nodes, max(1, (3 * n) // 4)))
            check = (lambda c: lambda s: c <= s)(many)
        seeds = rng.sample(nodes, rng.randint(0, min(8, n)))
        ranking = rng.sample(nodes, n)
        budget = rng.choice([None, None, None, 9])
        prices = {u: rng.choice([0.5, 1.0, 2.0, 8.0]) for u in nodes}
        out.append((nodes, check, seeds, ranking, budget, prices))
    return out


PROBLEMS = problems()


@pytest.mark.parametrize("case", range(len(PROBLEMS)))
@pytest.mark.parametrize("objective", ["count", "cost"])
def test_every_width_gives_the_sequential_search_trial_for_trial(case, objective):
    nodes, check, seeds, ranking, budget, prices = PROBLEMS[case]
    kw = dict(price=additive(prices), adjacent=chain(nodes)) if objective == "cost" else {}
    old = v1.find_minimal_fp32(nodes, check, seeds, ranking, budget, **kw)
    for width in WIDTHS:
        batch = FakeBatch(check, width)
        new = find_minimal_fp32(nodes, batch, seeds, ranking, budget, **kw)
        same(new, old)
        # every trial was evaluated exactly once, the others are speculative, and the plans
        # taken are the trials (plus memoized repeats)
        assert len(batch.evaluated) == len(set(batch.evaluated))
        assert [frozenset(t.fp32) for t in new.trials] == list(dict.fromkeys(batch.taken))
        assert new.speculative == len(batch.evaluated) - new.evaluations
        assert new.rounds == len(batch.rounds)
        if width == 1:
            assert new.speculative == 0 and new.rounds == new.evaluations


@pytest.mark.parametrize("case", range(0, len(PROBLEMS), 3))
def test_ddmin_in_batches_is_ddmin(case):
    nodes, check, *_ = PROBLEMS[case]
    old = v1.ddmin(nodes, check)
    for width in WIDTHS:
        new = ddmin(nodes, FakeBatch(check, width))
        same(new, old)


def test_certification_removals_run_as_one_round():
    """An exact prior of 6 culprits: all-FP16, the prior, then the 6 removals; 8 workers
    certify in one round, 3 in two."""
    nodes = [f"n{i}" for i in range(100)]
    culprits = {"n3", "n10", "n11", "n40", "n70", "n99"}
    check = needs(culprits)
    for width, rounds in [(1, 8), (3, 4), (8, 3)]:
        r = find_minimal_fp32(nodes, FakeBatch(check, width), seeds=sorted(culprits))
        assert set(r.fp32) == culprits and r.evaluations == 8
        assert r.rounds == rounds and r.speculative == 0


def test_bisection_speculates_both_outcomes_and_takes_one():
    """The grow phase's bisection with 3 workers: each round asks the midpoint and both
    quarter points; one of the two quarters is taken, so rounds are about half the
    evaluations, and the trace is the sequential one."""
    nodes = [f"n{i}" for i in range(1024)]
    check = needs({"n700"})
    old = v1.find_minimal_fp32(nodes, check, ranking=nodes)
    r = find_minimal_fp32(nodes, FakeBatch(check, 3), ranking=nodes)
    same(r, old)
    bisect = sum(t.phase == "bisect" for t in r.trials)
    assert bisect >= 8
    assert r.rounds <= r.evaluations - bisect // 2 + 1
    assert r.speculative >= bisect // 2 - 1


def test_a_journal_answers_without_evaluating_and_is_still_a_trial():
    """A resumed run: the journal's verdicts are taken in order as trials, never evaluated
    again, and the search goes on where the journal ends."""
    nodes = [f"n{i}" for i in range(200)]
    culprits = {"n5", "n50", "n150"}
    check = needs(culprits)
    full = find_minimal_fp32(nodes, check, seeds=["n5", "n6", "n50"], ranking=nodes)
    for cut in range(0, full.evaluations, 3):
        journal = {frozenset(t.fp32): t.passed for t in full.trials[:cut]}
        batch = FakeBatch(check, 3, journal)
        resumed = find_minimal_fp32(nodes, batch, seeds=["n5", "n6", "n50"], ranking=nodes)
        same(resumed, full)
        assert not set(batch.evaluated) & set(journal)


def test_the_budget_stops_at_the_same_trial_and_speculation_stays_within_it():
    nodes = [f"n{i}" for i in range(300)]
    check = needs({"n1", "n200", "n201"})
    for budget in (1, 2, 5, 9, 14):
        old = v1.find_minimal_fp32(nodes, check, ranking=nodes, max_evaluations=budget)
        for width in WIDTHS:
            batch = FakeBatch(check, width, budget=budget)
            new = find_minimal_fp32(nodes, batch, ranking=nodes, max_evaluations=budget)
            same(new, old)


def test_a_nested_search_batches_through_its_callers_oracle():
    """The TensorRT certificate runs a search inside the TensorRT oracle: its removals are
    evaluated in rounds of the outer batch, and the outer trace is the sequential one."""
    cand = [f"n{i}" for i in range(40)]
    culprits = {"n2", "n9", "n17", "n30"}

    def trt_check(s):
        return culprits <= s

    old = v1.find_minimal_fp32  # the sequential inner search
    emulator_plan = sorted(culprits | {"n5", "n6", "n7"}, key=cand.index)
    seq = emulator_then_trt(cand, trt_check, emulator_plan=emulator_plan, certify=True)
    assert old is not None
    for width in WIDTHS:
        batch = FakeBatch(trt_check, width)
        par = emulator_then_trt(cand, batch, emulator_plan=emulator_plan, certify=True)
        assert par.trials == seq.trials and par.fp32 == seq.fp32
        assert len(batch.rounds) <= len(seq.trials)
        if width == 8:
            assert len(batch.rounds) < len(seq.trials)


def test_an_oracle_without_a_batch_is_the_plain_sequential_oracle():
    calls = []

    def check(s):
        calls.append(s)
        return "a" in s

    o = Oracle(check, ["a", "b", "c"])
    assert o.width == 1
    assert o.first([{"b"}, {"c"}, {"a"}, {"a", "b"}]) == 2
    assert calls == [frozenset({"b"}), frozenset({"c"}), frozenset({"a"})]
    assert o.speculative == 0 and o.rounds == 3 and math.isclose(o._pass_rate("x"), 0.5)
