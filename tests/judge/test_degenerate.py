"""Degenerate models and hostile environments get one line and a documented exit code (#25):
nothing to judge in FP16 (int64, bool, no nodes), float64 compute, stdout closed, an ASCII-only
or C locale; and the bounds: random samples against memory, --stability (external data:
tests/graph/test_load.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto as TP
from onnx import helper as h

from tests.fuzz.make_cases import overflow_model, tiny_model, typed_model
from trtbisect.cli import main

ROOT = Path(__file__).resolve().parents[2]


def invoke(*args):
    return CliRunner().invoke(main, ["-q", *map(str, args)])


def one_error_line(r) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), r.output
    return lines[0]


def no_nodes() -> onnx.ModelProto:
    g = h.make_graph([], "empty", [h.make_tensor_value_info("x", TP.FLOAT, [2, 4])],
                     [h.make_tensor_value_info("x", TP.FLOAT, [2, 4])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 10
    return m


@pytest.mark.parametrize("model,why", [
    (lambda: typed_model(TP.INT64, "Add"), "no node computes in float32 or float16"),
    (lambda: typed_model(TP.BOOL, "And"), "no node computes in float32 or float16"),
    (no_nodes, "the graph has no nodes")])
def test_nothing_to_judge_is_a_verdict_of_its_own(tmp_path, model, why):
    onnx.save(model(), tmp_path / "m.onnx")
    r = invoke("run", tmp_path / "m.onnx", "--out", tmp_path / "out")
    assert r.exit_code == 0, (r.output, r.exception)
    assert "nothing to judge in FP16" in r.stdout and why in r.stdout.replace("\n", " ")
    plan = json.loads((tmp_path / "out" / "precision.json").read_text())
    assert plan["verdict"] == "nothing_to_judge" and plan["fp32_nodes"] == []
    assert plan["nothing_to_judge"] == why or plan["nothing_to_judge"].startswith(why)
    r = invoke("compare", tmp_path / "m.onnx")
    assert r.exit_code == 0 and "nothing to compare" in r.stdout


def test_float_nodes_beyond_the_judge_are_never_nothing_to_judge(tmp_path):
    """A node that computes in float (here an If) is never "nothing to judge": FP16 could change
    it. Where the judge cannot take it (an If kept FP32 whole) and nothing else is a candidate,
    the run is refused; where its body is judged (#26), the verdict is the judge's."""
    body = [h.make_graph([h.make_node(op, ["x", "x"], [t], name=f"body_{op}")], t, [],
                         [h.make_tensor_value_info(t, TP.FLOAT, [2, 4])])
            for op, t in (("Mul", "t"), ("Add", "e"))]
    g = h.make_graph([h.make_node("If", ["c"], ["y"], then_branch=body[0], else_branch=body[1],
                                  name="cond")], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [2, 4]),
                      h.make_tensor_value_info("c", TP.BOOL, [])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [2, 4])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 10
    onnx.save(m, tmp_path / "m.onnx")
    r = invoke("run", tmp_path / "m.onnx", "--out", tmp_path / "out")
    if r.exit_code == 2:
        line = one_error_line(r)
        assert "none can be judged" in line and "'cond'" in line
    else:
        plan = json.loads((tmp_path / "out" / "precision.json").read_text())
        assert plan["verdict"] != "nothing_to_judge", plan["verdict"]


def test_float64_compute_is_refused_with_tensorrts_reason(tmp_path):
    onnx.save(typed_model(TP.DOUBLE, "Mul"), tmp_path / "m.onnx")
    for cmd in (["run", tmp_path / "m.onnx", "--out", tmp_path / "out"],
                ["compare", tmp_path / "m.onnx"]):
        line = one_error_line(invoke(*cmd))
        assert "float64" in line and "casts DOUBLE down to FLOAT" in line
        assert "onnx-tensorrt" in line  # the source it cites


