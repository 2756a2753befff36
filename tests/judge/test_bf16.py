"""`--precision bf16` end to end (#24): planted faults in both directions (an overflow FP16
fails and BF16 holds; a precision loss BF16 fails and FP16 holds), diagnosis in BF16's words,
the one judge in BF16 (the run's numbers == `check` of its written bfloat16 file, bit for bit),
a model that is itself bfloat16-typed, and the renderings' BF16 flags."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from trtbisect.cli import main
from trtbisect.context import Options, prepare
from trtbisect.judge.precision import BF16
from trtbisect.outputs import render
from trtbisect.pipeline import check_mixed, run
from trtbisect.rewrites.rules import REWRITES, rewrites_for
from trtbisect.stages.evaluator import Evaluator
from trtbisect.stages.layerwise import layerwise


def _save(tmp: Path, name: str, model: onnx.ModelProto, **inputs: np.ndarray) -> tuple[Path, Path]:
    model.ir_version = 8
    path, data = tmp / f"{name}.onnx", tmp / f"{name}_in.npz"
    onnx.save(model, path)
    np.savez(data, **inputs)
    return path, data


def squares(tmp: Path) -> tuple[Path, Path]:
    """rms = sqrt(mean(x*x)) of x up to 300: x*x = 9e4 overflows FP16 (65504), not BF16."""
    g = h.make_graph([h.make_node("Mul", ["x", "x"], ["sq"], name="sq"),
                      h.make_node("ReduceMean", ["sq"], ["m"], name="mean", axes=[1]),
                      h.make_node("Sqrt", ["m"], ["y"], name="root")], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [4, 16])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [4, 1])])
    x = np.random.default_rng(0).uniform(-300, 300, (4, 16)).astype(np.float32)
    return _save(tmp, "squares", h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), x=x)


def differences(tmp: Path) -> tuple[Path, Path]:
    """y = 2 * (x_i - x_{i+8}) for x = 8 + U(0, 1): a small difference of large numbers. At 8
    FP16's spacing is 2^-7 (error well under 1% of y's range), BF16's 2^-4 (about 6%)."""
    w = np.zeros((16, 8), np.float32)
    for i in range(8):
        w[i, i], w[i + 8, i] = 1.0, -1.0
    g = h.make_graph([h.make_node("MatMul", ["x", "W"], ["d"], name="diff"),
                      h.make_node("Mul", ["d", "two"], ["y"], name="double")], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [4, 16])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [4, 8])],
                     [nh.from_array(w, "W"), nh.from_array(np.float32([2.0]), "two")])
    x = (8 + np.random.default_rng(0).uniform(0, 1, (4, 16))).astype(np.float32)
    return _save(tmp, "differences", h.make_model(g, opset_imports=[h.make_opsetid("", 13)]),
                 x=x)


def _types(path: Path) -> set[int]:
    m = onnx.load(path)
    return ({t.data_type for t in m.graph.initializer}
            | {a.i for n in m.graph.node if n.op_type == "Cast" for a in n.attribute})


def _one_judge(out: Path, model: Path, inputs: Path, precision: str) -> dict:
    """precision.json, after asserting its errors are what `check` says of its file."""
    plan = json.loads((out / "precision.json").read_text())
    mixed = out / f"{model.stem}.mixed.onnx"
    checked = check_mixed(mixed, model, Options.of(inputs=[str(inputs)], precision=precision))
    assert checked.errors and checked.passed
    for name, e in checked.errors.items():
        assert plan["errors_after"][name] == e.to_json()  # bit for bit, through JSON
    return plan


def test_an_fp16_overflow_holds_in_bf16(tmp_path):
    model, inputs = squares(tmp_path)
    fp16 = run(model, Options.of(inputs=[str(inputs)]), tmp_path / "fp16")
    assert fp16.verdict == "fixed" and "sq" in fp16.fp32_nodes
    assert fp16.culprit_groups[0].cause == "overflow"
    bf16 = run(model, Options.of(inputs=[str(inputs)], precision="bf16"), tmp_path / "bf16")
    assert bf16.verdict == "fp16_ok" and bf16.fp32_nodes == []  # the verdict's stable name
    plan = _one_judge(tmp_path / "bf16", model, inputs, "bf16")
    assert plan["precision"]["name"] == "bf16" and "bf16_rounding" in plan["semantics"]["rules"]
    assert TP.BFLOAT16 in _types(tmp_path / "bf16" / "squares.mixed.onnx")
    assert TP.FLOAT16 not in _types(tmp_path / "bf16" / "squares.mixed.onnx")


