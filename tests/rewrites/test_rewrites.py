"""FP16-safe rewrites: planted patterns are fixed with zero FP32 nodes, near misses are refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtbisect.rewrites.core import Match, Refusal, Rewrite
from trtbisect.rewrites.driver import (
    _better,
    emulator_judge,
    find_all,
    measure_drift,
    reference_outputs,
    same_interface,
    try_rewrites,
)
from trtbisect.rewrites.mask import MASK_FILL
from trtbisect.rewrites.norm import LAYERNORM
from trtbisect.rewrites.rules import REWRITES
from trtbisect.rewrites.scale import RAISE_EPSILON, SCALE_BEFORE_SQUARE

DEMO = Path(__file__).resolve().parents[2] / "models"
FP32_MIN = float(np.finfo(np.float32).min)


def _outcome(model, samples, **kw):
    before = model.SerializeToString()
    out = try_rewrites(model, samples, emulator_judge(model, samples), **kw)
    assert model.SerializeToString() == before, "the input model was mutated"
    return out


@pytest.mark.parametrize("name, expected", [
    ("constant_out_of_range", ["clamp_mask_constant"]),
    ("layernorm_overflow", ["fuse_layernorm"]),
    ("attention_logits", ["prescale_attention"]),
    ("reducesum_overflow", ["reducesum_to_mean"]),
    ("eps_underflow", ["scale_before_square"]),
    ("two_outputs", ["reducesum_to_mean", "scale_before_square"]),
])
def test_zoo_fault_fixed_without_fp32_nodes(zoo, name, expected):
    z = zoo[name]
    samples = [z.inputs]
    passed, _ = emulator_judge(z.model, samples)(z.model)
    assert not passed  # the planted fault is real
    out = _outcome(z.model, samples)
    assert [a.rewrite for a in out.applied] == expected
    assert out.passed  # all-FP16 (empty FP32 plan) now meets the tolerance
    assert same_interface(z.model, out.model)
    onnx.checker.check_model(out.model, full_check=True)
    assert all(a.drift.rel <= 1e-4 for a in out.applied)
    assert out.to_json()["all_fp16_passes"] is True


def test_layernorm_fusion_raises_opset_and_removes_the_chain(zoo):
    z = zoo["layernorm_overflow"]
    out = _outcome(z.model, [z.inputs])
    ops = [n.op_type for n in out.model.graph.node]
    assert ops.count("LayerNormalization") == 1
    assert not {"Pow", "Sqrt", "ReduceMean", "Sub", "Div"} & set(ops)  # no dead leftovers
    assert len(ops) == len(z.model.graph.node) - 9 + 1
    assert next(o.version for o in out.model.opset_import if o.domain == "") == 17
    ln = next(n for n in out.model.graph.node if n.op_type == "LayerNormalization")
    assert ln.output[0] == "y" and helper.get_attribute_value(ln.attribute[0]) == -1
    assert set(out.applied[0].where) >= z.expected_fp32


def test_demo_four_fp32_nodes_become_zero():
    data = np.load(DEMO / "demo_inputs.npz")
    samples = [{k: data[k] for k in data.files}]
    model = onnx.load(str(DEMO / "demo.onnx"))
    chain = ["/blocks.1/ln2/Pow", "/blocks.1/ln2/ReduceMean_1", "/blocks.1/ln2/Add",
             "/blocks.1/ln2/Sqrt"]
    out = _outcome(model, samples, groups=[{"nodes": chain, "pattern": "layernorm_decomposed"}])
    assert out.passed and out.judgements == 2  # the culprit group's rewrite is tried first
    assert [(a.rewrite, a.where[0]) for a in out.applied] == [
        ("fuse_layernorm", "/blocks.1/ln2/ReduceMean")]
    assert "opset" in out.applied[0].advice


def test_mask_fill_is_clamped_in_place(zoo):
    z = zoo["constant_out_of_range"]
    out = _outcome(z.model, [z.inputs])
    const = next(n for n in out.model.graph.node if n.name == "mask/Constant")
    assert float(numpy_helper.to_array(const.attribute[0].t)) == MASK_FILL
    assert out.applied[0].drift.max_abs == 0.0  # Softmax gives exactly 0 either way


# ---------------------------------------------------------------- near misses


def _model(nodes, inputs, outputs, inits, opset=13):
    graph = helper.make_graph(
        nodes, "t", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(np.asarray(v, np.float32 if isinstance(v, float) or
                                            np.asarray(v).dtype.kind == "f" else np.int64), k)
         for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=10)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    del model.graph.output[:]
    model.graph.output.extend(inferred.graph.output)
    onnx.checker.check_model(model)
    return model


def _mask_model(fill_also_elsewhere=False, factor=1.0, keep=None):
    if keep is None:
        keep = np.ones([1, 4], np.float32)
        keep[:, 3] = 0.0  # the last key is padding
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1], name="t"),
             helper.make_node("MatMul", ["x", "xt"], ["s"], name="qk"),
             helper.make_node("Sub", ["one", "mask"], ["inv"], name="inv"),
             helper.make_node("Mul", ["inv", "factor"], ["inv2"], name="scale_mask"),
             helper.make_node("Mul", ["inv2", "fmin"], ["bias"], name="mask/Mul"),
             helper.make_node("Add", ["s", "bias"], ["logits"], name="add"),
             helper.make_node("Softmax", ["logits"], ["y"], axis=-1, name="softmax")]
    outputs = ["y"]
    if fill_also_elsewhere:
        nodes.append(helper.make_node("Max", ["x", "fmin"], ["z"], name="floor"))
        outputs.append("z")
    inits = {"one": 1.0, "mask": keep, "factor": factor, "fmin": FP32_MIN}
    model = _model(nodes, [("x", [1, 4, 8])], outputs, inits)
    return model, [{"x": np.random.default_rng(0).standard_normal([1, 4, 8]).astype(np.float32)}]


def _refusals(model, rewrite, ranges=None):
    return [r for r in rewrite.find(model, ranges) if isinstance(r, Refusal)]


def test_mask_constant_also_used_elsewhere_is_refused():
    model, samples = _mask_model(fill_also_elsewhere=True)
    out = _outcome(model, samples)
    assert not out.applied
    reasons = [r.reason for r in out.refusals if r.rewrite == "clamp_mask_constant"]
    assert len(reasons) == 1 and "also used outside the mask path" in reasons[0]
    assert "floor" in reasons[0]


def test_mask_scaled_beyond_one_is_refused():
    model, _ = _mask_model(factor=5.0)
    (refusal,) = [r for r in REWRITES[0].find(model, None)]
    assert isinstance(refusal, Refusal) and "not a 0/1 mask" in refusal.reason


def test_clamping_a_fully_masked_row_drifts_and_is_refused():
    """Every key masked: FP32 gives a uniform row with -3.4e38 but not with -1e4."""
    model, samples = _mask_model(keep=np.zeros([1, 4], np.float32))
    (match,) = REWRITES[0].find(model, None)
    drift = measure_drift(reference_outputs(model, samples), REWRITES[0].apply(model, match),
                          samples)
    assert drift.rel > 1e-2
    out = _outcome(model, samples)
    assert not out.applied or out.applied[0].rewrite != "clamp_mask_constant"


def _ln_model(eps_after_sqrt=False, var_axes=(-1,), mean_axes=(-1,), sub_used=False,
              eps=1e-5):
    """A decomposed LayerNorm on a ~1e3-valued input (x^2 overflows FP16)."""
    var_out = "sd" if eps_after_sqrt else "ve"
    nodes = [helper.make_node("Mul", ["x", "big"], ["xb"], name="pre"),
             helper.make_node("ReduceMean", ["xb"], ["m"], axes=list(mean_axes), name="ln/mean"),
             helper.make_node("Sub", ["xb", "m"], ["d"], name="ln/Sub"),
             helper.make_node("Pow", ["d", "two"], ["sq"], name="ln/Pow"),
             helper.make_node("ReduceMean", ["sq"], ["v"], axes=list(var_axes), name="ln/var")]
    if eps_after_sqrt:
        nodes += [helper.make_node("Sqrt", ["v"], ["s"], name="ln/Sqrt"),
                  helper.make_node("Add", ["s", "eps"], ["sd"], name="ln/Add")]
    else:
        nodes += [helper.make_node("Add", ["v", "eps"], ["ve"], name="ln/Add"),
                  helper.make_node("Sqrt", ["ve"], ["sd"], name="ln/Sqrt")]
    nodes.append(helper.make_node("Div", ["d", var_out if eps_after_sqrt else "sd"], ["y"],
                                  name="ln/Div"))
    outputs = ["y"]
    if sub_used:
        nodes.append(helper.make_node("Relu", ["d"], ["r"], name="other"))
        outputs.append("r")
    model = _model(nodes, [("x", [1, 4, 16])], outputs,
                   {"big": 1e3, "two": 2.0, "eps": np.asarray(eps, np.float32)})
    return model


@pytest.mark.parametrize("kwargs, reason", [
    ({"eps_after_sqrt": True}, "eps is added after Sqrt"),
    ({"var_axes": (1,), "mean_axes": (1,)}, "trailing axes only"),
    ({"var_axes": (1,)}, "needs both over the same axes"),
    ({"sub_used": True}, "is also used by other"),
    ({"eps": np.full([16], 1e-5)}, "is not a scalar"),
])
def test_layernorm_near_misses_are_refused(kwargs, reason):
    model = _ln_model(**kwargs)
    found = LAYERNORM.find(model, None)
    assert not [m for m in found if isinstance(m, Match)]
    assert any(reason in r.reason for r in found), [r.reason for r in found]


def test_layernorm_control_matches():
    """The same builder without a planted near miss is fused (so the near misses are real)."""
    model = _ln_model()
    (match,) = LAYERNORM.find(model, None)
    assert isinstance(match, Match)
    samples = [{"x": np.random.default_rng(1).standard_normal([1, 4, 16]).astype(np.float32)}]
    out = _outcome(model, samples)
    assert [a.rewrite for a in out.applied] == ["fuse_layernorm"] and out.passed


def test_raise_epsilon_refused_when_eps_matters(zoo):
    """eps_underflow: eps 1e-10 is as large as the variance, so 6.1e-5 would change y."""
    z = zoo["eps_underflow"]
    out = _outcome(z.model, [z.inputs], rewrites=(RAISE_EPSILON,))
    assert not out.applied and not out.passed
    (refusal,) = out.refusals
    assert "FP32 drift" in refusal.reason and "exceeds the tolerance 0.0001" in refusal.reason


def test_raise_epsilon_is_invisible_when_the_variance_is_large():
    model = _ln_model(eps=1e-12)
    samples = [{"x": np.random.default_rng(2).standard_normal([1, 4, 16]).astype(np.float32)}]
    (match,) = [m for m in RAISE_EPSILON.find(model, None) if isinstance(m, Match)]
    drift = measure_drift(reference_outputs(model, samples), RAISE_EPSILON.apply(model, match),
                          samples)
    assert drift.rel <= 1e-6  # variance ~1e6: raising eps to 6e-5 does not show in FP32


def _nudge_bias(model, match):
    """A test rewrite that changes the result: LayerNorm's beta + 0.01."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    init = next(t for t in out.graph.initializer if t.name == "ln.bias")
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) + 0.01, "ln.bias"))
    return out


