"""The TensorRT search's strategy (search/refine.py) on planted checks: the emulator's plan
first, one TensorRT verification, refinement by engine layers then nodes where they disagree."""

from __future__ import annotations

import json

from trtbisect.search.refine import emulator_then_trt

NODES = [f"n{i:02d}" for i in range(24)]
GROUPS = {f"L{g}": tuple(NODES[4 * g:4 * g + 4]) for g in range(6)}  # 6 engine layers of 4


def needs(required):
    """A planted fault: passes exactly when every required node is FP32."""
    required = frozenset(required)
    calls: list[frozenset[str]] = []

    def check(fp32):
        calls.append(frozenset(fp32))
        return required <= fp32
    check.calls = calls  # type: ignore[attr-defined]
    return check


def never(_fp32):
    raise AssertionError("this check must not run")


def test_agreement_costs_two_trt_checks():
    emu, trt = needs({"n05", "n17"}), needs({"n05", "n17"})
    r = emulator_then_trt(NODES, trt, emulator_check=emu, groups=GROUPS)
    assert r.fp32 == ["n05", "n17"] and r.found and r.emulator_agreed
    assert r.trt_checks == 2 and trt.calls == [frozenset(), frozenset({"n05", "n17"})]
    assert r.trt_only == [] and not r.one_minimal_on_trt
    assert [t["phase"] for t in r.trials] == ["fp16", "verify"]


def test_fp16_engine_passing_needs_no_emulator():
    r = emulator_then_trt(NODES, needs(()), emulator_check=never)
    assert r.fp32 == [] and r.trt_checks == 1 and r.emulator_fp32 is None and r.one_minimal_on_trt


def test_disagreement_refines_layers_then_nodes_around_the_plan():
    """TensorRT also needs n10, fused in layer L2 next to nothing the emulator chose."""
    emu, trt = needs({"n05", "n17"}), needs({"n05", "n17", "n10"})
    r = emulator_then_trt(NODES, trt, emulator_check=emu, groups=GROUPS)
    assert r.fp32 == ["n05", "n10", "n17"] and r.found
    assert r.emulator_fp32 == ["n05", "n17"] and r.emulator_agreed is False
    assert r.trt_only == ["n10"] and r.culprit_layers == ["L2"]
    assert all({"n05", "n17"} <= c for c in trt.calls[1:])  # never below the emulator plan
    assert r.trt_checks == len(set(trt.calls)) == len(trt.calls)  # memoized: no plan built twice
    assert r.trt_checks <= 10
    phases = [t["phase"] for t in r.trials]
    assert phases[:2] == ["fp16", "verify"] and "layers" in phases and phases[-1] == "nodes"


def test_engine_layer_groups_save_builds():
    """When TensorRT needs several nodes of one fused layer, searching layers first is cheaper."""
    def run(groups):
        trt = needs({"n05", "n17", "n12", "n13", "n15"})  # three of layer L3
        r = emulator_then_trt(NODES, trt, emulator_plan=["n05", "n17"], groups=groups)
        assert r.fp32 == ["n05", "n12", "n13", "n15", "n17"] and r.one_minimal_on_trt is False
        assert r.culprit_layers == (["L3"] if groups else [])
        return r.trt_checks
    with_groups, without = run(GROUPS), run(None)
    assert with_groups < without, (with_groups, without)


def test_layer_near_the_emulator_plan_is_tried_first():
    """The disagreement often sits in a layer fused with a node the emulator kept FP32."""
    trt = needs({"n05", "n06"})  # n06 shares layer L1 with n05
    r = emulator_then_trt(NODES, trt, emulator_plan=["n05"], groups=GROUPS)
    assert r.fp32 == ["n05", "n06"] and r.culprit_layers == ["L1"]
    layer_calls = [c for c in trt.calls[2:] if len(c) > 2]
    assert layer_calls and {"n04", "n06", "n07"} <= layer_calls[0]


def test_no_groups_searches_nodes():
    trt = needs({"n03", "n20"})
    r = emulator_then_trt(NODES, trt, emulator_plan=[])
    assert r.fp32 == ["n03", "n20"] and r.one_minimal_on_trt and r.emulator_agreed is False
    assert [t["phase"] for t in r.trials][:1] == ["fp16"] and "verify" not in [t["phase"] for t in r.trials]


def test_certify_removes_what_trt_does_not_need():
    trt = needs({"n05"})
    loose = emulator_then_trt(NODES, trt, emulator_plan=["n05", "n09"])
    assert loose.fp32 == ["n05", "n09"] and not loose.one_minimal_on_trt
    tight = emulator_then_trt(NODES, needs({"n05"}), emulator_plan=["n05", "n09"], certify=True)
    assert tight.fp32 == ["n05"] and tight.one_minimal_on_trt and tight.trt_checks == 3


def test_trt_never_passes():
    r = emulator_then_trt(NODES, lambda fp32: False, emulator_plan=["n01"], groups=GROUPS)
    assert not r.found and r.fp32 == NODES


def test_budget_stops_with_best_plan():
    r = emulator_then_trt(NODES, needs({"n05", "n17", "n10"}), emulator_plan=["n05", "n17"],
                             groups=GROUPS, max_trt_checks=3)  # fp16, verify, near layers: all fail
    assert r.stopped_early and r.trt_checks == 3 and not r.one_minimal_on_trt
    assert not r.found and r.fp32 == NODES
    r = emulator_then_trt(NODES, needs({"n05", "n17", "n10"}), emulator_plan=["n05", "n17"],
                             groups=GROUPS, max_trt_checks=5)
    assert r.stopped_early and r.found and {"n05", "n17", "n10"} <= set(r.fp32)
    r = emulator_then_trt(NODES, needs({"n05"}), emulator_plan=["n05"], max_trt_checks=1)
    assert r.stopped_early and not r.found and r.fp32 == NODES
    json.dumps(r.to_json())