def test_a_precision_loss_fp16_holds_fails_in_bf16_and_is_said_in_bf16s_words(tmp_path):
    model, inputs = differences(tmp_path)
    fp16 = run(model, Options.of(inputs=[str(inputs)]), tmp_path / "fp16")
    assert fp16.verdict == "fp16_ok"
    bf16 = run(model, Options.of(inputs=[str(inputs)], precision="bf16"), tmp_path / "bf16")
    assert bf16.verdict == "fixed" and "diff" in bf16.fp32_nodes
    assert bf16.one_judge.search_equals_check
    plan = _one_judge(tmp_path / "bf16", model, inputs, "bf16")
    (group,) = plan["culprit_groups"]
    assert group["cause"] == "precision_loss"
    assert group["evidence"]["bf16_spacing"] > 0 and "fp16_spacing" not in group["evidence"]
    assert "BF16 keeps 8 significant bits" in group["summary"] and "2^-8" in group["summary"]
    assert "spacing 0.0625 at" in group["summary"]  # BF16's spacing at the inputs (8 to 9)
    assert "FP16" not in group["summary"] and "65504" not in group["summary"]
    assert all("BF16" in c["why"] for c in plan["culprits"])


def test_bf16_diagnosis_offers_no_fp16_range_fixes_and_no_range_rewrites():
    from trtbisect.diagnosis.wording import RANGE_FIXES
    assert {"scale_before_matmul", "mean_before_sum", "clamp_mask_fill"} <= RANGE_FIXES
    kept = {r.name for r in rewrites_for(BF16.narrow_range)}
    assert rewrites_for(True) == REWRITES and kept and kept < {r.name for r in REWRITES}
    assert all("norm" in name for name in kept)  # the fused norms change how, not where


def test_bf16_range_fixes_vanish_from_a_diagnosis(tmp_path):
    """The same overflow diagnosed as if BF16 had judged it (numbers over BF16's range are
    impossible here, so the words are checked on the fix list of an FP16-sized overflow)."""
    from trtbisect.diagnosis.diagnose import diagnose
    from trtbisect.graph import Graph
    from trtbisect.search.prior import constant_stats
    model, inputs = squares(tmp_path)
    opts = Options.of(inputs=[str(inputs)])
    ctx = prepare(model, opts)
    stats = layerwise(ctx, opts.judge, opts.search)
    g = Graph.from_path(model)
    fp16 = diagnose(g, ["sq", "mean"], stats, constant_stats(g))
    assert any(f.kind == "prescale_norm" for f in fp16[0].fixes)
    bf16 = diagnose(g, ["sq", "mean"], stats, constant_stats(g), precision=BF16)
    assert not any(f.kind == "prescale_norm" for f in bf16[0].fixes)


def test_one_judge_in_bf16_for_random_unit_plans_under_trt_semantics(tmp_path):
    """The trt-semantics cases of the FP16 one-judge test, in BF16 (TF32 on and off)."""
    from tests.judge.test_one_judge import TRT_CASES
    from trtbisect.judge import semantics
    from trtbisect.stages import written as judge_written
    for name in sorted(TRT_CASES):
        model, inputs = TRT_CASES[name]
        path = tmp_path / "m.onnx"
        onnx.save(model, path)
        np.savez(tmp_path / "x.npz", **inputs)
        for tf32 in (False, True):
            opts = Options.of(inputs=[str(tmp_path / "x.npz")], tf32=tf32, precision="bf16")
            ctx = prepare(path, opts)
            ev = Evaluator(ctx, opts.judge, {}, None)
            units = list(semantics.units(ctx.prepared, ctx.judged.candidates()).values())
            rng = np.random.default_rng(5)
            plans = [frozenset(), *(frozenset(n for u in units if rng.random() < p for n in u)
                                    for p in (0.3, 0.7))]
            for plan in plans:
                searched = judge_written.worst_of(ev.measure(plan)[1])
                checked = judge_written.write_and_judge(ctx, opts.judge, plan, None).checked.errors
                assert {o: judge_written.bits(e) for o, e in checked.items()} == \
                    {o: judge_written.bits(searched[o]) for o in checked}, (name, sorted(plan))
            ev.close()


