"""Inputs that cannot be judged are usage errors, never a silent pass."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

from tests.test_cli import invoke


def _dynamic(tmp_path):
    g = h.make_graph([h.make_node("Mul", ["x", "x"], ["y"], name="sq")], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, ["n", 16])],
                     [h.make_tensor_value_info("y", TP.FLOAT, ["n", 16])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 10
    path = tmp_path / "dyn.onnx"
    onnx.save(m, path)
    return path


def test_a_run_whose_every_output_is_empty_is_a_clear_message(tmp_path):
    r = invoke("run", _dynamic(tmp_path), "--shape", "x:0x16", "--out", tmp_path / "o")
    assert r.exit_code == 2 and "nothing to judge" in r.output and "Traceback" not in r.output
    np.savez(tmp_path / "zero.npz", x=np.zeros((0, 16), np.float32))
    r = invoke("run", _dynamic(tmp_path), "--inputs", tmp_path / "zero.npz", "--out", tmp_path / "o")
    assert r.exit_code == 2 and "nothing to judge" in r.output


def _decoder_step(tmp_path):
    """A decoder's first step: past keys of sequence length 0 concatenated with the new one,
    and a ReduceSum whose `axes` input is empty (reduce everything)."""
    nodes = [h.make_node("Concat", ["past", "new"], ["kv"], axis=1, name="cat"),
             h.make_node("Mul", ["kv", "kv"], ["sq"], name="sq"),
             h.make_node("ReduceSum", ["sq", "axes"], ["total"], keepdims=1, name="sum")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("past", TP.FLOAT, [1, "t", 8]),
                                  h.make_tensor_value_info("new", TP.FLOAT, [1, 1, 8]),
                                  h.make_tensor_value_info("axes", TP.INT64, ["n"])],
                     [h.make_tensor_value_info("sq", TP.FLOAT, [1, "t1", 8]),
                      h.make_tensor_value_info("total", TP.FLOAT, [1, 1, 1])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 10
    onnx.save(m, tmp_path / "step.onnx")
    np.savez(tmp_path / "step.npz", past=np.zeros((1, 0, 8), np.float32),
             new=np.full((1, 1, 8), 300.0, np.float32), axes=np.zeros((0,), np.int64))
    return tmp_path / "step.onnx", tmp_path / "step.npz"


def test_empty_tensors_are_data(tmp_path):
    """Zero-size dimensions are fed as given and judged like any data: here 300^2 overflows
    FP16, so the plan keeps the square in FP32."""
    model, data = _decoder_step(tmp_path)
    r = invoke("-q", "run", model, "--inputs", data, "--out", tmp_path / "o", "--json")
    assert r.exit_code == 0, r.output
    import json
    plan = json.loads(r.output)
    assert plan["verdict"] == "fixed" and "sq" in plan["fp32_nodes"]
    r = invoke("-q", "run", model, "--shape", "past:1x0x8", "--shape", "axes:0",
               "--out", tmp_path / "r", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["samples"] == 1, r.output


@pytest.mark.parametrize("shape,code", [("x:2x16", 0), ("x:3x16", 2)])
def test_shape_must_agree_with_the_data(tmp_path, shape, code):
    np.savez(tmp_path / "x.npz", x=np.ones((2, 16), np.float32))
    r = invoke("-q", "run", _dynamic(tmp_path), "--inputs", tmp_path / "x.npz", "--shape", shape,
               "--out", tmp_path / "o")
    assert r.exit_code == code, r.output
    if code:
        assert "disagrees" in r.output


def test_a_closed_stdout_is_141_not_a_bug(tmp_path):
    import subprocess
    import sys
    cmd = (f"{sys.executable} -m trtbisect -q run {_dynamic(tmp_path)} --shape x:2x16 "
           f"--out {tmp_path / 'o'} | head -c 1 >/dev/null; exit ${{PIPESTATUS[0]}}")
    done = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True)
    assert done.returncode in (0, 141), done.stderr  # 0: everything fitted the pipe first
    assert "Traceback" not in done.stderr
