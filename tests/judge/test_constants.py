"""Issue #20: a weight is a weight however the exporter stored it, and LayerNormalization is
rounded like every node.

Planted models keep their weights in Constant nodes (paddle2onnx, tf2onnx style); each must
give the verdict, the errors (bit for bit) and the plan of its twin whose Constants are
initializers, under both semantics, and `check` of the written file must say what the run
said. Opset-17 LayerNormalization is a candidate: strict rounds it, trt rounds it as
TensorRT's normalization layer runs in FP16 (inputs and Y rounded, computed in FP32), and its
Mean/InvStdDev stay FP32.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import save_zoo_model
from tests.judge.test_semantics_pipeline import _judge_agrees, _same_bits
from tests.models.semantics_models import (
    constant_planted,
    constant_stored,
    layernorm_overflow_opset17,
)
from trtbisect.backends.ort import Emulator, make_session
from trtbisect.context import Options
from trtbisect.diagnosis.diagnose import CulpritGroup
from trtbisect.graph import Graph, fp16_signature, fp32_outputs, node_names
from trtbisect.judge import semantics as sem
from trtbisect.pipeline import check_mixed, run
from trtbisect.result import RunResult, as_json

CONSTANT_PLANTED = constant_planted()
ZOO_AS_CONSTANTS = ["eps_underflow", "constant_out_of_range", "layernorm_overflow",
                    "precision_loss", "healthy"]
SEMANTICS = ["trt", "strict"]


def _run(model: onnx.ModelProto, inputs: dict, semantics: str, folder: Path,
         name: str = "m") -> RunResult:
    folder.mkdir(parents=True, exist_ok=True)
    path, npz = folder / f"{name}.onnx", folder / f"{name}_inputs.npz"
    onnx.save(model, path)
    np.savez(npz, **inputs)
    return run(path, Options.of(inputs=[str(npz)], semantics=semantics), folder / "out")


def _assert_same_run(a: RunResult, b: RunResult) -> None:
    """Verdict, plan, evaluations and every error field, bit for bit (floats compared exactly)."""
    assert (a.verdict, a.fp32_nodes) == (b.verdict, b.fp32_nodes)
    assert _errors(a.errors_before) == _errors(b.errors_before)
    assert _errors(a.errors_after) == _errors(b.errors_after)
    assert a.evaluations == b.evaluations
    assert a.fp32_layers == b.fp32_layers
    assert as_json(a.errors_before_strict) == as_json(b.errors_before_strict)


def _errors(errors: dict) -> str:
    """Every field of every output's error, exactly (NaN equal to NaN)."""
    return json.dumps({k: {f: repr(x) for f, x in vars(e).items()} for k, e in errors.items()},
                      sort_keys=True)


def _assert_check_is_the_run(r: RunResult, folder: Path, semantics: str) -> None:
    """`trtbisect check` of the written mixed model reports the run's errors, bit for bit."""
    if r.verdict not in ("fixed", "fp16_ok"):
        return
    data = json.loads((folder / "out" / "precision.json").read_text())
    assert data["one_judge"]["search_equals_check"] is True
    checked = check_mixed(folder / "out" / "m.mixed.onnx", folder / "m.onnx",
                          Options.of(inputs=[str(folder / "m_inputs.npz")], semantics=semantics))
    for out, e in checked.errors.items():
        assert data["errors_after"][out] == e.to_json()


# ------------------------------------------------------ twins: Constant nodes vs initializers

@pytest.mark.parametrize("semantics", SEMANTICS)
@pytest.mark.parametrize("name", list(CONSTANT_PLANTED))
def test_constant_weights_and_their_initializer_twin_give_one_answer(tmp_path, name, semantics):
    p = CONSTANT_PLANTED[name]
    held = _run(p.model, p.inputs, semantics, tmp_path / "constants")
    twin = _run(sem.constants_as_initializers(p.model), p.inputs, semantics, tmp_path / "twin")
    _assert_same_run(held, twin)
    if semantics in p.expected:
        assert (held.verdict, set(held.fp32_nodes)) == (
            p.expected[semantics][0], set(p.expected[semantics][1]))
    _assert_check_is_the_run(held, tmp_path / "constants", semantics)
    _assert_check_is_the_run(twin, tmp_path / "twin", semantics)