def bfloat16_model(tmp: Path) -> Path:
    """A model held back in bfloat16: its input, weight and output are bfloat16."""
    w = np.random.default_rng(1).normal(0, 1, (16, 8)).astype(np.float32)
    wb = h.make_tensor("W", TP.BFLOAT16, w.shape,
                       w.astype(ml_dtypes.bfloat16).view(np.uint16).flatten().tolist())
    g = h.make_graph([h.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g",
                     [h.make_tensor_value_info("x", TP.BFLOAT16, [4, 16])],
                     [h.make_tensor_value_info("y", TP.BFLOAT16, [4, 8])], [wb])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, tmp / "held.onnx")
    return tmp / "held.onnx"


def test_a_bfloat16_typed_model_runs_compares_and_checks(tmp_path):
    model = bfloat16_model(tmp_path)
    r = run(model, Options.of(precision="bf16"), tmp_path / "out")
    assert r.verdict in ("fp16_ok", "fixed")
    assert check_mixed(tmp_path / "out" / "held.mixed.onnx", model,
                       Options.of(precision="bf16")).errors
    cli = CliRunner()
    done = cli.invoke(main, ["compare", str(model), "--precision", "bf16", "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["tensors"]
    assert json.loads(done.output)["summary"]["precision"] == "bf16"
    done = cli.invoke(main, ["check", str(tmp_path / "out" / "held.mixed.onnx"), "--reference",
                             str(model), "--precision", "bf16"])
    assert done.exit_code == 0 and "bfloat16 tensors" in done.output, done.output


def test_check_refuses_a_file_of_the_other_precision_and_both_outside_run(tmp_path):
    model, inputs = squares(tmp_path)
    run(model, Options.of(inputs=[str(inputs)]), tmp_path / "fp16")
    cli = CliRunner()
    done = cli.invoke(main, ["check", str(tmp_path / "fp16" / "squares.mixed.onnx"),
                             "--reference", str(model), "--inputs", str(inputs),
                             "--precision", "bf16"])
    assert done.exit_code == 2 and "holds fp16 tensors, not bf16" in done.output
    done = cli.invoke(main, ["compare", str(model), "--precision", "both"])
    # compare does not offer `both` (its --help neither): click refuses it, one line
    assert done.exit_code == 2 and "'both' is not one of 'fp16', 'bf16'" in done.output
    done = cli.invoke(main, ["run", str(model), "--precision", "bf16", "--fp16-accumulate",
                             "--out", str(tmp_path / "acc")])
    assert done.exit_code == 2 and "accumulate in FP32" in done.output


def test_bf16_renderings_use_each_tools_bf16_words(tmp_path):
    ctx = render.RenderContext(model="m.onnx", mixed_model="m.mixed.onnx", engine_stem="m",
                               precision="bf16")
    rs = render.render_all(["a"], ctx)
    assert "--bf16" in rs["trtexec_trt10"].text.split() and "--fp16" not in rs["trtexec_trt10"].text
    assert "--bf16" in rs["polygraphy"].text.split() and "BF16" in rs["polygraphy"].title
    assert "--low_precision_type=bf16" in rs["autocast"].text
    assert 'low_precision_type="bf16"' in rs["autocast_python"].text
    assert "--precision" not in rs["autocast"].text  # judge_args carry it (pipeline), not here
    snippet = rs["tensorrt_python"].text
    assert "trt.BuilderFlag.BF16" in snippet and "trt.bfloat16" in snippet
    assert "FP16)" not in snippet and "m.bf16.plan" in snippet
    from tests.backends.test_trt_surface import module_chains, resolves
    from trtbisect.backends import trt_surface
    bad = [c for _, c in module_chains(snippet) if not resolves(trt_surface.load("10.13"), c)]
    assert not bad
    fp16 = render.render_all(["a"], render.RenderContext(model="m.onnx"))
    assert "--fp16" in fp16["trtexec_trt10"].text.split()  # the default is unchanged
    poly = Path(sys.executable).parent / "polygraphy"
    if poly.exists():  # polygraphy 0.53.6 (dev extra) has the flag the rendering uses
        helptext = subprocess.run([str(poly), "run", "--help"], capture_output=True,
                                  text=True).stdout
        assert "--bf16" in helptext


def test_the_run_writes_check_lines_that_judge_in_bf16(tmp_path):
    model, inputs = differences(tmp_path)
    run(model, Options.of(inputs=[str(inputs)], precision="bf16"), tmp_path / "out")
    plan = json.loads((tmp_path / "out" / "precision.json").read_text())
    commands = (tmp_path / "out" / "commands.sh").read_text()
    assert "--bf16" in commands and "--precision bf16" in commands
    assert "--low_precision_type=bf16" in plan["renderings"]["autocast"]


def test_run_precision_both_judges_each_and_shows_them_side_by_side(tmp_path):
    """Two independent runs in <out>/fp16 and <out>/bf16 (each its own one judge), the table
    on stdout, in --json and in precisions.md; exit 0 when either precision has a plan."""
    model, inputs = differences(tmp_path)
    out = tmp_path / "both"
    cli = CliRunner()
    done = cli.invoke(main, ["-q", "run", str(model), "--inputs", str(inputs), "--out", str(out),
                             "--precision", "both", "--json"])
    assert done.exit_code == 0, done.output
    got = json.loads(done.output)
    rows = {r["precision"]: r for r in got["precisions"]}
    assert rows["fp16"]["verdict"] == "fp16_ok" and rows["fp16"]["fp32_nodes"] == 0
    assert rows["bf16"]["verdict"] == "fixed" and rows["bf16"]["fp32_nodes"] == 2
    assert rows["bf16"]["plan_s"] is not None and rows["bf16"]["all_fp32_s"] is not None
    assert got["runs"]["bf16"]["precision"]["name"] == "bf16"
    for name in ("fp16", "bf16"):
        _one_judge(out / name, model, inputs, name)
    saved = json.loads((out / "precisions.json").read_text())["precisions"]
    assert [r["verdict"] for r in saved] == ["fp16_ok", "fixed"]
    md = (out / "precisions.md").read_text()
    assert "| FP16 | passes as is | 0 of 2 |" in md and "| BF16 | fixed | 2 of 2 |" in md
    table = cli.invoke(main, ["-q", "run", str(model), "--inputs", str(inputs), "--out",
                              str(out), "--precision", "both"])
    assert table.exit_code == 0 and "FP16 and BF16, side by side" in table.output
    assert "BF16 plan:" in table.output


def test_bf16_judges_a_model_older_than_opset_13_through_a_converted_copy(tmp_path, caplog,
                                                                           monkeypatch):
    """Cast takes bfloat16 from opset 13 on (the emulator's rounding, the mixed ONNX): an
    opset-12 model (PP-OCRv4's export) is judged through onnx.version_converter's copy, said
    in one line, its nodes named as in the file; only a conversion that fails is refused."""
    g = h.make_graph([h.make_node("Relu", ["x"], ["y"], name="r")], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [4])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [4])])
    path, _ = _save(tmp_path, "old", h.make_model(g, opset_imports=[h.make_opsetid("", 12)]),
                    x=np.ones(4, np.float32))
    before = path.read_bytes()
    with caplog.at_level("WARNING"):
        done = run(path, Options.of(precision="bf16"), tmp_path / "o")
    assert done.verdict == "fp16_ok"
    said = [r.getMessage() for r in caplog.records if "converted from 12" in r.getMessage()]
    assert len(said) == 1 and "opset 13" in said[0] and "untouched" in said[0]
    mixed = onnx.load(str(tmp_path / "o" / "old.mixed.onnx"))
    onnx.checker.check_model(mixed, full_check=True)
    assert mixed.opset_import[0].version == 13 and [n.name for n in mixed.graph.node
                                                    if n.op_type == "Relu"] == ["r"]
    assert path.read_bytes() == before

    def fails(model, target):
        raise RuntimeError("No adapter for op Frob")
    monkeypatch.setattr("onnx.version_converter.convert_version", fails)
    refused = CliRunner().invoke(main, ["run", str(path), "--precision", "bf16", "--out",
                                        str(tmp_path / "r")])
    assert refused.exit_code == 2 and "could not convert it: No adapter for op Frob" in \
        refused.output
    assert not (tmp_path / "r" / "precision.json").exists()
    assert run(path, Options(), tmp_path / "fp16").verdict == "fp16_ok"  # FP16 is unaffected