NUDGE = Rewrite("nudge", lambda m, r: [Match("nudge", ("ln/Add_1",), "test")], _nudge_bias,
                "test", "changes y by 0.01", "none")


def test_drift_tolerance_is_a_parameter(zoo):
    z = zoo["layernorm_overflow"]
    strict = _outcome(z.model, [z.inputs], rewrites=(NUDGE,))
    assert not strict.applied and "exceeds the tolerance 0.0001" in strict.refusals[0].reason
    loose = _outcome(z.model, [z.inputs], rewrites=(NUDGE,), drift_rtol=0.1)
    assert not loose.applied and "did not improve" in loose.refusals[0].reason


def test_square_rewrite_needs_samples(zoo):
    z = zoo["two_outputs"]
    assert any("needs samples" in r.reason for r in _refusals(z.model, SCALE_BEFORE_SQUARE))


def test_prescale_refuses_a_constant_divided_by_logits(zoo):
    z = zoo["attention_logits"]
    model = onnx.ModelProto()
    model.CopyFrom(z.model)
    div = next(n for n in model.graph.node if n.name == "attn/Div")
    div.input[0], div.input[1] = div.input[1], div.input[0]
    matches, refusals = find_all(model)
    assert not [m for m in matches if m.rewrite == "prescale_attention"]
    assert any("divides by the value" in r.reason for r in refusals)


