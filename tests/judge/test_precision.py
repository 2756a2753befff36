"""BF16 beside FP16 (#24): the Precision object's numbers, ONNX Runtime's Cast to bfloat16 (the
emulator's rounding) against ml_dtypes bit for bit, and the one judge in BF16 (the emulator's
numbers for a plan == the judge of the bfloat16 mixed file written for it)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

from trtbisect.backends.ort import Emulator, MixedModel
from trtbisect.errors import TrtBisectError
from trtbisect.graph import Graph
from trtbisect.judge.mixed import mixed_model
from trtbisect.judge.precision import BF16, FP16, precision
from trtbisect.judge.semantics import Rules, round_weight


def test_the_formats_limits():
    assert FP16.overflow_at == 65520.0  # max + half an ulp: the tie rounds to inf
    assert FP16.flush_at == 2.0**-25
    assert BF16.max == pytest.approx(3.3895313892515355e38)
    assert float(np.float32(BF16.overflow_at).astype(ml_dtypes.bfloat16)) == np.inf
    below = np.nextafter(np.float32(BF16.overflow_at), np.float32(0))
    assert float(np.float32(below).astype(ml_dtypes.bfloat16)) == BF16.max
    assert BF16.spacing(1.0) == 2.0**-7 and FP16.spacing(1.0) == 2.0**-10
    assert BF16.spacing(300.0) == 2.0  # 256 <= 300 < 512: 2^8 * 2^-7
    assert FP16.narrow_range and not BF16.narrow_range
    assert precision("bf16") is BF16
    with pytest.raises(TrtBisectError, match="unknown precision 'fp8'"):
        precision("fp8")


def _cast_model(to: int) -> onnx.ModelProto:
    g = h.make_graph([h.make_node("Cast", ["x"], ["l"], to=to),
                      h.make_node("Cast", ["l"], ["y"], to=TP.FLOAT)], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [None])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [None])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def _hard_floats() -> np.ndarray:
    """Random bit patterns (every exponent), exact ties between bfloat16 neighbours (odd and even
    lower neighbour), values next to the overflow edge, subnormals, signed zeros, inf and NaN."""
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32)
    ties = (rng.integers(0, 2**16, 2000, dtype=np.uint32) << 16) | np.uint32(0x8000)
    near = np.float32(BF16.overflow_at) * np.float32([1 - 2**-9, 1 - 2**-20, 1, 1 + 2**-20])
    special = np.float32([0.0, -0.0, np.inf, -np.inf, 1e-45, -1e-40, 2.0**-133, 3e38, -3.4e38])
    x = np.concatenate([bits.view(np.float32), ties.view(np.float32), near, special])
    return x[~np.isnan(x)]


def test_ort_cast_to_bfloat16_rounds_to_nearest_even_as_ml_dtypes():
    """The emulator's Cast(bfloat16) -> Cast(float) is bit for bit ml_dtypes' (RNE) rounding,
    which `Precision.round` and the mixed file's weight conversion use."""
    x = _hard_floats()
    sess = ort.InferenceSession(_cast_model(TP.BFLOAT16).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    got = sess.run(None, {"x": x})[0]
    want = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(BF16.round(x).view(np.uint32), want.view(np.uint32))
    # ties go to the even neighbour: 1 + 2^-8 is halfway between 1 and 1 + 2^-7
    assert BF16.round(np.float32([1 + 2**-8, 1 + 3 * 2**-8])).tolist() == [1.0, 1 + 2 * 2**-7]


def test_weight_clamp_rule_uses_the_formats_limits():
    a = np.float32([1e5, -1e5, 3.4e38, 1e-30, 1e-44, 0.0])
    f = round_weight(a, "clamp", FP16)
    assert f[:2].tolist() == [65504.0, -65504.0] and f[3] == np.float32(2.0**-24)
    b = round_weight(a, "clamp", BF16)
    assert b[0] == BF16.round(np.float32([1e5]))[0] and b[2] == np.float32(BF16.max)
    assert b[3] == BF16.round(np.float32([1e-30]))[0] and b[4] == np.float32(2.0**-133)


def _squares(n: int = 8) -> onnx.ModelProto:
    """y = sum(x*x) * w: a plan can keep any of the three nodes FP32."""
    w = onnx.numpy_helper.from_array(np.float32([0.37, 1.9, 3.3e-3, 250.0] * (n // 4)), "w")
    g = h.make_graph([h.make_node("Mul", ["x", "x"], ["sq"], name="sq"),
                      h.make_node("Mul", ["sq", "w"], ["sw"], name="sw"),
                      h.make_node("ReduceSum", ["sw"], ["y"], name="sum", keepdims=1)], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [n])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1])], [w])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("rule", ["inf", "clamp"])
def test_one_judge_in_bf16_emulator_equals_the_written_bfloat16_file(tmp_path, rule):
    model = _squares()
    g = Graph(model)
    x = {"x": np.float32([300.1, -7.3, 1e-3, 12345.6, 0.5, -2.25, 3.1e3, 9.9])}
    rules = Rules(weight_rule=rule, precision=BF16)
    emu = Emulator(g, rules=rules)
    cands = g.candidates()
    plans = [frozenset(), frozenset(cands), frozenset(["sq"]), frozenset(["sum"])]
    seen = set()
    for k, plan in enumerate(plans):
        path = tmp_path / f"p{k}.onnx"
        mixed_model(g, plan, rule, BF16).save(path)
        written = onnx.load(path)
        types = {t.data_type for t in written.graph.initializer} | {
            n.attribute[0].i for n in written.graph.node if n.op_type == "Cast"}
        if plan != frozenset(cands):
            assert TP.BFLOAT16 in types and TP.FLOAT16 not in types
        judged = MixedModel(Graph.from_path(path)).run(x)["y"]
        searched = emu.run(plan, x)["y"]
        np.testing.assert_array_equal(searched, judged, err_msg=f"plan {sorted(plan)}")
        seen.add(float(searched[0]))
    assert len(seen) > 1  # the plans differ: the test can tell them apart


def test_bf16_and_fp16_emulation_differ_where_the_formats_do():
    """x*x of 300 overflows FP16 (90000 > 65504) and not BF16."""
    g = Graph(_squares(4))
    x = {"x": np.float32([300.0, 1.0, 1.0, 1.0])}
    fp16 = Emulator(g, rules=Rules(precision=FP16)).run(frozenset(), x)["y"][0]
    bf16 = Emulator(g, rules=Rules(precision=BF16)).run(frozenset(), x)["y"][0]
    assert np.isinf(fp16) and np.isfinite(bf16)