def centered(tmp: Path) -> tuple[Path, Path]:
    """A LayerNorm's mean subtraction with an offset: y = (x - mean(x)) @ W for x = 4 + U(0, 1).
    At 4 FP16's spacing is 2^-8, BF16's 2^-5: the centred values keep too few bits in BF16."""
    w = np.random.default_rng(1).normal(0, 0.2, (64, 8)).astype(np.float32)
    g = h.make_graph([h.make_node("ReduceMean", ["x"], ["m"], name="mean", axes=[1]),
                      h.make_node("Sub", ["x", "m"], ["c"], name="center"),
                      h.make_node("MatMul", ["c", "W"], ["y"], name="proj")], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [4, 64])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [4, 8])], [nh.from_array(w, "W")])
    x = (4 + np.random.default_rng(0).uniform(0, 1, (4, 64))).astype(np.float32)
    return _save(tmp, "centered", h.make_model(g, opset_imports=[h.make_opsetid("", 13)]), x=x)


def test_a_mean_subtraction_with_an_offset_holds_in_fp16_and_not_in_bf16(tmp_path):
    model, inputs = centered(tmp_path)
    assert run(model, Options.of(inputs=[str(inputs)]), tmp_path / "fp16").verdict == "fp16_ok"
    bf16 = run(model, Options.of(inputs=[str(inputs)], precision="bf16"), tmp_path / "bf16")
    assert bf16.verdict == "fixed" and set(bf16.fp32_nodes) == {"mean", "center"}
    plan = _one_judge(tmp_path / "bf16", model, inputs, "bf16")
    (group,) = plan["culprit_groups"]
    assert group["cause"] == "precision_loss" and group["evidence"]["bf16_spacing"] > 0


