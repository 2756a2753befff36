"""Explicitly quantized models (trtbisect/quant/): the quantized layers as TensorRT fuses
them, the exact minimal set of layers to un-quantize on planted faults, the diagnosis of each
culprit, one judge for the search and the written file, and the renderings."""

from __future__ import annotations

import itertools
import json
import re

import numpy as np
import onnx
import pytest

from tests.models import quant_models as qm
from tests.test_cli import assert_one_line_error, invoke
from trtbisect.context import Options
from trtbisect.judge.compare import Tolerance
from trtbisect.outputs.quantized import patterns
from trtbisect.quant import analyse, is_quantized, run, unquantize
from trtbisect.quant.judge import QuantJudge, session


def _files(p: qm.Planted, tmp_path):
    model, inputs = tmp_path / f"{p.name}.onnx", tmp_path / f"{p.name}.npz"
    onnx.save(p.model, model)
    np.savez(inputs, **p.inputs)
    return model, inputs


def _opts(inputs, rtol, objective: str = "cost") -> Options:
    """`objective="count"` where a test asserts the 1-minimal plan: under the default cost
    objective a cheaper plan one unit away may replace it (search/cheaper.py)."""
    return Options.of(inputs=[str(inputs)], tolerance=Tolerance(rtol, 0.0), threads=1,
                      objective=objective, validation_share=0)  # the search's tests: no hold-out


# a plan found whose written file passes: `fixed`, or `fragile` where its certificate finds the
# margin within what ONNX Runtime's own QDQ fusions move the error by (checked exactly in
# test_planted_fault_gives_the_exact_minimal_plan_and_its_cause)
PLANNED = ("fixed", "fragile")

# the fix trtbisect applies and verifies for each planted culprit (None: none it can verify)
VERIFIED = {"outlier": "SmoothQuant", "fp8_saturation": "max calibration",
            "softmax": None, "residual": None, "channels": "per-channel weight scales"}


@pytest.mark.parametrize("make", qm.PLANTED, ids=lambda m: m.__name__)
def test_planted_fault_gives_the_exact_minimal_plan_and_its_cause(make, tmp_path):
    p = make()
    model, inputs = _files(p, tmp_path)
    r = run(model, _opts(inputs, p.rtol), tmp_path / "out")
    # the written file judged again under ORT's own optimizations (its QDQ fusions) and other
    # threads: `fixed` only with the margin over that spread, else `fragile` (stages/spread.py)
    assert r.verdict == ("fixed" if r.certified.certified else "fragile"), r.to_json()
    assert set(r.plan) == p.plan
    assert r.one_minimal
    assert not r.before.passed and r.after.passed
    # one judge: the written file's errors are the search's, bit for bit
    assert r.one_judge is True
    kinds = {f.kind for f in r.findings[next(iter(p.plan))]}
    assert p.finding in kinds, [f.text for fs in r.findings.values() for f in fs]
    (layer,) = p.plan
    verified = [f.fix for f in r.fixes.get(layer, []) if f.passed]
    if VERIFIED[p.name] is None:
        assert verified == []
    else:
        assert any(VERIFIED[p.name] in v for v in verified), r.fixes
    text = (tmp_path / "out" / "precision.json").read_text()
    written = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert written["verdict"] in PLANNED and set(written["unquantized_layers"]) == p.plan
    assert written["plan"][0]["fixes_judged"] == [f.to_json() for f in r.fixes.get(layer, [])]
    assert written["one_judge"]["search_equals_check"] is True


def test_a_file_fp16_elsewhere_gets_one_search_over_both_sides(tmp_path):
    """ModelOpt's default writes the float part in FP16: the search takes quantized layers
    and FP16 nodes together, and says which side each culprit is on."""
    p = qm.fp16_side()
    model, inputs = _files(p, tmp_path)
    r = run(model, _opts(inputs, p.rtol, "count"), tmp_path / "out")
    assert r.verdict in PLANNED and r.one_minimal and r.one_judge is True
    assert r.plan == ["mm1"] and r.fp32_nodes == ["amp", "back"]
    assert r.before.errors["y"].nonfinite > 0  # the overflow, judged with FP16 stores explicit
    assert "beyond FP16's 65504" in r.fp32_reasons["amp"]
    assert "activation_outlier" in {f.kind for f in r.findings["mm1"]}
    written = json.loads((tmp_path / "out" / "precision.json").read_text())
    assert written["sides"] == {"mm1": "quantized", "amp": "fp16", "back": "fp16"}
    # ModelOpt keeps FP16 nodes in FP32 by op type only: the rendering says so
    assert written["renderings"]["modelopt_op_types_to_exclude_fp16"] == ["Mul"]
    assert "--high_precision_dtype=fp16" in written["renderings"]["modelopt_cli"]
    m = onnx.load(tmp_path / "out" / "fp16_side.unquantized.onnx")
    onnx.checker.check_model(m, full_check=True)
    amp = next(n for n in m.graph.node if n.name == "amp")
    back = next(n for n in m.graph.node if n.name == "back")
    assert back.input[0] == amp.output[0]  # handed over in FP32, never stored in FP16


def test_ort_alone_hides_an_fp16_overflow_between_two_fp16_ops():
    """Why half.emulate exists: run as it is, ORT's CPU provider computes the FP16 Muls in
    FP32 and the overflow of `big` never reaches the output."""
    p = qm.fp16_side()
    y = session(p.model).run(["y"], p.inputs)[0]
    assert np.isfinite(y).all()
    from trtbisect.quant import half
    emulated = half.emulate(p.model, half.types(p.model))
    assert not np.isfinite(session(emulated).run(["y"], p.inputs)[0]).all()


def test_layers_follow_tensorrts_fusion(tmp_path):
    """R2: a DQ'd activation and a DQ'd weight feeding a MatMul are one layer of two edges;
    R3: an Add with both inputs DQ'd is one layer; R1: a DQ moved past a Reshape belongs to
    the MatMul after it; a weight-only quantized MatMul is a layer too."""
    layers = {la.name: la for la in analyse(qm.residual().model)}
    assert list(layers) == ["mm1", "add", "mm2"]
    assert [(e.source, e.weight, e.per_channel) for e in layers["mm1"].edges] == [
        ("a", False, False), ("w1_int8", True, True)]
    assert layers["mm1"].rule == "R2" and layers["add"].rule == "R3"
    assert sorted(e.source for e in layers["add"].edges) == ["h", "x"]
    assert [e.weight for e in layers["mm2"].edges] == [True]
    # R1: Q -> DQ -> Reshape -> MatMul: the MatMul is the layer, the Reshape is re-pointed
    b = qm.QBuilder()
    x = np.ones((qm.N, qm.C), np.float32)
    r = b.node("Reshape", [b.act("x", 1.0), "shape"], "xr", "reshape")
    b.inits.append(onnx.numpy_helper.from_array(np.array([qm.N, qm.C], np.int64), "shape"))
    b.node("MatMul", [r, b.weight("w", np.eye(qm.C, dtype=np.float32))], "y", "mm")
    m = b.model({"x": x}, ["y"])
    (layer,) = analyse(m)
    assert layer.name == "mm" and {e.consumer for e in layer.edges} == {"reshape", "mm"}
    plain = unquantize(m, [layer])
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in plain.graph.node)


