"""The search's own noise (search/noise.py): a search whose error rises when it keeps more in
FP32 stops at once and says `fragile` (#45 item 3)."""

from __future__ import annotations

import json

import numpy as np
import onnx
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from trtbisect.search import noise
from trtbisect.search.minimal import find_minimal_fp32
from trtbisect.search.noise import Monotony

F = frozenset


def test_a_monotone_search_is_never_noisy():
    m = Monotony(0.25)
    for i, (plan, p) in enumerate([((), 3.0), (("a",), 1.2), (("a", "b"), 0.9),
                                   (("a", "b", "c"), 0.1)], 1):
        assert m.add(i, F(plan), {"y": p}) is None
    assert m.worst is None and m.noisy() is None


def test_one_rise_is_physics_two_from_other_plans_are_noise():
    m = Monotony(0.25)
    m.add(1, F({"a"}), {"y": 0.8})
    m.add(2, F({"a", "b"}), {"y": 1.3})  # b kept FP32 uncovers a's error: can be physics
    assert m.worst is not None and m.worst.size == 1.3 - 0.8 and m.noisy() is None
    m.add(3, F({"c"}), {"y": 0.9})
    m.add(4, F({"c", "d"}), {"y": 1.05})  # under the share: not counted
    assert m.noisy() is None
    m.add(5, F({"c", "d", "e"}), {"y": 1.4})  # from {c}: another smaller plan, over the share
    got = m.noisy()
    assert got is not None and (got.smaller, got.larger, got.output) == (1, 2, "y")
    assert "0.8 to 1.3 of its bound (evaluations 1 and 2)" in got.text()


def test_rises_far_from_the_bound_or_from_a_partial_judgement_do_not_count():
    m = Monotony(0.25)
    m.add(1, F({"a"}), {"y": 900.0})
    m.add(2, F({"a", "b"}), {"y": 1200.0})  # an overflow moving: says nothing near the bound
    m.add(3, F({"c"}), {"y": 1.3})
    m.add(4, F({"c", "d"}), {"y": 2.0})  # from over 1 + share: failing either way
    m.add(5, F({"e"}), {"y": 0.5}, complete=False)  # a lower bound: never the smaller plan
    m.add(6, F({"e", "f"}), {"y": 1.5})
    m.add(7, F({"j"}), {"y": 0.3})
    m.add(8, F({"j", "k"}), {"y": 0.6})  # passing by far, still passing: no decision moved
    m.add(10, F({"j", "k", "l"}), {"y": 10.0})  # from far inside: a real interaction
    m.add(11, F({"g"}), {"y": 0.9})
    m.add(12, F({"g", "h"}), {"y": float("inf")})  # non-finite: not a pressure
    assert m.worst is None
    m.add(13, F({"g", "h", "i"}), {"y": 5.0})  # counted, capped at CEILING
    assert m.worst is not None and m.worst.size == noise.CEILING - 0.9


def test_one_addition_seen_from_nested_plans_is_one_rise():
    """The grow phase's prefixes: a unit added after three nested plans raises the error seen
    from each of them, yet it is one addition; the search is not called noisy for it."""
    m = Monotony(0.25)
    m.add(1, F({"a"}), {"y": 0.9})
    m.add(2, F({"a", "b"}), {"y": 0.9})
    m.add(3, F({"a", "b", "c"}), {"y": 0.9})
    m.add(4, F({"a", "b", "c", "d"}), {"y": 1.6})
    assert m.worst is not None and len(m.over) == 1 and m.noisy() is None


def _noisy_check(culprit: str, units: list[str]):
    """A criterion that needs `culprit` FP32 and whose error near the bound then moves with
    whichever other units happen to be FP32 (a hash of the plan): pressure per plan."""
    pressures: dict[frozenset[str], dict[str, float]] = {}

    def pressure(plan: frozenset[str]) -> float:
        if culprit not in plan:
            return 3.0
        if len(plan) == len(units):
            return 0.2  # everything FP32: clear of the bound
        wobble = (sum(units.index(u) * 7919 for u in plan) % 97) / 97  # 0 .. 1
        return 0.7 + 1.0 * wobble

    def check(plan: frozenset[str]) -> bool:
        p = pressure(plan)
        pressures[plan] = {"y": p}
        return p <= 1.0

    return check, pressures


def test_a_noisy_criterion_stops_the_search_at_once_with_a_passing_plan():
    units = [f"u{i}" for i in range(64)]
    check, pressures = _noisy_check("u40", units)
    chased = find_minimal_fp32(units, check, seeds=[], ranking=units)
    m = Monotony(0.25)

    def watch(index, plan):
        m.add(index, plan, pressures[plan])
        return m.noisy()
    decided = find_minimal_fp32(units, check, seeds=[], ranking=units, watch=watch)
    assert decided.noisy is not None and decided.found and not decided.one_minimal
    assert check(frozenset(decided.fp32))  # the plan written passes
    assert decided.evaluations < chased.evaluations
    assert decided.to_json()["noisy"]["rise"] > 0.25


