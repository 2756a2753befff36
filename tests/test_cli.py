"""The command line through click's runner: exit codes, one-line errors, JSON, help."""

from __future__ import annotations

import json

import click
import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from tests.conftest import save_zoo_model
from trtbisect.cli import main


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_one_line_error(result, code, *fragments):
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    # progress lines may come first (stderr without a terminal); the error is one last line
    assert lines[-1].startswith("error:"), result.output
    assert sum(line.startswith("error:") for line in lines) == 1, result.output
    for f in fragments:
        assert f in result.output


@pytest.mark.parametrize("name,code", [("layernorm_overflow", 0), ("healthy", 0),
                                       ("fp32_broken", 3)])
def test_run_exit_codes_and_json(zoo, tmp_path, name, code):
    model, inputs = save_zoo_model(zoo[name], tmp_path)
    r = invoke("-q", "run", model, "--semantics", "strict", "--inputs", inputs, "--out", tmp_path / "out", "--json")
    assert r.exit_code == code, r.output
    data = json.loads(r.output)
    assert data["verdict"] == zoo[name].expected_verdict
    assert set(data["fp32_nodes"]) == set(zoo[name].expected_fp32)
    assert isinstance(data["evaluations"], int)


def test_run_table_names_the_culprits(zoo, tmp_path):
    model, inputs = save_zoo_model(zoo["layernorm_overflow"], tmp_path)
    r = invoke("-q", "run", model, "--semantics", "strict", "--inputs", inputs, "--out", tmp_path / "out")
    assert r.exit_code == 0
    for node in zoo["layernorm_overflow"].expected_fp32:
        assert node in r.output
    assert "65504" in r.output


def test_no_plan_exits_4(zoo, tmp_path):
    model, inputs = save_zoo_model(zoo["layernorm_overflow"], tmp_path)
    r = invoke("-q", "run", model, "--semantics", "strict", "--inputs", inputs, "--out", tmp_path / "o", "--max-evals", "1")
    assert r.exit_code == 4, r.output  # only all-FP16 was evaluated: no passing plan known


def test_wrong_input_name_dtype_and_shape(zoo, tmp_path):
    model, _ = save_zoo_model(zoo["layernorm_overflow"], tmp_path)
    name, value = next(iter(zoo["layernorm_overflow"].inputs.items()))
    np.savez(tmp_path / "a.npz", wrong=value)
    assert_one_line_error(invoke("run", model, "--inputs", tmp_path / "a.npz"), 2, name)
    np.savez(tmp_path / "b.npz", **{name: value.astype(np.float64)})
    assert_one_line_error(invoke("run", model, "--inputs", tmp_path / "b.npz"), 2, "float64")
    np.savez(tmp_path / "c.npz", **{name: value[..., :1]})
    assert_one_line_error(invoke("run", model, "--inputs", tmp_path / "c.npz"), 2, "shape")


def test_dynamic_shape_needs_a_shape(zoo, tmp_path):
    z = zoo["layernorm_overflow"]
    m = onnx.ModelProto()
    m.CopyFrom(z.model)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    path = tmp_path / "dyn.onnx"
    onnx.save(m, path)
    name = m.graph.input[0].name
    assert_one_line_error(invoke("run", path, "--out", tmp_path / "o"), 2, name, "--shape")
    dims = [d.dim_value or 2 for d in m.graph.input[0].type.tensor_type.shape.dim]
    r = invoke("-q", "run", path, "--out", tmp_path / "o", "--shape",
               f"{name}:{'x'.join(map(str, dims))}", "--json")
    assert r.exit_code in (0, 4), r.output


def test_unsupported_op(tmp_path):
    from onnx import TensorProto as TP
    from onnx import helper as h
    g = h.make_graph([h.make_node("FancyOp", ["x"], ["y"], domain="com.example", name="f")], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [2])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [2])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13), h.make_opsetid("com.example", 1)])
    m.ir_version = 10
    path = tmp_path / "custom.onnx"
    onnx.save(m, path)
    assert_one_line_error(invoke("run", path, "--out", tmp_path / "o"), 2, "onnxruntime")


def test_compare_and_check_commands(zoo, tmp_path):
    model, inputs = save_zoo_model(zoo["layernorm_overflow"], tmp_path)
    r = invoke("compare", model, "--inputs", inputs)
    assert r.exit_code == 0 and "first value beyond 65504" in r.output
    data = json.loads(invoke("compare", model, "--inputs", inputs, "--json").output)
    assert data["summary"]["first_overflow"]
    invoke("-q", "run", model, "--semantics", "strict", "--inputs", inputs, "--out", tmp_path / "out")
    mixed = tmp_path / "out" / f"{model.stem}.mixed.onnx"
    ok = invoke("check", mixed, "--reference", model, "--inputs", inputs)
    assert ok.exit_code == 0, ok.output
    same = invoke("check", model, "--reference", model, "--inputs", inputs)  # the FP32 model itself
    assert same.exit_code == 0 and "0 float16 tensors" in same.output


def test_compare_is_the_librarys_call_the_command_prints(zoo, tmp_path):
    """pipeline.compare finds, `compare --json` prints exactly that; criterion flags add the
    all-FP16 verdict; a broken reference is refused by the library (exit 3) and the command."""
    from trtbisect import pipeline
    from trtbisect.context import Options
    from trtbisect.errors import TrtBisectError
    from trtbisect.judge.criteria import Criteria

    model, inputs = save_zoo_model(zoo["layernorm_overflow"], tmp_path)
    found = pipeline.compare(model, Options.of(inputs=[str(inputs)]))
    assert found.nothing is None and found.judged is None and found.summary["first_overflow"]
    printed = json.loads(invoke("-q", "compare", model, "--inputs", inputs, "--json").output)
    assert printed == json.loads(json.dumps(found.to_json()))
    half = Options.of(inputs=[str(inputs)], criteria=Criteria(pass_rate=0.5))
    judged = pipeline.compare(model, half)
    assert judged.judged is not None and judged.stats == found.stats  # the same tensors, judged
    printed = json.loads(invoke("-q", "compare", model, "--inputs", inputs, "--pass-rate", "0.5",
                                "--json").output)
    assert printed["all_fp16"] == json.loads(json.dumps(judged.judged.to_json()))
    broken, broken_inputs = save_zoo_model(zoo["fp32_broken"], tmp_path / "b")
    with pytest.raises(TrtBisectError) as e:
        pipeline.compare(broken, Options.of(inputs=[str(broken_inputs)]))
    assert e.value.exit_code == 3
    assert_one_line_error(invoke("compare", broken, "--inputs", broken_inputs), 3, "already broken")


def test_every_command_has_help():
    for cmd in [[], *[[name] for name in main.list_commands(click.Context(main))]]:
        r = invoke(*cmd, "--help")
        assert r.exit_code == 0 and "Usage" in r.output
        assert len(r.output.splitlines()) > 5


def test_import_does_not_pull_heavy_optional_dependencies():
    import subprocess
    import sys
    code = ("import sys, trtbisect, trtbisect.cli, trtbisect.pipeline; "
            "print([m for m in ('torch', 'tensorrt', 'matplotlib') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