def test_unquantizing_one_layer_leaves_a_shared_pair_to_the_other():
    """Two layers read one Q/DQ pair: un-quantizing one re-points only its own input."""
    b = qm.QBuilder()
    dq = b.act("x", 4.0)
    b.node("MatMul", [dq, b.weight("w1", np.eye(qm.C, dtype=np.float32))], "y1", "mm1")
    b.node("Relu", [dq], "y2", "relu")
    m = b.model({"x": np.ones((qm.N, qm.C), np.float32)}, ["y1", "y2"])
    layers = {la.name: la for la in analyse(m)}
    out = unquantize(m, [layers["relu"]])
    nodes = {n.name: n for n in out.graph.node}
    assert nodes["relu"].input[0] == "x" and nodes["mm1"].input[0] == "x_dq"
    assert "q0_x" in nodes and "dq0_x" in nodes  # the pair stays for mm1
    assert analyse(m) == analyse(onnx.load_from_string(m.SerializeToString()))  # pure


def test_the_reference_is_the_model_without_its_qdq():
    """Q/DQ removed: float weights behind Q -> DQ come back as they were, stored INT8
    weights come back dequantized (by ORT's own DequantizeLinear)."""
    p = qm.channels()
    layers = analyse(p.model)
    ref = unquantize(p.model, layers)
    assert not is_quantized(ref)
    onnx.checker.check_model(ref, full_check=True)
    got = session(ref).run(["y"], p.inputs)[0]
    x = p.inputs["x"]
    w1 = onnx.numpy_helper.to_array(next(t for t in p.model.graph.initializer if t.name == "w1"))
    gain = onnx.numpy_helper.to_array(next(t for t in p.model.graph.initializer
                                           if t.name == "col_gain"))
    w2 = next(t for t in p.model.graph.initializer if t.name == "w2_int8")
    s2 = next(t for t in p.model.graph.initializer if t.name == "w2_scale")
    w2 = onnx.numpy_helper.to_array(w2).astype(np.float32) * onnx.numpy_helper.to_array(s2)
    np.testing.assert_allclose(got, ((x @ w1) * gain) @ w2, rtol=1e-5, atol=1e-5)


def test_a_model_that_passes_quantized_needs_no_plan(tmp_path):
    p = qm.outlier()
    model, inputs = _files(p, tmp_path)
    r = run(model, _opts(inputs, 0.5), tmp_path / "out")
    assert r.verdict == "quantized_ok" and r.plan == [] and r.exit_code == 0
    assert r.before.passed and r.evaluations == 0


def test_written_plan_model_passes_the_full_check_and_loads_in_ort(tmp_path):
    p = qm.fp8_saturation()
    model, inputs = _files(p, tmp_path)
    r = run(model, _opts(inputs, p.rtol), tmp_path / "out")
    path = tmp_path / "out" / "fp8_saturation.unquantized.onnx"
    assert r.files["mixed_qdq_model"] == str(path)
    m = onnx.load(path)
    onnx.checker.check_model(m, full_check=True)
    assert {la.name for la in analyse(m)} == {"mm2"}  # the rest stays FP8
    assert session(path).run(["y"], p.inputs)[0].shape == (qm.N, qm.C)


def test_modelopt_exclusions_match_exactly_the_plans_nodes():
    names = ["mm1", "a.b", "x(1)", "/blocks.0/attn/MatMul", "mm1_suffix"]
    pats = patterns(["mm1", "a.b", "x(1)", "/blocks.0/attn/MatMul"])
    # ModelOpt matches each entry with re.match against every node name
    matched = {n for n in names for pat in pats if re.match(pat, n)}
    assert matched == {"mm1", "a.b", "x(1)", "/blocks.0/attn/MatMul"}


def test_search_and_file_share_one_judge(tmp_path):
    p = qm.softmax()
    layers = analyse(p.model)
    ref = unquantize(p.model, layers)
    refs = [dict(zip(["y"], session(ref).run(["y"], p.inputs)))]
    from trtbisect.judge.criteria import Criteria
    judge = QuantJudge(p.model, layers, [p.inputs], refs, Criteria(), Tolerance(p.rtol, 0.0))
    assert judge.check(frozenset({"softmax"})) and not judge.check(frozenset())
    assert not judge.check(frozenset({"mm2"}))
    a = judge.measure(frozenset({"softmax"}))
    written = tmp_path / "plan.onnx"  # the file, as `check` reads it, not the in-memory model
    onnx.save(judge.model_for({"softmax"}), str(written))
    b = judge.judge_model(written)
    assert a.errors["y"].max_abs == b.errors["y"].max_abs


def test_cli_run_on_a_quantized_model(tmp_path):
    p = qm.residual()
    model, inputs = _files(p, tmp_path)
    r = invoke("-q", "run", model, "--inputs", inputs, "--rtol", p.rtol, "--out",
               tmp_path / "out", "--validation-share", "0")
    # fixed, or fragile where ORT's own QDQ fusions move the error by more than the margin
    assert (r.exit_code, r.output.startswith("verdict: fixed")) in ((0, True), (7, False))
    assert ("fixed by running 1 of 3 quantized layers un-quantized" in r.output
            or "the plan (1 of 3 layers un-quantized)" in r.output), r.output
    assert "oversized_scale" in r.output
    sh = (tmp_path / "out" / "commands.sh").read_text()
    assert "--nodes_to_exclude 'add$'" in sh and "--quantize_mode=int8" in sh
    assert "trtexec --onnx=residual.unquantized.onnx --stronglyTyped" in sh
    assert "polygraphy run residual.unquantized.onnx --trt --strongly-typed" in sh
    # against an FP32 model that computes something else, even all un-quantized fails
    other = unquantize(p.model, analyse(p.model))
    for t in other.graph.initializer:
        if t.name.startswith("w2"):
            t.CopyFrom(onnx.numpy_helper.from_array(2 * onnx.numpy_helper.to_array(t), t.name))
    onnx.save(other, tmp_path / "other.onnx")
    r = invoke("-q", "run", model, "--inputs", inputs, "--rtol", p.rtol, "--reference",
               tmp_path / "other.onnx", "--out", tmp_path / "out2", "--json")
    assert r.exit_code == 4, r.output
    assert json.loads(r.output)["verdict"] == "no_plan"


