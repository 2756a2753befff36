"""`fixed` holds outside the run (issue #32): every written file loads, `check` judges exactly
the file it is given, and a plan within the spread of what the tools may compute is never
called fixed."""

from __future__ import annotations

import numpy as np
import onnx
from click.testing import CliRunner
from onnx import TensorProto, helper

from tests.models.control_flow_models import if_untyped_branch_outputs
from trtbisect.cli import main
from trtbisect.judge.loadable import checker_problem, runtime_problem


def _branches_that_disagree(tmp_path):
    """The planted untyped If with its else branch stored in float16: the two branches give
    the If two types, which no runtime loads (the file the old writer made for silero-vad)."""
    p = if_untyped_branch_outputs()
    model, inputs = tmp_path / "model.onnx", tmp_path / "x.npz"
    onnx.save(p.model, model)
    np.savez(inputs, **p.inputs)
    broken = onnx.ModelProto()
    broken.CopyFrom(p.model)
    other = next(a.g for a in broken.graph.node[3].attribute if a.name == "else_branch")
    other.node[-1].output[0] = "else_y_f32"
    other.node.append(helper.make_node("Cast", ["else_y_f32"], ["else_y"], to=TensorProto.FLOAT16,
                                       name="half"))
    path = tmp_path / "broken.onnx"
    onnx.save(broken, path)
    return model, inputs, path


def test_check_refuses_a_file_no_runtime_loads_naming_the_checker_error(tmp_path):
    model, inputs, broken = _branches_that_disagree(tmp_path)
    assert runtime_problem(broken) is not None and checker_problem(broken) is not None
    r = CliRunner().invoke(main, ["check", str(broken), "--reference", str(model),
                                  "--inputs", str(inputs)])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "does not load" in lines[0] and "branch" in lines[0]
    assert "pass" not in r.output.lower().split("does not load")[0]


def test_check_judges_a_file_that_loads_as_it_is(tmp_path):
    p = if_untyped_branch_outputs()
    model, inputs = tmp_path / "model.onnx", tmp_path / "x.npz"
    onnx.save(p.model, model)
    np.savez(inputs, **p.inputs)
    r = CliRunner().invoke(main, ["check", str(model), "--reference", str(model),
                                  "--inputs", str(inputs)])
    assert r.exit_code == 0, r.output


# ---------------------------------------------------------------- the margin before `fixed`

