"""Every node judged (issue #26): nodes inside If branches, Loop and Scan bodies (any depth)
and model-local functions are candidates with qualified names, rounded by the emulator,
searched, written into the mixed model (outer-scope references valid, full_check), and judged
by `check` bit for bit as the search measured them. Their names: tests/graph/test_names.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.models.control_flow_models import Planted, all_planted
from trtbisect.backends.ort import Emulator, MixedModel, Reference
from trtbisect.context import Options
from trtbisect.graph import Graph, with_node_names
from trtbisect.judge.compare import Tolerance
from trtbisect.judge.loadable import checker_problem, runtime_problem
from trtbisect.judge.mixed import mixed_model
from trtbisect.pipeline import check_mixed, run

PLANTED = all_planted()
SUBGRAPHS = ["if_taken_branch", "if_other_branch", "nested_if", "loop_third_trip", "scan_rows",
             "if_branch_constant_weight", "if_untyped_branch_outputs"]
CONTROL_FLOW = [*SUBGRAPHS, "local_function"]


def _save(p: Planted, folder) -> tuple[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    model, inputs = folder / f"{p.name}.onnx", folder / f"{p.name}_inputs.npz"
    onnx.save(p.model, model)
    np.savez(inputs, **p.inputs)
    return str(model), str(inputs)


def _plans(g: Graph, seed: int) -> list[frozenset[str]]:
    cands = g.candidates()
    rng = np.random.default_rng(seed)
    return [frozenset(), frozenset(cands),
            *(frozenset(c for c in cands if rng.random() < p) for p in (0.3, 0.6))]


@pytest.mark.parametrize("name", CONTROL_FLOW)
def test_the_emulator_rounds_inside_subgraphs(name):
    p = PLANTED[name]
    g = Graph(p.model)
    ref = Reference(g).run(p.inputs)
    emu = Emulator(g)
    half = emu.run(frozenset(), p.inputs)
    planted_out = any(not np.isfinite(v).all() for v in half.values())
    assert planted_out == bool(p.strict)  # an inf from inside a body reaches the output
    fixed = emu.run(p.strict, p.inputs)
    assert all(np.isfinite(v).all() for v in fixed.values())
    full = emu.run(frozenset(g.candidates()), p.inputs)
    for out, value in ref.items():  # all-FP32 is the reference, bit for bit
        np.testing.assert_array_equal(full[out], value)


@pytest.mark.parametrize("name", CONTROL_FLOW)
def test_switching_inside_subgraphs_equals_static_plans_bit_for_bit(name):
    p = PLANTED[name]
    g = Graph(p.model)
    switched = Emulator(g, active=g.candidates())  # every node an If of its own
    for k, plan in enumerate(_plans(g, 5)):
        static = Emulator(g).run(plan, p.inputs)
        for out, value in switched.run(plan, p.inputs).items():
            np.testing.assert_array_equal(value, static[out], err_msg=f"plan {k} {out}")


@pytest.mark.parametrize("name", CONTROL_FLOW)
def test_written_plans_pass_full_check_and_judge_as_searched(name, tmp_path):
    p = PLANTED[name]
    g = Graph(p.model)
    emu = Emulator(g)
    for k, plan in enumerate(_plans(g, 11)):
        path = tmp_path / f"plan{k}.onnx"
        mixed_model(g, plan).save(path)
        onnx.checker.check_model(onnx.load(path), full_check=True)
        written = Graph.from_path(path)
        assert set(g.candidates()) <= set(written.names)  # the file keeps the plan's names
        judged = MixedModel(written).run(p.inputs)
        for out, value in emu.run(plan, p.inputs).items():
            np.testing.assert_array_equal(value, judged[out], err_msg=f"plan {k} {out}")


def test_precision_casts_go_inside_the_subgraph():
    p = PLANTED["loop_third_trip"]
    g = Graph(p.model)
    m = mixed_model(g, p.strict).materialize()
    body = m.graph.node[0].attribute[0].g
    ops = [n.op_type for n in body.node]
    assert "Cast" in ops  # the FP32 square reads the FP16 state, the FP16 grow its root
    assert {n.name for n in body.node} >= {"loop[body]/square", "loop[body]/root"}
    types = {v.name: v.type.tensor_type.elem_type for v in body.output}
    assert types["v_out"] == onnx.TensorProto.FLOAT  # the Loop keeps its declared type


@pytest.mark.parametrize("semantics", ["strict", "trt"])
@pytest.mark.parametrize("name", CONTROL_FLOW)
def test_run_finds_the_exact_set_and_check_agrees(name, semantics, tmp_path):
    p = PLANTED[name]
    model, inputs = _save(p, tmp_path)
    opts = Options.of(inputs=[inputs], semantics=semantics)
    r = run(model, opts, tmp_path / "out")
    want = p.strict if semantics == "strict" else p.trt
    assert set(r.fp32_nodes) == want
    assert r.verdict == ("fixed" if want else "fp16_ok")
    assert r.one_judge.search_equals_check
    mixed = tmp_path / "out" / f"{p.name}.mixed.onnx"
    written = sorted((tmp_path / "out").glob("*.onnx"))
    assert mixed in written
    for f in written:  # every file holds outside the run: the checker and ONNX Runtime take it
        assert checker_problem(f) is None, f.name
        assert runtime_problem(f) is None, f.name
    checked = check_mixed(mixed, model, opts)
    plan = json.loads((tmp_path / "out" / "precision.json").read_text())
    assert checked.passed
    for out, e in checked.errors.items():
        assert plan["errors_after"][out] == e.to_json()  # bit for bit, through JSON


# ------------------------------------------------------------------ never a silent "FP16 is fine"

def test_a_contrib_op_is_listed_as_unjudged_and_as_unsupported_by_tensorrt():
    from trtbisect.stages import coverage

    g = Graph(PLANTED["contrib_fused_matmul"].model)
    assert g.types["mm"] == onnx.TensorProto.FLOAT  # typed past the op onnx does not know
    (u,) = coverage.unjudged(g)
    assert (u.op, u.domain, u.nodes) == ("FusedMatMul", "com.microsoft", ("fused_mm",))
    (t,) = coverage.trt_unsupported(g)
    assert t.op == "FusedMatMul" and "plugin" in t.why and "without" in t.fix
    for name in SUBGRAPHS:  # control flow is judged, and TensorRT imports it
        g = Graph(PLANTED[name].model)
        assert coverage.unjudged(g) == [] and coverage.trt_unsupported(g) == []


@pytest.mark.parametrize("semantics", ["strict", "trt"])
def test_a_fixed_plan_around_a_contrib_op_is_partial(semantics, tmp_path):
    p = PLANTED["contrib_fused_matmul"]
    model, inputs = _save(p, tmp_path)
    r = run(model, Options.of(inputs=[inputs], semantics=semantics), tmp_path / "out")
    assert r.verdict == "partial" and r.exit_code == 5
    assert set(r.fp32_nodes) == (p.strict if semantics == "strict" else p.trt)
    plan = json.loads((tmp_path / "out" / "precision.json").read_text())
    assert plan["verdict"] == "partial" and plan["partial"]["judged_verdict"] == "fixed"
    (u,) = plan["coverage"]["unjudged"]
    assert (u["op"], u["domain"], u["count"]) == ("FusedMatMul", "com.microsoft", 1)
    assert plan["coverage"]["tensorrt_unsupported"][0]["op"] == "FusedMatMul"
    assert (tmp_path / "out" / f"{p.name}.mixed.onnx").is_file()  # the plan is still written
    checked = check_mixed(tmp_path / "out" / f"{p.name}.mixed.onnx", model,
                          Options.of(inputs=[inputs], semantics=semantics))
    assert checked.passed and checked.exit_code == 5 and checked.unjudged[0].op == "FusedMatMul"


def test_fp16_fine_around_a_contrib_op_is_never_called_fine(tmp_path):
    """Without the overflow, all-FP16 passes on what was judged: the verdict says partial,
    never fp16_ok, and the CLI exits 5."""
    import subprocess
    import sys

    p = PLANTED["contrib_fused_matmul"]
    m = onnx.ModelProto()
    m.CopyFrom(p.model)
    for t in m.graph.initializer:
        if t.name in ("huge", "tiny"):
            t.CopyFrom(onnx.numpy_helper.from_array(np.array(0.5, np.float32), t.name))
    model, inputs = _save(Planted(p.name, m, p.inputs, frozenset(), frozenset(), ""), tmp_path)
    r = run(model, Options.of(inputs=[inputs]), tmp_path / "out")
    assert r.verdict == "partial" and r.partial.judged_verdict == "fp16_ok"
    cli = subprocess.run([sys.executable, "-m", "trtbisect", "run", model, "--inputs", inputs,
                          "--out", str(tmp_path / "cli")], capture_output=True, text=True)
    assert cli.returncode == 5, cli.stderr
    assert "partial" in cli.stdout and "FusedMatMul" in cli.stdout
    assert "FP16 already meets the tolerance" not in cli.stdout
    assert "TensorRT's ONNX parser" in cli.stderr  # reported before the search


def test_coverage_counts_the_nodes_judged_in_subgraphs(tmp_path):
    p = PLANTED["nested_if"]
    model, inputs = _save(p, tmp_path)
    plan = run(model, Options.of(inputs=[inputs]), tmp_path / "out").to_json()
    g = Graph(p.model)
    assert plan["coverage"]["judged"] == len(g.candidates())
    assert plan["coverage"]["judged_in_subgraphs"] == sum(map(g.is_inner, g.candidates())) == 11


# ------------------------------------------------------------------------------ renderings

def test_renderings_name_subgraph_nodes_or_say_they_cannot(tmp_path):
    p = PLANTED["if_taken_branch"]
    model, inputs = _save(p, tmp_path)
    r = run(model, Options.of(inputs=[inputs]), tmp_path / "out")
    plan = json.loads((tmp_path / "out" / "precision.json").read_text())
    rend = plan["renderings"]
    # TensorRT names each layer after its node: the named model carries the qualified names
    named = onnx.load(plan["files"]["named_model"])
    then = next(a.g for a in named.graph.node[3].attribute if a.name == "then_branch")
    assert {n.name for n in then.node} >= set(r.fp32_nodes)
    assert rend["trtexec_layer_precisions"] == ",".join(f"{n}:fp32" for n in r.fp32_nodes)
    for n in r.fp32_nodes:
        assert f"{n}:float32" in rend["polygraphy"] and json.dumps(n) in rend["tensorrt_python"]
    # AutoCast keeps subgraph nodes in FP32: the file says so, and how the plan is judged
    for key in ("autocast", "autocast_python"):
        assert "cannot run the plan's" in rend[key] and ".mixed.onnx" in rend[key]
    commands = (tmp_path / "out" / "commands.sh").read_text()
    assert "AutoCast 0.47 keeps If/Loop/Scan subgraph nodes in FP32" in commands


@pytest.mark.slow
def test_autocast_keeps_subgraph_nodes_in_fp32_as_the_rendering_says(tmp_path):
    pytest.importorskip("modelopt.onnx.autocast")
    from modelopt.onnx.autocast import convert_to_mixed_precision

    from trtbisect.outputs.render import autocast_patterns

    p = PLANTED["if_taken_branch"]
    path = tmp_path / "named.onnx"
    onnx.save(with_node_names(p.model), path)
    np.savez(tmp_path / "x.npz", **p.inputs)
    out = convert_to_mixed_precision(str(path), low_precision_type="fp16",
                                     nodes_to_exclude=autocast_patterns(sorted(p.strict)),
                                     data_max=float("inf"), init_max=float("inf"),
                                     keep_io_types=True, calibration_data=str(tmp_path / "x.npz"))
    branch = next(n for n in out.graph.node if n.op_type == "If")
    for a in branch.attribute:  # no precision Cast inside: every branch node stays FP32
        assert "Cast" not in {n.op_type for n in a.g.node}


@pytest.mark.parametrize("semantics", ["strict", "trt"])
def test_a_weight_inside_a_branch_follows_the_weight_rule(semantics, tmp_path):
    """A branch's Constant weight of 7e4: per-node casting makes it inf (strict), TensorRT 10
    clamps it to 65504 (trt); either way the written file holds what the judge read."""
    p = PLANTED["if_branch_constant_weight"]
    model, inputs = _save(p, tmp_path)
    opts = Options.of(inputs=[inputs], semantics=semantics, tolerance=Tolerance(rtol=0.1))
    r = run(model, opts, tmp_path / "out")
    want = p.strict if semantics == "strict" else set()
    assert set(r.fp32_nodes) == want and r.verdict == ("fixed" if want else "fp16_ok")
    assert r.one_judge.search_equals_check
    if semantics == "trt":  # all-FP16 is off by 70000 - 65504 times x/1000 (FP16 noise aside)
        assert r.errors_after["y"].max_abs == pytest.approx(
            np.abs(p.inputs["x"] * 1e-3).max() * (7e4 - 65504), rel=0.02)
    mixed = onnx.load(tmp_path / "out" / f"{p.name}.mixed.onnx")
    onnx.checker.check_model(mixed, full_check=True)


def test_the_report_shows_subgraph_culprits_and_coverage(tmp_path):
    pytest.importorskip("matplotlib")
    p = PLANTED["nested_if"]
    model, inputs = _save(p, tmp_path)
    r = run(model, Options.of(inputs=[inputs], report=True), tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    for n in r.fp32_nodes:
        assert n in md
    assert "11 of them inside If/Loop/Scan subgraphs" in md
    groups = r.culprit_groups
    assert groups and groups[0].cause == "overflow"  # the layer-wise pass saw inside


def test_a_culprit_inside_a_pytorch_branch_keeps_its_module(tmp_path):
    """The module map reads a subgraph node's own (exporter's) name, not its qualified one."""
    p = PLANTED["if_taken_branch"]
    m = onnx.ModelProto()
    m.CopyFrom(p.model)
    then = next(a.g for a in m.graph.node[3].attribute if a.name == "then_branch")
    for n in then.node:
        n.name = f"/net/head/{n.name}"
    model, inputs = _save(Planted(p.name, m, p.inputs, frozenset(), frozenset(), ""), tmp_path)
    r = run(model, Options.of(inputs=[inputs]), tmp_path / "out")
    assert {c.node for c in r.culprits} == {"branch[then_branch]/net/head/square",
                                            "branch[then_branch]/net/head/root"}
    assert {c.module for c in r.culprits} == {"net.head"}


def test_default_domain_ops_without_fp16_or_importer_are_listed():
    """Celu's schema takes float only: every FP16 file computes it in FP32, as the judge does,
    so it is listed as judged in FP32 (tests/stages/test_fp32_by_schema.py), not unjudged."""
    from trtbisect.stages import coverage

    nodes = [onnx.helper.make_node("Celu", ["x"], ["c"], name="celu"),  # float only: no FP16
             onnx.helper.make_node("Relu", ["c"], ["r"], name="relu"),
             onnx.helper.make_node("Det", ["r"], ["y"], name="det")]  # no TensorRT importer
    g = Graph(onnx.helper.make_model(
        onnx.helper.make_graph(nodes, "g", [onnx.helper.make_tensor_value_info("x", 1, [3, 3])],
                               [onnx.helper.make_tensor_value_info("y", 1, [])]),
        opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=10))
    assert coverage.unjudged(g) == []
    (k,) = coverage.kept_fp32(g)
    assert (k.op, k.nodes) == ("Celu", ("celu",)) and "no float16" in k.why
    (t,) = coverage.trt_unsupported(g)
    assert (t.op, t.nodes) == ("Det", ("det",)) and "unsupported" in t.why and t.fix
    assert "relu" in g.candidates() and "det" in g.candidates()


SILERO = Path(__file__).resolve().parents[2] / ".bench_cache" / "models"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["silero_vad_if", "silero_vad_op15"])
def test_the_silero_if_models_are_judged_and_written_whole(name, tmp_path):
    """The real files of issue #26 (scripts/fetch_models.py; skipped when not fetched): every
    branch node judged, the written file valid (outer-scope weights kept) and judged alike."""
    path = SILERO / f"{name}.onnx"
    if not path.is_file():
        pytest.skip(f"run `python scripts/fetch_models.py {name}` first")
    rng = np.random.default_rng(0)
    sample = {"input": (0.1 * rng.standard_normal((1, 576))).astype(np.float32),
              "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)}
    np.savez(tmp_path / "x.npz", **sample)
    g = Graph.from_path(path)
    assert sum(map(g.is_inner, g.candidates())) == {"silero_vad_if": 218,
                                                    "silero_vad_op15": 78}[name]
    r = run(path, Options.of(inputs=[str(tmp_path / "x.npz")], tolerance=Tolerance(rtol=1e-3)),
            tmp_path / "out")
    assert r.verdict == "fixed" and r.one_judge.search_equals_check
    assert name != "silero_vad_if" or any(g.is_inner(n) for n in r.fp32_nodes)  # all inside
    mixed = tmp_path / "out" / f"{name}.mixed.onnx"
    onnx.checker.check_model(onnx.load(mixed), full_check=True)
    for f in (tmp_path / "out").glob("*.onnx"):
        assert checker_problem(f) is None and runtime_problem(f) is None, f.name


@pytest.mark.slow
@pytest.mark.parametrize("semantics", ["trt", "strict"])
def test_silero_streamed_at_1e4_writes_files_every_runtime_loads(semantics, tmp_path):
    """Issue #32's case: silero_vad.onnx on 4 streamed chunks at --rtol 1e-4 wrote a mixed
    file whose If branches disagreed on a type (an untyped branch output FP16 in one branch,
    FP32 in the other) while `check` said pass."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from bench_control_flow import stream_samples

    path = SILERO / "silero_vad_if.onnx"
    if not path.is_file():
        pytest.skip("run `python scripts/fetch_models.py silero_vad_if` first")
    inputs = []
    for k, s in enumerate(stream_samples(path)):
        np.savez(tmp_path / f"chunk{k}.npz", **s)
        inputs.append(str(tmp_path / f"chunk{k}.npz"))
    r = run(path, Options.of(inputs=inputs, tolerance=Tolerance(rtol=1e-4), semantics=semantics),
            tmp_path / "out")
    assert r.verdict == "fixed" and r.certificate.certified
    for f in (tmp_path / "out").glob("*.onnx"):
        assert checker_problem(f) is None and runtime_problem(f) is None, f.name