def test_cli_reference_fp32_model(tmp_path):
    p = qm.outlier()
    model, inputs = _files(p, tmp_path)
    ref = tmp_path / "fp32.onnx"
    onnx.save(unquantize(p.model, analyse(p.model)), ref)
    r = invoke("-q", "run", model, "--inputs", inputs, "--rtol", p.rtol, "--reference", ref,
               "--out", tmp_path / "out", "--json", "--validation-share", "0")
    got = json.loads(r.output)
    assert r.exit_code == (0 if got["certificate"]["certified"] else 7), r.output
    assert got["unquantized_layers"] == ["mm1"] and got["reference"] == str(ref)
    other = tmp_path / "other.onnx"
    onnx.save(qm.residual().model, other)
    assert_one_line_error(invoke("run", model, "--inputs", inputs, "--reference", other,
                                 "--out", tmp_path / "o2"), 2, "--reference")


def test_cli_refusals_are_one_line(tmp_path, monkeypatch):
    p = qm.outlier()
    model, inputs = _files(p, tmp_path)
    assert_one_line_error(invoke("run", model, "--backend", "trt", "--out", tmp_path / "o"),
                          2, "--stronglyTyped")
    assert_one_line_error(invoke("run", model, "--precision", "fp8", "--gpu", "a100",
                                 "--out", tmp_path / "o"), 2, "has no FP8 tensor cores")
    assert_one_line_error(invoke("compare", model, "--precision", "int8"), 2,
                          "'int8' is not one of")  # only `run` offers int8|fp8
    assert_one_line_error(invoke("run", model, "--stability", "3", "--out", tmp_path / "o"),
                          2, "--stability: not available for a quantized model")
    assert_one_line_error(invoke("run", model, "--precision", "bf16", "--out", tmp_path / "o"),
                          2, "is quantized")
    # --precision int8 on a float model needs ModelOpt: without it, how to install it
    import builtins
    real = builtins.__import__

    def no_modelopt(name, *a, **k):
        if name.startswith("modelopt"):
            raise ImportError("No module named 'modelopt'")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_modelopt)
    import sys
    for name in [m for m in sys.modules if m == "modelopt" or m.startswith("modelopt.")]:
        monkeypatch.setitem(sys.modules, name, None)  # imported by an earlier test: hidden too
    fp32 = tmp_path / "fp32.onnx"
    onnx.save(unquantize(p.model, analyse(p.model)), fp32)
    assert_one_line_error(invoke("run", fp32, "--precision", "int8", "--out", tmp_path / "o3"),
                          2, "pip install", "nvidia-modelopt")
    assert_one_line_error(invoke("run", fp32, "--reference", fp32, "--out", tmp_path / "o4"),
                          2, "--reference is for a quantized")


def test_hostile_names_reach_sentences_escaped(tmp_path):
    p = qm.outlier()
    m = p.model
    evil = "x\x1b[2J\u202e"
    for n in m.graph.node:
        n.input[:] = [evil if t == "x" else t for t in n.input]
    m.graph.input[0].name = evil
    model = tmp_path / "evil.onnx"
    onnx.save(m, model)
    np.savez(tmp_path / "in.npz", **{evil: p.inputs["x"]})
    r = run(model, _opts(tmp_path / "in.npz", p.rtol), tmp_path / "out")
    assert r.plan == ["mm1"]
    text = " ".join(f.text for f in r.findings["mm1"])
    assert "\x1b" not in text and "\\x1b" in text and "\\u202e" in text


def test_quantized_plans_are_priced_at_the_datasheet_peaks(tmp_path):
    """A compute-bound quantized MatMul costs FP16's time over 2 on an L4 (INT8 242.5 dense
    TOPS against FP16's 121 TFLOPS); un-quantizing it in a file FP32 elsewhere costs the FP32
    rate; an FP8 file priced on an A100 is refused."""
    from trtbisect.errors import TrtBisectError
    from trtbisect.quant.cost import QuantPricing, _Node, pricing_for
    from trtbisect.search.cost import GPUS, QUANT_PEAKS

    pr = QuantPricing("l4", "int8", half_file=False,
                      nodes=[_Node("mm", "MatMul", 1e15, 0, 0, 0)], layer_of={"mm": "mm"})
    assert pr.price(()) == pytest.approx(1e15 / QUANT_PEAKS["l4"]["int8"])
    assert pr.all_fp16() == pytest.approx(1e15 / GPUS["l4"].fp16_tensor)
    assert pr.price({"mm"}) == pytest.approx(1e15 / GPUS["l4"].fp32)
    assert pr.all_fp16() / pr.price(()) == pytest.approx(242.5 / 121)
    p = qm.fp8_saturation()
    with pytest.raises(TrtBisectError, match="no FP8 tensor cores"):
        pricing_for(p.model, analyse(p.model), {}, p.inputs, "a100", False)
    model, inputs = _files(p, tmp_path)
    r = run(model, _opts(inputs, p.rtol), tmp_path / "out")
    assert r.cost.format == "fp8" and r.cost.plan_s > r.cost.all_quantized_s > 0
    assert_one_line_error(invoke("run", model, "--inputs", inputs, "--gpu", "a100", "--out",
                                 tmp_path / "o"), 2, "no FP8 tensor cores")


