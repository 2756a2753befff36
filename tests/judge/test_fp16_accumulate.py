"""--fp16-accumulate: FP16 MatMul/Gemm/Conv accumulate in FP16 over blocks of the inner
dimension. A planted K=4096 MatMul passes with FP32 accumulation and fails with FP16
accumulation; the blocked form matches an independent NumPy model of it; refused nodes keep
FP32 accumulation; and the one-judge invariant (search == `check` of the written file, bit for
bit) holds with the rule on."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.judge.test_semantics_pipeline import DEMO, PLANTED, _judge_agrees, _same_bits
from tests.test_cli import invoke
from trtbisect.backends.ort import Emulator
from trtbisect.context import Options
from trtbisect.graph import Graph
from trtbisect.judge import semantics as sem
from trtbisect.judge.mixed import mixed_model
from trtbisect.pipeline import check_mixed, run

BLOCK = sem.FP16_ACCUMULATE_BLOCK
F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs,
                          [numpy_helper.from_array(np.asarray(a), k) for k, a in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


def stalling_matmul() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """y = |x| @ w with K = 4096: one term of 2048, then 4095 terms of 3/128. Summed in FP32 the
    output is 2143.98 (FP16 stores it within 1); accumulated in FP16 every block adds 0.75 to
    2048, less than half the FP16 spacing there (2), so the sum stalls at 2048 (4.5% low)."""
    k, n = 4096, 4
    w = np.full((k, n), 3 / 128, np.float32)
    w[0] = 2048.0
    m = _model([helper.make_node("Abs", ["x"], ["ax"], name="abs"),
                helper.make_node("MatMul", ["ax", "w"], ["y"], name="mm")],
               [helper.make_tensor_value_info("x", F, [1, k])],
               [helper.make_tensor_value_info("y", F, [1, n])], {"w": w})
    return m, {"x": np.ones((1, k), np.float32)}


def shapes_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Every blockable form (batched MatMul, 1-D operand, Gemm with transposes and bias, Conv
    with bias, pads and stride) and every refused one (grouped Conv, Gemm alpha != 1, K beyond
    MAX_ACCUMULATE_BLOCKS blocks), on values whose partial sums round visibly."""
    rng = np.random.default_rng(0)
    r = lambda *s: rng.uniform(0.5, 1.5, s).astype(np.float32)  # noqa: E731
    long_k = BLOCK * sem.MAX_ACCUMULATE_BLOCKS + 8
    inits = {"wb": r(70, 5), "v": r(5), "ga": r(6, 40), "gb": r(3, 40), "gc": r(3),
             "cw": r(4, 80, 3, 3), "cb": r(4), "gw": r(80, 1, 3, 3), "wl": r(long_k, 2)}
    nodes = [
        helper.make_node("MatMul", ["x3", "wb"], ["m1"], name="batched"),  # (2,3,70)@(70,5)
        helper.make_node("MatMul", ["m1", "v"], ["m2"], name="vector"),  # (2,3,5)@(5,): K=5
        helper.make_node("Gemm", ["ga", "xg"], ["g1"], name="gemm", transA=1, transB=1),
        helper.make_node("Gemm", ["xg2", "gb", "gc"], ["g2"], name="gemm_bias", transB=1),
        helper.make_node("Gemm", ["xg2", "gb"], ["g3"], name="gemm_alpha", transB=1, alpha=2.0),
        helper.make_node("Conv", ["xc", "cw", "cb"], ["c1"], name="conv", pads=[1, 1, 1, 1],
                         strides=[2, 2]),
        helper.make_node("Conv", ["xc", "gw"], ["c2"], name="grouped", group=80),
        helper.make_node("MatMul", ["xl", "wl"], ["l1"], name="too_long"),
    ]
    ins = {"x3": [2, 3, 70], "xg": [7, 6], "xg2": [2, 40], "xc": [1, 80, 6, 6],
           "xl": [1, long_k]}
    outs = {"m2": [2, 3], "g1": [40, 7], "g2": [2, 3], "g3": [2, 3], "c1": [1, 4, 3, 3],
            "c2": [1, 80, 4, 4], "l1": [1, 2]}
    # Gemm "gemm": A is (6, 40) transposed -> (40, 6); B is xg (7, 6) transposed -> (6, 7): K=6
    m = _model(nodes, [helper.make_tensor_value_info(k, F, s) for k, s in ins.items()],
               [helper.make_tensor_value_info(k, F, s) for k, s in outs.items()], inits)
    feeds = {k: r(*s) for k, s in ins.items()}
    return m, feeds


def _emulate(model, feeds, accumulate: int, semantics: str = "strict") -> dict[str, np.ndarray]:
    sg, prepared = sem.prepare_graph(Graph(model), semantics)
    return Emulator(sg, rules=sem.rules_for(prepared, False, accumulate)).run(frozenset(), feeds)


def _h(a) -> np.ndarray:
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float64)


def _blocked_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """NumPy's own model of the rule: a @ b over blocks of BLOCK along K (a's last axis, b's
    first), each partial and every running sum rounded to FP16."""
    acc = None
    for lo in range(0, a.shape[-1], BLOCK):
        part = _h(_h(a[..., lo:lo + BLOCK]) @ _h(b[lo:lo + BLOCK]))
        acc = part if acc is None else _h(acc + part)
    return acc