def test_float64_beside_float32_is_named(tmp_path, caplog):
    m = overflow_model()
    m.graph.node.extend([h.make_node("Cast", ["y"], ["y64"], to=TP.DOUBLE, name="to64"),
                         h.make_node("Mul", ["y64", "y64"], ["z"], name="sq64")])
    m.graph.output.append(h.make_tensor_value_info("z", TP.DOUBLE, [2, 4]))
    onnx.save(m, tmp_path / "m.onnx")
    np.savez(tmp_path / "in.npz", x=np.ones((2, 4), np.float32))
    r = CliRunner().invoke(main, ["run", str(tmp_path / "m.onnx"), "--inputs",
                                  str(tmp_path / "in.npz"), "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert "compute in float64" in r.stderr and "sq64" in r.stderr


def _cli(args, **env):
    return subprocess.run([sys.executable, "-m", "trtbisect", *map(str, args)],
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                          capture_output=True, text=True, timeout=900)


@pytest.fixture
def unicode_model(tmp_path):
    onnx.save(overflow_model(("up\u00e9", "\u8f93\u5165\u2192", "down\u00e9")), tmp_path / "u.onnx")
    np.savez(tmp_path / "in.npz", x=np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4))
    return tmp_path / "u.onnx", tmp_path / "in.npz"


def test_stdout_closed(unicode_model, tmp_path):
    model, inputs = unicode_model
    proc = subprocess.run([sys.executable, "-m", "trtbisect", "run", str(model), "--inputs",
                           str(inputs), "--out", str(tmp_path / "out")],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=900,
                          preexec_fn=lambda: os.close(1))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "stdout is closed" in proc.stderr
    assert json.loads((tmp_path / "out" / "precision.json").read_text())["verdict"] == "fixed"


@pytest.mark.parametrize("env", [{"PYTHONIOENCODING": "ascii"},
                                 {"PYTHONUTF8": "0", "LC_ALL": "C", "LANG": "C"}])
def test_non_ascii_names_on_an_ascii_terminal(unicode_model, tmp_path, env):
    model, inputs = unicode_model
    proc = _cli(["run", model, "--inputs", inputs, "--out", tmp_path / "out"], **env)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "up\\xe9" in proc.stdout  # shown escaped, not a UnicodeEncodeError
    plan = json.loads((tmp_path / "out" / "precision.json").read_text(encoding="utf-8"))
    assert plan["fp32_nodes"] == ["up\u00e9", "\u8f93\u5165\u2192", "down\u00e9"]


# ---------------------------------------------------------------- bounds

def test_random_samples_are_bounded_by_memory(tmp_path, monkeypatch):
    onnx.save(tiny_model(dims=("n", 4)), tmp_path / "m.onnx")
    line = one_error_line(invoke("run", tmp_path / "m.onnx", "--shape", "x:100000000x4",
                                 "--samples", "500", "--out", tmp_path / "out"))
    assert "--samples 500" in line and "GiB" in line and "half of this machine's memory" in line
    line = one_error_line(invoke("run", tmp_path / "m.onnx", "--shape", "x:2x4",
                                 "--samples", "1000000000", "--out", tmp_path / "out"))
    assert "1<=x<=10000" in line
    assert not (tmp_path / "out" / "journal.jsonl").exists()  # refused before any work


def test_stability_is_bounded(tmp_path, monkeypatch):
    onnx.save(overflow_model(), tmp_path / "m.onnx")
    line = one_error_line(invoke("run", tmp_path / "m.onnx", "--stability", "1000",
                                 "--out", tmp_path / "out"))
    assert "0<=x<=100" in line
    monkeypatch.setattr("trtbisect.base.limits.memory_limit", lambda: 1000)  # 100 copies of 32 B
    line = one_error_line(invoke("run", tmp_path / "m.onnx", "--stability", "100",
                                 "--out", tmp_path / "out"))
    assert "--stability 100" in line and "half of this machine's memory" in line