def _three_matmuls() -> tuple[onnx.ModelProto, np.ndarray, np.random.Generator]:
    """mm1 -> mm2 -> mm3, each reading a quantized activation and a quantized weight; the
    sample, and the generator that drew the weights (its next draws are the tests')."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((qm.N, qm.C)).astype(np.float32)
    b = qm.QBuilder()
    t = "x"
    for k in (1, 2, 3):
        t = b.node("MatMul", [b.act(t, 4.0), b.weight(f"w{k}", qm._w(rng))], f"h{k}", f"mm{k}")
    return b.model({"x": x}, ["h3"]), x, rng


def test_unquantizing_a_layer_between_two_quantized_ones_adds_its_boundary_traffic():
    """x -> mm1 -> mm2 -> mm3, each MatMul quantized (INT8, FP32 elsewhere). All quantized,
    the only reformat is the graph input's Q (x read in FP32, written in INT8): the Qs of h1
    and h2 fuse into mm1 and mm2. Un-quantizing mm2 drops h1's Q/DQ but leaves h2's Q for
    mm3 with no quantized layer to fuse into: a Q kernel of its own (h2 read at 4 bytes,
    written at 1), priced at the L4's bandwidth. The cost rows add up to the plan's slowdown
    against all-quantized."""
    from trtbisect.quant.cost import pricing_for
    from trtbisect.search.cost import GPUS

    model, x, rng = _three_matmuls()
    layers = analyse(model)
    assert [la.name for la in layers] == ["mm1", "mm2", "mm3"]
    pr = pricing_for(model, layers, {}, {"x": x}, "l4", False)
    n, bw = qm.N * qm.C, GPUS["l4"].bandwidth
    assert pr.boundary(()) == (1, n * (4 + 1) / bw)  # x's Q only
    assert pr.boundary({"mm2"}) == (2, 2 * n * (4 + 1) / bw)  # and h2's Q
    assert pr.boundary({"mm1"}) == (1, n * (4 + 1) / bw)  # h1's Q fuses into mm1 no more,
    # but x's Q goes with mm1 and h1's Q takes its place
    assert pr.boundary({"mm1", "mm2", "mm3"}) == (0, 0.0)  # no Q/DQ left
    c = pr.summary(["mm2"])
    rows = {r["row"]: r for r in c["rows"]}
    # h2's Q kernel, and mm1 writing h1 in FP32 (4 bytes) where its fused Q wrote INT8 (1)
    assert rows["Q/DQ boundaries"]["added_s"] == pytest.approx((n * 5 + n * 3) / bw)
    assert c["qdq_boundaries"]["plan"]["kernels"] == 2
    assert sum(r["share"] for r in c["rows"]) == pytest.approx(c["plan_vs_all_quantized"])
    assert c["plan_s"] - c["all_quantized_s"] == pytest.approx(
        sum(r["added_s"] for r in c["rows"]))
    # a graph output quantized (R2': Q fused into the layer, its DQ a reformat of its own)
    b2 = qm.QBuilder()
    h = b2.node("MatMul", [b2.act("x", 4.0), b2.weight("w1", qm._w(rng))], "h", "mm1")
    b2.act(h, 4.0)
    m2 = b2.model({"x": x}, ["h_dq"])
    pr2 = pricing_for(m2, analyse(m2), {}, {"x": x}, "l4", False)
    assert pr2.boundary(()) == (2, (n * 5 + n * 5) / bw)  # x's Q, h's DQ (1 byte in, 4 out)
    assert pr2.boundary({"mm1"}) == (0, 0.0)


def test_a_reformat_reads_the_float_width_its_writer_has_under_the_plan():
    """In a file FP16 elsewhere a Q reformat reads 2 bytes per element, 4 where the plan also
    keeps the layer writing its input in FP32: fp16_side's xh (written by a Cast) always has
    one; un-quantizing mm1 removes it and leaves h's Q, mm1's output, a kernel of its own."""
    from trtbisect.quant.cost import pricing_for
    from trtbisect.quant.half import half_nodes
    from trtbisect.quant.judge import FP32_PREFIX
    from trtbisect.search.cost import GPUS

    p = qm.fp16_side()
    units = {FP32_PREFIX + n: n for n in half_nodes(p.model)}
    pr = pricing_for(p.model, analyse(p.model), units, p.inputs, "l4", True)
    n, bw = qm.N * qm.C, GPUS["l4"].bandwidth
    assert pr.boundary(()) == (1, n * (2 + 1) / bw)  # xh's Q
    assert pr.boundary({"mm1"}) == (1, n * (2 + 1) / bw)  # h's Q instead
    assert pr.boundary({"mm1", FP32_PREFIX + "mm1"}) == (1, n * (4 + 1) / bw)


def test_a_quantized_layer_kept_in_fp32_is_priced_as_the_float_layer_the_file_runs():
    """fp16_side with mm2 left quantized but its node kept in FP32: the written file puts
    Casts between mm2's DQs and it, so no DQ fuses (rule R1 moves a DQ past none): mm2 is
    priced as an FP32 MatMul on dequantized values, h's DQ a kernel of its own (1 byte read,
    2 written), beside xh's Q reformat; mm1 still fuses h's Q and writes 1 byte."""
    from trtbisect.quant.cost import pricing_for
    from trtbisect.quant.half import half_nodes
    from trtbisect.quant.judge import FP32_PREFIX
    from trtbisect.search.cost import GPUS

    p = qm.fp16_side()
    units = {FP32_PREFIX + n: n for n in half_nodes(p.model)}
    pr = pricing_for(p.model, analyse(p.model), units, p.inputs, "l4", True)
    n, bw = qm.N * qm.C, GPUS["l4"].bandwidth
    floated = {FP32_PREFIX + "mm2"}
    assert pr.floated(frozenset(floated)) == {"mm2"}
    assert pr.node_times(floated)["mm2"] == pr.node_times({"mm2", FP32_PREFIX + "mm2"})["mm2"]
    assert pr.node_times(floated)["mm2"] == pytest.approx(4 * 3 * n / bw)  # h, w2, yh at 4
    assert pr.boundary(floated) == (2, (n * (2 + 1) + n * (1 + 2)) / bw)
    assert pr.written_bytes("mm1", frozenset(floated)) == 1


def test_a_relu_after_a_quantized_layer_is_priced_in_its_epilogue():
    """outlier: x -> mm1 -> relu -> mm2, FP32 elsewhere, n = 256 elements per tensor. The
    Relu runs in mm1's epilogue (TensorRT's explicit-quantization placement: a linear
    operation followed by its activation): it costs nothing of its own, where it cost
    4 * (n + n) bytes before. All quantized: mm1 reads x and w1 at 1 byte and writes hr's
    fused Q at 1 (3n), mm2 reads 2n at 1 byte and writes y at 4 (6n), x's Q reformat reads
    4 and writes 1 (5n): 14n. mm1 un-quantized (FP32, the Relu with it): 12n + 5n (hr's Q a
    reformat now) + 6n. A Relu whose input something else reads too is priced on its own."""
    from trtbisect.quant.cost import pricing_for
    from trtbisect.search.cost import GPUS

    p = qm.outlier()
    pr = pricing_for(p.model, analyse(p.model), {}, p.inputs, "l4", False)
    n, bw = qm.N * qm.C, GPUS["l4"].bandwidth
    assert pr.epilogue == {"relu": "mm1"}
    assert pr.node_times(())["relu"] == pr.node_times({"mm1"})["relu"] == 0.0
    assert pr.price(()) == pytest.approx(14 * n / bw)
    assert pr.price({"mm1"}) == pytest.approx(23 * n / bw)
    assert pr.all_fp16() == pytest.approx((2 * 3 * n + 2 * 3 * n) / bw)
    m = onnx.ModelProto()
    m.CopyFrom(p.model)
    m.graph.output.append(onnx.helper.make_tensor_value_info("h", onnx.TensorProto.FLOAT,
                                                             [qm.N, qm.C]))
    apart = pricing_for(m, analyse(m), {}, p.inputs, "l4", False)
    assert apart.epilogue == {}
    assert apart.node_times(())["relu"] == pytest.approx(4 * 2 * n / bw)


def test_units_joined_by_a_tensor_are_neighbours():
    """quant/adjacent.py on fp16_side: mm1 and mm2 meet through h's Q/DQ, a layer and the
    FP32 unit of its own node are neighbours, amp reads mm2, back reads amp; the Casts at
    the graph's edges are no units."""
    from trtbisect.quant.adjacent import unit_adjacency
    from trtbisect.quant.half import half_nodes

    p = qm.fp16_side()
    units = {**{la.name: (la.name,) for la in analyse(p.model)},
             **{"fp32:" + n: (n,) for n in half_nodes(p.model)}}
    assert unit_adjacency(p.model, units) == {
        "mm1": ("mm2", "fp32:mm1", "fp32:mm2"),
        "mm2": ("mm1", "fp32:mm1", "fp32:mm2", "fp32:amp"),
        "fp32:mm1": ("mm1", "mm2", "fp32:mm2"),
        "fp32:mm2": ("mm1", "mm2", "fp32:mm1", "fp32:amp"),
        "fp32:amp": ("mm2", "fp32:mm2", "fp32:back"),
        "fp32:back": ("fp32:amp",)}


