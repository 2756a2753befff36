"""The quantized road on the one spine (#42): one exit table, the FP16 road's certificate and
validation, honest culprits, reasons for `no_plan`, the judged file kept for `quantized_ok`."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.models import quant_models as qm
from trtbisect.context import Options
from trtbisect.judge.compare import Tolerance
from trtbisect.quant.run import float_side_reasons, run
from trtbisect.result import VERDICT_EXIT, Found


def _files(p, tmp_path):
    model, inputs = tmp_path / f"{p.name}.onnx", tmp_path / f"{p.name}.npz"
    onnx.save(p.model, model)
    np.savez(inputs, **p.inputs)
    return model, inputs


FP16_SIDE = (lambda: qm.fp16_side(fused=False), lambda: qm.fp16_side(fused=True))


@pytest.mark.parametrize("make", [*qm.PLANTED, *FP16_SIDE],
                         ids=[*(m.__name__ for m in qm.PLANTED), "fp16_side", "fp16_side_fused"])
def test_no_quantized_fixed_misses_the_bound_in_plain_onnx_runtime(make, tmp_path):
    """Whatever the verdict, `fixed` only where the written file, run as is in a plain
    InferenceSession (ORT's default optimizations, its QDQ fusions), meets the bound."""
    p = make()
    model, inputs = _files(p, tmp_path)
    r = run(model, Options.of(inputs=[str(inputs)], tolerance=Tolerance(p.rtol, 0.0),
                              threads=1, validation_share=0), tmp_path / "out")
    assert r.exit_code == VERDICT_EXIT[r.verdict]  # one exit table
    assert isinstance(r, Found)  # one result type: what every search run finds
    assert r.errors_before == r.before.errors and r.errors_after == r.after.errors
    assert r.candidates == len(r.judge.units) and r.inferences == r.judge.runs > 0
    assert r.certified is not None and r.validation.kind == "none"
    if r.verdict != "fixed":  # (fp8_saturation's plan is fixed: the check below runs)
        assert r.verdict == "fragile" and not r.certified.certified
        return
    sess = ort.InferenceSession(r.files["mixed_qdq_model"], providers=["CPUExecutionProvider"])
    x = dict(np.load(inputs))
    got = sess.run(None, x)
    for out, value in zip(sess.get_outputs(), got):
        e = r.after.errors[out.name]
        assert float(np.max(np.abs(value - r.judge.references[0][out.name]))) <= e.bound


def test_each_culprit_says_whether_accuracy_needs_it(tmp_path):
    """Under --objective cost the cheaper step may add units for estimated engine time: each
    unit of the plan is `needed` (in the certified 1-minimal plan) or not, with the saving;
    the 1-minimal plan is always recorded."""
    p = qm.fp16_side(fused=False)
    model, inputs = _files(p, tmp_path)
    r = run(model, Options.of(inputs=[str(inputs)], tolerance=Tolerance(p.rtol, 0.0), threads=1,
                              validation_share=0), tmp_path / "out")
    written = json.loads((tmp_path / "out" / "precision.json").read_text())
    assert written["minimal_plan"] == r.minimal_plan and r.minimal_plan
    names = [c["name"] for c in written["culprits"]]
    assert names == [*r.plan, *r.fp32_nodes]
    plan = frozenset(r.units)  # fp16_side: un-fused, a search unit per node
    for c in written["culprits"]:
        unit = c["name"] if c["side"] == "quantized" else next(
            u for u, n in r.judge.half.items() if n == c["name"])
        # needed: the written plan without it fails, judged afresh here
        assert c["needed"] == (not r.judge.judge_model(r.judge.model_for(plan - {unit})).passed)
        assert ("faster_by" in c) == (not c["needed"])
    # the cheaper step added mm2 for estimated time: not needed, the 1-minimal plan without it
    assert [c["name"] for c in written["culprits"] if not c["needed"]] == ["mm2"]
    assert "mm2" not in written["minimal_plan"] and "mm2" in written["unquantized_layers"]
    assert written["culprits"][1]["faster_by"] > 0


def test_the_console_gives_a_cause_only_to_needed_culprits(tmp_path, monkeypatch):
    """The "why" column: a failure cause for a needed layer, "faster un-quantized (est. -x%)"
    for one the cheaper step added (its number: precision.json's faster_by)."""
    from tests.test_cli import invoke

    monkeypatch.setenv("COLUMNS", "400")
    p = qm.fp16_side(fused=False)
    model, inputs = _files(p, tmp_path)
    r = invoke("-q", "run", model, "--inputs", inputs, "--rtol", p.rtol, "--out",
               tmp_path / "out", "--validation-share", "0")
    got = json.loads((tmp_path / "out" / "precision.json").read_text())
    faster = next(c["faster_by"] for c in got["culprits"] if c["name"] == "mm2")
    rows = {line.split()[1]: line for line in r.output.splitlines()
            if line.startswith("│") and len(line.split()) > 1}
    assert f"faster un-quantized (est. -{100 * faster:.1f}%)" in rows["mm2"], r.output
    assert "faster" not in rows["mm1"] and "fails" not in rows["mm2"]
    assert any(f["text"] in rows["mm1"] for f in got["plan"][0]["findings"]), r.output


def test_no_plan_names_the_broken_weights_and_who_wrote_them(tmp_path):
    """A converter that wrote a BatchNorm variance beyond FP16's range as fp16 inf: even all
    float fails, and the run says why, by name."""
    p = qm.outlier()
    m = onnx.ModelProto()
    m.CopyFrom(p.model)
    m.producer_name, m.producer_version = "modelopt", "0.47.0"
    bad = onnx.numpy_helper.from_array(np.array([np.inf, 1.0], np.float16), "bn_var")
    m.graph.initializer.append(bad)
    (line,) = float_side_reasons(m)
    assert "bn_var (float16) holds 1 non-finite value(s)" in line and "modelopt 0.47.0" in line
    assert float_side_reasons(p.model) == []


def test_quantized_ok_keeps_the_file_it_judged(tmp_path):
    """A file trtbisect made (ModelOpt's, in a temporary folder) that passes as it is: the
    judged file and its commands stay in --out, and precision.json points at them."""
    p = qm.outlier()
    model, inputs = _files(p, tmp_path)
    r = run(model, Options.of(inputs=[str(inputs)], tolerance=Tolerance(0.5, 0.0), threads=1,
                              validation_share=0), tmp_path / "out", owned=True)
    assert r.verdict == "quantized_ok"
    kept = tmp_path / "out" / "outlier.quantized.onnx"
    assert r.files["quantized_model"] == str(kept) == r.model_path and kept.is_file()
    assert (tmp_path / "out" / "commands.sh").is_file()
    assert json.loads((tmp_path / "out" / "precision.json").read_text())["model"] == str(kept)


def test_a_one_hot_tensor_is_no_activation_outlier():
    """Mostly zeros (a one-hot): most values sit below one quantization step and the median
    magnitude is 0, so no outlier ratio is said (#46: '1 is 1e+30x its median magnitude 0');
    a tensor with a real median is still an outlier, its ratio against that median."""
    from onnx import helper

    from trtbisect.quant.diagnose import EdgeStats, _edge_findings
    from trtbisect.quant.qdq import Edge, Layer

    e = Edge("mm", 0, "dq", "q", "x", False, "int8", "s", False, 1)
    layer = Layer("mm", "MatMul", (e,), "R2")
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")
    hot = np.zeros(64, np.float32)
    hot[3] = 1.0
    kinds = {f.kind for f in _edge_findings(
        layer, e, EdgeStats(hot, 0.1, np.array([1 / 127], np.float32), 0.0, 0.98), node)}
    assert "activation_outlier" not in kinds
    spiky = np.full(64, 0.01, np.float32)
    spiky[3] = 1.0
    (f,) = [f for f in _edge_findings(
        layer, e, EdgeStats(spiky, 0.1, np.array([1 / 127], np.float32), 0.0, 0.98), node)
        if f.kind == "activation_outlier"]
    assert "is 100x its median magnitude 0.01" in f.text


def test_one_all_fp16_price_per_model_and_gpu_class(tmp_path):
    """The quantized run's all-FP16 figure is the FP16 run's of the same float model on the
    same GPU class (#46: 98.53 us against 45.57 us for magika), and the file's own float side
    is priced beside it."""
    from trtbisect.pipeline import run as fp16_run
    from trtbisect.quant.qdq import analyse, unquantize

    p = qm.outlier()
    model, inputs = _files(p, tmp_path)
    ref = tmp_path / "fp32.onnx"
    onnx.save(unquantize(p.model, analyse(p.model)), ref)
    q = run(model, Options.of(inputs=[str(inputs)], tolerance=Tolerance(p.rtol, 0.0), threads=1,
                              validation_share=0, gpu="h100"), tmp_path / "q")
    f = fp16_run(ref, Options.of(inputs=[str(inputs)], threads=1, validation_share=0,
                                 gpu="h100"), tmp_path / "f")
    assert q.cost.all_fp16_s == f.cost.all_low_s > 0 and f.cost.precision == "fp16"
    assert q.cost.all_fp16_from == "the FP16 road's engine of the float model"
    assert q.cost.file_all_float_s > 0 and q.cost.file_fp32_nodes >= 0


def test_search_samples_searches_on_the_worst_and_certifies_on_all(tmp_path):
    """--search-samples on the quantized road (the FP16 road's judge/subset.py): the search
    judges its plans on the samples where the file as given fails worst, the plan found is
    judged on every sample; the same plan as a search on every sample."""
    p = qm.outlier()
    files = []
    for k, scale in enumerate((1.0, 0.02, 0.5, 0.01)):  # two samples far below the outlier
        f = tmp_path / f"s{k}.npz"
        np.savez(f, x=(p.inputs["x"] * scale).astype(np.float32))
        files.append(str(f))
    model = tmp_path / "q.onnx"
    onnx.save(p.model, model)

    def go(n, out):
        said = []
        r = run(model, Options.of(inputs=files, tolerance=Tolerance(p.rtol, 0.0), threads=1,
                                  validation_share=0, search_samples=n), tmp_path / out,
                stage=said.append)
        return r, said
    narrow, said = go(1, "narrow")
    every, said_every = go(0, "every")
    assert any("the search judges on 1 of 4 samples" in s for s in said), said
    assert not any("the search judges on" in s for s in said_every)
    assert narrow.plan == every.plan and narrow.verdict == every.verdict
    assert len(narrow.after.samples) == 4 and narrow.after.passed  # certified on all of them
    assert narrow.one_judge  # the search's last verdict of the plan is on every sample too
    # the search's inferences: on one sample (the culprits' removals, judged on all four where
    # the narrowed search did not know them, aside: quant/run.py `_honest`)
    needed = sum(t.phase == "needed" for t in narrow.trials)
    assert narrow.judge.runs - 4 * needed < every.judge.runs


@pytest.mark.parametrize("flag", [["--search-samples", "1"], ["--trt-version", "10"]])
def test_flags_the_quantized_road_honours_are_not_refused(flag, tmp_path):
    from click.testing import CliRunner

    from trtbisect.cli import main
    p = qm.outlier()
    model, inputs = _files(p, tmp_path)
    res = CliRunner().invoke(main, ["run", str(model), "--inputs", str(inputs), *flag,
                                    "--rtol", str(p.rtol), "--out", str(tmp_path / "o")])
    assert res.exit_code != 2, res.output
    assert (tmp_path / "o" / "precision.json").is_file()


def test_the_written_file_loads_and_declares_what_it_computes(tmp_path):
    """The plan's file, as the FP16 road's: it passes the checker's full check, ONNX Runtime
    loads it, and its metadata names the layers it runs in float and the FP16 nodes it keeps
    in FP32 (an entry of an earlier run's file is replaced, not repeated)."""
    from trtbisect.judge.loadable import checker_problem, runtime_problem

    p = qm.fp16_side(fused=False)
    m = onnx.ModelProto()
    m.CopyFrom(p.model)
    m.metadata_props.append(onnx.StringStringEntryProto(key="trtbisect.fp32_nodes", value="x"))
    model, inputs = tmp_path / "q.onnx", tmp_path / "q.npz"
    onnx.save(m, model)
    np.savez(inputs, **p.inputs)
    r = run(model, Options.of(inputs=[str(inputs)], tolerance=Tolerance(p.rtol, 0.0), threads=1,
                              validation_share=0), tmp_path / "out")
    written = r.files["mixed_qdq_model"]
    assert checker_problem(written) is None and runtime_problem(written) is None
    meta = [(e.key, e.value) for e in onnx.load(written).metadata_props]
    keys = [k for k, _ in meta]
    assert len(keys) == len(set(keys))
    assert dict(meta)["trtbisect.unquantized_layers"] == ",".join(r.plan)
    assert dict(meta)["trtbisect.fp32_nodes"] == ",".join(r.fp32_nodes) and r.fp32_nodes


def test_the_journal_is_not_replayed_under_other_judge_settings(tmp_path):
    """The quantized journal's fingerprint is JudgeSettings' (context.run_fingerprint, as the
    FP16 road's): the same run replays its evaluations, a run under another --eval-timeout
    or --trt-version judges afresh (its journal is set aside, never trusted)."""
    p = qm.fp16_side()
    model, inputs = _files(p, tmp_path)

    def opts(**kw):
        return Options.of(inputs=[str(inputs)], tolerance=Tolerance(p.rtol, 0.0), threads=1,
                          validation_share=0, **kw)
    first = run(model, opts(), tmp_path / "out")
    again = run(model, opts(), tmp_path / "out")
    assert len(again.judge.verdicts) < len(first.judge.verdicts)  # replayed
    timed = run(model, opts(eval_timeout=300.0), tmp_path / "out")
    assert len(timed.judge.verdicts) == len(first.judge.verdicts)  # judged afresh
    other = run(model, opts(trt_version=10), tmp_path / "out")
    assert len(other.judge.verdicts) == len(first.judge.verdicts)
    assert other.units == timed.units == first.units


def test_tf32_rounds_the_operands_of_fp32_inner_products_only(tmp_path):
    """--tf32 on the quantized road: a layer run un-quantized (an FP32 MatMul) reads its
    operands TF32-rounded, as the FP16 road's emulator rounds them; a quantized layer's MatMul
    (reading DequantizeLinear) is TensorRT's INT8 kernel and is left alone; the run judges its
    plans and its written file under it."""
    from trtbisect.quant.half import types
    from trtbisect.quant.judge import QuantJudge, tf32_rounded
    from trtbisect.quant.qdq import analyse

    p = qm.outlier()
    layers = analyse(p.model)
    assert tf32_rounded(p.model, p.model, types(p.model)) is p.model  # all quantized
    judge = QuantJudge(p.model, layers, [p.inputs], [{}], Options().judge.criteria, Tolerance(),
                       tf32=True)
    plan = judge.model_for(frozenset({"mm1"}))
    judged = judge.judged_model(plan)
    mm1 = next(n for n in judged.graph.node if n.name == "mm1")
    mm2 = next(n for n in judged.graph.node if n.name == "mm2")
    assert all(i.endswith("__tf32") for i in mm1.input)
    assert not any(i.endswith("__tf32") for i in mm2.input)
    model, inputs = _files(p, tmp_path)
    r = {tf: run(model, Options.of(inputs=[str(inputs)], tolerance=Tolerance(p.rtol, 0.0),
                                   threads=1, validation_share=0, tf32=tf), tmp_path / f"o{tf}")
         for tf in (False, True)}
    assert r[True].plan == r[False].plan == ["mm1"]
    assert r[True].after.errors["y"].max_abs != r[False].after.errors["y"].max_abs