def test_reducesum_scaled_up_is_refused(zoo):
    z = zoo["reducesum_overflow"]
    model = onnx.ModelProto()
    model.CopyFrom(z.model)
    init = next(t for t in model.graph.initializer if t.name == "pool.inv_hw")
    init.CopyFrom(numpy_helper.from_array(np.array(2.0, np.float32), "pool.inv_hw"))
    _, refusals = find_all(model)
    assert any(r.rewrite == "reducesum_to_mean" and "scaled by 2" in r.reason for r in refusals)


def test_healthy_model_is_left_alone(zoo):
    z = zoo["healthy"]
    out = _outcome(z.model, [z.inputs])
    assert out.passed and out.model is z.model and not out.applied and out.judgements == 1


def test_improvement_rule():
    assert _better((1, 0, 5.0), (2, 0, 1.0))  # an output fixed
    assert _better((1, 0, 5.0), (1, 3, 1.0))  # fewer non-finite values
    assert _better((1, 0, 0.9), (1, 0, 1.0)) and not _better((1, 0, 0.95), (1, 0, 1.0))


def test_every_rewrite_has_advice_and_exactness():
    assert len({rw.name for rw in REWRITES}) == len(REWRITES)
    for rw in REWRITES:
        assert rw.advice and rw.exact and rw.summary