def test_report_draws_every_evaluated_plan_against_its_estimated_time(tmp_path):
    """`--report` on a quantized run writes the trade-off plot: one point per evaluated plan
    at its estimated time and the error its judge measured, the file as given (all quantized)
    at its own error, the written plan's point at the written file's error."""
    pytest.importorskip("matplotlib")
    from trtbisect.quant.report import tradeoff_points, worst_rel

    p = qm.residual()
    model, inputs = _files(p, tmp_path)
    res = invoke("run", model, "--inputs", inputs, "--rtol", str(p.rtol), "--report",
                 "--out", tmp_path / "out")
    assert res.exit_code in (0, 7), res.output  # fixed, or fragile under ORT's QDQ fusions
    png = tmp_path / "out" / "report_tradeoff.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    written = json.loads((tmp_path / "out" / "precision.json").read_text())
    assert written["files"]["report_tradeoff"] == str(png)
    assert all("price_s" in t and "score" in t for t in written["trials"])
    r = run(model, _opts(inputs, p.rtol), tmp_path / "o2")
    points, chosen, given = tradeoff_points(r)
    assert len(points) == 1 + r.evaluations
    assert given == (1e6 * r.cost.all_quantized_s, worst_rel(r.before.errors), False)
    assert chosen == (1e6 * r.cost.plan_s, worst_rel(r.after.errors), True)
    assert [pt[2] for pt in points[1:]] == [t.passed for t in r.trials]


