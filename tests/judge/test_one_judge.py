"""One judge: what the search measures for a plan is, bit for bit, what `check` measures on the
file written for it; the all-FP32 plan is the FP32 reference; the weights are handled by
reference (external data); float16 models and op parameters are handled as data is not."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

from tests.conftest import save_zoo_model, x_to_y
from trtbisect.backends.ort import Emulator, MixedModel, Reference
from trtbisect.context import Options, prepare
from trtbisect.graph import Graph
from trtbisect.judge.compare import Tolerance, compare_outputs
from trtbisect.judge.mixed import mixed_model
from trtbisect.pipeline import check_mixed, run
from trtbisect.stages import written
from trtbisect.stages.evaluator import Evaluator
from trtbisect.stages.layerwise import layerwise

ZOO = ["layernorm_overflow", "reducesum_overflow", "attention_logits", "eps_underflow",
       "constant_out_of_range", "two_outputs", "precision_loss", "healthy"]


def plans_of(g: Graph, seed: int) -> list[frozenset[str]]:
    cands = g.candidates()
    rng = np.random.default_rng(seed)
    return [frozenset(), frozenset(cands),
            *(frozenset(c for c in cands if rng.random() < p) for p in (0.2, 0.5, 0.8))]


@pytest.mark.parametrize("name", ZOO)
def test_search_and_check_of_the_written_file_agree_bit_for_bit(zoo, tmp_path, name):
    z = zoo[name]
    g = Graph(z.model)
    emu = Emulator(g)
    for k, plan in enumerate(plans_of(g, 7)):
        path = tmp_path / f"plan{k}.onnx"
        mixed_model(g, plan).save(path)
        judged = MixedModel(Graph.from_path(path)).run(z.inputs)
        searched = emu.run(plan, z.inputs)
        for out, value in searched.items():
            np.testing.assert_array_equal(value, judged[out], err_msg=f"{name} plan {k} {out}")


def test_demo_plans_agree_bit_for_bit(tmp_path):
    from pathlib import Path
    root = Path(__file__).parents[2] / "models"
    g = Graph.from_path(root / "demo.onnx")
    x = dict(np.load(root / "demo_inputs.npz"))
    emu = Emulator(g)
    for k, plan in enumerate(plans_of(g, 3)):
        path = tmp_path / f"demo{k}.onnx"
        mixed_model(g, plan).save(path)
        judged = MixedModel(Graph.from_path(path)).run(x)
        for out, value in emu.run(plan, x).items():
            np.testing.assert_array_equal(value, judged[out])


@pytest.mark.parametrize("name", ["layernorm_overflow", "two_outputs", "attention_logits"])
def test_run_reports_exactly_what_check_says_of_its_file(zoo, tmp_path, name):
    z = zoo[name]
    model, inputs = save_zoo_model(z, tmp_path)
    r = run(model, Options.of(inputs=[str(inputs)]), tmp_path / "out")
    assert r.verdict == "fixed" and r.one_judge.search_equals_check
    checked = check_mixed(tmp_path / "out" / f"{name}.mixed.onnx", model,
                          Options.of(inputs=[str(inputs)]))
    plan = json.loads((tmp_path / "out" / "precision.json").read_text())
    for out, e in checked.errors.items():
        assert plan["errors_after"][out] == e.to_json()  # bit for bit, through JSON


def test_all_fp32_plan_is_the_reference_bit_for_bit(zoo):
    for name in ZOO:
        z = zoo[name]
        g = Graph(z.model)
        ref = Reference(g).run(z.inputs)
        got = Emulator(g, active=g.candidates()).run(frozenset(g.candidates()), z.inputs)
        for out, value in ref.items():
            np.testing.assert_array_equal(got[out], value, err_msg=name)


def _fragile_model() -> tuple[onnx.ModelProto, dict]:
    """y = x @ W with K=256: FP32 kernels that sum in another order differ by a few ulp, the
    noise floor; a tolerance set a hair above all-FP16's error leaves a margin below it."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 64)).astype(np.float32)
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [8, 256])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [8, 64])],
                     [numpy_helper.from_array(w, "w")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 10
    return m, {"x": rng.standard_normal((8, 256)).astype(np.float32) * 10}


def test_a_plan_within_the_noise_floor_is_not_called_fp16_ok(tmp_path):
    """All-FP16 passes the judge by less than the FP32 noise floor: the run aims inside the
    bound and returns a plan with margin (tests/judge/test_trust.py has the rest of the rule)."""
    m, x = _fragile_model()
    path = tmp_path / "mm.onnx"
    onnx.save(m, path)
    np.savez(tmp_path / "x.npz", **x)
    g = Graph(m)
    ref = Reference(g).run(x)
    # all-FP16 error, as a fraction of the output's range: set rtol a hair above it
    e = compare_outputs(ref, Emulator(g).run(frozenset(), x), Tolerance(0.0))["y"]
    tight = Options.of(inputs=[str(tmp_path / "x.npz")], tolerance=Tolerance(e.rel * (1 + 1e-6)))
    r = run(path, tight, tmp_path / "tight")
    assert r.verdict == "fixed" and r.fp32_nodes == ["mm"]
    margin = r.margins["y"]
    assert margin.margin > margin.spread >= margin.noise_floor > 0
    assert not margin.fragile
    assert json.loads((tmp_path / "tight" / "precision.json").read_text())["fragile"] is False
    loose = run(path, Options.of(inputs=[str(tmp_path / "x.npz")], tolerance=Tolerance(e.rel * 2)),
                tmp_path / "loose")
    assert loose.verdict == "fp16_ok" and loose.fragile is False


def _external_data_model(folder, blocks: int = 3, d: int = 256):
    """A MatMul stack whose weights live in an external data file, one planted overflow."""
    rng = np.random.default_rng(1)
    nodes, inits, x = [], [], "x"
    for i in range(blocks):
        scale = 600.0 if i == 1 else 1.0 / np.sqrt(d)
        inits.append(numpy_helper.from_array((rng.standard_normal((d, d)) * scale).astype(np.float32),
                                             f"w{i}"))
        nodes.append(h.make_node("MatMul", [x, f"w{i}"], [f"m{i}"], name=f"mm{i}"))
        nodes.append(h.make_node("Tanh" if i == 1 else "Relu", [f"m{i}"], [f"a{i}"], name=f"act{i}"))
        x = f"a{i}"
    g = h.make_graph(nodes, "ext", [h.make_tensor_value_info("x", TP.FLOAT, [4, d])],
                     [h.make_tensor_value_info(x, TP.FLOAT, [4, d])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 10
    path = folder / "ext.onnx"
    onnx.save(m, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.onnx.data", size_threshold=0)
    return path


def test_external_data_model_runs_by_reference_and_its_files_check(tmp_path):
    path = _external_data_model(tmp_path)
    raw = onnx.load(str(path), load_external_data=False)
    assert all(t.data_location == TP.EXTERNAL for t in raw.graph.initializer)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    r = run(path, Options.of(semantics="strict"), tmp_path / "out")
    assert r.verdict == "fixed" and r.fp32_nodes == ["mm1"]  # tanh(inf) is tanh(big): 1
    # trt: MatMul + Tanh are one layer (the count objective; --objective cost may keep the
    # first layer instead, which passes too and saves the input's Cast)
    fused = run(path, Options.of(objective="count"), tmp_path / "fused")
    assert fused.fp32_nodes == ["mm1", "act1"] and fused.one_judge.search_equals_check
    cheap = run(path, Options(), tmp_path / "cheap")
    assert cheap.fp32_nodes in (["mm0", "act0"], ["mm1", "act1"])
    assert cheap.one_judge.search_equals_check
    assert cheap.cost.plan_s <= fused.cost.plan_s
    assert r.one_judge.search_equals_check
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    assert check_mixed(tmp_path / "out" / "ext.mixed.onnx", path, Options.of(semantics="strict")).passed
    # the graph never pulled the weights into its proto: they are memory-mapped from the file
    g = Graph.from_path(path)
    assert isinstance(g.array("w0"), np.memmap)


def test_written_models_go_external_above_the_embed_limit(tmp_path, monkeypatch):
    from trtbisect.judge import mixed
    path = _external_data_model(tmp_path)
    monkeypatch.setattr(mixed, "EMBED_LIMIT", 1024)
    g = Graph.from_path(path)
    files = mixed_model(g, ["mm1", "act1"]).save(tmp_path / "m.onnx")
    assert [f.name for f in files] == ["m.onnx", "m.onnx.data"]
    x = {"x": np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)}
    a = MixedModel(Graph.from_path(tmp_path / "m.onnx")).run(x)
    b = Emulator(g).run(frozenset(["mm1", "act1"]), x)
    np.testing.assert_array_equal(a["a2"], b["a2"])
    onnx.checker.check_model(str(tmp_path / "m.onnx"))


def _fp16_model() -> tuple[onnx.ModelProto, dict]:
    """An all-FP16 export: float16 input, weights and output; x*x overflows in FP16."""
    w = numpy_helper.from_array(np.full((4,), 300.0, np.float16), "w")
    nodes = [h.make_node("Mul", ["x", "w"], ["xw"], name="scale"),
             h.make_node("Mul", ["xw", "xw"], ["sq"], name="square"),
             h.make_node("Sqrt", ["sq"], ["y"], name="root")]
    g = h.make_graph(nodes, "half", [h.make_tensor_value_info("x", TP.FLOAT16, [4])],
                     [h.make_tensor_value_info("y", TP.FLOAT16, [4])], [w])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 10
    return m, {"x": np.array([1, 2, 0.5, 3], np.float16)}


def test_float16_models_are_judged_against_their_fp32_upcast(tmp_path):
    m, x = _fp16_model()
    path = tmp_path / "half.onnx"
    onnx.save(m, path)
    np.savez(tmp_path / "x.npz", **x)
    opts = Options.of(inputs=[str(tmp_path / "x.npz")], semantics="strict")
    r = run(path, opts, tmp_path / "out")
    assert r.verdict == "fixed" and set(r.fp32_nodes) == {"square", "root"}
    assert r.one_judge.search_equals_check
    mixed = onnx.load(tmp_path / "out" / "half.mixed.onnx")
    assert mixed.graph.input[0].type.tensor_type.elem_type == TP.FLOAT16  # declared I/O kept
    assert mixed.graph.output[0].type.tensor_type.elem_type == TP.FLOAT16
    assert check_mixed(path, path, opts).passed is False  # the model as is: x*x overflows
    assert check_mixed(tmp_path / "out" / "half.mixed.onnx", path, opts).passed


def test_parameter_inputs_are_never_rounded_bicubic_resize(tmp_path):
    """ViT-style: position embeddings cast to float and resized bicubically to int64 sizes,
    with a float scale that FP16 cannot hold exactly; the parameters must not be rounded."""
    rng = np.random.default_rng(0)
    pos = numpy_helper.from_array(rng.standard_normal((1, 8, 7, 7)).astype(np.float16), "pos")
    sizes = numpy_helper.from_array(np.array([1, 8, 4, 4], np.int64), "sizes")
    roi = numpy_helper.from_array(np.array([], np.float32), "roi")
    nodes = [h.make_node("Cast", ["pos"], ["posf"], to=TP.FLOAT, name="cast"),
             h.make_node("Resize", ["posf", "roi", "", "sizes"], ["r"], name="resize",
                         mode="cubic"),
             h.make_node("Add", ["x", "r"], ["y"], name="add")]
    g = h.make_graph(nodes, "vit", [h.make_tensor_value_info("x", TP.FLOAT, [1, 8, 4, 4])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, 8, 4, 4])], [pos, sizes, roi])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 10
    graph = Graph(m)
    assert graph.fp16_inputs("resize") == ["posf"]  # roi is a parameter, not data
    path = tmp_path / "vit.onnx"
    onnx.save(m, path)
    r = run(path, Options(), tmp_path / "out")
    assert r.verdict == "fp16_ok" and r.one_judge.search_equals_check


def test_internal_names_never_collide_with_the_models(tmp_path):
    """Names the emulator adds are built on a separator no model name contains."""
    nodes = [h.make_node("Mul", ["x", "x"], ["~tb:r1"], name="~tb:fp16:sq"),
             h.make_node("Add", ["~tb:r1", "x"], ["trtbisect_fp16_0"], name="add"),
             h.make_node("Identity", ["trtbisect_fp16_0"], ["y"], name="id")]
    x = {"x": np.array([300.0, 2.0, 3.0], np.float32)}
    graph = Graph(x_to_y(nodes, 3))
    emu = Emulator(graph, active=graph.candidates())
    assert np.isinf(emu.run(frozenset(), x)["y"][0])
    np.testing.assert_array_equal(emu.run(frozenset(graph.candidates()), x)["y"],
                                  Reference(graph).run(x)["y"])


def test_a_float16_models_fused_layers_are_the_same_to_the_search_and_to_check(tmp_path,
                                                                               monkeypatch):
    """Under trt, x*x -> sqrt of a float16 model is one PWN layer whose x*x (8.1e5) stays in
    the kernel. The search's emulator must find that layer as check finds it in the written
    file: the emulator-first verdict, the file's verdict and the layer-wise statistics agree."""
    from trtbisect import pipeline
    m, x = _fp16_model()
    path = tmp_path / "half.onnx"
    onnx.save(m, path)
    np.savez(tmp_path / "x.npz", **x)
    opts = Options.of(inputs=[str(tmp_path / "x.npz")])
    file_first = run(path, opts, tmp_path / "a")
    assert file_first.verdict == "fp16_ok"
    monkeypatch.setattr(pipeline, "FILE_FIRST_WEIGHT_BYTES", -1)  # the emulator decides first
    emulator_first = run(path, opts, tmp_path / "b")
    assert emulator_first.verdict == "fp16_ok"
    assert emulator_first.one_judge.search_equals_check
    assert {k: e.to_json() for k, e in emulator_first.errors_before.items()} == \
        {k: e.to_json() for k, e in file_first.errors_before.items()}
    ctx = prepare(path, opts)
    emu_stats = layerwise(ctx, opts.judge, opts.search)  # the FP16 side from the search's emulator
    monkeypatch.setattr(pipeline, "FILE_FIRST_WEIGHT_BYTES", 1 << 30)
    with_report = run(path, Options.of(inputs=[str(tmp_path / "x.npz")], report=True), tmp_path / "c")
    assert {k: s.to_json() for k, s in with_report.stats.items()} == \
        {k: s.to_json() for k, s in emu_stats.items()}  # first batch's FP16 side: the file's
    assert emu_stats["sq"].fp16_nonfinite == 0  # inside the layer: never stored in FP16


def _trt_cases():
    from tests.models.make_models import deep_model, zoo
    from tests.models.semantics_models import planted
    cases = {f"planted/{n}": (p.model, p.inputs) for n, p in planted().items()}
    cases.update({n: (zoo()[n].model, zoo()[n].inputs) for n in ("layernorm_overflow",
                                                                  "constant_out_of_range")})
    d = deep_model(blocks=4, overflow_blocks=(1,))
    cases["deep_4"] = (d.model, d.inputs)
    cases["float16"] = _fp16_model()
    return cases


TRT_CASES = _trt_cases()


@pytest.mark.parametrize("name", sorted(TRT_CASES))
@pytest.mark.parametrize("kernels", ["plain", "tf32+fp16-accumulate"])
def test_trt_semantics_search_and_written_file_agree_for_random_unit_plans(tmp_path, name,
                                                                           kernels):
    """Under trt semantics (fused layers, folded constants, BatchNorm as scale/shift), with
    and without TF32 and FP16 accumulation: the search's numbers for a plan of whole units
    are, bit for bit, those of the judge of its written file."""
    from trtbisect.judge import semantics
    model, inputs = TRT_CASES[name]
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    np.savez(tmp_path / "x.npz", **inputs)
    odd = kernels != "plain"
    opts = Options.of(inputs=[str(tmp_path / "x.npz")], tf32=odd, fp16_accumulate=odd)
    ctx = prepare(path, opts)
    ev = Evaluator(ctx, opts.judge, {}, None)
    units = list(semantics.units(ctx.prepared, ctx.judged.candidates()).values())
    rng = np.random.default_rng(5)
    plans = [frozenset(), frozenset(n for u in units for n in u),
             *(frozenset(n for u in units if rng.random() < p for n in u) for p in (0.3, 0.7))]
    for plan in plans:
        searched = written.worst_of(ev.measure(plan)[1])
        checked = written.write_and_judge(ctx, opts.judge, plan, None).checked.errors
        assert {o: written.bits(e) for o, e in checked.items()} == \
            {o: written.bits(searched[o]) for o in checked}, (name, sorted(plan))
