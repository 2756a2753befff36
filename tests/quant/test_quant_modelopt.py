"""`run --precision int8` with NVIDIA ModelOpt's ONNX PTQ (an optional extra: these tests
skip without it, as in CI), and the rendered `nodes_to_exclude` applied by ModelOpt itself."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.models import quant_models as qm
from tests.test_cli import invoke
from trtbisect.quant import analyse, unquantize

pytest.importorskip("modelopt.onnx.quantization")


@pytest.mark.slow  # ModelOpt's import alone takes seconds
def test_precision_int8_quantizes_then_bisects_and_the_exclusions_reproduce_the_plan(tmp_path):
    from modelopt.onnx.quantization import quantize

    p = qm.outlier()
    fp32 = tmp_path / "outlier_fp32.onnx"
    onnx.save(unquantize(p.model, analyse(p.model)), fp32)
    np.savez(tmp_path / "in.npz", **p.inputs)
    before = fp32.read_bytes()
    r = invoke("-q", "run", fp32, "--precision", "int8", "--inputs", tmp_path / "in.npz",
               "--rtol", p.rtol, "--out", tmp_path / "out", "--json")
    # fixed, or fragile where ORT's own QDQ fusions move the error by more than the margin
    assert r.exit_code in (0, 7), r.output
    assert fp32.read_bytes() == before  # ModelOpt rewrites its input: it gets a copy
    got = json.loads(r.stdout)
    assert got["verdict"] in ("fixed", "fragile") and got["unquantized_layers"] == ["mm1"]
    assert got["reference"] == str(fp32)
    # ModelOpt given the rendered exclusions leaves exactly the plan's layer un-quantized,
    # and that file passes the judge the plan passed
    cli = shlex.split(got["renderings"]["modelopt_cli"])
    excl = cli[cli.index("--nodes_to_exclude") + 1:]
    out = tmp_path / "excluded.onnx"
    quantize(onnx_path=str(fp32), quantize_mode="int8", calibration_data=p.inputs,
             nodes_to_exclude=excl, output_path=str(out), high_precision_dtype="fp32",
             calibration_eps=["cpu"])
    names = {la.name for la in analyse(onnx.load(out))}
    assert "mm1" not in names and "mm2" in names
    r = invoke("-q", "run", out, "--inputs", tmp_path / "in.npz", "--rtol", p.rtol,
               "--reference", fp32, "--out", tmp_path / "out2", "--json")
    # passes the judge; `quantized_ok` only with the certificate's margin over the spread and
    # validated (judge/verdict.py's order; ORT's own QDQ fusions move this file's error ~6x
    # its bound here: `fragile`)
    again = json.loads(r.stdout)
    assert again["judged"]["before"]["passed"], r.output
    verdict = ("fragile" if not again["certificate"]["certified"] else "unvalidated"
               if not again["validation"]["passed"] else "quantized_ok")
    assert again["verdict"] == verdict
    assert r.exit_code == {"quantized_ok": 0, "fragile": 7, "unvalidated": 9}[verdict]


@pytest.mark.slow
def test_commands_sh_runs_modelopt_as_written_and_check_judges_its_file(tmp_path):
    """commands.sh's ModelOpt line, run as written after the script's own `cd` to its folder
    (calib.npz is there, the FP32 model named by its absolute path) from another folder, writes a file that `trtbisect check` judges
    as precision.json recorded ModelOpt's file of the same exclusions: the same layers
    quantized, the same errors, bit for bit."""
    p = qm.outlier()
    fp32 = tmp_path / "outlier_fp32.onnx"
    onnx.save(unquantize(p.model, analyse(p.model)), fp32)
    np.savez(tmp_path / "in.npz", **p.inputs)
    out = tmp_path / "out"
    r = invoke("-q", "run", fp32, "--precision", "int8", "--inputs", tmp_path / "in.npz",
               "--rtol", p.rtol, "--out", out, "--json")
    assert r.exit_code in (0, 7), r.output
    got = json.loads(r.stdout)
    rep = got["renderings"]["modelopt_reproduction"]
    # one price (#46 item 5): the int8 run's all-FP16 is the FP16 run's of the same model
    f = invoke("-q", "run", fp32, "--inputs", tmp_path / "in.npz", "--rtol", p.rtol, "--json")
    assert got["cost"]["all_fp16_s"] == json.loads(f.stdout)["cost"]["all_fp16_s"]
    assert rep["ran"] and rep["exact"] and rep["path"] == got["files"]["modelopt_model"]
    sh = (out / "commands.sh").read_text()
    line = next(x for x in sh.splitlines() if x.startswith("python -m modelopt"))
    assert "tried: ModelOpt quantizes exactly the layers the plan keeps quantized" in sh
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
           f"{os.environ.get('PATH', '')}"}
    cd = next(x for x in sh.splitlines() if x.startswith("cd "))  # runs from anywhere:
    done = subprocess.run(["sh", "-c", f"{cd}\n{line}", str(out / "commands.sh")],
                          cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    written = out / "model.quant.onnx"
    assert {la.name for la in analyse(onnx.load(written))} == {"mm2"}
    c = invoke("-q", "check", written, "--reference", fp32, "--inputs", tmp_path / "in.npz",
               "--rtol", p.rtol, "--json")
    judged = json.loads(c.stdout)
    assert c.exit_code == (0 if rep["passed"] else 4) and judged["passed"] == rep["passed"]
    assert judged["errors"]["y"]["max_abs"] == rep["errors"]["y"]["max_abs"]
    # a plan ModelOpt cannot reproduce is said so (its neighbours' rule), in words
    from trtbisect.outputs.quantized import Reproduction, reproduction_lines
    (said,) = reproduction_lines(dataclasses.replace(Reproduction.from_json(rep), exact=False,
                                                     also_unquantized=("mm2",)))
    assert "cannot reproduce the plan exactly" in said and "also leaves mm2 un-quantized" in said


@pytest.mark.slow
def test_calibration_samples_are_given_apart(tmp_path):
    """--calibration: ModelOpt calibrates on those samples, the plan is judged on --inputs.
    Calibrated on the samples scaled down 100x, every scale is too small: both layers
    saturate."""
    p = qm.outlier()
    fp32 = tmp_path / "outlier_fp32.onnx"
    onnx.save(unquantize(p.model, analyse(p.model)), fp32)
    np.savez(tmp_path / "in.npz", **p.inputs)
    np.savez(tmp_path / "quiet.npz", x=p.inputs["x"] / 100)
    r = invoke("-q", "run", fp32, "--precision", "int8", "--inputs", tmp_path / "in.npz",
               "--calibration", tmp_path / "quiet.npz", "--rtol", p.rtol, "--out",
               tmp_path / "out", "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["unquantized_layers"] == ["mm1", "mm2"]
    kinds = {f["kind"] for layer in got["plan"] for f in layer["findings"]}
    assert "saturation" in kinds


def _chain(tmp_path: Path) -> Path:
    """MatMul n0, MatMul n1, Add n2 (n1's output and n0's), MatMul n3, Relu n4, MatMul n5."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    c, nodes, inits, t = 64, [], [], "x"
    for i, op in enumerate(["MatMul", "MatMul", "Add", "MatMul", "Relu", "MatMul"]):
        if op == "MatMul":
            w = (rng.standard_normal((c, c)) / 8).astype(np.float32)
            inits.append(numpy_helper.from_array(w, f"w{i}"))
            nodes.append(helper.make_node(op, [t, f"w{i}"], [f"t{i}"], name=f"n{i}"))
        else:
            ins = [t, "t0"] if op == "Add" else [t]
            nodes.append(helper.make_node(op, ins, [f"t{i}"], name=f"n{i}"))
        t = f"t{i}"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     [32, c])],
                          [helper.make_tensor_value_info(t, TensorProto.FLOAT, [32, c])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.save(m, tmp_path / "chain.onnx")
    return tmp_path / "chain.onnx"


@pytest.mark.slow
def test_a_plan_modelopt_cannot_reproduce_is_said_so_and_its_file_judged(tmp_path):
    """ModelOpt told to exclude n1 also leaves its neighbour, the Add n2, un-quantized: the
    reproduction says so, in commands.sh's words, and its file is judged as check judges it."""
    from types import SimpleNamespace

    from modelopt.onnx.quantization import quantize

    from trtbisect.backends.ort import Reference
    from trtbisect.graph import Graph, with_node_names
    from trtbisect.judge.compare import Tolerance
    from trtbisect.judge.criteria import Criteria
    from trtbisect.outputs.quantized import reproduction_lines
    from trtbisect.quant import ptq
    from trtbisect.quant.judge import QuantJudge

    fp32 = _chain(tmp_path)
    data = {"x": np.random.default_rng(1).standard_normal((32, 64)).astype(np.float32)}
    np.savez(tmp_path / "in.npz", **data)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    np.savez(scratch / ptq.GIVEN, **data)
    q = scratch / "chain.int8.onnx"
    quantize(onnx_path=str(fp32), quantize_mode="int8", calibration_data=data,
             output_path=str(q), high_precision_dtype="fp32", calibration_eps=["cpu"])
    model = with_node_names(onnx.load(q))
    layers = analyse(model)
    assert {la.name for la in layers} == {"n0", "n1", "n2", "n3", "n5"}
    ref = Reference(Graph(onnx.load(fp32)), 1)
    refs = [ref.run(data)]
    ref.close()
    judge = QuantJudge(model, layers, [data], refs, Criteria(), Tolerance(0.05, 0.0), 1)
    result = SimpleNamespace(plan=["n1"], layers=layers, renderings={"quantize_mode": "int8"})
    rep = ptq.reproduce(result, judge, fp32, q)
    assert rep is not None and rep.ran and not rep.exact
    assert rep.also_unquantized == ("n2",) and rep.also_quantized == ()
    (said,) = reproduction_lines(rep)
    assert "cannot reproduce the plan exactly: it also leaves n2 un-quantized (it skips " \
           "neighbours of excluded nodes)" in said
    c = invoke("-q", "check", rep.path, "--reference", fp32, "--inputs", tmp_path / "in.npz",
               "--rtol", 0.05, "--json")
    judged = json.loads(c.stdout)
    assert judged["passed"] == rep.passed
    assert judged["errors"] == {k: {**e} for k, e in rep.errors.items()}
