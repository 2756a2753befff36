"""The semantics integrated: each trt rule proven end to end with exact culprits under each
semantics, and the one-judge invariant (search == `check` of the written file, bit for bit)
under both semantics, with and without TF32."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import save_zoo_model
from tests.models.semantics_models import planted
from tests.test_cli import invoke
from trtbisect.backends.ort import Emulator, MixedModel
from trtbisect.context import Options
from trtbisect.graph import Graph
from trtbisect.judge import semantics as sem
from trtbisect.judge.compare import Tolerance
from trtbisect.judge.mixed import mixed_model
from trtbisect.pipeline import check_mixed, run

PLANTED = planted()
DEMO = Path(__file__).resolve().parents[2] / "models"
CASES = [(name, key) for name, p in PLANTED.items() for key in p.expected]


def _opts(key: str, inputs: Path, **kw) -> Options:
    return Options.of(inputs=[str(inputs)], semantics=key.split("+")[0], tf32="tf32" in key, **kw)


@pytest.mark.parametrize("name,key", CASES)
def test_planted_rule_exact_culprits_per_semantics(tmp_path, name, key):
    p = PLANTED[name]
    model, inputs = save_zoo_model(p, tmp_path)
    r = run(model, _opts(key, inputs), tmp_path / "out")
    verdict, expected = p.expected[key]
    assert (r.verdict, set(r.fp32_nodes)) == (verdict, set(expected))
    data = json.loads((tmp_path / "out" / "precision.json").read_text())
    record = data["semantics"]
    assert record["semantics"] == key.split("+")[0] and record["tf32"] == ("tf32" in key)
    assert record["weight_rule"] == ("inf" if key == "strict" else "clamp")
    assert ("batchnorm_scale" in record["rules"]) == (key != "strict")
    assert ("tf32" in record["rules"]) == ("tf32" in key)
    if r.verdict in ("fixed", "fp16_ok"):
        assert data["one_judge"]["search_equals_check"] is True
        assert set(data["fp32_layers"]) <= set(r.fp32_nodes) | {
            c["layer"] for c in data["culprits"] if "layer" in c}


def test_batchnorm_culprit_only_per_node_is_explained(tmp_path):
    model, inputs = save_zoo_model(PLANTED["batchnorm_variance"], tmp_path)
    r = run(model, _opts("trt", inputs), tmp_path / "out")
    assert r.verdict == "fp16_ok"
    strict_before = r.errors_before_strict["y"]
    assert not strict_before.error.passed and all(e.passed for e in r.errors_before.values())
    assert r.strict_only_culprits == ["bn"]
    group = next(g for g in r.culprit_groups if g.cause == "per_node_rounding_only")
    assert group.nodes == ["bn"]
    assert "fails only under per-node rounding" in group.summary
    assert "precomputes this BatchNorm's scale" in group.summary
    # the strict run blames it, and says TensorRT may not
    s = run(model, _opts("strict", inputs), tmp_path / "strict")
    assert s.fp32_nodes == ["bn"]
    assert "per-node rounding" in s.culprits[0].why and "--semantics trt" in s.culprits[0].why


def test_folded_constant_culprits_only_per_node_are_explained(tmp_path):
    model, inputs = save_zoo_model(PLANTED["constant_subgraph"], tmp_path)
    r = run(model, _opts("trt", inputs), tmp_path / "out")
    assert set(r.strict_only_culprits) == {"const_sq", "const_div"}
    group = next(g for g in r.culprit_groups if g.cause == "per_node_rounding_only")
    assert "folds this constant computation in FP32" in group.summary


def test_culprits_are_named_as_fused_layers(tmp_path):
    # under trt the Conv + bias + Relu unit stays FP32 together when strict tolerance demands it
    # (rtol 2e-4: tight enough that FP16 fails, wide enough for a margin over FP32's own noise,
    # 6e-5 of the output's range here; at 1e-7 no plan has one and the verdict is fragile)
    p = PLANTED["conv_bias_relu"]
    model, inputs = save_zoo_model(p, tmp_path)
    r = run(model, _opts("trt", inputs, tolerance=Tolerance(rtol=2e-4)), tmp_path / "out")
    assert r.verdict == "fixed" and set(r.fp32_nodes) == {"conv", "bias", "relu"}
    tight = run(model, _opts("trt", inputs, tolerance=_tight()), tmp_path / "tight")
    assert tight.verdict == "fragile" and tight.fp32_nodes == r.fp32_nodes
    assert r.fp32_layers == ["conv + bias + relu"]
    assert {c.layer for c in r.culprits} == {"conv + bias + relu"}
    data = json.loads((tmp_path / "out" / "precision.json").read_text())
    assert data["culprits"][0]["layer"] == "conv + bias + relu"


def _tight():
    from trtbisect.judge.compare import Tolerance
    return Tolerance(rtol=1e-7)


def test_renderings_carry_the_judges_tf32_assumption(tmp_path):
    model, inputs = save_zoo_model(PLANTED["tf32_offset"], tmp_path)
    off = run(model, _opts("trt", inputs), tmp_path / "off").renderings()
    assert "--noTF32" in off["trtexec_trt10"] and "--noTF32" in off["trtexec_trt11"]
    assert "--tf32" not in off["polygraphy"]  # Polygraphy leaves TF32 off unless --tf32
    p = PLANTED["batchnorm_variance"]
    model, inputs = save_zoo_model(p, tmp_path / "bn")
    on = run(model, _opts("trt+tf32", inputs), tmp_path / "on").renderings()
    assert "--noTF32" not in on["trtexec_trt10"] and "--tf32" in on["polygraphy"]


def test_check_judges_the_file_under_the_chosen_semantics(tmp_path):
    p = PLANTED["conv_bias_relu"]
    model, inputs = save_zoo_model(p, tmp_path)
    r = run(model, _opts("trt", inputs), tmp_path / "out")
    mixed = Path(r.files["mixed_model"])
    assert check_mixed(mixed, model, _opts("trt", inputs)).passed
    # per node, the all-FP16 file's Conv output is rounded before the bias cancels it
    assert not check_mixed(mixed, model, _opts("strict", inputs)).passed


def test_cli_flags_reach_precision_json(zoo, tmp_path):
    model, inputs = save_zoo_model(zoo["healthy"], tmp_path)
    r = invoke("-q", "run", model, "--inputs", inputs, "--out", tmp_path / "o", "--semantics",
               "strict", "--trt-version", "11", "--tf32", "--json")
    assert r.exit_code == 0, r.output
    record = json.loads(r.output)["semantics"]
    assert (record["semantics"], record["trt_version"], record["tf32"]) == ("strict", 11, True)
    assert record["rules"] == ["tf32"]
    bad = invoke("run", model, "--semantics", "fast")
    assert bad.exit_code == 2


def test_search_graph_reads_untouched_weights_from_the_original_store(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 64)).astype(np.float32)  # 16 KiB: held by the store
    g_ = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
         helper.make_node("BatchNormalization", ["m4", "g", "b", "mu", "v"], ["n"], name="bn"),
         helper.make_node("Reshape", ["m", "shape"], ["m4"], name="rs"),
         helper.make_node("Reshape", ["n", "shape2"], ["y"], name="rs2")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [numpy_helper.from_array(w, "w"),
         *[numpy_helper.from_array(a.astype(np.float32), k) for k, a in
           {"g": np.ones(64), "b": np.zeros(64), "mu": np.zeros(64), "v": np.full(64, 1e6)}.items()],
         numpy_helper.from_array(np.array([1, 64, 1, 1], np.int64), "shape"),
         numpy_helper.from_array(np.array([1, 64], np.int64), "shape2")])
    m = helper.make_model(g_, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    nodes = list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend([nodes[0], nodes[2], nodes[1], nodes[3]])
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    g = Graph.from_path(path)
    sg, prepared = sem.prepare_graph(g, "trt")
    assert sg.array("w") is g.array("w")  # by reference, not a copy
    assert "bn::scale" in sg.initializers and "v" not in sg.initializers
    assert all(t.data_location == TensorProto.EXTERNAL for t in sg.model.graph.initializer
               if t.name == "w")


# ------------------------------------------------------------------- one judge, bit for bit

def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    nan = np.isnan(a) & np.isnan(b)
    return a.shape == b.shape and bool(np.all((a.view(np.uint32) == b.view(np.uint32)) | nan))


def _judge_agrees(model: onnx.ModelProto, feeds: dict, semantics: str, tf32: bool,
                  folder: Path, plans: int = 3, accumulate: int = 0) -> None:
    """Static and switchable emulator, and `check` of the written file, for all-FP16, all-FP32
    and random unit subsets: the same bits (`accumulate`: under --fp16-accumulate)."""
    g = Graph(model)
    sg, prepared = sem.prepare_graph(g, semantics)
    rules = sem.rules_for(prepared, tf32, accumulate)
    units = sem.units(prepared, sg.candidates())
    names = list(units)
    rng = np.random.default_rng(0)
    chosen = [[], names] + [[u for u in names if rng.random() < 0.4] for _ in range(plans)]
    static = Emulator(sg, rules=rules)
    active = Emulator(sg, rules=rules, active=sg.candidates())
    for k, plan in enumerate(chosen):
        nodes = frozenset(n for u in plan for n in units[u])
        a = static.run(nodes, feeds)
        b = active.run(nodes, feeds)
        path = folder / f"{semantics}{int(tf32)}{accumulate}_{k}.onnx"
        mixed_model(sg, nodes, rules.weight_rule).save(path)
        c = MixedModel(Graph.from_path(path), rules=rules, fused=semantics == "trt").run(feeds)
        for out in a:
            assert _same_bits(a[out], b[out]), (semantics, tf32, accumulate, plan, out, "active")
            assert _same_bits(a[out], c[out]), (semantics, tf32, accumulate, plan, out, "check")


@pytest.mark.parametrize("semantics", ["trt", "strict"])
def test_one_judge_on_the_zoo_and_planted_models(zoo, tmp_path, semantics):
    models = [(z.model, z.inputs) for z in zoo.values()] + [
        (p.model, p.inputs) for p in PLANTED.values()]
    for k, (model, feeds) in enumerate(models):
        folder = tmp_path / str(k)
        folder.mkdir()
        _judge_agrees(model, feeds, semantics, tf32=False, folder=folder)


@pytest.mark.parametrize("semantics", ["trt", "strict"])
def test_one_judge_with_tf32(tmp_path, semantics):
    for k, p in enumerate(PLANTED.values()):
        folder = tmp_path / str(k)
        folder.mkdir()
        _judge_agrees(p.model, p.inputs, semantics, tf32=True, folder=folder)


@pytest.mark.parametrize("semantics,tf32", [("trt", False), ("strict", False), ("trt", True)])
def test_one_judge_on_the_demo(tmp_path, semantics, tf32):
    model = onnx.load(DEMO / "demo.onnx")
    feeds = dict(np.load(DEMO / "demo_inputs.npz"))
    _judge_agrees(model, feeds, semantics, tf32, tmp_path, plans=4)


def test_demo_run_under_trt_keeps_one_judge(tmp_path):
    r = run(DEMO / "demo.onnx", Options.of(inputs=[str(DEMO / "demo_inputs.npz")]), tmp_path / "o")
    assert r.verdict in ("fixed", "fp16_ok")
    assert r.one_judge.search_equals_check is True
    assert r.errors_before_strict is not None


def test_rewrites_are_judged_under_the_runs_semantics(tmp_path):
    """A decomposed LayerNorm that overflows, then a BatchNorm whose raw variance (4.97e5)
    overflows only when each node rounds. Under trt, fusing the LayerNorm is the whole fix:
    the rewrite's judge must say so (a per-node judge would blame the BatchNorm too)."""
    from tests.models.make_models import layernorm_overflow
    z = layernorm_overflow()
    m = onnx.ModelProto()
    m.CopyFrom(z.model)
    g = m.graph
    for n in g.node:
        n.output[:] = ["ln_out" if t == "y" else t for t in n.output]
    c = 16
    g.initializer.extend(numpy_helper.from_array(np.full(c, v, np.float32), name)
                         for name, v in (("bn_g", 1.0), ("bn_b", 0.0), ("bn_m", 0.5),
                                         ("bn_v", 4.97e5)))
    g.node.append(helper.make_node("BatchNormalization", ["ln_out", "bn_g", "bn_b", "bn_m", "bn_v"],
                                   ["y"], name="bn"))
    z = type(z)(**{**z.__dict__, "name": "ln_then_bn", "model": m})
    model, inputs = save_zoo_model(z, tmp_path)
    r = run(model, _opts("trt", inputs, rewrite=True), tmp_path / "out")
    assert r.verdict == "fixed" and r.fp32_nodes == [], (r.verdict, r.fp32_nodes)
    assert [a.rewrite for a in r.rewrites.applied] == ["fuse_layernorm"]
    assert r.mixed_model_passed
    s = run(model, _opts("strict", inputs, rewrite=True), tmp_path / "strict")
    assert "bn" in s.fp32_nodes  # per node, the BatchNorm needs FP32 whatever the rewrites