def _matmul(tmp_path, k: int = 256):
    """y = x @ W with K=256: kernels that sum in another order (ORT's optimized MatMul,
    another thread count) move max|d| by a few ulp: the spread."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((k, 64)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 64])],
                          [onnx.numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=10)
    path, inputs = tmp_path / "mm.onnx", tmp_path / "x.npz"
    onnx.save(m, path)
    np.savez(inputs, x=rng.standard_normal((8, k)).astype(np.float32) * 10)
    return m, path, inputs


def _all_fp16_rel(m, inputs) -> float:
    from trtbisect.backends.ort import Emulator, Reference
    from trtbisect.graph import Graph
    from trtbisect.judge.compare import Tolerance, compare_outputs

    g, x = Graph(m), dict(np.load(inputs))
    return compare_outputs(Reference(g).run(x), Emulator(g).run(frozenset(), x),
                           Tolerance(0.0))["y"].rel


def test_fp16_passing_within_the_spread_is_searched_again_inside_the_bound(tmp_path):
    """All-FP16 passes the judge by a hair (a tolerance 1e-6 above its error): that is inside
    what ORT's optimized kernels move the error by, so it is not `fp16_ok`; the search aims
    inside the bound and keeps the MatMul in FP32, which holds with margin."""
    from trtbisect.context import Options
    from trtbisect.judge.compare import Tolerance
    from trtbisect.pipeline import run

    m, path, inputs = _matmul(tmp_path)
    rel = _all_fp16_rel(m, inputs)
    r = run(path, Options.of(inputs=[str(inputs)], tolerance=Tolerance(rel * (1 + 1e-6))),
            tmp_path / "out")
    assert r.verdict == "fixed" and r.fp32_nodes == ["mm"] and r.exit_code == 0
    cert = r.certificate
    assert cert.certified and cert.aim_rounds == 1
    y = cert.outputs["y"]
    assert y.margin > y.spread > 0 and y.spread >= y.noise_floor
    from trtbisect.backends.ort import variants
    assert set(cert.variants) == {v.label for v in variants(None)}  # every variation ran
    assert any(v.startswith("ORT optimizations on") for v in cert.variants)
    assert any(v.endswith((", 1 thread", "threads")) and "off" in v for v in cert.variants)
    (aim,) = r.aimed_searches
    assert aim.found and aim.ceiling["y"] < y.bound
    plan = __import__("json").loads((tmp_path / "out" / "precision.json").read_text())
    assert plan["verdict"] == "fixed" and plan["fragile"] is False
    assert plan["certificate"] == __import__("json").loads(__import__("json").dumps(cert.to_json()))
    from trtbisect.result import RunResult
    back = RunResult.typed_from_json(plan)  # the frozen records again, from precision.json
    assert back["certificate"] == cert and back["aimed_searches"] == [aim]


def test_no_plan_with_the_margin_is_fragile_exit_7_and_still_written(tmp_path):
    """A bound below the FP32 noise floor: even all-FP32 cannot pass by more than the spread."""
    from trtbisect.backends.ort import Reference, kernel_noise
    from trtbisect.context import Options
    from trtbisect.graph import Graph
    from trtbisect.judge.compare import Tolerance
    from trtbisect.pipeline import run

    m, path, inputs = _matmul(tmp_path)
    g, x = Graph(m), dict(np.load(inputs))
    ref = Reference(g).run(x)
    noise = kernel_noise(g, [x], [ref])["y"]
    assert noise > 0
    rtol = noise / 4 / float(np.abs(ref["y"]).max())
    r = run(path, Options.of(inputs=[str(inputs)], tolerance=Tolerance(rtol)), tmp_path / "out")
    assert r.verdict == "fragile" and r.exit_code == 7
    assert r.fp32_nodes == ["mm"]  # the nearest plan: it passes the judge, without margin
    assert not r.certificate.certified
    assert (tmp_path / "out" / "mm.mixed.onnx").exists()
    res = CliRunner().invoke(main, ["run", str(path), "--inputs", str(inputs), "--rtol",
                                    repr(rtol), "--out", str(tmp_path / "cli"), "--json"])
    assert res.exit_code == 7, res.output
    assert __import__("json").loads(res.stdout)["verdict"] == "fragile"


# ---------------------------------------------------------------- renderings pass as written

def _conv_detector(tmp_path):
    """A small detector head: Conv, BatchNorm, Relu, Conv, Sigmoid, the kind of graph ONNX
    Runtime's default optimizations rewrite (Conv+BN folding, NCHWc kernels)."""
    rng = np.random.default_rng(3)
    f = onnx.numpy_helper.from_array
    inits = [f(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w1"),
             f(np.abs(rng.standard_normal(8)).astype(np.float32) + 0.5, "scale"),
             f(rng.standard_normal(8).astype(np.float32), "bias"),
             f(rng.standard_normal(8).astype(np.float32), "mean"),
             f(np.abs(rng.standard_normal(8)).astype(np.float32) + 0.5, "var"),
             f(rng.standard_normal((1, 8, 3, 3)).astype(np.float32) * 0.3, "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("BatchNormalization", ["c1", "scale", "bias", "mean", "var"],
                              ["b1"], name="bn1"),
             helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("Sigmoid", ["c2"], ["score"], name="head")]
    g = helper.make_graph(nodes, "det", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, 32, 32])], [helper.make_tensor_value_info(
            "score", TensorProto.FLOAT, [1, 1, 32, 32])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    path, inputs = tmp_path / "det.onnx", tmp_path / "det.npz"
    onnx.save(m, path)
    np.savez(inputs, x=(rng.standard_normal((1, 3, 32, 32)) * 3).astype(np.float32))
    return m, path, inputs


def _rendered_polygraphy_check(out):
    import json
    import shlex
    import subprocess
    import sys
    from pathlib import Path

    poly = Path(sys.executable).parent / "polygraphy"
    text = json.loads((out / "precision.json").read_text())["renderings"]["polygraphy_check"]
    lines = [shlex.split(ln) for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert len(lines) == 2 and all(argv[0] == "polygraphy" for argv in lines)
    for argv in lines:  # as written: Polygraphy's defaults (ORT's graph optimizations on)
        done = subprocess.run([str(poly), *argv[1:]], cwd=out, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_the_rendered_polygraphy_check_passes_as_written(tmp_path):
    """The two Polygraphy lines commands.sh writes pass, run as written, on the demo, a
    control-flow model and a detector head whose tolerance sits a hair above all-FP16's error
    (the plan the search first finds passes the judge by less than ORT's optimizations move
    it; the certified plan does not)."""
    import pytest

    pytest.importorskip("polygraphy")
    from pathlib import Path

    from trtbisect.context import Options
    from trtbisect.judge.compare import Tolerance
    from trtbisect.pipeline import run

    root = Path(__file__).resolve().parents[2]
    r = run(root / "models" / "demo.onnx",
            Options.of(inputs=[str(root / "models" / "demo_inputs.npz")]), tmp_path / "demo")
    assert r.verdict == "fixed" and r.certificate.certified
    _rendered_polygraphy_check(tmp_path / "demo")

    p = if_untyped_branch_outputs()
    onnx.save(p.model, tmp_path / "cf.onnx")
    np.savez(tmp_path / "cf.npz", **p.inputs)
    r = run(tmp_path / "cf.onnx", Options.of(inputs=[str(tmp_path / "cf.npz")]), tmp_path / "cf")
    assert r.verdict == "fixed" and set(r.fp32_nodes) == p.strict
    _rendered_polygraphy_check(tmp_path / "cf")

    m, path, inputs = _conv_detector(tmp_path)
    from trtbisect.backends.ort import Emulator, Reference
    from trtbisect.graph import Graph
    from trtbisect.judge.compare import compare_outputs

    g, x = Graph(m), dict(np.load(inputs))
    rel = compare_outputs(Reference(g).run(x), Emulator(g).run(frozenset(), x),
                          Tolerance(0.0))["score"].rel
    # a hair above all-FP16's error on its one sample: perturbed copies of it exceed that
    # bound (validation says `unvalidated`, test_validation.py); here the certificate alone
    r = run(path, Options.of(inputs=[str(inputs)], tolerance=Tolerance(rel * (1 + 1e-6)),
                             semantics="strict", validation_share=0), tmp_path / "det")
    assert r.verdict == "fixed" and r.certificate.certified
    m = r.certificate.outputs["score"]
    assert m.margin > m.spread > 0
    _rendered_polygraphy_check(tmp_path / "det")


# ---------------------------------------------------------------- the criterion that fits

def test_concentrated_error_and_probability_maps_point_to_the_criteria_that_fit():
    from trtbisect.judge.compare import Tolerance, compare_output
    from trtbisect.judge.hints import Hint, criterion_hints, hint_lines

    rng = np.random.default_rng(0)
    ref = rng.random((1, 1, 64, 64)).astype(np.float32)  # a sigmoid heat map
    got = ref + 1e-6
    got[0, 0, 3, 3] += 0.05  # one pixel
    e = compare_output(ref, got, 1e-2, 0.0)
    assert not e.passed and e.p99_abs * 100 <= e.max_abs
    probs = np.full((2, 10), 0.1, np.float32)
    pe = compare_output(probs, probs * 1.5, 1e-2, 0.0)
    (det, cls) = criterion_hints({"map": e, "cls": pe}, {"map": ref, "cls": probs},
                                 Tolerance())
    assert det.output == "map" and "few elements" in det.why[0]
    flags = [c.flags for c in det.criteria]
    assert flags[0].startswith("--check-error-stat map:quantile --error-quantile map:0.99")
    assert det.criteria[0].all_fp16.startswith("passes")
    assert any(f.startswith("--metric map:iou:") for f in flags)
    assert any(f.startswith("--check ") for f in flags)
    assert cls.output == "cls" and "sums to 1" in cls.why[0]
    assert [c.flags for c in cls.criteria][0] == "--metric cls:topk:1"
    assert len(hint_lines([det, cls])) == 2 + len(det.criteria) + len(cls.criteria)
    assert [Hint.from_json(h.to_json()) for h in (det, cls)] == [det, cls]
    from types import SimpleNamespace

    from trtbisect.reports.report import hint_rows
    rows = hint_rows(SimpleNamespace(criterion_hints=[det, cls]))  # type: ignore[arg-type]
    assert len(rows) == len(det.criteria) + len(cls.criteria)
    assert rows[0] == ("map", "; ".join(det.why), flags[0], det.criteria[0].all_fp16)
    # nothing to say of an output that passes, or whose error is spread out
    spread = compare_output(ref, ref * 1.5, 1e-2, 0.0)
    assert criterion_hints({"ok": compare_output(ref, ref, 1e-2, 0.0), "wide": spread},
                           {"ok": ref, "wide": ref * 7}, Tolerance()) == []


def test_the_console_says_which_criterion_fits(tmp_path):
    """y = x * 1.0001 (FP16 rounds the weight to 1) on inputs with one huge element: the
    error sits in that element; the run says the quantile criterion would pass all-FP16."""
    x = np.full((1, 256), 0.1, np.float32)
    x[0, 7] = 5000.0
    g = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["y"], name="scale")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])],
                          [onnx.numpy_helper.from_array(np.array(1.0001, np.float32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=10)
    onnx.save(m, tmp_path / "m.onnx")
    np.savez(tmp_path / "x.npz", x=x)
    r = CliRunner().invoke(main, ["run", str(tmp_path / "m.onnx"), "--inputs",
                                  str(tmp_path / "x.npz"), "--rtol", "1e-5", "--out",
                                  str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert "may not be what you mean" in r.output and "quantile" in r.output
    import json
    plan = json.loads((tmp_path / "out" / "precision.json").read_text())
    (hint,) = plan["criterion_hints"]
    assert hint["criteria"][0]["all_fp16"].startswith("passes")
    from trtbisect.judge.hints import Hint
    from trtbisect.result import RunResult
    (back,) = RunResult.typed_from_json(plan)["criterion_hints"]  # the record again
    assert isinstance(back, Hint) and back.to_json() == hint and back.output == "y"


def test_under_pass_rate_the_margin_is_that_of_the_samples_that_pass(tmp_path):
    """--pass-rate 0.5 on two samples, the second overflowing FP16 (a failure the rate
    allows): the margin is measured on the sample that passes, so all-FP16 holds."""
    from trtbisect.context import Options
    from trtbisect.judge.flags import parse_criteria
    from trtbisect.pipeline import run

    m, path, _ = _matmul(tmp_path)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 256)).astype(np.float32)
    np.savez(tmp_path / "a.npz", x=x)
    np.savez(tmp_path / "b.npz", x=x * 1e4)  # |y| ~ 1.6e5: beyond 65504
    # both samples judged (no hold-out): the rate is over the two
    r = run(path, Options.of(inputs=[str(tmp_path / "a.npz"), str(tmp_path / "b.npz")],
                             criteria=parse_criteria(pass_rate=0.5), validation_share=0),
            tmp_path / "out")
    assert r.verdict == "fp16_ok", r.certificate
    y = r.certificate.outputs["y"]
    assert y.certified and y.margin > y.spread


def test_the_aimed_search_reaches_the_same_plan_with_workers(tmp_path):
    """The aimed rounds judge in the run's process; the first search on 2 workers: the plan,
    the certificate and the evaluations are those of one process."""
    from trtbisect.context import Options
    from trtbisect.judge.compare import Tolerance
    from trtbisect.pipeline import run

    m, path, inputs = _conv_detector(tmp_path)
    from trtbisect.backends.ort import Emulator, Reference
    from trtbisect.graph import Graph
    from trtbisect.judge.compare import compare_outputs

    g, x = Graph(m), dict(np.load(inputs))
    rel = compare_outputs(Reference(g).run(x), Emulator(g).run(frozenset(), x),
                          Tolerance(0.0))["score"].rel
    runs = [run(path, Options.of(inputs=[str(inputs)], tolerance=Tolerance(rel * 0.5),
                                 semantics="strict", workers=w), tmp_path / f"w{w}")
            for w in (1, 2)]
    one, two = runs
    assert two.workers.workers == 2  # the first search ran on worker processes
    assert one.verdict == two.verdict == "fixed"
    assert one.fp32_nodes == two.fp32_nodes and one.evaluations == two.evaluations
    assert one.certificate == two.certificate


def test_the_noise_floor_is_measured_once_per_run(tmp_path, monkeypatch):
    """FP32's noise floor is the reference's alone: an aimed round's certificate reuses it
    (each measurement builds two sessions and runs every sample twice)."""
    import trtbisect.backends.ort as ort_backend
    from trtbisect.context import Options
    from trtbisect.judge.compare import Tolerance
    from trtbisect.pipeline import run

    calls = []
    real = ort_backend.nudge_noise
    monkeypatch.setattr(ort_backend, "nudge_noise",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    m, path, inputs = _matmul(tmp_path)
    rel = _all_fp16_rel(m, inputs)
    r = run(path, Options.of(inputs=[str(inputs)], tolerance=Tolerance(rel * (1 + 1e-6))),
            tmp_path / "out")
    assert r.aimed_searches and len(calls) == 1


# ---------------------------------------------------------------- one number per output

def test_one_number_per_output_over_several_samples(tmp_path):
    """Four samples of one model at four scales (one held out): the console's Outputs table,
    `check` of the written file, precision.json, the report, the certificate's margin line and
    the rendered Polygraphy bound all say the same max|d| (the largest over the samples, with
    its sample) against the same bound (the smallest, with its sample), and the margin line's
    numbers are the table's (#46 item 2)."""
    import json
    import re

    from tests.models.make_models import precision_loss

    p = precision_loss()
    onnx.save(p.model, tmp_path / "m.onnx")
    scales = (1.0, 3.0, 1.5, 2.0)  # the largest error on sample 1, the smallest bound on 0
    np.savez(tmp_path / "x.npz", x=np.stack([p.inputs["x"] * s for s in scales]))
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["run", str(tmp_path / "m.onnx"), "--inputs",
                                  str(tmp_path / "x.npz"), "--out", str(out), "--report"],
                           env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    plan = json.loads((out / "precision.json").read_text())
    assert plan["verdict"] == "fixed"
    assert plan["validation"]["indices"], "a sample is held out"
    e = plan["errors_after"]["y"]
    # the numbers are over every sample given, held-out ones too, and say whose they are
    assert (e["sample"], e["bound_sample"]) == (1, 0)
    cell = f"max|d| {e['max_abs']:.3g} on sample 1 (bound {e['bound']:.3g} of sample 0)"
    table = r.output.split("Outputs", 1)[1]
    (row,) = [ln for ln in table.splitlines() if ln.startswith("│ y")]
    assert row.split("│")[3].strip() == f"ok {cell}"  # the "with the plan" column
    c = CliRunner().invoke(main, ["check", str(out / "m.mixed.onnx"), "--reference",
                                  str(tmp_path / "m.onnx"), "--inputs", str(tmp_path / "x.npz")],
                           env={"COLUMNS": "250"})
    assert c.exit_code == 0, c.output
    assert f"y: ok {cell}" in c.output
    # the certificate measures the very numbers the table shows
    cert = plan["certificate"]["outputs"]["y"]
    assert (cert["worst"], cert["bound"], cert["sample"], cert["bound_sample"]) == (
        e["max_abs"], e["bound"], 1, 0)
    margin = next(ln for ln in r.output.splitlines() if "margin" in ln and ln.strip()
                  .startswith("y:"))
    said = re.findall(r"\d[\d.e+-]*", margin.split("spread")[0])
    assert f"{e['bound']:.3g}" in said and f"{e['max_abs']:.3g}" in said
    assert f"{e['bound']:.3g}" in row and f"{e['max_abs']:.3g}" in row
    # the report says the same cell; the renderings check against the same bound
    report = (out / "report.md").read_text()
    assert cell.replace(f"{e['max_abs']:.3g}", _num(e["max_abs"])).replace(
        f"{e['bound']:.3g}", _num(e["bound"])) in report
    assert f"--atol y:{e['bound']!r}" in (out / "commands.sh").read_text()
    # a single place of truth: the search's own record of the plan agrees bit for bit
    assert plan["one_judge"]["search_equals_check"]


def _num(x: float) -> str:
    from trtbisect.diagnosis.diagnose import num
    return num(x)


# ---------------------------------------------------------------- a margin under every criterion

def test_a_metric_plan_says_its_margin_everywhere(tmp_path):
    """Under --metric the written plan's score is held clear of its threshold by more than the
    variations move it: the certificate records it (with the worst sample), the margins carry
    it, and the console and the report say it (#46 item 3)."""
    import json

    from tests.models.make_models import precision_loss

    p = precision_loss()
    onnx.save(p.model, tmp_path / "m.onnx")
    np.savez(tmp_path / "x.npz", x=np.stack([p.inputs["x"] * s for s in (1.0, 3.0, 1.5)]))
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["run", str(tmp_path / "m.onnx"), "--inputs",
                                  str(tmp_path / "x.npz"), "--out", str(out), "--report",
                                  "--metric", "cosine:0.9999"], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    plan = json.loads((out / "precision.json").read_text())
    assert plan["verdict"] == "fixed"
    (key, m), = plan["certificate"]["scores"].items()
    assert key == "y:cosine:0.9999" and m["certified"] and m["margin"] > m["spread"]
    e = plan["errors_after"]["y"]  # the table's: the worst sample's score
    assert (m["worst"], m["sample"]) == (e["scores"][0]["value"], e["sample"])
    assert m["bound"] == 0.9999 and m["margin"] == 1 - m["severity"]
    assert abs(m["severity"] - (1 - m["worst"]) / (1 - 0.9999)) < 1e-9
    assert plan["margins"][key]["fragile"] is False
    said = f"score {m['worst']:.6g} on sample {m['sample']} against threshold 0.9999"
    assert f"{key}: {said}" in r.output
    assert said in (out / "report.md").read_text()


def test_a_polygraphy_statistic_is_clear_by_either_of_its_rules():
    """Polygraphy's statistic passes when |d| <= atol OR rel <= rtol: a quantile far above
    atol but well inside rtol has its margin, in the severity both rules share (1 at the
    threshold), not a negative |d| - atol."""
    from trtbisect.judge.compare import Tolerance
    from trtbisect.judge.flags import parse_criteria
    from trtbisect.stages.spread import _score_margins

    crit = parse_criteria(stats=["quantile"], quantiles=["0.99"])
    ref = {"y": np.linspace(50, 100, 256)}
    got = {"y": ref["y"] + 0.05}  # |d| 0.05 over atol 1e-3; rel 5e-4 of rtol 1e-2
    judged = [crit.judge(ref, got, {}, Tolerance(1e-2, 1e-3))]
    (m,) = _score_margins(judged, {"v": judged}, {0}).values()
    assert m.worst > m.bound and 0.8 < m.margin < 1 and m.certified


# ---------------------------------------------------------------- the trade-off plot says why

def test_every_failing_plan_on_the_tradeoff_plot_says_why(tmp_path):
    """The data behind report_tradeoff.png labels each failing trial with its reason, naming
    the output and the sample; a plan that fails under the tolerance line failed by something
    its error does not show: here the aimed bound (the margin), and the Pareto front runs
    through passing plans only (#46 item 4)."""
    from tests.models.make_models import precision_loss
    from trtbisect.context import Options
    from trtbisect.judge.compare import Tolerance
    from trtbisect.pipeline import run
    from trtbisect.reports.report import failing_below, pareto_front, tradeoff_points

    p = precision_loss()
    onnx.save(p.model, tmp_path / "m.onnx")
    np.savez(tmp_path / "x.npz", x=np.stack([p.inputs["x"] * s for s in (1.0, 3.0, 1.5, 2.0)]))
    r = run(tmp_path / "m.onnx", Options.of(inputs=[str(tmp_path / "x.npz")]), tmp_path / "o")
    points, _, rtol = tradeoff_points(r)
    failing = [pt for pt in points if not pt[2]]
    assert failing and all(pt[3].startswith("bound: y on sample ") for pt in failing)
    assert all(pt[1] > rtol for pt in failing)  # over the line: the line explains them
    assert failing_below(points, rtol) == {}
    assert all(points[i][2] for i in pareto_front(points))

    m, path, inputs = _matmul(tmp_path)  # passes by a hair: the search aims inside the bound
    r = run(path, Options.of(inputs=[str(inputs)], tolerance=Tolerance(_all_fp16_rel(m, inputs)
                                                                    * (1 + 1e-6))),
            tmp_path / "aimed")
    assert r.aimed_searches  # the written plan comes from the aimed search
    points, _, rtol = tradeoff_points(r)
    below = failing_below(points, rtol)
    assert below and set(below.values()) == {"margin"}  # all-FP16, under the line: the margin
    assert all(points[i][3] == "margin: y on sample 0" for i in below)
    assert all(points[i][2] for i in pareto_front(points))


def test_onnx_runtime_loads_a_written_file_once_and_only_when_it_is_kept(tmp_path,
                                                                        monkeypatch):
    """Loading an FP16 file in ONNX Runtime costs about what judging it does (20k nodes: 27 s):
    the all-FP16 file that fails is never an output and is only checked by the checker; the
    plan's file, and an all-FP16 file that passes, are loaded; the emulated file is not loaded
    again (the judge's session was its load)."""
    import trtbisect.judge.loadable as loadable
    from trtbisect.context import Options
    from trtbisect.judge.compare import Tolerance
    from trtbisect.pipeline import run

    loaded: list[str | None] = []
    paths: list[str] = []
    real = loadable.runtime_problem

    def seen(path) -> None:
        meta = {p.key: p.value for p in onnx.load(str(path), load_external_data=False)
                .metadata_props}
        loaded.append(meta.get("trtbisect.fp32_nodes"))
        paths.append(str(path))

    def spy(path, weight_bytes=None):
        seen(path)
        return real(path, weight_bytes)

    class InChild(loadable.LoadCheck):  # a big plan's file loads in a child process
        def __init__(self, path, weight_bytes=None, in_child=True):
            if in_child:  # else `runtime_problem` runs here, and the spy sees it
                seen(path)
            super().__init__(path, weight_bytes, in_child)

    monkeypatch.setattr(loadable, "runtime_problem", spy)
    monkeypatch.setattr(loadable, "LoadCheck", InChild)
    m, path, inputs = _matmul(tmp_path)
    rel = _all_fp16_rel(m, inputs)
    failing = run(path, Options.of(inputs=[str(inputs)], tolerance=Tolerance(rel / 2)),
                  tmp_path / "fails")
    assert failing.fp32_nodes == ["mm"] and failing.verdict in ("fixed", "fragile")
    assert "" not in loaded and "mm" in loaded  # the plan's file loaded, all-FP16's not
    # the emulated file is the judge's own graph, which ONNX Runtime built a session of: it
    # is not loaded a second time, and it loads
    emulated = tmp_path / "fails" / "mm.mixed.emulated.onnx"
    assert emulated.exists() and not any(p.endswith(".emulated.onnx") for p in paths)
    assert real(emulated) is None
    loaded.clear()
    passing = run(path, Options.of(inputs=[str(inputs)], tolerance=Tolerance(rel * 100)),
                  tmp_path / "passes")
    assert passing.verdict == "fp16_ok" and "" in loaded


def _all_fp16_matmul(tmp_path):
    """`_matmul`'s graph, two samples, and its all-FP16 file's emulated graph."""
    from trtbisect.graph import Graph
    from trtbisect.judge.mixed import mixed_model

    m, _, inputs = _matmul(tmp_path)
    g = Graph(m)
    x = dict(np.load(inputs))
    written = mixed_model(g, frozenset())
    return g, [x, {"x": x["x"] * 0.5}], (written.proto, written.arrays)


def _variant_numbers(runs) -> list:
    return [(v.label, k, {n: a.tobytes() for n, a in r.items()},
             {n: a.tobytes() for n, a in e.items()}) for v, k, r, e in runs]


def test_the_references_run_in_a_child_process_compute_the_same_bits(tmp_path, monkeypatch):
    """The certificate's FP32 references run in a child process beside the emulated file's
    sessions (#45 item 4): the same sessions of the same proto and weights, so the same numbers
    bit for bit as all of them here, in the same order; a child that dies is replaced by the
    same runs here."""
    import multiprocessing as mp

    import trtbisect.backends.ort as ort_backend

    g, samples, emulated = _all_fp16_matmul(tmp_path)
    from trtbisect.base import child as child_mod
    monkeypatch.setattr(child_mod, "CHILD_NODES", 0)  # a child even for this small graph
    beside = _variant_numbers(ort_backend.variant_runs(g, emulated, samples))
    assert not [p for p in mp.active_children() if p.name == "trtbisect-variant"]
    monkeypatch.setattr(ort_backend, "VARIANT_CHILD_BYTES", -1)  # every session here
    here = _variant_numbers(ort_backend.variant_runs(g, emulated, samples))
    every = ort_backend.variants(None)
    assert beside == here and len(here) == len(samples) * len(every)
    assert [(label, k) for label, k, _, _ in here] == [(v.label, k) for v in every
                                                       for k in range(len(samples))]
    child = ort_backend._ReferenceChild.start(every, ort_backend._fp32_graph(g), samples,
                                              g.output_names())
    assert child._proc is not None
    child._proc.kill()  # dies before it answers: the same runs here instead
    refs = [r for per_variant in child.results() for r in per_variant]
    assert [{n: a.tobytes() for n, a in r.items()} for r in refs] == [r for _, _, r, _ in here]


def test_the_runs_references_started_early_and_kept_compute_the_same_bits(tmp_path,
                                                                          monkeypatch):
    """The certificate's FP32 references do not depend on the plan: a run starts them in a
    child once its samples are known and keeps them for later certificates (the aimed rounds),
    with the same numbers bit for bit as computed at the certificate; references of another
    graph or other samples are not used; `close` leaves no child behind."""
    import multiprocessing as mp

    import trtbisect.backends.ort as ort_backend
    from trtbisect.base import child as child_mod
    from trtbisect.graph import Graph

    g, samples, emulated = _all_fp16_matmul(tmp_path)
    plain = _variant_numbers(ort_backend.variant_runs(g, emulated, samples))
    monkeypatch.setattr(child_mod, "CHILD_NODES", 0)  # a child even for this small graph
    early = ort_backend.VariantReferences.start(g, samples, None)
    assert early._child is not None
    try:
        first = _variant_numbers(ort_backend.variant_runs(g, emulated, samples, None, early))
        assert first == plain and early._kept is not None and early._child is None
        calls = []
        real = ort_backend._fp32_graph
        monkeypatch.setattr(ort_backend, "_fp32_graph", lambda gr: calls.append(1) or real(gr))
        again = _variant_numbers(ort_backend.variant_runs(g, emulated, samples, None, early))
        assert again == plain and not calls  # kept: no FP32 session built again
        other = [{"x": samples[0]["x"] * 2.0}]
        assert not early.serves(g, other, None)
        assert not early.serves(Graph(g.source), samples, None)
        _variant_numbers(ort_backend.variant_runs(g, emulated, other, None, early))
        assert calls  # another sample set: its own references
    finally:
        early.close()
    late = ort_backend.VariantReferences.start(g, samples, None)
    late.close()
    assert not [p for p in mp.active_children() if p.name == "trtbisect-variant"]


def test_the_judge_sessions_runs_started_early_compute_the_same_bits(tmp_path, monkeypatch):
    """The noise floor's nudged runs and the perturbed copies' FP32 references do not depend
    on the plan either: computed in the early child, they are the numbers `nudge_noise` and
    `Reference.run` compute here, bit for bit; asked for other samples, nothing is given."""
    import trtbisect.backends.ort as ort_backend
    from trtbisect.base import child as child_mod
    from trtbisect.graph import Graph

    m, _, inputs = _matmul(tmp_path)
    g = Graph(m)
    x = dict(np.load(inputs))
    samples = [x, {"x": x["x"] * 0.5}]
    copies = [{"x": x["x"] * 1.01}, {"x": x["x"] - 0.25}]
    ref = ort_backend.Reference(g)
    references = [ref.run(s) for s in samples]
    here = [ref.run(c) for c in copies]
    noise = ort_backend.nudge_noise(g, samples, references)
    monkeypatch.setattr(child_mod, "CHILD_NODES", 0)
    early = ort_backend.VariantReferences.start(g, samples, None, copies)
    try:
        got = early.of_others(copies)
        assert got is not None and len(got) == len(here)
        assert [{n: a.tobytes() for n, a in r.items()} for r in got] == \
            [{n: a.tobytes() for n, a in r.items()} for r in here]
        runs = early.nudged(g, samples, None)
        assert runs is not None and ort_backend.nudge_moves(references, runs) == noise
        assert early.of_others([dict(c) for c in copies]) is None  # other samples
        assert early.nudged(g, list(samples), None) is None
    finally:
        early.close()


def test_a_run_with_the_early_child_writes_the_same_certificate_and_validation(tmp_path,
                                                                              monkeypatch):
    """The same run with its plan-independent FP32 work in the early child (a graph worth a
    child) and without one: the same certificate, margins, validation and plan, and no child
    left behind."""
    import multiprocessing as mp

    from trtbisect.base import child as child_mod
    from trtbisect.context import Options
    from trtbisect.judge.compare import Tolerance
    from trtbisect.pipeline import run

    m, path, inputs = _matmul(tmp_path)
    rel = _all_fp16_rel(m, inputs)
    opts = Options.of(inputs=[str(inputs)], tolerance=Tolerance(rel * 100))
    import trtbisect.backends.ort as ort_backend

    plain = run(path, opts, tmp_path / "plain")
    monkeypatch.setattr(child_mod, "CHILD_NODES", 0)

    def not_here(*a, **k):
        raise AssertionError("the nudged runs are the early child's")

    given = []
    real = ort_backend.VariantReferences.of_others

    def of_others(self, samples):
        given.append(real(self, samples))
        return given[-1]

    monkeypatch.setattr("trtbisect.backends.ort.nudge_noise", not_here)
    monkeypatch.setattr(ort_backend.VariantReferences, "of_others", of_others)
    early = run(path, opts, tmp_path / "early")
    assert given and all(g is not None for g in given)  # the copies' references: the child's
    assert plain.validation is not None and plain.validation.kind == "perturbed"
    for r in (plain, early):
        assert r.verdict == "fp16_ok" and r.certificate is not None
    assert early.certificate.to_json() == plain.certificate.to_json()
    assert early.validation.to_json() == plain.validation.to_json()
    assert {k: v.to_json() for k, v in early.margins.items()} == \
        {k: v.to_json() for k, v in plain.margins.items()}
    assert not [p for p in mp.active_children() if p.name == "trtbisect-variant"]


def test_an_early_child_that_dies_is_replaced_by_the_same_runs_here(tmp_path, monkeypatch):
    """The early child does not leave its FP32 proto and weights held here meanwhile: should
    it die, they are built again and the same runs made here, the same bits."""
    import trtbisect.backends.ort as ort_backend
    from trtbisect.base import child as child_mod

    g, samples, emulated = _all_fp16_matmul(tmp_path)
    copies = [{"x": samples[0]["x"] * 1.01}]
    plain = _variant_numbers(ort_backend.variant_runs(g, emulated, samples))
    monkeypatch.setattr(child_mod, "CHILD_NODES", 0)
    early = ort_backend.VariantReferences.start(g, samples, None, copies)
    try:
        child = early._child
        assert child is not None and child._task[1] is None  # not held here
        assert child._proc is not None
        child._proc.kill()
        got = _variant_numbers(ort_backend.variant_runs(g, emulated, samples, None, early))
        assert got == plain
        here = ort_backend.Reference(g).run(copies[0])
        again = early.of_others(copies)
        assert again is not None
        assert {n: a.tobytes() for n, a in again[0].items()} == \
            {n: a.tobytes() for n, a in here.items()}
    finally:
        early.close()