def test_bench_bf16_measures_one_model_and_rewrites_only_its_section(tmp_path):
    """scripts/bench_bf16.py on one zoo case end to end: both precisions, both files checked
    bit for bit, and the doc section replaced between its markers, the rest kept."""
    import importlib
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "scripts"))
    try:
        bench = importlib.import_module("bench_bf16")
    finally:
        sys.path.remove(str(root / "scripts"))
    (name, build), = list(bench.cases(lambda n: n == "zoo/reducesum_overflow"))
    rec = bench.measure(name, build, tmp_path / "w")
    assert rec["runs"]["fp16"]["verdict"] == "fixed" and rec["runs"]["bf16"]["verdict"] == "fp16_ok"
    assert rec["runs"]["fp16"]["search_equals_check"] and rec["runs"]["bf16"]["search_equals_check"]
    doc = tmp_path / "bf16.md"
    doc.write_text(f"# BF16\n\nbefore\n\n{bench.BEGIN}\nold\n{bench.END}\n\nafter\n")
    bench.write_section(bench.markdown([rec], ["deep_24"]), doc)
    text = doc.read_text()
    assert "before" in text and "after" in text and "old" not in text
    assert "| zoo/reducesum_overflow | 7 | fixed | 2 |" in text and "deep_24" in text


def test_the_bf16_tensorrt_10_snippet_runs_on_the_10_13_fake_and_forces_the_plan(monkeypatch, zoo,
                                                                                tmp_path):
    """tests/backends/test_trt_surface.py's check, in BF16: the snippet runs on the fake TensorRT 10.13
    (a name its bindings lack raises), sets BuilderFlag.BF16 (not FP16) and forces the plan."""
    import pickle
    import runpy

    from tests.backends.test_trt_backend import fake
    from tests.backends.test_trt_surface import snippet_context
    ctx, plan = snippet_context(tmp_path, zoo)
    ctx = render.RenderContext(**{**ctx.__dict__, "precision": "bf16"})
    (tmp_path / "snippet.py").write_text(render.render_all(plan, ctx)["tensorrt_python"].text)
    monkeypatch.chdir(tmp_path)
    fake.install(monkeypatch, version="10.13.0.35")
    runpy.run_path(str(tmp_path / "snippet.py"))
    used = {(a.owner, a.name) for a in fake.ACCESSES if a.present}
    assert ("BuilderFlag", "BF16") in used and ("BuilderFlag", "FP16") not in used
    built = pickle.loads((tmp_path / "model.bf16.plan").read_bytes())
    assert not built["fp16"] and sorted(built["forced"]) == sorted(plan)