def test_onnx_runtimes_quantizer_output_gets_the_same_plan(tmp_path):
    """ONNX Runtime's quantizer (QDQ, uint8 activations, per-channel int8 weights) quantizes
    the graph output too (its Q fuses into the last layer) and drops the Relu before a Q
    whose zero point is 0 (the Q clamps negatives): un-quantized, that edge keeps a Relu, so
    the reference is the FP32 model's computation again."""
    import sys
    if any(m.startswith("modelopt.onnx") for m in sys.modules):
        pytest.skip("ModelOpt, imported by an earlier test, patched ONNX Runtime's quantizer "
                    "in this process (modelopt/onnx/quantization/ort_patching.py)")
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    p = qm.outlier()
    fp32, qdq_path = tmp_path / "fp32.onnx", tmp_path / "ort_qdq.onnx"
    plain = unquantize(p.model, analyse(p.model))
    onnx.save(plain, fp32)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.left = [dict(p.inputs)]

        def get_next(self):
            return self.left.pop() if self.left else None
    quantize_static(str(fp32), str(qdq_path), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    m = onnx.load(qdq_path)
    assert "Relu" not in {n.op_type for n in m.graph.node}  # folded into the Q
    layers = analyse(m)
    assert [la.name for la in layers] == ["mm1", "mm2"]
    assert any(e.slot == -1 for e in layers[1].edges)  # the output's Q/DQ, fused into mm2
    ref = unquantize(m, layers)
    np.testing.assert_allclose(session(ref).run(["y"], p.inputs)[0],
                               session(plain).run(["y"], p.inputs)[0], rtol=1e-5, atol=1e-5)
    np.savez(tmp_path / "in.npz", **p.inputs)
    r = run(qdq_path, _opts(tmp_path / "in.npz", p.rtol, "count"), tmp_path / "out")
    assert r.verdict in PLANNED and r.plan == ["mm1"] and r.one_judge is True


def test_hostile_layer_names_reach_commands_sh_whole(tmp_path):
    """A layer named with quotes, a newline and regex syntax: commands.sh hands ModelOpt
    exactly one pattern that matches that name alone."""
    import shlex

    p = qm.outlier()
    evil = "mm1'; rm -rf ~\n.*(x)"
    for n in p.model.graph.node:
        if n.name == "mm1":
            n.name = evil
    model, inputs = _files(p, tmp_path)
    r = run(model, _opts(inputs, p.rtol), tmp_path / "out")
    assert r.plan == [evil]
    sh = (tmp_path / "out" / "commands.sh").read_text()
    line = next(x for x in shlex.split(sh, comments=True) if x.startswith("mm1"))
    assert re.match(line, evil) and not re.match(line, "mm1") and not re.match(line, "mm2")


def test_a_non_finite_reference_is_refused_with_exit_3(tmp_path):
    p = qm.outlier()
    p.inputs["x"][0, 0] = np.inf
    model, inputs = _files(p, tmp_path)
    r = invoke("-q", "run", model, "--inputs", inputs, "--out", tmp_path / "out", "--json")
    assert r.exit_code == 3, r.output
    assert json.loads(r.stdout)["verdict"] == "reference_invalid"
    written = json.loads((tmp_path / "out" / "precision.json").read_text())
    assert written["verdict"] == "reference_invalid" and written["reference_problems"]


def test_check_judges_the_written_file_as_run_did(tmp_path):
    """`trtbisect check` of the written Q/DQ file against the reference gives run's numbers
    bit for bit (a file FP16 elsewhere: FP16 stores explicit in both)."""
    p = qm.fp16_side()
    model, inputs = _files(p, tmp_path)
    r = run(model, _opts(inputs, p.rtol), tmp_path / "out")
    ref = tmp_path / "ref.onnx"
    onnx.save(unquantize(p.model, analyse(p.model)), ref)
    written = tmp_path / "out" / "fp16_side.unquantized.onnx"
    c = invoke("-q", "check", written, "--reference", ref, "--inputs", inputs, "--rtol",
               p.rtol, "--json")
    assert c.exit_code == 0, c.output
    got = json.loads(c.stdout)
    assert got["errors"]["y"]["max_abs"] == r.after.errors["y"].max_abs
    c = invoke("-q", "check", model, "--reference", ref, "--inputs", inputs, "--rtol", p.rtol)
    assert c.exit_code == 4 and "fail" in c.stdout


def test_a_rerun_replays_the_journaled_evaluations(tmp_path):
    """Every search evaluation is journaled in --out; the same run again replays them (the
    same plan, no search inference), --no-resume starts afresh."""
    p = qm.fp16_side()
    model, inputs = _files(p, tmp_path)
    first = run(model, _opts(inputs, p.rtol), tmp_path / "out")
    again = run(model, _opts(inputs, p.rtol), tmp_path / "out")
    assert again.units == first.units and again.evaluations == first.evaluations
    assert len(again.judge.verdicts) < len(first.judge.verdicts)  # searched plans: replayed
    done = [json.loads(ln) for ln in (tmp_path / "out" / "journal.jsonl").read_text()
            .splitlines()[1:] if '"done"' in ln]
    # each verdict with its pressures, for the search's watch on its own noise when replayed
    assert done and all(set(d["pressure"]) == {"y"} for d in done)
    assert again.search.noisy is None and first.search.noisy is None
    fresh = _opts(inputs, p.rtol).but(resume=False)
    afresh = run(model, fresh, tmp_path / "out")
    assert len(afresh.judge.verdicts) == len(first.judge.verdicts)


def test_detection_reads_big_files_in_chunks(tmp_path):
    """The CLI's hook looks for the op type's bytes before parsing anything: a word split
    across chunks is found, a model without it is never parsed."""
    from trtbisect.quant.run import _mentions, is_quantized_file

    f = tmp_path / "f.bin"
    f.write_bytes(b"x" * 20 + b"DequantizeLinear" + b"y" * 5)
    assert all(_mentions(f, b"DequantizeLinear", chunk=c) for c in (1, 3, 8, 16, 17, 100))
    assert not _mentions(f, b"QuantizeLinearX", chunk=8)
    p = qm.outlier()
    model, _ = _files(p, tmp_path)
    plain = tmp_path / "plain.onnx"
    onnx.save(unquantize(p.model, analyse(p.model)), plain)
    assert is_quantized_file(model) and not is_quantized_file(plain)
    assert not is_quantized_file(tmp_path / "missing.onnx") and not is_quantized_file(tmp_path)


@pytest.mark.parametrize("make", [qm.outlier], ids=lambda m: m.__name__)
def test_the_count_objective_finds_the_same_plans(make, tmp_path):
    p = make()
    model, inputs = _files(p, tmp_path)
    opts = _opts(inputs, p.rtol, "count")
    r = run(model, opts, tmp_path / "out")
    cheapest = run(model, _opts(inputs, p.rtol), tmp_path / "out2")
    assert r.one_minimal and r.units == cheapest.units and r.cost.objective == "count"


def _every_plan(r, p: qm.Planted) -> dict[frozenset[str], tuple[float, bool]]:
    """Brute force: every subset of the run's search units, its price (the run's pricing)
    and its verdict (the run's judge)."""
    from trtbisect.quant.cost import pricing_for, shape_probe

    j = r.judge
    pricing = pricing_for(p.model, r.layers, j.half, p.inputs, r.cost.gpu, r.emulated,
                          shape_probe(p.model, p.inputs, 1))
    plans = [frozenset(s) for k in range(len(j.units) + 1)
             for s in itertools.combinations(j.units, k)]
    return {s: (pricing.price(j.expand(s)), j.check(s)) for s in plans}


def _cheaper_run(p: qm.Planted, tmp_path):
    model, inputs = _files(p, tmp_path)
    count = run(model, _opts(inputs, p.rtol, "count"), tmp_path / "count")
    cost = run(model, _opts(inputs, p.rtol), tmp_path / "cost")
    assert cost.verdict in PLANNED and cost.one_judge is True
    # `check` of the written file gives run's numbers bit for bit
    ref = tmp_path / "ref.onnx"
    onnx.save(unquantize(p.model, analyse(p.model)), ref)
    c = invoke("-q", "check", tmp_path / "cost" / f"{p.name}.unquantized.onnx", "--reference",
               ref, "--inputs", inputs, "--rtol", p.rtol, "--json")
    assert c.exit_code == 0, c.output
    assert json.loads(c.stdout)["errors"]["y"]["max_abs"] == cost.after.errors["y"].max_abs
    # the cheaper step: bounded, and what it judged is in the trace
    step = cost.certificate.cheaper
    assert step.evaluations <= step.allowance == 2 * len(cost.judge.units)
    assert cost.evaluations == len(cost.trials)
    assert sum(t.phase == "cheaper" for t in cost.trials) == step.evaluations
    assert count.certificate is None and all(t.phase != "cheaper" for t in count.trials)
    return count, cost


def test_the_cost_objective_takes_a_cheaper_superset_the_cheapest_of_all(tmp_path):
    """fp16_side(fused=True): the 1-minimal plan un-quantizes mm1 alone, which leaves h's Q
    a reformat of its own (mm1 now writes FP16); un-quantizing mm2 too removes it and costs
    less than it saves. Brute force over the 32 plans: {mm1, mm2} is the cheapest that
    passes, 0.02049 us against {mm1}'s 0.02135 us on the default L4."""
    p = qm.fp16_side(fused=True)
    count, cost = _cheaper_run(p, tmp_path)
    assert count.units == ["mm1"] and count.one_minimal
    assert cost.units == ["mm1", "mm2"] and not cost.one_minimal
    every = _every_plan(cost, p)
    best = min((price, sorted(s)) for s, (price, ok) in every.items() if ok)
    assert best == (cost.cost.plan_s, ["mm1", "mm2"])
    assert cost.cost.plan_s == pytest.approx(2.049e-8, rel=1e-3)
    assert cost.certificate.minimal_price_s == every[frozenset({"mm1"})][0] == \
        count.cost.plan_s == pytest.approx(2.1353e-8, rel=1e-3)
    written = json.loads((tmp_path / "cost" / "precision.json").read_text())
    assert written["cost"]["certificate"]["cheaper"]["moves"] == [
        {"added": ["mm2"], "removed": []}]
    assert cost.minimality == ("a 1-minimal plan made 4.0% cheaper in 1 step(s) to cheaper "
                               "passing plans one unit away")
    assert count.minimality == "certified 1-minimal"


def test_the_cost_objective_on_fp16_side_ends_at_a_local_optimum(tmp_path):
    """fp16_side: the 1-minimal plan {mm1, amp, back} (0.02477 us) becomes {mm1, mm2, amp,
    back} (0.02392 us): no passing plan one unit away (added, removed, swapped) is cheaper,
    nor any passing superset of the 1-minimal plan. The cheapest passing plan of all 64,
    {mm1, mm2, fp32:mm2} (0.0222 us: mm2 un-quantized in FP32, so amp and back fuse into one
    pointwise layer that keeps 2^15 x inside), is three units away, and each first step
    towards it fails or costs more: a descent one unit at a time cannot reach it
    (docs/quantization.md)."""
    p = qm.fp16_side()
    count, cost = _cheaper_run(p, tmp_path)
    half = ["fp32:amp", "fp32:back"]
    assert count.units == ["mm1", *half] and cost.units == ["mm1", "mm2", *half]
    every = _every_plan(cost, p)
    plan, minimal = frozenset(cost.units), frozenset(count.units)
    assert every[plan][0] == cost.cost.plan_s == pytest.approx(2.392e-8, rel=1e-3)
    assert every[minimal][0] == count.cost.plan_s == pytest.approx(2.4773e-8, rel=1e-3)
    supersets = [(price, sorted(s)) for s, (price, ok) in every.items() if ok and minimal <= s]
    assert min(supersets) == (every[plan][0], sorted(plan))
    near = [s for s in every if len(s ^ plan) == 1 or (len(s) == len(plan)
                                                       and len(s - plan) == 1)]
    assert all(not ok or price >= every[plan][0] for s in near for price, ok in [every[s]])
    best = min((price, sorted(s)) for s, (price, ok) in every.items() if ok)
    assert set(best[1]) == {"mm1", "mm2", "fp32:mm2"} and best[0] < every[plan][0]
    assert best[0] == pytest.approx(2.22e-8, rel=1e-3)
    # the way there: adding fp32:mm2 costs more, removing amp or back first fails
    assert every[plan | {"fp32:mm2"}][0] > every[plan][0]
    assert not every[plan - {"fp32:amp"}][1] and not every[plan - {"fp32:back"}][1]


def test_a_layer_whose_output_q_fuses_into_it_writes_int8():
    """TensorRT's Q/DQ fusion (the convolution with inputs and output quantized): x -> mm1 ->
    mm2 -> mm3, FP32 elsewhere. mm1 and mm2 write h1 and h2 through the Q that fuses into
    them: 1 byte per element. mm3 writes the graph output in FP32: 4. Un-quantizing mm2
    leaves h1's Q/DQ to no reader: mm1 writes FP32 again. A tensor a float node reads beside
    the Q (a residual) stays float."""
    from trtbisect.quant.cost import pricing_for
    from trtbisect.search.cost import GPUS

    model, x, rng = _three_matmuls()
    pr = pricing_for(model, analyse(model), {}, {"x": x}, "l4", False)
    n, bw = qm.N * qm.C, GPUS["l4"].bandwidth
    reads = 2 * n  # the INT8 activation and the INT8 weight, 1 byte each
    times = pr.node_times(())
    assert times["mm1"] == pytest.approx((reads + 1 * n) / bw)
    assert times["mm2"] == pytest.approx((reads + 1 * n) / bw)
    assert times["mm3"] == pytest.approx((reads + 4 * n) / bw)
    assert pr.written_bytes("mm1", frozenset({"mm2"})) == 4
    assert pr.node_times({"mm2"})["mm1"] == pytest.approx((reads + 4 * n) / bw)
    assert pr.price(()) == pytest.approx(sum(times.values()) + n * (4 + 1) / bw)
    # a residual: h1 read by mm2's Q and by a float Add: mm1 writes FP32
    b2 = qm.QBuilder()
    h = b2.node("MatMul", [b2.act("x", 4.0), b2.weight("w1", qm._w(rng))], "h", "mm1")
    h2 = b2.node("MatMul", [b2.act(h, 4.0), b2.weight("w2", qm._w(rng))], "h2", "mm2")
    b2.node("Add", [h, h2], "y", "add")
    m2 = b2.model({"x": x}, ["y"])
    pr2 = pricing_for(m2, analyse(m2), {}, {"x": x}, "l4", False)
    assert pr2.written_bytes("mm1", frozenset()) == 4
    assert pr2.node_times(())["mm1"] == pytest.approx((reads + 4 * n) / bw)


def _report_run(tmp_path, model: onnx.ModelProto, inputs: dict, rtol: float, rename=None,
                objective: str = "cost"):
    """`run --report` on a planted model, its layers' compute nodes renamed by `rename`."""
    for n in model.graph.node:
        n.name = (rename or {}).get(n.name, n.name)
    tmp_path.mkdir(parents=True, exist_ok=True)
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "m.npz", **inputs)
    res = invoke("run", tmp_path / "m.onnx", "--inputs", tmp_path / "m.npz", "--rtol", rtol,
                 "--report", "--out", tmp_path / "out", "--objective", objective,
                 "--validation-share", "0")  # the pages are the subject
    assert res.exit_code in (0, 7), res.output  # fixed, or fragile under ORT's QDQ fusions
    return tmp_path / "out"


