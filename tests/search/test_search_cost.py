"""The cost-aware search with planted faults and planted prices; `--objective count` against
the frozen earlier search, trace for trace."""

from __future__ import annotations

import importlib.util
import itertools
import random
import sys
from pathlib import Path

import pytest

from trtbisect.search.minimal import ddmin, find_minimal_fp32, swap_neighbourhood

_spec = importlib.util.spec_from_file_location(
    "search_count_v0", Path(__file__).parents[1] / "fixtures" / "search_count_v0.py")
v0 = importlib.util.module_from_spec(_spec)
sys.modules["search_count_v0"] = v0  # dataclasses look their module up
_spec.loader.exec_module(v0)  # type: ignore[union-attr]

NODES = [f"n{i}" for i in range(600)]


def needs(culprits):
    return lambda fp32: set(culprits) <= fp32


def additive(prices, extra=None):
    """A plan's price: the sum of its units' prices (`extra(plan)`: a boundary term)."""
    return lambda plan: sum(prices[u] for u in plan) + (extra(plan) if extra else 0.0)


def chain(nodes):
    """Each unit adjacent to the one before and after it."""
    return {n: tuple(x for x in (nodes[i - 1] if i else None,
                                  nodes[i + 1] if i + 1 < len(nodes) else None) if x)
            for i, n in enumerate(nodes)}


def trace(r):
    return [(t.fp32, t.passed, t.phase) for t in r.trials]


def _problems():
    """Planted problems of every shape the count search meets: exact, noisy and missing
    priors, single and several culprits, alternatives, non-monotone checks, budgets."""
    rng = random.Random(7)
    out = []
    for k in range(40):
        n = rng.choice([10, 40, 200])
        nodes = [f"u{i}" for i in range(n)]
        culprits = set(rng.sample(nodes, rng.randint(1, min(6, n))))
        alt = set(rng.sample(nodes, 2))
        kind = k % 4
        if kind == 0:
            check = needs(culprits)
        elif kind == 1:
            check = (lambda c, a: lambda s: c <= s or a <= s)(culprits, alt)
        elif kind == 2:  # non-monotone: too many FP32 nodes hurt
            check = (lambda c, lim: lambda s: c <= s and len(s) <= lim)(culprits, len(culprits) + 8)
        else:
            check = (lambda c: lambda s: len(c & s) >= max(1, len(c) - 1))(culprits)
        seeds = rng.sample(nodes, rng.randint(0, min(8, n)))
        ranking = rng.sample(nodes, n)
        budget = rng.choice([None, None, 6])
        out.append((nodes, check, seeds, ranking, budget))
    return out


@pytest.mark.parametrize("case", range(40))
def test_count_objective_is_the_earlier_search_evaluation_for_evaluation(case):
    nodes, check, seeds, ranking, budget = _problems()[case]
    new = find_minimal_fp32(nodes, check, seeds, ranking, budget)
    old = v0.find_minimal_fp32(nodes, check, seeds, ranking, budget)
    assert trace(new) == trace(old)
    assert (new.fp32, new.found, new.one_minimal, new.evaluations, new.stopped_early) == \
        (old.fp32, old.found, old.one_minimal, old.evaluations, old.stopped_early)
    assert new.certificate is None


def test_cost_picks_the_cheaper_of_two_one_minimal_plans():
    """{n5} or {n8, n9} fixes it: count keeps the one node, cost the two cheap ones."""
    nodes = NODES[:30]
    prices = {n: 1.0 for n in nodes} | {"n5": 10.0}

    def check(fp32):
        return "n5" in fp32 or {"n8", "n9"} <= fp32

    count = find_minimal_fp32(nodes, check, seeds=["n5", "n8", "n9"])
    cheap = find_minimal_fp32(nodes, check, seeds=["n5", "n8", "n9"], price=additive(prices))
    assert count.fp32 == ["n5"]
    assert cheap.fp32 == ["n8", "n9"] and cheap.one_minimal
    assert cheap.certificate.removals == (("n9",), ("n8",))
    assert all(not check(frozenset(r)) for r in cheap.certificate.removals)


def test_a_cheaper_neighbour_that_also_fixes_it_is_swapped_in_and_the_trace_shows_it():
    """The suspect (an expensive MatMul, say) passes alone, so does the cheap node after it;
    no removal finds that, the swap certificate does."""
    nodes = NODES[:50]
    prices = {n: 1.0 for n in nodes} | {"n20": 30.0}

    def check(fp32):
        return "n20" in fp32 or "n21" in fp32

    r = find_minimal_fp32(nodes, check, seeds=["n20"], ranking=["n20", "n21"],
                          price=additive(prices), adjacent=chain(nodes))
    assert r.fp32 == ["n21"] and r.one_minimal
    phases = [t.phase for t in r.trials]
    assert phases[:2] == ["all-fp16", "prior"] and "swap" in phases
    swap = next(t for t in r.trials if t.phase == "swap" and t.passed)
    assert swap.fp32 == ("n21",) and swap.price == 1.0
    # the certificate: n21's cheaper neighbours... none is cheaper (all 1.0): nothing to try
    assert r.certificate.swaps == () and r.certificate.price_s == 1.0
    assert all(t.price is not None for t in r.trials)


