"""`run` end to end on the planted-fault zoo: verdicts, exact minimal sets, evaluation bounds,
and that every written file says what the plan predicted."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from tests.conftest import save_zoo_model
from tests.models.make_models import deep_model
from trtbisect.context import Options, prepare
from trtbisect.graph import Graph
from trtbisect.pipeline import check_mixed, run
from trtbisect.rewrites.driver import RewritesRecord
from trtbisect.search.journal import Journal
from trtbisect.search.minimal import ddmin

ZOO = ["layernorm_overflow", "reducesum_overflow", "attention_logits", "eps_underflow",
       "constant_out_of_range", "healthy", "fp32_broken", "two_outputs", "precision_loss"]


@pytest.mark.parametrize("name", ZOO)
def test_zoo_verdict_and_exact_minimal_set(zoo, tmp_path, name):
    z = zoo[name]
    model, inputs = save_zoo_model(z, tmp_path)
    r = run(model, Options.of(semantics="strict", inputs=[str(inputs)]), tmp_path / "out")
    assert r.verdict == z.expected_verdict
    assert set(r.fp32_nodes) == set(z.expected_fp32)
    plan = json.loads((tmp_path / "out" / "precision.json").read_text())
    assert plan["verdict"] == z.expected_verdict
    assert set(plan["fp32_nodes"]) == set(z.expected_fp32)
    if z.expected_verdict == "fixed":
        assert r.one_minimal and plan["one_minimal"]
        # all-FP16, the prior, one removal per node, a few for growth, the final check
        assert r.evaluations <= 2 * len(z.expected_fp32) + 10
        assert all(e.passed for e in r.errors_after.values())
        assert not all(e.passed for e in r.errors_before.values())


def test_an_fp16_verdict_is_the_written_files_and_builds_no_emulator(zoo, tmp_path, monkeypatch):
    """FP16 passes: the all-FP16 file, written and judged, is the answer; no search graph."""
    from trtbisect import pipeline
    built = []
    orig = pipeline.Emulator.__init__

    def counting(self, *args, **kwargs):
        built.append(1)
        orig(self, *args, **kwargs)
    monkeypatch.setattr(pipeline.Emulator, "__init__", counting)
    z = zoo["healthy"]
    model, inputs = save_zoo_model(z, tmp_path)
    r = run(model, Options.of(inputs=[str(inputs)]), tmp_path / "out")
    assert r.verdict == "fp16_ok" and r.evaluations == 1 and not built
    assert r.mixed_model_passed and r.errors_after == r.errors_before
    checked = check_mixed(tmp_path / "out" / "healthy.mixed.onnx", model,
                          Options.of(inputs=[str(inputs)]))
    assert {k: e.max_abs for k, e in checked.errors.items()} == \
        {k: e.max_abs for k, e in r.errors_before.items()}
    z = zoo["layernorm_overflow"]  # FP16 fails: the search builds its emulator
    model, inputs = save_zoo_model(z, tmp_path)
    assert run(model, Options.of(inputs=[str(inputs)]), tmp_path / "out2").verdict == "fixed"
    assert built


def test_big_weights_take_the_emulator_first_and_reach_the_same_verdict(zoo, tmp_path,
                                                                        monkeypatch):
    from trtbisect import pipeline
    z = zoo["healthy"]
    model, inputs = save_zoo_model(z, tmp_path)
    small = run(model, Options.of(inputs=[str(inputs)]), tmp_path / "small")
    monkeypatch.setattr(pipeline, "FILE_FIRST_WEIGHT_BYTES", -1)  # every model is "big"
    big = run(model, Options.of(inputs=[str(inputs)]), tmp_path / "big")
    assert big.verdict == small.verdict == "fp16_ok" and big.mixed_model_passed
    assert big.one_judge.search_equals_check  # the emulator's numbers, the file's
    assert {k: e.max_abs for k, e in big.errors_before.items()} == \
        {k: e.max_abs for k, e in small.errors_before.items()}


@pytest.mark.parametrize("name", ["layernorm_overflow", "two_outputs", "constant_out_of_range"])
def test_written_mixed_model_is_valid_and_passes_check(zoo, tmp_path, name):
    z = zoo[name]
    model, inputs = save_zoo_model(z, tmp_path)
    r = run(model, Options.of(semantics="strict", inputs=[str(inputs)]), tmp_path / "out")
    mixed_path = tmp_path / "out" / f"{name}.mixed.onnx"
    mixed = onnx.load(mixed_path)
    onnx.checker.check_model(mixed, full_check=True)
    assert [o.type.tensor_type.elem_type for o in mixed.graph.output] == \
           [o.type.tensor_type.elem_type for o in z.model.graph.output]
    halves = [t for t in mixed.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16]
    assert halves, "FP16 nodes should read FP16 weights"
    result = check_mixed(mixed_path, model, Options.of(semantics="strict", inputs=[str(inputs)]))
    assert result.passed and r.mixed_model_passed is True
    assert json.loads((tmp_path / "out" / "precision.json").read_text())["mixed_model_passed"]
    # the file behaves exactly as the plan predicted on the emulator
    for name_out, e in r.errors_after.items():
        assert result.errors[name_out].max_abs == pytest.approx(e.max_abs, rel=1e-6, abs=1e-6)


def test_all_fp16_mixed_model_fails_check(zoo, tmp_path):
    from trtbisect.judge.mixed import write_mixed_onnx
    z = zoo["layernorm_overflow"]
    model, inputs = save_zoo_model(z, tmp_path)
    path = tmp_path / "all16.onnx"
    onnx.save(write_mixed_onnx(z.model, []), path)
    assert not check_mixed(path, model, Options.of(semantics="strict", inputs=[str(inputs)])).passed


def test_input_model_is_never_modified(zoo, tmp_path):
    model, inputs = save_zoo_model(zoo["layernorm_overflow"], tmp_path)
    before = model.read_bytes()
    run(model, Options.of(semantics="strict", inputs=[str(inputs)]), tmp_path / "out")
    assert model.read_bytes() == before


def test_resume_replays_the_journal(zoo, tmp_path):
    z = zoo["two_outputs"]
    model, inputs = save_zoo_model(z, tmp_path)
    first = run(model, Options.of(semantics="strict", inputs=[str(inputs)]), tmp_path / "out")
    path = tmp_path / "out" / "journal.jsonl"
    header, *records = path.read_text().splitlines()
    done = [json.loads(line) for line in records if '"done"' in line]
    fingerprint = json.loads(header)["fingerprint"]
    # kill mid-search: the journal holds the first three finished evaluations, plus one
    # evaluation that started but never finished (in flight at the kill: run again)
    path.unlink()
    j = Journal(path, fingerprint)
    for rec in done[:3]:
        j.start(rec["done"])
        j.record(rec["done"], rec["passed"], {})
    j.start(done[3]["done"])
    j.close()
    calls = []
    from trtbisect.stages.evaluator import Evaluator
    orig = Evaluator.measure

    def counting(self, plan, stop_early=False, full=False):
        calls.append(plan)
        return orig(self, plan, stop_early, full)
    Evaluator.measure = counting
    try:
        second = run(model, Options.of(semantics="strict", inputs=[str(inputs)]), tmp_path / "out")
    finally:
        Evaluator.measure = orig
    assert second.fp32_nodes == first.fp32_nodes or set(second.fp32_nodes) == set(z.expected_fp32)
    # the final check is always run (all-FP16 is judged on its written file, not measured);
    # the search ran everything except all-FP16 and the three replayed plans (the one in
    # flight ran again)
    assert len(calls) == 1 + (first.search.evaluations - 1) - 3
    assert done[3]["done"] in {json.dumps(sorted(p)) for p in calls}


def test_strict_rejects_internal_overflow_hidden_by_the_outputs(tmp_path):
    from onnx import TensorProto as TP
    from onnx import helper as h
    # y = Min(x*x, 1): x*x overflows to inf in FP16 but the clamp hides it from the output
    nodes = [h.make_node("Mul", ["x", "x"], ["sq"], name="sq"),
             h.make_node("Min", ["sq", "one"], ["y"], name="clamp")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [8])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [8])],
                     [h.make_tensor("one", TP.FLOAT, [], [1.0])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 10
    path = tmp_path / "clamp.onnx"
    onnx.save(m, path)
    np.savez(tmp_path / "x.npz", x=np.full(8, 300.0, np.float32))
    loose = run(path, Options.of(semantics="strict", inputs=[str(tmp_path / "x.npz")]), tmp_path / "a")
    strict = run(path, Options.of(semantics="strict", inputs=[str(tmp_path / "x.npz")], strict=True), tmp_path / "b")
    assert loose.verdict == "fp16_ok"
    assert strict.verdict == "fixed" and strict.fp32_nodes == ["sq"]  # its stored value is finite


def test_plan_must_pass_on_every_sample(zoo, tmp_path):
    z = zoo["layernorm_overflow"]
    model, _ = save_zoo_model(z, tmp_path)
    # a second sample scaled down to stay in range on its own does not change the plan;
    # the plan found on both must pass both
    x = {k: np.stack([v, v * 0.01]) for k, v in z.inputs.items()}
    np.savez(tmp_path / "two.npz", **x)
    r = run(model, Options.of(semantics="strict", inputs=[str(tmp_path / "two.npz")]), tmp_path / "out")
    assert r.samples == 2 and set(r.fp32_nodes) == set(z.expected_fp32)


def test_deep_model_two_sites_far_fewer_evaluations_than_ddmin(tmp_path):
    z = deep_model()
    model, inputs = save_zoo_model(z, tmp_path)
    r = run(model, Options.of(semantics="strict", inputs=[str(inputs)]), tmp_path / "out")
    assert set(r.fp32_nodes) == set(z.expected_fp32)
    g = Graph(z.model)
    assert len(g.names) >= 600
    from trtbisect.backends.ort import Emulator, Reference
    from trtbisect.judge.compare import Tolerance, compare_outputs
    emu, ref = Emulator(g), Reference(g).run(z.inputs)
    plain = ddmin(g.candidates(), lambda s: all(
        e.passed for e in compare_outputs(ref, emu.run(s, z.inputs), Tolerance()).values()))
    assert len(r.fp32_nodes) <= len(plain.fp32)
    assert 3 * r.evaluations <= plain.evaluations


@pytest.mark.parametrize("name", ["constant_out_of_range", "attention_logits", "precision_loss"])
def test_rewrite_first_then_the_fp32_set_for_what_is_left(zoo, tmp_path, name):
    z = zoo[name]
    model, inputs = save_zoo_model(z, tmp_path)
    r = run(model, Options.of(inputs=[str(inputs)], rewrite=True, semantics="strict"), tmp_path / "out")
    applied = r.rewrites.applied
    written = json.loads((tmp_path / "out" / "precision.json").read_text())["rewrites"]
    assert written == r.rewrites.to_json()  # the frozen record, as precision.json writes it
    assert RewritesRecord.from_json(written) == r.rewrites
    if name == "precision_loss":  # nothing matches: the plain FP32 plan
        assert not applied and set(r.fp32_nodes) == set(z.expected_fp32)
        assert not (tmp_path / "out" / f"{name}.rewritten.onnx").exists()
        return
    assert applied and r.verdict == "fixed" and r.fp32_nodes == []
    assert r.one_judge.search_equals_check
    rewritten = onnx.load(tmp_path / "out" / f"{name}.rewritten.onnx")
    assert [v.name for v in rewritten.graph.output] == [v.name for v in z.model.graph.output]
    assert check_mixed(tmp_path / "out" / f"{name}.mixed.onnx", model,
                       Options.of(inputs=[str(inputs)])).passed
    assert max(a.drift.rel for a in applied) < 1e-4


def test_rewrites_reuse_what_the_run_knows(zoo, tmp_path, monkeypatch):
    """The model's FP32 outputs and all-FP16 verdict are the run's (not computed again), and
    the kept candidate's prepared graph is the search's (not prepared again)."""
    from trtbisect import pipeline
    from trtbisect.rewrites import driver as rewrites
    prepared, references = [], []
    real_prepare, real_refs = pipeline.semantics.prepare_graph, rewrites.reference_outputs
    monkeypatch.setattr(pipeline.semantics, "prepare_graph",
                        lambda *a, **k: prepared.append(1) or real_prepare(*a, **k))
    monkeypatch.setattr(rewrites, "reference_outputs",
                        lambda *a, **k: references.append(1) or real_refs(*a, **k))
    z = zoo["layernorm_overflow"]
    model, inputs = save_zoo_model(z, tmp_path)
    r = run(model, Options.of(inputs=[str(inputs)], rewrite=True), tmp_path / "out")
    assert r.verdict == "fixed" and r.fp32_nodes == []
    tried = r.rewrites.judgements
    assert tried == len(r.rewrites.applied) == 1
    assert len(references) == tried  # one FP32 drift check per candidate
    assert len(prepared) == 1 + tried  # the model, then each candidate once


def test_a_resumed_run_reuses_the_layerwise_statistics(zoo, tmp_path, monkeypatch):
    from trtbisect import pipeline
    from trtbisect.stages import layerwise
    z = zoo["layernorm_overflow"]
    model, inputs = save_zoo_model(z, tmp_path)
    first = run(model, Options.of(inputs=[str(inputs)]), tmp_path / "out")
    calls, references = [], []
    monkeypatch.setattr(layerwise, "layerwise", lambda *a, **k: calls.append(1) or {})
    real = pipeline.Reference
    for module in (pipeline, layerwise):
        monkeypatch.setattr(module, "Reference",
                            lambda *a, **k: references.append(1) or real(*a, **k))
    again = run(model, Options.of(inputs=[str(inputs)]), tmp_path / "out")
    assert not calls and not references and again.fp32_nodes == first.fp32_nodes
    assert {k: v.to_json() for k, v in again.stats.items()} == \
           {k: v.to_json() for k, v in first.stats.items()}
    fresh = run(model, Options.of(inputs=[str(inputs)], resume=False), tmp_path / "out")
    assert calls and fresh.verdict == "fixed"


@pytest.mark.parametrize("budget", [1 << 30, pytest.param(40_000, marks=pytest.mark.slow)])
def test_layerwise_fp16_side_from_the_judged_file_gives_the_same_statistics(tmp_path, monkeypatch,
                                                                             budget):
    """A failing all-FP16 file's judge also returns the FP16 side of the first layer-wise
    batch: the statistics are those of the layer-wise pass on its own, bit for bit, with one
    emulator session fewer (two samples; one batch, or many under a small budget)."""
    from trtbisect import pipeline
    from trtbisect.stages import layerwise
    z = deep_model()
    model, inputs = save_zoo_model(z, tmp_path)
    other = tmp_path / "other.npz"
    rng = np.random.default_rng(1)
    np.savez(other, **{k: (v * rng.uniform(0.5, 1.5, v.shape)).astype(v.dtype)
                       for k, v in z.inputs.items()})
    opts = Options.of(inputs=[str(inputs), str(other)], memory_budget=budget)
    exposing = []
    real = pipeline.Emulator

    def spy(*args, **kwargs):
        exposing.append(bool(kwargs.get("expose")))
        return real(*args, **kwargs)
    for module in (pipeline, layerwise):
        monkeypatch.setattr(module, "Emulator", spy)
    sized = []
    real_sizes = layerwise.estimate_bytes
    monkeypatch.setattr(layerwise, "estimate_bytes", lambda *a: sized.append(1) or real_sizes(*a))
    r = run(model, opts, tmp_path / "out")
    assert r.verdict == "fixed" and len(sized) == 1  # the batches are planned once a run
    ctx = prepare(model, opts)
    ctx.hold_out(opts.sample.validation_share, opts.sample.seed)  # the run's statistics: its search samples
    batches = layerwise.layerwise_batches(ctx, opts.search)
    assert (len(batches) > 1) == (budget < 1 << 20)
    assert exposing.count(True) == len(batches) - 1
    alone = layerwise.layerwise(ctx, opts.judge, opts.search)
    assert {k: v.to_json() for k, v in r.stats.items()} == \
        {k: v.to_json() for k, v in alone.items()}


def test_precision_json_times_each_stage(zoo, tmp_path):
    z = zoo["layernorm_overflow"]
    model, inputs = save_zoo_model(z, tmp_path)
    run(model, Options.of(inputs=[str(inputs)]), tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "precision.json").read_text())
    names = [s["stage"].split(" ")[0] for s in saved["stages"]]
    assert names == ["loading", "all-FP16", "layer-wise", "searching", "judging", "all-FP16"]
    assert all(s["seconds"] >= 0 for s in saved["stages"])
    # the stages cover the span from the first mark to the end: never more than the total
    assert sum(s["seconds"] for s in saved["stages"]) <= round(saved["seconds"], 3) + 1e-9


def test_rewrites_fix_every_overflowing_norm_of_a_deep_model(tmp_path):
    """Each fused LayerNorm alone barely helps while the others still overflow: the driver
    retries the ones that did not help enough after each kept rewrite."""
    z = deep_model()
    model, inputs = save_zoo_model(z, tmp_path)
    r = run(model, Options.of(inputs=[str(inputs)], rewrite=True, semantics="strict"), tmp_path / "o")
    applied = r.rewrites.applied
    assert r.verdict == "fixed" and r.fp32_nodes == [] and len(applied) == 2
    assert {a.rewrite for a in applied} == {"fuse_layernorm"}
    assert r.rewrites.judgements <= 12  # the suspects' norms are tried first


def test_strict_tolerance_under_trt_semantics_runs_the_per_node_comparison(zoo, tmp_path):
    """--strict (non-finite watch) with the default trt semantics: the per-node comparison's
    emulator watches nothing, and still runs."""
    z = zoo["layernorm_overflow"]
    model, inputs = save_zoo_model(z, tmp_path)
    r = run(model, Options.of(strict=True, inputs=[str(inputs)]), tmp_path / "out")
    assert r.verdict == "fixed" and r.mixed_model_passed
    assert r.errors_before_strict is not None


def test_the_swap_certificate_runs_on_the_prefetched_session(tmp_path, monkeypatch):
    """The swap certificate tries a neighbouring unit in a plan unit's place: the first session
    holds the suspects' neighbours, so no swap rebuilds it (each rebuild cost 11 s at 20k
    nodes). One session for the search, one for the per-node comparison."""
    from tests.conftest import script_module
    from trtbisect.backends import ort
    m = script_module("bench_models").synthetic_transformer(600)
    onnx.save(m.model, tmp_path / "t.onnx")
    np.savez(tmp_path / "t.npz", **m.inputs)
    builds = []
    real = ort.Emulator._build

    def counting(self, active):
        builds.append(len(active))
        return real(self, active)
    monkeypatch.setattr(ort.Emulator, "_build", counting)
    r = run(tmp_path / "t.onnx", Options.of(inputs=[str(tmp_path / "t.npz")], workers=1),
            tmp_path / "out")
    phases = [t["phase"] for t in r.search.to_json()["trials"]]
    assert r.verdict == "fixed" and phases.count("swap") >= 1
    assert len(builds) == 2, builds


def test_a_run_s_result_is_assembled_once_with_its_verdict_over_every_finding(zoo, tmp_path):
    """The result `run` returns is built whole: no field is assigned after (a change is a new
    result), and its verdict is the one its recorded findings decide (the written file, its
    certificate, its validation and the graph's coverage all judged), as precision.json says."""
    import dataclasses

    from trtbisect.judge.verdict import decide

    z = zoo["layernorm_overflow"]
    model, inputs = save_zoo_model(z, tmp_path)
    r = run(model, Options.of(semantics="strict", inputs=[str(inputs)]), tmp_path / "out")
    f = r.verdict_findings
    assert f is not None and r.verdict == z.expected_verdict == "fixed"
    assert (f.file_passed, f.certified, f.covered) == (True, True, True)
    assert f.validated is not None and f.tensorrt is None
    assert decide(f.proposed, file_passed=f.file_passed, certified=f.certified,
                  validated=f.validated, covered=f.covered) == r.verdict
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.verdict = "no_plan"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.files = {}
    plan = json.loads((tmp_path / "out" / "precision.json").read_text())
    assert plan["verdict"] == r.verdict and plan["files"] == r.files
    assert plan["certificate"] == r.certificate.to_json() and plan["fragile"] is False
