"""--budget steers the search (#36): only plans within the budget are evaluated; the cheapest
passing one within it is returned, else the best failing one within it, over budget."""

from __future__ import annotations

from trtbisect.search import find_minimal_fp32

NODES = ["big", "a", "b", *[f"n{i}" for i in range(12)]]  # the ranking: most suspicious first
PRICE = {"big": 10.0, "a": 1.0, "b": 1.0, **{f"n{i}": 0.5 for i in range(12)}}


def price(plan):
    return 100.0 + sum(PRICE[u] for u in plan)


def check(plan):
    """Two ways to pass: the dear unit alone, or the two cheap ones together."""
    return "big" in plan or {"a", "b"} <= plan


def score(plan):
    return 0.0 if check(plan) else 1.0 - 0.4 * len({"a", "b"} & plan)


def search(limit=None, max_evaluations=None):
    return find_minimal_fp32(NODES, check, seeds=["big"], ranking=NODES,
                             max_evaluations=max_evaluations, price=price,
                             adjacent={}, limit=limit, score=score)


def test_without_a_budget_the_search_takes_the_dear_plan_the_prior_points_at():
    r = search()
    assert r.fp32 == ["big"] and r.found and not r.over_budget


def test_a_budget_that_excludes_it_searches_within_and_finds_the_cheap_plan():
    free = search()
    r = search(limit=103.0)
    assert r.fp32 == ["a", "b"] and r.found and not r.over_budget and r.one_minimal
    assert all(price(frozenset(t.fp32)) <= 103.0 for t in r.trials)  # every evaluation inside
    assert not any("big" in t.fp32 for t in r.trials)
    assert [t.fp32 for t in r.trials] != [t.fp32 for t in free.trials]


def test_nothing_passes_within_the_budget_the_best_plan_within_it_is_over_budget():
    r = search(limit=101.5)
    assert r.over_budget and r.found and not r.one_minimal
    assert all(price(frozenset(t.fp32)) <= 101.5 for t in r.trials)
    assert price(frozenset(r.fp32)) <= 101.5
    # the smallest error among what was evaluated: one of the two cheap units
    assert len({"a", "b"} & set(r.fp32)) == 1


def test_a_budget_the_search_plan_fits_changes_nothing():
    free = search()
    loose = search(limit=1000.0)
    assert loose.fp32 == free.fp32 and not loose.over_budget


def test_the_evaluation_limit_stops_a_budgeted_search_with_what_it_has():
    r = search(limit=103.0, max_evaluations=2)
    assert r.stopped_early and r.evaluations == 2
    assert all(price(frozenset(t.fp32)) <= 103.0 for t in r.trials)