def test_reducesum_with_a_non_count_factor_is_prescaled(zoo):
    """x.sum() / 512 over 1024 elements: not a mean, so the 1/512 moves before the sum."""
    z = zoo["reducesum_overflow"]
    model = onnx.ModelProto()
    model.CopyFrom(z.model)
    init = next(t for t in model.graph.initializer if t.name == "pool.inv_hw")
    init.CopyFrom(numpy_helper.from_array(np.array(1 / 512, np.float32), "pool.inv_hw"))
    (match,) = [m for m in find_all(model)[0] if m.rewrite == "reducesum_to_mean"]
    assert match.params["mean"] is False
    rewritten = REWRITES[3].apply(model, match)
    ops = [n.op_type for n in rewritten.graph.node]
    assert ops[ops.index("ReduceSum") - 1] == "Mul" and ops[ops.index("ReduceSum") + 1] == "Flatten"
    samples = [z.inputs]
    assert measure_drift(reference_outputs(model, samples), rewritten, samples).rel <= 1e-6


def test_find_all_reads_one_view_of_the_model_and_finds_what_each_rule_finds(zoo, monkeypatch):
    """Every rule's finder reads the same View (a 20k-node model's costs 0.2 s), and finds
    exactly what it finds alone."""
    from trtbisect.rewrites import core
    model = zoo["layernorm_overflow"].model
    alone = [(type(i).__name__, i.rewrite, tuple(i.where)) for rw in REWRITES
             for i in rw.find(model, None)]
    made = []
    real = core.View.__init__
    monkeypatch.setattr(core.View, "__init__",
                        lambda self, m: made.append(1) or real(self, m))
    matches, refusals = find_all(model)
    assert len(made) == 1
    found = [(type(i).__name__, i.rewrite, tuple(i.where)) for i in [*matches, *refusals]]
    assert sorted(found) == sorted(alone) and any(k == "Match" for k, _, _ in found)
    assert core.View.of(model) is not core.View.of(model)  # shared only inside find_all