@pytest.mark.parametrize("semantics", SEMANTICS)
@pytest.mark.parametrize("name", ZOO_AS_CONSTANTS)
def test_zoo_models_with_constant_weights_match_the_zoo(zoo, tmp_path, name, semantics):
    """The zoo's own models (initializers) against copies whose weights are Constant nodes."""
    z = zoo[name]
    _assert_same_run(_run(constant_stored(z.model), z.inputs, semantics, tmp_path / "c"),
                     _run(z.model, z.inputs, semantics, tmp_path / "i"))


@pytest.mark.parametrize("semantics", SEMANTICS)
def test_search_and_written_file_agree_on_constant_stored_models(tmp_path, semantics):
    for k, p in enumerate(CONSTANT_PLANTED.values()):
        folder = tmp_path / str(k)
        folder.mkdir()
        _judge_agrees(p.model, p.inputs, semantics, tf32=False, folder=folder)


def test_the_emulator_rounds_a_constant_output_as_it_rounds_an_initializer():
    """Strict: a Constant's value rounded at run time (a Cast pair) and an initializer
    pre-rounded by numpy are the same bits, read by the same kernel, for values in range,
    beyond it (inf), subnormal and flushed."""
    w = np.array([[1.0, 70000.0, -1e6, 3e-6], [1e-9, -0.333, 65519.0, 2.0 ** -25],
                  [6e-8, -7e4, 0.1, 12.5], [1e-3, 2.0, -3.0, 0.5]], np.float32)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    stored = constant_stored(_matmul_model(w))
    outs = []
    for model in (stored, sem.constants_as_initializers(stored)):
        g = Graph(model)
        outs.append(Emulator(g).run(frozenset(), {"x": x})["y"])
    assert _same_bits(outs[0], outs[1])
    assert np.isinf(outs[0]).any()  # the test reaches the out-of-range values


def _matmul_model(w: np.ndarray) -> onnx.ModelProto:
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
        [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=10)


# --------------------------------------------------------------- prepare sees Constants

