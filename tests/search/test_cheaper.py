"""The cheaper step after a cost search (search/cheaper.py), tested alone: a planted price
that is not monotone (a unit next to the culprit removes the reformat between them, as an
un-quantized layer next to the plan's removes a Q/DQ pair) and a planted check."""

from __future__ import annotations

import itertools

from trtbisect.search.cheaper import Cheaper, cheaper_neighbours
from trtbisect.search.minimal import find_minimal_fp32

UNITS = ["a", "b", "c", "x", "d"]
ADJACENT = {"a": ("b", "x"), "b": ("a", "c"), "c": ("b",), "x": ("a", "d"), "d": ("x",)}
OWN = {"a": 3.0, "b": 0.5, "c": 0.5, "x": 0.5, "d": 4.0}  # what each unit adds to the plan


def price(plan: frozenset[str]) -> float:
    """Each unit's own cost, and the reformats: `a` in the plan without `b` pays 2 (the Q
    between them), without `x` 3; `b` without `c` pays 1."""
    p = sum(OWN[u] for u in plan)
    if "a" in plan:
        p += (2.0 if "b" not in plan else 0.0) + (3.0 if "x" not in plan else 0.0)
    if "b" in plan and "c" not in plan:
        p += 1.0
    return p


def check(plan: frozenset[str]) -> bool:
    """`a` is the culprit; `x` breaks the output unless `d` is kept too, so the cheapest
    superset of {a}, {a, x}, fails and must never be the plan."""
    return "a" in plan and ("x" not in plan or "d" in plan)


def cheapest_passing() -> tuple[float, frozenset[str]]:
    plans = (frozenset(s) for k in range(len(UNITS) + 1)
             for s in itertools.combinations(UNITS, k))
    return min((price(p), sorted(p), p) for p in plans if check(p))[::2]


def test_the_cost_search_steps_to_the_cheapest_passing_plan_and_never_to_a_failing_one():
    minimal = find_minimal_fp32(UNITS, check, price=price, adjacent=ADJACENT)
    assert minimal.fp32 == ["a"] and price(frozenset(minimal.fp32)) == 8.0
    r = find_minimal_fp32(UNITS, check, price=price, adjacent=ADJACENT,
                          after=Cheaper(UNITS, price, ADJACENT, 10))
    best_price, best = cheapest_passing()
    assert set(r.fp32) == best == {"a", "b", "c"} and price(best) == best_price == 7.0
    assert not r.one_minimal  # {"a"} alone passes: the plan is cheaper, not 1-minimal
    step = [t for t in r.trials if t.phase == "cheaper"]
    # {a, x} (price 5.5) is cheaper and fails: judged, never taken
    assert ("a", "x") in [t.fp32 for t in step if not t.passed]
    assert all("x" not in t.fp32 for t in step if t.passed)
    cert = r.certificate
    assert cert is not None and cert.cheaper is not None
    assert cert.minimal_plan == ("a",) and cert.minimal_price_s == 8.0
    assert [m["added"] for m in cert.cheaper.moves] == [["b"], ["c"]]
    assert cert.cheaper.evaluations == len(step) <= 10
    assert r.evaluations == minimal.evaluations + len(step)


def test_the_cheaper_step_spends_at_most_its_allowance():
    r = find_minimal_fp32(UNITS, check, price=price, adjacent=ADJACENT,
                          after=Cheaper(UNITS, price, ADJACENT, 1))
    step = [t for t in r.trials if t.phase == "cheaper"]
    assert len(step) == 1 and step[0].fp32 == ("a", "x")  # the cheapest neighbour, failed
    assert r.fp32 == ["a"] and r.certificate.cheaper.cheaper_neighbours_unjudged > 0


def test_cheaper_neighbours_come_cheapest_first_then_by_name():
    """Added anywhere, removed, or swapped for an adjacent unit; never the empty plan."""
    near = cheaper_neighbours(frozenset({"a"}), UNITS, price, ADJACENT)
    assert [sorted(p) for p in near] == [["x"], ["b"], ["a", "x"], ["a", "b"]]
    flat = lambda p: 5.0 - len(p & {"b", "c"})  # noqa: E731 - b and c save alike
    assert [sorted(p) for p in cheaper_neighbours(frozenset({"a"}), UNITS, flat, ADJACENT)
            ] == [["a", "b"], ["a", "c"], ["b"]]


def test_without_the_cheaper_step_the_cost_search_is_unchanged():
    """The FP16 road passes no `cheaper`: its result and trace are those of before."""
    a = find_minimal_fp32(UNITS, check, price=price, adjacent=ADJACENT)
    b = find_minimal_fp32(UNITS, check, price=price, adjacent=ADJACENT, after=None)
    assert a.to_json() == b.to_json() and a.certificate.cheaper is None
    assert all(t.phase != "cheaper" for t in a.trials)


def test_a_budget_that_runs_out_in_the_step_keeps_the_last_passing_plan():
    """--max-evals reached inside the step: the plan is the last one it took (it passed),
    flagged stopped early, never the smallest passing plan the budget fallback would give."""
    minimal = find_minimal_fp32(UNITS, check, price=price, adjacent=ADJACENT)
    r = find_minimal_fp32(UNITS, check, price=price, adjacent=ADJACENT,
                          max_evaluations=minimal.evaluations + 2,
                          after=Cheaper(UNITS, price, ADJACENT, 10))
    assert r.evaluations == minimal.evaluations + 2 and r.stopped_early
    assert r.fp32 == ["a", "b"] and check(frozenset(r.fp32)) and price(frozenset(r.fp32)) == 7.5
    assert r.certificate.cheaper.stopped_early is True
