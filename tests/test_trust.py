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
