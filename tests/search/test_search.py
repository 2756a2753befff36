"""The search, tested alone with planted faults: a fake check that fails exactly when chosen
nodes run in FP16."""

from __future__ import annotations

import itertools
import random

import pytest

from trtbisect.search.minimal import ddmin, find_minimal_fp32

NODES = [f"n{i}" for i in range(600)]
CULPRITS = {"n100", "n101", "n102", "n103", "n400", "n401"}


def needs(culprits):
    return lambda fp32: culprits <= fp32


def is_one_minimal(plan, check):
    return check(frozenset(plan)) and all(not check(frozenset(plan) - {x}) for x in plan)


def test_exact_prior_costs_one_check_per_culprit_plus_two():
    r = find_minimal_fp32(NODES, needs(CULPRITS), seeds=sorted(CULPRITS))
    assert set(r.fp32) == CULPRITS and r.one_minimal
    assert r.evaluations == 1 + 1 + len(CULPRITS)  # all-FP16, the prior, one removal each


def test_noisy_prior_is_minimised():
    seeds = sorted(CULPRITS | {"n5", "n200", "n402"})
    r = find_minimal_fp32(NODES, needs(CULPRITS), seeds=seeds)
    assert set(r.fp32) == CULPRITS
    # one removal per seed, plus re-checks of nodes certified before a later removal
    assert r.evaluations <= 2 + 2 * len(seeds)


def test_incomplete_prior_grows_along_the_ranking():
    ranking = ["n100", "n101", "n102", "n103", "n7", "n400", "n401", *NODES]
    r = find_minimal_fp32(NODES, needs(CULPRITS), seeds=["n100", "n101"], ranking=ranking)
    assert set(r.fp32) == CULPRITS and r.one_minimal
    assert r.evaluations <= 16  # 15, and one probe of the pinned node alone


def test_a_single_culprit_the_prior_missed_is_pinned_by_the_grow_and_tried_alone():
    """The non-monotone case of PP-OCRv4 rec: the suspects kept in FP32 hurt, and the one node
    that fixes it alone is the last the grow phase takes."""
    seeds = ["n1", "n2", "n3", "n4"]
    ranking = [*seeds, *NODES[10:40], "n300", *NODES]

    def check(fp32):  # n300 fixes it, unless the seeds run in FP32 without 15 more nodes
        return "n300" in fp32 and (not set(seeds) <= fp32 or len(fp32) >= 20)

    r = find_minimal_fp32(NODES, check, seeds=seeds, ranking=ranking)
    assert r.fp32 == ["n300"] and r.one_minimal
    # all-FP16, the seeds, grow 8/16/32/64, bisect 48/40/36/34/35, the pinned node alone
    assert r.evaluations == 12
    plain = ddmin(NODES, check)
    assert r.evaluations < plain.evaluations


def test_a_ranking_that_needs_most_of_the_candidates_hands_over_to_ddmin():
    """PP-OCRv4 rec under strict semantics: the grow phase passes only with most of the
    ranking (a wide combination of suspects), while one node it ranked last fixes the model
    alone. Shrinking the prefix would keep the whole combination; one probe finds that what
    the prefix left out passes too, and ddmin over that finds the node."""
    nodes = NODES[:64]
    combo = set(nodes[:40])

    def check(fp32):  # n63 alone fixes it; so do the 40 suspects together
        return "n63" in fp32 or combo <= fp32

    r = find_minimal_fp32(nodes, check, ranking=nodes)
    assert r.fp32 == ["n63"] and r.one_minimal
    plain = ddmin(nodes, check)
    assert r.evaluations <= plain.evaluations + 12  # the grow and bisect it ran first


def test_beats_plain_ddmin_by_3x_with_a_prior():
    ours = find_minimal_fp32(NODES, needs(CULPRITS), seeds=sorted(CULPRITS))
    plain = ddmin(NODES, needs(CULPRITS))
    assert set(plain.fp32) == CULPRITS
    assert 3 * ours.evaluations <= plain.evaluations


def test_without_prior_still_no_worse_than_ddmin():
    ours = find_minimal_fp32(NODES, needs(CULPRITS))
    plain = ddmin(NODES, needs(CULPRITS))
    assert set(ours.fp32) == CULPRITS
    assert ours.evaluations <= plain.evaluations


def test_fp16_ok_takes_one_evaluation():
    r = find_minimal_fp32(NODES, lambda fp32: True)
    assert r.fp32 == [] and r.found and r.evaluations == 1


def test_no_plan_when_even_all_fp32_fails():
    r = find_minimal_fp32(NODES[:20], lambda fp32: False)
    assert not r.found and not r.one_minimal


def test_alternatives_give_a_one_minimal_set():
    # either {a} or {b, c} fixes it: any answer must be 1-minimal
    def check(fp32):
        return "n3" in fp32 or {"n8", "n9"} <= fp32
    r = find_minimal_fp32(NODES[:30], check, seeds=["n8", "n9", "n3"])
    assert r.one_minimal and is_one_minimal(r.fp32, check)
    assert set(r.fp32) in ({"n3"}, {"n8", "n9"})


def test_non_monotone_check_still_certified():
    # n1 alone fails, n1+n2 passes, n1+n2+n3 fails (interaction), n1+n3 passes
    table = {frozenset({"n1", "n2"}): True, frozenset({"n1", "n3"}): True}

    def check(fp32):
        return table.get(frozenset(fp32) & {"n1", "n2", "n3"}, False)
    r = find_minimal_fp32(NODES[:10], check, seeds=["n1", "n2"])
    assert r.one_minimal and is_one_minimal(r.fp32, check)


def test_budget_stops_early_and_says_so():
    r = find_minimal_fp32(NODES, needs(CULPRITS), max_evaluations=5)
    assert r.stopped_early and not r.one_minimal and r.evaluations == 5


@pytest.mark.parametrize("seed", range(5))
def test_random_planted_faults_match_brute_force(seed):
    rng = random.Random(seed)
    nodes = [f"m{i}" for i in range(10)]
    culprits = set(rng.sample(nodes, rng.randint(1, 3)))
    r = find_minimal_fp32(nodes, needs(culprits), ranking=rng.sample(nodes, len(nodes)))
    smallest = min((set(c) for k in range(len(nodes) + 1)
                    for c in itertools.combinations(nodes, k) if culprits <= set(c)), key=len)
    assert set(r.fp32) == smallest


def test_trace_records_every_evaluation_once():
    r = find_minimal_fp32(NODES, needs(CULPRITS), seeds=sorted(CULPRITS))
    keys = [frozenset(t.fp32) for t in r.trials]
    assert len(keys) == len(set(keys)) == r.evaluations
    assert r.trials[0].phase == "all-fp16" and not r.trials[0].passed