def test_planted_stall_passes_with_fp32_accumulation_and_fails_with_fp16(tmp_path):
    model, feeds = stalling_matmul()
    assert np.all(_emulate(model, feeds, 0)["y"] == np.float32(2144.0))
    assert np.all(_emulate(model, feeds, BLOCK)["y"] == np.float32(2048.0))
    path, inputs = tmp_path / "stall.onnx", tmp_path / "stall.npz"
    onnx.save(model, path)
    np.savez(inputs, **feeds)
    plain = run(path, Options.of(inputs=[str(inputs)]), tmp_path / "plain")
    assert (plain.verdict, plain.fp32_nodes) == ("fp16_ok", [])
    acc = run(path, Options.of(inputs=[str(inputs)], fp16_accumulate=True), tmp_path / "acc")
    assert (acc.verdict, set(acc.fp32_nodes)) == ("fixed", {"mm"})
    assert not acc.errors_before["y"].passed and acc.errors_after["y"].passed
    data = json.loads((tmp_path / "acc" / "precision.json").read_text())
    assert data["semantics"]["fp16_accumulate"] == BLOCK
    assert "fp16_accumulation" in data["semantics"]["rules"]
    assert data["one_judge"]["search_equals_check"] is True
    # check of an all-FP16 file: fails only when the judge accumulates in FP16
    all_half = tmp_path / "all_fp16.onnx"
    mixed_model(Graph(model), frozenset()).save(all_half)
    assert check_mixed(all_half, path, Options.of(inputs=[str(inputs)])).passed
    assert not check_mixed(all_half, path, Options.of(inputs=[str(inputs)],
                                                      fp16_accumulate=True)).passed


def test_cli_flag_reaches_precision_json_and_the_check_rendering(tmp_path):
    model, feeds = stalling_matmul()
    path, inputs = tmp_path / "stall.onnx", tmp_path / "stall.npz"
    onnx.save(model, path)
    np.savez(inputs, **feeds)
    r = invoke("-q", "run", path, "--inputs", inputs, "--out", tmp_path / "o",
               "--fp16-accumulate", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["fp32_nodes"] == ["mm"] and data["semantics"]["fp16_accumulate"] == BLOCK
    assert any("--fp16-accumulate" in str(v) for v in data["renderings"].values())
    mixed = data["files"]["mixed_model"]
    c = invoke("check", mixed, "--reference", path, "--inputs", inputs, "--fp16-accumulate")
    assert c.exit_code == 0, c.output
    off = invoke("-q", "run", path, "--inputs", inputs, "--out", tmp_path / "off", "--json")
    assert json.loads(off.output)["semantics"]["fp16_accumulate"] == 0


def test_blocked_forms_match_numpys_model_and_refused_nodes_keep_fp32_accumulation():
    model, feeds = shapes_model()
    on, off = _emulate(model, feeds, BLOCK), _emulate(model, feeds, 0)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    m1 = _blocked_dot(feeds["x3"], inits["wb"])
    np.testing.assert_allclose(on["m2"], _blocked_dot(m1, inits["v"]), rtol=2e-3)
    np.testing.assert_allclose(on["g1"], _blocked_dot(inits["ga"].T, feeds["xg"].T), rtol=2e-3)
    expect = _h(_blocked_dot(feeds["xg2"], inits["gb"].T) + _h(inits["gc"]))
    np.testing.assert_array_equal(on["g2"], expect.astype(np.float32))
    assert not _same_bits(on["g2"], off["g2"])  # K = 40: two blocks round differently
    assert not _same_bits(on["c1"], off["c1"])  # C = 80: three blocks
    for refused in ("g3", "c2", "l1"):
        assert _same_bits(on[refused], off[refused]), refused


def _has_inner_products(model: onnx.ModelProto) -> bool:
    return any(n.op_type in ("MatMul", "Gemm", "Conv") for n in model.graph.node)


@pytest.mark.parametrize("semantics", ["trt", "strict"])
def test_one_judge_with_fp16_accumulation(zoo, tmp_path, semantics):
    """trt: the zoo and planted models; strict (with TF32, so an active node selects between
    TF32 operands and the blocked FP16 form): the planted ones. Both: the forms above."""
    zoo_models = [(z.model, z.inputs) for z in zoo.values()] if semantics == "trt" else []
    models = zoo_models + [(p.model, p.inputs) for p in PLANTED.values()] + [
        stalling_matmul(), shapes_model()]
    for k, (model, feeds) in enumerate(models):
        if not _has_inner_products(model):
            continue
        folder = tmp_path / str(k)
        folder.mkdir()
        _judge_agrees(model, feeds, semantics, tf32=semantics == "strict", folder=folder,
                      plans=2, accumulate=BLOCK)


def test_one_judge_with_fp16_accumulation_on_the_demo(tmp_path):
    model = onnx.load(DEMO / "demo.onnx")
    feeds = dict(np.load(DEMO / "demo_inputs.npz"))
    _judge_agrees(model, feeds, "strict", True, tmp_path, plans=3, accumulate=BLOCK)


def test_demo_run_with_fp16_accumulation_keeps_one_judge(tmp_path):
    opts = Options.of(inputs=[str(DEMO / "demo_inputs.npz")], fp16_accumulate=True)
    r = run(DEMO / "demo.onnx", opts, tmp_path / "o")
    assert r.verdict in ("fixed", "fp16_ok")
    assert r.one_judge.search_equals_check is True
    assert r.semantics.fp16_accumulate == BLOCK