def _unnamed_bn_model() -> onnx.ModelProto:
    """Conv -> BatchNorm with every weight in an unnamed Constant and every node unnamed."""
    rng = np.random.default_rng(2)
    c = 3

    def const(name, value):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(
            np.asarray(value, np.float32), name))
    nodes = [const("w", rng.standard_normal((c, 1, 3, 3))), const("g", np.ones(c)),
             helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             const("beta", np.zeros(c)), const("mean", np.full(c, 0.5)),
             const("var", np.full(c, 9.8e7)),
             helper.make_node("BatchNormalization", ["c", "g", "beta", "mean", "var"], ["b"]),
             helper.make_node("Relu", ["b"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     [1, 1, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 6, 6])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=10)


def test_prepare_makes_constants_weights_folds_the_batchnorm_and_keeps_every_name():
    model = _unnamed_bn_model()
    prepared = sem.prepare(model, "trt")
    ops = [n.op_type for n in prepared.model.graph.node]
    assert ops == ["Conv", "Relu"]  # no Constant left, the BatchNorm folded into the Conv
    names = node_names(model)
    assert [n.name for n in prepared.model.graph.node] == [names[2], names[7]]  # Conv_2, Relu_7
    assert prepared.renamed[names[6]] == names[2]
    assert any(n.startswith("constant_weights: 5 Constant") for n in prepared.notes)
    folded = {t.name: numpy_helper.to_array(t) for t in prepared.model.graph.initializer}
    assert set(folded) == {f"{names[2]} + {names[6]}.weight", f"{names[2]} + {names[6]}.bias"}
    assert max(abs(float(a.max())) for a in folded.values()) < 1.0  # var never a weight
    again = sem.prepare(prepared.model, "trt")  # idempotent
    assert [n.name for n in again.model.graph.node] == [n.name for n in
                                                        prepared.model.graph.node]


def test_shape_arithmetic_and_the_reshape_it_feeds_fold_into_one_weight():
    p = CONSTANT_PLANTED["reshape_shape_in_constant"]
    prepared = sem.prepare(p.model, "trt")
    ops = [n.op_type for n in prepared.model.graph.node]
    assert ops == ["Add", "MatMul", "Sub"]
    w = next(t for t in prepared.model.graph.initializer if t.name == "w")
    assert tuple(w.dims) == (16, 16) and w.data_type == TensorProto.FLOAT
    assert prepared.renamed["reshape_w"] == "matmul"


def test_a_folded_value_read_only_inside_an_if_body_is_kept():
    """A constant computation whose only reader is a node of an If branch (an outer-scope
    read) stays available to it after folding."""
    k = helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(
        np.array([2.0, 3.0], np.float32), "k"))
    kk = helper.make_node("Mul", ["k", "k"], ["k2"], name="k_squared")
    then = helper.make_graph([helper.make_node("Mul", ["x", "k2"], ["t"], name="then_mul")],
                             "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT,
                                                                        [2])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"], name="else_id")],
                              "else", [], [helper.make_tensor_value_info("e", TensorProto.FLOAT,
                                                                         [2])])
    cond = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(
        np.array(True), "c"))
    iff = helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)
    g = helper.make_graph([k, kk, cond, iff], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=10)
    prepared = sem.prepare(model, "trt").model
    assert "k_squared" not in [n.name for n in prepared.graph.node]
    x = np.array([1.0, -1.0], np.float32)
    got = make_session(prepared).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, x * np.array([4.0, 9.0], np.float32))


# --------------------------------------------------------------------- LayerNormalization

def test_layernormalization_runs_in_fp16_with_fp32_statistics():
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv"])
    assert fp16_signature(node, 17) == frozenset({0, 1, 2})
    assert fp32_outputs(node, 17) == frozenset({1, 2})
    assert fp32_outputs(helper.make_node("Add", ["a", "b"], ["c"]), 17) == frozenset()


@pytest.mark.parametrize("semantics", SEMANTICS)
def test_a_plan_names_the_layernorm_that_reads_out_of_range_values(tmp_path, semantics):
    p = layernorm_overflow_opset17()
    model, inputs = save_zoo_model(p, tmp_path)
    r = run(model, Options.of(inputs=[str(inputs)], semantics=semantics), tmp_path / "out")
    assert (r.verdict, set(r.fp32_nodes)) == (p.expected[semantics][0],
                                              set(p.expected[semantics][1]))
    data = json.loads((tmp_path / "out" / "precision.json").read_text())
    assert data["one_judge"]["search_equals_check"] is True