def test_report_pages_name_each_culprit_and_its_side(tmp_path):
    """report.html and report.md on a file FP16 elsewhere: the verdict first, the planted
    culprits on both sides (mm1 quantized, run un-quantized; amp and back FP16, kept in
    FP32), the diagnosis with the fix trtbisect verified, the trade-off plot, and
    precision.json's files list the pages."""
    pytest.importorskip("matplotlib")
    p = qm.fp16_side()
    out = _report_run(tmp_path, p.model, p.inputs, p.rtol, objective="count")
    md = (out / "report.md").read_text(encoding="utf-8")
    assert md.splitlines()[2].startswith("**Verdict: fixed by running 1 of 2 quantized layers")
    rows = {line.split(" | ")[0].strip("| `"): line.split(" | ")[1]
            for line in md.splitlines() if line.startswith("| `")
            and " | " in line and ("quantized (" in line or "FP16: kept" in line)}
    assert rows == {"mm1": "quantized (INT8): run un-quantized", "amp": "FP16: kept in FP32",
                    "back": "FP16: kept in FP32"}
    assert "**activation\\_outlier**" in md and "verified: SmoothQuant" in md
    assert "![trade-off plot](report_tradeoff.png)" in md
    page = (out / "report.html").read_text(encoding="utf-8")
    cell = "<td class=''>{}</td><td class=''>{}</td>".format
    assert cell("mm1", "quantized (INT8): run un-quantized") in page
    assert cell("amp", "FP16: kept in FP32") in page
    assert "data:image/png;base64," in page
    files = json.loads((out / "precision.json").read_text())["files"]
    assert files["report_html"] == str(out / "report.html")
    assert files["report_md"] == str(out / "report.md")


