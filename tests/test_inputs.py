"""Inputs that cannot be judged are usage errors, never a silent pass."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper as h

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


def test_an_empty_shape_is_refused(tmp_path):
    r = invoke("run", _dynamic(tmp_path), "--shape", "x:0x16", "--out", tmp_path / "o")
    assert r.exit_code == 2 and "positive" in r.output


def test_an_empty_array_is_refused(tmp_path):
    np.savez(tmp_path / "zero.npz", x=np.zeros((0, 16), np.float32))
    r = invoke("run", _dynamic(tmp_path), "--inputs", tmp_path / "zero.npz", "--out", tmp_path / "o")
    assert r.exit_code == 2 and "empty" in r.output


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
