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
    from trtbisect.compare import Tolerance, compare_outputs
    from trtbisect.graph import Graph

    g, x = Graph(m), dict(np.load(inputs))
    return compare_outputs(Reference(g).run(x), Emulator(g).run(frozenset(), x),
                           Tolerance(0.0))["y"].rel


def test_fp16_passing_within_the_spread_is_searched_again_inside_the_bound(tmp_path):
    """All-FP16 passes the judge by a hair (a tolerance 1e-6 above its error): that is inside
    what ORT's optimized kernels move the error by, so it is not `fp16_ok`; the search aims
    inside the bound and keeps the MatMul in FP32, which holds with margin."""
    from trtbisect.compare import Tolerance
    from trtbisect.pipeline import Options, run

    m, path, inputs = _matmul(tmp_path)
    rel = _all_fp16_rel(m, inputs)
    r = run(path, Options(inputs=[str(inputs)], tolerance=Tolerance(rel * (1 + 1e-6))),
            tmp_path / "out")
    assert r.verdict == "fixed" and r.fp32_nodes == ["mm"] and r.exit_code == 0
    cert = r.extra["certificate"]
    assert cert["certified"] and cert["aim_rounds"] == 1
    y = cert["outputs"]["y"]
    assert y["margin"] > y["spread"] > 0 and y["spread"] >= y["noise_floor"]
    assert {"ORT optimizations on, 1 thread", "ORT optimizations on, 2 threads"} <= set(
        cert["variants"]) or len(cert["variants"]) >= 2
    (aim,) = r.extra["aimed_searches"]
    assert aim["found"] and aim["ceiling"]["y"] < y["bound"]
    plan = __import__("json").loads((tmp_path / "out" / "precision.json").read_text())
    assert plan["verdict"] == "fixed" and plan["fragile"] is False
    assert plan["certificate"] == __import__("json").loads(__import__("json").dumps(cert))


def test_no_plan_with_the_margin_is_fragile_exit_7_and_still_written(tmp_path):
    """A bound below the FP32 noise floor: even all-FP32 cannot pass by more than the spread."""
    from trtbisect.backends.ort import Reference, kernel_noise
    from trtbisect.compare import Tolerance
    from trtbisect.graph import Graph
    from trtbisect.pipeline import Options, run

    m, path, inputs = _matmul(tmp_path)
    g, x = Graph(m), dict(np.load(inputs))
    ref = Reference(g).run(x)
    noise = kernel_noise(g, [x], [ref])["y"]
    assert noise > 0
    rtol = noise / 4 / float(np.abs(ref["y"]).max())
    r = run(path, Options(inputs=[str(inputs)], tolerance=Tolerance(rtol)), tmp_path / "out")
    assert r.verdict == "fragile" and r.exit_code == 7
    assert r.fp32_nodes == ["mm"]  # the nearest plan: it passes the judge, without margin
    assert not r.extra["certificate"]["certified"]
    assert (tmp_path / "out" / "mm.mixed.onnx").exists()
    res = CliRunner().invoke(main, ["run", str(path), "--inputs", str(inputs), "--rtol",
                                    repr(rtol), "--out", str(tmp_path / "cli"), "--json"])
    assert res.exit_code == 7, res.output
    assert __import__("json").loads(res.stdout)["verdict"] == "fragile"