def test_the_certificate_lists_every_cheaper_swap_and_each_failed():
    nodes = NODES[:40]
    prices = {n: float(1 + i % 5) for i, n in enumerate(nodes)}
    culprits = {"n12", "n30"}
    price = additive(prices)
    adj = chain(nodes)
    r = find_minimal_fp32(nodes, needs(culprits), seeds=["n12", "n30", "n3"], price=price,
                          adjacent=adj)
    assert set(r.fp32) == culprits and r.one_minimal
    plan = frozenset(r.fp32)
    expected = swap_neighbourhood(plan, price, {}, adj)
    assert [set(s) for s in r.certificate.swaps] == [set(s) for s in expected]
    for s in expected:
        assert price(s) < price(plan)
        assert any(t.fp32 == tuple(sorted(s, key=nodes.index)) and not t.passed
                   for t in r.trials)


@pytest.mark.parametrize("seed", range(12))
def test_random_prices_give_a_certified_local_optimum(seed):
    """Brute force on 10 nodes: the plan passes, every removal fails, every cheaper
    adjacent swap (k unbounded) fails, and no plan cheaper than it passes when the faults
    are monotone and the alternatives are single nodes."""
    rng = random.Random(seed)
    nodes = [f"m{i}" for i in range(10)]
    prices = {n: rng.choice([1.0, 2.0, 5.0, 20.0]) for n in nodes}
    groups = [set(rng.sample(nodes, rng.randint(1, 2))) for _ in range(rng.randint(1, 3))]

    def check(fp32):  # each group: one of its nodes in FP32 suffices
        return all(g & fp32 for g in groups)

    price = additive(prices)
    adj = {n: tuple(m for m in nodes if m != n) for n in nodes}  # everything adjacent
    r = find_minimal_fp32(nodes, check, ranking=rng.sample(nodes, 10), price=price,
                          adjacent=adj, swap_k=10, swap_share=None)
    plan = frozenset(r.fp32)
    assert check(plan) and r.one_minimal
    assert all(not check(plan - {x}) for x in plan)
    for x in plan:
        for y in nodes:
            swapped = (plan - {x}) | {y}
            if y not in plan and price(swapped) < price(plan):
                assert not check(swapped)
    if all(len(g) == 1 for g in groups):  # one answer only
        assert plan == set().union(*groups)
    best = min((frozenset(c) for k in range(11) for c in itertools.combinations(nodes, k)
                if check(frozenset(c))), key=price)
    assert price(plan) <= price(best) * 4  # a local optimum, not always the global one


def test_single_culprit_among_many_suspects_costs_less_than_ddmin():
    """The all-MiniLM-L6-v2 case: 16 suspects pass together, one of them (the mask Mul) is
    the culprit; the earlier search removed them one at a time (18 evaluations), ddmin
    needed 11 over the 179 units. Bisecting the failed run finds it in about 2 log2 16."""
    units = [f"u{i}" for i in range(1200)]
    seeds = [units[i] for i in range(0, 160, 10)]
    culprit = seeds[1]
    prices = {u: 1.0 for u in units} | {culprit: 0.01}  # the culprit is a tiny tensor
    r = find_minimal_fp32(units, needs({culprit}), seeds=seeds, price=additive(prices),
                          adjacent=chain(units))
    plain = ddmin(units, needs({culprit}))
    count = find_minimal_fp32(units, needs({culprit}), seeds=seeds)
    assert r.fp32 == [culprit] and r.one_minimal
    assert r.evaluations <= plain.evaluations and r.evaluations < count.evaluations


@pytest.mark.parametrize("position", [0, 7, 15])
def test_single_culprit_anywhere_in_an_equal_priced_prior_stays_within_ddmin(position):
    units = [f"u{i}" for i in range(1200)]
    seeds = [units[i] for i in range(0, 160, 10)]
    culprit = seeds[position]
    r = find_minimal_fp32(units, needs({culprit}), seeds=seeds,
                          price=additive({u: 1.0 for u in units}), adjacent=chain(units))
    assert r.fp32 == [culprit]
    assert r.evaluations <= ddmin(units, needs({culprit})).evaluations


def test_an_exact_prior_costs_one_evaluation_per_unit_as_before():
    culprits = ["n100", "n101", "n102", "n103", "n400", "n401"]
    r = find_minimal_fp32(NODES, needs(set(culprits)), seeds=culprits,
                          price=additive({n: 1.0 for n in NODES}))
    assert set(r.fp32) == set(culprits) and r.evaluations == 2 + len(culprits)


def test_budget_stops_the_cost_search_and_says_so():
    r = find_minimal_fp32(NODES, needs({"n3", "n500"}), max_evaluations=4,
                          price=additive({n: 1.0 for n in NODES}))
    assert r.stopped_early and not r.one_minimal and r.evaluations == 4


def test_the_swap_certificate_costs_at_most_half_the_evaluations_before_it():
    """An exact prior of one unit (2 evaluations) with many cheaper neighbours: one swap."""
    nodes = NODES[:20]
    adj = {n: tuple(m for m in nodes if m != n) for n in nodes}
    prices = {n: 1.0 for n in nodes} | {"n5": 10.0}
    count = find_minimal_fp32(nodes, needs({"n5"}), seeds=["n5"])
    r = find_minimal_fp32(nodes, needs({"n5"}), seeds=["n5"], price=additive(prices),
                          adjacent=adj)
    assert count.evaluations == 2 and r.evaluations == 3 and r.fp32 == ["n5"]
    assert len(r.certificate.swaps) == 1 and "at most 1 evaluated" in \
        r.certificate.neighbourhood
