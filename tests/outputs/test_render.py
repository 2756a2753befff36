"""render.py: every rendering of one plan, the tools' name grammars, and the files that let a
command reproduce the run. The real-tool tests run Polygraphy and ModelOpt AutoCast where
installed (`pip install polygraphy==0.53.6`; AutoCast: see README) and skip cleanly otherwise."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.conftest import save_zoo_model
from trtbisect.base.files import npz_bytes
from trtbisect.context import Options
from trtbisect.judge.compare import Tolerance
from trtbisect.outputs import render as rd
from trtbisect.pipeline import check_mixed, run

ODD = ["/a:b/Pow", "with space", "ünï/ç:ode", "trailing:", ":leading", "x=y", "a*b"]


# ------------------------------------------------------------------------ trtexec grammar

def test_trtexec_parser_follows_the_documented_grammar():
    assert rd.parse_trtexec_spec("a:fp32,/b/c:fp16") == [("a", "fp32"), ("/b/c", "fp16")]
    assert rd.parse_trtexec_spec("onnx::Add_5:fp32") == [("onnx::Add_5", "fp32")]  # last ':'
    assert rd.parse_trtexec_spec("'a:b':fp32") == [("a:b", "fp32")]  # quoted name
    assert rd.parse_trtexec_spec("x:1x3x8x8") == [("x", "1x3x8x8")]
    assert rd.parse_trtexec_spec("") == []
    with pytest.raises(ValueError, match="found 1"):
        rd.parse_trtexec_spec("it's:fp32")
    # a comma always splits: "a,b:fp32" is two items, and "a" alone is not name:value
    assert rd.parse_trtexec_spec("a,b:fp32") == [("a", "a"), ("b", "fp32")]


@pytest.mark.parametrize("name", ODD)
def test_trtexec_names_round_trip(name):
    others = ["x", "y"]
    spec = rd.layer_precisions([name, "plain"], rd.RenderContext(node_names=(name, "plain", *others)))
    assert rd.parse_trtexec_spec(spec) == [(name, "fp32"), ("plain", "fp32")]
    argv = rd.trtexec_argv("m.onnx", "e.plan", strongly_typed=False, fp32_layers=[name],
                           known_names=[name, *others])
    # the shell hands trtexec the same word back, and trtexec splits the flag at the first '='
    words = shlex.split(rd.command_line(argv))
    value = next(w for w in words if w.startswith("--layerPrecisions=")).split("=", 1)[1]
    assert rd.parse_trtexec_spec(value) == [(name, "fp32")]


@pytest.mark.parametrize("name, why", [("a,b", "','"), ("it's", "quoted"), ("", "empty")])
def test_trtexec_refuses_names_it_cannot_express(name, why):
    with pytest.raises(rd.Unrenderable, match=why):
        rd.trtexec_name(name, ["x"])


def test_trtexec_wildcard_refused_only_where_it_matches_another_node():
    assert rd.trtexec_name("a*b", ["a*b", "c"]) == "a*b"
    with pytest.raises(rd.Unrenderable, match="also matches 'a_x_b'"):
        rd.trtexec_name("a*b", ["a*b", "a_x_b"])
    with pytest.raises(rd.Unrenderable, match="wildcard"):
        rd.trtexec_name("a*b")  # the model's names unknown: cannot prove it harmless


def test_trtexec_argv_weak_strong_shapes_tf32_and_output_types():
    ranges = {"x": ((1, 8), (2, 8), (4, 8))}
    argv = rd.trtexec_argv("m.onnx", "e.plan", strongly_typed=False, fp32_layers=["n1", "topk"],
                           output_types={"topk": ("fp16", "int64")}, shape_ranges=ranges,
                           profiling=True, layer_info_path="layers.json")
    assert argv == ["trtexec", "--onnx=m.onnx", "--fp16", "--precisionConstraints=obey",
                    "--layerPrecisions=n1:fp32,topk:fp32",
                    "--layerOutputTypes=n1:fp32,topk:fp32+int64", "--noTF32",
                    "--minShapes=x:1x8", "--optShapes=x:2x8", "--maxShapes=x:4x8",
                    "--profilingVerbosity=detailed", "--saveEngine=e.plan",
                    "--exportLayerInfo=layers.json"]
    assert rd.trtexec_argv("mixed.onnx", "e", strongly_typed=True, fp32_layers=["ignored"],
                           no_tf32=False) == ["trtexec", "--onnx=mixed.onnx", "--stronglyTyped",
                                              "--saveEngine=e"]


def test_polygraphy_words_and_convert():
    assert rd.polygraphy_word("a:b c", "float32") == "a:b c:float32"  # split at the last ':'
    with pytest.raises(rd.Unrenderable, match="option"):
        rd.polygraphy_word("-x", "float32")
    argv = rd.polygraphy_convert_argv("m.onnx", "e", strongly_typed=False, fp32_layers=["/ln/Sub"],
                                      shape_ranges={"input": ((1, 3), (1, 3), (2, 3))})
    assert argv == ["polygraphy", "convert", "m.onnx", "--fp16", "--precision-constraints",
                    "obey", "--layer-precisions", "/ln/Sub:float32",
                    "--trt-min-shapes", "input:[1,3]", "--trt-opt-shapes", "input:[1,3]",
                    "--trt-max-shapes", "input:[2,3]", "-o", "e"]
    assert rd.polygraphy_convert_argv("m.onnx", "e", strongly_typed=True) == [
        "polygraphy", "convert", "m.onnx", "--strongly-typed", "-o", "e"]


# ------------------------------------------------------------------------ context pieces

def test_output_bounds_are_trtbisects_bound_smallest_over_samples():
    refs = [{"y": np.array([1.0, -200.0, np.inf], np.float32), "i": np.array([3])},
            {"y": np.array([50.0], np.float32)}]
    b = rd.output_bounds(refs, Tolerance(0.01, 0.5))
    assert b == {"y": pytest.approx(0.01 * 50 + 0.5)} and "i" not in b


def test_shape_ranges_only_for_dynamic_inputs():
    samples = [{"x": np.zeros((2, 8)), "w": np.zeros((3,))}, {"x": np.zeros((5, 8)), "w": np.zeros(3)}]
    assert rd.shape_ranges({"x": ["batch", 8], "w": [3]}, samples) == {
        "x": ((2, 8), (2, 8), (5, 8))}


def test_npz_keeps_any_input_name(tmp_path):
    arrays = {"file": np.arange(3.0), "a/b:c d": np.ones((2, 2), np.float16)}
    (tmp_path / "s.npz").write_bytes(npz_bytes(arrays))
    with np.load(tmp_path / "s.npz") as z:
        assert set(z.files) == set(arrays) and z["a/b:c d"].dtype == np.float16


def test_refusals_are_stated_in_the_rendering_and_the_json():
    ctx = rd.RenderContext(model="m.onnx", node_names=("a,b", "-n"))
    rs = rd.render_all(["a,b", "-n"], ctx)
    assert not rs["trtexec_trt10"].ok and rs["trtexec_trt10"].text.startswith("# ")
    assert "','" in rs["trtexec_trt10"].text
    assert not rs["polygraphy"].ok and "'-n'" in rs["polygraphy"].refused[0]
    assert rs["trtexec_trt11"].ok and rs["autocast"].ok and rs["tensorrt_python"].ok
    j = rd.renderings_json(["a,b", "-n"], ctx)
    assert set(j["refused"]) == {"trtexec_trt10", "polygraphy"}
    assert j["trtexec_layer_precisions"] is None
    assert j["autocast_nodes_to_exclude"] == ["^a,b$", "^\\-n$"]


def test_python_renderings_compile_and_keep_names_exact():
    names = ["it's", 'q"uote', "ü:x,y"]
    ctx = rd.RenderContext(model="m.onnx", shape_ranges={"x": ((1,), (2,), (3,))})
    rs = rd.render_all(names, ctx)
    for key in ("autocast_python", "tensorrt_python"):
        compile(rs[key].text, key, "exec")
    ns: dict = {}
    exec(rs["tensorrt_python"].text.split("import tensorrt as trt")[1].split("def onnx_nodes")[0], ns)
    assert ns["FP32_NODES"] == names
    assert "profile.set_shape('x', [1], [2], [3])" in rs["tensorrt_python"].text
    assert "clear_flag(trt.BuilderFlag.TF32)" in rs["tensorrt_python"].text


# ------------------------------------------------------------------------ the run's files

def _renamed(z, names: dict[str, str]):
    """The zoo model with some nodes renamed (names no tool grammar was written for)."""
    m = onnx.ModelProto()
    m.CopyFrom(z.model)
    for n in m.graph.node:
        n.name = names.get(n.name, n.name)
    return m


@pytest.fixture(scope="module")
def odd_run(zoo, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("odd")
    z = zoo["reducesum_overflow"]  # AutoCast would fuse a decomposed LayerNorm (see README)
    model, inputs = save_zoo_model(z, tmp_path)
    renames = {"pool/ReduceSum": "/pool, 1:ReduceSum it's", "pool/Mul": "-ünï code"}
    onnx.save(_renamed(z, renames), model)
    out = tmp_path / "out"
    result = run(model, Options.of(inputs=[str(inputs)]), out)
    assert set(result.fp32_nodes) == {renames[n] for n in z.expected_fp32}
    return result, out, model, inputs


def test_run_writes_reproducible_commands(odd_run):
    result, out, model, _ = odd_run
    plan = json.loads((out / "precision.json").read_text())
    r = plan["renderings"]
    assert set(r["refused"]) == {"trtexec_trt10", "polygraphy"}  # ',' and "'" / leading '-'
    assert r["workdir"] == str(out.resolve())
    script = (out / "commands.sh").read_text()
    assert 'cd "$(dirname "$0")"' in script
    assert "cannot express this plan" in script
    assert "--data-loader-script data_loader.py" in script and "--atol" in script
    assert "--keep_io_types --data_max=inf --init_max=inf" in script
    assert (out / "data_loader.py").exists() and (out / "inputs" / "sample_000.npz").exists()
    # the data loader yields exactly the sample the plan was judged on
    ns: dict = {"__file__": str(out / "data_loader.py")}
    exec((out / "data_loader.py").read_text(), ns)
    fed = list(ns["load_data"]())
    assert len(fed) == 1 and set(fed[0]) == {"x"}
    assert not (out / "layer_precisions.txt").exists()  # trtexec cannot write this plan


def _tool(name: str) -> str:
    path = Path(sys.executable).parent / name
    if not path.exists():
        pytest.skip(f"{name} is not installed beside {sys.executable}")
    return str(path)


def _commands(text: str) -> list[list[str]]:
    return [shlex.split(line) for line in text.splitlines() if line and not line.startswith("#")]


def test_polygraphy_check_passes_on_the_mixed_model_and_fails_all_fp16(odd_run):
    """Runs in CI: polygraphy (pure Python) is in the dev extra."""
    pytest.importorskip("polygraphy")
    from trtbisect.backends.ort import emulation_of_mixed
    from trtbisect.graph import Graph
    from trtbisect.judge.mixed import Written, mixed_model

    result, out, model, _ = odd_run
    poly = _tool("polygraphy")
    save, check = _commands(json.loads((out / "precision.json").read_text())
                            ["renderings"]["polygraphy_check"])
    for argv in (save, check):
        done = subprocess.run([poly, *argv[1:]], cwd=out, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    mixed_model(Graph.from_path(model), []).save(out / "all16.mixed.onnx")
    Written(*emulation_of_mixed(Graph.from_path(out / "all16.mixed.onnx"))).save(out / "all_fp16.onnx")
    bad = [poly, *check[1:]]
    bad[bad.index(result.render_context.emulated_model)] = "all_fp16.onnx"
    done = subprocess.run(bad, cwd=out, capture_output=True, text=True)
    assert done.returncode != 0, "the check must be able to fail"


@pytest.mark.slow
def test_autocast_with_the_rendered_flags_reproduces_the_plan(odd_run):
    pytest.importorskip("modelopt.onnx.autocast")
    result, out, model, inputs = odd_run
    convert, check = _commands(json.loads((out / "precision.json").read_text())
                               ["renderings"]["autocast"])
    done = subprocess.run([sys.executable, *convert[1:]], cwd=out, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    converted = out / result.render_context.autocast_output
    assert fp32_compute_nodes(onnx.load(str(converted))) == set(result.fp32_nodes)
    assert check[:3] == ["trtbisect", "check", result.render_context.autocast_output]
    verdict = check_mixed(converted, model, Options.of(inputs=[str(inputs)]))
    assert verdict.passed


@pytest.fixture(scope="module")
def masked_runs(zoo, tmp_path_factory):
    """The -3.4e38 attention-mask fill, computed from constants: under trt TensorRT folds it in
    FP32 and clamps it into FP16 (FP16 passes as it is); per node it is -inf."""
    tmp_path = tmp_path_factory.mktemp("masked")
    model, inputs = save_zoo_model(zoo["constant_out_of_range"], tmp_path)
    return {sem: (run(model, Options.of(inputs=[str(inputs)], semantics=sem),
                      tmp_path / sem), tmp_path / sem, model, inputs)
            for sem in ("trt", "strict")}


def _autocast_argv(out: Path) -> tuple[list[str], list[str]]:
    return tuple(_commands(json.loads((out / "precision.json").read_text())
                           ["renderings"]["autocast"]))


def test_autocast_converts_the_graph_tensorrt_builds(masked_runs):
    """Under trt the AutoCast rendering converts the judged graph (constant subgraphs folded in
    FP32, written beside the plan), not the model as given; its check line still judges against
    the model as given. Under strict the judged graph is the model: nothing extra is written."""
    result, out, model, _ = masked_runs["trt"]
    assert result.verdict == "fp16_ok"
    convert, check = _autocast_argv(out)
    given = out / "constant_out_of_range.autocast_input.onnx"
    assert f"--onnx_path={given.name}" in convert and result.files["autocast_input"] == str(given)
    assert check[check.index("--reference") + 1] == str(model)
    m = onnx.load(str(given))
    assert not any(n.name.startswith("mask/") for n in m.graph.node)  # folded into a weight
    folded = [onnx.numpy_helper.to_array(t) for t in m.graph.initializer]
    assert any(a.dtype == np.float32 and a.min() < -1e38 for a in folded)  # still FP32 as given
    python = json.loads((out / "precision.json").read_text())["renderings"]["autocast_python"]
    assert f"onnx_path={given.name!r}" in python
    result, out, model, _ = masked_runs["strict"]
    assert result.verdict == "fixed" and "autocast_input" not in result.files
    assert not list(out.glob("*.autocast_input.onnx"))
    convert, _ = _autocast_argv(out)
    assert f"--onnx_path={model}" in convert


@pytest.mark.parametrize("fill, written", [(-3.4e38, True), (1e-30, True), (-2.0, False)])
def test_the_built_graph_is_written_only_when_autocast_would_convert_differently(
        tmp_path, fill, written):
    """A Constant node whose value TensorRT clamps as a weight (beyond 65504, or a nonzero below
    FP16's smallest subnormal) makes AutoCast convert the built graph; an in-range Constant and
    no fold: AutoCast converts the model as given, and no copy of the weights is written."""
    from onnx import TensorProto as TP
    from onnx import helper as h
    c = h.make_node("Constant", [], ["c"], name="fill", value=onnx.numpy_helper.from_array(
        np.array([0.0, fill, 0.0, 0.0], np.float32)))
    nodes = [c, h.make_node("Add", ["x", "c"], ["s"], name="add"),
             h.make_node("Softmax", ["s"], ["y"], name="softmax", axis=-1)]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [2, 4])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [2, 4])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.save(m, tmp_path / "m.onnx")
    result = run(tmp_path / "m.onnx", Options(), tmp_path / "out")
    assert ("autocast_input" in result.files) is written
    convert, _ = _autocast_argv(tmp_path / "out")
    assert (f"--onnx_path={tmp_path / 'm.onnx'}" in convert) is not written


@pytest.mark.slow
@pytest.mark.parametrize("semantics", ["trt", "strict"])
def test_autocast_of_the_built_graph_reproduces_the_plan(masked_runs, semantics):
    """AutoCast run as rendered gives a file the run's judge passes, with the plan's nodes (and
    only those) in FP32; under trt, AutoCast given the model as is fails, which is why the
    rendering hands it the built graph."""
    pytest.importorskip("modelopt.onnx.autocast")
    result, out, model, inputs = masked_runs[semantics]
    convert, check = _autocast_argv(out)
    done = subprocess.run([sys.executable, *convert[1:]], cwd=out, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    converted = out / result.render_context.autocast_output
    opts = Options.of(inputs=[str(inputs)], semantics=semantics)
    assert fp32_compute_nodes(onnx.load(str(converted))) >= set(result.fp32_nodes)
    assert check_mixed(converted, model, opts).passed
    if semantics == "trt":
        as_given = [a if not a.startswith("--onnx_path=") else f"--onnx_path={model}"
                    for a in convert]
        as_given[as_given.index(next(a for a in as_given if a.startswith("--output_path=")))] = \
            "--output_path=as_given.onnx"
        done = subprocess.run([sys.executable, *as_given[1:]], cwd=out, capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        assert not check_mixed(out / "as_given.onnx", model, opts).passed


def fp32_compute_nodes(model: onnx.ModelProto) -> set[str]:
    """Non-Cast nodes that read a float32 tensor: the nodes a converter left in FP32."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type
             for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    types.update({t.name: t.data_type for t in model.graph.initializer})
    return {n.name for n in model.graph.node if n.op_type != "Cast"
            and any(types.get(i) == onnx.TensorProto.FLOAT for i in n.input)}