def test_report_pages_escape_a_hostile_layer_name(tmp_path):
    """The residual's culprit Add named with terminal escapes, HTML and Markdown in it: both
    pages keep the structure of the plainly named run's, and show the name as text."""
    pytest.importorskip("matplotlib")
    from tests.fuzz.make_cases import HOSTILE
    from tests.outputs.test_hostile_names import Tags, _markdown_tokens, _structure, controls
    from trtbisect.base.escape import visible

    evil = HOSTILE[0] + HOSTILE[2]
    p = qm.residual()
    plain = _report_run(tmp_path / "plain", p.model, p.inputs, p.rtol)
    hostile = _report_run(tmp_path / "evil", qm.residual().model, p.inputs, p.rtol,
                          {"add": evil})
    assert json.loads((hostile / "precision.json").read_text())["unquantized_layers"] == [evil]
    tokens = _markdown_tokens(hostile / "report.md")
    assert _structure(tokens) == _structure(_markdown_tokens(plain / "report.md"))
    inline = [c for t in tokens if t.children for c in t.children]
    assert not [t for t in tokens + inline if t.type in ("html_block", "html_inline",
                                                          "link_open")]
    assert any(c.type == "code_inline" and c.content == visible(evil) for c in inline)
    seen, plain_tags = Tags(), Tags()
    page = (hostile / "report.html").read_text(encoding="utf-8")
    seen.feed(page)
    plain_tags.feed((plain / "report.html").read_text(encoding="utf-8"))
    assert seen.tags == plain_tags.tags and controls(page) == []
    assert not [a for a, _ in seen.attrs if a.startswith("on")]
    assert visible(evil) in "".join(seen.text)


def test_the_fp16_side_rounds_per_fused_tensorrt_layer_by_default(tmp_path):
    """amp -> back is one pointwise chain TensorRT fuses into a PWN layer that rounds its
    output once (semantics.py's pointwise_fusion): the default judge leaves the middle value
    (2^15 x, beyond 65504) unrounded, so only the quantized culprit mm1 is in the plan;
    `--semantics strict` rounds every node, the middle value overflows, and amp and back are
    kept in FP32 too. `check` of the written file gives run's numbers under each."""
    from trtbisect.quant import half

    p = qm.fp16_side(fused=True)
    ty = half.types(p.model)
    assert half.fused_internal(p.model, ty) == {"big"}
    assert half.fused_internal(qm.fp16_side().model, ty) == frozenset()  # MatMul epilogue:
    # uncertain, per-node rounding kept
    model, inputs = _files(p, tmp_path)
    fused = run(model, _opts(inputs, p.rtol, "count"), tmp_path / "trt")
    assert fused.verdict in PLANNED and fused.one_minimal and fused.one_judge is True
    assert fused.plan == ["mm1"] and fused.fp32_nodes == []
    # the pair switches as one unit: kept apart, one in FP32 and the other in FP16, the
    # value TensorRT keeps inside the layer would be stored in FP16 between them
    assert fused.judge.units == ["mm1", "mm2", "fp32:mm1", "fp32:mm2",
                                 "fp32:PWN(amp, back)"]
    assert fused.before.errors["y"].nonfinite == 0
    assert json.loads((tmp_path / "trt" / "precision.json").read_text())["semantics"] == "trt"
    ref = tmp_path / "ref.onnx"
    onnx.save(unquantize(p.model, analyse(p.model)), ref)
    r = invoke("-q", "check", tmp_path / "trt" / "fp16_side.unquantized.onnx", "--reference",
               ref, "--inputs", inputs, "--rtol", p.rtol, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["errors"]["y"]["max_abs"] == fused.after.errors["y"].max_abs
    # in the same --out: the journal of the trt run is not replayed (its fingerprint differs)
    head = json.loads((tmp_path / "trt" / "journal.jsonl").read_text().splitlines()[0])
    assert head["fingerprint"]["settings"]["semantics"][0] == "trt"
    strict_opts = _opts(inputs, p.rtol, "count").but(semantics="strict")
    strict = run(model, strict_opts, tmp_path / "trt")
    assert strict.plan == ["mm1"] and strict.fp32_nodes == ["amp", "back"]
    assert strict.before.errors["y"].nonfinite > 0


def test_shapes_inference_leaves_open_are_probed_for_the_price():
    """x is reshaped by a shape fed at run time (shape inference cannot know it): without the
    probe the quantized MatMul after it is priced on its weight alone; with it (one ORT
    inference of the file), on its activation and output too, as the FP16 run prices."""
    from trtbisect.quant.cost import pricing_for, shape_probe
    from trtbisect.search.cost import GPUS

    rng = np.random.default_rng(3)
    x = rng.standard_normal((qm.N * qm.C,)).astype(np.float32)
    b = qm.QBuilder()
    t = b.node("Reshape", ["flat", "shape"], "x", "reshape")
    b.node("MatMul", [b.act(t, 4.0), b.weight("w1", qm._w(rng))], "y", "mm1")
    h, tp = onnx.helper, onnx.TensorProto
    model = h.make_model(h.make_graph(
        b.nodes, "reshaped", [h.make_tensor_value_info("flat", tp.FLOAT, [qm.N * qm.C]),
                              h.make_tensor_value_info("shape", tp.INT64, [2])],
        [h.make_tensor_value_info("y", tp.FLOAT, None)], b.inits),
        opset_imports=[h.make_opsetid("", 13)])
    model.ir_version = 10
    sample = {"flat": x, "shape": np.array([qm.N, qm.C], np.int64)}
    n, bw = qm.N * qm.C, GPUS["l4"].bandwidth
    blind = pricing_for(model, analyse(model), {}, sample, "l4", False)
    assert blind.node_times(())["mm1"] == pytest.approx(qm.C * qm.C / bw)  # the weight only
    seen = pricing_for(model, analyse(model), {}, sample, "l4", False, shape_probe(model, sample))
    # INT8 activation and weight read (1 byte each), FP32 output written (4)
    assert seen.node_times(())["mm1"] == pytest.approx((n + qm.C * qm.C + 4 * n) / bw)


def test_report_pages_of_a_file_that_passes_as_given(tmp_path):
    """Nothing planned: the pages say so, give the file's own margin and error, and offer no
    plan's column or commands."""
    pytest.importorskip("matplotlib")
    p = qm.residual()
    out = _report_run(tmp_path, p.model, p.inputs, 0.9)
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "**Verdict: the quantized model already meets the tolerance (3 quantized layers).**" \
        in md
    assert "- y: the file as given uses" in md
    assert "| output | quantized as given |\n" in md and "with the plan" not in md
    assert "Apply the plan" not in md and "Culprits" not in md
    assert "Apply the plan" not in (out / "report.html").read_text(encoding="utf-8")