def _ties(path, seed: int = 0, sharpen: float = 60.0, depth: int = 12, n: int = 16):
    """A softmax whose two largest classes tie in FP32 (`depth` MatMuls by random orthogonal
    matrices, then logits sharpened and biased so that classes 0 and 1 are equal and on top):
    each FP16 rounding moves the tie, and which MatMuls stay FP32 decides by how much. All-FP16
    misses the default bound; near it, the error moves with whichever MatMuls are FP32."""
    rng = np.random.default_rng(seed)
    weights = [np.linalg.qr(rng.normal(0, 1, (n, n)))[0].astype(np.float32)
               for _ in range(depth)]
    x = rng.normal(0, 1, (1, n)).astype(np.float32)
    z = x[0]
    for w in weights:
        z = (z.astype(np.float64) @ w.astype(np.float64)).astype(np.float32)
    b = (-sharpen * z).astype(np.float32)
    b[:2] += 4.0
    inits = [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)]
    inits += [numpy_helper.from_array(np.array(sharpen, np.float32), "s"),
              numpy_helper.from_array(b[None], "b")]
    nodes, h = [], "x"
    for i in range(depth):
        nodes.append(helper.make_node("MatMul", [h, f"w{i}"], [f"h{i}"], name=f"mm{i}"))
        h = f"h{i}"
    nodes += [helper.make_node("Mul", [h, "s"], ["zs"], name="sharpen"),
              helper.make_node("Add", ["zs", "b"], ["z"], name="bias"),
              helper.make_node("Softmax", ["z"], ["y"], name="softmax", axis=-1)]
    g = helper.make_graph(nodes, "ties", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, n])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, n])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8),
              path / "ties.onnx")
    np.savez(path / "ties.npz", x=x)
    return path / "ties.onnx", path / "ties.npz"


def test_a_planted_borderline_model_is_fragile_within_a_few_evaluations(tmp_path, monkeypatch):
    """The tie: the run stops its search once two plans got worse by over a quarter of the
    bound with more FP32, writes its best passing plan, says `fragile` (exit 7) and names
    criteria that fit; without the watch the same search takes more evaluations."""
    from trtbisect.cli import main

    model, inputs = _ties(tmp_path)
    res = CliRunner().invoke(main, ["run", str(model), "--inputs", str(inputs), "--out",
                                    str(tmp_path / "out"), "--json"])
    assert res.exit_code == 7, res.output
    doc = json.loads(res.stdout)
    assert doc["verdict"] == "fragile" and doc["fp32_nodes"]
    rise = doc["certificate"]["search_noise"]
    assert rise["output"] == "y" and rise["rise"] > 0.25
    assert "cannot tell plans apart" in doc["certificate"]["decided"] or \
        "noise is as large" in doc["certificate"]["decided"]
    assert not doc.get("aimed_searches") and doc["criterion_hints"]
    assert doc["evaluations"] <= 30  # docs/trust.md: fragile in about 25
    check = CliRunner().invoke(main, ["check", str(tmp_path / "out" / "ties.mixed.onnx"),
                                      "--reference", str(model), "--inputs", str(inputs)])
    assert check.exit_code == 0, check.output  # the plan written passes as `check` judges it

    monkeypatch.setattr(noise, "REPEATS", 10**6)
    res = CliRunner().invoke(main, ["run", str(model), "--inputs", str(inputs), "--out",
                                    str(tmp_path / "chased"), "--json"])
    assert json.loads(res.stdout)["evaluations"] > doc["evaluations"]


def test_a_run_cut_before_its_noise_decision_resumes_to_the_same_verdict(tmp_path,
                                                                          monkeypatch):
    """Each verdict's pressures are journaled: a run killed before the search decides replays
    them and stops where the uninterrupted run stopped, with the same plan and evaluations."""
    from tests.search.test_aimed_resume import _counting
    from trtbisect.context import Options
    from trtbisect.pipeline import run

    calls = _counting(monkeypatch)
    model, inputs = _ties(tmp_path)
    opts = Options.of(inputs=[str(inputs)])
    out = tmp_path / "out"
    fresh = run(model, opts, out)
    fresh_calls = len(calls)
    assert fresh.verdict == "fragile" and fresh.search.noisy is not None
    header, *lines = (out / "journal.jsonl").read_text().splitlines()
    done = [k for k, ln in enumerate(lines) if '"done"' in ln]
    assert all('"pressure"' in lines[k] for k in done)
    cut = done[len(done) // 2] + 2  # half the verdicts done, the next one in flight
    (out / "journal.jsonl").write_text("\n".join([header, *lines[:cut]]) + "\n")
    calls.clear()
    again = run(model, opts, out)
    assert len(calls) < fresh_calls  # the verdicts before the cut are replayed, not judged
    assert again.verdict == "fragile" and again.fp32_nodes == fresh.fp32_nodes
    assert again.evaluations == fresh.evaluations
    assert again.search.noisy == fresh.search.noisy


def test_the_noise_decision_is_the_same_on_workers(tmp_path):
    """The pressures come from the verdicts the search takes, in its order: on 2 worker
    processes the search stops at the same evaluation with the same plan."""
    from trtbisect.context import Options
    from trtbisect.pipeline import run

    model, inputs = _ties(tmp_path)
    one, two = (run(model, Options.of(inputs=[str(inputs)], workers=w), tmp_path / f"w{w}")
                for w in (1, 2))
    assert two.workers.workers == 2
    assert one.verdict == two.verdict == "fragile"
    assert (one.fp32_nodes, one.evaluations, one.search.noisy) == \
        (two.fp32_nodes, two.evaluations, two.search.noisy)
