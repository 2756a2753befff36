"""--budget steers the search (#36): only plans within the budget are evaluated; the cheapest
passing one within it is returned, else the best failing one within it, over budget."""

from __future__ import annotations

from trtbisect.search.minimal import find_minimal_fp32

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


# ---------------------------------------------------------------- on a model, end to end

HOOK = '''import numpy as np


def check(fp32, fp16, sample):
    """Either output right will do: y1 (an overflowing MatMul) or y2 (a cancellation)."""
    first = np.allclose(fp16["y1"], fp32["y1"], rtol=1e-2)
    second = np.allclose(fp16["y2"], fp32["y2"], rtol=1e-2, atol=1e-7)
    return bool(first or second)
'''


def either_model(tmp_path):
    """Two ways to pass the hook: the MatMul layer whose output overflows FP16 (dear: its FP32
    math and weights; the prior points at it), or the pointwise layer whose cancellation FP16
    loses (c = 1 + 2^-12 rounds to 1; cheap: it moves FP32 inputs and outputs either way)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    shape = [64, 256]
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("x", "z", "y1", "y2")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Mul", ["h", "milli"], ["y1"], name="shrink"),
             helper.make_node("Mul", ["z", "c"], ["b"], name="scale"),
             helper.make_node("Sub", ["b", "z"], ["y2"], name="diff")]
    inits = [numpy_helper.from_array(np.full((256, 256), 300, np.float32), "W"),
             numpy_helper.from_array(np.array(1e-3, np.float32), "milli"),
             numpy_helper.from_array(np.array(1 + 2**-12, np.float32), "c")]
    model = helper.make_model(helper.make_graph(nodes, "g", vi[:2], vi[2:], inits),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, tmp_path / "either.onnx")
    np.savez(tmp_path / "either.npz", x=(1 + rng.random(shape)).astype(np.float32),
             z=rng.standard_normal(shape).astype(np.float32))
    (tmp_path / "either_check.py").write_text(HOOK)
    return tmp_path / "either.onnx"


def _run(tmp_path, name, *extra):
    import json

    from click.testing import CliRunner

    from trtbisect.cli import main

    out = tmp_path / name
    res = CliRunner().invoke(main, ["run", str(tmp_path / "either.onnx"), "--inputs",
                                    str(tmp_path / "either.npz"), "--check",
                                    f"{tmp_path / 'either_check.py'}:check", "--out", str(out),
                                    "-q", *extra])
    precision = json.loads((out / "precision.json").read_text())
    trace = json.loads((out / "trace.json").read_text())
    return res, precision, trace


def test_on_a_model_the_budget_finds_the_passing_plan_the_free_search_never_evaluates(tmp_path):
    either_model(tmp_path)
    res, free, free_trace = _run(tmp_path, "free")
    assert res.exit_code == 0, res.output
    assert free["verdict"] == "fixed" and list(free["cost"]["units"]) == ["mm + shrink"]
    assert free["cost"]["slowdown"] > 0.05  # the dear plan: over a 5% budget
    res, within, trace = _run(tmp_path, "within", "--budget", "5")
    assert res.exit_code == 0, res.output
    assert within["verdict"] == "fixed" and list(within["cost"]["units"]) == ["PWN(scale, diff)"]
    assert within["cost"]["within_budget"] and within["cost"]["slowdown"] <= 0.05
    base = within["cost"]["all_fp16_s"]
    assert all(t["price_s"] <= base * 1.05 * (1 + 1e-9) for t in trace["trials"])
    assert not any("mm + shrink" in t["fp32"] for t in trace["trials"])
    assert {tuple(t["fp32"]) for t in trace["trials"]} != \
        {tuple(t["fp32"]) for t in free_trace["trials"]}


def test_on_a_model_a_budget_nothing_passes_in_is_over_budget_with_the_best_plan_within(tmp_path):
    either_model(tmp_path)
    (tmp_path / "either_check.py").write_text(HOOK.replace("first or second", "first"))
    res, precision, trace = _run(tmp_path, "tight", "--budget", "5")
    assert res.exit_code == 6, res.output
    assert precision["verdict"] == "over_budget" and precision["cost"]["within_budget"]
    base = precision["cost"]["all_fp16_s"]
    assert all(t["price_s"] <= base * 1.05 * (1 + 1e-9) for t in trace["trials"])