def _rms_model(form: str, d: int = 16) -> onnx.ModelProto:
    """A decomposed RMSNorm of a 1e3-scaled input (x^2 ~ 1e6 overflows FP16), written the
    way each exporter writes it: `div` x / sqrt(v) * w (TorchScript), `rsqrt` x *
    Reciprocal(sqrt(v)) * w (Hugging Face's LlamaRMSNorm, nn.RMSNorm through dynamo),
    `div_one` x * (1 / sqrt(v)) * w, `weight_first` (w * x) / sqrt(v)."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
             (("big", 1e3), ("two", 2.0), ("eps", 1e-6), ("one", 1.0))]
    inits.append(numpy_helper.from_array((1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
                                         "w"))
    inits.append(numpy_helper.from_array(np.array([-1], np.int64), "axes"))
    n = helper.make_node
    nodes = [n("Mul", ["x", "big"], ["h"], name="/rms/pre"),
             n("Pow", ["h", "two"], ["sq"], name="/rms/Pow"),
             n("ReduceMean", ["sq", "axes"], ["var"], name="/rms/ReduceMean", keepdims=1),
             n("Add", ["var", "eps"], ["ve"], name="/rms/Add"),
             n("Sqrt", ["ve"], ["std"], name="/rms/Sqrt")]
    if form == "div":
        nodes += [n("Div", ["h", "std"], ["normed"], name="/rms/Div"),
                  n("Mul", ["normed", "w"], ["y"], name="/rms/Mul")]
    elif form == "rsqrt":
        nodes += [n("Reciprocal", ["std"], ["inv"], name="/rms/Reciprocal"),
                  n("Mul", ["h", "inv"], ["normed"], name="/rms/Mul"),
                  n("Mul", ["w", "normed"], ["y"], name="/rms/Mul_1")]
    elif form == "div_one":
        nodes += [n("Div", ["one", "std"], ["inv"], name="/rms/Div"),
                  n("Mul", ["inv", "h"], ["normed"], name="/rms/Mul"),
                  n("Mul", ["normed", "w"], ["y"], name="/rms/Mul_1")]
    else:
        nodes.insert(1, n("Mul", ["w", "h"], ["wh"], name="/rms/Mul"))
        nodes.append(n("Div", ["wh", "std"], ["y"], name="/rms/Div"))
    graph = helper.make_graph(nodes, "rms", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 4, d])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 4, d])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    return model


RMS_FORMS = ("div", "rsqrt", "div_one", "weight_first")


@pytest.mark.parametrize("form", RMS_FORMS)
@pytest.mark.parametrize("rule", ["fuse_rmsnorm", "scale_before_square"])
def test_every_exported_rmsnorm_form_is_rewritten(form, rule):
    """Each rule alone fixes each form: all-FP16 fails before, passes after, FP32 unchanged."""
    model = _rms_model(form)
    samples = [{"x": np.random.default_rng(0).standard_normal((1, 4, 16)).astype(np.float32)}]
    assert not emulator_judge(model, samples)(model)[0]  # x^2 ~ 1e6 overflows FP16
    rewrite = next(r for r in REWRITES if r.name == rule)
    out = _outcome(model, samples, rewrites=(rewrite,))
    assert [a.rewrite for a in out.applied] == [rule] and out.passed
    assert out.applied[0].drift.rel <= 1e-4
    ops = [nd.op_type for nd in out.model.graph.node]
    if rule == "fuse_rmsnorm":  # the whole chain, its weight included, is one op
        assert ops == ["Mul", "RMSNormalization"], ops
    else:  # x is scaled once; every reader of x reads the scaled x
        readers = [nd for nd in out.model.graph.node if "h" in nd.input]
        assert [nd.op_type for nd in readers] == ["Mul"]


@pytest.mark.parametrize("form", RMS_FORMS)
def test_rmsnorm_match_covers_the_whole_tail(form):
    from trtbisect.rewrites.norm import find_rmsnorm

    model = _rms_model(form)
    found = find_rmsnorm(model)
    assert len(found) == 1 and isinstance(found[0], Match), found
    names = {nd.name for nd in model.graph.node} - {"/rms/pre"}
    assert set(found[0].where) == names


def test_rmsnorm_tail_that_is_not_a_division_of_x_is_refused():
    from trtbisect.rewrites.norm import find_rmsnorm

    model = _rms_model("rsqrt")
    for nd in model.graph.node:  # 1/sqrt(v) times something else than x
        if nd.name == "/rms/Mul":
            nd.input[0] = "x"
    found = find_rmsnorm(model)
    assert len(found) == 1 and isinstance(found[0], Refusal)
    assert "not multiplied by x alone" in found[0].reason
