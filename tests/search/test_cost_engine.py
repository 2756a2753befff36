"""One price per engine (#36): every node priced where it runs (If branches, Loop and Scan
bodies, local functions), keeping a unit FP32 never cheaper, and the same price whatever
--semantics judges."""

from __future__ import annotations

import itertools
import random

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.models.control_flow_models import all_planted
from tests.models.make_models import deep_model, zoo
from tests.models.semantics_models import constant_planted, planted
from trtbisect.backends.ort import Reference
from trtbisect.graph import Graph
from trtbisect.judge import semantics
from trtbisect.search.cost import engine_pricing, search_args


def _probe(sample):
    def for_graph(g: Graph):
        def probe(names):
            return {t: tuple(a.shape) for t, a in Reference(g).run_tensors(sample, names).items()}
        return probe
    return for_graph


def _priced(model: onnx.ModelProto, sample, sem: str):
    graph = Graph(model)
    judged, prepared = semantics.prepare_graph(graph, sem)
    units = semantics.units(prepared, judged.candidates())
    return engine_pricing(graph, judged, prepared, units, sample, "l4",
                          probe_for=_probe(sample)), units


def _models():
    out = {f"cf:{k}": (p.model, p.inputs) for k, p in all_planted().items()}
    out.update({f"zoo:{k}": (z.model, z.inputs) for k, z in zoo().items()})
    out.update({f"sem:{k}": (p.model, p.inputs)
                for k, p in {**planted(), **constant_planted()}.items()})
    return out


MODELS = _models()


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("sem", ["trt", "strict"])
def test_no_plan_is_priced_below_all_fp16_nor_above_all_fp32(name, sem):
    """Every plan of a small model (a sample of plans of a larger one), and every plan with one
    unit more: all-FP16 <= price <= all-FP32, and one unit more never costs less."""
    model, sample = MODELS[name]
    pricing, units = _priced(model, sample, sem)
    names = list(units)
    lo, hi = pricing.fp16_s, pricing.fp32_s
    assert 0 < lo <= hi, (name, lo, hi)
    if len(names) <= 10:
        plans = [frozenset(c) for k in range(len(names) + 1)
                 for c in itertools.combinations(names, k)]
    else:
        rng = random.Random(0)
        plans = [frozenset(rng.sample(names, rng.randint(0, len(names)))) for _ in range(300)]
    tol = 1e-12 * hi
    for plan in plans:
        p = pricing.price(plan)
        assert lo - tol <= p <= hi + tol, (name, sorted(plan), p, lo, hi)
        for u in names:
            if u not in plan:
                assert pricing.price(plan | {u}) >= p - tol, (name, sorted(plan), u)


def test_a_deep_model_is_monotone_too():
    z = deep_model(blocks=4, overflow_blocks=(1,))
    pricing, units = _priced(z.model, z.inputs, "trt")
    names, rng = list(units), random.Random(1)
    for _ in range(200):
        plan = frozenset(rng.sample(names, rng.randint(0, len(names) - 1)))
        u = rng.choice([n for n in names if n not in plan])
        assert pricing.fp16_s <= pricing.price(plan) <= pricing.price(plan | {u}) <= pricing.fp32_s


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_price_does_not_depend_on_the_semantics(name):
    """The engine TensorRT builds is the same whatever rounding the judge uses: all-FP16,
    all-FP32, and a strict plan priced by the layers its nodes belong to."""
    model, sample = MODELS[name]
    trt, trt_units = _priced(model, sample, "trt")
    strict, strict_units = _priced(model, sample, "strict")
    assert strict.fp16_s == trt.fp16_s and strict.fp32_s == trt.fp32_s
    assert strict.engine.units == trt.engine.units
    for layer, nodes in trt_units.items():  # a layer's nodes, as a strict plan, price the layer
        kept = [n for n in nodes if n in strict_units]
        if kept:
            assert strict.price(kept) == trt.price([layer]), (name, layer)


def test_the_branch_taken_is_priced_and_the_other_is_not():
    p = all_planted()["if_taken_branch"]
    pricing, _ = _priced(p.model, p.inputs, "trt")
    engine = pricing.engine
    assert engine.cost["branch[then_branch]/square"].fp16_s > 0
    assert engine.cost["branch[else_branch]/tanh"].fp16_s == 0  # never runs on this sample
    assert not engine.flow.notes and not engine.unpriced
    # without a reference run the branch taken is unknown: the dearer one is priced, and said
    graph = Graph(p.model)
    units = {n: (n,) for n in graph.candidates()}
    blind = engine_pricing(graph, graph, None, units, p.inputs, "l4")
    assert blind.engine.cost["branch[then_branch]/square"].fp16_s > 0
    assert blind.engine.cost["branch[else_branch]/tanh"].fp16_s == 0
    assert any("dearer branch (then_branch)" in n for n in blind.engine.flow.notes)


def test_nested_branches_multiply_and_a_branch_never_reached_says_nothing():
    p = all_planted()["nested_if"]
    e = _priced(p.model, p.inputs, "trt")[0].engine
    runs = dict(zip(Graph(p.model).names, e.flow.runs))
    assert runs["outer[then_branch]/inner[then_branch]/square"] == 1
    assert runs["outer[then_branch]/inner[else_branch]/tanh"] == 0
    assert runs["outer[else_branch]/tanh"] == 0 and not e.flow.notes