def test_layernorm_in_fp16_rounds_inputs_and_y_and_keeps_mean_in_fp32(tmp_path):
    """All-FP16 on the emulator is LayerNorm computed in FP32 on FP16-rounded X, Scale and B,
    Y rounded to FP16, Mean not rounded; the written file types them so (valid ONNX), and
    `check` of it gives the same bits."""
    rng = np.random.default_rng(3)
    d = 8
    scale = (1 + 0.3 * rng.standard_normal(d)).astype(np.float32)
    bias = (0.3 * rng.standard_normal(d)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "mean"], name="ln",
                          epsilon=1e-5)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, d]),
         helper.make_tensor_value_info("mean", TensorProto.FLOAT, [3, 1])],
        [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    x = (rng.standard_normal((3, d)) * 3 + 0.1).astype(np.float32)
    half = lambda a: a.astype(np.float16).astype(np.float32)  # noqa: E731
    rounded = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    for t in rounded.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(half(numpy_helper.to_array(t)), t.name))
    want_y, want_mean = make_session(rounded).run(None, {"x": half(x)})
    for semantics in SEMANTICS:
        sg, prepared = sem.prepare_graph(Graph(model), semantics)
        assert "ln" in sg.candidates()
        rules = sem.rules_for(prepared, False)
        got = Emulator(sg, rules=rules).run(frozenset(), {"x": x})
        assert _same_bits(got["y"], half(want_y)) and _same_bits(got["mean"], want_mean)
        folder = tmp_path / semantics
        folder.mkdir()
        _judge_agrees(model, {"x": x}, semantics, tf32=False, folder=folder)
        written = onnx.load(next(folder.glob("*_0.onnx")))  # the all-FP16 file
        onnx.checker.check_model(written)
        types = {v.name: v.type.tensor_type.elem_type for v in
                 onnx.shape_inference.infer_shapes(written).graph.value_info}
        ln = next(n for n in written.graph.node if n.op_type == "LayerNormalization")
        assert types[ln.output[0]] == TensorProto.FLOAT16 and ln.output[1] == "mean"


def test_the_trt_layernorm_rule_is_in_the_table_with_its_source():
    rule = next(r for r in sem.RULES if r.name == "layernorm_fp32_compute")
    assert rule.default and rule.applied == "emulator"
    assert "setComputePrecision" in rule.evidence and "onnx-tensorrt" in rule.evidence
    assert "layernorm_fp32_compute" in sem.applied_rules("trt", 10, False)


# ---------------------------------------------------------------------------- diagnosis

def _groups(r: RunResult) -> list[CulpritGroup]:
    return (r.culprit_groups or [])


def test_a_folded_batchnorm_variance_is_never_blamed_under_trt(tmp_path):
    p = CONSTANT_PLANTED["batchnorm_in_constants"]
    r = _run(p.model, p.inputs, "trt", tmp_path)
    assert r.verdict == "fp16_ok"
    assert not any(g.cause == "constant_out_of_range" for g in _groups(r))
    assert set(r.strict_only_culprits) == {"bn", "var_identity"}
    strict = _run(p.model, p.inputs, "strict", tmp_path / "strict")
    blamed = next(g for g in _groups(strict) if g.cause == "constant_out_of_range")
    assert blamed.evidence["fp16_value"] == "inf" and "rounds to inf" in blamed.summary


def test_an_out_of_range_weight_is_clamped_in_words_under_trt(tmp_path):
    p = CONSTANT_PLANTED["matmul_weight_in_constant"]
    words = {}
    for semantics in SEMANTICS:
        r = _run(p.model, p.inputs, semantics, tmp_path / semantics)
        group = next(g for g in _groups(r) if g.cause == "constant_out_of_range")
        words[semantics] = (group.evidence["fp16_value"], group.summary)
    assert words["strict"][0] == "inf" and "FP16 rounds to inf" in words["strict"][1]
    assert words["trt"][0] == "65504" and "clamps to 65504" in words["trt"][1]
    assert "inf" not in words["trt"][1].split("clamps to")[1].split(";")[0]


def test_an_eps_that_trt_clamps_is_not_said_to_flush(tmp_path):
    p = CONSTANT_PLANTED["eps_in_constant"]
    said = {}
    for semantics in SEMANTICS:
        r = _run(p.model, p.inputs, semantics, tmp_path / semantics)
        said[semantics] = " ".join(g.summary for g in _groups(r))
    assert "eps Constant_1 = 1e-12 flushes to zero" in said["strict"]  # named as Netron does
    assert "1e-12 flushes" not in said["trt"] and "flush" in said["trt"]  # x*x still flushes
    assert "= 1e-12 is below FP16's smallest subnormal: TensorRT's FP16 conversion raises it " \
        "to 5.96e-8" in said["trt"]
