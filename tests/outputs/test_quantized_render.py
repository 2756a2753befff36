"""The quantized plan's renderings (trtbisect/outputs/quantized.py) from plain data: what
commands.sh's ModelOpt line reads is what the run writes beside it, and each line names the
plan it was given (the runs' own renderings: tests/quant/)."""

from __future__ import annotations

import shlex

import numpy as np

from trtbisect.outputs.quantized import QuantPlan, renderings
from trtbisect.quant import ptq


def _plan(**kw) -> QuantPlan:
    base = dict(model_path="/runs/net.int8.onnx", reference="words: the Q/DQ removed",
                formats=frozenset({"int8"}), unquantized=("mm1", "a.b"), fp32_ops=(),
                half=False, plan_file=True)
    return QuantPlan(**{**base, **kw})  # type: ignore[arg-type]


def _modelopt_argv(r: dict) -> list[str]:
    line = next(x for x in r["commands_sh"].splitlines()
                if x.startswith("python -m modelopt"))
    assert line == r["modelopt_cli"]
    return shlex.split(line)


def test_the_modelopt_line_reads_the_calibration_file_the_run_writes(tmp_path):
    """commands.sh runs from the run folder: its --calibration_data_path is the very file
    ptq.write_calibration puts there (the run's samples stacked for a file given as is)."""
    argv = _modelopt_argv(renderings(_plan()))
    (data,) = [a.split("=", 1)[1] for a in argv if a.startswith("--calibration_data_path=")]
    sample = {"x": np.ones((1, 4), np.float32)}
    written = ptq.write_calibration(tmp_path, tmp_path / "net.int8.onnx", [sample, sample])
    assert written is not None and written == tmp_path / data
    assert np.load(tmp_path / data)["x"].shape == (2, 4)


def test_each_line_names_the_plan_it_was_given(tmp_path):
    fp32 = tmp_path / "net.onnx"
    r = renderings(_plan(reference=str(fp32), formats=frozenset({"fp8"}), half=True,
                         fp32_ops=("Add", "Mul")))
    argv = _modelopt_argv(r)
    assert f"--onnx_path={fp32.resolve()}" in argv and "--quantize_mode=fp8" in argv
    assert "--high_precision_dtype=fp16" in argv
    excl = argv[argv.index("--nodes_to_exclude") + 1:argv.index("--op_types_to_exclude_fp16")]
    assert excl == r["modelopt_nodes_to_exclude"] == ["mm1$", r"a\.b$"]
    assert argv[argv.index("--op_types_to_exclude_fp16") + 1:] == ["Add", "Mul"]
    assert r["trtexec"] == "trtexec --onnx=net.int8.unquantized.onnx --stronglyTyped"
    assert r["trtexec"] in r["commands_sh"].splitlines()


def test_no_plan_file_no_engine_lines_and_an_unknown_reference_is_said():
    r = renderings(_plan(unquantized=(), plan_file=False))
    argv = _modelopt_argv(r)
    assert "--onnx_path=model_fp32.onnx" in argv and "--nodes_to_exclude" not in argv
    assert "# model_fp32.onnx: the FP32 model the file was quantized from" in r["commands_sh"]
    assert r["trtexec"] is None and "trtexec" not in r["commands_sh"]
    assert "polygraphy" not in r["commands_sh"]
    assert "quantize(onnx_path='model_fp32.onnx'" in r["modelopt_python"]