def test_loop_and_scan_bodies_are_priced_times_their_trips():
    loop = all_planted()["loop_third_trip"]
    pricing, _ = _priced(loop.model, loop.inputs, "trt")
    e = pricing.engine
    g = Graph(loop.model)
    assert e.flow.runs[g.index["loop[body]/square"]] == 3
    # square reads v_in (FP32: the loop carries its declared type) and writes v_sq: 16 each
    assert e.cost["loop[body]/square"].float_elements == 3 * (16 + 16)
    scan = all_planted()["scan_rows"]
    e = _priced(scan.model, scan.inputs, "trt")[0].engine
    assert e.flow.runs[Graph(scan.model).index["scan[body]/square"]] == 6


def test_a_local_function_is_priced_as_its_body():
    p = all_planted()["local_function"]
    pricing, units = _priced(p.model, p.inputs, "strict")
    assert "l2/sum" in units and pricing.price(["l2/sum"]) > pricing.fp16_s


def _data_dependent_loop() -> onnx.ModelProto:
    """A Loop that stops when its value passes a bound: no scan output, so its trips cannot
    be read off the reference's outputs."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["v_in", "two"], ["v_out"], name="double"),
         helper.make_node("ReduceMax", ["v_out"], ["m"], keepdims=0, name="max"),
         helper.make_node("Less", ["m", "bound"], ["cond_out"], name="go_on")],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [2, 8])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["", "", "x"], ["y"], body=body, name="loop")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
         numpy_helper.from_array(np.array(100.0, np.float32), "bound")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_loop_with_unknown_trips_is_named_unpriced_and_the_search_falls_back_to_count():
    sample = {"x": np.ones((2, 8), np.float32)}
    pricing, _ = _priced(_data_dependent_loop(), sample, "trt")
    assert pricing.unpriced == ["the body of Loop 'loop' (its trip count on the analysed "
                                "sample is unknown)"]
    assert search_args(pricing, "cost", None) == {}
    s = pricing.summary([], "cost")
    assert s["objective"] == "count" and "fell back to count" in s["fallback"]
    assert "Loop 'loop'" in s["fallback"]


# ---------------------------------------------------------------- in the run's outputs

def conv_bn_mean(tmp_path):
    """Conv -> BatchNorm (TensorRT folds it into the Conv: one layer "conv + bn") whose output
    overflows FP16, then a channel mean and a scale back: every layer is a culprit."""
    rng = np.random.default_rng(0)
    c = 4
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"], name="bn"),
             helper.make_node("ReduceMean", ["n"], ["p"], name="mean", axes=[1], keepdims=1),
             helper.make_node("Mul", ["p", "milli"], ["y"], name="out")]
    arrays = {"w": rng.random((c, 3, 3, 3)) * 3000, "s": np.full(c, 4.0), "b": np.zeros(c),
              "m": np.zeros(c), "v": np.ones(c), "milli": np.array(1e-3)}
    inits = [numpy_helper.from_array(np.asarray(a, np.float32), k) for k, a in arrays.items()]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 16, 16])],
                          inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              tmp_path / "cbn.onnx")
    np.savez(tmp_path / "cbn.npz", x=(1 + rng.random((1, 3, 16, 16))).astype(np.float32))
    return tmp_path / "cbn.onnx", tmp_path / "cbn.npz"


def _cli(*args):
    from click.testing import CliRunner

    from trtbisect.cli import main
    return CliRunner().invoke(main, ["run", *map(str, args)], env={"COLUMNS": "200"})


def test_one_price_per_engine_in_the_run_and_the_table_adds_up(tmp_path):
    import json
    model, npz = conv_bn_mean(tmp_path)
    out = {}
    for sem in ("trt", "strict"):
        res = _cli(model, "--inputs", npz, "--out", tmp_path / sem, "--semantics", sem, "--report")
        assert res.exit_code == 0, res.output
        out[sem] = (res.output, json.loads((tmp_path / sem / "precision.json").read_text())["cost"])
    trt, strict = out["trt"][1], out["strict"][1]
    for key in ("all_fp16_s", "plan_s", "all_fp32_s", "slowdown", "plan_layers", "layers"):
        assert trt[key] == strict[key], key
    # the fused layer is priced under the name the table shows, and holds the plan's nodes
    assert trt["units"]["conv + bn"]["nodes"] == ["conv"]
    assert strict["units"]["conv + bn"]["nodes"] == ["conv", "bn"]
    for c in (trt, strict):  # the rows add up to the plan's slowdown
        rows = [u["share"] for u in c["units"].values()] + [c["boundary_casts_share"]]
        assert sum(rows) == pytest.approx(c["slowdown"], rel=1e-9)
        assert c["precision"] == "fp16" and c["all_low_s"] == c["all_fp16_s"]
    console = out["trt"][0]
    share = f"+{100 * trt['units']['conv + bn']['share']:.1f}%"
    assert any(line.startswith("│ conv") and share in line for line in console.splitlines())
    from trtbisect.search.cost import pct
    casts = pct(trt["boundary_casts_share"])  # the console's plan table adds up too
    assert any("boundary Casts" in line and casts in line for line in console.splitlines())
    assert "TensorRT layers in FP32" in console
    md = (tmp_path / "trt" / "report.md").read_text()
    assert share in md and "(boundary Casts)" in md


def test_bf16_runs_say_bf16(tmp_path):
    import json
    model, npz = conv_bn_mean(tmp_path)
    res = _cli(model, "--inputs", npz, "--out", tmp_path / "bf", "--precision", "bf16")
    assert res.exit_code in (0, 3), res.output
    c = json.loads((tmp_path / "bf" / "precision.json").read_text())["cost"]
    assert c["precision"] == "bf16" and "all_bf16_s" in c and "all_fp16_s" not in c
    assert "all BF16 " in res.output and "all FP16 " not in res.output
