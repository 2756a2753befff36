"""Validation on samples the search never saw (judge/validation.py), and the certificate that
decides instead of chasing noise (stages/spread.py, stages/search.py `aim`)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from trtbisect.cli import main
from trtbisect.judge import validation
from trtbisect.result import RunResult, StrictError


def _save_1d(tmp_path, name: str, nodes, consts, size: int):
    """A model of `nodes` over a float input x[size] with scalar constants `consts`
    ((name, value) pairs) and output y[size], saved as NAME.onnx; its path."""
    k = [helper.make_tensor(n, TensorProto.FLOAT, [], [v]) for n, v in consts]
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [size])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [size])], k)
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8),
              path)
    return path


def _two_overflows(tmp_path, x_searched, x_held):
    """y = x*1e3*1e3/1e6 + x*300*300/9e4: the first chain overflows FP16 once |x| > 0.066,
    the second once |x| > 0.73. The sample the search sees and the one held out are saved so
    that the split (seed 0) holds out `x_held`."""
    nodes = [helper.make_node("Mul", ["x", "k1"], ["a1"], name="p1_up"),
             helper.make_node("Mul", ["a1", "k1"], ["a2"], name="p1_up2"),
             helper.make_node("Div", ["a2", "d1"], ["a3"], name="p1_down"),
             helper.make_node("Mul", ["x", "k2"], ["b1"], name="p2_up"),
             helper.make_node("Mul", ["b1", "k2"], ["b2"], name="p2_up2"),
             helper.make_node("Div", ["b2", "d2"], ["b3"], name="p2_down"),
             helper.make_node("Add", ["a3", "b3"], ["y"], name="sum")]
    path = _save_1d(tmp_path, "two", nodes,
                    (("k1", 1e3), ("d1", 1e6), ("k2", 300.0), ("d2", 9e4)), 8)
    kept, held = validation.split(2, validation.HOLD_OUT_SHARE, 0)
    order = {held[0]: x_held, kept[0]: x_searched}
    files = []
    for i in (0, 1):
        f = tmp_path / f"s{i}.npz"
        np.savez(f, x=np.asarray(order[i], np.float32))
        files.append(str(f))
    return path, files


def test_split_is_seeded_holds_out_a_share_and_never_every_sample():
    assert validation.split(1, 0.25, 0) == ([0], [])
    assert validation.split(8, 0, 0) == (list(range(8)), [])
    kept, held = validation.split(8, 0.25, 3)
    assert len(held) == 2 and sorted(kept + held) == list(range(8))
    assert validation.split(8, 0.25, 3) == (kept, held)  # the seed decides, nothing else
    assert validation.split(2, 0.9, 0)[1] and validation.split(2, 0.9, 0)[0]


def test_perturbed_copies_fit_each_input_type():
    rng = np.random.default_rng(0)
    sample = {"x": rng.standard_normal((4, 16)).astype(np.float16),
              "ids": rng.integers(5, 9, (1, 64)).astype(np.int64),
              "sr": np.array(16000, np.int64), "mask": np.ones((1, 64), bool)}
    a, b = validation.perturb(sample, 1), validation.perturb(sample, 1)
    for k in sample:
        assert a[k].dtype == sample[k].dtype and a[k].shape == sample[k].shape
        assert np.array_equal(a[k], b[k])  # seeded
    moved = np.abs(a["x"].astype(np.float64) - sample["x"])
    assert 0 < moved.max() < 10 * validation.PERTURB_SCALE * float(np.std(sample["x"]))
    assert set(np.unique(a["ids"])) <= set(np.unique(sample["ids"]))  # values it holds
    assert 0 < int((a["ids"] != sample["ids"]).sum()) <= 4  # 5% of 64 positions redrawn
    assert a["sr"] == sample["sr"] and a["mask"].all()  # shape-like and boolean: as given


def test_a_plan_fitted_to_its_sample_fails_the_held_out_one_and_is_not_fixed(tmp_path):
    """The search sees |x| = 0.5 (the first chain overflows); the held-out sample reaches 1.0
    (both do): the plan passes its sample and fails the unseen one: `unvalidated`, exit 9,
    written with the validation's errors."""
    from trtbisect.context import Options
    from trtbisect.pipeline import run

    easy = [0.5, 0.2, -0.3, 0.1, 0.4, -0.5, 0.25, 0.3]
    hard = [1.0, 0.9, -0.95, 0.8, 0.3, -1.0, 0.2, 0.85]
    path, files = _two_overflows(tmp_path, easy, hard)
    r = run(path, Options.of(inputs=files, semantics="strict"), tmp_path / "out")
    assert r.verdict == "unvalidated" and r.exit_code == 9
    # the first chain's overflow, not the second's (the searched sample never overflows it)
    assert {"p1_up2", "p1_down"} <= set(r.fp32_nodes) and "p2_up2" not in r.fp32_nodes
    assert r.validation.kind == "held_out" and r.validation.passed is False
    assert r.validation.indices == validation.split(2, validation.HOLD_OUT_SHARE, 0)[1]
    written = json.loads((tmp_path / "out" / "precision.json").read_text())
    assert written["verdict"] == "unvalidated" and written["validation"] == r.validation.to_json()
    back = RunResult.typed_from_json(written)["validation"]  # the record again, by attribute
    assert back.to_json() == r.validation.to_json() and back.overall is r.validation.overall
    assert back.passed is False and back.indices == r.validation.indices
    assert (tmp_path / "out" / "two.mixed.onnx").exists()  # the plan is still written

    # the hard sample searched, the easy one held out: the plan covers both, and holds
    path, files = _two_overflows(tmp_path, hard, easy)
    r = run(path, Options.of(inputs=files, semantics="strict"), tmp_path / "out2")
    assert r.verdict == "fixed" and r.validation.passed is True
    assert {"p1_up2", "p2_up2"} <= set(r.fp32_nodes)

    # the command says it in one line and exits 9
    path, files = _two_overflows(tmp_path, easy, hard)
    res = CliRunner().invoke(main, ["run", str(path), *sum((["--inputs", f] for f in files),
                                                           []), "--semantics", "strict",
                                    "--out", str(tmp_path / "cli")])
    assert res.exit_code == 9, res.output
    assert "unvalidated" in res.output and "validation on 1 held-out sample" in res.output
    assert "FAILS" in res.output
    # no validation asked for: the plan is fixed on what it was searched on, and says so
    res = CliRunner().invoke(main, ["run", str(path), *sum((["--inputs", f] for f in files),
                                                           []), "--semantics", "strict",
                                    "--validation-share", "0", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["verdict"] == "fixed" and out["validation"]["kind"] == "none"


def test_one_sample_near_the_bound_is_validated_on_perturbed_copies(tmp_path):
    """One sample whose second chain sits just under 65504 (x = 1.0 times 65500): the plan
    for the first chain passes it, and perturbed copies push the second over: never fixed."""
    nodes = [helper.make_node("Mul", ["x", "k1"], ["a1"], name="p1_up"),
             helper.make_node("Mul", ["a1", "k1"], ["a2"], name="p1_up2"),
             helper.make_node("Div", ["a2", "d1"], ["a3"], name="p1_down"),
             helper.make_node("Mul", ["x", "k2"], ["b1"], name="p2_up"),
             helper.make_node("Div", ["b1", "k2"], ["b2"], name="p2_down"),
             helper.make_node("Add", ["a3", "b2"], ["y"], name="sum")]
    path = _save_1d(tmp_path, "near", nodes, (("k1", 1e3), ("d1", 1e6), ("k2", 65500.0)), 16)
    x = np.array([1.0] * 8 + [0.5, 0.2, 0.1, 0.3, 0.6, 0.4, 0.2, 0.5], np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    from trtbisect.context import Options
    from trtbisect.pipeline import run
    r = run(path, Options.of(inputs=[str(tmp_path / "x.npz")], semantics="strict"),
            tmp_path / "out")
    assert {"p1_up2", "p1_down"} <= set(r.fp32_nodes) and "p2_up" not in r.fp32_nodes
    assert r.validation.kind == "perturbed" and r.validation.passed is False
    assert r.verdict == "unvalidated"


def test_a_spread_as_large_as_the_effect_is_fragile_at_once(tmp_path):
    """A bound a quarter of FP32's own noise floor: no aimed search can help, so none runs;
    the evaluations are the first search's alone and the certificate says why."""
    from tests.judge.test_trust import _matmul
    from trtbisect.backends.ort import Reference, kernel_noise
    from trtbisect.context import Options
    from trtbisect.graph import Graph
    from trtbisect.judge.compare import Tolerance
    from trtbisect.pipeline import run
    m, path, inputs = _matmul(tmp_path)
    g, x = Graph(m), dict(np.load(inputs))
    ref = Reference(g).run(x)
    rtol = kernel_noise(g, [x], [ref])["y"] / 4 / float(np.abs(ref["y"]).max())
    r = run(path, Options.of(inputs=[str(inputs)], tolerance=Tolerance(rtol)), tmp_path / "out")
    assert r.verdict == "fragile" and r.exit_code == 7
    assert not r.aimed_searches and "noise is as large" in r.certificate.decided
    assert r.evaluations <= 3  # all-FP16, then the one unit: no search again


def test_aimed_rounds_share_a_fraction_of_the_first_search():
    from trtbisect.stages.search import aim_allowance
    from trtbisect.stages.spread import AIM_FLOOR
    assert aim_allowance(0) == AIM_FLOOR
    assert aim_allowance(1000) == 200  # at most 20% more evaluations than the search


def test_retarget_carries_known_failures_to_a_tighter_bound(tmp_path):
    """A plan that failed under the looser bound is not judged again under the aimed one."""
    from tests.judge.test_trust import _matmul
    from trtbisect.context import Options, prepare
    from trtbisect.judge.compare import Tolerance
    from trtbisect.stages.evaluator import Evaluator
    _, path, inputs = _matmul(tmp_path)
    opts = Options.of(inputs=[str(inputs)], tolerance=Tolerance(1e-9))
    ctx = prepare(path, opts)
    ev = Evaluator(ctx, opts.judge, {}, None)
    assert ev.check(frozenset()) is False
    runs = ev.runs
    again = ev.retarget(opts.judge, {}, "aim:x")
    assert again.check(frozenset()) is False and again.runs == 0 and runs == 1
    again.close()


def test_a_declared_shape_the_model_contradicts_is_not_written(tmp_path):
    """An exporter's rank-0 declaration on a [2, 3] output: the run's copy declares it of rank
    2 with symbolic dimensions, so the written file declares nothing false and `check` accepts
    it."""
    g = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["y"], name="sq")], "r0",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    path = tmp_path / "r0.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8),
              path)
    np.savez(tmp_path / "x.npz", x=np.ones((2, 3), np.float32))
    res = CliRunner().invoke(main, ["run", str(path), "--inputs", str(tmp_path / "x.npz"),
                                    "--out", str(tmp_path / "out"), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert any("declare output 'y' as ['y_d0', 'y_d1']" in n for n in out["model_copy"])
    mixed = onnx.load(tmp_path / "out" / "r0.mixed.onnx")
    dims = mixed.graph.output[0].type.tensor_type.shape.dim
    assert [d.dim_param for d in dims] == ["y_d0", "y_d1"]
    res = CliRunner().invoke(main, ["check", str(tmp_path / "out" / "r0.mixed.onnx"),
                                    "--reference", str(path), "--inputs",
                                    str(tmp_path / "x.npz")])
    assert res.exit_code == 0, res.output


def test_a_metric_plan_needs_its_score_clear_of_the_threshold_by_the_spread():
    """Under `--metric` the certificate holds each score against its threshold: the worst
    score over the samples, the largest move of it under the variations; certified only
    when the margin exceeds that move (#46 item 3)."""
    from trtbisect.judge.compare import Tolerance
    from trtbisect.judge.flags import parse_criteria
    from trtbisect.stages.spread import _score_margins

    crit = parse_criteria(metrics=["cosine:0.99"])
    rng = np.random.default_rng(0)
    ref = {"y": rng.standard_normal(64)}
    near = {"y": ref["y"] + 0.1 * rng.standard_normal(64)}  # cosine ~0.995
    judged = [crit.judge(ref, near, {}, Tolerance())]
    score = judged[0].errors["y"].scores[0].value
    assert 0.99 < score < 1
    still = {"ORT variant": [crit.judge(ref, near, {}, Tolerance())]}
    (m,) = _score_margins(judged, still, {0}).values()
    # in severity (1 at the threshold): a metric's (1 - score) / (1 - threshold)
    assert m.spread == 0 and m.margin == pytest.approx((score - 0.99) / 0.01) and m.certified
    moved = {"y": ref["y"] + 0.14 * rng.standard_normal(64)}  # the variant's score drops
    far = {"ORT variant": [crit.judge(ref, moved, {}, Tolerance())]}
    (m,) = _score_margins(judged, far, {0}).values()
    assert m.spread > m.margin > 0 and not m.certified


def test_fp16_as_it_is_passing_only_its_searched_sample_is_not_fp16_ok(tmp_path):
    """y = x*256*256/65536 (powers of two: exact in FP16 until x*65536 overflows, |x| > 1).
    The searched sample stays under 1, the held-out one reaches 1.5: all-FP16 passes what it
    was judged on and fails the unseen sample, so the verdict is `unvalidated` with no FP32
    node, said as FP16 as it is, exit 9."""
    nodes = [helper.make_node("Mul", ["x", "up"], ["a"], name="up1"),
             helper.make_node("Mul", ["a", "up"], ["b"], name="up2"),
             helper.make_node("Mul", ["b", "down"], ["y"], name="down")]
    path = _save_1d(tmp_path, "pow2", nodes, (("up", 256.0), ("down", 1 / 65536)), 8)
    kept, held = validation.split(2, validation.HOLD_OUT_SHARE, 0)
    xs = {kept[0]: [0.5, -0.25, 0.75, 0.125, -0.5, 0.25, 0.0, -0.75],
          held[0]: [1.5, -1.25, 0.5, 1.0, -1.5, 0.25, 0.0, 1.25]}
    files = []
    for i in (0, 1):
        np.savez(tmp_path / f"s{i}.npz", x=np.asarray(xs[i], np.float32))
        files.append(str(tmp_path / f"s{i}.npz"))
    res = CliRunner().invoke(main, ["run", str(path), *sum((["--inputs", f] for f in files),
                                                           []), "--semantics", "strict",
                                    "--out", str(tmp_path / "out")])
    assert res.exit_code == 9, res.output
    assert "unvalidated: FP16 as it is meets" in " ".join(res.output.split())
    written = json.loads((tmp_path / "out" / "precision.json").read_text())
    assert written["verdict"] == "unvalidated" and written["fp32_nodes"] == []
    assert written["validation"]["passed"] is False
    from trtbisect.context import Options
    from trtbisect.pipeline import run
    from trtbisect.reports.report import verdict_line
    r = run(path, Options.of(inputs=files, semantics="strict"))
    assert r.verdict == "unvalidated" and verdict_line(r).startswith(
        "unvalidated: FP16 as it is meets")


def test_inputs_read_as_shapes_or_counts_are_not_perturbed():
    """Resize's scales (a float input), a length that feeds Range through integer arithmetic
    and Casts: read as a shape or a count, never perturbed; token ids that feed a Gather and
    the image that is resized: perturbed."""
    from trtbisect.graph import Graph

    one = helper.make_tensor("one", TensorProto.INT64, [], [1])
    zero = helper.make_tensor("zero", TensorProto.INT64, [], [0])
    emb = helper.make_tensor("emb", TensorProto.FLOAT, [10, 2], list(np.arange(20.0)))
    nodes = [helper.make_node("Resize", ["img", "", "scales"], ["big"], name="resize"),
             helper.make_node("Cast", ["n"], ["n64"], to=TensorProto.INT64, name="cast"),
             helper.make_node("Add", ["n64", "one"], ["n1"], name="plus"),
             helper.make_node("Range", ["zero", "n1", "one"], ["r"], name="range"),
             helper.make_node("Gather", ["emb", "ids"], ["e"], name="gather")]
    vi = helper.make_tensor_value_info
    g = helper.make_graph(nodes, "shapes",
                          [vi("img", TensorProto.FLOAT, [1, 1, 4, 4]),
                           vi("scales", TensorProto.FLOAT, [4]),
                           vi("n", TensorProto.INT32, []), vi("ids", TensorProto.INT64, [16])],
                          [vi("big", TensorProto.FLOAT, None), vi("r", TensorProto.INT64, None),
                           vi("e", TensorProto.FLOAT, [16, 2])], [one, zero, emb])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    keep = validation.shape_like_inputs(Graph(model))
    assert keep == {"scales", "n"}
    rng = np.random.default_rng(0)
    sample = {"img": rng.standard_normal((1, 1, 4, 4)).astype(np.float32),
              "scales": np.array([1, 1, 2, 2], np.float32), "n": np.array(5, np.int32),
              "ids": rng.integers(0, 10, 16).astype(np.int64)}
    copy = validation.perturb(sample, 3, keep)
    assert np.array_equal(copy["scales"], sample["scales"]) and copy["n"] == 5
    assert not np.array_equal(copy["img"], sample["img"])
    assert not np.array_equal(copy["ids"], sample["ids"])


def test_a_validation_and_its_scores_read_back_from_json_are_the_records_again():
    """precision.json's "validation" and "errors_before_strict" make the frozen records again:
    a metric's score keeps which way is better and its unit (its entry's, by its name), a
    non-finite number written as text is a float again, a held-out run's overall verdict
    stays the one it reported."""
    import math

    from trtbisect.judge import metrics
    from trtbisect.judge.compare import OutputError
    from trtbisect.judge.criteria import Score, Verdict

    snr = Score("snr:20", "y", 15.0, 20.0, False, True, (), "dB")
    cos = Score("cosine:0.99", "y", 0.995, 0.99, True, True)
    stat = Score("quantile", "y", 7e-6, 0.0, True, False, (("quantile", 0.99), ("rel", 0.2),
                                                          ("rtol", 0.01)))
    err = OutputError(math.inf, 0.5, math.inf, 2.0, 1.5, 0.25, 3, False, (snr, cos, stat), 1, 0)
    verdict = Verdict(False, {"y": err}, (Score("check", None, 0.5, math.nan, True),),
                      (True, False), (0.5, math.inf), 2)
    held = validation.Validation("held_out", "1 held-out sample (#1)", [], verdict, [1], False)
    entries = metrics.entries()
    again = validation.Validation.from_json(json.loads(json.dumps(held.to_json())), entries)
    assert again.to_json() == held.to_json() and again.passed is False
    assert again.verdict.errors["y"].scores[:2] == (snr, cos) and again.verdict.severities[1] > 1
    assert [s.text() for s in again.verdict.errors["y"].scores] == [
        s.text() for s in err.scores]  # "need >= 20 dB", not "need <= 20"
    assert again.verdict.scores[0].criterion == "check" and math.isnan(again.verdict.scores[0].bound)
    strict = StrictError(err)
    back = StrictError.from_json(json.loads(json.dumps(strict.to_json())), entries)
    assert back.to_json() == strict.to_json() and back.text == strict.text
    assert back.error.max_abs == math.inf and back.error.sample == 1
    none = validation.unvalidated("validation turned off (--validation-share 0)")
    assert validation.Validation.from_json(none.to_json(), entries) == none