def test_polygraphy_checks_the_bf16_mixed_model_on_onnx_runtime(tmp_path):
    """The rendered Polygraphy check (ONNX Runtime, no GPU) passes on the BF16 plan's emulated
    mixed model and fails on the all-BF16 one: the rendering reproduces the plan in its tool."""
    import shlex
    pytest.importorskip("polygraphy")
    from trtbisect.backends.ort import emulation_of_mixed
    from trtbisect.graph import Graph
    from trtbisect.judge.mixed import Written, mixed_model
    from trtbisect.judge.semantics import Rules
    poly = Path(sys.executable).parent / "polygraphy"
    if not poly.exists():
        pytest.skip("polygraphy is not installed beside the interpreter")
    model, inputs = differences(tmp_path)
    out = tmp_path / "out"
    run(model, Options.of(inputs=[str(inputs)], precision="bf16"), out)
    text = json.loads((out / "precision.json").read_text())["renderings"]["polygraphy_check"]
    save, check = [shlex.split(line) for line in text.splitlines() if line and line[0] != "#"]
    for argv in (save, check):
        done = subprocess.run([str(poly), *argv[1:]], cwd=out, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    mixed_model(Graph.from_path(model), [], precision=BF16).save(out / "all.mixed.onnx")
    Written(*emulation_of_mixed(Graph.from_path(out / "all.mixed.onnx"),
                                Rules(precision=BF16))).save(out / "all_bf16.onnx")
    emulated = next(w for w in check if w.endswith(".emulated.onnx"))
    bad = [str(poly), *[("all_bf16.onnx" if w == emulated else w) for w in check[1:]]]
    done = subprocess.run(bad, cwd=out, capture_output=True, text=True)
    assert done.returncode != 0, "the check must be able to fail"


def test_a_bf16_run_never_replays_an_fp16_journal_in_the_same_folder(tmp_path):
    model, inputs = squares(tmp_path)
    out = tmp_path / "out"
    assert run(model, Options.of(inputs=[str(inputs)]), out).verdict == "fixed"
    assert run(model, Options.of(inputs=[str(inputs)], precision="bf16"), out).verdict == "fp16_ok"
    again = run(model, Options.of(inputs=[str(inputs)]), out)  # and back: FP16's own answer
    assert again.verdict == "fixed" and "sq" in again.fp32_nodes


@pytest.mark.slow
def test_autocast_bf16_with_the_rendered_flags_reproduces_the_plan(tmp_path):
    """Where ModelOpt installs: AutoCast with the rendered `--low_precision_type=bf16` keeps
    exactly the plan's nodes in FP32 and its file passes `check --precision bf16`. (ModelOpt
    is not installed on the machine this was written on: skipped there.)"""
    import shlex
    pytest.importorskip("modelopt.onnx.autocast")
    from tests.outputs.test_render import fp32_compute_nodes
    model, inputs = differences(tmp_path)
    out = tmp_path / "out"
    result = run(model, Options.of(inputs=[str(inputs)], precision="bf16"), out)
    text = json.loads((out / "precision.json").read_text())["renderings"]["autocast"]
    convert, check = [shlex.split(line) for line in text.splitlines() if line and line[0] != "#"]
    assert "--low_precision_type=bf16" in convert
    assert check[check.index("--precision") + 1] == "bf16"  # the check judges in BF16
    done = subprocess.run([sys.executable, *convert[1:]], cwd=out, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    converted = out / result.render_context.autocast_output
    assert fp32_compute_nodes(onnx.load(str(converted))) == set(result.fp32_nodes)
    assert check_mixed(converted, model, Options.of(inputs=[str(inputs)], precision="bf16")).passed
